"""Input pipeline: deterministic batches, process shards, augmentation ops."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from input_pipeline import augment
from input_pipeline import pipeline


# Per-function XLA options (unlike jax_disable_most_optimizations, they do not
# leak into other test modules): the augmentation graphs compile ~3x faster.
_FAST_COMPILE = {'xla_backend_optimization_level': 0,
                 'xla_llvm_disable_expensive_passes': True}


def _data(n=100, size=8, channels=1):
  rng = np.random.default_rng(0)
  return pipeline.ArrayDataset(
      rng.integers(0, 256, (n, size, size, channels), dtype=np.uint8),
      rng.integers(0, 10, n).astype(np.int32))


def _batches(data, batch=16, seed=0):
  mesh = jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return pipeline.TrainBatches(data, global_batch_size=batch, seed=seed,
                               sharding=NamedSharding(mesh, P('data')))


def test_batches_are_a_pure_function_of_step():
  data = _data()
  a, b = _batches(data), _batches(data)
  for step in (0, 7, 3, 12):   # Any order, as after a resume.
    np.testing.assert_array_equal(np.asarray(a(step)['index']),
                                  np.asarray(b(step)['index']))
  batch = a(5)
  idx = np.asarray(batch['index'])
  np.testing.assert_array_equal(np.asarray(batch['image']), data.images[idx])
  np.testing.assert_array_equal(np.asarray(batch['label']), data.labels[idx])


def test_each_epoch_visits_distinct_examples_and_reshuffles():
  data = _data(n=100)
  b = _batches(data, batch=16)
  assert b.steps_per_epoch == 6     # 100 // 16, the remainder dropped.
  epoch0 = np.concatenate([b.global_indices(s) for s in range(6)])
  epoch1 = np.concatenate([b.global_indices(s) for s in range(6, 12)])
  assert len(set(epoch0)) == 96 and len(set(epoch1)) == 96
  assert not np.array_equal(epoch0, epoch1)
  other_seed = _batches(data, batch=16, seed=1)
  assert not np.array_equal(b.global_indices(0), other_seed.global_indices(0))


def test_process_slices_are_disjoint_and_cover_the_batch():
  batch = np.arange(100, 132)
  parts = [pipeline.process_slice(batch, i, 4) for i in range(4)]
  np.testing.assert_array_equal(np.concatenate(parts), batch)


def test_batch_size_errors():
  with pytest.raises(ValueError, match='exceeds'):
    _batches(_data(n=10), batch=16)


def test_flip_matches_numpy():
  img = jnp.asarray(np.random.default_rng(0).random((5, 7, 3)), jnp.float32)
  flipped = augment.flip_left_right(jax.random.key(0), img, p=1.0)
  np.testing.assert_array_equal(np.asarray(flipped), np.asarray(img)[:, ::-1])
  kept = augment.flip_left_right(jax.random.key(0), img, p=0.0)
  np.testing.assert_array_equal(np.asarray(kept), np.asarray(img))


def test_full_area_crop_is_identity_and_crop_resize_of_gradient_is_linear():
  # A horizontal gradient image: every crop of it, resized bilinearly, is
  # again a linear ramp in x (constant in y), with its range inside [0, 1].
  w = 16
  ramp = np.tile(np.linspace(0, 1, w, dtype=np.float32), (w, 1))[..., None]
  same = augment.random_resized_crop(jax.random.key(1), jnp.asarray(ramp),
                                     scale=(1., 1.), ratio=(1., 1.))
  np.testing.assert_allclose(np.asarray(same), ramp, atol=1e-6)
  for seed in range(5):
    out = np.asarray(augment.random_resized_crop(
        jax.random.key(seed), jnp.asarray(ramp), scale=(0.2, 0.5)))[..., 0]
    np.testing.assert_allclose(out, np.broadcast_to(out[:1], out.shape),
                               atol=1e-5)  # Constant along y.
    dx = np.diff(out[0, 1:-1])       # Borders may clamp; the inside is linear.
    assert np.all(dx > 0)
    np.testing.assert_allclose(dx, dx.mean(), atol=1e-4)
    assert out.min() >= -1e-6 and out.max() <= 1 + 1e-6


def test_pad_crop_is_a_translation():
  img = np.random.default_rng(0).random((8, 8, 1)).astype(np.float32)
  out = np.asarray(augment.pad_and_crop(jax.random.key(3), jnp.asarray(img),
                                        pad=2))
  padded = np.pad(img, ((2, 2), (2, 2), (0, 0)))
  matches = [(dy, dx) for dy in range(5) for dx in range(5)
             if np.array_equal(padded[dy:dy + 8, dx:dx + 8], out)]
  assert matches


def test_grayscale_matches_luma_and_is_identity_on_one_channel():
  img = np.random.default_rng(0).random((4, 4, 3)).astype(np.float32)
  gray = np.asarray(augment.to_grayscale(jnp.asarray(img)))
  want = 0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]
  for c in range(3):
    np.testing.assert_allclose(gray[..., c], want, atol=1e-6)
  one = img[..., :1]
  np.testing.assert_array_equal(np.asarray(augment.to_grayscale(one)), one)


def _all_presets_fn(num_views):
  """One jitted function making `num_views` views under every preset.

  One compilation per channel count instead of one per (preset, channels)
  pair keeps this test set fast; multi-crop goes through augment_views.
  """
  @functools.partial(jax.jit, compiler_options=_FAST_COMPILE)
  def fn(rng, images):
    return {name: augment.augment_views(rng, images,
                                        augment.get_views(name, num_views))
            for name in augment.PRESETS}
  return fn


@pytest.mark.parametrize('channels', [1, 3])
def test_views_shapes_ranges_determinism(channels):
  size, num_views = 14, 3
  images = jnp.asarray(_data(n=6, size=size, channels=channels).images)
  fn = _all_presets_fn(num_views)
  out = fn(jax.random.key(0), images)
  again = fn(jax.random.key(0), images)
  other = fn(jax.random.key(1), images)
  for name, views in out.items():
    assert len(views) == num_views, name
    for v, cfg in enumerate(augment.get_views(name, num_views)):
      side = size if cfg.size is None else round(cfg.size * size)
      assert views[v].shape == (6, side, side, channels), (name, v)
      assert views[v].dtype == jnp.float32, name
      x = np.asarray(views[v])
      assert x.min() >= 0. and x.max() <= 1. + 1e-6, name
      # Same key: the same views; another key: other views.
      np.testing.assert_array_equal(x, np.asarray(again[name][v]))
      assert not np.allclose(x, np.asarray(other[name][v])), (name, v)
    # Views of one image differ from each other.
    assert not np.allclose(np.asarray(views[0]), np.asarray(views[1])), name


def test_unknown_preset():
  with pytest.raises(ValueError, match='unknown augmentation preset'):
    augment.get_views('nope', 2)
