"""configs/papers/recipes.yaml pins every paper config, value by value.

The YAML table is the one list of the paper configs' training
hyperparameters: for every (method, scale) of configs/papers/ and every
hyperparameter `hyperparameters(config)` reads from the resolved config, it
gives our value, the official value with its source, and a status
('matches', 'differs' with a reason, 'unverified' or 'n/a'). The tests here
build every config and check that

* the table has a row for exactly the hyperparameters the config defines
  (a new loss keyword, MoCo field or LARS constant needs a row);
* every `ours` equals the config's value, so a changed config fails until the
  table (and its source) changes too;
* every 'matches' row has the config's value == official, every 'differs'
  row a reason and the config's value != official, every 'unverified' or 'n/a' row a reason and no official
  value, every row a source.

Values the code cannot yet express are read with `.get(field, default)` under
the field name the feature would take (e.g. `model.bn_splits`), so the
rows stay 'differs' ("needs ...") until the field exists.
"""

import importlib
import math
import os
import pkgutil

import pytest
import yaml

import configs.papers
from configs.papers import common
from contrastive_jax import models
from contrastive_jax.evaluators import linear_eval
from input_pipeline import augment

TABLE = os.path.join(os.path.dirname(configs.papers.__file__), 'recipes.yaml')
METHODS = sorted(m.name for m in pkgutil.iter_modules(configs.papers.__path__)
                 if m.name != 'common')
STATUSES = ('matches', 'differs', 'unverified', 'n/a')
# ViewConfig fields pinned per view (`jitter_strength` is folded into the four
# `jitter` amounts it stands for). OPTIONAL_VIEW_FIELDS get a row only when a
# view sets them away from ViewConfig's default (TCL's pad_crop and
# AutoAugment), so setting one still fails until the table has its row.
VIEW_FIELDS = ('crop_scale', 'flip_p', 'jitter', 'jitter_p', 'grayscale_p',
               'blur_p', 'solarize_p')
OPTIONAL_VIEW_FIELDS = ('crop_ratio', 'pad_crop', 'autoaugment',
                        'autoaugment_impl', 'erase_p')
# LinearEvalConfig fields pinned only when a linear-evaluation preset sets
# them away from their default (SupCon's TF stage 2), as the optional view
# fields: setting one in a preset fails until the table has its row. The
# classifier's init, the encoder's BatchNorm mode and the lr's timing
# (`classifier_init`, `encoder_bn`, `lr_update`) have a row in every config
# with a linear evaluation, each read in the official code.
OPTIONAL_LINEAR_FIELDS = ('label_smoothing', 'normalize_features')
# The order in which augment.augment_image applies the ops.

def _plain(x):
  """A YAML-comparable value: tuples (nested too) as lists."""
  if isinstance(x, (tuple, list)):
    return [_plain(v) for v in x]
  return x


def _views_value(views, field):
  if field == 'jitter':
    values = [[round(a, 6) for a in v.jitter_amounts()] for v in views]
  else:
    values = [_plain(getattr(v, field)) for v in views]
  if all(v == values[0] for v in values):
    return values[0]
  return {'per_view': values}


def _op_order(order, views) -> str:
  """The order of the views' ops (`config.augment.op_order`): without
  'autoaugment' where no view uses it; with AutoAugment, only the ops the
  views use ('crop' stands for the translation crop too)."""
  names = [n.strip() for n in (order.split(',') if isinstance(order, str)
                               else order)]
  if not any(v.autoaugment for v in views):
    return ', '.join(n for n in names if n != 'autoaugment')
  used = {'crop': any(v.crop_scale is not None or v.pad_crop for v in views),
          'flip': any(v.flip_p for v in views),
          'autoaugment': True,
          'jitter': any(any(v.jitter_amounts()) and v.jitter_p for v in views),
          'grayscale': any(v.grayscale_p for v in views),
          'blur': any(v.blur_p for v in views),
          'solarize': any(v.solarize_p for v in views)}
  return ', '.join(n for n in names if used[n])


