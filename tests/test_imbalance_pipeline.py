"""Class-imbalanced subsets: counts follow CACR's rules exactly."""

import logging

import numpy as np
import pytest

from input_pipeline import imbalance
from input_pipeline import pipeline

# Kept per class on CIFAR-10 (5000 per class), from the CACR code's rules
# (docs/configs.md, "Class-imbalanced data"), computed by hand, not by the
# code under test: linear p = l/10, exponential p = e^l / e^10, int()
# truncation.
CIFAR10_LINEAR = [500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000]
CIFAR10_EXP = [0, 1, 4, 12, 33, 91, 248, 676, 1839, 5000]
# CIFAR-100 (500 per class), per group of 10 consecutive classes.
CIFAR100_LINEAR_GROUP = [50, 100, 150, 200, 250, 300, 350, 400, 450, 500]
CIFAR100_EXP_GROUP = [0, 0, 0, 1, 3, 9, 24, 67, 183, 500]


def _balanced(num_classes, per_class, seed=0):
  """A shuffled balanced dataset; each 1x1 'image' stores its example id."""
  labels = np.repeat(np.arange(num_classes), per_class)
  labels = np.random.default_rng(seed).permutation(labels).astype(np.int32)
  ids = np.arange(len(labels))
  images = ids.astype(np.uint32).view(np.uint8).reshape(-1, 1, 1, 4)
  return pipeline.ArrayDataset(images, labels)


def _ids(data):
  return data.images.reshape(-1, 4).copy().view(np.uint32)[:, 0]


@pytest.mark.parametrize('rule, want, total', [
    ('linear', CIFAR10_LINEAR, 27_500),
    ('exponential', CIFAR10_EXP, 7_904),
])
def test_cifar10_counts_match_the_paper_rules(rule, want, total):
  data = _balanced(10, 5000)
  sub = imbalance.imbalanced_subset(data, rule=rule)
  counts = np.bincount(sub.labels, minlength=10)
  np.testing.assert_array_equal(counts, want)
  assert sub.num_examples == total
  # Images stay with their labels, in the original order.
  ids = _ids(sub)
  assert np.all(np.diff(ids) > 0)
  np.testing.assert_array_equal(data.labels[ids], sub.labels)


@pytest.mark.parametrize('rule, group, total', [
    ('linear', CIFAR100_LINEAR_GROUP, 27_500),
    ('exponential', CIFAR100_EXP_GROUP, 7_870),
])
def test_cifar100_counts_per_group_of_ten_classes(rule, group, total):
  data = _balanced(100, 500)
  sub = imbalance.imbalanced_subset(data, rule=rule)
  counts = np.bincount(sub.labels, minlength=100)
  np.testing.assert_array_equal(counts, np.repeat(group, 10))
  assert sub.num_examples == total


def test_uneven_classes_use_each_class_count():
  # Class c has 7 + 3c examples; 4 levels over 4 classes: keep l/4 of each.
  labels = np.concatenate([np.full(7 + 3 * c, c, np.int32) for c in range(4)])
  data = pipeline.ArrayDataset(np.zeros((len(labels), 1, 1, 1), np.uint8),
                               labels)
  sub = imbalance.imbalanced_subset(data, rule='linear')
  counts = np.bincount(sub.labels, minlength=4)
  want = [(c + 1) * (7 + 3 * c) // 4 for c in range(4)]   # 1, 5, 9, 16
  np.testing.assert_array_equal(counts, want)


def test_deterministic_in_the_seed_and_counts_independent_of_it():
  data = _balanced(10, 200)
  a = imbalance.imbalanced_subset(data, rule='linear', seed=3)
  b = imbalance.imbalanced_subset(data, rule='linear', seed=3)
  c = imbalance.imbalanced_subset(data, rule='linear', seed=4)
  np.testing.assert_array_equal(_ids(a), _ids(b))
  assert not np.array_equal(_ids(a), _ids(c))
  np.testing.assert_array_equal(np.bincount(a.labels), np.bincount(c.labels))


def test_logs_the_class_counts(caplog):
  caplog.set_level(logging.INFO)
  imbalance.imbalanced_subset(_balanced(10, 100), rule='exponential')
  # int(100 e^(l-10)): e^-4 = 0.018 -> 1, e^-3 -> 4, e^-2 -> 13, e^-1 -> 36.
  assert '[0, 0, 0, 0, 0, 1, 4, 13, 36, 100]' in caplog.text


def test_unknown_rule():
  with pytest.raises(ValueError, match='unknown imbalance rule'):
    imbalance.imbalanced_subset(_balanced(10, 10), rule='step')
