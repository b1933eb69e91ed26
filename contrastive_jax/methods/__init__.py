"""Methods (base.py): how a batch becomes a loss's inputs. `METHODS` lists
each name `config.method` may give with its `Method` class."""

from contrastive_jax.methods import base
from contrastive_jax.methods import byol
from contrastive_jax.methods import in_batch
from contrastive_jax.methods import memory_bank
from contrastive_jax.methods import moco

# The registry: the one place a method is listed.
METHODS: dict[str, type[base.Method]] = {
    'in_batch': in_batch.Method, 'moco': moco.Method,
    'memory_bank': memory_bank.Method, 'byol': byol.Method,
}


def names() -> tuple[str, ...]:
  return tuple(sorted(METHODS))


def get(name: str) -> type[base.Method]:
  """The `Method` class of method `name`; ValueError listing the known ones."""
  if name not in METHODS:
    raise ValueError(f'unknown method {name!r} (config.method); known: '
                     f'{", ".join(names())}.')
  return METHODS[name]
