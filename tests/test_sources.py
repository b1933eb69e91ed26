"""Random-access sources and the one batch path over them (pipeline.py)."""

import gzip
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from PIL import Image

from configs import test as test_config
from contrastive_jax import config_lib
from contrastive_jax import data as data_lib
from contrastive_jax import train
from input_pipeline import datasets
from input_pipeline import pipeline
from input_pipeline import sources
from synthetic_data import add_bad_files
from synthetic_data import make_colour_folder
from synthetic_data import make_jpeg_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('jpeg'))
  make_jpeg_folder(root, num_train=40, num_test=12)
  return root


def _dataset(**fields):
  """configs/test.py's resolved config.dataset with `fields` set."""
  config = config_lib.with_defaults(test_config.get_config())
  config.dataset.update(fields)
  return config.dataset


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
  assert src.classes == ('class_0', 'class_1', 'class_2', 'class_3')
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
  ids = batches.host_batch.global_indices(6)
  np.testing.assert_array_equal(np.asarray(direct[6]['image']),
                                src.read(ids)['image'])
  # An epoch visits distinct examples.
  epoch = np.concatenate([batches.host_batch.global_indices(s)
                          for s in range(5)])
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


_LAZY_IMPORT_WINDOW_SCRIPT = r"""
import contextlib, gc, multiprocessing, sys
from etils import epy

# Every etils lazy-import window gets a garbage collection, as one can land
# there at any allocation; the windows entered are counted.
plain = epy.lazy_imports
windows = []
@contextlib.contextmanager
def collecting(**kwargs):
  windows.append(1)
  with plain(**kwargs):
    gc.collect()
    yield
epy.lazy_imports = collecting
failed = []
sys.unraisablehook = lambda u: failed.append(f'{u.object!r}: {u.exc_value!r}')

from input_pipeline import pipeline, sources
print('WINDOWS AT IMPORT', len(windows))
windows.clear()

# What a dropped worker-process iterator leaves: a cycle holding a named
# semaphore, whose multiprocessing finalizer imports its resource tracker.
cycle = {'lock': multiprocessing.get_context('spawn').Lock()}
cycle['self'] = cycle
del cycle
sources.TfdsSource('fashion_mnist', 'test[:8]', data_dir=None, image_size=None)
import grain  # What the training iterator uses.
gc.collect()
print('WINDOWS AFTER IMPORT', len(windows))
print('FAILED FINALIZERS', failed)
"""


def test_opening_tfds_after_pipeline_garbage_runs_its_finalizers():
  # TFDS and grain import their dependencies under a patched
  # builtins.__import__; a collection in that window fails every
  # multiprocessing finalizer due (their semaphores leak) unless the input
  # pipeline's modules pass those windows when they are imported, before
  # they make any. A fresh interpreter: this one has imported both already.
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
      [sys.executable, '-c', _LAZY_IMPORT_WINDOW_SCRIPT], cwd=repo,
      env=dict(os.environ, PYTHONPATH=repo), capture_output=True, text=True,
      timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  # The import passes the windows (the libraries use them: else this test
  # checks nothing), and nothing after it enters one.
  assert 'WINDOWS AT IMPORT 0' not in out.stdout, out.stdout[-3000:]
  assert 'WINDOWS AT IMPORT' in out.stdout, out.stdout[-3000:]
  assert 'WINDOWS AFTER IMPORT 0' in out.stdout, out.stdout[-3000:]
  assert 'FAILED FINALIZERS []' in out.stdout, out.stdout[-3000:]


