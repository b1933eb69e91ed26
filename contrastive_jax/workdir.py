"""The run directory: the config and class list a run is bound to.

A workdir holds `config.json`, `data.json` (the images' shape) and, for an
image folder, `classes.json`. Resuming a checkpointed run with another config
or classes is refused before anything is written; a workdir without a
checkpoint holds no run, and a new start replaces it.
"""

from __future__ import annotations

import json
import os

import jax

from contrastive_jax import config_lib
from contrastive_jax import errors
from contrastive_jax import reporting
from contrastive_jax import storage


def _flatten(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


# Fields that change how a run is computed, not what: resuming may change them.
HOW_NOT_WHAT = ('dataset.num_workers',)


def holds_run(workdir: str) -> bool:
  """True when `workdir` holds a checkpoint: a run to protect."""
  checkpoints = storage.path(workdir) / 'checkpoints'
  return checkpoints.is_dir() and any(
      p.name.isdigit() for p in checkpoints.iterdir())


def check_config(config, workdir: str) -> None:
  """Refuses a workdir whose checkpointed run has another config (the saved
  one with the current defaults; `HOW_NOT_WHAT` aside). Writes nothing."""
  path = os.path.join(workdir, 'config.json')
  if not holds_run(workdir) or not storage.path(path).exists():
    return
  current = json.loads(config.to_json_best_effort(sort_keys=True))
  previous = json.loads(config_lib.load(workdir).to_json_best_effort(
      sort_keys=True))
  flat_prev, flat_cur = _flatten(previous), _flatten(current)
  diff = ', '.join(
      f'{k}: {flat_prev.get(k)!r} -> {flat_cur.get(k)!r}'
      for k in sorted(set(flat_prev) | set(flat_cur))
      if flat_prev.get(k) != flat_cur.get(k) and k not in HOW_NOT_WHAT)
  if diff:
    raise errors.ConfigError([
        f'workdir {workdir!r} holds a run (checkpoints/) of a different '
        f'config ({diff}). Use a new --workdir, or delete this one to start '
        'over; nothing was changed.'])


def load_classes(workdir: str) -> tuple[str, ...] | None:
  """The checkpointed run's class list (classes.json), if any."""
  if not holds_run(workdir):
    return None
  data = reporting.read_json(os.path.join(workdir, 'classes.json'))
  return tuple(data['classes']) if data else None


def check_classes(workdir: str, stored, classes) -> None:
  """Refuses data whose class list is not the checkpointed run's."""
  if stored is not None and classes is not None and (
      tuple(stored) != tuple(classes)):
    raise errors.ConfigError([
        f'workdir {workdir!r} holds a run with the classes {list(stored)} '
        f'(classes.json); the data has {list(classes)}. Use a new '
        '--workdir.'])


def bind(workdir: str, config, *, classes, image_shape) -> None:
  """Writes config.json, classes.json and data.json (process 0) once every
  check has passed; a checkpointed run's first two stay as they are."""
  if jax.process_index() != 0:
    return
  fresh = not holds_run(workdir)
  config_path = os.path.join(workdir, 'config.json')
  if fresh or not storage.path(config_path).exists():
    reporting.write_json(
        config_path, json.loads(config.to_json_best_effort(sort_keys=True)))
  classes_path = os.path.join(workdir, 'classes.json')
  if classes is not None and (fresh or
                              not storage.path(classes_path).exists()):
    reporting.write_json(classes_path, {'classes': list(classes)})
  elif classes is None and fresh and storage.path(classes_path).exists():
    storage.path(classes_path).unlink()   # A failed start's folder classes.
  reporting.write_json(os.path.join(workdir, 'data.json'),
                       {'image_shape': [int(d) for d in image_shape]})


def load_image_shape(workdir: str) -> tuple[int, int, int] | None:
  """The (H, W, C) a run stored in `data.json`, if any."""
  data = reporting.read_json(os.path.join(workdir, 'data.json'))
  return tuple(data['image_shape']) if data else None
