"""Class-imbalanced subsets of a dataset, as in the CACR paper.

CACR (Zheng et al., TMLR 2023, section 5.1, following Kim et al. 2020) keeps a
fraction p_l of the examples of each class at level l = 1..L:

* linear:      p_l = l / L
* exponential: p_l = exp(l - L)          (= e^l / e^L)

The paper's text writes these garbled ("floor(l/C)"); the released code
(`small_scale_experiments/*/util.py`) settles them as above, with L = 10 levels:
one class per level on CIFAR-10, ten consecutive classes per level on CIFAR-100.
Each class keeps its first `int(p_l * n_class)` examples after a seeded shuffle.
On CIFAR-10 (5000 per class) that keeps 500, 1000, ..., 5000 (linear; 27,500
total) or 0, 1, 4, 12, 33, 91, 248, 676, 1839, 5000 (exponential; 7,904 total).

Which examples are kept differs from the paper's code (it shuffles with
`sklearn.utils.shuffle(random_state=2021)`; here numpy's generator seeded with
(seed, class) does), but the per-class counts are the same.
"""

from __future__ import annotations

import math

import numpy as np
from absl import logging

from input_pipeline import pipeline

RULES = ('linear', 'exponential')


def class_levels(num_classes: int, num_levels: int) -> np.ndarray:
  """Level l in 1..num_levels of each class, consecutive classes grouped.

  Returns:
    [num_classes] int: class c has level c * num_levels // num_classes + 1.
  """
  if not 1 <= num_levels <= num_classes:
    raise ValueError(f'num_levels={num_levels} must be in [1, {num_classes}] '
                     '(the number of classes).')
  return np.arange(num_classes) * num_levels // num_classes + 1


def kept_counts(class_counts, *, rule: str, num_levels: int | None = None
                ) -> np.ndarray:
  """How many examples of each class the rule keeps.

  Args:
    class_counts: [C] number of examples of each class.
    rule: 'linear' or 'exponential' (see the module docstring).
    num_levels: L; default min(C, 10) as in the paper.

  Returns:
    [C] int64 counts.
  """
  class_counts = np.asarray(class_counts, np.int64)
  num_classes = len(class_counts)
  num_levels = min(num_classes, 10) if num_levels is None else num_levels
  levels = class_levels(num_classes, num_levels)
  if rule == 'linear':
    # Integer arithmetic: int(l / L * n) can truncate 57.0000 to 56 in floats.
    return levels * class_counts // num_levels
  if rule == 'exponential':
    return np.array([int(math.exp(l - num_levels) * n)
                     for l, n in zip(levels, class_counts)], np.int64)
  raise ValueError(f'unknown imbalance rule {rule!r}; known: {RULES}.')


def imbalanced_indices(labels, *, rule: str, num_levels: int | None = None,
                       seed: int = 2021, num_classes: int | None = None
                       ) -> np.ndarray:
  """Indices (ascending) of the examples an imbalanced subset keeps.

  Args:
    labels: [M] int class labels in [0, num_classes).
    rule: 'linear' or 'exponential'.
    num_levels: L; default min(num_classes, 10).
    seed: seeds which examples of each class are kept (not how many).
    num_classes: default max(labels) + 1.

  Returns:
    [M'] int64 indices into `labels`, ascending, so the subset keeps the
    original order.
  """
  labels = np.asarray(labels)
  num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
  counts = np.bincount(labels, minlength=num_classes)
  keep = kept_counts(counts, rule=rule, num_levels=num_levels)
  chosen = []
  for c in range(num_classes):
    members = np.flatnonzero(labels == c)
    order = np.random.default_rng([seed, c]).permutation(len(members))
    chosen.append(members[order[:keep[c]]])
  return np.sort(np.concatenate(chosen))


def imbalanced_subset(data: pipeline.ArrayDataset, *, rule: str = 'linear',
                      num_levels: int | None = None, seed: int = 2021
                      ) -> pipeline.ArrayDataset:
  """A class-imbalanced subset of `data` (CACR's linear or exponential rule).

  Deterministic in (data, rule, num_levels, seed); logs the class counts. The
  subset's positions are its stable example ids (`TrainBatches`' `index`).

  Args:
    data: a balanced (or any) dataset.
    rule: 'linear' (p_l = l / L) or 'exponential' (p_l = exp(l - L)).
    num_levels: L; default min(num_classes, 10) as in the paper.
    seed: which examples of each class are kept.

  Returns:
    The subset, in the original order.
  """
  idx = imbalanced_indices(data.labels, rule=rule, num_levels=num_levels,
                           seed=seed, num_classes=data.num_classes)
  subset = data.take(idx)
  counts = np.bincount(subset.labels, minlength=data.num_classes)
  logging.info('%s-imbalanced subset: %d of %d examples; per-class counts %s',
               rule, subset.num_examples, data.num_examples, counts.tolist())
  return subset