def test_in_memory_tfds_split_is_decoded_once_and_read_back_equal():
  # A split no other test uses. The first open decodes it and writes the
  # arrays; the next opens read the file; a file that does not match the
  # split is decoded anew.
  split = 'test[64:192]'
  dc = _dataset(name='fashion_mnist', data_dir=None, image_size=None,
                in_memory=True)
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
  # with what to do, in one line, having written nothing.
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run(
      [sys.executable, 'main.py', f'--config=configs/papers/simclr.py:{scale}',
       f'--workdir={tmp_path}/run', f'--config.dataset.data_dir={tmp_path}',
       '--config.batch_size=64', '--config.eval.batch_size=64'],
      cwd=repo, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode == 2, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and 'Traceback' not in out.stderr, last
  for word in words:
    assert word in last, last
  assert not os.path.exists(tmp_path / 'run')


def test_npz_splits_read_whole_or_sliced_and_errors_name_the_fix(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (10, 5, 5), np.uint8)   # [M, H, W]: 1 channel
  labels = np.arange(10) % 3
  np.savez_compressed(tmp_path / 'train.npz', image=images, label=labels)
  dc = _dataset(name='npz', data_dir=str(tmp_path), image_size=None,
                in_memory=False)
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
# --------------------------------------------------------------------------
# Real-world folders: one class list, bad files, odd images.
# --------------------------------------------------------------------------

def _folder_config(root, in_memory=True, **dataset):
  config = test_config.get_config()
  config.dataset.update(dict(name='image_folder', data_dir=str(root),
                             image_size=8, train_split='train',
                             eval_split='test', in_memory=in_memory,
                             **dataset))
  return config


def _expected_labels(source, classes):
  """Each file's label from its folder name's position in `classes`."""
  return [classes.index(os.path.basename(os.path.dirname(f)))
          for f in source.files]


@pytest.mark.parametrize('in_memory', [True, False])
def test_every_split_labels_a_class_alike_and_differences_are_logged(
    tmp_path, caplog, in_memory):
  # Test lacks b: its c must keep id 2 (the sorted union a, b, c), not 1.
  make_colour_folder(str(tmp_path / 'one'), {'train': dict(a=4, b=4, c=4),
                                             'test': dict(a=3, c=3)})
  streamed = [sources.ImageFolder(tmp_path / 'one', s, image_size=8)
              for s in ('train', 'test')]
  for src in streamed:
    np.testing.assert_array_equal(src.labels,
                                  _expected_labels(src, ['a', 'b', 'c']))
  train_data, test_data = data_lib.load(
      _folder_config(tmp_path / 'one', in_memory))
  np.testing.assert_array_equal(test_data.labels, [0] * 3 + [2] * 3)
  assert train_data.num_classes == test_data.num_classes == 3
  warned = [r.getMessage() for r in caplog.records if 'Classes:' in
            r.getMessage()]
  assert len(warned) == 1 and "no examples of 'b'" in warned[0], warned
  # Test has d, which train lacks: d gets id 3 in both, and the warning
  # says its examples cannot be predicted.
  caplog.clear()
  make_colour_folder(str(tmp_path / 'two'), {'train': dict(a=4, b=4, c=4),
                                             'test': dict(a=3, d=2)})
  train_data, test_data = data_lib.load(
      _folder_config(tmp_path / 'two', in_memory))
  np.testing.assert_array_equal(test_data.labels, [0] * 3 + [3] * 2)
  assert train_data.num_classes == 4 and train_data.classes == tuple('abcd')
  warned = ' '.join(r.getMessage() for r in caplog.records)
  assert ("training split 'train' has no examples of 'd'" in warned and
          'its 2 examples of them count as errors' in warned), warned


def test_folder_contents_have_defined_outcomes(tmp_path, caplog):
  """Image modes, extensions, empty, hidden and stray entries, tiny images."""
  split = tmp_path / 'train'

  def save(cls, name, array, mode=None, **kw):
    (split / cls).mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode).save(split / cls / name, **kw)

  const = lambda value, shape=(12, 12): np.full(shape, value, np.uint8)
  expected = {}     # file -> the RGB value every pixel must decode to
  save('grey', 'g.png', const(77))
  expected['grey/g.png'] = (77, 77, 77)
  save('rgba', 'r.png', const((10, 200, 30, 5), (12, 12, 4)))
  expected['rgba/r.png'] = (10, 200, 30)      # Alpha dropped, colour kept.
  pal = Image.fromarray(const(1), 'L').convert('P')
  pal.putpalette([0, 0, 0, 200, 10, 50] + [0] * 762)
  (split / 'palette').mkdir(parents=True)
  pal.save(split / 'palette' / 'p.png')
  expected['palette/p.png'] = (200, 10, 50)
  # 16-bit grey: 40000 / 65535 of white is round(40000 / 257) = 156 in 8
  # bits (PIL's own conversion would clip it to 255).
  save('deep', 'd.png', np.full((12, 12), 40000, np.uint16))
  expected['deep/d.png'] = (156, 156, 156)
  (split / 'cmyk').mkdir()
  Image.fromarray(const((200, 30, 30), (12, 12, 3))).convert('CMYK').save(
      split / 'cmyk' / 'c.jpg', quality=95)
  expected['cmyk/c.jpg'] = (200, 30, 30)
  for name in ('u.JPG', 'v.PNG', 'w.Jpeg'):
    save('upper', name, const((90, 60, 30), (12, 12, 3)), quality=95)
    expected[f'upper/{name}'] = (90, 60, 30)
  save('small', 's.png', const((5, 6, 7), (3, 5, 3)))   # Under image_size.
  expected['small/s.png'] = (5, 6, 7)
  (split / 'empty').mkdir()
  # Not data: hidden files (macOS metadata, an AppleDouble "._" twin that is
  # no JPEG), a hidden class folder, and stray files.
  (split / 'grey' / '.DS_Store').write_bytes(b'\0\1junk')
  (split / 'grey' / '._g.jpg').write_bytes(b'\0\5\26\7AppleDouble')
  save('.ipynb_checkpoints', 'g.png', const(1))
  (split / 'grey' / 'notes.txt').write_text('about the images')
  (split / 'README').write_text('a file outside the class folders')

  src = sources.ImageFolder(tmp_path, 'train', image_size=16)
  assert src.classes == ('cmyk', 'deep', 'empty', 'grey', 'palette', 'rgba',
                         'small', 'upper')
  got = {f'{f.parent.name}/{f.name}': i for i, f in enumerate(src.files)}
  assert sorted(got) == sorted(expected)
  batch = src.read(np.arange(len(src)))
  assert batch['image'].shape == (len(expected), 16, 16, 3)
  for name, value in expected.items():
    image = batch['image'][got[name]].astype(int)
    tol = 4 if name.lower().endswith(('.jpg', '.jpeg')) else 0
    assert np.abs(image - np.array(value)).max() <= tol, (name, image[0, 0])
  assert not src.skipped
  # The empty folder's class keeps its id, and the log says it is empty.
  assert any("'empty' have no examples in either split" in m
             for m in data_lib.class_warnings(src, src, train_name='train',
                                              eval_name='train'))
  ignored = [r.getMessage() for r in caplog.records
             if 'ignoring 2 entries' in r.getMessage()]
  assert ignored and 'notes.txt' in ignored[0] and 'README' in ignored[0]


