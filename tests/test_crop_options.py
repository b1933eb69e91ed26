"""Where crops are cut and in what order the ops run.

config.dataset.train_crop_source ('full_image': each view's random resized
crop cut on the host from the full decoded image, for pretraining and the
linear probe), config.dataset.eval_crop_fraction (Resize(size / fraction) +
CenterCrop(size) of every evaluation image), config.dataset.resize ('squash':
Resize((size, size)) of the whole image) and config.augment.op_order
(grayscale before jitter, as InsDis). References are PIL and numpy
computations of the torchvision rules.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from configs import default as default_config
from configs import test as test_config
from contrastive_jax import config_lib
from input_pipeline import augment
from input_pipeline import pipeline
from input_pipeline import sources

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (height, width) of the folder's images: at both resized shorter sides the
# tests use (14, 16) the longer side is a whole number (torchvision's int()
# and this code's round() agree) and every centre-crop margin is even (no
# half-pixel rounding to tell the two rules apart).
SIZES = ((28, 56), (56, 28), (42, 42), (35, 70))


def _dataset(**fields):
  """configs/test.py's resolved config.dataset with `fields` set."""
  config = config_lib.with_defaults(test_config.get_config())
  config.dataset.update(fields)
  return config.dataset


def _column_image(height, width, channels=3):
  """Pixel value = column index: where a crop came from is in its values."""
  return np.tile(np.arange(width, dtype=np.uint8)[None, :, None],
                 (height, 1, channels))


@pytest.fixture(scope='module')
def mixed_folder(tmp_path_factory):
  """root/{train,test}/{a,b}/*.png, lossless, of the SIZES."""
  root = tmp_path_factory.mktemp('mixed')
  rng = np.random.default_rng(0)
  for split, per_class in (('train', 8), ('test', 4)):
    for c, name in enumerate('ab'):
      d = root / split / name
      d.mkdir(parents=True)
      for i in range(per_class):
        h, w = SIZES[i % len(SIZES)]
        img = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
        img[..., c] = np.arange(w, dtype=np.uint8)[None, :] * 3
        Image.fromarray(img).save(d / f'{i:02d}.png')
  return str(root)


# --------------------------------------------------------------------------
# The host's random resized crop of the full image.
# --------------------------------------------------------------------------

def test_crop_boxes_respect_scale_and_ratio_and_reach_every_border():
  height, width = 200, 300
  rng = np.random.default_rng(0)
  boxes = [sources.crop_box(rng, height, width, (0.08, 1.0), (3 / 4, 4 / 3))
           for _ in range(2000)]
  area = np.array([h * w for _, _, h, w in boxes]) / (height * width)
  for top, left, h, w in boxes:
    assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
    # Sides are rounded from sqrt(area * r), sqrt(area / r): half a pixel.
    assert (w - 0.5) / (h + 0.5) <= 4 / 3 and (w + 0.5) / (h - 0.5) >= 3 / 4
    assert (h + 0.5) * (w + 0.5) >= 0.08 * height * width
  assert area.min() < 0.12 and area.max() > 0.85
  # The borders the centre square (columns 50..249) cuts off are reached.
  assert min(left for _, left, _, _ in boxes) == 0
  assert max(left + w for _, left, _, w in boxes) == width
  assert min(top for top, _, _, _ in boxes) == 0
  assert max(top + h for top, _, h, _ in boxes) == height
  assert np.mean([left < 50 or left + w > 250
                  for _, left, _, w in boxes]) > 0.3


