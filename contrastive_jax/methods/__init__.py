"""Methods: how a batch of views becomes a loss's inputs (see base.py).

`config.method` names a module of this package, which defines `Method` (a
subclass of `base.Method`); adding a method is adding a module, as in
big_vision's `config.model_name`. `names()` lists them; among them

  in_batch     SimCLR-style in-batch negatives (NT-Xent, SupCon, TCL, ...)
  moco         EMA key encoder and optional queue (MoCo v2/v3, JCL, ...)
  memory_bank  a bank of one feature per example (InsDis, CMC)
"""

import importlib
import pkgutil

from contrastive_jax.methods import base


def names() -> tuple[str, ...]:
  """Every method module in this package."""
  return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                      if m.name != 'base'))


def get(name: str) -> type[base.Method]:
  """The `Method` class of method `name`; ValueError listing the known ones."""
  if name not in names():
    raise ValueError(f'unknown method {name!r} (config.method); known: '
                     f'{", ".join(names())}.')
  return importlib.import_module(f'contrastive_jax.methods.{name}').Method
