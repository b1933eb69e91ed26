"""A config over the defaults of `configs/base.py`, and its checks.

`with_defaults` completes any config (a saved config.json included) from
base's values and each `config.evals` entry from its type's, and rejects keys
base does not know.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections

from configs import base as base_config
from contrastive_jax import errors
from contrastive_jax import evaluators
from contrastive_jax import losses
from contrastive_jax import methods
from contrastive_jax import models
from contrastive_jax import optim
from contrastive_jax import schedules
from contrastive_jax import storage
from input_pipeline import augment
from input_pipeline import sources

# Sub-dicts whose keys are the config's own, not base's.
_FREE = ('loss_kwargs', 'loss_schedules', 'evals', 'encoder_kwargs')


def _tuples(x):
  """JSON lists -> tuples, as modules take them."""
  if isinstance(x, dict):
    return {k: _tuples(v) for k, v in x.items()}
  if isinstance(x, list):
    return tuple(_tuples(v) for v in x)
  return x


# Renamed options an older config.json may hold -> their names.
RENAMED = {
    'eval.knn_ks': 'evals.knn.ks',
    'eval.knn_temperature': 'evals.knn.temperature',
    'eval.linear_l2': 'evals.linear.l2',
    'eval.linear_max_iter': 'evals.linear.max_iter',
    'eval.linear_eval': 'evals.linear_eval.preset',
    'eval.linear_eval_epochs': 'evals.linear_eval.epochs',
    'eval.linear_eval_batch_size': 'evals.linear_eval.batch_size',
    'online.knn_every_steps': 'evals.online_knn.every_steps',
    'online.knn_k': 'evals.online_knn.ks',
    'online.knn_bank_size': 'evals.online_knn.bank_size',
    'online.knn_num_queries': 'evals.online_knn.num_queries',
    'online.linear_probe': 'online.classifier'}
# Removed options an older config.json may hold -> the one value the code
# keeps; a config.json that set another cannot be reproduced.
REMOVED = {'dataset.imbalance_levels': 0,
           'online.classifier_learning_rate': 1e-3,
           'online.probe_learning_rate': 1e-3}


def _merge(defaults: dict, values: dict, path: str = '') -> dict:
  out = dict(defaults)
  for key, value in values.items():
    name = path + key
    if name in REMOVED and key not in defaults:
      if value != REMOVED[name]:
        raise ValueError(f'config.{name}={value!r} is no longer an option; '
                         f'the code keeps {REMOVED[name]!r}.')
      continue
    if key not in defaults and path[:-1] not in _FREE:
      hint = (f'; it is config.{RENAMED[name]} now' if name in RENAMED else
              ' (configs/base.py lists every option); check its spelling')
      raise ValueError(f'config.{name} is not an option{hint}.')
    if (isinstance(value, dict) and isinstance(defaults.get(key), dict)
        and key not in _FREE):
      out[key] = _merge(defaults[key], value, name + '.')
    else:
      out[key] = value
  return out


def with_defaults(config: ml_collections.ConfigDict | dict[str, Any]
                  ) -> ml_collections.ConfigDict:
  """`config` (a ConfigDict or a config.json dict) over base's defaults.

  A config that sets `evals` has exactly its entries; one without gets base's.
  """
  values = _tuples(config.to_dict() if hasattr(config, 'to_dict')
                   else dict(config))
  defaults = _tuples(base_config.get_config().to_dict())
  try:
    merged = _merge(defaults, values)
  except ValueError as e:
    raise errors.ConfigError([str(e)]) from None
  merged['evals'] = {
      name: {**evaluators.entry_defaults(name, entry), **entry}
      for name, entry in merged['evals'].items()}
  return ml_collections.ConfigDict(merged)


def load(workdir: str) -> ml_collections.ConfigDict:
  """A run's config from `<workdir>/config.json`, with the defaults."""
  path = os.path.join(workdir, 'config.json')
  text = storage.read_text(path)
  if text is None:
    raise FileNotFoundError(f'{path} not found: is {workdir!r} the --workdir '
                            'of a training run?')
  return with_defaults(json.loads(text))