def hyperparameters(config) -> dict:
  """Every training hyperparameter of a resolved paper config, by name."""
  opt, model, mc = config.optimizer, config.model, config.moco
  h = {
      'encoder': model.encoder,
      'encoder.stem': model.encoder_kwargs.stem + (
          f', padding {model.encoder_kwargs.stem_padding}'
          if model.encoder_kwargs.stem_padding else ''),
      'encoder.width': model.encoder_kwargs.width,
      'encoder.zero_init_residual': model.encoder_kwargs.zero_init_residual,
      'encoder.conv_init': model.encoder_kwargs.conv_init + (
          f'; stem {model.encoder_kwargs.stem_conv_init}'
          if model.encoder_kwargs.stem_conv_init else ''),
      # A constant of the code (models.BN_MOMENTUM, Flax's convention), in
      # PyTorch's: the share of a batch's statistics in the running ones.
      'encoder.bn_momentum': round(1 - models.BN_MOMENTUM, 6),
      'head.init': model.head_init,
      'head.layers': model.head_layers,
      'head.out_dim': model.head_out_dim,
      'head.hidden_bn': model.head_batch_norm,
      'head.final_bn': model.head_final_bn,
      'batch_size': config.batch_size,
      'num_epochs': float(config.num_epochs),
      'optimizer': opt.name,
      'optimizer.base_learning_rate': opt.base_learning_rate,
      'optimizer.peak_learning_rate': round(
          opt.base_learning_rate * config.batch_size / 256, 8),
      'optimizer.lr_scaling': 'linear, B / 256',
      'optimizer.weight_decay': opt.weight_decay,
      'optimizer.decay_biases_and_bn': opt.decay_biases_and_bn,
      'optimizer.warmup_epochs': round(
          opt.warmup_fraction * config.num_epochs, 6),
      'optimizer.warmup_init_lr': opt.warmup_init_lr,
      'optimizer.schedule': opt.schedule,
      'method': config.method,
      'use_labels': config.use_labels,
      'loss': config.loss,
      'loss.scale': config.loss_scale,
      'augment.num_views': config.augment.num_views,
      'dataset.image_size': config.dataset.image_size or 32,
      # A name of models.INPUT_NORMS (its mean / std in the row's source).
      'model.input_norm': model.input_norm,
      'evals.knn.ks': _plain(config.evals.knn.ks),
      'evals.knn.temperature': config.evals.knn.temperature,
      'evals.linear_eval.preset': (config.evals.linear_eval.preset
                                   if config.evals.linear_eval.every_steps >= 0
                                   else ''),
  }
  if model.head_layers > 1:
    h['head.hidden_dim'] = model.head_hidden_dim
  if model.head_final_bn:
    h['head.final_bn_scale'] = model.head_final_bn_scale
    h['head.final_bn_center'] = model.head_final_bn_center
  # Pinned only where a config sets it (SupCon's TF code), as the optional
  # view fields.
  if model.normalize_head_input:
    h['head.normalize_input'] = model.normalize_head_input
  if opt.name in ('sgd', 'lars'):
    h['optimizer.momentum'] = opt.momentum
  if opt.name == 'lars':
    h['optimizer.trust_coefficient'] = opt.trust_coefficient
    h['optimizer.clip_lr'] = opt.clip_lr
  if opt.schedule == 'cosine':
    h['optimizer.cosine_final'] = opt.cosine_final
  if opt.schedule == 'step':
    h['optimizer.decay_epochs'] = _plain(opt.decay_epochs)
    h['optimizer.lr_decay'] = opt.lr_decay
  for name, value in config.loss_kwargs.items():
    h[f'loss.{name}'] = _plain(value)
  for name, value in config.loss_schedules.items():
    h[f'loss_schedule.{name}'] = value
  if config.method == 'moco':
    q, k = tuple(mc.query_views), tuple(mc.key_views)
    h.update({
        'moco.query_views': list(q),
        'moco.key_views': list(k),
        'moco.directions': ('symmetric' if len(q) > 1 and set(q) == set(k)
                            else 'one-directional'),
        'moco.queue_size': mc.queue_size,
        'moco.enqueue_keys': mc.enqueue_keys,
        'moco.momentum': mc.momentum,
        'moco.momentum_schedule': mc.momentum_schedule,
        'moco.predictor_hidden_dim': mc.predictor_hidden_dim,
        'moco.shuffle_bn': mc.shuffle_bn,
        'model.bn_splits': model.bn_splits,
    })
  elif config.method == 'in_batch':
    h['directions'] = 'symmetric'
  if config.method == 'memory_bank':
    h.update({
        'memory_bank.momentum': config.memory_bank.momentum,
        'memory_bank.num_negatives': config.memory_bank.num_negatives,
        'memory_bank.noise': config.memory_bank.noise,
    })
  views = augment.build_views(config.augment.preset, config.augment.num_views,
                              config.augment.overrides, config.augment.op_order)
  for field in VIEW_FIELDS:
    h[f'views.{field}'] = _views_value(views, field)
  default = augment.ViewConfig()
  for field in OPTIONAL_VIEW_FIELDS:
    if any(getattr(v, field) != getattr(default, field) for v in views):
      h[f'views.{field}'] = _views_value(views, field)
  h['views.op_order'] = _op_order(config.augment.op_order, views)
  if config.dataset.name == 'imagenet2012':
    h['dataset.train_crop_source'] = config.dataset.train_crop_source
    h['dataset.eval_crop_fraction'] = config.dataset.eval_crop_fraction
    h['dataset.resize'] = config.dataset.resize
  entry = config.evals.linear_eval
  if entry.every_steps >= 0 and entry.preset:
    probe = linear_eval.get_config(entry.preset, epochs=entry.epochs,
                                   batch_size=entry.batch_size)
    h.update({
        'linear_eval.optimizer': probe.optimizer,
        'linear_eval.lr': round(probe.lr, 8),
        'linear_eval.batch_size': probe.batch_size,
        'linear_eval.epochs': probe.epochs,
        'linear_eval.weight_decay': probe.weight_decay,
        'linear_eval.schedule': probe.schedule,
        'linear_eval.crop_scale': _plain(probe.view.crop_scale),
        'linear_eval.flip_p': probe.view.flip_p,
        'linear_eval.classifier_init': probe.classifier_init,
        'linear_eval.encoder_bn': probe.encoder_bn,
        'linear_eval.lr_update': probe.lr_update,
    })
    if probe.optimizer == 'sgd':
      h['linear_eval.momentum'] = probe.momentum
      h['linear_eval.nesterov'] = probe.nesterov
    elif probe.optimizer == 'adam':
      h['linear_eval.adam_betas'] = [probe.adam_b1, probe.adam_b2]
    else:
      assert probe.optimizer == 'rmsprop', probe.optimizer
      h['linear_eval.momentum'] = probe.momentum
      h['linear_eval.rmsprop_decay'] = probe.rmsprop_decay
      h['linear_eval.rmsprop_eps'] = probe.rmsprop_eps
    if probe.schedule == 'step':
      h['linear_eval.milestones'] = _plain(probe.milestones)
      h['linear_eval.lr_decay'] = probe.lr_decay
    if probe.schedule == 'cosine':
      h['linear_eval.cosine_final'] = probe.cosine_final
    if probe.schedule == 'exponential':
      h['linear_eval.warmup_epochs'] = probe.warmup_epochs
      h['linear_eval.lr_decay'] = probe.lr_decay
      h['linear_eval.epochs_per_decay'] = probe.epochs_per_decay
    if probe.view.pad_crop:
      h['linear_eval.pad_crop'] = probe.view.pad_crop
    if probe.view.autoaugment:
      h['linear_eval.autoaugment'] = probe.view.autoaugment
      h['linear_eval.autoaugment_impl'] = probe.view.autoaugment_impl
    recipe_default = linear_eval.LinearEvalConfig()
    for field in OPTIONAL_LINEAR_FIELDS:
      if getattr(probe, field) != getattr(recipe_default, field):
        h[f'linear_eval.{field}'] = getattr(probe, field)
  return h


