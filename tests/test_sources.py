"""Random-access sources and the one batch path over them (pipeline.py)."""

import gzip
import os

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from ml_collections import config_dict
from PIL import Image

from input_pipeline import datasets
from input_pipeline import pipeline
from input_pipeline import sources
from synthetic_data import make_jpeg_folder


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('jpeg'))
  make_jpeg_folder(root, num_train=40, num_test=12)
  return root


def _sharding():
  mesh = jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))
  return NamedSharding(mesh, P('data'))


def test_fit_square_crops_the_centre_and_keeps_a_constant_image():
  # No resize needed (shorter side == size): exactly the central crop.
  img = np.arange(16 * 24 * 3, dtype=np.uint8).reshape(16, 24, 3)
  np.testing.assert_array_equal(sources.fit_square(img, 16, 3),
                                img[:, 4:20])
  # Any resize of a constant image is that constant.
  const = np.full((30, 50), 77, np.uint8)
  out = sources.fit_square(const, 12, 1)
  assert out.shape == (12, 12, 1) and np.all(out == 77)
  # Grey -> RGB repeats the channel; RGB -> grey is ITU-R 601 luma.
  np.testing.assert_array_equal(sources.fit_square(const, None, 3),
                                np.full((30, 50, 3), 77, np.uint8))
  rgb = np.zeros((4, 4, 3), np.uint8)
  rgb[..., 0] = 200
  assert np.all(sources.fit_square(rgb, None, 1) == round(200 * 0.299))


def test_image_folder_reads_sorted_classes_and_decodes_like_pil(folder):
  src = sources.ImageFolder(folder, 'train', image_size=16)
  assert len(src) == 40 and src.num_classes == 4
  assert src.classes == ['class_0', 'class_1', 'class_2', 'class_3']
  assert src.image_shape == (16, 16, 3)
  # Labels are the sorted class ids; file order is sorted within a class.
  np.testing.assert_array_equal(np.bincount(src.labels), [10, 10, 10, 10])
  assert np.all(np.diff(src.labels) >= 0)
  batch = src.read([3, 0, 39])
  for row, i in enumerate([3, 0, 39]):
    with Image.open(src.files[i]) as im:
      ref = np.asarray(im.convert('RGB').resize((16, 16), Image.BILINEAR))
    np.testing.assert_array_equal(batch['image'][row], ref)
    assert batch['label'][row] == src.labels[i]


def test_image_folder_errors_name_the_fix(tmp_path, folder):
  with pytest.raises(FileNotFoundError, match='splits there: .*test.*train'):
    sources.ImageFolder(folder, 'validation', image_size=16)
  (tmp_path / 'train' / 'a').mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match='no .*jpg.* images'):
    sources.ImageFolder(tmp_path, 'train', image_size=16)


def test_prefetched_iteration_equals_direct_batches_and_resumes(folder):
  src = sources.ImageFolder(folder, 'train', image_size=16)
  batches = pipeline.TrainBatches(src, global_batch_size=8, seed=3,
                                  sharding=_sharding())
  assert batches.steps_per_epoch == 5
  direct = [batches(s) for s in range(8)]       # crosses an epoch boundary
  streamed = list(batches.iterate(0, 8))
  resumed = list(batches.iterate(5, 8))
  assert len(streamed) == 8 and len(resumed) == 3
  for want, got in zip(direct, streamed):
    for k in ('image', 'label', 'index'):
      np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
  for want, got in zip(direct[5:], resumed):
    np.testing.assert_array_equal(np.asarray(got['image']),
                                  np.asarray(want['image']))
  # What each batch holds is exactly the source's examples at its ids.
  ids = batches.global_indices(6)
  np.testing.assert_array_equal(np.asarray(direct[6]['image']),
                                src.read(ids)['image'])
  # An epoch visits distinct examples.
  epoch = np.concatenate([batches.global_indices(s) for s in range(5)])
  assert len(set(epoch.tolist())) == 40