def validate(config, num_devices: int | None = None) -> None:
  """Checks all that is checkable before data or compilation: a ConfigError
  lists every problem (`num_devices`: default, every device of the job)."""
  problems = errors.Problems()
  n = jax.device_count() if num_devices is None else num_devices
  b = config.batch_size
  with problems.check():
    methods.get(config.method).validate(config, n)
  with problems.check():
    losses.get_loss(config.loss)
  with problems.check():
    models.validate(config)
  with problems.check():
    augment.build_views(config.augment.preset, config.augment.num_views,
                        config.augment.overrides, config.augment.op_order)
  with problems.check():
    sources.check_crop_options(config.dataset)
  with problems.check():
    if not isinstance(b, int) or b < 1:
      raise ValueError(f'config.batch_size={b!r} must be an int >= 1.')
    if b % n:
      raise ValueError(f'config.batch_size={b} is not divisible '
                       f'by the {n} devices; use a multiple of {n}.')
  with problems.check():
    if config.eval.batch_size % n:
      raise ValueError(f'config.eval.batch_size={config.eval.batch_size} is '
                       f'not divisible by the {n} devices; use a multiple of '
                       f'{n}.')
  with problems.check():
    splits = config.model.bn_splits
    if not isinstance(splits, int) or splits < 0:
      raise ValueError(f'config.model.bn_splits={splits!r} must be an int >= '
                       '0 (0: BatchNorm over the whole batch).')
    if splits and (b % splits or b // splits < 2):
      raise ValueError(
          f'config.batch_size={b} does not split into config.model.bn_splits='
          f'{splits} BatchNorm groups of at least 2 images; set batch_size to '
          f'a multiple of {splits} (>= {2 * splits}) or bn_splits to a '
          f'divisor of {b}.')
  for name, kind in dict(config.loss_schedules).items():
    with problems.check():
      if name not in methods.base.loss_parameters(config.loss):
        raise ValueError(f'config.loss_schedules.{name}: {config.loss!r} has '
                         f'no keyword argument {name!r}.')
      schedules.build(kind, 0., total_steps=1, steps_per_epoch=1,
                      num_epochs=1, name=f'config.loss_schedules.{name}')
  with problems.check():
    scale = config.loss_scale
    if (isinstance(scale, bool) or not isinstance(scale, (int, float))
        or not scale > 0):
      raise ValueError(f'config.loss_scale={scale!r} must be a number > 0 '
                       '(the factor on the loss; 1.0: none).')
  with problems.check():
    # The schedule's and optimizer's own checks, on a dummy length.
    optim.create_optimizer(
        config, optim.learning_rate_schedule(config, total_steps=1))
  with problems.check():
    evaluators.validate(config, num_devices=n)
  ds = config.dataset
  with problems.check():
    if not isinstance(ds.validation_size, int) or ds.validation_size < 0:
      raise ValueError(f'config.dataset.validation_size='
                       f'{ds.validation_size!r} must be an int >= 0 (0: no '
                       'validation holdout).')
  with problems.check():
    if config.eval.split not in ('test', 'validation'):
      raise ValueError(f'config.eval.split={config.eval.split!r} must be '
                       '"test" or "validation".')
    if config.eval.split == 'validation' and not ds.validation_size:
      raise ValueError('config.eval.split="validation" scores the holdout; '
                       'set config.dataset.validation_size > 0 (e.g. 10000).')
  with problems.check():
    if ds.imbalance not in ('none', 'linear', 'exponential'):
      raise ValueError(f'config.dataset.imbalance={ds.imbalance!r}; known: '
                       'none, linear, exponential.')
  with problems.check():
    if (ds.validation_size or ds.imbalance != 'none') and not ds.in_memory:
      raise ValueError('config.dataset.validation_size and .imbalance need '
                       'config.dataset.in_memory=True.')
  with problems.check():
    if not 0 <= ds.max_bad_fraction <= 1:
      raise ValueError(f'config.dataset.max_bad_fraction='
                       f'{ds.max_bad_fraction} must be in [0, 1] (0: stop at '
                       'the first bad record).')
  problems.raise_any()


def validate_data(config, *, num_train: int) -> None:
  """The checks that need the training split's size `num_train`, at once."""
  problems = errors.Problems()
  n = jax.device_count()
  with problems.check():
    if config.batch_size > num_train:
      fix = (f'set --config.batch_size={num_train // n * n} or lower (a '
             f'multiple of the {n} devices)' if num_train >= n else
             f'use at least {n} images (one per device)')
      raise ValueError(
          f'config.batch_size={config.batch_size} is larger than the '
          f'{num_train} training images; {fix}.')
  with problems.check():
    evaluators.validate(config, num_devices=n, num_train=num_train)
  problems.raise_any()