def _bad_folder(root):
  make_colour_folder(str(root), {'train': dict(a=6, b=6), 'test': dict(a=2)})
  return add_bad_files(str(root / 'train' / 'b'))


def test_undecodable_files_become_black_substitutes_named_once(tmp_path,
                                                               caplog):
  bad = _bad_folder(tmp_path)
  src = sources.ImageFolder(tmp_path, 'train', image_size=8)
  assert len(src) == 15
  bad_ids = [src.files.index(pathlib.Path(p)) for p in bad]
  for _ in range(2):      # Read twice: one warning per file all the same.
    batch = src.read(np.arange(len(src)))
  np.testing.assert_array_equal(batch['label'], _expected_labels(src,
                                                                 ['a', 'b']))
  good = np.setdiff1d(np.arange(15), bad_ids)
  assert not batch['image'][bad_ids].any()
  assert batch['image'][good].reshape(len(good), -1).max(1).min() > 100
  assert sorted(src.skipped) == sorted(bad_ids)
  for i, path in zip(bad_ids, bad):
    assert src.skipped[i].startswith(path)
  warned = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith('Cannot decode')]
  assert sorted(w.split()[2] for w in warned) == sorted(bad)
  # Evaluation leaves them out: masked like padding.
  mask = np.concatenate([np.asarray(b['mask']) for b in pipeline.eval_batches(
      src, batch_size=8, sharding=_sharding())])
  np.testing.assert_array_equal(np.flatnonzero(~mask[:15]), sorted(bad_ids))
  # In memory: the same substitutes, the same ids, kept through a subset.
  dc = _dataset(name='image_folder', data_dir=str(tmp_path), image_size=8,
                in_memory=True)
  held = sources.open_split(dc, 'train')
  np.testing.assert_array_equal(held.images, batch['image'])
  assert sorted(held.skipped) == sorted(bad_ids)
  part = held.take(np.array([bad_ids[1], 0, bad_ids[0]]))
  assert sorted(part.skipped) == [0, 2]
  # Past the allowed fraction: an error listing every file.
  data_lib.check_skipped('training split', src.skipped, 15, 0.2)
  with pytest.raises(ValueError, match='3 of the 15 records') as e:
    data_lib.check_skipped('training split', src.skipped, 15, 0.1)
  assert all(p in str(e.value) for p in bad)


