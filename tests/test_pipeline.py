"""Input pipeline: deterministic batches, process shards, augmentation ops."""

import dataclasses
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
  ids = b.host_batch.global_indices
  epoch0 = np.concatenate([ids(s) for s in range(6)])
  epoch1 = np.concatenate([ids(s) for s in range(6, 12)])
  assert len(set(epoch0)) == 96 and len(set(epoch1)) == 96
  assert not np.array_equal(epoch0, epoch1)
  other_seed = _batches(data, batch=16, seed=1)
  assert not np.array_equal(ids(0), other_seed.host_batch.global_indices(0))


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
  # One vmapped call over 5 keys: one compilation instead of 5 eager runs.
  crops = jax.jit(jax.vmap(lambda k: augment.random_resized_crop(
      k, jnp.asarray(ramp), scale=(0.2, 0.5))),
                  compiler_options=_FAST_COMPILE)(
                      jax.random.split(jax.random.key(0), 5))
  for out in np.asarray(crops)[..., 0]:
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


def _jitter_reference(img, b, c, s, hue, order):
  """SimCLR's colour jitter, one op after another on the image (float64)."""
  luma = np.array([0.299, 0.587, 0.114])
  to_yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322],
                     [0.211, -0.523, 0.312]])
  x = img.astype(np.float64)
  colour = x.shape[-1] == 3
  gray = lambda x: (x @ luma)[..., None] if colour else x
  for op in order:
    if op == 0:
      x = x * b
    elif op == 1:
      m = np.mean(gray(x))
      x = (x - m) * c + m
    elif op == 2 and colour:
      x = (x - gray(x)) * s + gray(x)
    elif op == 3 and colour:
      yiq = x @ to_yiq.T
      t = 2 * np.pi * hue
      i, q = yiq[..., 1].copy(), yiq[..., 2].copy()
      yiq[..., 1] = np.cos(t) * i - np.sin(t) * q
      yiq[..., 2] = np.sin(t) * i + np.cos(t) * q
      x = yiq @ np.linalg.inv(to_yiq).T
  return np.clip(x, 0., 1.)


@pytest.mark.parametrize('channels', [1, 3])
def test_jitter_equals_the_four_ops_applied_in_any_order(channels):
  rng = np.random.default_rng(channels)
  img = rng.random((6, 5, channels)).astype(np.float32)
  # Strong factors, so that the clip binds for some pixels.
  b, c, s, hue = 1.6, 0.3, 1.7, -0.17
  got = np.asarray(jax.jit(augment.jitter)(jnp.asarray(img), b, c, s, hue))
  assert 0 < np.mean((got == 0) | (got == 1)) < 1
  for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]):
    np.testing.assert_allclose(
        got, _jitter_reference(img, b, c, s, hue, order), atol=2e-6)


_SIZE, _NUM_VIEWS = 14, 3


@functools.cache
def _all_presets_fn():
  """One jitted function making `_NUM_VIEWS` views under every preset: one
  compilation per input shape, cached for the tests below."""
  @functools.partial(jax.jit, compiler_options=_FAST_COMPILE)
  def fn(rng, images):
    return {name: augment.augment_batch(rng, images,
                                        augment.get_views(name, _NUM_VIEWS))
            for name in augment.PRESETS}
  return fn


@pytest.mark.parametrize('channels', [1, 3])
def test_views_shapes_ranges_determinism(channels):
  images = jnp.asarray(_data(n=6, size=_SIZE, channels=channels).images)
  fn = _all_presets_fn()
  out = fn(jax.random.key(0), images)
  again = fn(jax.random.key(0), images)
  other = fn(jax.random.key(1), images)
  for name, views in out.items():
    assert views.shape == (6, _NUM_VIEWS, _SIZE, _SIZE, channels), name
    assert views.dtype == jnp.float32, name
    for v in range(_NUM_VIEWS):
      x = np.asarray(views[:, v])
      assert x.min() >= 0. and x.max() <= 1. + 1e-6, name
      # Same key: the same views; another key: other views.
      np.testing.assert_array_equal(x, np.asarray(again[name][:, v]))
      assert not np.allclose(x, np.asarray(other[name][:, v])), (name, v)
    # Views of one image differ from each other.
    assert not np.allclose(np.asarray(views[:, 0]), np.asarray(views[:, 1])), (
        name)


def test_one_channel_equals_replicated_gray_channels():
  # Colour ops on a gray image are identities (saturation, hue, random
  # grayscale), so under every preset a 1-channel image and the same image
  # replicated to 3 channels give the same views, channel for channel: the
  # grayscale path is the colour path on a replicated channel.
  gray = _data(n=6, size=_SIZE, channels=1).images
  fn = _all_presets_fn()       # Same shapes as above: no new compilation.
  one = fn(jax.random.key(0), jnp.asarray(gray))
  three = fn(jax.random.key(0), jnp.asarray(np.repeat(gray, 3, axis=-1)))
  for name in one:
    for a, b in zip(one[name], three[name]):
      a, b = np.asarray(a)[..., 0], np.asarray(b)
      for c in range(3):
        np.testing.assert_allclose(b[..., c], a, atol=2e-5, err_msg=name)


