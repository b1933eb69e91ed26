"""Per-step hyperparameters as optax-style schedules, traced in the jitted
step (`config.moco.momentum_schedule`, `config.loss_schedules`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

KINDS = ('constant', 'cosine', 'epoch_ramp')


def build(kind: str, value: float, *, total_steps: int, steps_per_epoch: int,
          num_epochs: float, name: str = 'schedule') -> optax.Schedule:
  """The schedule `kind` (int32 step -> float32) from or to `value`.

  'constant': value. 'cosine': from value up to 1 at `total_steps` (BYOL's
  and MoCo v3's momentum), 1 - (1 - value) (cos(pi t / T) + 1) / 2.
  'epoch_ramp': value min((epoch + 1) / ceil(num_epochs), 1) (JCL's lambda).
  `name` is the config field an error names.
  """
  if kind == 'constant':
    return lambda step: jnp.asarray(value, jnp.float32)
  if kind == 'cosine':
    def cosine(step: jax.Array) -> jax.Array:
      t = jnp.asarray(step, jnp.float32) / max(total_steps, 1)
      return 1. - (1. - value) * (jnp.cos(math.pi * t) + 1.) / 2.
    return cosine
  if kind == 'epoch_ramp':
    epochs = float(max(math.ceil(num_epochs), 1))

    def epoch_ramp(step: jax.Array) -> jax.Array:
      epoch = (jnp.asarray(step) // steps_per_epoch).astype(jnp.float32)
      return value * jnp.minimum((epoch + 1.) / epochs, 1.)
    return epoch_ramp
  raise ValueError(f'unknown schedule {kind!r} ({name}); known: '
                   f'{", ".join(KINDS)}.')