def test_a_fixed_scale_and_ratio_give_that_box_and_a_thin_image_the_fallback():
  rng = np.random.default_rng(1)
  for _ in range(20):
    _, _, h, w = sources.crop_box(rng, 100, 100, (0.5, 0.5), (1., 1.))
    assert (h, w) == (71, 71)    # round(sqrt(5000))
  # 10 x 1000: no box of aspect <= 4/3 and area >= 8% fits in 10 tries;
  # torchvision's fallback is the centred box of the largest allowed ratio.
  for _ in range(5):
    assert sources.crop_box(rng, 10, 1000, (0.08, 1.), (3 / 4, 4 / 3)) == (
        0, (1000 - 13) // 2, 10, 13)


def test_random_crop_equals_pil_crop_and_resize_of_the_full_image(
    monkeypatch):
  img = _column_image(60, 200)
  monkeypatch.setattr(sources, 'crop_box', lambda *a: (5, 140, 40, 56))
  crops = sources.RandomCrops((((0.08, 1.), (0.75, 4 / 3)),), seed=0)
  out = crops.at(3)(img, 0, 28, 3)
  assert out.shape == (1, 28, 28, 3) and out.dtype == np.uint8
  want = np.asarray(Image.fromarray(img).crop((140, 5, 196, 45)).resize(
      (28, 28), Image.BILINEAR))
  np.testing.assert_array_equal(out[0], want)
  # The ramp in numpy: output column j samples column 140 + 2 (j + 0.5) - 0.5.
  j = np.arange(2, 26)
  np.testing.assert_allclose(out[0, 10, j, 0], 140 + 2 * j + 0.5, atol=1)
  # Columns 140..195: beyond the centre square's 70..129.
  assert out.min() >= 139


def test_random_crops_are_a_function_of_seed_step_example_and_view():
  img = _column_image(60, 200)
  box = ((0.08, 1.), (0.75, 4 / 3))
  three = sources.RandomCrops((box,) * 3, seed=0)
  a = three.at(5)(img, 11, 16, 3)
  np.testing.assert_array_equal(a, three.at(5)(img, 11, 16, 3))
  assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[1], a[2])
  one = sources.RandomCrops((box,), seed=0)
  np.testing.assert_array_equal(one.at(5)(img, 11, 16, 3)[0], a[0])
  for other in (three.at(6)(img, 11, 16, 3), three.at(5)(img, 12, 16, 3),
                sources.RandomCrops((box,) * 3, seed=1).at(5)(img, 11, 16, 3)):
    assert not np.array_equal(other[0], a[0])
  # Over many steps the crops cover columns 0..199 of the full image.
  lows = [sources.RandomCrops((box,), 0).at(s)(img, 0, 16, 3).min()
          for s in range(60)]
  highs = [sources.RandomCrops((box,), 0).at(s)(img, 0, 16, 3).max()
           for s in range(60)]
  assert min(lows) < 20 and max(highs) > 180
  # A view without a random crop gets the centre square.
  mixed = sources.RandomCrops((box, None), seed=0).at(5)(img, 11, 16, 3)
  np.testing.assert_array_equal(mixed[1], sources.fit_square(img, 16, 3))


def test_host_crops_stream_the_same_for_any_number_of_processes(
    mixed_folder):
  source = sources.ImageFolder(mixed_folder, 'train', image_size=14)
  views = augment.build_views('simclr', 2)
  fit = sources.training_fit(_dataset(train_crop_source='full_image'),
                             views, seed=3)
  assert isinstance(fit, sources.RandomCrops)
  batch = lambda pid, n: pipeline._HostBatch(  # pylint: disable=protected-access
      source, 3, len(source), 8, pid, n, fit)
  whole = batch(0, 1)(5)
  assert whole['image'].shape == (8, 2, 14, 14, 3)
  halves = [batch(p, 2)(5)['image'] for p in (0, 1)]
  np.testing.assert_array_equal(np.concatenate(halves), whole['image'])
  assert not np.array_equal(batch(0, 1)(6)['image'], whole['image'])
  # Each crop is a crop of the full file: PIL on the box the draw gives.
  i = int(whole['index'][0])
  full = np.asarray(Image.open(source.files[i]).convert('RGB'))
  rng = np.random.default_rng([sources._CROP_STREAM, 3, 5, i, 1])  # pylint: disable=protected-access
  top, left, h, w = sources.crop_box(rng, *full.shape[:2], *fit.boxes[1])
  want = Image.fromarray(full).crop((left, top, left + w, top + h)).resize(
      (14, 14), Image.BILINEAR)
  np.testing.assert_array_equal(whole['image'][0, 1], np.asarray(want))


# --------------------------------------------------------------------------
# Evaluation images: Resize(size / fraction) + CenterCrop(size).
# --------------------------------------------------------------------------

def _torchvision_eval(path, size, resize):
  """Resize(resize) + CenterCrop(size) on PIL, torchvision's rules: the
  shorter side to `resize`, the longer int(resize * long / short); the crop
  at int(round(margin / 2))."""
  im = Image.open(path).convert('RGB')
  w, h = im.size
  if w <= h:
    nw, nh = resize, int(resize * h / w)
  else:
    nw, nh = int(resize * w / h), resize
  im = im.resize((nw, nh), Image.BILINEAR)
  top, left = int(round((nh - size) / 2)), int(round((nw - size) / 2))
  return np.asarray(im.crop((left, top, left + size, top + size)))