def _resolve(method, scale):
  return importlib.import_module(f'configs.papers.{method}').get_config(scale)


def load_table() -> dict:
  with open(TABLE) as f:
    table = yaml.safe_load(f)
  return table


def _equal(a, b) -> bool:
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
  if isinstance(a, bool) or isinstance(b, bool):
    return a is b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
  return a == b


PAIRS = [(m, s) for m in METHODS for s in common.SCALES]


def test_the_table_covers_every_method_and_scale():
  table = load_table()
  assert sorted(table) == METHODS
  for method in METHODS:
    assert sorted(table[method]) == sorted(common.SCALES), method


@pytest.mark.parametrize('method,scale', PAIRS)
def test_config_equals_the_tables_ours_value(method, scale):
  rows = load_table()[method][scale]['rows']
  ours = hyperparameters(_resolve(method, scale))
  missing = sorted(set(ours) - set(rows))
  extra = sorted(set(rows) - set(ours))
  assert not missing, f'{method}:{scale}: no table row for {missing}'
  assert not extra, f'{method}:{scale}: table rows the config lacks: {extra}'
  wrong = {name: (rows[name]['ours'], value) for name, value in ours.items()
           if not _equal(rows[name]['ours'], value)}
  assert not wrong, (f'{method}:{scale}: (table ours, config) differ for '
                     f'{wrong}')


