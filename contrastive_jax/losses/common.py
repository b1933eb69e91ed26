"""Helpers shared by the losses: normalisation, masks and input checks.

The conventions (shapes, float32, masks, queues) are in docs/losses.md.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

LossOutput = tuple[jax.Array, dict[str, jax.Array]]   # (loss, metrics)

MASKED = -1e9      # Logit of masked-out entries: finite, exp() is exactly 0.
MAX_VIEWS = 64     # The most views per instance a recipe makes (2 + 8 crops).


def float32_matmuls(fn: Callable) -> Callable:
  """`fn` with every matrix product it traces in full float32 precision."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.default_matmul_precision('float32'):
      return fn(*args, **kwargs)
  return wrapped


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
  """x / ||x|| along `axis` in float32; a zero vector maps to 0, not NaN."""
  x = jnp.asarray(x, jnp.float32)
  sum_sq = jnp.sum(x * x, axis=axis, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sum_sq, eps))


def in_batch(z, min_instances: int = 1):
  """Checks z [N, V >= 2, D]; (rows, cosines, pos, neg, self masks), M = N*V.

  rows: [M, D] unit, instance-major (row i*V + v); the rest [M, M].
  """
  check_views(z, 'z', min_views=2)
  n, v, d = z.shape
  if n < min_instances:
    raise ValueError(f'z must hold at least {min_instances} instances (shape '
                     f'[N, V, D]); got shape {tuple(z.shape)}.')
  zf = l2_normalize(z).reshape(n * v, d)
  inst = jnp.repeat(jnp.arange(n), v)
  same = inst[:, None] == inst[None, :]
  self_mask = jnp.eye(n * v, dtype=bool)
  return zf, zf @ zf.T, same & ~self_mask, ~same, self_mask


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of x over mask (0 when the mask is empty), as a float32 scalar."""
  total = jnp.sum(jnp.where(mask, x, 0.))
  return (total / jnp.maximum(jnp.sum(mask), 1)).astype(jnp.float32)


def unit_queue(queue: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(queue in float32 under stop_gradient, [Q] inverse row norms)."""
  queue = jax.lax.stop_gradient(jnp.asarray(queue, jnp.float32))
  return queue, jax.lax.rsqrt(jnp.maximum(jnp.sum(queue * queue, -1), 1e-12))


def queue_logits(anchors: jax.Array, queue: jax.Array,
                 temperature: float) -> jax.Array:
  """[A, Q] cosine logits of unit `anchors` [A, D] against raw `queue` rows."""
  queue, inv_norm = unit_queue(queue)
  return (anchors @ queue.T) * (inv_norm / temperature)[None, :]


def pair_sims(a: jax.Array, b: jax.Array, pairs) -> jax.Array:
  """[P, N, N] cosines of view p[0] of `a` [N, Va, D] with view p[1] of `b`."""
  a_idx = jnp.array([p[0] for p in pairs])
  b_idx = jnp.array([p[1] for p in pairs])
  return jnp.einsum('npd,mpd->pnm', a[:, a_idx], b[:, b_idx])


def check_choice(name: str, value, options) -> None:
  """Raises ValueError unless `value` is one of `options`."""
  if value not in options:
    raise ValueError(f'{name} must be {" or ".join(map(repr, options))}; got '
                     f'{value!r}.')


def check_temperature(temperature) -> None:
  if isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f'temperature must be > 0; got {temperature}.')


def check_views(z, name: str, *, min_views: int = 1,
                max_views: int | None = None) -> None:
  """Raises ValueError unless `z` is [N, V, D], min_views <= V <= max_views."""
  shape = jnp.shape(z)
  if len(shape) != 3:
    raise ValueError(
        f'{name} must have shape [N, V, D] (instances, views, dim); got shape '
        f'{tuple(shape)}. Stack views with jnp.stack(views, axis=1).')
  n, v = shape[0], shape[1]
  if v > max(n, MAX_VIEWS):
    # More views than instances and than any recipe makes: views stacked first.
    raise ValueError(
        f'{name} has shape {tuple(shape)}: {v} views of {n} instances. {name} '
        f'is [N, V, D]; views stacked first ([V, N, D]) need '
        f'{name}.swapaxes(0, 1), or jnp.stack(views, axis=1).')
  if v < min_views or (max_views is not None and v > max_views):
    want = (f'at least {min_views}' if max_views is None else
            f'between {min_views} and {max_views}')
    raise ValueError(
        f'{name} has {v} views (shape {tuple(shape)}) but this loss needs '
        f'{want} views per instance.')


def check_same_dim(a, b, name_a: str, name_b: str) -> None:
  """Raises ValueError unless the last (embedding) dims of a and b agree."""
  if jnp.shape(a)[-1] != jnp.shape(b)[-1]:
    raise ValueError(
        f'{name_a} and {name_b} must share the embedding dim D; got '
        f'{tuple(jnp.shape(a))} and {tuple(jnp.shape(b))}.')


def check_queue(queue, d: int) -> None:
  """Raises ValueError unless `queue` is None or [Q, d]."""
  if queue is None:
    return
  shape = jnp.shape(queue)
  if len(shape) != 2 or shape[1] != d:
    raise ValueError(f'queue must have shape [Q, {d}] (negatives, dim); got '
                     f'shape {tuple(shape)}.')