@pytest.mark.parametrize('fraction,resize', [(0.875, 16), (1.0, 14)])
def test_eval_images_are_resize_and_center_crop(mixed_folder, fraction,
                                                resize):
  source = sources.ImageFolder(mixed_folder, 'test', image_size=14,
                               fit=sources.CenterSquare(fraction))
  got = source.read(np.arange(len(source)))['image']
  assert got.shape == (len(source), 14, 14, 3)
  for k, path in enumerate(source.files):
    np.testing.assert_array_equal(got[k], _torchvision_eval(path, 14, resize))
  if fraction == 1.0:   # What every read gave before the option existed.
    plain = sources.ImageFolder(mixed_folder, 'test', image_size=14)
    np.testing.assert_array_equal(plain.read(np.arange(len(plain)))['image'],
                                  got)


def test_eval_crop_keeps_the_central_fraction_of_a_column_ramp():
  img = _column_image(64, 128)        # Resize(256 -> 224 / 0.875) of 64 px.
  out = sources.CenterSquare(0.875)(img, 0, 56, 3)     # 56 / 0.875 = 64
  assert out.shape == (56, 56, 3)
  # No resize (64 is the shorter side already); columns 36..91 of 128.
  np.testing.assert_array_equal(out[0, :, 0], np.arange(36, 92))


def test_a_training_read_takes_the_whole_square_whatever_the_eval_fraction(
    mixed_folder):
  source = sources.ImageFolder(mixed_folder, 'train', image_size=14,
                               fit=sources.CenterSquare(0.875))
  fit = sources.training_fit(_dataset(eval_crop_fraction=0.875))
  assert fit == sources.CenterSquare(1.0)
  whole = sources.ImageFolder(mixed_folder, 'train', image_size=14)
  ids = np.arange(6)
  np.testing.assert_array_equal(source.read(ids, fit=fit)['image'],
                                whole.read(ids)['image'])
  assert not np.array_equal(source.read(ids)['image'], whole.read(ids)['image'])


# --------------------------------------------------------------------------
# resize='squash': the whole image to size x size, for every read.
# --------------------------------------------------------------------------

def test_squash_is_pil_resize_of_the_whole_image_for_every_read(mixed_folder):
  dataset = _dataset(name='image_folder', data_dir=mixed_folder,
                     image_size=14, resize='squash', in_memory=False)
  sources.check_crop_options(dataset)
  for split in ('train', 'test'):
    source = sources.open_split(dataset, split)
    got = source.read(np.arange(len(source)))['image']
    for k, path in enumerate(source.files):
      # torchvision's Resize((14, 14)) on a PIL image is PIL's resize.
      want = Image.open(path).convert('RGB').resize((14, 14), Image.BILINEAR)
      np.testing.assert_array_equal(got[k], np.asarray(want))
  # Not the shorter-side square: the non-square images lose their sides.
  plain = sources.ImageFolder(mixed_folder, 'test', image_size=14)
  assert not np.array_equal(plain.read([0, 1])['image'], got[:2])
  # Held in memory, the squashed images are what training and evaluation
  # both read.
  held = sources.open_split(dict_update(dataset, in_memory=True), 'test')
  np.testing.assert_array_equal(held.images, got)
  # Training reads the source's own squashed image; full_image views without
  # a random crop get it too.
  assert sources.training_fit(dataset) is None
  fit = sources.training_fit(dict_update(dataset,
                                         train_crop_source='full_image'),
                             (augment.ViewConfig(crop_scale=None),), seed=0)
  img = np.asarray(Image.open(source.files[0]).convert('RGB'))
  np.testing.assert_array_equal(fit(img, 0, 14, 3)[0], got[0])


def test_squash_of_a_column_ramp_keeps_every_column():
  out = sources.fit_square(_column_image(32, 128), 32, 3, squash=True)
  assert out.shape == (32, 32, 3)
  # 128 columns into 32: output column j averages columns 4j..4j+3 (PIL's
  # antialiased bilinear: a triangle of support 4 around 4j + 1.5).
  np.testing.assert_allclose(out[0, :, 0], 4 * np.arange(32) + 1.5, atol=1)
  with pytest.raises(ValueError, match='fraction must be 1'):
    sources.fit_square(_column_image(32, 128), 32, 3, 0.875, squash=True)


