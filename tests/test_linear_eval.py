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
import numpy as np
import pytest

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


def _numpy_reference(train, test, cfg):
  x = train.images.astype(np.float64)[:, :, ::-1].reshape(N, -1) / 255.
  y = train.labels
  tx = test.images.astype(np.float64).reshape(len(test), -1) / 255.
  w, b = np.zeros((x.shape[1], C)), np.zeros(C)
  mw, mb = np.zeros_like(w), np.zeros_like(b)
  steps_per_epoch = N // cfg.batch_size
  total, step, top1, losses = cfg.epochs * steps_per_epoch, 0, [], []
  for epoch in range(cfg.epochs):
    order = np.random.default_rng([SEED, epoch]).permutation(N)
    epoch_losses = []
    for i in range(steps_per_epoch):
      idx = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
      logits = x[idx] @ w + b
      p = np.exp(logits - logits.max(1, keepdims=True))
      p /= p.sum(1, keepdims=True)
      epoch_losses.append(-np.mean(np.log(p[np.arange(len(idx)), y[idx]])))
      resid = (p - np.eye(C)[y[idx]]) / len(idx)
      gw = x[idx].T @ resid + cfg.weight_decay * w
      gb = resid.sum(0) + cfg.weight_decay * b
      lr = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / total))
      mw, mb = cfg.momentum * mw + gw, cfg.momentum * mb + gb
      w = w - lr * (gw + cfg.momentum * mw)        # Nesterov
      b = b - lr * (gb + cfg.momentum * mb)
      step += 1
    top1.append(np.mean(np.argmax(tx @ w + b, 1) == test.labels))
    losses.append(np.mean(epoch_losses))
  return w, b, top1, losses


def _run(mesh, cfg=CFG):
  return linear_eval.linear_evaluation(
      Pixels(), {}, _data(0, N), _data(1, 30), mesh, cfg=cfg, num_classes=C,
      seed=SEED, eval_batch_size=16)


def test_matches_a_numpy_sgd_loop_on_flipped_training_images():
  out = _run(runtime.create_mesh())
  w, b, top1, losses = _numpy_reference(_data(0, N), _data(1, 30), CFG)
  got = jax.device_get(out['classifier'])
  scale = np.abs(w).max()
  np.testing.assert_allclose(got['w'], w, atol=1e-5 * scale)
  np.testing.assert_allclose(got['b'], b, atol=1e-5 * scale)
  assert out['top1_per_epoch'] == pytest.approx(top1)
  assert out['train_loss_last'] == pytest.approx(losses[-1], rel=1e-5)
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


def test_the_supcon_moco_v3_and_tcl_cifar100_presets():
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
  tcl, tcl100 = linear_eval.PRESETS['tcl'], linear_eval.PRESETS['tcl_cifar100']
  assert (tcl100.batch_size, tcl100.lr) == (128, 0.5)
  assert dataclasses.replace(tcl100, batch_size=64) == tcl


def _numpy_step_sgd(train, test, cfg, steps_per_epoch):
  """Plain-momentum SGD (PyTorch's), the step schedule written out."""
  x = train.images.astype(np.float64)[:, :, ::-1].reshape(N, -1) / 255.
  y = train.labels
  w, b = np.zeros((x.shape[1], C)), np.zeros(C)
  mw, mb = np.zeros_like(w), np.zeros_like(b)
  lrs = []
  for epoch in range(cfg.epochs):
    lr = cfg.lr * cfg.lr_decay ** sum(m <= epoch for m in cfg.milestones)
    lrs.append(lr)
    order = np.random.default_rng([SEED, epoch]).permutation(N)
    for i in range(steps_per_epoch):
      idx = order[i * cfg.batch_size:(i + 1) * cfg.batch_size]
      logits = x[idx] @ w + b
      p = np.exp(logits - logits.max(1, keepdims=True))
      p /= p.sum(1, keepdims=True)
      resid = (p - np.eye(C)[y[idx]]) / len(idx)
      mw = cfg.momentum * mw + x[idx].T @ resid + cfg.weight_decay * w
      mb = cfg.momentum * mb + resid.sum(0) + cfg.weight_decay * b
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
  out = _run(runtime.create_mesh(), cfg)
  w, b, lrs = _numpy_step_sgd(_data(0, N), _data(1, 30), cfg,
                              steps_per_epoch=N // 16)
  assert lrs == pytest.approx([0.15625, 0.03125, 0.00625, 0.00125])
  got = jax.device_get(out['classifier'])
  scale = np.abs(w).max()
  np.testing.assert_allclose(got['w'], w, atol=1e-5 * scale)
  np.testing.assert_allclose(got['b'], b, atol=1e-5 * scale)
  # A constant lr (no decay) ends elsewhere: the schedule is what was used.
  flat = dataclasses.replace(cfg, milestones=())
  w_flat, _, _ = _numpy_step_sgd(_data(0, N), _data(1, 30), flat,
                                 steps_per_epoch=N // 16)
  assert np.abs(w_flat - w).max() > 100 * 1e-5 * scale
  # And the preset's own augmentation (crop 0.2-1 + flip) runs.
  own = _run(runtime.create_mesh(),
             linear_eval.get_config('supcon', batch_size=16, epochs=2))
  assert np.isfinite(own['train_loss_last'])
  assert 0. <= own['top1_last'] <= 1.
