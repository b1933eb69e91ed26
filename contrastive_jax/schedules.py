"""Per-step values of non-gradient hyperparameters, as optax-style schedules.

A schedule is a function step -> value (`optax.Schedule`), traced inside the
jitted step so that a changing value never recompiles it. The config names
them: `config.moco.momentum_schedule` (the EMA momentum of a key encoder) and
`config.loss_schedules` (loss keyword -> kind, e.g. JCL's `lam: 'epoch_ramp'`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

KINDS = ('constant', 'cosine', 'epoch_ramp')


def build(kind: str, value: float, *, total_steps: int, steps_per_epoch: int,
          num_epochs: float, name: str = 'schedule') -> optax.Schedule:
  """The schedule `kind` starting from (or ramping to) `value`.

  Kinds:
    'constant': value (MoCo v1/v2's momentum 0.999).
    'cosine': from value at step 0 up to 1 at `total_steps`, BYOL's and MoCo
      v3's momentum, m_t = 1 - (1 - value) (cos(pi t / T) + 1) / 2.
    'epoch_ramp': value * min((epoch + 1) / ceil(num_epochs), 1), JCL's
      lambda ramp (lambda grows once per epoch and reaches its final value
      in the last epoch; docs/losses.md, JCL).

  Args:
    kind: one of KINDS.
    value: the base (or final, for 'epoch_ramp') value.
    total_steps: steps of the whole run.
    steps_per_epoch: steps of one pass over the training data.
    num_epochs: the configured epochs (may be fractional).
    name: what the error message calls the schedule (its config field).

  Returns:
    A function int32 step -> float32 scalar.
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
