"""The papers' linear evaluation: a linear classifier [F, C] trained on the
frozen encoder's features of augmented images, scored after every epoch,
data-parallel over all devices; docs/evaluation.md describes the presets."""

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

_CROP_FLIP = augment.ViewConfig(crop_scale=(0.08, 1.), flip_p=0.5)
_CROP_02_FLIP = augment.ViewConfig(crop_scale=(0.2, 1.), flip_p=0.5)


@dataclasses.dataclass(frozen=True)
class LinearEvalConfig:
  """One linear-evaluation recipe (docs/evaluation.md): `lr` is the rate at
  `batch_size`; `encoder_bn` is the frozen encoder's BatchNorm in training
  steps. Another optimizer or schedule subclasses it (`SupConTFConfig`)."""
  optimizer: str = 'sgd'            # 'sgd' or 'adam'
  lr: float = 0.1
  epochs: int = 100
  batch_size: int = 256
  momentum: float = 0.9             # SGD's (PyTorch's heavy ball)
  nesterov: bool = False
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  weight_decay: float = 0.0         # coupled L2 (PyTorch's weight_decay)
  schedule: str = 'constant'        # 'constant', 'cosine' or 'step'
  milestones: tuple[int, ...] = ()  # 'step': epochs at which lr x= lr_decay
  lr_decay: float = 0.1
  cosine_final: float = 0.0         # 'cosine': the final lr / lr
  lr_update: str = 'every_step'     # or 'epoch_start', 'after_epoch'
  classifier_init: str = 'zeros'    # `init_classifier`
  encoder_bn: str = 'running'       # or 'batch', 'batch_update'
  view: augment.ViewConfig = _CROP_FLIP
  # Not fields here (SupConTFConfig's are).
  label_smoothing = 0.0
  normalize_features = False
  _CHOICES = {'optimizer': ('sgd', 'adam'),
              'schedule': ('constant', 'cosine', 'step'),
              'lr_update': ('every_step', 'epoch_start', 'after_epoch'),
              'classifier_init': ('zeros', 'normal_0.01', 'glorot_uniform',
                                  'torch_default'),
              'encoder_bn': ('running', 'batch', 'batch_update')}

  def __post_init__(self):
    for name, choices in self._CHOICES.items():
      if getattr(self, name) not in choices:
        raise ValueError(f'linear evaluation {name} must be one of '
                         f'{choices}; got {getattr(self, name)!r}.')

  def per_step_lr(self, steps_per_epoch: int) -> optax.Schedule:
    """Step -> lr, moved every step."""
    if self.schedule == 'cosine':
      return optax.cosine_decay_schedule(
          self.lr, max(self.epochs * steps_per_epoch, 1),
          alpha=self.cosine_final)
    if self.schedule == 'step':
      return optax.piecewise_constant_schedule(
          self.lr, {m * steps_per_epoch: self.lr_decay
                    for m in self.milestones})
    return optax.constant_schedule(self.lr)

  def base_optimizer(self, lr: optax.Schedule) -> optax.GradientTransformation:
    if self.optimizer == 'adam':
      return optax.adam(lr, b1=self.adam_b1, b2=self.adam_b2, eps=1e-8)
    return optax.sgd(lr, momentum=self.momentum or None,
                     nesterov=self.nesterov)


