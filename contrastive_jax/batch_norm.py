"""The encoders' BatchNorm: float32 statistics, optionally per group of the
batch, with the residual add and ReLU after it fused in.

`BatchNorm(...)(x, residual=r, relu=True)` computes
    y = relu(scale * (x - mean) / sqrt(var + eps) + bias + r)
with the biased batch statistics of x. `fused=True`: the textbook backward
(`fused_batch_norm`, two passes over the memory-bound tensors), else
autodiff's; equal to float32 rounding. Names and dtypes are nn.BatchNorm's,
so checkpoints do not depend on `config.model.fused_bn`.
"""

from __future__ import annotations

import functools
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero


# Running statistics keep 0.9 of their value: PyTorch's momentum=0.1, TF's
# decay 0.9 (configs/papers/recipes.yaml rows `encoder.bn_momentum`).
BN_MOMENTUM = 0.9


def _grouped(x, groups: int):
  """[N, ..., C] -> ([G, N / G, ..., C], its reduction axes)."""
  if groups == 1:
    return x, tuple(range(x.ndim - 1))
  xg = x.reshape((groups, x.shape[0] // groups) + x.shape[1:])
  return xg, tuple(range(1, xg.ndim - 1))


def _statistics(x32, axes):
  """Mean and biased variance over `axes`: E[x^2] - E[x]^2, clipped at 0."""
  mean = jnp.mean(x32, axes, keepdims=True)
  mean2 = jnp.mean(lax.square(x32), axes, keepdims=True)
  return mean, jnp.maximum(0., mean2 - lax.square(mean))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def fused_batch_norm(x, scale, bias, residual, groups: int, relu: bool,
                     epsilon: float):
  """Training-mode BatchNorm [+ residual] [+ ReLU] with its textbook backward.

  x: [N, ..., C]; scale, bias: [C] float32; residual: None or x's shape;
  each of `groups` contiguous groups of N / G examples has its own
  statistics. Returns (y in x.dtype, mean [G, C], var [G, C]). With xhat the
  normalised x and g the gradient past the ReLU: dbias = sum g, dscale =
  sum g xhat, dx = scale rsqrt(var + eps) (g - dbias / M - xhat dscale / M).
  """
  return _forward(x, scale, bias, residual, groups, relu, epsilon)[0]


def _forward(x, scale, bias, residual, groups, relu, epsilon):
  xg, axes = _grouped(x, groups)
  x32 = xg.astype(jnp.float32)
  mean, var = _statistics(x32, axes)
  rstd = lax.rsqrt(var + epsilon)
  t = (x32 - mean) * (rstd * scale) + bias
  if residual is not None:
    t = t + residual.reshape(xg.shape).astype(jnp.float32)
  y = (jnp.maximum(t, 0.) if relu else t).astype(x.dtype).reshape(x.shape)
  c = x.shape[-1]
  return (y, mean.reshape(groups, c), var.reshape(groups, c)), (
      mean, rstd, y)


def _fused_fwd(x, scale, bias, residual, groups, relu, epsilon):
  # symbolic_zeros: the differentiable inputs arrive wrapped (None as is).
  x, scale, bias = x.value, scale.value, bias.value
  residual = None if residual is None else residual.value
  out, (mean, rstd, y) = _forward(x, scale, bias, residual, groups, relu,
                                  epsilon)
  # An empty array of the residual's dtype stands for it: the backward
  # returns a gradient of its dtype, or None where there was none.
  marker = None if residual is None else jnp.zeros((0,), residual.dtype)
  return out, (x, scale, mean, rstd, y if relu else None, marker)


def _fused_bwd(groups, relu, epsilon, saved, cotangents):
  del epsilon  # In rstd.
  x, scale, mean, rstd, y, marker = saved
  dy, dmean, dvar = cotangents
  xg, axes = _grouped(x, groups)
  m = xg.size // (groups * x.shape[-1])
  g = (jnp.zeros(xg.shape, jnp.float32) if isinstance(dy, SymbolicZero)
       else dy.reshape(xg.shape).astype(jnp.float32))
  if relu:    # nn.relu's gradient: 0 where the output is 0.
    g = jnp.where(y.reshape(xg.shape) > 0, g, 0.)
  xhat = (xg.astype(jnp.float32) - mean) * rstd
  dbias = jnp.sum(g, axes, keepdims=True)
  dscale = jnp.sum(g * xhat, axes, keepdims=True)
  dx = (scale * rstd) * (g - (dbias + xhat * dscale) / m)
  if not isinstance(dmean, SymbolicZero):
    dx = dx + dmean.reshape(mean.shape) / m
  if not isinstance(dvar, SymbolicZero):
    dx = dx + (2. / m) * dvar.reshape(mean.shape) * (xhat / rstd)
  c = x.shape[-1]
  dresidual = (None if marker is None
               else g.astype(marker.dtype).reshape(x.shape))
  return (dx.astype(x.dtype).reshape(x.shape),
          jnp.sum(dscale.reshape(groups, c), 0),
          jnp.sum(dbias.reshape(groups, c), 0), dresidual)


fused_batch_norm.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


class BatchNorm(nn.BatchNorm):
  """nn.BatchNorm [+ residual add] [+ ReLU], over the batch or groups of it.

  In training each of `splits` contiguous groups of the batch has its own
  statistics (MoCo's per-GPU BN); the running ones move towards their mean.
  """
  use_running_average: bool = False
  momentum: float = BN_MOMENTUM
  splits: int = 1
  fused: bool = True

  @nn.compact
  def __call__(self, x, residual=None, relu: bool = False):  # pylint: disable=arguments-renamed
    n, s = x.shape[0], self.splits
    if self.use_running_average or (s == 1 and not self.fused):
      return self._finish(super().__call__(x), residual, relu)
    if s < 1 or n % s:
      raise ValueError(
          f'BatchNorm: a batch of {n} does not split into {s} equal groups; '
          'set config.batch_size to a multiple of config.model.bn_splits.')
    c = x.shape[-1]
    ra_mean = self.variable('batch_stats', 'mean',
                            lambda s: jnp.zeros(s, jnp.float32), (c,))
    ra_var = self.variable('batch_stats', 'var',
                           lambda s: jnp.ones(s, jnp.float32), (c,))
    scale = self.param('scale', self.scale_init, (c,), jnp.float32)
    bias = self.param('bias', self.bias_init, (c,), jnp.float32)
    dtype = self.dtype or jnp.result_type(x.dtype, jnp.float32)
    if self.fused:
      y, mean, var = fused_batch_norm(
          x.astype(dtype), scale, bias,
          None if residual is None else residual.astype(dtype), s, relu,
          self.epsilon)
    else:
      xg, axes = _grouped(x, s)
      mean, var = _statistics(xg.astype(jnp.float32), axes)
      y = (xg - mean) * (lax.rsqrt(var + self.epsilon) * scale) + bias
      y = self._finish(y.astype(dtype).reshape(x.shape), residual, relu)
      mean, var = mean.reshape(s, c), var.reshape(s, c)
    if not self.is_initializing():
      m = self.momentum
      ra_mean.value = m * ra_mean.value + (1 - m) * jnp.mean(mean, 0)
      ra_var.value = m * ra_var.value + (1 - m) * jnp.mean(var, 0)
    return y

  @staticmethod
  def _finish(y, residual, relu):
    if residual is not None:
      y = residual + y
    return nn.relu(y) if relu else y


def batch_norm(*, train: bool, dtype, bn_splits: int = 0, fused: bool = True):
  """The encoders' BatchNorm (call it with `name=`); `bn_splits` 0: statistics
  over the whole batch, > 0: over that many groups."""
  return functools.partial(BatchNorm, use_running_average=not train,
                           dtype=dtype, splits=max(bn_splits, 1), fused=fused)