@pytest.mark.parametrize('method,scale', PAIRS)
def test_every_row_has_a_status_a_source_and_a_consistent_verdict(method,
                                                                   scale):
  # The verdicts are checked on the config's own value (the `ours` column is
  # a readable copy of it, pinned by the test above), against `official`.
  entry = load_table()[method][scale]
  assert entry.get('reference'), f'{method}:{scale} names no reference recipe'
  config_values = hyperparameters(_resolve(method, scale))
  for name, row in entry['rows'].items():
    value = config_values[name]
    where = f'{method}:{scale} {name}'
    assert set(row) <= {'ours', 'official', 'status', 'source', 'why'}, where
    assert row.get('status') in STATUSES, where
    assert row.get('source'), f'{where}: no source'
    if row['status'] == 'matches':
      assert _equal(value, row['official']), (
          f'{where}: marked matches but the config has {value!r}, official '
          f'{row["official"]!r}')
    elif row['status'] == 'differs':
      assert row.get('why'), f'{where}: differs without a reason'
      assert not _equal(value, row.get('official')), (
          f'{where}: marked differs but the config has the official value')
    else:   # unverified, n/a: no official value; say what is missing.
      assert row.get('official') is None, where
      assert row.get('why'), f'{where}: {row["status"]} without a reason'


def test_a_changed_config_value_fails_against_the_table():
  # Three values of different kinds: a LARS constant, an augmentation
  # amount of one view, a MoCo queue size.
  rows = load_table()
  cases = [('moco_v3', 'cifar10', 'optimizer.trust_coefficient',
            lambda c: setattr(c.optimizer, 'trust_coefficient', 0.001)),
           ('simclr', 'cifar10', 'views.jitter',
            lambda c: c.augment.__setattr__('overrides', ())),
           ('moco_v2', 'imagenet', 'moco.queue_size',
            lambda c: setattr(c.moco, 'queue_size', 4096))]
  for method, scale, name, change in cases:
    config = _resolve(method, scale)
    assert _equal(hyperparameters(config)[name],
                  rows[method][scale]['rows'][name]['ours'])
    change(config)
    assert not _equal(hyperparameters(config)[name],
                      rows[method][scale]['rows'][name]['ours']), name
