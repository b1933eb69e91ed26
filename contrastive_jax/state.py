"""The train state pytree and the pure updates of its non-gradient parts.

`TrainState` holds everything that changes during training. Fields a method
does not use are None (no leaves), so they cost nothing in checkpoints:

  * `key_params`, `key_batch_stats`: the EMA key encoder (method 'moco');
  * `queue` [Q, D] and `queue_ptr`: MoCo's ring buffer of past keys ('moco'
    with queue_size > 0);
  * `bank` [num_examples, D]: InsDis/CMC's memory bank ('memory_bank');
  * `probe_params`, `probe_opt_state`: the online linear monitor
    (`config.online.linear_probe`).

Every function here is pure: arrays in, arrays out, no state, so the train step
stays a pure function of (state, batch) and resuming is exact.
"""

from __future__ import annotations

import math
from typing import Any

import flax
import jax
import jax.numpy as jnp

from contrastive_jax.losses.common import l2_normalize


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""
  step: jax.Array                 # int32 scalar: steps done.
  params: Any                     # Online (query) encoder + head.
  batch_stats: Any                # Its BatchNorm running statistics.
  opt_state: Any
  key_params: Any = None          # EMA key encoder (None: no key encoder).
  key_batch_stats: Any = None     # Key encoder's own BN statistics.
  queue: jax.Array | None = None  # [Q, D] past keys, row r written at step
  queue_ptr: jax.Array | None = None  # ... r // B (mod Q / B); int32 scalar.
  bank: jax.Array | None = None   # [num_rows, D] memory bank (rows >= data
                                  # size are padding, never read).
  probe_params: Any = None        # Online monitor: linear classifier on the
  probe_opt_state: Any = None     # stop-gradient backbone features.


def ema_update(target: Any, online: Any, momentum: jax.Array | float) -> Any:
  """Returns momentum * target + (1 - momentum) * online, leaf by leaf.

  The online parameters enter under `stop_gradient`: the key encoder is a
  slowly moving copy of the online one, not a function of it that gradients
  may flow through (MoCo's `param_k.data = ...` outside autograd; BYOL
  `_update_target`). Without it a step that differentiates through the keys
  would push gradients into the online weights via the EMA.

  momentum = 1 keeps `target`; momentum = 0 copies `online`.
  """
  m = jnp.asarray(momentum, jnp.float32)
  return jax.tree.map(
      lambda t, o: (m * t + (1. - m) * jax.lax.stop_gradient(o)).astype(
          t.dtype), target, online)


def momentum_schedule(step: jax.Array, *, base: float, total_steps: int,
                      schedule: str = 'constant') -> jax.Array:
  """EMA momentum at `step` (traced, so the step does not recompile).

  'constant': base (MoCo v1/v2: 0.999). 'cosine': BYOL / MoCo v3's increase
  to 1, m_t = 1 - (1 - base) (cos(pi t / T) + 1) / 2, so m_0 = base and
  m_T = 1.
  """
  if schedule == 'constant':
    return jnp.asarray(base, jnp.float32)
  if schedule == 'cosine':
    t = jnp.asarray(step, jnp.float32) / max(total_steps, 1)
    return 1. - (1. - base) * (jnp.cos(math.pi * t) + 1.) / 2.
  raise ValueError(f'unknown momentum schedule {schedule!r} '
                   '(config.moco.momentum_schedule); known: constant, '
                   'cosine.')


def init_queue(rng: jax.Array, size: int, dim: int) -> jax.Array:
  """MoCo's initial queue: random unit vectors, [size, dim] float32."""
  return l2_normalize(jax.random.normal(rng, (size, dim), jnp.float32))


def enqueue(queue: jax.Array, ptr: jax.Array, keys: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
  """MoCo's `_dequeue_and_enqueue`: write `keys` at `ptr`, oldest out first.

  `keys` is the whole global batch [B, D] in global order (under jit it is one
  global array, so MoCo's `concat_all_gather` is implicit). Requires
  Q % B == 0 (checked at startup by `train.validate_config`), so a write never
  wraps inside a batch.

  Returns:
    (new_queue, (ptr + B) % Q).
  """
  q, b = queue.shape[0], keys.shape[0]
  # Keys are targets, not a path for gradients (MoCo enqueues detached keys).
  keys = jax.lax.stop_gradient(keys).astype(queue.dtype)
  new_queue = jax.lax.dynamic_update_slice(queue, keys, (ptr, 0))
  return new_queue, ((ptr + b) % q).astype(ptr.dtype)


def init_bank(rng: jax.Array, num_rows: int, dim: int) -> jax.Array:
  """A memory bank of random unit vectors, [num_rows, dim] float32."""
  return l2_normalize(jax.random.normal(rng, (num_rows, dim), jnp.float32))


def update_bank(bank: jax.Array, index: jax.Array, features: jax.Array,
                momentum: float) -> jax.Array:
  """InsDis's bank update: v_i <- normalize(m v_i + (1 - m) f_i) at `index`.

  (Wu et al. 2018 Sec. 3.3; lemniscate's `LinearAverage` update.) Indices in
  one batch are distinct (batches are slices of a permutation), so the
  scatter has no collisions. The features are detached: the bank is a record
  of past features, never differentiated through.
  """
  f = jax.lax.stop_gradient(l2_normalize(features))
  rows = momentum * bank[index] + (1. - momentum) * f
  return bank.at[index].set(l2_normalize(rows).astype(bank.dtype))
