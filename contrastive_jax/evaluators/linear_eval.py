"""The papers' linear evaluation: SGD (or Adam, RMSProp) on augmented images,
frozen encoder.

SimCLR (Appendix B.5), MoCo (Sec. 4.1), SupCon, CACR, TCL and MACL report a
linear classifier trained on the frozen encoder's features of *augmented*
training images (random resized crop + flip, or the paper's crop), scored on the
un-augmented evaluation images (the sources' centre crops). This module runs
that protocol streamed, on any mesh and any number of processes:

* each step reads this process's part of a global batch
  (`pipeline.TrainBatches`: the order is a pure function of seed and step),
  augments it on the devices with the preset's `ViewConfig`, runs the encoder
  under stop_gradient with BatchNorm on its running statistics (or on the
  batch's, `encoder_bn='batch'`, never updating them; or on the batch's
  while updating the running ones, `encoder_bn='batch_update'`),
  L2-normalises the features where the preset says so, and updates
  the replicated [F, C] classifier (data-parallel: the batch is sharded over
  every device of every host, the gradient is a mean over the global batch);
* after every epoch the evaluation split is scored in `eval_batches` (each
  process reads its part; only scalar counts come back), the encoder's
  BatchNorm on its running statistics (with `encoder_bn='batch_update'`,
  those the training steps have updated so far).

The hyperparameters are the papers' (`PRESETS`, sources in each comment).
`logreg.logistic_regression` (L-BFGS on cached un-augmented features) is the
fast alternative: seconds instead of epochs of encoder forwards, for
monitoring and small features; its numbers are not the papers' protocol.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import progress
from contrastive_jax.evaluators import base
from contrastive_jax.losses.common import l2_normalize
from input_pipeline import augment
from input_pipeline import pipeline
from input_pipeline import sources

OPTIMIZERS = ('sgd', 'adam', 'rmsprop')
ENCODER_BN = ('running', 'batch', 'batch_update')
SCHEDULES = ('constant', 'cosine', 'step', 'exponential')
LR_UPDATES = ('every_step', 'epoch_start', 'after_epoch')
CLASSIFIER_INITS = ('zeros', 'normal_0.01', 'glorot_uniform', 'torch_default')
# (field, the one schedule it shapes): set under any other, it is refused.
SCHEDULE_ONLY = (('epochs_per_decay', 'exponential'),
                 ('warmup_epochs', 'exponential'),
                 ('cosine_final', 'cosine'))


@dataclasses.dataclass(frozen=True)
class LinearEvalConfig:
  """One linear-evaluation recipe (see PRESETS for the papers').

  `lr` is the learning rate at `batch_size`; another batch size scales it
  linearly (Goyal et al. 2017), as the papers that state lr = base x B / 256
  do. `view` is the training-image augmentation (crop, flip); evaluation
  images are never augmented.

  'rmsprop' is TensorFlow 1's `tf.compat.v1.train.RMSPropOptimizer` (the
  SupCon TF code's): mean square ms initialised to 1, ms <- d ms + (1 - d)
  g^2, mom <- momentum mom + lr g / sqrt(ms + eps) (eps inside the root, the
  learning rate inside the momentum), w <- w - mom. The 'exponential'
  schedule is TF's `exponential_decay(staircase=True)` after a linear warmup
  from 0 (the SupCon code's utils.py `build_learning_rate_schedule`): with
  W = floor(warmup_epochs x steps per epoch) warmup steps, lr x step / W
  for step < W, then lr x lr_decay ^ floor((step - W) / (epochs_per_decay x
  steps per epoch)), the decay counted from the warmup's end.
  `lr_update` is when the schedule moves: 'every_step' (the schedule's
  value at each step: the TF codes' global-step schedules);
  'epoch_start', held for each epoch at the schedule's value at that
  epoch's first step (PyTorch code that calls `adjust_learning_rate(
  optimizer, epoch)` before training epoch `epoch`, MoCo's and MoCo v3's
  main_lincls.py, SupContrast's main_linear.py, or steps an lr_scheduler
  once after each epoch, CACR's linear_eval.py; for a 'step' schedule
  whose milestones are whole epochs, the same lr as 'every_step' at every
  step); or
  'after_epoch', PyTorch code that calls its
  `adjust_learning_rate(optimizer, epoch)` after training epoch `epoch`
  (0-based) with that index: epoch e >= 1 trains at the schedule's value
  at epoch e - 1's first step, epoch 0 at its first value, so epochs 0
  and 1 share the initial lr (TCL's train.py).

  `encoder_bn` is the statistics the frozen encoder's BatchNorm uses in the
  training steps: 'running', its running averages (eval mode: the
  PyTorch probes' `model.eval()`, SimCLR's `is_training=False` under
  `--fine_tune_after_block=4`); 'batch', the mean and biased variance of
  the step's global batch of augmented images (the model applied in train
  mode, the statistics it would update discarded: the SupCon TF code's
  stage 2); 'batch_update', the same batch statistics with the running
  averages updated by every training step as in pretraining (the model's
  BatchNorm momentum, 0.9 = PyTorch's 0.1: TCL's `model.train()` with the
  encoder's parameters frozen by `requires_grad_(False)`). The evaluation
  passes read the running averages: those given for 'running' and 'batch',
  the updated ones for 'batch_update'. No mode gives the encoder's
  parameters a gradient.

  `classifier_init` is the kernel's (and bias') start: 'zeros' (SimCLR's
  `--zero_init_logits_layer`), 'normal_0.01' (MoCo's main_lincls.py:
  `fc.weight.normal_(mean=0, std=0.01)`, `fc.bias.zero_()`),
  'glorot_uniform' (TF's Dense: the kernel U(-l, l), l = sqrt(6 / (F +
  C)), a zero bias) or 'torch_default' (PyTorch's `nn.Linear`: kernel and
  bias U(-1 / sqrt(F), 1 / sqrt(F)), F the features).

  A field a preset leaves out takes the plain recipe's value (SGD with
  momentum, every-step lr, no weight decay, zero-initialised classifier,
  running BatchNorm statistics); the dataclass checks its values when
  built (ValueError).
  """
  optimizer: str = 'sgd'            # 'sgd', 'adam' or 'rmsprop'
  lr: float = 0.1
  epochs: int = 100
  batch_size: int = 256
  momentum: float = 0.9             # SGD (PyTorch-style heavy ball), RMSProp
  nesterov: bool = False            # SGD only
  adam_b1: float = 0.9              # Adam only
  adam_b2: float = 0.999
  rmsprop_decay: float = 0.9        # RMSProp only: the mean square's decay
  rmsprop_eps: float = 1e-10        # RMSProp only (TF 1's default), in sqrt
  weight_decay: float = 0.0         # coupled L2 (PyTorch weight_decay)
  schedule: str = 'constant'        # 'constant', 'cosine', 'step' or
                                    # 'exponential'
  lr_update: str = 'every_step'     # 'epoch_start' or 'after_epoch'
  milestones: tuple[int, ...] = ()  # epochs at which 'step' decays
  lr_decay: float = 0.1             # 'step': x per milestone; 'exponential':
                                    # x per epochs_per_decay
  cosine_final: float = 0.0         # 'cosine' final lr as a fraction of lr
  epochs_per_decay: float = 0.0     # 'exponential' only (> 0 there)
  warmup_epochs: float = 0.0        # 'exponential' only: linear from 0
  label_smoothing: float = 0.0      # targets (1 - a) one_hot + a / C
  normalize_features: bool = False  # L2-normalise the features first
  classifier_init: str = 'zeros'    # 'zeros', 'normal_0.01',
                                    # 'glorot_uniform' or 'torch_default'
  encoder_bn: str = 'running'       # training steps: 'running', 'batch' or
                                    # 'batch_update'
  view: augment.ViewConfig = augment.ViewConfig(crop_scale=(0.08, 1.),
                                                flip_p=0.5)

  def __post_init__(self):
    for name, choices in (('optimizer', OPTIMIZERS), ('schedule', SCHEDULES),
                          ('lr_update', LR_UPDATES),
                          ('classifier_init', CLASSIFIER_INITS),
                          ('encoder_bn', ENCODER_BN)):
      if getattr(self, name) not in choices:
        raise ValueError(f'linear evaluation {name} must be one of '
                         f'{choices}; got {getattr(self, name)!r}.')
    if self.nesterov and self.optimizer != 'sgd':
      raise ValueError('nesterov applies to the sgd optimizer only; got '
                       f'optimizer {self.optimizer!r} with nesterov=True.')
    if not 0. <= self.momentum < 1.:
      raise ValueError(f'momentum must be in [0, 1); got {self.momentum}.')
    if not 0. <= self.rmsprop_decay < 1.:
      raise ValueError('rmsprop_decay must be in [0, 1); got '
                       f'{self.rmsprop_decay}.')
    if not self.rmsprop_eps > 0.:
      raise ValueError(f'rmsprop_eps must be > 0; got {self.rmsprop_eps}.')
    if self.weight_decay < 0.:
      raise ValueError(f'weight_decay must be >= 0; got {self.weight_decay}.')
    if not self.lr_decay > 0.:
      raise ValueError(f'lr_decay must be > 0; got {self.lr_decay}.')
    if self.schedule == 'exponential' and not self.epochs_per_decay > 0.:
      raise ValueError("the 'exponential' schedule needs epochs_per_decay "
                       f'> 0; got {self.epochs_per_decay}.')
    if not 0. <= self.cosine_final < 1.:
      raise ValueError('cosine_final must be in [0, 1); got '
                       f'{self.cosine_final}.')
    if self.warmup_epochs < 0.:
      raise ValueError(f'warmup_epochs must be >= 0; got {self.warmup_epochs}.')
    for name, schedule in SCHEDULE_ONLY:
      if getattr(self, name) and self.schedule != schedule:
        raise ValueError(f'{name} applies to the {schedule!r} schedule only; '
                         f'got schedule {self.schedule!r} with {name}='
                         f'{getattr(self, name)}.')
    if not 0. <= self.label_smoothing < 1.:
      raise ValueError('label_smoothing must be in [0, 1); got '
                       f'{self.label_smoothing}.')


_CROP_FLIP = augment.ViewConfig(crop_scale=(0.08, 1.), flip_p=0.5)
# TCL's training transform (train.py --augment autoaug), the same in
# pretraining and in the linear stage: RandomCrop(padding=4), flip, then
# AutoAugment's CIFAR-10 policy in the pytorch-auto-augment port's
# conventions.
_TCL_VIEW = augment.PRESETS['tcl'][0]

# Each preset's source is in its comment: the paper's appendix or its
# released evaluation script.
PRESETS: dict[str, LinearEvalConfig] = {
    # MoCo v1/v2 ImageNet linear classification, facebookresearch/moco
    # main_lincls.py (copied unchanged in CACR's large_scale_shift_experiments
    # and JCL's code): SGD lr 30, batch 256, 100 epochs, x0.1 at 60 and 80,
    # no weight decay; RandomResizedCrop(224) + flip; the fc kernel drawn
    # from N(0, 0.01^2), its bias zero ('normal_0.01'); `model.eval()` in
    # train() (BatchNorm on its running averages); `adjust_learning_rate(
    # optimizer, epoch)` before each epoch ('epoch_start': with the
    # milestones whole epochs, the per-step schedule's values).
    'moco': LinearEvalConfig(optimizer='sgd', lr=30.0, epochs=100, batch_size=256,
                        momentum=0.9, schedule='step', milestones=(60, 80),
                        lr_decay=0.1, classifier_init='normal_0.01',
                        lr_update='epoch_start', view=_CROP_FLIP),
    # SimCLR (App. B.5; README linear evaluation command): SGD with Nesterov
    # momentum, lr 0.1 x B / 256 at batch 4096, cosine, 90 epochs, weight
    # decay 1e-6, crop + flip. The v1 code (model.py): the head zeroed
    # (--zero_init_logits_layer=True), the encoder run with
    # is_training=False under --fine_tune_after_block=4 (BatchNorm on its
    # moving averages, none updated), the cosine of the global step
    # (model_util.py learning_rate_schedule): the defaults.
    'simclr': LinearEvalConfig(optimizer='sgd', lr=1.6, epochs=90, batch_size=4096,
                          momentum=0.9, nesterov=True, weight_decay=1e-6,
                          schedule='cosine', view=_CROP_FLIP),
    # MoCo v3's main_lincls.py: SGD (momentum 0.9, no Nesterov), lr 0.1 x B /
    # 256 at batch 1024, cosine to 0, 90 epochs, no weight decay, crop + flip;
    # the fc kernel N(0, 0.01^2), bias zero; `model.eval()` in train(); the
    # cosine set before each epoch at 0.5 (1 + cos(pi epoch / 90)) x lr
    # (`adjust_learning_rate(optimizer, init_lr, epoch, args)`).
    'moco_v3': LinearEvalConfig(optimizer='sgd', lr=0.4, epochs=90,
                                batch_size=1024, momentum=0.9,
                                schedule='cosine', lr_update='epoch_start',
                                classifier_init='normal_0.01',
                                view=_CROP_FLIP),
    # SupContrast's main_linear.py with its README command (--batch_size 512
    # --learning_rate 5): SGD momentum 0.9, no weight decay, 100 epochs, lr x
    # 0.2 after epochs 60, 75 and 90; RandomResizedCrop(32, scale 0.2-1) +
    # flip; the classifier networks/resnet_big.py LinearClassifier's
    # nn.Linear at PyTorch's init ('torch_default'); `model.eval()` in
    # train(); util.py `adjust_learning_rate` before each epoch, no warmup
    # (--warm unset) ('epoch_start', the per-step values here).
    'supcon': LinearEvalConfig(optimizer='sgd', lr=5.0, epochs=100,
                               batch_size=512, momentum=0.9, schedule='step',
                               milestones=(60, 75, 90), lr_decay=0.2,
                               classifier_init='torch_default',
                               lr_update='epoch_start',
                               view=augment.ViewConfig(crop_scale=(0.2, 1.),
                                                       flip_p=0.5)),
    # The CIFAR configs (configs/papers) whose references report no linear
    # evaluation (lightly's kNN benchmark, lemniscate's kNN, solo-learn's
    # online classifier): this project's probe, SGD lr 0.1, batch 256, 100
    # epochs, cosine per step, no weight decay, RandomResizedCrop(32,
    # 0.08-1) + flip, a zero classifier, BatchNorm on running averages.
    # (solo-learn has no CIFAR linear script; its offline LinearModel,
    # solo/methods/linear.py, starts its nn.Linear at PyTorch's init and
    # runs `backbone.eval()` in each training step.)
    'cifar': LinearEvalConfig(optimizer='sgd', lr=0.1, epochs=100, batch_size=256,
                         momentum=0.9, schedule='cosine', view=_CROP_FLIP),
    # CACR's small-scale code (JegZheng/CACR-SSL small_scale_experiments/
    # cifar10/linear_eval.py, cifar100's the same): Adam(0.5, 0.999), lr
    # 1e-3, batch 128, 100 epochs, x0.2 at 60 and 80; RandomResizedCrop(
    # scale 0.2-1) + flip; `classifier = nn.Linear(...)` at PyTorch's init
    # ('torch_default'); `encoder.eval()` once, never back to train mode;
    # MultiStepLR stepped after each epoch ('epoch_start', the per-step
    # values here).
    'cacr_small': LinearEvalConfig(
        optimizer='adam', lr=1e-3, epochs=100, batch_size=128, adam_b1=0.5,
        adam_b2=0.999, schedule='step', milestones=(60, 80), lr_decay=0.2,
        classifier_init='torch_default', lr_update='epoch_start',
        view=augment.ViewConfig(crop_scale=(0.2, 1.), flip_p=0.5)),
    # TCL's linear stage, the authors' train.py (chaitanyaanimesh/
    # Tuned-Contrastive-Learning; `train_cross_entropy` after
    # `model1.freeze_projection()`): SGD(momentum 0.9, weight_decay 1e-4)
    # at lr 0.5 (--lr_cross_entropy), 50 epochs, 64 images per step (the
    # loader's batch, cifar10), cosine to lr x 0.1^3 set after each epoch
    # with that epoch's index (`adjust_learning_rate`: lr_update
    # 'after_epoch'); the training transform of pretraining (train_loader's
    # transform_train, --augment autoaug): RandomCrop(padding=4) + flip +
    # AutoAugment() (the pytorch-auto-augment port's CIFAR-10 policy, on
    # ImageNet-100 too); `model.train()` with the encoder frozen by
    # requires_grad_(False): BatchNorm on batch statistics, its running
    # averages updated (PyTorch momentum 0.1) and read by `validation`'s
    # `model.eval()` ('batch_update'); the classifier the model's
    # `self.linear = nn.Linear(dim_in, num_classes)`, unused in
    # pretraining, so PyTorch's default init ('torch_default'). The weight
    # decay reaches only that classifier (the frozen parameters and the
    # unused head have no gradient, which PyTorch's SGD skips).
    'tcl': LinearEvalConfig(optimizer='sgd', lr=0.5, epochs=50, batch_size=64,
                       momentum=0.9, weight_decay=1e-4, schedule='cosine',
                       cosine_final=1e-3, lr_update='after_epoch',
                       classifier_init='torch_default',
                       encoder_bn='batch_update', view=_TCL_VIEW),
    # TCL's linear stage at 128 images per step (train.py's linear loader
    # takes the pretraining's batch: CIFAR-100's and ImageNet-100's), with
    # the same lr 0.5 (the code's lr is fixed, not rescaled).
    'tcl_batch128': LinearEvalConfig(
        optimizer='sgd', lr=0.5, epochs=50, batch_size=128, momentum=0.9,
        weight_decay=1e-4, schedule='cosine', cosine_final=1e-3,
        lr_update='after_epoch', classifier_init='torch_default',
        encoder_bn='batch_update', view=_TCL_VIEW),
    # MACL: SGD lr 0.02, momentum 0.9, wd 0, 100 epochs; batch, schedule and
    # augmentation unstated (notes: 256, constant; CACR's crop 0.2-1 + flip);
    # no code released, so the classifier's init, the encoder's BatchNorm
    # mode and the lr's timing are unknown: the defaults.
    'macl': LinearEvalConfig(optimizer='sgd', lr=0.02, epochs=100, batch_size=256,
                        momentum=0.9, schedule='constant',
                        view=augment.ViewConfig(crop_scale=(0.2, 1.),
                                                flip_p=0.5)),
    # SupCon's ImageNet linear stage, the authors' TF code (google-research
    # supcon/scripts/supcon_imagenet_resnet50.sh with configs.sh; stage 2 of
    # launcher.py): RMSProp (utils.py build_optimizer: decay 0.9, momentum
    # 0.9, --stage_2_rmsprop_epsilon 1e-3) at lr 0.05 x 6144 / 256, 90
    # epochs, 12 warmup epochs from 0 (--stage_2_warmup_epochs default),
    # then x0.97 every 0.5 epoch (EXPONENTIAL, staircase), L2 1e-6 on the
    # classifier's kernel and bias (coeff x tf.nn.l2_loss: gradient coeff x
    # w), label smoothing 0.05 (IMAGENET_FLAGS), the L2-normalised encoder
    # output (--normalize_embedding=True: models.py classification input),
    # a Glorot-uniform kernel (--zero_initialize_classifier=False), the
    # pretraining's training images: distorted crop 0.08-1, flip,
    # AutoAugment (TF Model Garden's 'v0' in its conventions, as in
    # configs/papers/supcon.py), and the frozen encoder's
    # BatchNorm on batch statistics (launcher.py calls the model with
    # training=True in every training step, and
    # --stage_2_update_encoder_batch_norm=False leaves the moving averages;
    # --use_global_batch_norm, default True: blocks.py BatchNormalization's
    # cross-replica statistics of the global batch, as jit's here;
    # evaluation, training=False, reads the moving averages). Not
    # expressed: TF's stage-2 batch holds both augmented views of each
    # image (the BN statistics over 2 x 6144 images, the classifier trained
    # on the first view's logits; here one view of 6144), and its epochs
    # are fractional (1281167 / 6144 steps, here whole steps).
    'supcon_tf': LinearEvalConfig(
        optimizer='rmsprop', lr=1.2, epochs=90, batch_size=6144, momentum=0.9,
        rmsprop_decay=0.9, rmsprop_eps=1e-3, weight_decay=1e-6,
        schedule='exponential', warmup_epochs=12., lr_decay=0.97,
        epochs_per_decay=0.5, label_smoothing=0.05, normalize_features=True,
        classifier_init='glorot_uniform', encoder_bn='batch',
        view=augment.ViewConfig(crop_scale=(0.08, 1.), flip_p=0.5,
                                autoaugment='v0',
                                autoaugment_impl='tf_model_garden')),
}


def get_config(preset: str, *, epochs: int = 0,
               batch_size: int = 0) -> LinearEvalConfig:
  """PRESETS[preset], with `epochs` / `batch_size` overridden when > 0.

  A new batch size rescales the learning rate linearly.
  """
  if preset not in PRESETS:
    raise ValueError(f'unknown linear-evaluation preset {preset!r}; known: '
                     f'{", ".join(sorted(PRESETS))}.')
  cfg = PRESETS[preset]
  if epochs:
    cfg = dataclasses.replace(cfg, epochs=int(epochs))
  if batch_size:
    cfg = dataclasses.replace(cfg, batch_size=int(batch_size),
                              lr=cfg.lr * batch_size / cfg.batch_size)
  return cfg


def _exponential(cfg: LinearEvalConfig,
                 steps_per_epoch: int) -> optax.Schedule:
  """The SupCon TF code's warmup then staircase exponential decay (see
  LinearEvalConfig): utils.py `maybe_add_warmup_to_lr` over
  `exponential_decay`, the decay's step counted from the warmup's end."""
  warmup = int(cfg.warmup_epochs * steps_per_epoch)
  decay_steps = cfg.epochs_per_decay * steps_per_epoch

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    decayed = cfg.lr * jnp.power(cfg.lr_decay,
                                 jnp.floor((step - warmup) / decay_steps))
    if not warmup:
      return decayed
    return jnp.where(step < warmup, cfg.lr * step / warmup, decayed)

  return schedule


def learning_rate(cfg: LinearEvalConfig, steps_per_epoch: int) -> optax.Schedule:
  """Step -> learning rate of `cfg` ('step' milestones are in epochs), moved
  every step or held for each epoch: with lr_update='epoch_start' at the
  per-step schedule's value at the epoch's first step, with 'after_epoch'
  at its value at the previous epoch's first step (epoch 0 at step 0's)."""
  schedule = _per_step_schedule(cfg, steps_per_epoch)
  if cfg.lr_update == 'every_step':
    return schedule
  if cfg.lr_update == 'epoch_start':
    def epoch_start(step):
      epoch = jnp.asarray(step) // steps_per_epoch
      return schedule(epoch * steps_per_epoch)
    return epoch_start
  if cfg.lr_update == 'after_epoch':
    def after_epoch(step):
      epoch = jnp.asarray(step) // steps_per_epoch
      return schedule(jnp.maximum(epoch - 1, 0) * steps_per_epoch)
    return after_epoch
  raise ValueError(f'lr_update must be one of {LR_UPDATES}; got '
                   f'{cfg.lr_update!r}.')


def _per_step_schedule(cfg: LinearEvalConfig,
                       steps_per_epoch: int) -> optax.Schedule:
  total = cfg.epochs * steps_per_epoch
  if cfg.schedule == 'constant':
    return optax.constant_schedule(cfg.lr)
  if cfg.schedule == 'cosine':
    return optax.cosine_decay_schedule(cfg.lr, max(total, 1),
                                       alpha=cfg.cosine_final)
  if cfg.schedule == 'step':
    return optax.piecewise_constant_schedule(
        cfg.lr, {m * steps_per_epoch: cfg.lr_decay for m in cfg.milestones})
  if cfg.schedule == 'exponential':
    return _exponential(cfg, steps_per_epoch)
  raise ValueError(f'schedule must be one of {SCHEDULES}; got '
                   f'{cfg.schedule!r}.')


def optimizer(cfg: LinearEvalConfig,
              steps_per_epoch: int) -> optax.GradientTransformation:
  """The preset's optimizer, with PyTorch's coupled L2 `weight_decay` (the
  papers' code) added to the gradient first: the gradient of weight_decay x
  sum(w^2) / 2 over the kernel and the bias, which is also what the SupCon
  TF code's loss term weight_decay x tf.nn.l2_loss adds."""
  lr = learning_rate(cfg, steps_per_epoch)
  decay = optax.add_decayed_weights(cfg.weight_decay)
  if cfg.optimizer == 'sgd':
    opt = optax.sgd(lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
  elif cfg.optimizer == 'adam':
    opt = optax.adam(lr, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=1e-8)
  elif cfg.optimizer == 'rmsprop':
    # TF 1's RMSPropOptimizer: mean square initialised to ones, eps inside
    # the square root, the (scheduled) lr applied before the momentum.
    opt = optax.rmsprop(lr, decay=cfg.rmsprop_decay, eps=cfg.rmsprop_eps,
                        initial_scale=1.0, eps_in_sqrt=True,
                        momentum=cfg.momentum or None)
  else:
    raise ValueError(f'optimizer must be one of {OPTIMIZERS}; got '
                     f'{cfg.optimizer!r}.')
  return optax.chain(decay, opt)


def _frozen_features(model, variables, images, normalize: bool = False,
                     encoder_bn: str = 'running'):
  """(features [B, F] float32 of images [B, H, W, C], updates): the encoder
  frozen, no gradient to it.

  `encoder_bn` 'running': eval mode, BatchNorm on its running statistics.
  'batch': train mode, BatchNorm on the mean and biased variance of this
  batch (under jit, of the global batch however it is sharded; groups of
  it where config.model.bn_splits > 0); the updated statistics it
  returns are discarded. 'batch_update': the same, the updated statistics
  kept. `updates` is the collections to replace in `variables` for the
  next step: {'batch_stats': ...} (the running averages moved by this
  batch, the model's momentum) for 'batch_update', {} otherwise;
  `variables` itself is never changed. With `normalize`, each row divided
  by its L2 norm (floored at 1e-6, i.e. tf.nn.l2_normalize's epsilon 1e-12
  on the squared norm).
  """
  if encoder_bn in ('batch', 'batch_update'):
    out, updated = model.apply(variables, images, train=True,
                               mutable=['batch_stats'])
    updates = updated if encoder_bn == 'batch_update' else {}
  elif encoder_bn == 'running':
    out, updates = model.apply(variables, images, train=False), {}
  else:
    raise ValueError(f'encoder_bn must be one of {ENCODER_BN}; got '
                     f'{encoder_bn!r}.')
  # The encoder is frozen: the classifier's loss must not train it.
  features = jax.lax.stop_gradient(out['features'].astype(jnp.float32))
  if normalize:
    features = l2_normalize(features)
  return features, updates


def _logits(params, features):
  return features @ params['w'] + params['b']


def cross_entropy(logits, labels, label_smoothing: float = 0.0):
  """Per-example softmax cross-entropy [B] against integer labels, the
  targets smoothed to (1 - a) one_hot + a / C when a = label_smoothing > 0
  (tf.losses.softmax_cross_entropy's `label_smoothing`)."""
  if not label_smoothing:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(
      jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype),
      label_smoothing)
  return optax.softmax_cross_entropy(logits, targets)


# The classifier's initialisation reads its own stream of the seed's key
# (the augmentation of step s reads fold_in(key, s), s below this).
_INIT_STREAM = 2**31 - 1


def init_classifier(cfg: LinearEvalConfig, seed: int, feature_dim: int,
                    num_classes: int) -> dict[str, jax.Array]:
  """{'w': [F, C], 'b': [C]}, what `linear_evaluation(seed=seed)` starts
  from: the bias zero, the kernel zero (SimCLR's --zero_init_logits_layer),
  N(0, 0.01^2) ('normal_0.01', MoCo's main_lincls.py `normal_(mean=0.0,
  std=0.01)`) or Glorot-uniform, U(-l, l) with l = sqrt(6 / (F + C)) (TF's
  and Keras' glorot_uniform, the SupCon TF code's Dense); or
  'torch_default', PyTorch's nn.Linear(F, C): kernel (kaiming_uniform with
  a = sqrt(5)) and bias both U(-1 / sqrt(F), 1 / sqrt(F))."""
  key = jax.random.fold_in(jax.random.key(seed), _INIT_STREAM)
  b = jnp.zeros((num_classes,), jnp.float32)
  if cfg.classifier_init == 'zeros':
    w = jnp.zeros((feature_dim, num_classes), jnp.float32)
  elif cfg.classifier_init == 'normal_0.01':
    w = 0.01 * jax.random.normal(key, (feature_dim, num_classes), jnp.float32)
  elif cfg.classifier_init == 'glorot_uniform':
    w = jax.nn.initializers.glorot_uniform()(
        key, (feature_dim, num_classes), jnp.float32)
  elif cfg.classifier_init == 'torch_default':
    bound = 1. / np.sqrt(feature_dim)
    kw, kb = jax.random.split(key)
    w = jax.random.uniform(kw, (feature_dim, num_classes), jnp.float32,
                           -bound, bound)
    b = jax.random.uniform(kb, (num_classes,), jnp.float32, -bound, bound)
  else:
    raise ValueError(f'classifier_init must be one of {CLASSIFIER_INITS}; '
                     f'got {cfg.classifier_init!r}.')
  return {'w': w, 'b': b}


def make_step_fns(model, tx, cfg: LinearEvalConfig, mesh, *,
                  host_cropped: bool = False):
  """(train_step, eval_counts), jitted with explicit shardings.

  train_step(params, opt_state, variables, images uint8 [B,H,W,C] ([B,1,H,W,C]
  with `host_cropped`: the view's random resized crop cut by the host,
  `sources.RandomCrops`), labels [B], rng) -> (params, opt_state,
  encoder_updates, loss): one optimizer step on the batch augmented with
  `cfg.view`, the loss the (label-smoothed) cross-entropy;
  `encoder_updates` the encoder's collections to replace in `variables`
  ({'batch_stats': ...} with `cfg.encoder_bn='batch_update'`, else {}:
  `_frozen_features`).
  eval_counts(params, variables, images, labels, mask) -> (top-1 correct,
  top-5 correct, count), int32 scalars over the global batch. Both read the
  features L2-normalised when `cfg.normalize_features`; train_step's
  encoder BatchNorm uses `cfg.encoder_bn`'s statistics, eval_counts' the
  running ones of the `variables` it is given.
  """
  replicated = NamedSharding(mesh, P())
  rows = NamedSharding(mesh, P('data'))
  view, normalize = cfg.view, cfg.normalize_features

  @functools.partial(
      jax.jit, in_shardings=(replicated, replicated, replicated, rows, rows,
                             replicated),
      out_shardings=(replicated, replicated, replicated, replicated),
      donate_argnums=(0, 1))
  def train_step(params, opt_state, variables, images, labels, rng):
    x = augment.augment_groups(rng, images, (view,),
                               host_cropped=host_cropped)[0][:, 0]
    features, encoder_updates = _frozen_features(
        model, variables, x, normalize, cfg.encoder_bn)

    def loss_fn(p):
      return jnp.mean(cross_entropy(_logits(p, features), labels,
                                    cfg.label_smoothing))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state,
            encoder_updates, loss)

  @functools.partial(
      jax.jit, in_shardings=(replicated, replicated, rows, rows, rows),
      out_shardings=replicated)
  def eval_counts(params, variables, images, labels, mask):
    features, _ = _frozen_features(
        model, variables, images.astype(jnp.float32) / 255., normalize)
    logits = _logits(params, features)
    top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
    hit1 = top5[:, 0] == labels
    hit5 = jnp.any(top5 == labels[:, None], axis=-1)
    return (jnp.sum(hit1 & mask), jnp.sum(hit5 & mask), jnp.sum(mask))

  return train_step, eval_counts


def linear_evaluation(model, variables, train_source, eval_source, mesh, *,
                      cfg: LinearEvalConfig, num_classes: int, seed: int = 0,
                      eval_batch_size: int = 256, num_workers: int = 0,
                      fit=None, bar_desc: str = 'linear evaluation'
                      ) -> dict[str, Any]:
  """Trains and scores a linear classifier on the frozen encoder.

  Args:
    model: the ContrastiveModel (or a method's wrapper of it).
    variables: {'params', 'batch_stats'} of the frozen encoder.
    train_source, eval_source: sources (input_pipeline/sources.py).
    mesh: the device mesh with a 'data' axis; batches are sharded over it.
    cfg: the recipe (`get_config`).
    num_classes: C.
    seed: the order of training examples and the augmentation draws.
    eval_batch_size: global batch of the evaluation passes.
    num_workers: decoding processes of the streamed training images
      (`pipeline.TrainBatches`).
    fit: how the training images are read (`sources.training_fit` of
      `cfg.view`: its random resized crop cut from the full image with
      `train_crop_source='full_image'`, else the whole square whatever the
      sources' evaluation fit); None: the source's plain read.
    bar_desc: the progress bar's label (progress.py decides if it shows).

  Returns:
    {'top1_last', 'top5_last', 'top1_best', 'best_epoch' (1-based),
    'train_loss_last' (mean over the last epoch's steps), 'top1_per_epoch',
    'seconds', 'classifier' ({'w': [F, C], 'b': [C]}, replicated; it reads
    the L2-normalised features when `cfg.normalize_features`), 'variables'
    (the encoder's variables the evaluations read: `variables` itself, but
    with `cfg.encoder_bn='batch_update'` its 'batch_stats' those the
    training steps left)}. `top1_best`
    selects on the evaluation split, as some papers' code does (CACR prints
    it); `top1_last` is the honest number. 'train_loss_last' is the
    label-smoothed cross-entropy when `cfg.label_smoothing` > 0.
  """
  t0 = time.time()
  if cfg.epochs < 1:
    raise ValueError(f'linear evaluation needs epochs >= 1; got {cfg.epochs}.')
  rows = NamedSharding(mesh, P('data'))
  batches = pipeline.TrainBatches(train_source, global_batch_size=min(
      cfg.batch_size, len(train_source)), seed=seed, sharding=rows,
      num_workers=num_workers, fit=fit)
  if batches.global_batch_size % mesh.size:
    raise ValueError(f'the linear evaluation batch {batches.global_batch_size}'
                     f' is not divisible by the {mesh.size} devices; set '
                     'config.evals.<name>.batch_size to a multiple.')
  steps_per_epoch = batches.steps_per_epoch
  tx = optimizer(cfg, steps_per_epoch)
  feature_dim = jax.eval_shape(
      lambda x: model.apply(variables, x, train=False)['features'],
      jax.ShapeDtypeStruct((1,) + tuple(train_source.image_shape),
                           jnp.float32)).shape[-1]
  # `cfg.classifier_init`; replicated on the mesh.
  replicated = NamedSharding(mesh, P())
  params = jax.device_put(
      init_classifier(cfg, seed, feature_dim, num_classes), replicated)
  opt_state = jax.jit(tx.init, out_shardings=replicated)(params)
  train_step, eval_counts = make_step_fns(
      model, tx, cfg, mesh, host_cropped=isinstance(fit, sources.RandomCrops))
  key = jax.random.key(seed)
  top1, top5, losses = [], [], []
  total = cfg.epochs * steps_per_epoch
  with progress.bar(total, bar_desc, unit='step') as bar:
    for epoch in range(cfg.epochs):
      epoch_losses = []
      first = epoch * steps_per_epoch
      for step, batch in enumerate(
          batches.iterate(first, first + steps_per_epoch), start=first):
        params, opt_state, encoder_updates, loss = train_step(
            params, opt_state, variables, batch['image'], batch['label'],
            jax.random.fold_in(key, step))
        if encoder_updates:     # 'batch_update': the moved averages.
          variables = {**variables, **encoder_updates}
        epoch_losses.append(loss)
        bar.update(1)
      hits1 = hits5 = count = 0
      for batch in pipeline.eval_batches(eval_source,
                                         batch_size=eval_batch_size,
                                         sharding=rows):
        c1, c5, n = eval_counts(params, variables, batch['image'],
                                batch['label'], batch['mask'])
        hits1, hits5, count = hits1 + c1, hits5 + c5, count + n
      top1.append(float(hits1 / count))
      top5.append(float(hits5 / count))
      losses.append(float(np.mean(jax.device_get(epoch_losses))))
      bar.set_postfix_str(f'epoch {epoch + 1}/{cfg.epochs} top-1 '
                          f'{100 * top1[-1]:.2f}%')
  best = int(np.argmax(top1))
  out = {'top1_last': top1[-1], 'top5_last': top5[-1], 'top1_best': top1[best],
         'best_epoch': best + 1, 'train_loss_last': losses[-1],
         'top1_per_epoch': top1, 'seconds': round(time.time() - t0, 1),
         'classifier': params, 'variables': variables}
  logging.info('linear evaluation (%s, %d epochs of %d steps): top-1 %.2f%% '
               '(best %.2f%% at epoch %d) (%.1f s)', cfg.optimizer,
               cfg.epochs, steps_per_epoch, 100 * out['top1_last'],
               100 * out['top1_best'], out['best_epoch'], out['seconds'])
  return out


# Tells the probe's seed from the run's other uses of config.seed.
_PROBE_STREAM = 0x70726f6265


def probe_seed(seed: int) -> int:
  """The probe's own seed, derived from the run's `config.seed`: its
  example order, host crops, augmentation and classifier init must not
  repeat pretraining's draws (at an equal batch, the same seed would give
  the probe exactly pretraining's view-0 crops at every step), as the
  reference probes draw afresh."""
  return int(np.random.SeedSequence([int(seed), _PROBE_STREAM])
             .generate_state(1)[0] >> 1)



class LinearEval(base.Evaluator):
  """The papers' linear evaluation of the trained encoder (`linear_evaluation`).

  Config fields: `preset` (a name in PRESETS), `epochs` and `batch_size`
  (overrides of the preset's when > 0). Trained encoder only: it runs epochs
  of encoder forwards. Metrics: 'linear_eval_top1' (last epoch),
  'linear_eval_top5', 'linear_eval_top1_best', ...
  """
  type = 'linear_eval'
  DEFAULTS = {'preset': '', 'epochs': 0, 'batch_size': 0}
  baselines = False

  @property
  def recipe(self) -> LinearEvalConfig:
    return get_config(self.cfg.preset, epochs=self.cfg.epochs,
                      batch_size=self.cfg.batch_size)

  def validate(self, config, *, num_devices: int,
               num_train: int | None = None) -> None:
    batch = self.recipe.batch_size
    if num_train is not None:
      batch = min(batch, num_train)
    if batch % num_devices:
      raise ValueError(
          f'the {self.cfg.preset!r} linear evaluation batch would be {batch}, '
          f'not divisible by the {num_devices} devices; set '
          f'config.evals.{self.name}.batch_size to a multiple of them'
          + (f' below {num_train}.' if num_train is not None else '.'))
    splits = config.model.bn_splits
    if (self.recipe.encoder_bn in ('batch', 'batch_update') and splits
        and batch % splits):
      raise ValueError(
          f'the {self.cfg.preset!r} linear evaluation runs the encoder\'s '
          f'BatchNorm on batch statistics in {splits} groups '
          f'(config.model.bn_splits), but its batch would be {batch}; set '
          f'config.evals.{self.name}.batch_size to a multiple of {splits}.')

  def units(self, env) -> int:
    return 0      # Its own progress bar: epochs of training.

  def __call__(self, rep: base.Representation, *, bar=progress.NO_BAR
               ) -> dict[str, float]:
    env = rep.env
    seed = probe_seed(env.config.seed)
    out = linear_evaluation(
        env.model, rep.variables, env.train, env.test, env.mesh,
        cfg=self.recipe, num_classes=env.num_classes, seed=seed,
        eval_batch_size=env.config.eval.batch_size,
        num_workers=env.config.dataset.num_workers,
        # The probe's crops come from the full image where pretraining's
        # do (MoCo's main_lincls: RandomResizedCrop of the decoded image).
        fit=sources.training_fit(env.config.dataset, (self.recipe.view,),
                                 seed),
        bar_desc=f'linear evaluation ({self.cfg.preset})')
    names = {'top1_last': 'top1', 'top5_last': 'top5'}
    return {f'linear_eval_{names.get(k, k)}': v for k, v in out.items()
            if isinstance(v, (int, float))}
