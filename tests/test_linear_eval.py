"""The papers' linear evaluation (SGD on augmented images, frozen encoder).

The reference is a float64 numpy loop over the same global example order
(`TrainBatches`' documented order: a permutation per epoch from
np.random.default_rng([seed, epoch])), with PyTorch's SGD (coupled weight
decay, Nesterov momentum) and the cosine schedule written out.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import test as test_config
from configs.papers import supcon
from contrastive_jax import config_lib
from contrastive_jax import evaluators
from contrastive_jax import models
from contrastive_jax import runtime
from contrastive_jax.evaluators import linear_eval
from input_pipeline import augment
from input_pipeline import pipeline

N, HW, C, SEED = 48, 4, 3, 5


class Pixels(nn.Module):
  """A parameter-free 'encoder': the features are the pixels in [0, 1]."""

  @nn.compact
  def __call__(self, x, *, train: bool):
    del train
    return {'features': x.reshape(x.shape[0], -1)}


def _data(seed, n):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, C, n)
  images = rng.integers(0, 256, (n, HW, HW, 1))
  # A class cue in the left half, so a horizontal flip moves it.
  images[:, :, :2, 0] = np.clip(images[:, :, :2, 0] // 2 + 60 * labels[:, None,
                                                                      None],
                                0, 255)
  return pipeline.ArrayDataset(images.astype(np.uint8), labels)


# Every training image flipped (flip_p = 1), no crop: the reference can
# reproduce the augmentation exactly, and evaluation must not flip.
CFG = linear_eval.LinearEvalConfig(
    optimizer='sgd', lr=0.3, epochs=3, batch_size=16, momentum=0.9,
    nesterov=True, weight_decay=1e-3, schedule='cosine',
    view=augment.ViewConfig(crop_scale=None, flip_p=1.0))


def _np_grads(xb, yb, w, b, smoothing=0.):
  """(cross-entropy, dW, db) of softmax(xb w + b) against the one-hot yb
  (the loss unsmoothed), targets smoothed to (1 - a) one_hot + a / C."""
  logits = xb @ w + b
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  loss = -np.mean(np.log(p[np.arange(len(yb)), yb]))
  resid = (p - ((1 - smoothing) * np.eye(C)[yb] + smoothing / C)) / len(yb)
  return loss, xb.T @ resid, resid.sum(0)


def _numpy_reference(train, test, cfg, train_features=None,
                     eval_features=None, lr_of_epoch=None, start=None):
  """The SGD loop; `train_features` / `eval_features` map a batch of pixel
  rows [n, F] to its features (default: the pixels themselves; the
  evaluation's are computed after each epoch, so they may read state the
  training calls moved); `lr_of_epoch(epoch)`: an lr held for each epoch
  (default: the per-step cosine); `start`: the classifier's (w, b) at step
  0 (default: zeros)."""
  x = train.images.astype(np.float64)[:, :, ::-1].reshape(N, -1) / 255.
  y = train.labels
  tx = test.images.astype(np.float64).reshape(len(test), -1) / 255.
  train_features = train_features or (lambda rows: rows)
  eval_features = eval_features or (lambda rows: rows)
  if start is None:
    w, b = np.zeros((x.shape[1], C)), np.zeros(C)
  else:
    w, b = (np.asarray(v, np.float64) for v in start)
  mw, mb = np.zeros_like(w), np.zeros_like(b)
  steps_per_epoch = N // cfg.batch_size
  total, step, top1, losses = cfg.epochs * steps_per_epoch, 0, [], []
  for epoch in range(cfg.epochs):
    order = np.random.default_rng([SEED, epoch]).permutation(N)
    epoch_losses = []
    for i in range(steps_per_epoch):
      idx = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
      loss, gw, gb = _np_grads(train_features(x[idx]), y[idx], w, b)
      epoch_losses.append(loss)
      gw, gb = gw + cfg.weight_decay * w, gb + cfg.weight_decay * b
      lr = (lr_of_epoch(epoch) if lr_of_epoch else
            cfg.lr * 0.5 * (1 + math.cos(math.pi * step / total)))
      mw, mb = cfg.momentum * mw + gw, cfg.momentum * mb + gb
      w = w - lr * (gw + cfg.momentum * mw)        # Nesterov
      b = b - lr * (gb + cfg.momentum * mb)
      step += 1
    top1.append(np.mean(np.argmax(eval_features(tx) @ w + b, 1)
                        == test.labels))
    losses.append(np.mean(epoch_losses))
  return w, b, top1, losses


def _run(mesh, cfg=CFG, model=None, variables=None):
  return linear_eval.linear_evaluation(
      model or Pixels(), variables or {}, _data(0, N), _data(1, 30), mesh,
      cfg=cfg, num_classes=C, seed=SEED, eval_batch_size=16)


def _assert_matches(out, w, b, *, rtol, top1=None, last_loss=None):
  """The probe's classifier equals the numpy reference's (w, b) to rtol of
  its largest weight; its per-epoch top-1 and last loss, where given."""
  got = jax.device_get(out['classifier'])
  scale = np.abs(w).max()
  np.testing.assert_allclose(got['w'], w, atol=rtol * scale)
  np.testing.assert_allclose(got['b'], b, atol=rtol * scale)
  if top1 is not None:
    assert out['top1_per_epoch'] == pytest.approx(top1)
  if last_loss is not None:
    assert out['train_loss_last'] == pytest.approx(last_loss, rel=rtol)
  return scale


def test_matches_a_numpy_sgd_loop_on_flipped_training_images():
  out = _run(runtime.create_mesh())
  w, b, top1, losses = _numpy_reference(_data(0, N), _data(1, 30), CFG)
  scale = _assert_matches(out, w, b, rtol=1e-5, top1=top1,
                          last_loss=losses[-1])
  # The flip matters (the class cue is in the left half): without it the
  # reference reaches other weights, so a skipped augmentation would fail.
  no_flip = dataclasses.replace(
      CFG, view=augment.ViewConfig(crop_scale=None, flip_p=0.))
  assert not np.allclose(jax.device_get(_run(runtime.create_mesh(),
                                             no_flip)['classifier'])['w'],
                         w, atol=1e-3 * scale)


def test_eight_devices_equal_one_device():
  eight = jax.device_get(_run(runtime.create_mesh())['classifier'])
  one = jax.device_get(_run(runtime.create_mesh(jax.devices()[:1]))[
      'classifier'])
  assert len(jax.devices()) == 8
  for k in ('w', 'b'):
    np.testing.assert_allclose(eight[k], one[k], rtol=1e-5, atol=1e-6)


def test_presets_follow_the_papers_and_rescale_with_the_batch():
  moco = linear_eval.PRESETS['moco']
  assert (moco.optimizer, moco.lr, moco.epochs, moco.batch_size,
          moco.weight_decay, moco.milestones) == ('sgd', 30.0, 100, 256, 0.0,
                                                  (60, 80))
  sched = linear_eval.learning_rate(moco, steps_per_epoch=10)
  assert [float(sched(s)) for s in (0, 599, 600, 799, 800, 999)] == (
      pytest.approx([30, 30, 3, 3, 0.3, 0.3]))
  simclr = linear_eval.PRESETS['simclr']
  # SimCLR: lr = 0.1 x B / 256 at B = 4096, Nesterov, 90 epochs.
  assert (simclr.lr, simclr.batch_size, simclr.nesterov, simclr.epochs) == (
      pytest.approx(0.1 * 4096 / 256), 4096, True, 90)
  smaller = linear_eval.get_config('simclr', batch_size=1024, epochs=2)
  assert (smaller.lr, smaller.epochs) == (pytest.approx(0.4), 2)
  assert linear_eval.PRESETS['cacr_small'].view.crop_scale == (0.2, 1.)
  assert linear_eval.PRESETS['tcl'].view.pad_crop == 4
  with pytest.raises(ValueError, match='unknown linear-evaluation preset'):
    linear_eval.get_config('byol')


def test_the_supcon_moco_v3_and_tcl_batch128_presets():
  # SupContrast main_linear.py + README: SGD lr 5 at batch 512, momentum
  # 0.9, no weight decay, 100 epochs, x0.2 after epochs 60, 75 and 90.
  supcon = linear_eval.PRESETS['supcon']
  assert (supcon.optimizer, supcon.lr, supcon.batch_size, supcon.epochs,
          supcon.momentum, supcon.nesterov, supcon.weight_decay,
          supcon.schedule, supcon.milestones, supcon.lr_decay,
          supcon.view.crop_scale, supcon.view.flip_p) == (
              'sgd', 5.0, 512, 100, 0.9, False, 0.0, 'step', (60, 75, 90),
              0.2, (0.2, 1.), 0.5)
  # util.py adjust_learning_rate: lr x 0.2^(number of milestones the 1-based
  # epoch exceeds), i.e. 0-based epoch e has lr x 0.2^#{m <= e}.
  sched = linear_eval.learning_rate(supcon, steps_per_epoch=10)
  for epoch in (0, 59, 60, 74, 75, 89, 90, 99):
    for step in (10 * epoch, 10 * epoch + 9):
      assert float(sched(step)) == pytest.approx(
          5.0 * 0.2 ** sum(m <= epoch for m in (60, 75, 90)), rel=1e-6)
  # MoCo v3 main_lincls.py: lr 0.1 x 1024 / 256, plain momentum, cosine.
  mocov3 = linear_eval.PRESETS['moco_v3']
  assert (mocov3.lr, mocov3.batch_size, mocov3.epochs, mocov3.nesterov,
          mocov3.weight_decay, mocov3.schedule) == (
              pytest.approx(0.4), 1024, 90, False, 0.0, 'cosine')
  # SimCLR's README: --weight_decay=1e-6.
  assert linear_eval.PRESETS['simclr'].weight_decay == 1e-6
  # TCL's CIFAR-100 linear stage: 'tcl' at batch 128, lr 0.5 not rescaled.
  tcl, tcl100 = linear_eval.PRESETS['tcl'], linear_eval.PRESETS['tcl_batch128']
  assert (tcl100.batch_size, tcl100.lr) == (128, 0.5)
  assert dataclasses.replace(tcl100, batch_size=64) == tcl


def _numpy_step_sgd(train, test, cfg, steps_per_epoch, start):
  """Plain-momentum SGD (PyTorch's) from the classifier `start` = (w, b),
  the step schedule written out."""
  x = train.images.astype(np.float64)[:, :, ::-1].reshape(N, -1) / 255.
  y = train.labels
  w, b = (np.asarray(v, np.float64) for v in start)
  mw, mb = np.zeros_like(w), np.zeros_like(b)
  lrs = []
  for epoch in range(cfg.epochs):
    lr = cfg.lr * cfg.lr_decay ** sum(m <= epoch for m in cfg.milestones)
    lrs.append(lr)
    order = np.random.default_rng([SEED, epoch]).permutation(N)
    for i in range(steps_per_epoch):
      idx = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
      _, gw, gb = _np_grads(x[idx], y[idx], w, b)
      mw = cfg.momentum * mw + gw + cfg.weight_decay * w
      mb = cfg.momentum * mb + gb + cfg.weight_decay * b
      w, b = w - lr * mw, b - lr * mb
  return w, b, lrs


def test_a_short_run_of_the_supcon_preset_follows_its_step_schedule():
  # The 'supcon' preset at batch 16 (lr rescaled: 5 x 16 / 512), shortened
  # to 4 epochs with its decays after epochs 1, 2 and 3; every training
  # image flipped and not cropped, so that numpy can replay the run.
  cfg = dataclasses.replace(
      linear_eval.get_config('supcon', batch_size=16, epochs=4),
      milestones=(1, 2, 3),
      view=augment.ViewConfig(crop_scale=None, flip_p=1.0))
  assert cfg.lr == pytest.approx(5.0 * 16 / 512)
  # The run starts from nn.Linear's init for seed SEED (main_linear.py's
  # LinearClassifier), which numpy replays from there.
  start = jax.device_get(linear_eval.init_classifier(cfg, SEED, HW * HW, C))
  assert cfg.classifier_init == 'torch_default' and np.any(start['b'])
  start = (start['w'], start['b'])
  out = _run(runtime.create_mesh(), cfg)
  w, b, lrs = _numpy_step_sgd(_data(0, N), _data(1, 30), cfg,
                              steps_per_epoch=N // 16, start=start)
  assert lrs == pytest.approx([0.15625, 0.03125, 0.00625, 0.00125])
  scale = _assert_matches(out, w, b, rtol=1e-5)
  # A constant lr (no decay) ends elsewhere: the schedule is what was used.
  flat = dataclasses.replace(cfg, milestones=())
  w_flat, _, _ = _numpy_step_sgd(_data(0, N), _data(1, 30), flat,
                                 steps_per_epoch=N // 16, start=start)
  assert np.abs(w_flat - w).max() > 100 * 1e-5 * scale
  # And the preset's own augmentation (crop 0.2-1 + flip) runs.
  own = _run(runtime.create_mesh(),
             linear_eval.get_config('supcon', batch_size=16, epochs=2))
  assert np.isfinite(own['train_loss_last'])
  assert 0. <= own['top1_last'] <= 1.


# SupCon's TF linear stage ('supcon_tf'): RMSProp, warmup + exponential
# decay, label smoothing, L2-normalised features, a Glorot-uniform kernel.
# The references are written here from the documented rules:
# tf.compat.v1.train.RMSPropOptimizer (rmsprop.py: "mean_square = decay *
# mean_square{t-1} + (1-decay) * gradient ** 2; mom = momentum * mom{t-1} +
# learning_rate * g_t / sqrt(mean_square + epsilon); delta = - mom", the
# mean square initialised to ones), the SupCon code's utils.py schedule and
# tf.losses.softmax_cross_entropy's label smoothing.


def _tf_schedule(step, *, lr, warmup_steps, decay_steps, rate):
  """utils.py build_learning_rate_schedule with EXPONENTIAL: lr x step / W
  during the warmup, then tf.train.exponential_decay(staircase=True) of the
  steps counted from the warmup's end."""
  if step < warmup_steps:
    return lr * step / warmup_steps
  return lr * rate ** math.floor((step - warmup_steps) / decay_steps)


def test_the_supcon_tf_preset():
  tf = linear_eval.PRESETS['supcon_tf']
  assert (tf.optimizer, tf.lr, tf.batch_size, tf.epochs, tf.momentum,
          tf.rmsprop_decay, tf.rmsprop_eps, tf.weight_decay, tf.schedule,
          tf.warmup_epochs, tf.lr_decay, tf.epochs_per_decay,
          tf.label_smoothing, tf.normalize_features, tf.classifier_init,
          tf.nesterov, tf.encoder_bn) == (
              'rmsprop', pytest.approx(0.05 * 6144 / 256), 6144, 90, 0.9, 0.9,
              1e-3, 1e-6, 'exponential', 12., 0.97, 0.5, 0.05, True,
              'glorot_uniform', False, 'batch')
  assert (tf.view.crop_scale, tf.view.flip_p, tf.view.autoaugment,
          tf.view.autoaugment_impl) == ((0.08, 1.), 0.5, 'v0',
                                        'tf_model_garden')
  # configs/papers/supcon.py uses it at the ImageNet scale only.
  assert supcon.get_config('imagenet').evals.linear_eval.preset == 'supcon_tf'
  assert supcon.get_config('cifar10').evals.linear_eval.preset == 'supcon'
  # The plain recipe has none of its loss and feature terms.
  assert isinstance(tf, linear_eval.SupConTFConfig)
  default = linear_eval.LinearEvalConfig()
  assert (default.label_smoothing, default.normalize_features,
          default.classifier_init, default.encoder_bn) == (
              0., False, 'zeros', 'running')


def test_the_exponential_schedule_is_the_tf_codes_closed_form():
  # 10 steps per epoch: 120 warmup steps, then x0.97 every 5 steps.
  sched = linear_eval.learning_rate(linear_eval.PRESETS['supcon_tf'],
                                    steps_per_epoch=10)
  by_hand = {0: 0., 1: 1.2 / 120, 60: 0.6, 119: 1.2 * 119 / 120, 120: 1.2,
             124: 1.2, 125: 1.2 * 0.97, 129: 1.2 * 0.97,
             130: 1.2 * 0.97 ** 2, 899: 1.2 * 0.97 ** 155}
  for step, want in by_hand.items():
    assert float(sched(step)) == pytest.approx(want, rel=1e-5, abs=1e-9), step
  # A fractional decay period (7 steps per epoch: 3.5 steps) and warmup
  # (12 x 7 = 84 steps), and the batch-rescaled lr.
  cfg = linear_eval.get_config('supcon_tf', batch_size=256)
  assert cfg.lr == pytest.approx(0.05)
  sched = linear_eval.learning_rate(cfg, steps_per_epoch=7)
  for step in (0, 5, 83, 84, 87, 88, 90, 91, 92, 95, 629):
    assert float(sched(step)) == pytest.approx(_tf_schedule(
        step, lr=0.05, warmup_steps=84, decay_steps=3.5, rate=0.97),
                                               rel=1e-5, abs=1e-9), step
  # A non-integer warmup is floored (TF casts W x steps per epoch to the
  # step's integer type); without warmup the decay starts at step 0.
  cfg = dataclasses.replace(cfg, warmup_epochs=0.5)
  sched = linear_eval.learning_rate(cfg, steps_per_epoch=7)
  assert [float(sched(s)) for s in (2, 3)] == pytest.approx(
      [0.05 * 2 / 3, 0.05])
  cfg = dataclasses.replace(cfg, warmup_epochs=0., lr_decay=0.5)
  sched = linear_eval.learning_rate(cfg, steps_per_epoch=7)
  assert [float(sched(s)) for s in (0, 3, 4, 7, 10, 11)] == pytest.approx(
      [0.05, 0.05, 0.025, 0.0125, 0.0125, 0.00625])


def _tf_rmsprop(w0, grads, lrs, *, decay, momentum, eps, weight_decay,
                ms0=1.0, eps_in_sqrt=True):
  """TF 1's RMSPropOptimizer on the loss + weight_decay x sum(w^2) / 2."""
  w = np.array(w0, np.float64)
  ms, mom = np.full_like(w, ms0), np.zeros_like(w)
  for g, lr in zip(grads, lrs):
    g = g + weight_decay * w
    ms = decay * ms + (1 - decay) * g ** 2
    denom = np.sqrt(ms + eps) if eps_in_sqrt else np.sqrt(ms) + eps
    mom = momentum * mom + lr * g / denom
    w = w - mom
  return w


def test_rmsprop_is_tf1s_rmsprop_update():
  cfg = dataclasses.replace(
      linear_eval.PRESETS['supcon_tf'], lr=0.05, warmup_epochs=1.,
      epochs_per_decay=1., lr_decay=0.8, weight_decay=0.1, rmsprop_eps=0.3)
  steps_per_epoch = 4
  tx = linear_eval.optimizer(cfg, steps_per_epoch)
  rng = np.random.default_rng(0)
  w0 = rng.normal(size=(5, 3))
  grads = [rng.normal(scale=0.7, size=(5, 3)) for _ in range(14)]
  lrs = [_tf_schedule(s, lr=0.05, warmup_steps=4, decay_steps=4, rate=0.8)
         for s in range(14)]
  params = {'w': jnp.asarray(w0, jnp.float32)}
  state = tx.init(params)
  for g in grads:
    updates, state = tx.update({'w': jnp.asarray(g, jnp.float32)}, state,
                               params)
    params = optax.apply_updates(params, updates)
  kw = dict(decay=0.9, momentum=0.9, eps=0.3, weight_decay=0.1)
  want = _tf_rmsprop(w0, grads, lrs, **kw)
  got = np.asarray(params['w'])
  moved = np.abs(want - w0).max()
  np.testing.assert_allclose(got, want, atol=1e-5 * moved)
  # The reference is sensitive to what it pins: eps outside the root, a
  # mean square starting at 0 (Keras / optax's default) or no momentum
  # ends elsewhere.
  for other in (dict(kw, eps_in_sqrt=False), dict(kw, ms0=0.),
                dict(kw, momentum=0.)):
    assert np.abs(_tf_rmsprop(w0, grads, lrs, **other) - got).max() > (
        100 * 1e-5 * moved), other


def test_label_smoothed_cross_entropy_matches_numpy():
  rng = np.random.default_rng(1)
  logits = rng.normal(scale=3., size=(6, 5))
  labels = rng.integers(0, 5, 6)
  for a in (0., 0.05, 0.3):
    targets = (1 - a) * np.eye(5)[labels] + a / 5
    z = logits - logits.max(1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
    want = -(targets * log_p).sum(1)
    got = linear_eval.cross_entropy(jnp.asarray(logits, jnp.float32),
                                    jnp.asarray(labels), a)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def _glorot_uniform(init, f, c):
  limit = math.sqrt(6 / (f + c))     # TF's glorot_uniform bound
  assert not np.any(init['b'])
  assert limit >= np.abs(init['w']).max() > 0.999 * limit
  assert init['w'].var() == pytest.approx(limit ** 2 / 3, rel=0.01)
  assert abs(init['w'].mean()) < 1e-3 * limit


def _normal_0_01(init, f, c):
  # MoCo's main_lincls.py: fc.weight.normal_(mean=0.0, std=0.01),
  # fc.bias.zero_(). The moments in float64: mean 0 (standard error 0.01 /
  # sqrt(F C)), std 0.01 (standard error 0.01 / sqrt(2 F C)); normal, not
  # uniform: a fourth standardised moment of 3 (uniform: 1.8), values beyond
  # 3 std at the normal's rate 0.27%.
  del f, c
  assert not np.any(init['b'])
  w = init['w'].astype(np.float64)
  assert abs(w.mean()) < 5 * 0.01 / math.sqrt(w.size)
  assert w.std() == pytest.approx(0.01, abs=5 * 0.01 / math.sqrt(2 * w.size))
  z = w / w.std()
  assert np.mean(z ** 4) == pytest.approx(3., abs=0.02)
  assert np.mean(np.abs(z) > 3) == pytest.approx(0.0027, abs=3e-4)


def _torch_default(init, f, c):
  # PyTorch's nn.Linear(F, C).reset_parameters: kaiming_uniform_(weight,
  # a=sqrt(5)) has bound gain x sqrt(3 / fan_in) with gain = sqrt(2 / (1 +
  # a^2)), i.e. 1 / sqrt(F); the bias U(-1 / sqrt(F), 1 / sqrt(F)), its own
  # draw.
  del c
  bound = math.sqrt(2. / (1. + 5.)) * math.sqrt(3. / f)
  assert bound == pytest.approx(1. / math.sqrt(f))
  for name, values in init.items():
    assert bound >= np.abs(values).max() > 0.99 * bound, name
    # U(-l, l): variance l^2 / 3, mean 0.
    assert values.var() == pytest.approx(bound ** 2 / 3, rel=0.1), name
    assert abs(values.mean()) < 0.1 * bound, name
  assert init['w'].var() == pytest.approx(bound ** 2 / 3, rel=0.01)
  assert not np.allclose(init['w'][0], init['b'])


def _zeros(init, f, c):
  del f, c
  assert not np.any(init['w']) and not np.any(init['b'])


@pytest.mark.parametrize('preset,f,c,check', [
    ('supcon_tf', 2048, 1000, _glorot_uniform),
    ('moco', 2048, 1000, _normal_0_01),
    ('tcl', 512, 1000, _torch_default),
    ('simclr', 16, 3, _zeros)])
def test_the_classifier_init(preset, f, c, check):
  cfg = linear_eval.PRESETS[preset]
  init = jax.device_get(linear_eval.init_classifier(cfg, 3, f, c))
  assert init['w'].shape == (f, c) and init['b'].shape == (c,)
  check(init, f, c)
  # The same seed, the same start; another seed, another draw.
  again = jax.device_get(linear_eval.init_classifier(cfg, 3, f, c))
  for k in ('w', 'b'):
    np.testing.assert_array_equal(again[k], init[k])
  other = jax.device_get(linear_eval.init_classifier(cfg, 4, f, c))
  assert (check is _zeros) != (not np.allclose(other['w'], init['w']))


def test_the_fields_are_checked():
  cases = [(dict(optimizer='lamb'), 'optimizer must be one of'),
           (dict(optimizer='rmsprop'), 'optimizer must be one of'),
           (dict(schedule='exponential'), 'schedule must be one of'),
           (dict(classifier_init='normal'), 'classifier_init must be one of'),
           (dict(encoder_bn='train'), 'encoder_bn must be one of'),
           (dict(lr_update='epoch'), 'lr_update must be one of')]
  for fields, match in cases:
    with pytest.raises(ValueError, match=match):
      linear_eval.LinearEvalConfig(**fields)
  with pytest.raises(ValueError, match='schedule must be one of'):
    linear_eval.SupConTFConfig(schedule='cosine')
  with pytest.raises(ValueError, match='needs epochs_per_decay'):
    dataclasses.replace(linear_eval.PRESETS['supcon_tf'], epochs_per_decay=0.)


def _numpy_supcon_tf(train, cfg, w0, steps_per_epoch, *, normalize=True,
                     smoothing=None):
  """The TF stage 2 on the flipped pixels: L2-normalised features, the
  label-smoothed cross-entropy, TF 1's RMSProp on the loss + wd sum(w^2)/2
  over kernel and bias, the warmup + exponential schedule."""
  a = cfg.label_smoothing if smoothing is None else smoothing
  x = train.images.astype(np.float64)[:, :, ::-1].reshape(N, -1) / 255.
  if normalize:
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
  y = train.labels
  params = [np.array(w0, np.float64), np.zeros(C)]
  ms = [np.ones_like(p) for p in params]
  mom = [np.zeros_like(p) for p in params]
  warmup = int(cfg.warmup_epochs * steps_per_epoch)
  step = 0
  for epoch in range(cfg.epochs):
    order = np.random.default_rng([SEED, epoch]).permutation(N)
    for i in range(steps_per_epoch):
      idx = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
      grads = _np_grads(x[idx], y[idx], *params, smoothing=a)[1:]
      lr = _tf_schedule(step, lr=cfg.lr, warmup_steps=warmup,
                        decay_steps=cfg.epochs_per_decay * steps_per_epoch,
                        rate=cfg.lr_decay)
      for k in range(2):
        g = grads[k] + cfg.weight_decay * params[k]
        ms[k] = cfg.rmsprop_decay * ms[k] + (1 - cfg.rmsprop_decay) * g ** 2
        mom[k] = cfg.momentum * mom[k] + lr * g / np.sqrt(
            ms[k] + cfg.rmsprop_eps)
        params[k] = params[k] - mom[k]
      step += 1
  return params


def test_a_short_run_of_the_supcon_tf_preset_matches_numpy():
  # 'supcon_tf' at batch 16, shortened to 4 epochs of 3 steps: 1 warmup
  # epoch, then x0.5 every half epoch (1.5 steps); a larger lr and weight
  # decay so that every term moves the classifier; every training image
  # flipped and not cropped, so that numpy can replay the run. The kernel
  # starts from the run's Glorot-uniform draw (`init_classifier`, tested
  # above).
  cfg = dataclasses.replace(
      linear_eval.get_config('supcon_tf', batch_size=16, epochs=4),
      lr=0.05, warmup_epochs=1., epochs_per_decay=0.5, lr_decay=0.5,
      weight_decay=0.01, label_smoothing=0.2,
      view=augment.ViewConfig(crop_scale=None, flip_p=1.0))
  out = _run(runtime.create_mesh(), cfg)
  w0 = np.asarray(jax.device_get(linear_eval.init_classifier(
      cfg, SEED, HW * HW, C))['w'])
  assert np.abs(w0).max() > 0.1                 # Glorot, not zeros.
  w, b = _numpy_supcon_tf(_data(0, N), cfg, w0, steps_per_epoch=N // 16)
  got = jax.device_get(out['classifier'])
  moved = np.abs(w - w0).max()
  np.testing.assert_allclose(got['w'], w, atol=1e-4 * moved)
  np.testing.assert_allclose(got['b'], b, atol=1e-4 * moved)
  # Unnormalised features or no label smoothing end elsewhere: the run
  # used both.
  for kw in (dict(normalize=False), dict(smoothing=0.)):
    w_other, _ = _numpy_supcon_tf(_data(0, N), cfg, w0,
                                  steps_per_epoch=N // 16, **kw)
    assert np.abs(w_other - w).max() > 100 * 1e-4 * moved, kw
  assert np.isfinite(out['train_loss_last'])


def test_the_supcon_tf_preset_runs_with_its_own_augmentation():
  # Crop 0.08-1, flip and TF Model Garden's AutoAugment 'v0' on 3-channel
  # images.
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, (32, 16, 16, 3)).astype(np.uint8)
  train = pipeline.ArrayDataset(images, rng.integers(0, C, 32))
  test = pipeline.ArrayDataset(images[:16], rng.integers(0, C, 16))
  out = linear_eval.linear_evaluation(
      Pixels(), {}, train, test, runtime.create_mesh(),
      cfg=linear_eval.get_config('supcon_tf', batch_size=16, epochs=1),
      num_classes=C, seed=SEED, eval_batch_size=16)
  assert np.isfinite(out['train_loss_last'])
  assert 0. <= out['top1_last'] <= 1.


# The frozen encoder's BatchNorm in the training steps (`encoder_bn`): a
# one-layer 'encoder', BatchNorm of the pixels, whose statistics and affine
# parameters are set far from the identity, so that running and batch
# statistics give different features.


class BNPixels(nn.Module):
  """Features = BatchNorm(pixels in [0, 1]) [B, H W C] (momentum 0.9, eps
  1e-5, as the encoders')."""

  @nn.compact
  def __call__(self, x, *, train: bool):
    x = x.reshape(x.shape[0], -1)
    return {'features': nn.BatchNorm(use_running_average=not train,
                                     momentum=0.9, epsilon=1e-5)(x)}


F = HW * HW


def _bn_variables():
  rng = np.random.default_rng(7)
  return {'params': {'BatchNorm_0': {
              'scale': jnp.asarray(rng.uniform(0.5, 2., F), jnp.float32),
              'bias': jnp.asarray(rng.normal(0., 0.5, F), jnp.float32)}},
          'batch_stats': {'BatchNorm_0': {
              'mean': jnp.asarray(rng.uniform(0.2, 0.8, F), jnp.float32),
              'var': jnp.asarray(rng.uniform(0.01, 0.2, F), jnp.float32)}}}


def _np_bn(rows, variables, mean=None, var=None):
  """numpy BatchNorm of rows [n, F]: with the given statistics, else the
  rows' own mean and biased variance."""
  v = jax.tree.map(lambda a: np.asarray(a, np.float64), variables)
  if mean is None:
    mean, var = rows.mean(0), rows.var(0)
  return ((rows - mean) / np.sqrt(var + 1e-5) * v['params']['BatchNorm_0'][
      'scale'] + v['params']['BatchNorm_0']['bias'])


def _np_running(rows, variables):
  stats = jax.tree.map(lambda a: np.asarray(a, np.float64),
                       variables['batch_stats']['BatchNorm_0'])
  return _np_bn(rows, variables, stats['mean'], stats['var'])


def test_batch_statistics_are_the_global_batchs_and_train_nothing():
  # 16 images sharded over the 8 devices (2 each): 'batch' normalises with
  # the mean and biased variance of all 16 (what the jitted BatchNorm
  # reduces), not of each device's 2; 'running' with the running
  # statistics. No gradient reaches the encoder's variables.
  mesh = runtime.create_mesh()
  assert mesh.size == 8
  variables = _bn_variables()
  images = np.random.default_rng(3).uniform(0., 1., (16, HW, HW, 1))
  rows = images.reshape(16, -1)
  sharded = jax.device_put(jnp.asarray(images, jnp.float32),
                           NamedSharding(mesh, P('data')))
  for mode, expected in (('batch', _np_bn(rows, variables)),
                         ('running', _np_running(rows, variables))):
    fn = jax.jit(lambda v, x, mode=mode: linear_eval._frozen_features(
        BNPixels(), v, x, encoder_bn=mode))
    got, updates = fn(variables, sharded)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4,
                               atol=1e-4)
    assert updates == {}, mode            # Nothing to carry to a next step.
    grads = jax.grad(lambda v, mode=mode: jnp.sum(jnp.sin(
        linear_eval._frozen_features(BNPixels(), v, sharded,
                                     encoder_bn=mode)[0])))(variables)
    assert all(not np.any(g) for g in jax.tree.leaves(grads)), mode
  per_device = np.concatenate([_np_bn(rows[i:i + 2], variables)
                               for i in range(0, 16, 2)])
  assert np.abs(per_device - _np_bn(rows, variables)).max() > 0.1
  assert np.abs(_np_running(rows, variables)
                - _np_bn(rows, variables)).max() > 0.1


@pytest.mark.parametrize('encoder_bn', ['running', 'batch'])
def test_a_run_with_encoder_bn_matches_numpy(encoder_bn):
  # The SGD loop on BatchNorm features: each training step's batch of 16
  # (over 8 devices) normalised with its own statistics ('batch') or the
  # running ones ('running'); evaluation always with the running ones. The
  # statistics are never updated: numpy uses the initial ones throughout.
  cfg = dataclasses.replace(CFG, encoder_bn=encoder_bn)
  variables = _bn_variables()
  before = jax.device_get(variables)
  out = _run(runtime.create_mesh(), cfg, BNPixels(), variables)
  train = ((lambda rows: _np_bn(rows, before)) if encoder_bn == 'batch'
           else (lambda rows: _np_running(rows, before)))
  w, b, top1, losses = _numpy_reference(
      _data(0, N), _data(1, 30), cfg, train_features=train,
      eval_features=lambda rows: _np_running(rows, before))
  scale = _assert_matches(out, w, b, rtol=1e-4, top1=top1,
                          last_loss=losses[-1])
  for a, b_ in zip(jax.tree.leaves(jax.device_get(variables)),
                   jax.tree.leaves(before)):
    np.testing.assert_array_equal(a, b_)
  # The other mode's features end elsewhere.
  other = ((lambda rows: _np_running(rows, before)) if encoder_bn == 'batch'
           else (lambda rows: _np_bn(rows, before)))
  w_other, _, _, _ = _numpy_reference(
      _data(0, N), _data(1, 30), cfg, train_features=other,
      eval_features=lambda rows: _np_running(rows, before))
  assert np.abs(w_other - w).max() > 100 * 1e-4 * scale


def test_batch_statistics_in_groups_need_a_batch_of_whole_groups():
  # With SplitBatchNorm (config.model.bn_splits) the 'batch' mode normalises
  # groups of the batch: a batch that does not split is named before
  # training, a 'running' preset is not concerned.
  config = test_config.get_config()
  config.model.bn_splits = 8
  config.evals = {'lin': evaluators.config_entry(
      type='linear_eval', preset='supcon_tf', batch_size=20)}
  config = config_lib.with_defaults(config)
  with pytest.raises(ValueError, match=r'8 groups.*batch would be 20.*'
                     r'config.evals.lin.batch_size'):
    evaluators.validate(config, num_devices=4)
  config.evals.lin.batch_size = 24
  evaluators.validate(config, num_devices=4)
  config.evals.lin.preset = 'simclr'
  config.evals.lin.batch_size = 20
  evaluators.validate(config, num_devices=4)


# TCL's linear stage as the authors' train.py runs it (`train_cross_entropy`
# after `model1.freeze_projection()`): the training transform with
# AutoAugment, BatchNorm in train mode updating its running averages, the
# classifier at PyTorch's nn.Linear init, the cosine lr set after each epoch.


class _NumpyBatchNormState:
  """numpy BatchNorm of pixel rows in train mode that also moves running
  averages: PyTorch's BatchNorm with momentum 0.1 (running <- 0.9 running +
  0.1 batch; the variance the biased one, flax's rule), evaluation reading
  the running averages as they stand."""

  def __init__(self, variables):
    self.variables = variables
    stats = jax.tree.map(lambda a: np.asarray(a, np.float64),
                         variables['batch_stats']['BatchNorm_0'])
    self.mean, self.var = stats['mean'], stats['var']

  def train(self, rows):
    mean, var = rows.mean(0), rows.var(0)
    self.mean = 0.9 * self.mean + 0.1 * mean
    self.var = 0.9 * self.var + 0.1 * var
    return _np_bn(rows, self.variables, mean, var)

  def eval(self, rows):
    return _np_bn(rows, self.variables, self.mean, self.var)


def test_the_encoders_batchnorm_momentum_is_pytorchs_0_1():
  # models.batch_norm (every encoder's BatchNorm): running <- 0.9 running +
  # 0.1 batch mean (biased variance), PyTorch's momentum=0.1 convention.
  bn = models.batch_norm(train=True, dtype=jnp.float32)()
  x = jnp.asarray(np.random.default_rng(0).normal(2., 3., (32, 5)),
                  jnp.float32)
  variables = bn.init(jax.random.key(0), x)
  _, moved = bn.apply(variables, x, mutable=['batch_stats'])
  xs = np.asarray(x, np.float64)
  np.testing.assert_allclose(moved['batch_stats']['mean'],
                             0.1 * xs.mean(0), rtol=1e-5)
  np.testing.assert_allclose(moved['batch_stats']['var'],
                             0.9 + 0.1 * xs.var(0), rtol=1e-5)


def test_batch_update_moves_the_running_averages_over_the_global_batch():
  # One call on 16 images over the 8 devices: the features are the batch's
  # BatchNorm ('batch'), and the updates the running averages moved by
  # the global batch's mean and biased variance; no gradient to the
  # encoder, `variables` untouched.
  mesh = runtime.create_mesh()
  variables = _bn_variables()
  before = jax.device_get(variables)
  images = np.random.default_rng(3).uniform(0., 1., (16, HW, HW, 1))
  rows = images.reshape(16, -1)
  sharded = jax.device_put(jnp.asarray(images, jnp.float32),
                           NamedSharding(mesh, P('data')))
  got, updates = jax.jit(lambda v, x: linear_eval._frozen_features(
      BNPixels(), v, x, encoder_bn='batch_update'))(variables, sharded)
  state = _NumpyBatchNormState(before)
  np.testing.assert_allclose(np.asarray(got), state.train(rows), rtol=1e-4,
                             atol=1e-4)
  assert set(updates) == {'batch_stats'}
  moved = jax.device_get(updates['batch_stats']['BatchNorm_0'])
  np.testing.assert_allclose(moved['mean'], state.mean, rtol=1e-5)
  np.testing.assert_allclose(moved['var'], state.var, rtol=1e-5)
  grads = jax.grad(lambda v: jnp.sum(jnp.sin(linear_eval._frozen_features(
      BNPixels(), v, sharded, encoder_bn='batch_update')[0])))(variables)
  assert all(not np.any(g) for g in jax.tree.leaves(grads))
  for a, b in zip(jax.tree.leaves(jax.device_get(variables)),
                  jax.tree.leaves(before)):
    np.testing.assert_array_equal(a, b)


def test_a_run_with_batch_update_matches_numpy():
  # 3 epochs of 3 steps of 16 images: every step normalises with its
  # batch's statistics and moves the running averages (9 updates); each
  # epoch's evaluation reads the averages as they stand then. numpy
  # replays it; the run returns the moved averages with the classifier.
  cfg = dataclasses.replace(CFG, encoder_bn='batch_update')
  variables = _bn_variables()
  before = jax.device_get(variables)
  out = _run(runtime.create_mesh(), cfg, BNPixels(), variables)
  state = _NumpyBatchNormState(before)
  w, b, top1, losses = _numpy_reference(
      _data(0, N), _data(1, 30), cfg, train_features=state.train,
      eval_features=state.eval)
  _assert_matches(out, w, b, rtol=1e-4, top1=top1, last_loss=losses[-1])
  moved = jax.device_get(out['variables'])
  np.testing.assert_allclose(moved['batch_stats']['BatchNorm_0']['mean'],
                             state.mean, rtol=1e-4)
  np.testing.assert_allclose(moved['batch_stats']['BatchNorm_0']['var'],
                             state.var, rtol=1e-4)
  # The parameters are the frozen ones; the caller's variables untouched.
  for a, b_ in zip(jax.tree.leaves(moved['params']),
                   jax.tree.leaves(before['params'])):
    np.testing.assert_array_equal(a, b_)
  for a, b_ in zip(jax.tree.leaves(jax.device_get(variables)),
                   jax.tree.leaves(before)):
    np.testing.assert_array_equal(a, b_)
  # The averages moved far from the initial ones, and an evaluation on
  # those would score other logits: the run evaluated with the moved ones.
  initial = before['batch_stats']['BatchNorm_0']
  assert np.abs(state.mean - initial['mean']).max() > 0.05
  test_rows = _data(1, 30).images.astype(np.float64).reshape(30, -1) / 255.
  assert np.abs(state.eval(test_rows) @ w
                - _np_running(test_rows, before) @ w).max() > 0.1
  # The other modes return the variables they were given.
  assert _run(runtime.create_mesh(), dataclasses.replace(
      CFG, encoder_bn='batch'), BNPixels(), variables)['variables'] is (
          variables)


def _tcl_epoch_lrs(lr, epochs):
  """The lr each epoch trains at in TCL's train.py: the optimizer built at
  lr, then `adjust_learning_rate(optimizer, epoch)` after epoch `epoch`:
  eta_min = lr x 0.1^3, lr <- eta_min + (lr - eta_min)(1 + cos(pi epoch /
  epochs)) / 2."""
  current, out = lr, []
  eta_min = lr * 0.1 ** 3
  for epoch in range(epochs):
    out.append(current)
    current = eta_min + (lr - eta_min) * (
        1 + math.cos(math.pi * epoch / epochs)) / 2
  return out


def _held_and_gap_to_per_step(cfg, sched, spe, epochs):
  """(the schedule's lr at every step, its gap to the per-step schedule of
  the same recipe) over `epochs` epochs of `spe` steps."""
  steps = np.arange(epochs * spe)
  per_step = np.asarray(linear_eval.learning_rate(
      dataclasses.replace(cfg, lr_update='every_step'), spe)(steps))
  held = np.asarray(sched(steps))
  return held, held - per_step


def test_the_after_epoch_cosine_is_tcls_adjust_learning_rate():
  cfg = linear_eval.PRESETS['tcl']
  assert (cfg.schedule, cfg.cosine_final, cfg.lr_update) == (
      'cosine', 1e-3, 'after_epoch')
  spe = 781                          # CIFAR-10's 50000 // 64 steps
  sched = linear_eval.learning_rate(cfg, spe)
  want = _tcl_epoch_lrs(0.5, 50)
  assert want[0] == want[1] == 0.5
  for epoch in range(50):
    for step in (epoch * spe, epoch * spe + spe // 2, epoch * spe + spe - 1):
      assert float(sched(step)) == pytest.approx(want[epoch], rel=1e-5), (
          epoch, step)
  # The per-step cosine it replaces: at most 0.0313 apart (6.3% of the
  # peak lr), at the end of epoch 25 (0-based); the last epoch at 0.0025
  # instead of falling to 0.0005.
  after, gap = _held_and_gap_to_per_step(cfg, sched, spe, 50)
  assert gap.min() >= -1e-6
  assert gap.max() == pytest.approx(0.03134, abs=2e-4)
  assert int(np.argmax(gap)) // spe == 25
  assert after[-1] == pytest.approx(0.00247, rel=1e-2)


def test_a_run_with_the_after_epoch_lr_matches_numpy():
  # CFG's cosine set after each epoch: epochs 0 and 1 at lr 0.3, epoch 2 at
  # the cosine of epoch 1 (to 0, cosine_final 0).
  cfg = dataclasses.replace(CFG, lr_update='after_epoch')
  lrs = [0.3, 0.3, 0.3 * 0.5 * (1 + math.cos(math.pi / 3))]
  out = _run(runtime.create_mesh(), cfg)
  w, b, top1, _ = _numpy_reference(_data(0, N), _data(1, 30), cfg,
                                   lr_of_epoch=lambda e: lrs[e])
  scale = _assert_matches(out, w, b, rtol=1e-5, top1=top1)
  w_step, _, _, _ = _numpy_reference(_data(0, N), _data(1, 30), CFG)
  assert np.abs(w_step - w).max() > 100 * 1e-5 * scale


def test_the_three_fields_of_every_preset_are_the_official_codes():
  # (classifier_init, encoder_bn, lr_update) as configs/papers/recipes.yaml
  # records them: MoCo's and MoCo v3's main_lincls.py (fc N(0, 0.01^2),
  # model.eval(), adjust_learning_rate before each epoch); SupContrast's
  # main_linear.py and CACR's linear_eval.py (nn.Linear's init, eval mode,
  # the lr set per epoch); SimCLR v1 (--zero_init_logits_layer,
  # is_training=False, the global step's cosine); SupCon's TF stage 2; TCL's
  # train.py; 'cifar' (this project's) and 'macl' (unstated) the defaults.
  want = {
      'moco': ('normal_0.01', 'running', 'epoch_start'),
      'moco_v3': ('normal_0.01', 'running', 'epoch_start'),
      'supcon': ('torch_default', 'running', 'epoch_start'),
      'cacr_small': ('torch_default', 'running', 'epoch_start'),
      'simclr': ('zeros', 'running', 'every_step'),
      'supcon_tf': ('glorot_uniform', 'batch', 'every_step'),
      'tcl': ('torch_default', 'batch_update', 'after_epoch'),
      'tcl_batch128': ('torch_default', 'batch_update', 'after_epoch'),
      'cifar': ('zeros', 'running', 'every_step'),
      'macl': ('zeros', 'running', 'every_step'),
  }
  assert sorted(want) == sorted(linear_eval.PRESETS)
  for name, fields in want.items():
    cfg = linear_eval.PRESETS[name]
    assert (cfg.classifier_init, cfg.encoder_bn, cfg.lr_update) == fields, (
        name)


def test_epoch_start_is_the_step_schedule_at_whole_epoch_milestones():
  # MoCo's adjust_learning_rate(optimizer, epoch) before each epoch: lr x
  # 0.1 for each milestone <= epoch, held for the epoch; SupContrast's (x0.2
  # for each milestone the 1-based epoch exceeds) and CACR's MultiStepLR
  # stepped after each epoch give the same. Written out per epoch here, and
  # equal to the per-step schedule at every step.
  spe = 7
  for name, rate in (('moco', 0.1), ('supcon', 0.2), ('cacr_small', 0.2)):
    cfg = linear_eval.PRESETS[name]
    assert (cfg.schedule, cfg.lr_update, cfg.lr_decay) == (
        'step', 'epoch_start', rate), name
    steps = np.arange(cfg.epochs * spe)
    held = np.asarray(linear_eval.learning_rate(cfg, spe)(steps))
    want = np.asarray([cfg.lr * rate ** sum(m <= s // spe
                                            for m in cfg.milestones)
                       for s in steps])
    np.testing.assert_allclose(held, want, rtol=1e-6, err_msg=name)
    per_step = np.asarray(linear_eval.learning_rate(dataclasses.replace(
        cfg, lr_update='every_step'), spe)(steps))
    np.testing.assert_array_equal(held, per_step, err_msg=name)


def test_epoch_start_cosine_is_moco_v3s_adjust_learning_rate():
  # MoCo v3's main_lincls.py: before epoch e (0-based), lr = init_lr x 0.5
  # x (1 + cos(pi e / epochs)), held for the epoch.
  cfg = linear_eval.PRESETS['moco_v3']
  spe = 1251                           # 1281167 // 1024
  sched = linear_eval.learning_rate(cfg, spe)
  for epoch in range(90):
    want = 0.4 * 0.5 * (1 + math.cos(math.pi * epoch / 90))
    for step in (epoch * spe, epoch * spe + spe // 2, epoch * spe + spe - 1):
      assert float(sched(step)) == pytest.approx(want, rel=1e-5, abs=1e-7), (
          epoch, step)
  # Against the per-step cosine it replaces: never below it, at most
  # pi / (2 x 90) of the peak above (the cosine's largest fall in one
  # epoch), the last epoch at 3.0e-4 x lr where the per-step one ends at 0.
  held, gap = _held_and_gap_to_per_step(cfg, sched, spe, 90)
  assert gap.min() >= -1e-6
  assert gap.max() == pytest.approx(0.4 * 0.5 * math.sin(math.pi / 90),
                                    rel=1e-2)
  assert held[-1] / 0.4 == pytest.approx(0.5 * (1 - math.cos(math.pi / 90)),
                                         rel=1e-3)


def test_a_run_from_the_normal_init_with_the_epoch_start_lr_matches_numpy():
  # CFG's cosine held per epoch at its value at the epoch's start (0.3,
  # 0.225, 0.075), from MoCo's N(0, 0.01^2) classifier: MoCo v3's probe in
  # miniature.
  cfg = dataclasses.replace(CFG, lr_update='epoch_start',
                            classifier_init='normal_0.01')
  lrs = [0.3 * 0.5 * (1 + math.cos(math.pi * e / 3)) for e in range(3)]
  assert lrs == pytest.approx([0.3, 0.225, 0.075])
  start = jax.device_get(linear_eval.init_classifier(cfg, SEED, HW * HW, C))
  assert np.any(start['w']) and not np.any(start['b'])
  out = _run(runtime.create_mesh(), cfg)
  w, b, top1, _ = _numpy_reference(_data(0, N), _data(1, 30), cfg,
                                   lr_of_epoch=lambda e: lrs[e],
                                   start=(start['w'], start['b']))
  scale = _assert_matches(out, w, b, rtol=1e-5, top1=top1)
  # Neither the per-step cosine nor the zero start reaches those weights.
  w_step, _, _, _ = _numpy_reference(_data(0, N), _data(1, 30), cfg,
                                     start=(start['w'], start['b']))
  assert np.abs(w_step - w).max() > 100 * 1e-5 * scale
  w_zero, _, _, _ = _numpy_reference(_data(0, N), _data(1, 30), cfg,
                                     lr_of_epoch=lambda e: lrs[e])
  assert np.abs(w_zero - w).max() > 100 * 1e-5 * scale


def test_the_tcl_presets_view_is_the_pretraining_transform_with_autoaugment():
  # train.py's linear stage reads train_loader, whose transform_train is
  # pretraining's: RandomCrop(padding=4), flip, AutoAugment() (CIFAR-10
  # policy, pytorch-auto-augment port).
  for name in ('tcl', 'tcl_batch128'):
    view = linear_eval.PRESETS[name].view
    assert view == augment.PRESETS['tcl'][0], name
    assert (view.crop_scale, view.pad_crop, view.flip_p, view.autoaugment,
            view.autoaugment_impl) == (None, 4, 0.5, 'cifar10',
                                       'pytorch_auto_augment')
  # Through augment.augment_batch: pad-crop and flip (the view without
  # AutoAugment, same keys) then AutoAugment of each result with its own
  # key (fold_in of the image's key), composed here from the pieces.
  view = linear_eval.PRESETS['tcl'].view
  images = np.random.default_rng(4).integers(0, 256, (8, 32, 32, 3)).astype(
      np.uint8)
  rng = jax.random.key(9)
  got = np.asarray(augment.augment_batch(rng, images, (view,))[:, 0])
  plain = np.asarray(augment.augment_batch(
      rng, images, (dataclasses.replace(view, autoaugment=''),))[:, 0])
  keys = jax.random.split(jax.random.fold_in(rng, 0), 8)
  want = np.stack([np.asarray(augment.autoaugment(
      jax.random.fold_in(keys[i], augment._AUTOAUGMENT_STREAM),
      jnp.asarray(plain[i]), policy='cifar10', impl='pytorch_auto_augment'))
                   for i in range(8)])
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert got.shape == (8, 32, 32, 3) and 0. <= got.min() <= got.max() <= 1.
  assert np.abs(got - plain).max() > 0.1     # AutoAugment changed images.


def test_the_tcl_preset_runs_end_to_end():
  # 'tcl' at batch 16 for 2 epochs on 3-channel images through a BatchNorm
  # encoder: AutoAugment, batch_update, torch_default, after_epoch together.
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, (32, 8, 8, 3)).astype(np.uint8)
  train = pipeline.ArrayDataset(images, rng.integers(0, C, 32))
  test = pipeline.ArrayDataset(images[:16], rng.integers(0, C, 16))
  model = BNPixels()
  variables = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)),
                         train=False)
  out = linear_eval.linear_evaluation(
      model, variables, train, test, runtime.create_mesh(),
      cfg=linear_eval.get_config('tcl', batch_size=16, epochs=2),
      num_classes=C, seed=SEED, eval_batch_size=16)
  assert np.isfinite(out['train_loss_last'])
  assert 0. <= out['top1_last'] <= 1.
  stats = jax.device_get(out['variables']['batch_stats']['BatchNorm_0'])
  assert np.abs(stats['mean']).max() > 0.1      # 4 steps moved them.


def test_the_probe_draws_its_own_crops_and_order():
  # At an equal batch, the run's seed would hand the probe pretraining's
  # view-0 crops at every step; the probe's seed is derived apart.
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top
  config = config_lib.with_defaults(test_config.get_config())
  config.dataset.update({'name': 'image_folder', 'image_size': 16,
                         'in_memory': False,
                         'train_crop_source': 'full_image'})
  view = linear_eval.PRESETS['moco'].view
  seed = linear_eval.probe_seed(config.seed)
  assert seed != config.seed and seed == linear_eval.probe_seed(config.seed)
  image = np.random.default_rng(0).integers(0, 256, (100, 120, 3)).astype(
      np.uint8)
  pre = sources.training_fit(config.dataset, (view,), config.seed).at(3)
  probe = sources.training_fit(config.dataset, (view,), seed).at(3)
  crops = [(pre(image, i, 16, 3), probe(image, i, 16, 3)) for i in range(8)]
  assert not any(np.array_equal(a, b) for a, b in crops)
  assert not np.array_equal(pipeline._permutation(config.seed, 64, 0),  # pylint: disable=protected-access
                            pipeline._permutation(seed, 64, 0))  # pylint: disable=protected-access
