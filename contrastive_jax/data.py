"""A run's data: the configured splits, opened and checked.

`load` opens the splits of `config.dataset` (input_pipeline/sources.py),
holds out validation and applies the imbalance (input_pipeline/splits.py),
and checks them: the same on every process, few enough undecodable records,
and any difference in their classes logged (docs/input_pipeline.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np
from absl import logging

from contrastive_jax import errors
from input_pipeline import sources
from input_pipeline import splits


def load(config, classes=None):
  """(train, eval) sources of `config.dataset`; eval is the validation
  holdout when `config.eval.split == 'validation'`. `classes`, a run's stored
  list, fixes an image folder's ids. Data errors raise a ConfigError."""
  ds = config.dataset
  train_name = f'training split {ds.train_split!r}'
  eval_name = (f'evaluation split {ds.eval_split!r}'
               if config.eval.split == 'test' else 'validation holdout')
  try:
    if ds.name == 'image_folder' and classes is None and ds.data_dir:
      classes = sources.folder_classes(ds.data_dir)   # One list, both splits.
    opened = {train_name: sources.open_split(ds, ds.train_split, classes)}
    if config.eval.split == 'test':
      opened[eval_name] = sources.open_split(ds, ds.eval_split, classes)
    for what, source in opened.items():
      check_same_on_every_process(what, fingerprint(source))
      if ds.verify and not ds.in_memory:
        logging.info('Decoding every record of the %s '
                     '(config.dataset.verify).', what)
        scan(source)
    count_skipped(config, opened)
    train, validation = splits.prepare_train(opened[train_name], ds)
    evaluation = opened.get(eval_name, validation)
    for message in class_warnings(train, evaluation, train_name=train_name,
                                  eval_name=eval_name):
      logging.warning('Classes: %s', message)
  except errors.ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:
    raise errors.ConfigError([str(e)]) from e
  return train, evaluation


def count_skipped(config, named: dict[str, Any]) -> dict[str, Any]:
  """Agrees the undecodable records of each named split over the processes
  (a collective), raises past `config.dataset.max_bad_fraction`, and returns
  results.json's 'data/skipped_records' and 'data/skipped_files' (100)."""
  fraction = config.dataset.max_bad_fraction
  found = []
  for what, source in named.items():
    skipped = sync_skipped(source)
    check_skipped(what, skipped, len(source), fraction)
    found += skipped.values()
  return {'data/skipped_records': len(found),
          'data/skipped_files': sorted(found)[:100]}


def check_skipped(what: str, skipped: dict[int, str], size: int,
                  max_fraction: float) -> None:
  """Raises, listing them, when over `max_fraction` of the `size` records of
  split `what` are undecodable (`skipped`: id -> file and error)."""
  if len(skipped) <= max_fraction * size:
    return
  listed = [skipped[i] for i in sorted(skipped)]
  shown = '; '.join(listed[:20]) + (
      f'; and {len(listed) - 20} more (each logged above)'
      if len(listed) > 20 else '')
  raise ValueError(
      f'{len(skipped)} of the {size} records of the {what} cannot be decoded, '
      f'more than config.dataset.max_bad_fraction={max_fraction} of it: '
      f'{shown}. Remove or replace these files (config.dataset.verify=True '
      'lists every bad file before training starts), or raise '
      'config.dataset.max_bad_fraction to train with black images in their '
      'place.')


def _names(classes, ids) -> str:
  ids = list(ids)
  named = [repr(classes[c]) if classes else f'id {c}' for c in ids[:20]]
  return ', '.join(named) + (f' and {len(ids) - 20} more'
                             if len(ids) > 20 else '')


