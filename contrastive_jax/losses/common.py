"""Helpers shared by every loss: normalisation and input validation.

Every loss in this package follows one convention:

* in-batch losses take ``z: [N, V, D]`` (N instances, V views of each);
* losses with a key encoder take ``query: [N, Vq, D]`` and ``key: [N, Vk, D]``
  and optional negatives ``queue: [Q, D]`` (a MoCo queue or a memory bank);
* supervised losses also take ``labels: [N]`` (int);
* hyperparameters are keyword-only, with the paper's defaults;
* the return value is ``(loss, metrics)``: a float32 scalar and a flat dict of
  float32 scalars.

Inputs are L2-normalised inside the loss; similarities are computed in float32
whatever the input dtype, so bfloat16 embeddings are safe at small
temperatures, and in full float32 on every backend (`float32_matmuls`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]
LossOutput = tuple[jax.Array, Metrics]


def float32_matmuls(fn: Callable) -> Callable:
  """`fn` with every matrix product it traces in full float32.

  A float32 matmul's default precision depends on the backend: exact float32
  on CPUs, TF32 (a 10-bit mantissa, ~1e-3 relative error) on NVIDIA GPUs,
  bf16 passes on TPUs. A loss divides cosine similarities by a temperature
  of 0.05-0.5 before a softmax, which turns 1e-3 errors in the similarities
  into errors of 1e-2 in the logits. The losses' products ([N, D] x [D, N]
  and similar) cost little next to the encoder's, so every loss runs them in
  full precision, forward and backward, whatever
  `jax_default_matmul_precision` says; the encoder's precision is the
  config's (`config.model.dtype`).
  """
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.default_matmul_precision('float32'):
      return fn(*args, **kwargs)
  return wrapped


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
  """Returns x / ||x|| along `axis`, computed in float32.

  Uses rsqrt(max(sum_sq, eps)) (as BYOL does) so that an all-zero vector maps to
  zero with a finite gradient instead of NaN.
  """
  x = jnp.asarray(x, jnp.float32)
  sum_sq = jnp.sum(x * x, axis=axis, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sum_sq, eps))


# The most views per instance a recipe makes (multi-crop: 2 + 8).
MAX_VIEWS = 64


def check_views(z, name: str, *, min_views: int = 1, max_views: int | None = None
                ) -> None:
  """Raises ValueError unless `z` is [N, V, D] with min_views <= V <= max_views.

  Shapes are static under jit, so this check costs nothing at run time and
  fails at trace time with a message naming the argument.
  """
  shape = jnp.shape(z)
  if len(shape) != 3:
    raise ValueError(
        f'{name} must have shape [N, V, D] (instances, views, dim); got shape '
        f'{tuple(shape)}. Stack views with jnp.stack(views, axis=1).')
  n, v = shape[0], shape[1]
  if v > max(n, MAX_VIEWS):
    # More views than instances, and more than any recipe makes: most likely
    # views stacked first. (Where both counts are plausible, the shape
    # cannot tell the layouts apart.)
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


def check_labels(labels, n: int, name: str = 'labels') -> None:
  """Raises ValueError unless `labels` is an int vector of length n."""
  if labels is None:
    raise ValueError(
        f'this loss is supervised: pass {name}=... (int class ids of shape '
        f'[{n}]).')
  shape = jnp.shape(labels)
  if shape != (n,):
    raise ValueError(f'{name} must have shape [{n}] (one id per instance); got '
                     f'shape {tuple(shape)}.')


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