@pytest.mark.parametrize('num_workers,crops', [
    (0, False), (2, False), (0, True), (2, True), (pipeline.AUTO, True)])
def test_resumed_batches_equal_uninterrupted_ones_with_bad_records(
    tmp_path, num_workers, crops):
  # Threads or worker processes, the centre square or each view's crop of
  # the full image (train_crop_source='full_image').
  bad = _bad_folder(tmp_path)
  # A resumed process starts with a fresh source that has found nothing.
  first, resumed = (sources.ImageFolder(tmp_path, 'train', image_size=8)
                    for _ in range(2))
  bad_ids = [first.files.index(pathlib.Path(p)) for p in bad]
  fit = (sources.RandomCrops((((0.08, 1.), (0.75, 4 / 3)), None), seed=2)
         if crops else None)
  make = lambda src: pipeline.TrainBatches(src, global_batch_size=8, seed=1,
                                           sharding=_sharding(),
                                           num_workers=num_workers, fit=fit)
  whole = list(make(first).iterate(0, 6))      # 15 examples: 1 step/epoch
  tail = list(make(resumed).iterate(3, 6))
  for want, got in zip(whole[3:], tail):
    for k in ('image', 'label', 'index'):
      np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
  seen = np.concatenate([np.asarray(b['index']) for b in whole])
  assert set(bad_ids) & set(seen.tolist())      # The substitutes were used.
  # Decoded in worker processes or not, the training process knows every bad
  # record it was given (the streamed fraction check reads `skipped`).
  assert sorted(first.skipped) == sorted(set(bad_ids) & set(seen.tolist()))
  assert all(first.skipped[i].startswith(tuple(bad)) for i in first.skipped)
  for b in whole:
    for row, i in enumerate(np.asarray(b['index'])):
      assert (i in bad_ids) == (not np.asarray(b['image'])[row].any())


def test_verify_refuses_before_training_listing_every_bad_file(tmp_path):
  bad = _bad_folder(tmp_path)
  # Streamed without verify: nothing is decoded yet, so nothing is found.
  train_data, _ = data_lib.load(_folder_config(
      tmp_path, in_memory=False, max_bad_fraction=0.))
  assert not train_data.skipped
  with pytest.raises(ValueError, match="training split 'train' cannot be "
                     'decoded') as e:
    data_lib.load(_folder_config(tmp_path, in_memory=False, verify=True))
  assert all(p in str(e.value) for p in bad)
  # Within the allowed fraction: the run goes on, every bad file known.
  train_data, _ = data_lib.load(_folder_config(
      tmp_path, in_memory=False, verify=True, max_bad_fraction=0.25))
  assert sorted(train_data.skipped.values())[0].startswith(sorted(bad)[0])
  assert len(train_data.skipped) == 3


def test_a_runs_stored_class_list_keeps_its_ids(tmp_path):
  make_colour_folder(str(tmp_path), {'train': dict(b=3, c=3),
                                     'test': dict(b=2, c=2)})
  # The run started with a, b, c; a's folders are gone since: c stays 2.
  train_data, test_data = data_lib.load(_folder_config(tmp_path),
                                          classes=('a', 'b', 'c'))
  np.testing.assert_array_equal(test_data.labels, [1, 1, 2, 2])
  assert train_data.num_classes == 3
  (tmp_path / 'test' / 'e').mkdir()
  with pytest.raises(ValueError, match=r"class folders \['e'\].*classes.json"):
    data_lib.load(_folder_config(tmp_path), classes=('a', 'b', 'c'))


_PROCESS_SCRIPT = '''
import json, sys
from contrastive_jax import runtime
from contrastive_jax import data as data_lib
runtime.initialize_distributed()
from configs import test as test_config
config = test_config.get_config()
config.dataset.update(dict(
    name='image_folder', data_dir=sys.argv[1], image_size=8,
    train_split='train', eval_split='test', in_memory=False, verify=True,
    max_bad_fraction=0.5))
try:
  tr, te = data_lib.load(config)
  print('RESULT ' + json.dumps({'classes': tr.classes,
                                'train': tr.labels.tolist(),
                                'test': te.labels.tolist(),
                                'skipped': sorted(tr.skipped.values())}))
except ValueError as e:
  print('RESULT ' + json.dumps({'error': str(e)}))
'''