def dict_update(dataset, **fields):
  copy = dataset.copy_and_resolve_references()
  copy.update(fields)
  return copy


@pytest.mark.parametrize('dataset,match', [
    ({'train_crop_source': 'full_image'}, 'in memory'),
    ({'eval_crop_fraction': 0.875}, 'in memory'),
    ({'name': 'npz', 'in_memory': False, 'eval_crop_fraction': 0.875},
     'name=npz'),
    ({'in_memory': False, 'image_size': None, 'eval_crop_fraction': 0.875},
     'image_size is None'),
    ({'in_memory': False, 'eval_crop_fraction': 0.}, r'in \(0, 1\]'),
    ({'in_memory': False, 'eval_crop_fraction': 1.2}, r'in \(0, 1\]'),
    ({'in_memory': False, 'train_crop_source': 'random'}, 'center_square'),
    ({'in_memory': False, 'resize': 'crop'}, 'shorter_side, squash'),
    ({'in_memory': False, 'resize': 'squash', 'eval_crop_fraction': 0.875},
     'nothing to centre-crop'),
    ({'resize': 'squash', 'name': 'npz'}, 'npz split'),
    ({'resize': 'squash', 'image_size': None}, 'image_size'),
    ({'resize': 'squash', 'in_memory': True,
      'train_crop_source': 'full_image'},
     # The in-memory refusal names the option that needs streaming only.
     r"train_crop_source='full_image' act where(?!.*squash)"),
])
def test_crop_options_a_dataset_cannot_take_are_refused(dataset, match):
  config = config_lib.with_defaults(test_config.get_config())
  config.dataset.update({'name': 'image_folder', 'image_size': 16,
                         **dataset})
  with pytest.raises(ValueError, match=match):
    sources.check_crop_options(config.dataset)


def test_an_in_memory_split_refuses_a_fit():
  data = pipeline.ArrayDataset(np.zeros((4, 8, 8, 3), np.uint8),
                               np.zeros(4, np.int32))
  with pytest.raises(ValueError, match='in_memory=False'):
    data.read([0, 1], fit=sources.CenterSquare())


def test_the_default_and_test_configs_keep_todays_paths():
  for get in (default_config.get_config, test_config.get_config):
    config = config_lib.with_defaults(get())
    assert config.dataset.train_crop_source == 'center_square'
    assert config.dataset.eval_crop_fraction == 1.0
    assert config.augment.op_order == ', '.join(augment.DEFAULT_OP_ORDER)
    views = augment.build_views(config.augment.preset,
                                config.augment.num_views,
                                config.augment.overrides,
                                config.augment.op_order)
    assert views == augment.build_views(config.augment.preset,
                                        config.augment.num_views,
                                        config.augment.overrides)
    assert sources.training_fit(config.dataset, views, config.seed) is None
    sources.check_crop_options(config.dataset)


# --------------------------------------------------------------------------
# The devices' side: host-cropped views skip their crop; the ops' order.
# --------------------------------------------------------------------------

def test_host_cropped_views_skip_the_device_crop_and_keep_the_other_draws():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (4, 3, 12, 12, 3)).astype(np.uint8)
  views = augment.build_views('simclr', 3)
  key = jax.random.key(7)
  got = augment.augment_batch(key, images, views, host_cropped=True)
  uncropped = [augment.ViewConfig(**{**v.__dict__, 'crop_scale': None})
               for v in views]
  for v in range(3):
    want = augment.augment_batch(key, images[:, v], uncropped)[:, v]
    np.testing.assert_allclose(got[:, v], want, atol=1e-6)
  with pytest.raises(ValueError, match='host-cropped'):
    augment.augment_batch(key, images[:, 0], views, host_cropped=True)


def _luma(x):
  return x @ np.array([0.299, 0.587, 0.114])


def _numpy_view(image, order, b, c, s, gray):
  """Brightness b, contrast c, saturation s (one clip at the end, as
  augment.jitter), grayscale when `gray`, in `order`."""
  x = image.astype(np.float64)
  for op in order:
    if op == 'jitter':
      x = b * x
      x = c * x + (1 - c) * _luma(x).mean()
      x = s * x + (1 - s) * _luma(x)[..., None]
      x = np.clip(x, 0, 1)
    elif op == 'grayscale' and gray:
      x = np.repeat(_luma(x)[..., None], 3, axis=-1)
  return x