@dataclasses.dataclass(frozen=True)
class SupConTFConfig(LinearEvalConfig):
  """The SupCon TF code's stage 2: TF 1's RMSProp, linear warmup then a
  staircase exponential decay, label smoothing, L2-normalised features
  (docs/evaluation.md gives the update and the schedule)."""
  optimizer: str = 'rmsprop'
  schedule: str = 'exponential'
  rmsprop_decay: float = 0.9
  rmsprop_eps: float = 1e-10        # TF 1's default; inside the root
  warmup_epochs: float = 0.0
  epochs_per_decay: float = 1.0
  label_smoothing: float = 0.0
  normalize_features: bool = False  # L2-normalise the features first
  _CHOICES = {**LinearEvalConfig._CHOICES, 'optimizer': ('rmsprop',),
              'schedule': ('exponential',)}

  def __post_init__(self):
    super().__post_init__()
    if not self.epochs_per_decay > 0.:
      raise ValueError("the 'exponential' schedule needs epochs_per_decay "
                       f'> 0; got {self.epochs_per_decay}.')

  def per_step_lr(self, steps_per_epoch: int) -> optax.Schedule:
    warmup = int(self.warmup_epochs * steps_per_epoch)
    decay_steps = self.epochs_per_decay * steps_per_epoch

    def schedule(step):
      step = jnp.asarray(step, jnp.float32)
      decayed = self.lr * jnp.power(self.lr_decay,
                                    jnp.floor((step - warmup) / decay_steps))
      if not warmup:
        return decayed
      return jnp.where(step < warmup, self.lr * step / warmup, decayed)

    return schedule

  def base_optimizer(self, lr: optax.Schedule) -> optax.GradientTransformation:
    return optax.rmsprop(lr, decay=self.rmsprop_decay, eps=self.rmsprop_eps,
                         initial_scale=1.0, eps_in_sqrt=True,
                         momentum=self.momentum or None)


# Each preset's source: its paper's appendix or released evaluation script
# (configs/papers/recipes.yaml cites them row by row).
PRESETS: dict[str, LinearEvalConfig] = {
    # MoCo v1/v2's main_lincls.py (also CACR's and JCL's ImageNet probe).
    'moco': LinearEvalConfig(lr=30.0, epochs=100, batch_size=256,
                             schedule='step', milestones=(60, 80),
                             classifier_init='normal_0.01',
                             lr_update='epoch_start'),
    # SimCLR App. B.5 and its v1 code's README linear command.
    'simclr': LinearEvalConfig(lr=1.6, epochs=90, batch_size=4096,
                               nesterov=True, weight_decay=1e-6,
                               schedule='cosine'),
    # MoCo v3's main_lincls.py.
    'moco_v3': LinearEvalConfig(lr=0.4, epochs=90, batch_size=1024,
                                schedule='cosine', lr_update='epoch_start',
                                classifier_init='normal_0.01'),
    # SupContrast's main_linear.py with its README command.
    'supcon': LinearEvalConfig(lr=5.0, epochs=100, batch_size=512,
                               schedule='step', milestones=(60, 75, 90),
                               lr_decay=0.2, classifier_init='torch_default',
                               lr_update='epoch_start', view=_CROP_02_FLIP),
    # This project's CIFAR probe (no CIFAR reference gives one).
    'cifar': LinearEvalConfig(lr=0.1, epochs=100, batch_size=256,
                              schedule='cosine'),
    # CACR's small_scale_experiments/cifar10/linear_eval.py.
    'cacr_small': LinearEvalConfig(
        optimizer='adam', lr=1e-3, epochs=100, batch_size=128, adam_b1=0.5,
        adam_b2=0.999, schedule='step', milestones=(60, 80), lr_decay=0.2,
        classifier_init='torch_default', lr_update='epoch_start',
        view=_CROP_02_FLIP),
    # TCL's train.py `train_cross_entropy` (CIFAR-10), pretraining's views.
    'tcl': LinearEvalConfig(lr=0.5, epochs=50, batch_size=64,
                            weight_decay=1e-4, schedule='cosine',
                            cosine_final=1e-3, lr_update='after_epoch',
                            classifier_init='torch_default',
                            encoder_bn='batch_update',
                            view=augment.PRESETS['tcl'][0]),
    # MACL Sec. 5 (SGD 0.02, 100 epochs); CACR's crop.
    'macl': LinearEvalConfig(lr=0.02, epochs=100, batch_size=256,
                             schedule='constant', view=_CROP_02_FLIP),
    # SupCon's TF supcon_imagenet_resnet50.sh, stage 2: lr 0.05 x 6144 / 256.
    'supcon_tf': SupConTFConfig(
        lr=1.2, epochs=90, batch_size=6144, rmsprop_decay=0.9,
        rmsprop_eps=1e-3, weight_decay=1e-6, warmup_epochs=12., lr_decay=0.97,
        epochs_per_decay=0.5, label_smoothing=0.05, normalize_features=True,
        classifier_init='glorot_uniform', encoder_bn='batch',
        view=augment.ViewConfig(crop_scale=(0.08, 1.), flip_p=0.5,
                                autoaugment='v0',
                                autoaugment_impl='tf_model_garden')),
}
# TCL's stage at batch 128 (CIFAR-100, ImageNet-100), the same lr.
PRESETS['tcl_batch128'] = dataclasses.replace(PRESETS['tcl'], batch_size=128)


