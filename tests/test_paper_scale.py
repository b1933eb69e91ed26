"""What the paper-scale recipes add: mixed precision, MoCo v3's predictor, the
step learning-rate schedule, MoCo v2's BN-free head, LARS, and weight decay
with or without biases and BatchNorm parameters.

References are independent of the code under test: closed forms for the
schedule, the float32 step for the bf16 one, and for MoCo v3 the symmetric
InfoNCE written in numpy on outputs of the model called directly.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import base
from configs import moco_v3
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import optim
from contrastive_jax import models
from contrastive_jax import train
from numpy_reference import f32_rtol

B, HW = 16, 16


def _batch(mesh, views):
  rows = NamedSharding(mesh, P('data'))
  return {'views': jax.device_put(views, rows),
          'label': jax.device_put(np.arange(B, dtype=np.int32) % 4, rows),
          'index': jax.device_put(np.arange(B, dtype=np.int32), rows)}


def _setup(config, mesh, channels):
  return step_lib.build(config, mesh, total_steps=10, steps_per_epoch=5,
                     num_examples=64, image_shape=(HW, HW, channels),
                     num_classes=4)


def test_step_schedule_decays_at_the_configured_epochs():
  config = base.get_config()
  config.batch_size, config.num_epochs = 256, 200.
  config.optimizer.schedule = 'step'
  config.optimizer.decay_epochs = (120, 160)
  config.optimizer.base_learning_rate = 0.03
  config.optimizer.warmup_fraction = 0.
  lr = optim.learning_rate_schedule(config, total_steps=2000)  # 10 per epoch
  got = [float(lr(s)) for s in (0, 1199, 1200, 1599, 1600, 1999)]
  assert got == pytest.approx([0.03, 0.03, 0.003, 0.003, 3e-4, 3e-4])
  # With a warmup: linear from 0, then the same steps at the same epochs.
  config.optimizer.warmup_fraction = 0.05
  lr = optim.learning_rate_schedule(config, total_steps=2000)
  got = [float(lr(s)) for s in (0, 50, 100, 1199, 1200, 1600)]
  assert got == pytest.approx([0., 0.015, 0.03, 0.03, 0.003, 3e-4])


def test_moco_v2_head_has_biases_and_no_batch_norm():
  config = base.get_config()
  config.model.head_batch_norm = False
  model = models.create_model(config)
  variables = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((2, 28, 28, 1)),
                         train=False))
  head = variables['params']['head']
  assert set(head['dense0']) == {'kernel', 'bias'}
  assert 'head' not in variables['batch_stats']


def _resnet_config(dtype):
  config = base.get_config()
  config.model.encoder = 'resnet18'
  config.model.encoder_kwargs = ml_collections.ConfigDict(
      {'stem': 'cifar', 'width': 8, 'stage_sizes': (1, 1, 1, 1)})
  config.model.head_hidden_dim, config.model.head_out_dim = 32, 16
  config.model.dtype = dtype
  config.batch_size = B
  config.optimizer.name = 'lars'
  config.optimizer.warmup_fraction = 0.
  config.optimizer.base_learning_rate = 4.8
  return config


def test_bfloat16_step_agrees_with_float32_and_keeps_float32_state():
  mesh = runtime.create_mesh()
  views = np.random.default_rng(0).random((B, 2, HW, HW, 3), np.float32)
  out = {}
  for dtype in ('float32', 'bfloat16'):
    setup = _setup(_resnet_config(dtype), mesh, channels=3)
    state = setup.init_fn(jax.random.key(0))
    before = jax.device_get(state.params)
    new, metrics = setup.step_fn(state, _batch(mesh, views),
                                 jax.random.key(1))
    new = jax.device_get(new)
    out[dtype] = (float(metrics['loss']), jax.tree.map(
        lambda a, b: np.asarray(a, np.float64) - b, new.params, before), new)
  (loss32, upd32, _), (loss16, upd16, state16) = out['float32'], out['bfloat16']
  # Parameters, BN statistics and optimizer state stay float32 under bf16.
  for leaf in jax.tree.leaves((state16.params, state16.batch_stats,
                               state16.opt_state)):
    assert leaf.dtype in (np.float32, np.int32), leaf.dtype
  # bf16 keeps 8 mantissa bits (relative error 2^-9 per rounding). Measured
  # on this 10-layer net at tau 0.1: loss 0.85% apart, update 19% apart in
  # norm with cosine 0.983 (LARS rescales each layer, so the direction error
  # of bf16 gradients shows in full). The bounds leave ~3x room; a step that
  # ignored the dtype would give identical numbers, hence the lower bound.
  assert 1e-4 < abs(loss16 - loss32) / loss32 < 2.5e-2
  flat32 = np.concatenate([u.ravel() for u in jax.tree.leaves(upd32)])
  flat16 = np.concatenate([u.ravel() for u in jax.tree.leaves(upd16)])
  assert np.linalg.norm(flat32) > 0
  rel = np.linalg.norm(flat16 - flat32) / np.linalg.norm(flat32)
  cos = flat16 @ flat32 / (np.linalg.norm(flat16) * np.linalg.norm(flat32))
  assert rel < 0.5 and cos > 0.95, (rel, cos)


def _numpy_symmetric_infonce(q, k, tau):
  """MoCo v3 (Alg. 1): mean of ctr(q1, k2) and ctr(q2, k1), in-batch keys."""
  q = q / np.linalg.norm(q, axis=-1, keepdims=True)
  k = k / np.linalg.norm(k, axis=-1, keepdims=True)
  total = 0.
  for a, b in ((0, 1), (1, 0)):
    logits = q[:, a] @ k[:, b].T / tau
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    total += -np.mean(np.diag(log_p))
  return total / 2


def test_moco_v3_queries_are_predictions_and_keys_ema_projections():
  config = moco_v3.get_config()
  config.model.encoder_kwargs.widths = (4, 8)
  config.model.head_hidden_dim, config.model.head_out_dim = 16, 8
  config.moco.predictor_hidden_dim = 12
  config.batch_size = B
  config.online.classifier = False
  mesh = runtime.create_mesh()
  setup = _setup(config, mesh, channels=1)
  assert setup.method.embedding == 'prediction'
  state = setup.init_fn(jax.random.key(0))
  s0 = jax.device_get(state)
  assert 'predictor' in s0.params
  views = np.random.default_rng(1).random((B, 2, HW, HW, 1), np.float32)
  _, metrics = setup.step_fn(state, _batch(mesh, views), jax.random.key(2))

  m = float(metrics['momentum'])
  target = jax.tree.map(lambda t, o: m * np.asarray(t) + (1 - m) *
                        np.asarray(o), s0.method_state.key_params, s0.params)

  def outputs(params, batch_stats):
    out, _ = setup.model.apply({'params': params, 'batch_stats': batch_stats},
                               views.reshape((-1, HW, HW, 1)), train=True,
                               mutable=['batch_stats'])
    return jax.tree.map(lambda a: np.asarray(a, np.float64).reshape(B, 2, -1),
                        out)

  queries = outputs(s0.params, s0.batch_stats)['prediction']
  keys = outputs(jax.tree.map(np.float32, target),
                 s0.method_state.key_batch_stats)['projection']
  want = _numpy_symmetric_infonce(queries, keys, tau=1.0)
  assert float(metrics['loss']) == pytest.approx(
      want, rel=f32_rtol(B * HW * HW))
  # The same loss on the projections (no predictor) differs: the queries
  # really are the predictor's.
  proj = outputs(s0.params, s0.batch_stats)['projection']
  assert abs(_numpy_symmetric_infonce(proj, keys, 1.0) - want) > 1e-3


@pytest.mark.parametrize('warmup_fraction', [0.05, 0.])
def test_schedules_of_runs_without_training_steps(warmup_fraction):
  # num_epochs = 0 (untrained baselines) or 1 step: a valid schedule, and
  # from 2 steps on the warmup-cosine schedule is unchanged (closed form).
  config = base.get_config()
  config.optimizer.warmup_fraction = warmup_fraction
  for total in (0, 1):
    assert np.isfinite(float(optim.learning_rate_schedule(config, total)(0)))
  peak = config.optimizer.base_learning_rate * config.batch_size / 256
  lr = optim.learning_rate_schedule(config, 100)
  warmup = int(warmup_fraction * 100)
  for t in (10, 50, 99):
    want = peak * 0.5 * (1 + np.cos(np.pi * (t - warmup) / (100 - warmup)))
    assert float(lr(t)) == pytest.approx(want, abs=1e-6 * peak)


def _lars_params_and_grads():
  """Layers whose trust ratios differ by orders of magnitude, and a bias."""
  rng = np.random.default_rng(0)
  shapes = {'conv': (3, 3, 2, 4), 'dense': (5, 3), 'head': (3, 2)}
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  grads = {k: (rng.normal(size=s) * scale).astype(np.float32)
           for (k, s), scale in zip(shapes.items(), (1e-3, 1., 30.))}
  params['bias'] = rng.normal(size=4).astype(np.float32)
  grads['bias'] = rng.normal(size=4).astype(np.float32)
  return params, grads


def _lars_config(**optimizer):
  config = base.get_config()
  config.optimizer.name = 'lars'
  config.optimizer.update(optimizer)
  return config


@pytest.mark.parametrize('decay_all', [False, True])
def test_lars_trust_coefficient_is_the_configured_one(decay_all):
  # optax's LARS: rate lr * eta * ||w|| / ||g + wd w|| for every matrix; a
  # 1-D leaf (bias, BN) steps -lr g, or with decay_biases_and_bn (the same
  # leaves decayed and adapted) follows the matrices' rule.
  params, grads = _lars_params_and_grads()
  wd, eta, lr = 1e-2, 0.02, 0.3
  opt = optim.create_optimizer(
      _lars_config(weight_decay=wd, momentum=0., trust_coefficient=eta,
                   decay_biases_and_bn=decay_all),
      lambda step: lr)
  got, _ = opt.update(grads, opt.init(params), params)
  for k, w in params.items():
    adapted = w.ndim > 1 or decay_all
    g = grads[k].astype(np.float64) + (wd * w if adapted else 0.)
    rate = lr * eta * np.linalg.norm(w) / np.linalg.norm(g) if (
        adapted) else lr
    np.testing.assert_allclose(got[k], -rate * g, rtol=1e-5)


@pytest.mark.parametrize('decay_all', [False, True])
def test_clipped_lars_rate_is_solo_learns_per_layer_rule(decay_all):
  # solo-learn lars.py with clip_lr: a matrix's rate is
  # min(eta ||w|| / (||g|| + wd ||w||), lr), its step -rate (g + wd w); 1-D
  # leaves step -lr g (exclude_bias_n_norm), or with decay_biases_and_bn
  # follow the matrices' rule. Two steps with momentum 0.9 on a schedule.
  params, grads = _lars_params_and_grads()
  wd, eta, m = 1e-2, 0.02, 0.9
  ratio = lambda w, g: eta * np.linalg.norm(w) / (
      np.linalg.norm(g) + wd * np.linalg.norm(w))
  ratios = sorted(ratio(params[k], grads[k]) for k in ('conv', 'dense',
                                                       'head'))
  lr0 = float(np.sqrt(ratios[0] * ratios[1]))   # Caps some layers...
  schedule = lambda step: lr0 * 1e-3 ** step     # ...then every layer.
  opt = optim.create_optimizer(
      _lars_config(weight_decay=wd, momentum=m, trust_coefficient=eta,
                   clip_lr=True, decay_biases_and_bn=decay_all), schedule)
  state, w_got = opt.init(params), dict(params)
  w_want = {k: v.astype(np.float64) for k, v in params.items()}
  buf = {k: np.zeros_like(v) for k, v in w_want.items()}
  bound = []
  for t in range(2):
    lr = lr0 * 1e-3 ** t
    updates, state = opt.update(grads, state, w_got)
    w_got = {k: w_got[k] + updates[k] for k in w_got}
    for k, w in w_want.items():
      g = grads[k].astype(np.float64)
      if w.ndim > 1 or decay_all:
        r = ratio(w, g)
        if w.ndim > 1:
          bound.append(r > lr)   # The cap lr binds.
        d = min(r / lr, 1.) * (g + wd * w)
      else:
        d = g
      buf[k] = m * buf[k] + d
    w_want = {k: w - lr * buf[k] for k, w in w_want.items()}
    for k in w_want:
      np.testing.assert_allclose(w_got[k], w_want[k], rtol=1e-5, atol=1e-7)
  assert any(bound[:3]) and not all(bound[:3]) and all(bound[3:])


@pytest.mark.parametrize('decay_all', [False, True])
@pytest.mark.parametrize('name', ['sgd', 'adamw', 'adam'])
def test_weight_decay_reaches_biases_and_bn_only_when_configured(name,
                                                                 decay_all):
  # configs/base.py (decay_biases_and_bn=False): weight decay on matrices
  # only. True: on every leaf, as torch's SGD(model.parameters(),
  # weight_decay=wd). Two steps against numpy: torch's SGD buf = m buf +
  # (g + wd w), w -= lr buf; AdamW w -= lr (m^ / (sqrt(v^) + eps) + wd w);
  # torch's Adam the moments of g + wd w, w -= lr m^ / (sqrt(v^) + eps).
  params, grads = _lars_params_and_grads()
  params['bn_scale'] = np.linspace(0.5, 1.5, 4).astype(np.float32)
  grads['bn_scale'] = np.linspace(-1., 1., 4).astype(np.float32)
  wd, m, lr = 0.1, 0.9, 0.05
  config = base.get_config()
  assert config.optimizer.decay_biases_and_bn is False   # The default.
  config.optimizer.update(name=name, weight_decay=wd, momentum=m,
                          decay_biases_and_bn=decay_all)
  opt = optim.create_optimizer(config, lambda step: lr)
  state, got = opt.init(params), dict(params)
  want = {k: v.astype(np.float64) for k, v in params.items()}
  buf = {k: np.zeros_like(v) for k, v in want.items()}
  mu = {k: np.zeros_like(v) for k, v in want.items()}
  nu = {k: np.zeros_like(v) for k, v in want.items()}
  for t in range(1, 3):
    updates, state = opt.update(grads, state, got)
    got = {k: got[k] + updates[k] for k in got}
    for k, w in want.items():
      g = grads[k].astype(np.float64)
      decay = wd if (w.ndim > 1 or decay_all) else 0.
      if name == 'sgd':
        buf[k] = m * buf[k] + g + decay * w
        want[k] = w - lr * buf[k]
      elif name == 'adam':
        g = g + decay * w
        mu[k] = 0.9 * mu[k] + 0.1 * g
        nu[k] = 0.999 * nu[k] + 0.001 * g * g
        want[k] = w - lr * (mu[k] / (1 - 0.9 ** t)) / (
            np.sqrt(nu[k] / (1 - 0.999 ** t)) + 1e-8)
      else:
        mu[k] = 0.9 * mu[k] + 0.1 * g
        nu[k] = 0.999 * nu[k] + 0.001 * g * g
        adam = (mu[k] / (1 - 0.9 ** t)) / (np.sqrt(nu[k] / (1 - 0.999 ** t))
                                           + 1e-8)
        want[k] = w - lr * (adam + decay * w)
  # atol: float32 rounding of steps of size ~lr (weights ~1) near w = 0.
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=4e-6)
  if name == 'sgd':
    # Undecayed, two SGD steps move a leaf by -lr (2 + m) g: the 1-D leaves
    # do so exactly when they are not decayed (the decay's share, about
    # lr wd |w| = 5e-3, is far above the tolerance).
    for k in ('bias', 'bn_scale'):
      undecayed = params[k] - lr * (2 + m) * grads[k]
      assert np.allclose(got[k], undecayed, rtol=1e-5) != decay_all, k


@pytest.mark.parametrize('schedule', ['cosine', 'step'])
def test_warmup_rises_linearly_from_its_initial_lr(schedule):
  # lr(t) = a + (peak - a) t / W during the warmup (SupContrast's
  # warmup_learning_rate), then the schedule's value after W warmup steps:
  # cosine peak (1 + cos(pi (t - W) / (T - W))) / 2, or the step schedule's
  # peak x 0.1 from the decay epoch's step (150 x 10).
  config = base.get_config()
  config.batch_size, config.num_epochs = 1024, 200.
  config.optimizer.base_learning_rate = 0.125     # Peak 0.5 at 1024.
  config.optimizer.schedule = schedule
  config.optimizer.decay_epochs = (150,)
  config.optimizer.warmup_fraction = 0.05
  config.optimizer.warmup_init_lr = 0.01
  total, warmup, a, peak = 2000, 100, 0.01, 0.5
  lr = optim.learning_rate_schedule(config, total_steps=total)
  for t in (0, 1, 37, 99):
    assert float(lr(t)) == pytest.approx(a + (peak - a) * t / warmup,
                                         rel=1e-6)
  for t in (100, 640, 1499, 1500, 1999):
    if schedule == 'cosine':
      want = peak * 0.5 * (1 + np.cos(np.pi * (t - warmup) / (total - warmup)))
    else:
      want = peak * (0.1 if t >= 1500 else 1.)
    assert float(lr(t)) == pytest.approx(want, rel=1e-5, abs=1e-7)


def _cosine_with_floor(t, *, peak, final, warmup, total, init=0.):
  """The closed form, written here: linear warmup from `init` over `warmup`
  steps, then final + (peak - final) (1 + cos(pi u / U)) / 2 with u the
  steps since the warmup and U = total - warmup (SupContrast util.py
  adjust_learning_rate with eta_min = final)."""
  if t < warmup:
    return init + (peak - init) * t / warmup
  u, span = t - warmup, total - warmup
  return final + (peak - final) * (1 + np.cos(np.pi * u / span)) / 2


@pytest.mark.parametrize('warmup_fraction', [0., 0.05])
@pytest.mark.parametrize('cosine_final', [0., 1e-3, 0.25])
def test_cosine_ends_at_cosine_final_times_the_peak(warmup_fraction,
                                                    cosine_final):
  config = base.get_config()
  config.batch_size, config.num_epochs = 1024, 200.
  config.optimizer.base_learning_rate = 0.125     # Peak 0.5 at 1024.
  config.optimizer.warmup_fraction = warmup_fraction
  config.optimizer.warmup_init_lr = 0.01 if warmup_fraction else 0.
  config.optimizer.cosine_final = cosine_final
  total, peak = 2000, 0.5
  warmup = int(warmup_fraction * total)
  final = cosine_final * peak
  lr = optim.learning_rate_schedule(config, total_steps=total)
  for t in (0, 1, 37, 99, 100, 101, 640, 1000, 1500, 1999, 2000, 2500):
    want = _cosine_with_floor(min(t, total), peak=peak, final=final,
                              warmup=warmup, total=total, init=0.01)
    assert float(lr(t)) == pytest.approx(want, rel=1e-5, abs=1e-8), t
  # The end of the schedule (and beyond it) is the floor itself.
  assert float(lr(total)) == pytest.approx(final, abs=1e-8)
  assert float(lr(10 * total)) == pytest.approx(final, abs=1e-8)


@pytest.mark.parametrize('value', [-0.1, 1., 1.5, True, None])
def test_cosine_final_outside_0_1_is_rejected(value):
  config = base.get_config()
  config.optimizer.cosine_final = value
  with pytest.raises(ValueError, match=r'cosine_final=.* must be a number '
                     r'in \[0, 1\)'):
    optim.learning_rate_schedule(config, total_steps=100)


def test_cosine_final_with_the_step_schedule_is_rejected():
  config = base.get_config()
  config.optimizer.schedule = 'step'
  config.optimizer.decay_epochs = (2,)
  config.optimizer.cosine_final = 1e-3
  with pytest.raises(ValueError, match="applies to .*schedule='cosine' only"):
    optim.learning_rate_schedule(config, total_steps=100)
  config.optimizer.cosine_final = 0.
  optim.learning_rate_schedule(config, total_steps=100)
