"""Class-imbalanced subsets of a dataset, as in the CACR paper.

CACR (Zheng et al., TMLR 2023, section 5.1) keeps a fraction p_l of each
class at level l = 1..L, consecutive classes grouped into L = 10 levels:

* linear:      p_l = l / L
* exponential: p_l = exp(l - L)

(the released code's rules), `int(p_l * n_class)` examples after a seeded
shuffle. CIFAR-10 keeps 27,500 (linear) or 7,904 (exponential) examples.
"""

from __future__ import annotations

import math

import numpy as np
from absl import logging

from input_pipeline import pipeline

def kept_counts(class_counts, *, rule: str) -> np.ndarray:
  """[C] examples of each class the rule keeps, L = min(C, 10) levels."""
  class_counts = np.asarray(class_counts, np.int64)
  num_classes = len(class_counts)
  num_levels = min(num_classes, 10)
  levels = np.arange(num_classes) * num_levels // num_classes + 1
  if rule == 'linear':
    # Integer arithmetic: int(l / L * n) can truncate 57.0000 to 56 in floats.
    return levels * class_counts // num_levels
  if rule == 'exponential':
    return np.array([int(math.exp(l - num_levels) * n)
                     for l, n in zip(levels, class_counts)], np.int64)
  raise ValueError(f"unknown imbalance rule {rule!r}; known: ('linear', "
                   "'exponential').")


def sample_per_class(labels, counts, seed: int) -> np.ndarray:
  """Ascending indices of the first `counts[c]` examples of each class c
  after shuffling them with `default_rng([seed, c])`."""
  chosen = []
  for c, count in enumerate(counts):
    members = np.flatnonzero(labels == c)
    order = np.random.default_rng([seed, c]).permutation(len(members))
    chosen.append(members[order[:count]])
  return np.sort(np.concatenate(chosen))


def imbalanced_subset(data: pipeline.ArrayDataset, *, rule: str = 'linear',
                      seed: int = 2021) -> pipeline.ArrayDataset:
  """The imbalanced subset of `data`, in its order, renumbered; `seed`
  chooses which examples, never how many. Logs the class counts."""
  counts = np.bincount(data.labels, minlength=data.num_classes)
  subset = data.take(sample_per_class(
      data.labels, kept_counts(counts, rule=rule), seed))
  logging.info('%s-imbalanced subset: %d of %d examples; per-class counts %s',
               rule, subset.num_examples, data.num_examples,
               np.bincount(subset.labels, minlength=data.num_classes).tolist())
  return subset