def test_grayscale_before_jitter_differs_and_each_order_matches_numpy():
  amounts = (0.8, 0.4, 0.4, 0.)
  base = augment.ViewConfig(crop_scale=None, flip_p=0., jitter=amounts,
                            jitter_p=1., grayscale_p=1.)
  image = np.zeros((6, 6, 3), np.float32)
  image[..., 0], image[..., 1], image[..., 2] = 0.95, 0.45, 0.1
  image[:3] *= 0.6                      # Two colours: a mean to contrast.
  key = jax.random.key(0)
  # The factors the view's jitter draws (its key: the fourth of eight).
  _, k_b, k_c, k_s, _, _ = jax.random.split(jax.random.split(key, 8)[3], 6)
  b, c, s = (float(jax.random.uniform(k, (), minval=1 - r, maxval=1 + r))
             for k, r in zip((k_b, k_c, k_s), amounts))
  assert b > 1.1          # Red clips: the orders must then differ.
  outs = {}
  for order in (('crop', 'flip', 'jitter', 'grayscale'),
                ('crop', 'grayscale', 'jitter', 'flip')):
    cfg = augment.ViewConfig(**{**base.__dict__, 'op_order': order})
    outs[order] = np.asarray(augment.augment_image(key, jnp.asarray(image),
                                                   cfg))
    np.testing.assert_allclose(outs[order], _numpy_view(image, order, b, c, s,
                                                        True), atol=1e-5)
  a, g = outs.values()
  assert np.abs(a - g).max() > 0.05


@pytest.mark.parametrize('order,match', [
    ('flip, crop', 'starting with crop'),
    ('crop, crop', 'starting with crop'),
    ('crop, rotate', 'starting with crop'),
    ('crop, flip, jitter', 'leaves out grayscale'),
])
def test_op_orders_are_checked(order, match):
  with pytest.raises(ValueError, match=match):
    augment.build_views('moco_v1', 2, (), order)


def test_op_order_is_set_for_every_view_not_per_view():
  views = augment.build_views('simclr', 3, (), 'crop, grayscale, jitter, '
                              'flip, blur')
  assert {v.op_order for v in views} == {
      ('crop', 'grayscale', 'jitter', 'flip', 'blur')}
  with pytest.raises(ValueError, match='config.augment.op_order'):
    augment.build_views('simclr', 2, ({'op_order': ('crop',)},))


# --------------------------------------------------------------------------
# main.py with the options, on a folder of mixed sizes.
# --------------------------------------------------------------------------

def test_main_trains_and_evaluates_with_the_new_options(mixed_folder,
                                                        tmp_path):
  out = subprocess.run(
      [sys.executable, 'main.py', '--config=configs/test.py',
       f'--workdir={tmp_path}', '--config.dataset.name=image_folder',
       '--config.dataset.train_split=train', '--config.dataset.eval_split=test',
       f'--config.dataset.data_dir={mixed_folder}',
       '--config.dataset.image_size=14', '--config.dataset.in_memory=False',
       '--config.dataset.train_crop_source=full_image',
       '--config.dataset.eval_crop_fraction=0.875',
       '--config.augment.preset=moco_v1',
       '--config.augment.op_order=crop, grayscale, jitter, flip',
       '--config.batch_size=8', '--config.eval.batch_size=8',
       '--config.model.encoder_kwargs.widths=(4,8)',
       '--config.eval.baselines=False',
       '--config.evals.online_knn.every_steps=-1',
       '--config.evals.linear.max_iter=5', '--config.evals.knn.ks=(3,)',
       # The papers' linear probe, its crops cut from the full image too.
       '--config.evals.linear_eval.every_steps=0',
       '--config.evals.linear_eval.preset=moco',
       '--config.evals.linear_eval.epochs=1'],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8'))
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / 'results.json') as f:
    results = json.load(f)
  assert results['steps'] == 2      # 16 training images, batch 8.
  assert 0 <= results['trained/knn_weighted_top1@3'] <= 1, results
  assert 0 <= results['trained/linear_eval_top1'] <= 1, results
  with open(tmp_path / 'config.json') as f:
    stored = json.load(f)
  assert stored['dataset']['train_crop_source'] == 'full_image'