def _two_processes(data_dirs):
  """Runs `data_lib.load` as 2 joined processes, one data_dir each."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f'localhost:{port}',
             JAX_NUM_PROCESSES='2', PYTHONPATH=repo, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=2')
  procs = [subprocess.Popen(
      [sys.executable, '-c', _PROCESS_SCRIPT, str(d)], cwd=repo, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      env=dict(env, JAX_PROCESS_ID=str(i))) for i, d in enumerate(data_dirs)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0 and 'RESULT ' in out, err[-3000:]
  # Gloo writes to stdout too, even on the result's line.
  return [json.JSONDecoder().raw_decode(out.split('RESULT ', 1)[1])[0]
          for out, _ in outs]


def test_every_process_reads_the_same_labels_and_bad_records(tmp_path):
  # Each process scans half of the folder (config.dataset.verify); both end
  # with every bad file, the same class list and labels.
  bad = _bad_folder(tmp_path / 'data')
  make_colour_folder(str(tmp_path / 'data'), {'test': dict(c=2)}, seed=1)
  a, b = _two_processes([tmp_path / 'data'] * 2)
  assert a == b, (a, b)
  assert a['classes'] == ['a', 'b', 'c']
  assert a['test'] == [0, 0, 2, 2]
  assert [s.split(' (')[0] for s in a['skipped']] == sorted(bad)
  # A process that sees another copy of the data (here one more class)
  # stops, and so does the other: no run with two sets of ids.
  shutil.copytree(tmp_path / 'data', tmp_path / 'other')
  make_colour_folder(str(tmp_path / 'other'), {'test': dict(d=1)})
  for out in _two_processes([tmp_path / 'data', tmp_path / 'other']):
    assert 'differs between processes' in out.get('error', ''), out


# --------------------------------------------------------------------------
# Decoding: where (threads or worker processes), and how cheaply.
# --------------------------------------------------------------------------

def test_decoding_is_chosen_from_the_host_unless_the_config_says():
  auto = pipeline.AUTO
  # Accelerator hosts: a worker process per core, one decoding thread each.
  for backend in ('gpu', 'tpu'):
    d = pipeline.decoding(auto, cores=16, backend=backend)
    assert (d.workers, d.threads) == (16, 1)
    assert '16 cores' in str(d) and backend in str(d)
  # A host of hundreds of cores: at most 32 processes, each a share.
  d = pipeline.decoding(auto, cores=240, backend='tpu')
  assert (d.workers, d.threads) == (pipeline.MAX_AUTO_WORKERS, 7)
  # CPU devices share the cores: threads of the training process.
  d = pipeline.decoding(auto, cores=2, backend='cpu')
  assert (d.workers, d.threads) == (0, 2)
  assert pipeline.decoding(auto, cores=64, backend='cpu').threads == 16
  # The config's number: its processes share the cores' threads.
  assert (pipeline.decoding(4, cores=16).workers,
          pipeline.decoding(4, cores=16).threads) == (4, 4)
  assert pipeline.decoding(8, cores=2).threads == 1
  assert (pipeline.decoding(0, cores=32).workers,
          pipeline.decoding(0, cores=32).threads) == (0, 16)
  with pytest.raises(ValueError, match='num_workers=-3'):
    pipeline.decoding(-3, cores=4)


def test_worker_processes_decode_on_their_share_of_the_cores(folder):
  src = sources.ImageFolder(folder, 'train', image_size=16)
  cores = len(os.sched_getaffinity(0))
  workers = pipeline.TrainBatches(src, global_batch_size=8, seed=3,
                                  sharding=_sharding(), num_workers=2)
  reader = workers.host_batch.source
  assert reader is not src and reader.num_threads == max(1, cores // 2)
  assert src.num_threads == sources.ImageFolder.num_threads   # Unchanged.
  threads = pipeline.TrainBatches(src, global_batch_size=8, seed=3,
                                  sharding=_sharding(), num_workers=0)
  assert threads.host_batch.source is src
  # A subset (a holdout, an imbalanced split) reads through the copy, and
  # what its workers find undecodable reaches the source by its own ids.
  sub = pipeline.Subset(src, np.arange(10, 30))
  copy = pipeline.TrainBatches(sub, global_batch_size=8, seed=3,
                               sharding=_sharding(), num_workers=2)
  assert copy.host_batch.source.source.num_threads == max(1, cores // 2)
  sub.note_skipped({3: 'x (OSError)'})
  assert src.skipped[13] == 'x (OSError)' and sub.skipped == {3: 'x (OSError)'}
  # Arrays in memory, whole or a subset, have nothing to decode.
  data = pipeline.ArrayDataset(src.read(np.arange(40))['image'], src.labels)
  assert pipeline.TrainBatches(pipeline.Subset(data, np.arange(20)),
                               global_batch_size=8, seed=3,
                               sharding=_sharding(),
                               num_workers=2).num_workers == 0


def test_a_workdir_resumes_with_another_decoding(tmp_path):
  from contrastive_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.with_defaults(test_config.get_config())
  workdir_lib.bind(str(tmp_path), config, classes=None, image_shape=(8, 8, 1))
  (tmp_path / 'checkpoints' / '2').mkdir(parents=True)   # A run to protect.
  workdir_lib.check_config(config, str(tmp_path))
  config.dataset.num_workers = 6     # How, not what: the same batches.
  workdir_lib.check_config(config, str(tmp_path))
  config.dataset.image_size = 20     # What: refused.
  with pytest.raises(ValueError, match='different config'):
    workdir_lib.check_config(config, str(tmp_path))


def _jpeg(path, height, width, *, gray=False, seed=0, **save):
  """A smooth colour field plus noise, saved as a JPEG at `path`."""
  rng = np.random.default_rng(seed)
  small = rng.integers(0, 256, (4, 5, 3), np.uint8)
  img = np.asarray(Image.fromarray(small).resize((width, height),
                                                  Image.BICUBIC), np.float32)
  img = np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
  Image.fromarray(img).convert('L' if gray else 'RGB').save(path, 'JPEG',
                                                            **save)
  return path


@pytest.mark.parametrize('save', [
    dict(quality=90, subsampling=2),                   # 4:2:0
    dict(quality=75, subsampling=1),                   # 4:2:2
    dict(quality=95, subsampling=0),                   # 4:4:4
    dict(quality=85, progressive=True),
    dict(quality=85, gray=True),
    dict(quality=85, cmyk=True)])                      # Through PIL.
def test_jpegs_decode_like_pil_at_every_reduction(tmp_path, save):
  save = dict(save)
  gray, cmyk = save.pop('gray', False), save.pop('cmyk', False)
  # Sides under 8 px (libjpeg-turbo's API would pick a 7/8 scale) and
  # sides that 2, 4 and 8 do not divide.
  for n, (h, w) in enumerate(((301, 457), (640, 427), (97, 130), (5, 7),
                              (9, 14))):
    path = _jpeg(tmp_path / f'{n}.jpg', h, w, gray=gray, seed=n, **save)
    if cmyk:
      with Image.open(path) as im:
        im.convert('CMYK').save(path, 'JPEG', quality=90)
    for k in (1, 2, 4, 8):
      if min(h, w) < k:
        continue
      got, full = sources.load_image(path, 3, lambda *hw, k=k: k)
      with Image.open(path) as im:
        if k > 1:   # PIL's own reduction at the same scale.
          im.draft('RGB', (im.width // k, im.height // k))
        want = np.asarray(im.convert('RGB'))
      assert full == (h, w)
      np.testing.assert_array_equal(got, want, err_msg=f'{h}x{w}, 1/{k}')
      assert got.shape[:2] == (-(-h // k), -(-w // k))
  # From the file's bytes (a TFDS record) the same as from its path.
  got, _ = sources.load_image(path.read_bytes(), 3, lambda *hw: 2)
  np.testing.assert_array_equal(got, sources.load_image(path, 3,
                                                        lambda *hw: 2)[0])


def test_jpeg_reduction_and_the_centre_squares_match_pils_draft():
  assert [sources.jpeg_reduction(r) for r in (0.5, 1, 1.99, 2, 3.9, 4,
                                              7.99, 8, 100)] == [
                                                  1, 1, 1, 2, 2, 4, 4, 8, 8]
  # The centre square's reduction is the one PIL's draft(mode, (d, d))
  # picks for the side d the resize needs: size / fraction.
  for h, w in ((375, 500), (448, 600), (1000, 2000), (3000, 4000)):
    for size, fraction in ((224, 1.0), (224, 0.875), (64, 1.0)):
      d = round(size / fraction)
      k = sources.CenterSquare(fraction).reduction(0, size)(h, w)
      assert k == max(s for s in (1, 2, 4, 8) if min(w // d, h // d) >= s)


def test_random_crops_of_a_reduced_decode_keep_their_boxes(tmp_path):
  # A 1,203 x 1,597 photo (sides no reduction divides), crops of at least
  # half its area resized to 64 px: every box is far larger than 64 px, so
  # the JPEG decodes at 1/8 or 1/4.
  path = tmp_path / 'big.jpg'
  ramp = np.tile(np.linspace(0, 255, 1597)[None, :, None], (1203, 1, 3))
  Image.fromarray(ramp.round().astype(np.uint8)).save(path, quality=95)
  fit = sources.RandomCrops((((0.5, 1.), (0.75, 4 / 3)),) * 3, seed=0)
  reductions, diffs = [], []
  for step in range(6):
    f = fit.at(step)
    reduce = f.reduction(7, 64)
    reductions.append(reduce(1203, 1597))
    small, full = sources.load_image(path, 3, reduce)
    whole, _ = sources.load_image(path, 3)
    assert full == (1203, 1597) and small.shape[0] < 1203
    got = f(small, 7, 64, 3, full_size=full)
    want = f(whole, 7, 64, 3)   # The same boxes cut from the full decode.
    assert got.shape == want.shape == (3, 64, 64, 3)
    diffs.append(np.abs(got.astype(float) - want).mean())
    # Columns of the ramp tell where a crop came from: the same place.
    np.testing.assert_allclose(got[:, 32, :, 0].astype(float),
                               want[:, 32, :, 0], atol=4)
  assert min(reductions) >= 2, reductions
  assert max(diffs) < 1.0, diffs
  # The image folder's read takes this path: the same crops.
  os.makedirs(tmp_path / 'f' / 'train' / 'a')
  shutil.copy(path, tmp_path / 'f' / 'train' / 'a' / 'big.jpg')
  src = sources.ImageFolder(tmp_path / 'f', 'train', image_size=64)
  small, full = sources.load_image(path, 3, fit.at(5).reduction(0, 64))
  np.testing.assert_array_equal(
      src.read([0], fit=fit.at(5))['image'][0],
      fit.at(5)(small, 0, 64, 3, full_size=full))


def test_an_arrayrecord_build_of_a_folder_reads_as_the_folder(tmp_path):
  # The pod's format: the folder's JPEGs as a TFDS ArrayRecord dataset,
  # read in a process that has no builder class for it (as one prepared on
  # another machine), gives the folder's own reads: the same decoding path,
  # centre squares and each view's crop of the full image alike.
  from benchmarks import input_rate  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'folder'
  for i, (h, w) in enumerate(((120, 90), (64, 200), (300, 260), (48, 48))):
    os.makedirs(root / 'train' / f'class_{i % 2}', exist_ok=True)
    _jpeg(root / 'train' / f'class_{i % 2}' / f'{i}.jpg', h, w, seed=i,
          quality=90)
  data_dir = input_rate.arrayrecord_of(str(root))
  script = f'''
import json, sys
import numpy as np
sys.path.insert(0, {REPO!r})
from input_pipeline import sources
fit = sources.RandomCrops((((0.08, 1.), (0.75, 4 / 3)),) * 2, seed=3).at(7)
out = {{}}
for name, src in (
    ('tfds', sources.TfdsSource({input_rate.ARRAYRECORD_NAME!r}, 'train',
                                data_dir={data_dir!r}, image_size=24)),
    ('folder', sources.ImageFolder({str(root)!r}, 'train', image_size=24))):
  ids = np.arange(len(src))
  out[name] = [src.read(ids)['image'].tolist(),
               src.read(ids, fit=fit)['image'].tolist(),
               src.read(ids)['label'].tolist(), list(src.classes)]
print('RESULT ' + json.dumps(out))
'''
  proc = subprocess.run([sys.executable, '-c', script], capture_output=True,
                        text=True, timeout=300, env=dict(os.environ))
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.split('RESULT ', 1)[1])
  squares, crops, labels, classes = out['tfds']
  assert classes == ['class_0', 'class_1'] and labels == [0, 0, 1, 1]
  assert np.asarray(squares).shape == (4, 24, 24, 3)
  assert np.asarray(crops).shape == (4, 2, 24, 24, 3)
  assert out['tfds'] == out['folder']
