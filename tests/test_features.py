"""Frozen features of a split: each row is its example, where it was computed."""

import jax
import numpy as np

from contrastive_jax import evaluate
from contrastive_jax import runtime
from input_pipeline import pipeline

NUM, BATCH = 37, 16        # three eval batches, the last with 11 padding rows


def _split():
  rng = np.random.default_rng(0)
  return pipeline.ArrayDataset(
      rng.integers(0, 256, (NUM, 4, 4, 1), dtype=np.uint8),
      rng.integers(0, 5, NUM).astype(np.int32))


def test_every_row_is_the_example_its_index_names():
  data, mesh = _split(), runtime.create_mesh()
  # variables=None: the raw-pixel representation, x = image / 255 flattened.
  feats = evaluate.extract_features(evaluate.make_feature_fn(None, mesh), None,
                                    data, mesh, BATCH)
  x, label, mask, index = jax.device_get(tuple(feats))
  assert sorted(index.tolist()) == list(range(3 * BATCH))
  assert np.array_equal(mask, index < NUM)
  real = index[mask]
  # x = image / 255 (XLA may multiply by 1/255: within an ulp, so compare
  # the pixel values it came from).
  np.testing.assert_array_equal(
      np.rint(x[mask] * 255), data.images[real].reshape(len(real), -1))
  np.testing.assert_array_equal(label[mask], data.labels[real])


def test_rows_stay_on_the_device_that_computed_them():
  # Device d computed rows [d B / n, (d + 1) B / n) of every eval batch; the
  # split's features keep exactly those rows there (no row crosses devices,
  # or hosts on a pod).
  data, mesh = _split(), runtime.create_mesh()
  feats = evaluate.extract_features(evaluate.make_feature_fn(None, mesh), None,
                                    data, mesh, BATCH)
  per_device = BATCH // mesh.size
  devices = list(mesh.devices.flat)
  assert feats.x.sharding == feats.index.sharding == feats.label.sharding
  for shard in feats.index.addressable_shards:
    d = devices.index(shard.device)
    rows_in_batch = np.asarray(shard.data) % BATCH
    assert set(rows_in_batch.tolist()) == set(
        range(d * per_device, (d + 1) * per_device))


def test_first_rows_are_the_splits_first_examples_in_order():
  data, mesh = _split(), runtime.create_mesh()
  feats = evaluate.extract_features(evaluate.make_feature_fn(None, mesh), None,
                                    data, mesh, BATCH)
  for n, want in [(5, 5), (10 ** 6, NUM)]:
    x, label = evaluate.first_rows(feats, n)
    np.testing.assert_array_equal(np.rint(x * 255),
                                  data.images[:want].reshape(want, -1))
    np.testing.assert_array_equal(label, data.labels[:want])
