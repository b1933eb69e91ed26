"""The run directory: the config and class list a run is bound to.

A workdir holds one run: `config.json` (the config it started with, with the
defaults), `data.json` (the images' shape, so that a checkpoint restores
without opening the data) and, for an image folder, `classes.json` (its class
list, so that resuming or evaluating labels the images as training did). Resuming with
another config or other classes is refused before anything is written.
"""

from __future__ import annotations

import json
import os

import jax

from contrastive_jax import config_lib
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


# Fields that change how a run is computed but not what: a run resumes
# with another value (e.g. moved to a host with more cores).
HOW_NOT_WHAT = ('dataset.num_workers',)


def check_config(config, workdir: str) -> None:
  """Writes `config.json`, or refuses a workdir that holds another config.

  The saved config is completed with the current defaults first
  (`config_lib.with_defaults`), so an option added since the run started is
  not taken for a difference; nor are the fields of `HOW_NOT_WHAT`.
  """
  path = os.path.join(workdir, 'config.json')
  current = json.loads(config.to_json_best_effort(sort_keys=True))
  if storage.path(path).exists():
    previous = json.loads(config_lib.load(workdir).to_json_best_effort(
        sort_keys=True))
    flat_prev, flat_cur = _flatten(previous), _flatten(current)
    diff = ', '.join(
        f'{k}: {flat_prev.get(k)!r} -> {flat_cur.get(k)!r}'
        for k in sorted(set(flat_prev) | set(flat_cur))
        if flat_prev.get(k) != flat_cur.get(k) and k not in HOW_NOT_WHAT)
    if diff:
      raise ValueError(
          f'workdir {workdir!r} holds a run of a different config ({diff}). '
          'Use a new --workdir, or delete this one to start over; nothing '
          'was changed.')
    return
  if jax.process_index() == 0:
    reporting.write_json(path, current)


def load_classes(workdir: str) -> tuple[str, ...] | None:
  """The class list a run stored in `<workdir>/classes.json`, if any."""
  data = reporting.read_json(os.path.join(workdir, 'classes.json'))
  return tuple(data['classes']) if data else None


def store_classes(workdir: str, stored, classes) -> None:
  """Writes the run's class list once; refuses data with another one."""
  if classes is None:
    return
  if stored is None:
    if jax.process_index() == 0:
      reporting.write_json(os.path.join(workdir, 'classes.json'),
                  {'classes': list(classes)})
  elif tuple(stored) != tuple(classes):
    raise ValueError(
        f'workdir {workdir!r} holds a run with the classes {list(stored)} '
        f'(classes.json); the data has {list(classes)}. Use a new --workdir.')


def store_image_shape(workdir: str, image_shape) -> None:
  """Writes `data.json` with the training images' (H, W, C)."""
  if jax.process_index() == 0:
    reporting.write_json(os.path.join(workdir, 'data.json'),
                         {'image_shape': [int(d) for d in image_shape]})


def load_image_shape(workdir: str) -> tuple[int, int, int] | None:
  """The (H, W, C) a run stored in `data.json`, if any."""
  data = reporting.read_json(os.path.join(workdir, 'data.json'))
  return tuple(data['image_shape']) if data else None
