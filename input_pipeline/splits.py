"""Dataset variants from the config: a validation holdout and class imbalance.

The holdout is stratified and chosen by the labels and `VALIDATION_SEED`
alone (never config.seed), so every run is scored on the same examples; the
imbalance then thins the rest, so validation stays balanced like the test.
"""

from __future__ import annotations

import numpy as np

from input_pipeline import imbalance
from input_pipeline import pipeline

VALIDATION_SEED = 20_231_013
IMBALANCE_SEED = 2021   # The CACR code's sklearn shuffle's random_state.


def stratified_counts(labels, size: int, num_classes: int) -> np.ndarray:
  """[C] examples of each class in a stratified sample of `size`:
  floor(size * n_c / N), plus one for the classes with the largest
  remainders (ties: lower id first), so the counts sum to `size`."""
  counts = np.bincount(labels, minlength=num_classes).astype(np.int64)
  total = int(counts.sum())
  if not 0 <= size < total:
    raise ValueError(f'validation_size={size} must be in [0, {total}) '
                     f'(the training split has {total} examples).')
  exact = counts * size
  base = exact // total
  remainder = exact - base * total
  order = np.argsort(-remainder, kind='stable')
  base[order[:size - int(base.sum())]] += 1
  return base


def holdout(data: pipeline.ArrayDataset, size: int, *,
            seed: int = VALIDATION_SEED
            ) -> tuple[pipeline.ArrayDataset, pipeline.ArrayDataset]:
  """(train, validation) of `data`, a stratified holdout of `size`; both in
  the original order, renumbered."""
  take = stratified_counts(data.labels, size, data.num_classes)
  validation = imbalance.sample_per_class(data.labels, take, seed)
  keep = np.ones(len(data), bool)
  keep[validation] = False
  return data.take(np.flatnonzero(keep)), data.take(validation)


def prepare_train(data, dataset_config):
  """(train, validation) from the full training split and `config.dataset`
  (validation_size, imbalance); validation None at 0."""
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
    data = imbalance.imbalanced_subset(data, rule=rule, seed=IMBALANCE_SEED)
  return data, validation