def get_config(preset: str, *, epochs: int = 0,
               batch_size: int = 0) -> LinearEvalConfig:
  """PRESETS[preset], `epochs` / `batch_size` overridden when > 0 (a new
  batch size rescales the lr linearly)."""
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


def learning_rate(cfg: LinearEvalConfig,
                  steps_per_epoch: int) -> optax.Schedule:
  """Step -> lr of `cfg`, held per epoch as `cfg.lr_update` says."""
  schedule = cfg.per_step_lr(steps_per_epoch)
  if cfg.lr_update == 'every_step':
    return schedule
  lag = int(cfg.lr_update == 'after_epoch')

  def held(step):
    epoch = jnp.asarray(step) // steps_per_epoch
    return schedule(jnp.maximum(epoch - lag, 0) * steps_per_epoch)

  return held


def optimizer(cfg: LinearEvalConfig,
              steps_per_epoch: int) -> optax.GradientTransformation:
  """The recipe's optimizer on the gradient plus weight_decay x params
  (PyTorch's coupled L2; also TF's weight_decay x tf.nn.l2_loss)."""
  return optax.chain(optax.add_decayed_weights(cfg.weight_decay),
                     cfg.base_optimizer(learning_rate(cfg, steps_per_epoch)))


def _frozen_features(model, variables, images, normalize: bool = False,
                     encoder_bn: str = 'running'):
  """(features [B, F] float32, updates) of images [B, H, W, C], no gradient
  to the encoder; `updates`: the moved {'batch_stats'} for 'batch_update'."""
  if encoder_bn == 'running':
    out, updates = model.apply(variables, images, train=False), {}
  else:
    out, updates = model.apply(variables, images, train=True,
                               mutable=['batch_stats'])
    updates = updates if encoder_bn == 'batch_update' else {}
  features = jax.lax.stop_gradient(out['features'].astype(jnp.float32))
  if normalize:
    features = l2_normalize(features)
  return features, updates


def cross_entropy(logits, labels, label_smoothing: float = 0.0):
  """Per-example softmax cross-entropy [B] against integer labels, the
  targets (1 - a) one_hot + a / C for a = label_smoothing > 0."""
  if not label_smoothing:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(
      jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype),
      label_smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def init_classifier(cfg: LinearEvalConfig, seed: int, feature_dim: int,
                    num_classes: int) -> dict[str, jax.Array]:
  """{'w': [F, C], 'b': [C]}: 'zeros'; 'normal_0.01' (MoCo's fc), w ~ N(0,
  0.01^2); 'glorot_uniform' (TF's Dense); 'torch_default' (nn.Linear), w and
  b ~ U(-1 / sqrt(F), 1 / sqrt(F)). The bias is zero unless said."""
  # Its own stream of the seed's key: step s's augmentation reads
  # fold_in(key, s), s < 2^31 - 1.
  key = jax.random.fold_in(jax.random.key(seed), 2**31 - 1)
  shape = (feature_dim, num_classes)
  w, b = jnp.zeros(shape, jnp.float32), jnp.zeros((num_classes,), jnp.float32)
  if cfg.classifier_init == 'normal_0.01':
    w = 0.01 * jax.random.normal(key, shape, jnp.float32)
  elif cfg.classifier_init == 'glorot_uniform':
    w = jax.nn.initializers.glorot_uniform()(key, shape, jnp.float32)
  elif cfg.classifier_init == 'torch_default':
    bound = 1. / np.sqrt(feature_dim)
    kw, kb = jax.random.split(key)
    w = jax.random.uniform(kw, shape, jnp.float32, -bound, bound)
    b = jax.random.uniform(kb, (num_classes,), jnp.float32, -bound, bound)
  return {'w': w, 'b': b}


