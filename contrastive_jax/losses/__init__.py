"""Contrastive objectives as pure, jit-compatible functions.

Every loss is `loss(inputs..., *, hyperparameters) -> (loss, metrics)`
(docs/losses.md). `LOSSES` maps each name a config may give to its function;
`apply` calls one with the inputs its signature names:

    >>> loss, metrics = losses.ntxent(z, temperature=0.1)   # z: [N, V, D]
    >>> loss, metrics = losses.apply(
    ...     'infonce', losses.LossInputs(z=q, key=k, queue=queue))
"""

import inspect
from collections.abc import Callable

import flax
import jax

# Modules are named by idea, so that none shadows a loss's name.
from contrastive_jax.losses.attraction_repulsion import cacr
from contrastive_jax.losses.baselines import align_uniform, dcl, hard_negative
from contrastive_jax.losses.common import l2_normalize
from contrastive_jax.losses.instance import cmc, infonce, insdis, ntxent
from contrastive_jax.losses.joint import jcl
from contrastive_jax.losses.model_aware import macl
from contrastive_jax.losses.regression import byol
from contrastive_jax.losses.supervised import supcon, tcl

# The registry: the one place a loss is listed.
LOSSES: dict[str, Callable] = {
    'ntxent': ntxent, 'infonce': infonce, 'insdis': insdis, 'cmc': cmc,
    'supcon': supcon, 'tcl': tcl,
    'align_uniform': align_uniform, 'hard_negative': hard_negative, 'dcl': dcl,
    'cacr': cacr, 'macl': macl, 'jcl': jcl, 'byol': byol,
}


@flax.struct.dataclass
class LossInputs:
  """Everything a loss can take besides its hyperparameters.

  Attributes:
    z: [N, V, D] online embeddings, every loss's first argument.
    key: [N, Vk, D] key-encoder embeddings or memory-bank rows.
    queue: negatives, [Q, D] or [N, K, D] (InsDis's per-instance noise).
    labels: [N] int class ids (supervised losses).
  """
  z: jax.Array
  key: jax.Array | None = None
  queue: jax.Array | None = None
  labels: jax.Array | None = None


_OPTIONAL_INPUTS = ('key', 'queue', 'labels')


def inputs_of(name: str) -> tuple[frozenset[str], frozenset[str]]:
  """(accepted, required) `LossInputs` fields of loss `name`'s signature."""
  params = inspect.signature(get_loss(name)).parameters
  accepted, required = {'z'}, {'z'}
  for field in _OPTIONAL_INPUTS:
    if field in params:
      accepted.add(field)
      if params[field].default is inspect.Parameter.empty:
        required.add(field)
  return frozenset(accepted), frozenset(required)


def apply(name: str, inputs: LossInputs, **hyperparameters):
  """Calls loss `name` with the inputs it takes: (loss, metrics).

  A required input is passed even when None, for the loss's own check; an
  input the loss does not take raises ValueError.
  """
  fn = get_loss(name)
  accepted, required = inputs_of(name)
  first = next(iter(inspect.signature(fn).parameters))
  kwargs = {first: inputs.z}
  for field in _OPTIONAL_INPUTS:
    value = getattr(inputs, field)
    if value is not None and field not in accepted:
      raise ValueError(f'loss {name!r} takes no {field}; leave '
                       f'LossInputs.{field} as None.')
    if value is not None or field in required:
      kwargs[field] = value
  return fn(**kwargs, **hyperparameters)


def names() -> tuple[str, ...]:
  """Every loss's name."""
  return tuple(sorted(LOSSES))


def get_loss(name: str) -> Callable:
  """The loss registered as `name`; ValueError listing the known ones."""
  try:
    return LOSSES[name]
  except KeyError:
    raise ValueError(f'unknown loss {name!r}; known losses: '
                     f'{", ".join(sorted(LOSSES))}.') from None


def default_kwarg(name: str, kwarg: str):
  """The default of `kwarg` in loss `name`'s signature (its one home)."""
  param = inspect.signature(get_loss(name)).parameters.get(kwarg)
  if param is None or param.default is inspect.Parameter.empty:
    raise ValueError(f'loss {name!r} has no keyword argument {kwarg!r} with a '
                     'default.')
  return param.default