def test_worker_processes_decode_the_same_batches_in_order(folder):
  # Decoding in 2 worker processes (grain's multiprocessing prefetch) gives
  # the batches the in-process threads give, in step order, resumable.
  src = sources.ImageFolder(folder, 'train', image_size=16)
  src.read([0])   # A thread pool exists: the source must still pickle.
  threads = pipeline.TrainBatches(src, global_batch_size=8, seed=3,
                                  sharding=_sharding())
  workers = pipeline.TrainBatches(src, global_batch_size=8, seed=3,
                                  sharding=_sharding(), num_workers=2)
  assert workers.num_workers == 2
  for start in (0, 3):
    want = list(threads.iterate(start, 8))
    got = list(workers.iterate(start, 8))
    assert len(got) == len(want) == 8 - start
    for w, g in zip(want, got):
      for k in ('image', 'label', 'index'):
        np.testing.assert_array_equal(np.asarray(g[k]), np.asarray(w[k]))
  # Arrays in memory have nothing to decode: always read in this process.
  data = pipeline.ArrayDataset(src.read(np.arange(40))['image'],
                               src.labels)
  assert pipeline.TrainBatches(data, global_batch_size=8, seed=3,
                               sharding=_sharding(),
                               num_workers=2).num_workers == 0


def test_eval_batches_cover_the_split_once_with_a_padding_mask(folder):
  src = sources.ImageFolder(folder, 'test', image_size=16)
  got = list(pipeline.eval_batches(src, batch_size=8, sharding=_sharding()))
  assert len(got) == 2                        # 12 examples: 8 + 4 + 4 padding
  mask = np.concatenate([np.asarray(b['mask']) for b in got])
  np.testing.assert_array_equal(mask, np.arange(16) < 12)
  images = np.concatenate([np.asarray(b['image']) for b in got])
  np.testing.assert_array_equal(images[:12], src.read(np.arange(12))['image'])
  assert not images[12:].any()


@pytest.mark.parametrize('nproc', [2, 4])
def test_process_parts_are_disjoint_and_cover_each_batch(nproc):
  batch = np.arange(100, 132)
  parts = [pipeline.process_slice(batch, i, nproc) for i in range(nproc)]
  np.testing.assert_array_equal(np.concatenate(parts), batch)


def _idx_file(path):
  """An IDX file (gzip) as a numpy array, read independently of TFDS."""
  with gzip.open(path) as f:
    data = f.read()
  ndim = data[3]
  dims = np.frombuffer(data[4:4 + 4 * ndim], '>u4')
  return np.frombuffer(data[4 + 4 * ndim:], np.uint8).reshape(dims)


def test_tfds_source_reads_fashion_mnist_like_the_raw_idx_files():
  src = sources.TfdsSource('fashion_mnist', 'test[:64]', data_dir=None,
                           image_size=None)
  assert len(src) == 64 and src.num_classes == 10
  assert src.image_shape == (28, 28, 1)
  d = datasets.DEBIAN_FASHION_MNIST_DIR
  images = _idx_file(f'{d}/t10k-images-idx3-ubyte.gz')
  labels = _idx_file(f'{d}/t10k-labels-idx1-ubyte.gz')
  # TFDS stores examples in its own (hashed) order, so look each one up by
  # its pixels: every image read must be an upstream test image, with its
  # upstream label.
  by_pixels = {img.tobytes(): int(lab) for img, lab in zip(images, labels)}
  got = src.read(np.arange(64))
  for img, lab in zip(got['image'][..., 0], got['label']):
    assert by_pixels[img.tobytes()] == lab
  assert len({img.tobytes() for img in got['image']}) == 64


