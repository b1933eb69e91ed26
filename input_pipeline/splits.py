"""Dataset variants from the config: a validation holdout and class imbalance.

Pure functions on `pipeline.ArrayDataset`; `data.load` is their only
caller in the training job, through `prepare_train`.

* Validation holdout (`config.dataset.validation_size`): a fixed, stratified
  part of the training split, removed from the training data. Stratified means
  each class contributes in proportion to its share of the split (largest
  remainder rounding, so the sizes add up exactly). Which examples are held
  out depends only on the labels, the size and `VALIDATION_SEED`, never on
  `config.seed`: every run, whatever its seed, is scored on the same
  validation examples and never trains on them.
* Class imbalance (`config.dataset.imbalance`): CACR's linear or exponential
  rule (Table 2; `imbalance.py`, docs/configs.md), applied to the
  training data *after* the holdout, so the validation split stays balanced
  like the test split (the paper evaluates on the standard balanced sets).
"""

from __future__ import annotations

import numpy as np

from input_pipeline import imbalance
from input_pipeline import pipeline

# Fixed on purpose and independent of config.seed (see the module doc).
VALIDATION_SEED = 20_231_013
# Which examples the imbalanced subset keeps: fixed as well (2021 is the
# `random_state` of the CACR code's sklearn shuffle).
IMBALANCE_SEED = 2021
IMBALANCE_RULES = ('none',) + imbalance.RULES


def stratified_counts(labels, size: int, num_classes: int | None = None
                      ) -> np.ndarray:
  """How many examples of each class a stratified sample of `size` takes.

  Class c gets floor(size * n_c / N) plus one if it is among the
  `size - sum(floors)` classes with the largest remainders (ties: lower class
  id first), so the counts sum to `size` and never exceed n_c.

  Returns:
    [C] int64 counts.
  """
  labels = np.asarray(labels)
  num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
  counts = np.bincount(labels, minlength=num_classes).astype(np.int64)
  total = int(counts.sum())
  if not 0 <= size < total:
    raise ValueError(f'validation_size={size} must be in [0, {total}) '
                     f'(the training split has {total} examples).')
  exact = counts * size
  base = exact // total
  remainder = exact - base * total
  extra = size - int(base.sum())
  # Stable sort on -remainder: the largest remainders, lower ids first.
  order = np.argsort(-remainder, kind='stable')
  base[order[:extra]] += 1
  return base


def stratified_holdout_indices(labels, size: int, *,
                               seed: int = VALIDATION_SEED,
                               num_classes: int | None = None
                               ) -> tuple[np.ndarray, np.ndarray]:
  """(train, validation) example indices, both ascending and disjoint.

  Class c's examples are shuffled with `default_rng([seed, c])` and the first
  `stratified_counts(...)[c]` of them are held out.
  """
  labels = np.asarray(labels)
  num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
  take = stratified_counts(labels, size, num_classes)
  held = []
  for c in range(num_classes):
    members = np.flatnonzero(labels == c)
    order = np.random.default_rng([seed, c]).permutation(len(members))
    held.append(members[order[:take[c]]])
  validation = np.sort(np.concatenate(held)).astype(np.int64)
  keep = np.ones(len(labels), bool)
  keep[validation] = False
  return np.flatnonzero(keep), validation


def holdout(data: pipeline.ArrayDataset, size: int, *,
            seed: int = VALIDATION_SEED
            ) -> tuple[pipeline.ArrayDataset, pipeline.ArrayDataset]:
  """Splits `data` into (train, validation) with a stratified holdout.

  Both keep the original order; the training part's positions are its new
  example ids.
  """
  train_idx, val_idx = stratified_holdout_indices(
      data.labels, size, seed=seed, num_classes=data.num_classes)
  return data.take(train_idx), data.take(val_idx)


def prepare_train(data, dataset_config):
  """The training data and the validation split a config asks for.

  Args:
    data: the full training split (an `ArrayDataset` when a holdout or an
      imbalance is asked for).
    dataset_config: `config.dataset` (validation_size, imbalance,
      imbalance_levels).

  Returns:
    (train, validation): validation is None when validation_size is 0.
  """
  size = int(dataset_config.validation_size)
  rule = dataset_config.imbalance
  if (size or rule != 'none') and not isinstance(data, pipeline.ArrayDataset):
    raise ValueError('config.dataset.validation_size and .imbalance need the '
                     'training split in memory (config.dataset.in_memory='
                     'True).')
  validation = None
  if size:
    data, validation = holdout(data, size)
  if rule != 'none':
    levels = int(dataset_config.imbalance_levels) or None
    data = imbalance.imbalanced_subset(data, rule=rule, num_levels=levels,
                                       seed=IMBALANCE_SEED)
  return data, validation
