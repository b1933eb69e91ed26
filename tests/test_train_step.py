"""The train step: device-count invariance, EMA, queue, bank, no recompiles.

One process, 8 virtual CPU devices (conftest); a 1-device mesh is built from
`jax.devices()[:1]`. Tolerance of the 1-vs-8-device comparison: rtol = tol,
atol = tol * max(1, max |x|) per float32 array, tol = f32_rtol(steps * B * H *
W) = 8 eps sqrt(2048) = 4.3e-5 (see numpy_reference.f32_rtol). Only the
summation order of the cross-device reductions (BN statistics, gradients over
the B * H * W positions, the loss mean) differs, which moves each sum by about
sqrt(n) eps of its scale per step (measured here: up to 119 eps of an
array's scale, above the old atol of 1e-5 * scale = 84 eps; the old rtol 1e-4
covered the rest). A sharding bug (a missing all-reduce, per-device BN, a
row in the wrong place) moves results by O(1) of their scale. The optimizer is
SGD so that these ulps are not amplified the way Adam's first step amplifies
a near-zero gradient (g / (|g| + eps)).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import test as test_config
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import config_lib
from contrastive_jax import losses
from contrastive_jax import train
from numpy_reference import f32_rtol
from tiny_step import build_step
from tiny_step import tiny_config

B, HW, N_DATA, TOTAL = 16, 8, 40, 10
# Tests that compare 1 device with 8: CI's CPU has 8 virtual devices; on a
# single-GPU host (benchmarks/accelerator.py --parts=tests) they cannot run.
needs_8_devices = pytest.mark.skipif(
    jax.device_count() < 8, reason='compares 1 device with 8; this host has '
    f'{jax.device_count()}')


def _config(kind):
  c = tiny_config(batch=B, out_dim=8)
  c.optimizer.base_learning_rate = 2.
  c.optimizer.weight_decay = 1e-4
  c.moco.queue_size = 0
  if kind == 'simclr':
    c.loss, c.loss_kwargs = 'ntxent', {'temperature': 0.2}
  elif kind == 'moco_v2':
    c.method, c.loss = 'moco', 'infonce'
    c.loss_kwargs = {'temperature': 0.2, 'in_batch_negatives': False}
    c.moco.momentum, c.moco.queue_size = 0.9, 3 * B
  elif kind == 'insdis':
    c.method, c.loss = 'memory_bank', 'insdis'
    c.loss_kwargs = {'temperature': 0.1}
    c.augment.num_views = 1
    c.memory_bank.num_negatives = 24
  elif kind == 'jcl':
    c.method, c.loss = 'moco', 'jcl'
    c.loss_kwargs = {'temperature': 0.2, 'lam': 4.}
    c.augment.num_views = 3
    c.moco.momentum, c.moco.momentum_schedule = 0.9, 'cosine'
    c.moco.key_views, c.moco.queue_size = (1, 2), 2 * B
    c.moco.enqueue_keys = 'mean'
    c.loss_schedules = {'lam': 'epoch_ramp'}
  else:
    raise ValueError(kind)
  config_lib.validate(c)
  return c


def _build(config, mesh):
  return build_step(config, mesh, total_steps=TOTAL, num_examples=N_DATA,
                    image_shape=(HW, HW, 1))


def _batch(config, mesh, step):
  rng = np.random.default_rng(step)
  v = config.augment.num_views
  host = {'views': rng.random((B, v, HW, HW, 1), np.float32),
          'label': rng.integers(0, 4, B).astype(np.int32),
          'index': rng.permutation(N_DATA)[:B].astype(np.int32)}
  return jax.device_put(host, NamedSharding(mesh, P('data')))


def _run(config, mesh, steps=2):
  _, init_fn, step_fn = _build(config, mesh)
  rng = jax.random.key(3)
  state = init_fn(jax.random.key(0))
  init = jax.device_get(state)
  metrics = []
  for s in range(steps):
    state, m = step_fn(state, _batch(config, mesh, s), rng)
    metrics.append(jax.device_get(m))
  return init, state, metrics, step_fn


def _close(a, b):
  # Reassociated sums over B * HW * HW positions in each of _run's 2 steps
  # (module doc); atol scales with the array's magnitude (params grow to ~20
  # in 2 steps).
  b = np.asarray(b)
  tol = f32_rtol(2 * B * HW * HW)
  np.testing.assert_allclose(np.asarray(a), b, rtol=tol,
                             atol=tol * max(1., float(np.max(np.abs(b)))))


# InsDis draws its noise per device from the device's own bank shard, so its
# draws depend on the device count by design; its 1-vs-8 comparison, with the
# 1-device step fed the 8 devices' draws, is in tests/test_bank_sharding.py.
@needs_8_devices
@pytest.mark.parametrize('kind', ['simclr', 'moco_v2', 'jcl'])
def test_one_device_and_eight_devices_agree(kind):
  config = _config(kind)
  mesh1 = runtime.create_mesh(jax.devices()[:1])
  mesh8 = runtime.create_mesh()
  assert mesh1.size == 1 and mesh8.size == 8
  init, s1, m1, _ = _run(config, mesh1)
  _, s8, m8, _ = _run(config, mesh8)
  q8, q1 = (getattr(s.method_state, 'queue', None) for s in (s8, s1))
  if q8 is not None:
    assert q8.sharding.spec == P('data', None)
    assert int(s1.method_state.queue_ptr) == int(
        s8.method_state.queue_ptr) == 2 * B % config.moco.queue_size
  if getattr(s8.method_state, 'bank', None) is not None:
    assert s8.method_state.bank.sharding.spec == P('data', None)
  s1, s8 = jax.device_get(s1), jax.device_get(s8)
  # The step did something (lr is 0 on the first, warmup, step only).
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(init.params), jax.tree.leaves(s1.params)))
  assert moved > 1e-3
  jax.tree.map(_close, s1, s8)       # params, key params, queue, bank, ...
  for a, b in zip(m1, m8):
    assert a.keys() == b.keys()
    for k in a:
      _close(a[k], b[k])
      assert np.isfinite(a[k])


@pytest.mark.parametrize('momentum', [0., 1.])
def test_ema_in_the_step(momentum):
  config = _config('moco_v2')
  config.moco.momentum = momentum
  mesh = runtime.create_mesh()
  _, init_fn, step_fn = _build(config, mesh)
  rng = jax.random.key(3)
  state = init_fn(jax.random.key(0))
  init = jax.device_get(state)
  state, _ = step_fn(state, _batch(config, mesh, 0), rng)
  before = jax.device_get(state)      # The online params after step 1.
  state, _ = step_fn(state, _batch(config, mesh, 1), rng)
  after = jax.device_get(state)
  moved = any(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(before.params), jax.tree.leaves(after.params)))
  assert moved
  # momentum 1: the key encoder never moves from its init (a copy of the
  # online init); momentum 0: it is the online encoder the step started from.
  want = init.params if momentum == 1. else before.params
  jax.tree.map(np.testing.assert_array_equal, after.method_state.key_params,
               want)


def test_queue_receives_the_normalised_keys_at_the_pointer():
  # With momentum 0 the keys of step 2 come from the online params after step
  # 1: recompute them directly with the model and compare with the queue.
  config = _config('moco_v2')
  config.moco.momentum = 0.
  mesh = runtime.create_mesh(jax.devices()[:1])
  model, init_fn, step_fn = _build(config, mesh)
  rng = jax.random.key(3)
  state = init_fn(jax.random.key(0))
  queue0 = np.asarray(state.method_state.queue)
  state, _ = step_fn(state, _batch(config, mesh, 0), rng)
  s1 = jax.device_get(state)
  batch = _batch(config, mesh, 1)
  state, _ = step_fn(state, batch, rng)
  out, _ = model.apply({'params': s1.params,
                        'batch_stats': s1.method_state.key_batch_stats},
                       np.asarray(batch['views'])[:, 1], train=True,
                       mutable=['batch_stats'])
  k = np.asarray(out['projection'], np.float64)
  k /= np.linalg.norm(k, axis=1, keepdims=True)
  queue = np.asarray(state.method_state.queue)
  np.testing.assert_allclose(queue[B:2 * B], k, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(queue[2 * B:], queue0[2 * B:])  # Untouched.
  assert int(state.method_state.queue_ptr) == 2 * B


def test_memory_bank_rows_of_the_batch_are_updated():
  config = _config('insdis')
  mesh = runtime.create_mesh(jax.devices()[:1])
  model, init_fn, step_fn = _build(config, mesh)
  state = init_fn(jax.random.key(0))
  s0 = jax.device_get(state)
  batch = _batch(config, mesh, 0)
  state, _ = step_fn(state, batch, jax.random.key(3))
  out, _ = model.apply({'params': s0.params, 'batch_stats': s0.batch_stats},
                       np.asarray(batch['views'])[:, 0], train=True,
                       mutable=['batch_stats'])
  f = np.asarray(out['projection'], np.float64)
  f /= np.linalg.norm(f, axis=1, keepdims=True)
  idx = np.asarray(batch['index'])
  bank0 = s0.method_state.bank
  want = 0.5 * bank0[idx] + 0.5 * f
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  bank = np.asarray(state.method_state.bank)
  np.testing.assert_allclose(bank[idx], want, rtol=1e-4, atol=1e-5)
  rest = np.setdiff1d(np.arange(bank.shape[0]), idx)
  np.testing.assert_array_equal(bank[rest], bank0[rest])


@needs_8_devices
def test_shuffle_bn():
  # On one device per-device BN is global BN and the permutation is undone:
  # the same step. On 8 devices (2 keys per device) the keys differ.
  config = _config('moco_v2')
  shuffled = _config('moco_v2')
  shuffled.moco.shuffle_bn = True
  mesh1 = runtime.create_mesh(jax.devices()[:1])
  _, a, ma, _ = _run(config, mesh1)
  _, b, mb, _ = _run(shuffled, mesh1)
  jax.tree.map(_close, jax.device_get(a), jax.device_get(b))
  _close(ma[-1]['loss'], mb[-1]['loss'])
  _, c, mc, _ = _run(shuffled, runtime.create_mesh())
  assert np.isfinite(mc[-1]['loss'])
  assert abs(float(mc[-1]['pos_sim']) - float(ma[-1]['pos_sim'])) > 1e-3


def test_no_recompilation_between_steps():
  # JCL has the most traced per-step scalars: the cosine momentum, the lambda
  # ramp and the queue pointer.
  config = _config('jcl')
  _, _, metrics, step_fn = _run(config, runtime.create_mesh(), steps=4)
  assert step_fn._cache_size() == 1
  lams = [float(m['lam']) for m in metrics]
  # lambda_t = 4 (epoch + 1) / ceil(num_epochs=1): 4 from the first epoch on.
  np.testing.assert_allclose(lams, [4., 4., 4., 4.])
  moms = [float(m['momentum']) for m in metrics]
  np.testing.assert_allclose(
      moms, [1 - 0.1 * (np.cos(np.pi * s / TOTAL) + 1) / 2 for s in range(4)],
      rtol=1e-6)


def test_lambda_ramp_per_epoch():
  config = _config('jcl')
  config.num_epochs = 4.
  ramp = step_lib.build(config, runtime.create_mesh(jax.devices()[:1]),
                     total_steps=8, steps_per_epoch=2, num_examples=N_DATA,
                     image_shape=(HW, HW, 1)).loss.schedules['lam']
  got = [float(ramp(jnp.int32(s))) for s in range(8)]
  np.testing.assert_allclose(got, [1., 1., 2., 2., 3., 3., 4., 4.])


@pytest.mark.parametrize('change, match', [
    (dict(method='moco', loss='infonce', queue_size=24), 'multiple of'),
    (dict(method='nope'), 'unknown method'),
    (dict(method='in_batch', loss='infonce'), 'cannot be fed'),
    (dict(loss='ntxent', use_labels=True), 'takes no labels'),
    (dict(method='moco', loss='infonce', key_views=(2,)), 'view ids'),
    (dict(method='memory_bank', loss='insdis'), 'one view'),
])
def test_bad_method_configs_fail_early(change, match):
  c = test_config.get_config()
  for k in ('method', 'loss', 'use_labels'):
    if k in change:
      c[k] = change[k]
  if 'queue_size' in change:
    c.moco.queue_size = change['queue_size']
  if 'key_views' in change:
    c.moco.key_views = change['key_views']
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c)


@pytest.mark.parametrize('kind', ['simclr', 'moco_v2'])
def test_loss_scale_multiplies_the_loss_and_its_gradient(kind):
  # config.loss_scale = s: the step differentiates s x loss. With SGD, no
  # momentum and no weight decay, one step's logged loss, grad norm and
  # parameter change are s times those of the same step at s = 1, while the
  # loss's own metrics (similarities) are unchanged.
  mesh = runtime.create_mesh(jax.devices()[:1])
  s = 0.8
  runs = {}
  for scale in (1.0, s):
    config = _config(kind)
    config.optimizer.momentum = 0.
    config.optimizer.weight_decay = 0.
    config.optimizer.warmup_fraction = 0.   # The peak lr at step 0.
    config.loss_scale = scale
    config_lib.validate(config, num_devices=1)
    init, state, metrics, _ = _run(config, mesh, steps=1)
    delta = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b,
                         jax.device_get(state.params), init.params)
    runs[scale] = metrics[0], delta
  (m1, d1), (ms, ds) = runs[1.0], runs[s]
  np.testing.assert_allclose(ms['loss'], s * m1['loss'], rtol=1e-6)
  np.testing.assert_allclose(ms['grad_norm'], s * m1['grad_norm'], rtol=1e-5)
  np.testing.assert_allclose(ms['pos_sim'], m1['pos_sim'], rtol=1e-6)
  assert float(np.max(np.abs(jax.tree.leaves(d1)[0]))) > 0
  for a, b in zip(jax.tree.leaves(ds), jax.tree.leaves(d1)):
    np.testing.assert_allclose(a, s * b, rtol=1e-4,
                               atol=1e-6 * max(1., float(np.max(np.abs(b)))))


@pytest.mark.parametrize('scale', [0., -1.])
def test_loss_scale_must_be_a_positive_number(scale):
  c = test_config.get_config()
  c.loss_scale = scale
  with pytest.raises(ValueError, match='loss_scale'):
    config_lib.validate(c)
