"""Streaming tf.data path: process shards, determinism, resume, eval crops."""

import jax
import numpy as np
import pytest
import tensorflow as tf
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from input_pipeline import pipeline
from input_pipeline import streaming

tf.config.set_visible_devices([], 'GPU')

N, SIDE = 37, 6


def _arrays():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (N, SIDE, SIDE, 1), dtype=np.uint8)
  labels = rng.integers(0, 10, N)
  return images, labels


def _ds():
  images, labels = _arrays()
  return tf.data.Dataset.from_tensor_slices({'image': images,
                                             'label': labels})


def _sharding():
  mesh = jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return NamedSharding(mesh, P('data'))


def _train(process_index, process_count=2, seed=0, batch=8):
  return streaming.StreamingTrainBatches(
      _ds(), global_batch_size=batch, image_size=SIDE, seed=seed,
      sharding=_sharding(), shuffle_buffer=64,
      process_index=process_index, process_count=process_count)


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_process_ranges_are_disjoint_and_cover():
  for n, k in [(37, 2), (10, 3), (8, 8)]:
    ranges = [streaming.process_range(n, i, k) for i in range(k)]
    covered = np.concatenate([np.arange(a, b) for a, b in ranges])
    np.testing.assert_array_equal(covered, np.arange(n))
    assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


def test_two_processes_eval_shards_are_disjoint_and_cover_the_split():
  images, labels = _arrays()
  seen, num_batches = [], []
  for proc in (0, 1):
    batches = list(streaming.eval_batches(
        _ds(), batch_size=8, image_size=SIDE, sharding=_sharding(),
        process_index=proc, process_count=2, to_mesh=False))
    num_batches.append(len(batches))
    for b in batches:
      assert b['image'].shape == (4, SIDE, SIDE, 1)
      assert b['image'].dtype == np.uint8 and b['label'].dtype == np.int32
      idx = b['index'][b['mask']]
      np.testing.assert_array_equal(b['image'][b['mask']], images[idx])
      np.testing.assert_array_equal(b['label'][b['mask']], labels[idx])
      assert not b['image'][~b['mask']].any()       # Padding rows are zero.
      seen.append(idx)
  assert num_batches[0] == num_batches[1] == 5     # ceil(19 / 4).
  seen = np.concatenate(seen)
  np.testing.assert_array_equal(np.sort(seen), np.arange(N))  # Disjoint, all.


def test_two_processes_train_shards_are_disjoint_within_an_epoch():
  per_proc = []
  for proc in (0, 1):
    stream = _train(proc)
    assert stream.steps_per_epoch == 4               # (37 // 2) // 4.
    batches = _take(stream.host_batches(), stream.steps_per_epoch)
    idx = np.concatenate([b['index'] for b in batches])
    images, labels = _arrays()
    for b in batches:
      np.testing.assert_array_equal(b['image'], images[b['index']])
      np.testing.assert_array_equal(b['label'], labels[b['index']])
    assert len(set(idx)) == 16                       # No repeats in an epoch.
    lo, hi = streaming.process_range(N, proc, 2)
    assert idx.min() >= lo and idx.max() < hi        # Only its own range.
    per_proc.append(set(idx))
  assert not per_proc[0] & per_proc[1]


def test_same_seed_same_order_and_resume_continues_exactly():
  stream = _train(1)
  ref = _take(stream.host_batches(), 10)             # 2.5 epochs of 4 steps.
  again = _take(_train(1).host_batches(), 10)
  for a, b in zip(ref, again):
    np.testing.assert_array_equal(a['index'], b['index'])
  for start in (3, 4, 6):       # Mid-epoch, an epoch boundary, next epoch.
    resumed = _take(_train(1).host_batches(start), 10 - start)
    for a, b in zip(ref[start:], resumed):
      np.testing.assert_array_equal(a['index'], b['index'])
      np.testing.assert_array_equal(a['image'], b['image'])
  # Epochs reshuffle; another seed gives another order.
  epoch0 = np.concatenate([b['index'] for b in ref[:4]])
  epoch1 = np.concatenate([b['index'] for b in ref[4:8]])
  assert not np.array_equal(epoch0, epoch1)
  other = _take(_train(1, seed=1).host_batches(), 4)
  assert not np.array_equal(epoch0,
                            np.concatenate([b['index'] for b in other]))


def test_batches_land_on_the_mesh():
  stream = _train(0, process_count=1, batch=16)
  batch = next(stream.iterate(0))
  assert batch['image'].shape == (16, SIDE, SIDE, 1)
  assert batch['image'].sharding == _sharding()
  assert {k: v.dtype for k, v in batch.items()} == {
      'image': np.uint8, 'label': np.int32, 'index': np.int32}


def test_decode_and_crop_references():
  rng = np.random.default_rng(0)
  # Encoded PNG of the target size: decoded unchanged.
  img = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
  out = streaming.decode_and_crop(tf.io.encode_png(img), 6, channels=3)
  np.testing.assert_array_equal(out.numpy(), img)
  # Shorter side already the target: only the centre crop, a numpy slice.
  wide = rng.integers(0, 256, (6, 10, 1), dtype=np.uint8)
  out = streaming.decode_and_crop(tf.constant(wide), 6)
  np.testing.assert_array_equal(out.numpy(), wide[:, 2:8])
  # Eval crop_fraction 0.5 of an 8x8 image at size 4: resize to 8 (no-op),
  # then the central 4x4.
  sq = rng.integers(0, 256, (8, 8), dtype=np.uint8)
  out = streaming.decode_and_crop(tf.constant(sq), 4, crop_fraction=0.5)
  np.testing.assert_array_equal(out.numpy()[..., 0], sq[2:6, 2:6])
  # Halving a horizontal ramp 30 x: a symmetric filter keeps a linear ramp,
  # so interior output column j samples x = 2j + 0.5, i.e. 60 j + 15.
  ramp = np.tile(30 * np.arange(8, dtype=np.uint8), (8, 1))[..., None]
  out = streaming.decode_and_crop(tf.constant(ramp), 4).numpy()[..., 0]
  assert out.shape == (4, 4) and out.dtype == np.uint8
  np.testing.assert_array_equal(out[:, 1:3], [[75, 135]] * 4)
  assert out.min() >= 0 and out.max() <= 210


def test_tfds_fashion_mnist_process_shard_matches_load_split():
  # The TFDS path: process 1 of 2 reads test[5000:10000] (prepared offline at
  # /tmp/tfds_test, as the other dataset tests use).
  test = pipeline.load_split('fashion_mnist', 'test', '/tmp/tfds_test')
  batch = next(streaming.eval_batches(
      'fashion_mnist', split='test', data_dir='/tmp/tfds_test', batch_size=16,
      image_size=28, sharding=_sharding(), process_index=1, process_count=2,
      to_mesh=False))
  np.testing.assert_array_equal(batch['index'], np.arange(5000, 5008))
  np.testing.assert_array_equal(batch['image'], test.images[5000:5008])
  np.testing.assert_array_equal(batch['label'], test.labels[5000:5008])


def test_errors():
  with pytest.raises(ValueError, match='not divisible'):
    _train(0, process_count=3, batch=8)
  with pytest.raises(ValueError, match='exceeds'):
    _train(0, batch=64)
  unknown = _ds().filter(lambda ex: True)
  with pytest.raises(ValueError, match='cardinality'):
    _train_from(unknown)


def _train_from(ds):
  return streaming.StreamingTrainBatches(
      ds, global_batch_size=8, image_size=SIDE, seed=0, sharding=_sharding())