def test_unknown_preset():
  with pytest.raises(ValueError, match='unknown augmentation preset'):
    augment.get_views('nope', 2)


def test_crop_resize_to_half_size_matches_numpy_block_mean():
  # The full image resized bilinearly (no antialiasing) to half its side
  # samples input coordinate 2i + 0.5: the mean of each 2x2 block.
  img = np.random.default_rng(0).random((8, 12, 3)).astype(np.float32)
  out = augment.random_resized_crop(jax.random.key(0), jnp.asarray(img),
                                    scale=(1., 1.), ratio=(1., 1.),
                                    size=(4, 6))
  want = img.reshape(4, 2, 6, 2, 3).mean(axis=(1, 3))
  np.testing.assert_allclose(np.asarray(out), want, atol=1e-6)


def test_random_crop_of_gradient_to_another_size_is_a_linear_ramp():
  w = 16
  ramp = np.tile(np.linspace(0, 1, w, dtype=np.float32), (w, 1))[..., None]
  out = np.asarray(augment.random_resized_crop(
      jax.random.key(4), jnp.asarray(ramp), scale=(0.3, 0.6), size=(6, 7)))
  assert out.shape == (6, 7, 1)
  out = out[..., 0]
  np.testing.assert_allclose(out, np.broadcast_to(out[:1], out.shape),
                             atol=1e-5)
  dx = np.diff(out[0, 1:-1])
  assert np.all(dx > 0)
  np.testing.assert_allclose(dx, dx.mean(), atol=1e-4)


def test_solarize_matches_numpy():
  img = np.random.default_rng(0).random((5, 5, 3)).astype(np.float32)
  out = augment.solarize(jax.random.key(0), jnp.asarray(img), p=1.0)
  np.testing.assert_array_equal(np.asarray(out),
                                np.where(img < 0.5, img, 1. - img))
  kept = augment.solarize(jax.random.key(0), jnp.asarray(img), p=0.0)
  np.testing.assert_array_equal(np.asarray(kept), img)


def test_blur_keeps_constants_and_range():
  const = jnp.full((10, 10, 3), 0.3, jnp.float32)
  out = augment.gaussian_blur(jax.random.key(0), const, p=1.0)
  np.testing.assert_allclose(np.asarray(out), 0.3, atol=1e-6)
  img = np.random.default_rng(0).random((10, 10, 1)).astype(np.float32)
  out = np.asarray(augment.gaussian_blur(jax.random.key(1), jnp.asarray(img),
                                         p=1.0))
  assert img.min() - 1e-6 <= out.min() and out.max() <= img.max() + 1e-6
  assert out.std() < img.std()       # Smoothing lowers the variance.


def test_random_erase_zeroes_one_rectangle():
  img = 0.5 + 0.5 * np.random.default_rng(0).random((12, 12, 1),
                                                    ).astype(np.float32)
  out = np.asarray(augment.random_erase(jax.random.key(2), jnp.asarray(img),
                                        p=1.0))[..., 0]
  zero = out == 0
  ys, xs = np.nonzero(zero)
  assert zero.any()
  box = np.zeros_like(zero)
  box[ys.min():ys.max() + 1, xs.min():xs.max() + 1] = True
  np.testing.assert_array_equal(zero, box)   # Exactly a filled rectangle.
  np.testing.assert_array_equal(out[~zero], img[..., 0][~zero])


def test_build_views_applies_per_view_overrides():
  views = augment.build_views('simclr', 2, ({'blur_p': 1.0},
                                            {'blur_p': 0.1, 'solarize_p': 0.2}))
  assert (views[0].blur_p, views[0].solarize_p) == (1.0, 0.0)
  assert (views[1].blur_p, views[1].solarize_p) == (0.1, 0.2)
  assert views[0].jitter_strength == 1.0     # Untouched fields: the preset's.
  # One override applies to every view; lists from a config become tuples.
  views = augment.build_views('fmnist', 4, [{'crop_scale': [0.5, 1.0]}])
  assert all(v.crop_scale == (0.5, 1.0) for v in views) and len(views) == 4
  assert augment.build_views('byol', 2) == augment.get_views('byol', 2)


def test_build_views_from_an_ml_collections_config():
  import ml_collections  # pylint: disable=g-import-not-at-top
  cfg = ml_collections.ConfigDict()
  cfg.preset = 'simclr'
  cfg.num_views = 2
  cfg.overrides = ({'blur_p': 1.0}, {'blur_p': 0.1, 'solarize_p': 0.2})
  views = augment.build_views(cfg.preset, cfg.num_views, cfg.overrides)
  assert views == augment.PRESETS['byol']   # BYOL's pair, rebuilt.