def linear_evaluation(model, variables, train_source, eval_source, mesh, *,
                      cfg: LinearEvalConfig, num_classes: int, seed: int = 0,
                      eval_batch_size: int = 256, num_workers: int = 0,
                      fit=None, bar_desc: str = 'linear evaluation'
                      ) -> dict[str, Any]:
  """Trains and scores a linear classifier on the frozen encoder's
  `variables`; `fit`: `sources.training_fit` (None: the plain read). Returns
  {'top1_last', 'top5_last', 'top1_best' (chosen on the test split),
  'best_epoch' (1-based), 'train_loss_last', 'top1_per_epoch', 'seconds',
  'classifier', 'variables' (those the evaluations read)}."""
  t0 = time.time()
  if cfg.epochs < 1:
    raise ValueError(f'linear evaluation needs epochs >= 1; got {cfg.epochs}.')
  rows = NamedSharding(mesh, P('data'))
  replicated = NamedSharding(mesh, P())
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
  params = jax.device_put(
      init_classifier(cfg, seed, feature_dim, num_classes), replicated)
  opt_state = jax.jit(tx.init, out_shardings=replicated)(params)

  @functools.partial(
      jax.jit, in_shardings=(replicated, replicated, replicated, rows, rows,
                             replicated),
      out_shardings=(replicated, replicated, replicated, replicated),
      donate_argnums=(0, 1))
  def train_step(params, opt_state, variables, images, labels, rng):
    x = augment.augment_batch(
        rng, images, (cfg.view,),
        host_cropped=isinstance(fit, sources.RandomCrops))[:, 0]
    features, encoder_updates = _frozen_features(
        model, variables, x, cfg.normalize_features, cfg.encoder_bn)

    def loss_fn(p):
      logits = features @ p['w'] + p['b']
      return jnp.mean(cross_entropy(logits, labels, cfg.label_smoothing))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state,
            encoder_updates, loss)

  @functools.partial(
      jax.jit, in_shardings=(replicated, replicated, rows, rows, rows),
      out_shardings=replicated)
  def eval_counts(params, variables, images, labels, mask):
    x = images.astype(jnp.float32) / 255.
    features, _ = _frozen_features(model, variables, x,
                                   cfg.normalize_features)
    logits = features @ params['w'] + params['b']
    top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
    hit1 = top5[:, 0] == labels
    hit5 = jnp.any(top5 == labels[:, None], axis=-1)
    return (jnp.sum(hit1 & mask), jnp.sum(hit5 & mask), jnp.sum(mask))

  key = jax.random.key(seed)
  top1, top5, losses = [], [], []
  with progress.bar(cfg.epochs * steps_per_epoch, bar_desc,
                    unit='step') as bar:
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
      counts = [eval_counts(params, variables, b['image'], b['label'],
                            b['mask'])
                for b in pipeline.eval_batches(
                    eval_source, batch_size=eval_batch_size, sharding=rows)]
      hits1, hits5, count = (sum(c) for c in zip(*counts))
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


def probe_seed(seed: int) -> int:
  """The probe's seed, apart from pretraining's draws of `config.seed`."""
  return int(np.random.SeedSequence([int(seed), 0x70726f6265])   # 'probe'
             .generate_state(1)[0] >> 1)


class LinearEval(base.Evaluator):
  """The papers' linear evaluation of the trained encoder: `preset` (in
  PRESETS), `epochs` and `batch_size` (overrides when > 0). Metrics:
  'linear_eval_top1' (last epoch), 'linear_eval_top5', ..."""
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
