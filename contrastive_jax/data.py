"""A run's data: the configured splits, opened and checked.

`load` opens the training and evaluation splits of `config.dataset`
(input_pipeline/sources.py), holds out the validation split and applies the
imbalance (input_pipeline/splits.py); `count_skipped` counts the undecodable
records found so far on every process and stops a run that has too many.
"""

from __future__ import annotations

from typing import Any

from absl import logging

from contrastive_jax import errors
from input_pipeline import pipeline
from input_pipeline import sources
from input_pipeline import splits


def load(config, classes=None):
  """(train, eval) sources of `config.dataset` (input_pipeline/sources.py).

  With `config.dataset.in_memory` each process holds the split in memory (an
  optimisation for small datasets); otherwise every read goes to the files.
  The training split becomes the training data after
  `config.dataset.validation_size` (a fixed stratified holdout) and
  `config.dataset.imbalance` (CACR's subsets), see input_pipeline/splits.py.
  The eval source is the test split (`config.dataset.eval_split`), or the
  holdout when `config.eval.split == 'validation'`.

  `classes` is a run's stored class list (`workdir.load_classes`): an image folder's
  ids follow it, not the folder's current contents. Before returning, the
  splits are checked: the same on every process, no more undecodable records
  than `config.dataset.max_bad_fraction` (all of them decoded first with
  `config.dataset.verify`), and any difference in their classes logged.
  What the data's own checks find (a missing folder or split, too many bad
  files) raises `errors.ConfigError`: a user's error, not the program's.
  """
  try:
    return _load(config, classes)
  except errors.ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:
    raise errors.ConfigError([str(e)]) from e


def _load(config, classes):
  ds = config.dataset
  if ds.name == 'image_folder' and classes is None and ds.data_dir:
    classes = sources.folder_classes(ds.data_dir)   # One list, both splits.
  train_name = f'training split {ds.train_split!r}'
  eval_name = (f'evaluation split {ds.eval_split!r}'
               if config.eval.split == 'test' else 'validation holdout')
  opened = {train_name: sources.open_split(ds, ds.train_split, classes)}
  if config.eval.split == 'test':
    opened[eval_name] = sources.open_split(ds, ds.eval_split, classes)
  for what, source in opened.items():
    pipeline.check_same_on_every_process(what, sources.fingerprint(source))
    if ds.verify and not ds.in_memory:
      logging.info('Decoding every record of the %s (config.dataset.verify).',
                   what)
      pipeline.scan(source)
  count_skipped(config, opened)
  train, validation = splits.prepare_train(opened[train_name], ds)
  evaluation = opened.get(eval_name, validation)
  for message in sources.class_warnings(train, evaluation,
                                        train_name=train_name,
                                        eval_name=eval_name):
    logging.warning('Classes: %s', message)
  return train, evaluation


def count_skipped(config, named: dict[str, Any]) -> dict[str, Any]:
  """The undecodable records found so far in each named split, agreed by
  every process (a collective: call it on all at the same point).

  Raises when a split has more than `config.dataset.max_bad_fraction` of
  them. Returns results.json's entries: 'data/skipped_records' (all splits)
  and 'data/skipped_files' (the first 100, sorted).
  """
  fraction = config.dataset.max_bad_fraction
  found = []
  for what, source in named.items():
    skipped = pipeline.sync_skipped(source)
    sources.check_skipped(what, skipped, len(source), fraction)
    found += skipped.values()
  return {'data/skipped_records': len(found),
          'data/skipped_files': sorted(found)[:100]}