@pytest.mark.parametrize('kwargs, match', [
    (dict(num_views=0), 'out of range'),
    (dict(num_views=11), 'out of range'),
    (dict(num_views=2, overrides=({'blurr_p': 1.},)), 'unknown ViewConfig'),
    (dict(num_views=3, overrides=({}, {})), '2 view overrides for 3'),
    (dict(num_views=2, overrides=({'flip_p': 1.5},)), 'not a probability'),
    (dict(num_views=2, overrides=({'crop_scale': (0.5, 0.2)},)),
     'crop_scale'),
])
def test_build_views_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    augment.build_views('simclr', **kwargs)


def _factors(amounts, n=512):
  """The jitter factor each op drew, recovered from the output of n keys.

  One 2-pixel image with colours x0, x1 goes through `color_jitter` with
  p = 1, and the affine maps of `augment.jitter` are inverted in numpy on
  YIQ coordinates (luma Y, chroma (I, Q)): brightness b scales the mean luma
  (contrast, saturation and hue keep it); contrast c then scales the two
  pixels' luma difference by b c; saturation s scales chroma by b c s; hue
  rotates chroma by its angle in turns.
  """
  x = np.array([[[0.5, 0.3, 0.2], [0.3, 0.4, 0.35]]], np.float32)
  fn = jax.jit(jax.vmap(lambda k: augment.color_jitter(
      k, jnp.asarray(x), amounts=amounts, p=1.)))
  y = np.asarray(fn(jax.random.split(jax.random.key(0), n)), np.float64)
  to_yiq = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322],
                     [0.211, -0.523, 0.312]])
  xq, yq = x[0].astype(np.float64) @ to_yiq.T, y[:, 0] @ to_yiq.T
  b = yq[:, :, 0].mean(-1) / xq[:, 0].mean()
  c = (yq[:, 0, 0] - yq[:, 1, 0]) / (xq[0, 0] - xq[1, 0]) / b
  s = (np.linalg.norm(yq[:, 0, 1:], axis=-1) / np.linalg.norm(xq[0, 1:])
       / (b * c))
  hue = (np.arctan2(yq[:, 0, 2], yq[:, 0, 1])
         - np.arctan2(xq[0, 2], xq[0, 1])) / (2 * np.pi)
  return {'brightness': b, 'contrast': c, 'saturation': s, 'hue': hue}


@pytest.mark.parametrize('op, amounts, lo, hi', [
    ('brightness', (0.4, 0., 0., 0.), 0.6, 1.4),
    ('contrast', (0., 0.3, 0., 0.), 0.7, 1.3),
    ('saturation', (0., 0., 0.2, 0.), 0.8, 1.2),
    ('hue', (0., 0., 0., 0.1), -0.1, 0.1),
])
def test_color_jitter_draws_each_amount_from_its_own_range(op, amounts, lo,
                                                           hi):
  # ColorJitter(b, c, s, h): factors U[1 - a, 1 + a], hue U[-h, h] turns;
  # the other three ops stay the identity.
  got = _factors(amounts)
  span = hi - lo
  assert got[op].min() >= lo - 1e-4 and got[op].max() <= hi + 1e-4
  assert got[op].min() < lo + 0.05 * span and got[op].max() > hi - 0.05 * span
  for other in set(got) - {op}:
    np.testing.assert_allclose(got[other], 0. if other == 'hue' else 1.,
                               atol=1e-5)


def test_jitter_strength_is_simclrs_shorthand_for_the_four_amounts():
  # Strength s = amounts (0.8 s, 0.8 s, 0.8 s, 0.2 s): the same views for
  # the same key whichever way the recipe says it.
  images = jax.random.uniform(jax.random.key(2), (4, 16, 16, 3))
  for s in (1.0, 0.5):
    short = (dataclasses.replace(augment.PRESETS['simclr'][0],
                                 jitter_strength=s),) * 2
    full = (dataclasses.replace(short[0], jitter_strength=0.,
                                jitter=(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)),
            ) * 2
    np.testing.assert_array_equal(
        np.asarray(augment.augment_batch(jax.random.key(7), images, short)),
        np.asarray(augment.augment_batch(jax.random.key(7), images, full)))
  views = augment.build_views('simclr', 2, ({'jitter': [0.4, 0.4, 0.2, 0.1]},))
  assert views[0].jitter_amounts() == (0.4, 0.4, 0.2, 0.1)
  with pytest.raises(ValueError, match='four amounts'):
    augment.build_views('simclr', 2, ({'jitter': (0.4, 0.4, 0.2)},))
