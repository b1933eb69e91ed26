"""BYOL (the README's worked example of a method): its loss and its step.

References are independent of the method module: the loss is checked against
a numpy loop of Eq. 2 and its closed-form extremes, the step's loss against
Eq. 2 applied to outputs of the model called directly (online predictions of
views (0, 1), target projections of views (1, 0)), and the target's update
against the EMA written out in numpy.
"""

import os
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import byol as byol_config
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import config_lib
from contrastive_jax import losses
from contrastive_jax import reporting
from contrastive_jax import train
from numpy_reference import f32_rtol

B, HW = 16, 8


def _numpy_regression(q, k):
  total = 0.
  for i in range(q.shape[0]):
    for v in range(q.shape[1]):
      a, b = q[i, v].astype(np.float64), k[i, v].astype(np.float64)
      total += 2. - 2. * a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
  return total / (q.shape[0] * q.shape[1])


def test_loss_is_eq2_of_the_paper():
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(6, 2, 5)), rng.normal(size=(6, 2, 5))
  loss, metrics = losses.apply('byol', losses.LossInputs(
      z=q.astype(np.float32), key=k.astype(np.float32)))
  np.testing.assert_allclose(loss, _numpy_regression(q, k),
                             rtol=f32_rtol(10))
  # Extremes: 0 for a positive multiple of the target, 4 for its opposite.
  zero, _ = losses.apply('byol', losses.LossInputs(
      z=np.float32(3.) * k.astype(np.float32), key=k.astype(np.float32)))
  four, _ = losses.apply('byol', losses.LossInputs(
      z=-k.astype(np.float32), key=k.astype(np.float32)))
  assert abs(float(zero)) < 1e-6 and abs(float(four) - 4.) < 1e-6
  assert abs(float(metrics['cosine']) - (1. - float(loss) / 2.)) < 1e-6


def test_loss_refuses_mismatched_pairs_and_negatives():
  z = np.ones((4, 2, 3), np.float32)
  with pytest.raises(ValueError, match='same shape'):
    losses.apply('byol', losses.LossInputs(z=z, key=z[:, :1]))
  with pytest.raises(ValueError, match='takes no queue'):
    losses.apply('byol', losses.LossInputs(z=z, key=z, queue=z[0]))


def _setup(config, mesh):
  return step_lib.build(config, mesh, total_steps=10, steps_per_epoch=5,
                     num_examples=64, image_shape=(HW, HW, 1))


def _tiny():
  c = byol_config.get_config()
  c.model.encoder_kwargs.widths = (4, 8)
  c.model.head_hidden_dim, c.model.head_out_dim = 16, 8
  c.moco.predictor_hidden_dim = 12
  c.batch_size = B
  c.online.classifier = False
  return c


def test_step_regresses_online_predictions_on_the_ema_target():
  config = _tiny()
  mesh = runtime.create_mesh()
  setup = _setup(config, mesh)
  state = setup.init_fn(jax.random.key(0))
  s0 = jax.device_get(state)
  assert s0.method_state.queue is None            # No negatives (Sec. 3.1).
  rng = np.random.default_rng(1)
  views = rng.random((B, 2, HW, HW, 1)).astype(np.float32)
  sharded = NamedSharding(mesh, P('data'))
  batch = {'views': jax.device_put(views, sharded),
           'label': jax.device_put(np.zeros(B, np.int32), sharded),
           'index': jax.device_put(np.arange(B, dtype=np.int32), sharded)}
  new, metrics = setup.step_fn(state, batch, jax.random.key(2))
  new = jax.device_get(new)

  # The target before the keys: m * target + (1 - m) * online, m = 0.99 at
  # step 0 of the cosine schedule.
  m = float(metrics['momentum'])
  assert m == pytest.approx(0.99, abs=1e-7)
  target = jax.tree.map(lambda t, o: m * np.asarray(t) + (1 - m) *
                        np.asarray(o), s0.method_state.key_params, s0.params)
  for got, want in zip(jax.tree.leaves(new.method_state.key_params),
                       jax.tree.leaves(target)):
    np.testing.assert_allclose(got, want, rtol=f32_rtol(2), atol=1e-7)

  def outputs(params, batch_stats, x):
    out, _ = setup.model.apply({'params': params, 'batch_stats': batch_stats},
                               x.reshape((-1, HW, HW, 1)), train=True,
                               mutable=['batch_stats'])
    return jax.tree.map(lambda a: np.asarray(a).reshape(B, 2, -1), out)

  online = outputs(s0.params, s0.batch_stats, views)['prediction']
  keys = outputs(jax.tree.map(np.float32, target),
                 s0.method_state.key_batch_stats,
                 views[:, ::-1])['projection']
  want = _numpy_regression(online, keys)
  # Sums over B * HW * HW positions in BN and the convolutions.
  assert float(metrics['loss']) == pytest.approx(
      want, rel=f32_rtol(B * HW * HW))
  # Gradients reach the online side (the first step's lr is 0: warmup).
  assert float(metrics['grad_norm']) > 1e-3


def test_byol_refuses_a_queue():
  config = _tiny()
  config.moco.queue_size = 2 * B
  with pytest.raises(ValueError, match='queue_size=0'):
    config_lib.validate(config, num_devices=8)


def test_byol_trains_end_to_end(tmp_path):
  """configs/byol.py through train_and_evaluate: the loss falls below its
  value at random init (2 - 2 cos of unrelated directions is about 2; with
  the step's lr 16x smaller it stays at 1.91 -> 1.95)."""
  import synthetic_data  # pylint: disable=g-import-not-at-top
  config = _tiny()
  config.num_epochs = 6.
  config.optimizer.base_learning_rate = 0.1   # 0.1 * 16 / 256 = 6e-3 peak.
  config.log_every_steps = 1
  config.eval.batch_size = 32
  config.evals.knn.ks = (3,)
  config.evals.linear.max_iter = 5
  config.eval.baselines = False
  config.evals.online_knn.every_steps = -1
  data = (synthetic_data.stripes_and_brightness(64, 2),
          synthetic_data.stripes_and_brightness(32, 3))
  results = train.train_and_evaluate(config, str(tmp_path), data=data)
  assert results['steps'] == 24
  history = [h for h in reporting.read_json(
      os.path.join(str(tmp_path), 'history.json'), []) if 'loss' in h]
  first, last = history[0]['loss'], history[-1]['loss']
  assert last < 0.8 * first, (first, last)   # Measured: 1.91 -> 1.20.