def class_warnings(train, evaluation, *, train_name: str,
                   eval_name: str) -> list[str]:
  """One message per difference between two splits' classes: their counts
  and, where labels are known without decoding, which classes each has."""
  out = []
  if train.num_classes != evaluation.num_classes:
    out.append(
        f'the {train_name} has {train.num_classes} classes and the '
        f'{eval_name} {evaluation.num_classes}: scores take ids 0..'
        f'{max(train.num_classes, evaluation.num_classes) - 1} to mean the '
        'same classes in both.')
  train_labels = getattr(train, 'labels', None)
  eval_labels = getattr(evaluation, 'labels', None)
  if train_labels is None or eval_labels is None:
    return out
  n = max(train.num_classes, evaluation.num_classes)
  in_train = np.bincount(train_labels, minlength=n) > 0
  in_eval = np.bincount(eval_labels, minlength=n) > 0
  classes = train.classes or evaluation.classes
  if (lacking := np.flatnonzero(in_train & ~in_eval)).size:
    out.append(f'the {eval_name} has no examples of {_names(classes, lacking)}'
               f', which the {train_name} has; every split labels a class '
               'with the same id, so the scores stay correct.')
  if (lacking := np.flatnonzero(in_eval & ~in_train)).size:
    count = int(np.isin(eval_labels, lacking).sum())
    out.append(f'the {train_name} has no examples of '
               f'{_names(classes, lacking)}, which the {eval_name} has: '
               f'nothing can predict them, so its {count} examples of them '
               'count as errors.')
  if classes and (empty := np.flatnonzero(~in_train & ~in_eval)).size:
    out.append(f'{_names(classes, empty)} have no examples in either split '
               '(empty class folders, or slices without them); they keep '
               'their ids.')
  return out


def fingerprint(source) -> bytes:
  """What every process must agree on about a split: size, classes, labels
  and (image folders) files."""
  h = hashlib.sha256(repr((len(source), source.classes)).encode())
  labels = getattr(source, 'labels', None)
  if labels is not None:
    h.update(np.asarray(labels, np.int32).tobytes())
  for f in getattr(source, 'files', ()):
    h.update(f'{f.parent.name}/{f.name}\n'.encode())
  return h.digest()


def _allgather(x: np.ndarray) -> np.ndarray:
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x))


def check_same_on_every_process(what: str, digest: bytes) -> None:
  """Raises on every process when the processes' `digest`s of `what` differ
  (one reading another copy of the data would train with other ids)."""
  if jax.process_count() == 1:
    return
  every = _allgather(np.frombuffer(digest[:16], np.int32))
  differ = [p for p in range(len(every))
            if not np.array_equal(every[p], every[0])]
  if differ:
    raise ValueError(
        f'{what} differs between processes ({differ} against 0): every '
        'process must read the same files with the same class list; check '
        'that config.dataset.data_dir is the same complete copy on every '
        'host.')


def sync_skipped(source) -> dict[int, str]:
  """The undecodable records of `source` found by any process so far, the
  same on every process (each decodes the ids it lacks). A collective."""
  if jax.process_count() == 1:
    return dict(source.skipped)
  mine = np.fromiter(source.skipped, np.int32)
  width = int(np.max(_allgather(np.asarray([len(mine)], np.int32))))
  if not width:
    return {}
  # A power of two: a handful of shapes (each compiles once) as counts grow.
  padded = np.full((1 << (width - 1).bit_length(),), -1, np.int32)
  padded[:len(mine)] = mine
  every = _allgather(padded)
  ids = np.unique(every[every >= 0])
  missing = [int(i) for i in ids if int(i) not in source.skipped]
  if missing:
    source.read(missing)
  return {int(i): source.skipped.get(
      int(i), f'record {i} (undecodable on another process only)')
          for i in ids}


def scan(source, chunk: int = 1024) -> dict[int, str]:
  """Decodes every record once (each process a share): `sync_skipped`."""
  share = np.array_split(np.arange(len(source)),
                         jax.process_count())[jax.process_index()]
  for start in range(0, len(share), chunk):
    source.read(share[start:start + chunk])
  return sync_skipped(source)
