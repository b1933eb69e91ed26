"""The encoders' BatchNorm (contrastive_jax/batch_norm.py), fused and not.

References: float64 numpy (the forward and the running-statistics update
written out, two-pass variance; gradients by central differences of that
numpy forward), flax.linen.BatchNorm followed by the add and nn.relu (the
layers the encoders used before the fused form), and the same computation on
one device against the batch sharded over eight.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import batch_norm
from contrastive_jax import models
from contrastive_jax import runtime

EPS = 1e-5


def _numpy_bn(x, scale, bias, residual, groups, relu):
  """float64: (y, mean [G, C], var [G, C]) of training-mode BatchNorm."""
  g = x.reshape((groups, -1) + x.shape[1:])
  axes = tuple(range(1, g.ndim - 1))
  mean = g.mean(axis=axes, keepdims=True)
  var = ((g - mean) ** 2).mean(axis=axes, keepdims=True)
  t = ((g - mean) / np.sqrt(var + EPS) * scale + bias).reshape(x.shape)
  if residual is not None:
    t = t + residual
  c = x.shape[-1]
  return (np.maximum(t, 0.) if relu else t, mean.reshape(groups, c),
          var.reshape(groups, c))


def _inputs(shape=(8, 3, 3, 4), groups=2, seed=0):
  """x with groups of different means and scales, and the other inputs."""
  rng = np.random.default_rng(seed)
  n, c = shape[0], shape[-1]
  spread = np.repeat(rng.uniform(0.5, 3., groups), n // groups)
  offset = np.repeat(rng.normal(0., 2., groups), n // groups)
  x = rng.normal(size=shape) * spread.reshape((n,) + (1,) * (len(shape) - 1))
  x += offset.reshape((n,) + (1,) * (len(shape) - 1))
  return {'x': x, 'scale': rng.uniform(0.5, 2., c), 'bias': rng.normal(size=c),
          'residual': rng.normal(size=shape), 'ct': rng.normal(size=shape)}


def _central_differences(f, args, h=1e-6):
  """d f(*args) / d each array of `args`, float64 central differences."""
  grads = []
  for i, a in enumerate(args):
    if a is None:
      grads.append(None)
      continue
    grad = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
      hi = [np.array(b, copy=True) if b is not None else None for b in args]
      lo = [np.array(b, copy=True) if b is not None else None for b in args]
      hi[i][idx] += h
      lo[i][idx] -= h
      grad[idx] = (f(*hi) - f(*lo)) / (2 * h)
    grads.append(grad)
  return grads


@pytest.mark.parametrize('fused', [True, False])
@pytest.mark.parametrize('groups', [1, 2])
@pytest.mark.parametrize('residual,relu', [(False, False), (False, True),
                                           (True, True)])
def test_values_gradients_and_statistics_equal_a_float64_reference(
    fused, groups, residual, relu):
  d = _inputs(groups=2)
  r = d['residual'] if residual else None
  want_y, want_mean, want_var = _numpy_bn(d['x'], d['scale'], d['bias'], r,
                                          groups, relu)
  if relu:   # No value at the ReLU's kink, where differences are undefined.
    assert np.abs(want_y[want_y > 0]).min() > 1e-3
  module = batch_norm.BatchNorm(splits=groups, fused=fused, epsilon=EPS)
  stats = {'mean': np.full(4, 0.5), 'var': np.full(4, 2.)}
  f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)

  def apply(x, scale, bias, r):
    return module.apply(
        {'params': {'scale': scale, 'bias': bias},
         'batch_stats': jax.tree.map(f32, stats)},
        x, residual=r, relu=relu, mutable=['batch_stats'])

  (y, new), vjp = jax.vjp(apply, f32(d['x']), f32(d['scale']), f32(d['bias']),
                          f32(r))
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  # The running statistics keep 0.9 and move 0.1 towards the mean over the
  # groups of their means and biased variances.
  np.testing.assert_allclose(new['batch_stats']['mean'],
                             0.9 * 0.5 + 0.1 * want_mean.mean(0), rtol=1e-5)
  np.testing.assert_allclose(new['batch_stats']['var'],
                             0.9 * 2. + 0.1 * want_var.mean(0), rtol=1e-5)
  zero_stats = jax.tree.map(jnp.zeros_like, new)
  grads = vjp((f32(d['ct']), zero_stats))
  want = _central_differences(
      lambda x, s, b, r: np.vdot(_numpy_bn(x, s, b, r, groups, relu)[0],
                                 d['ct']),
      [d['x'], d['scale'], d['bias'], r])
  for name, got, ref in zip(('x', 'scale', 'bias', 'residual'), grads, want):
    if ref is None:
      assert got is None
      continue
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4, err_msg=name)


def test_gradients_through_the_returned_statistics():
  # The statistics fused_batch_norm returns carry their own gradient (zero
  # in training, where only the running averages read them).
  d = _inputs(groups=2)
  rng = np.random.default_rng(5)
  a, b = rng.normal(size=(2, 4)), rng.normal(size=(2, 4))

  def ours(x, scale, bias):
    y, mean, var = batch_norm.fused_batch_norm(x, scale, bias, None, 2, True,
                                               EPS)
    return (jnp.vdot(y, jnp.asarray(d['ct'], jnp.float32))
            + jnp.vdot(mean, jnp.asarray(a, jnp.float32))
            + jnp.vdot(var, jnp.asarray(b, jnp.float32)))

  def reference(x, scale, bias):
    y, mean, var = _numpy_bn(x, scale, bias, None, 2, True)
    return np.vdot(y, d['ct']) + np.vdot(mean, a) + np.vdot(var, b)

  got = jax.grad(ours, argnums=(0, 1, 2))(
      *(jnp.asarray(d[k], jnp.float32) for k in ('x', 'scale', 'bias')))
  want = _central_differences(reference, [d['x'], d['scale'], d['bias']])
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


def _flax_then_add_relu(x, variables, residual, relu):
  """What the encoders computed before: nn.BatchNorm, then x + y, nn.relu."""
  y, new = nn.BatchNorm(use_running_average=False, momentum=0.9,
                        epsilon=EPS).apply(variables, x,
                                           mutable=['batch_stats'])
  if residual is not None:
    y = residual + y
  return (nn.relu(y) if relu else y), new


@pytest.mark.parametrize('shape', [(16, 5, 5, 6), (32, 12)])
def test_equal_to_flax_batch_norm_add_relu(shape):
  d = _inputs(shape, groups=1, seed=1)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  variables = {'params': {'scale': f32(d['scale']), 'bias': f32(d['bias'])},
               'batch_stats': {'mean': f32(d['scale'] - 1),
                               'var': f32(d['scale'] + 1)}}
  ct = f32(d['ct'])

  def loss(fn):
    def f(params, x, r):
      (y, new) = fn({**variables, 'params': params}, x, r)
      return jnp.vdot(y, ct), (y, new)
    return jax.jit(jax.grad(f, argnums=(0, 1, 2), has_aux=True))

  args = (variables['params'], f32(d['x']), f32(d['residual']))
  ref_grads, (ref_y, ref_new) = loss(
      lambda v, x, r: _flax_then_add_relu(x, v, r, True))(*args)
  for fused in (False, True):
    module = batch_norm.BatchNorm(fused=fused, epsilon=EPS)
    grads, (y, new) = loss(lambda v, x, r, m=module: m.apply(
        v, x, residual=r, relu=True, mutable=['batch_stats']))(*args)
    if not fused:   # nn.BatchNorm's own code: identical, bit for bit.
      jax.tree.map(np.testing.assert_array_equal, (grads, y, new),
                   (ref_grads, ref_y, ref_new))
      continue
    # Fused: the same sums in another order (float32 rounding).
    np.testing.assert_allclose(y, ref_y, rtol=1e-6, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6,
                                                         atol=1e-6),
                 new, ref_new)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                         atol=1e-5),
                 grads, ref_grads)


def test_bfloat16_inputs_keep_float32_statistics():
  d = _inputs((16, 4, 4, 8), groups=1, seed=2)
  x = jnp.asarray(d['x'], jnp.bfloat16)
  r = jnp.asarray(d['residual'], jnp.bfloat16)
  variables = batch_norm.BatchNorm().init(jax.random.key(0), x)
  want_y, want_mean, want_var = _numpy_bn(
      np.asarray(x, np.float64), np.ones(8), np.zeros(8),
      np.asarray(r, np.float64), 1, True)
  for fused in (True, False):
    y, new = batch_norm.BatchNorm(fused=fused, dtype=jnp.bfloat16).apply(
        variables, x, residual=r, relu=True, mutable=['batch_stats'])
    assert y.dtype == jnp.bfloat16
    assert new['batch_stats']['mean'].dtype == jnp.float32
    # Statistics of the bfloat16 values computed in float32: float32-close.
    np.testing.assert_allclose(new['batch_stats']['mean'],
                               0.1 * want_mean[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new['batch_stats']['var'],
                               0.9 + 0.1 * want_var[0], rtol=1e-5)
    # The output to bfloat16's resolution (8 bits: 2^-8 relative).
    np.testing.assert_allclose(np.asarray(y, np.float64), want_y, rtol=1e-2,
                               atol=2e-2)


@pytest.mark.parametrize('groups', [1, 2])
def test_sharded_batch_equals_one_device(groups):
  # Statistics over the global batch (or its groups) when the batch is
  # sharded over 8 devices: the partitioner's all-reduces, in the forward and
  # the textbook backward alike.
  assert jax.device_count() == 8
  d = _inputs((16, 3, 3, 4), groups=2, seed=3)
  module = batch_norm.BatchNorm(splits=groups)
  x, r, ct = (jnp.asarray(d[k], jnp.float32) for k in ('x', 'residual', 'ct'))
  variables = module.init(jax.random.key(0), x)

  def step(variables, x, r, ct):
    def f(params, x, r):
      y, new = module.apply({**variables, 'params': params}, x, residual=r,
                            relu=True, mutable=['batch_stats'])
      return jnp.vdot(y, ct), new
    return jax.grad(f, argnums=(0, 1, 2), has_aux=True)(
        variables['params'], x, r)

  one = jax.jit(step)(variables, x, r, ct)
  mesh = runtime.create_mesh()
  shard = lambda a: jax.device_put(a, NamedSharding(mesh, P('data')))
  eight = jax.jit(step)(variables, shard(x), shard(r), shard(ct))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                       atol=1e-6), eight, one)


def test_eval_mode_uses_the_running_statistics():
  d = _inputs(groups=2)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  stats = {'mean': d['scale'] - 1, 'var': d['scale'] + 1}
  variables = {'params': {'scale': f32(d['scale']), 'bias': f32(d['bias'])},
               'batch_stats': jax.tree.map(f32, stats)}
  want = np.maximum((d['x'] - stats['mean']) / np.sqrt(stats['var'] + EPS)
                    * d['scale'] + d['bias'] + d['residual'], 0.)
  for fused in (True, False):
    y = batch_norm.BatchNorm(use_running_average=True, splits=2,
                             fused=fused).apply(
                                 variables, f32(d['x']),
                                 residual=f32(d['residual']), relu=True)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_a_batch_that_does_not_split_is_refused():
  x = jnp.zeros((10, 3, 3, 5))
  variables = batch_norm.BatchNorm(splits=5).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match='multiple of config.model.bn_splits'):
    batch_norm.BatchNorm(splits=3).apply(variables, x,
                                         mutable=['batch_stats'])


@pytest.mark.parametrize('encoder,kwargs,shape', [
    ('small_cnn', {'widths': (4, 8)}, (8, 12, 12, 1)),
    ('resnet18', {'width': 4, 'stem': 'cifar'}, (8, 16, 16, 3)),
    ('resnet50', {'width': 2}, (8, 32, 32, 3)),
])
def test_encoders_fused_equal_unfused(encoder, kwargs, shape):
  # The switch changes how the gradient is computed, not the model:
  # parameters, outputs, gradients and statistics agree.
  x = jax.random.uniform(jax.random.key(1), shape)
  nets = {fused: models.ENCODERS[encoder](**kwargs, fused_bn=fused)
          for fused in (True, False)}
  variables = nets[True].init(jax.random.key(0), x, train=False)
  assert jax.tree.structure(variables) == jax.tree.structure(
      nets[False].init(jax.random.key(0), x, train=False))

  def run(net):
    def f(params):
      y, new = net.apply({**variables, 'params': params}, x, train=True,
                         mutable=['batch_stats'])
      return jnp.sum(jnp.sin(y)), (y, new)
    return jax.jit(jax.grad(f, has_aux=True))(variables['params'])

  got, want = run(nets[True]), run(nets[False])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=2e-4, atol=2e-5 * max(1., float(np.abs(b).max()))),
               got, want)