def test_in_memory_tfds_split_is_decoded_once_and_read_back_equal():
  # A split no other test uses. The first open decodes it and writes the
  # arrays; the next opens read the file; a file that does not match the
  # split is decoded anew.
  split = 'test[64:192]'
  dc = config_dict.ConfigDict(dict(name='fashion_mnist', data_dir=None,
                                   image_size=None, in_memory=True))
  src = sources.TfdsSource('fashion_mnist', split, data_dir=None,
                           image_size=None)
  path = src.decoded_path
  if os.path.exists(path):
    os.remove(path)
  direct = src.read(np.arange(len(src)))     # Decoded record by record.

  def check_equal(data):
    np.testing.assert_array_equal(data.images, direct['image'])
    np.testing.assert_array_equal(data.labels, direct['label'])

  try:
    check_equal(sources.open_split(dc, split))
    assert os.path.exists(path)
    # The next open returns what the file holds: mark one image in it.
    with np.load(path) as f:
      image, label = f['image'].copy(), f['label']
    image[0] = 255 - image[0]
    with open(path, 'wb') as f:
      np.savez(f, image=image, label=label)
    again = sources.open_split(dc, split)
    np.testing.assert_array_equal(again.images[0], 255 - direct['image'][0])
    np.testing.assert_array_equal(again.images[1:], direct['image'][1:])
    # Too few rows, or not an .npz at all: decoded anew (and rewritten).
    with open(path, 'wb') as f:
      np.savez(f, image=image[:10], label=label[:10])
    check_equal(sources.open_split(dc, split))
    with np.load(path) as f:
      assert len(f['label']) == len(src)
    with open(path, 'wb') as f:
      f.write(b'half a file')
    check_equal(sources.open_split(dc, split))
  finally:
    if os.path.exists(path):
      os.remove(path)


@pytest.mark.parametrize('scale,words', [
    ('imagenet', ('imagenet2012', 'downloads/manual',
                  'ILSVRC2012_img_train.tar')),
    ('cifar10', ('cifar10', 'Fix:')),
])
def test_paper_config_without_its_dataset_fails_fast_naming_the_fix(
    tmp_path, scale, words):
  # The real entry point and the papers' configs: without ImageNet prepared,
  # or CIFAR downloadable (no network here), it must stop before any training
  # with what to do, and leave nothing but config.json behind.
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
      [sys.executable, 'main.py', f'--config=configs/papers/simclr.py:{scale}',
       f'--workdir={tmp_path}/run', f'--config.dataset.data_dir={tmp_path}',
       '--config.batch_size=64', '--config.eval.batch_size=64'],
      cwd=repo, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode != 0
  last = out.stderr.strip().splitlines()[-1]
  for word in words:
    assert word in last, last
  assert os.listdir(tmp_path / 'run') == ['config.json']


def test_npz_splits_read_whole_or_sliced_and_errors_name_the_fix(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (10, 5, 5), np.uint8)   # [M, H, W]: 1 channel
  labels = np.arange(10) % 3
  np.savez_compressed(tmp_path / 'train.npz', image=images, label=labels)
  dc = config_dict.ConfigDict({'name': 'npz', 'data_dir': str(tmp_path),
                                  'image_size': None, 'in_memory': False})
  data = sources.open_split(dc, 'train')
  assert data.image_shape == (5, 5, 1) and data.num_classes == 3
  np.testing.assert_array_equal(data.images[..., 0], images)
  part = sources.open_split(dc, 'train[2:-3]')
  np.testing.assert_array_equal(part.images[..., 0], images[2:7])
  np.testing.assert_array_equal(part.labels, labels[2:7])
  assert part.labels.dtype == np.int32
  for split, message in [('test', 'splits there: train'),
                         ('train[5%:]', 'integer bounds'),
                         ('train[:0]', 'selects no example')]:
    with pytest.raises((ValueError, FileNotFoundError), match=message):
      sources.open_split(dc, split)
  dc.image_size = 8
  with pytest.raises(ValueError, match='image_size=8 but the npz images'):
    sources.open_split(dc, 'train')
  np.savez(tmp_path / 'bad.npz', x=images)
  with pytest.raises(ValueError, match='needs the arrays "image"'):
    sources.read_npz(tmp_path, 'bad')
