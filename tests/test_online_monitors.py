"""Online monitors: the linear probe never touches the encoder; both log."""

import json
import os

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import test as test_config
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import train
from numpy_reference import f32_rtol
import synthetic_data

B, HW, CLASSES = 16, 8, 4


def _step_fns(probe: bool):
  config = test_config.get_config()
  config.model.encoder_kwargs.widths = (4, 8)
  config.batch_size = B
  config.online.classifier = probe
  mesh = runtime.create_mesh()
  setup = step_lib.build(config, mesh, total_steps=10, steps_per_epoch=5,
                      num_examples=80, image_shape=(HW, HW, 1),
                      num_classes=CLASSES)
  return mesh, setup.init_fn, setup.step_fn


def _batch(mesh, step):
  rng = np.random.default_rng(step)
  host = {'views': rng.random((B, 2, HW, HW, 1), np.float32),
          'label': rng.integers(0, CLASSES, B).astype(np.int32),
          'index': np.arange(B, dtype=np.int32)}
  return jax.device_put(host, NamedSharding(mesh, P('data')))


def test_probe_trains_itself_and_leaves_the_encoder_untouched():
  runs = {}
  for probe in (False, True):
    mesh, init_fn, step_fn = _step_fns(probe)
    state = init_fn(jax.random.key(0))
    for step in range(3):
      state, metrics = step_fn(state, _batch(mesh, step), jax.random.key(1))
    runs[probe] = (jax.device_get(state), jax.device_get(metrics))
  (off, m_off), (on, m_on) = runs[False], runs[True]
  assert off.classifier_params is None and 'online/linear_acc' not in m_off
  # Stop-gradient: the encoder, head, BN statistics and optimizer state
  # evolve exactly as without the monitor (only XLA fusion may differ, which
  # reorders float32 sums over B * HW * HW positions in each of the 3 steps:
  # test_train_step's bound, here relative to each array's own scale; rtol
  # 1e-6 and atol 1e-7 were 8 ulps). A probe loss leaking into the encoder's
  # gradient (tried: the probe starts at w = 0) moves its Adam traces by
  # ~1e-3 of their scale: 7-40x this tolerance in 14 arrays.
  tol = f32_rtol(3 * B * HW * HW)
  for name in ('params', 'batch_stats', 'opt_state'):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(
        a, b, rtol=tol, atol=tol * float(np.max(np.abs(b), initial=0.))),
                 getattr(off, name), getattr(on, name))
  np.testing.assert_allclose(m_on['loss'], m_off['loss'], rtol=tol)
  assert np.any(on.classifier_params['w'] != 0)     # It did learn something.
  assert 0. <= m_on['online/linear_acc'] <= 1.
  assert np.isfinite(m_on['online/linear_loss'])


def test_online_monitors_are_logged_and_reported(tmp_path):
  config = test_config.get_config()           # 256 / 32 = 8 steps.
  config.online.classifier = True
  config.evals.online_knn.every_steps = 4
  config.evals.online_knn.ks = (5,)
  config.evals.online_knn.bank_size = 128
  config.evals.online_knn.num_queries = 32
  config.eval.baselines = False
  data = (synthetic_data.stripes_and_brightness(256, 0),
          synthetic_data.stripes_and_brightness(64, 1))
  results = train.train_and_evaluate(config, str(tmp_path), data=data)
  with open(os.path.join(tmp_path, 'history.json')) as f:
    history = json.load(f)
  knn_steps = [h['step'] for h in history if 'online/knn_weighted_top1@5' in h]
  assert knn_steps == [4, 8]
  probe_steps = [h['step'] for h in history if 'online/linear_acc' in h]
  assert probe_steps == [2, 4, 6, 8]
  assert 0. <= results['online/knn_weighted_top1@5'] <= 1.
  assert 0. <= results['online/linear_acc'] <= 1.
  # The final (offline) evaluation keeps its own, unprefixed names.
  assert 'trained/knn_weighted_top1@5' in results
