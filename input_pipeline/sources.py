"""Random-access data sources: how every split, small or huge, is read.

A source is a sized, indexable split:

    len(source)                    number of examples M
    source.read(indices)           {'image': [B, H, W, C] uint8, 'label': [B]}
    source.num_classes, source.image_shape
    source.classes                 class names by id, or None
    source.skipped                 {id: what was wrong} of the records found
                                   undecodable so far (black substitutes)

Random access is what makes the input pipeline simple at pod scale: the global
order is a pure function of (seed, step) (`pipeline.TrainBatches`), each
process reads only the examples of its own part of each global batch, and a
resumed run reads exactly what an uninterrupted one would have, for any number
of processes, with no iterator state. Three kinds:

* `pipeline.ArrayDataset`: a split held in host memory (Fashion-MNIST, CIFAR:
  under 3 GB as uint8). An optimisation behind the same interface.
* `TfdsSource`: any TFDS dataset prepared in the ArrayRecord format, read
  through `tfds.data_source` (imagenet2012: 1.28M JPEGs, never all in memory;
  each read decodes only the requested records).
* `ImageFolder`: `root/<split>/<class>/*.jpg|png` (TFDS ImageFolder's
  layout), one class list for every split: custom data, and the tests' JPEG
  sets.
* `read_npz`: `root/<split>.npz` holding `image` [M, H, W, C] uint8 and
  `label` [M] int arrays, read whole into an `ArrayDataset`: data that is
  already arrays, and hosts without TensorFlow (TFDS needs it to build).

Images of varying size (JPEG sources) are decoded on the host and made into
fixed-shape arrays by a *fit*, so batches stack; the random augmentations then
run on the devices (`augment.py`). Decoding a JPEG needs a CPU codec and varies
in shape, which is why it is the host's job; everything after it is
fixed-shape array work that the accelerators do far faster than the host
(docs/input_pipeline.md). Two fits:

* `CenterSquare(fraction, squash)`: the shorter side resized to
  `image_size / fraction`, the central `image_size` square cut (fraction 1:
  the whole square; 0.875: torchvision's Resize(256) + CenterCrop(224)); or,
  squashed, the whole image resized to image_size x image_size
  (Resize((224, 224))). A decoding source's own `fit` (what a plain `read`
  gives, so every evaluation read) has `config.dataset.eval_crop_fraction`
  and `config.dataset.resize` (`source_fit`).
* `RandomCrops`: `config.dataset.train_crop_source='full_image'`, one random
  resized crop per view cut from the full decoded image and resized to
  `image_size` ([V, S, S, C] per example), drawn from (seed, step, example
  id, view) alone, so any number of processes reads the same crops.
  Training batches pass it to `read` (`training_fit`).
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import functools
import hashlib
import io
import math
import os
import pathlib
import re
import threading
import zipfile
from collections.abc import Sequence

import numpy as np
import simplejpeg
from PIL import Image
from PIL import UnidentifiedImageError
# Imported with this module, never first inside a function: TFDS imports its
# own dependencies under etils' `lazy_imports`, which replaces
# `builtins.__import__` while it runs. A garbage collection that lands in
# that window runs finalizers whose imports then fail (multiprocessing's,
# left by a dropped worker-process iterator: their semaphores leak). Imported
# here, it runs when the input pipeline is imported, before any such object
# exists.
import tensorflow_datasets as tfds
from absl import logging

from contrastive_jax import storage

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
_BILINEAR = Image.Resampling.BILINEAR


def _to_channels(image: np.ndarray, channels: int) -> np.ndarray:
  """[H, W, c] uint8 -> [H, W, channels]: grey repeated, or RGB's luma."""
  if image.shape[-1] != channels:
    if channels == 3 and image.shape[-1] == 1:
      image = np.repeat(image, 3, axis=-1)
    elif channels == 1 and image.shape[-1] == 3:
      # ITU-R 601 luma, as PIL's convert('L').
      image = np.round(image @ np.array([0.299, 0.587, 0.114])).astype(
          np.uint8)[..., None]
    else:
      raise ValueError(f'cannot convert {image.shape[-1]} channels to '
                       f'{channels}.')
  return image


def _pil(image: np.ndarray) -> Image.Image:
  """[h, w, C] uint8 -> a PIL image (mode L or RGB)."""
  return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _array(pil: Image.Image) -> np.ndarray:
  out = np.asarray(pil)
  return out[..., None] if out.ndim == 2 else out


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """[h, w, C] uint8 -> [height, width, C]: PIL's bilinear filter, which
  antialiases when reducing (torchvision's Resize on PIL images)."""
  return _array(_pil(image).resize((width, height), _BILINEAR))


def fit_square(image: np.ndarray, size: int | None, channels: int,
               fraction: float = 1.0, squash: bool = False) -> np.ndarray:
  """[H, W(, C)] uint8 -> [size, size, channels] uint8.

  Resizes the shorter side to `size / fraction` (bilinear, antialiased:
  PIL's reducing filter) and cuts the central `size` square (top-left
  corner at half the excess, rounded down): torchvision's Resize(size /
  fraction) + CenterCrop(size). `squash` instead resizes the whole image to
  size x size, its aspect ratio lost (torchvision's Resize((size, size))),
  so nothing is cut; the fraction must then be 1. None keeps the image's own
  size (it must then already be square and the same for every example; the
  fraction must be 1).
  """
  if image.ndim == 2:
    image = image[..., None]
  if squash and fraction != 1:
    raise ValueError('a squashed image keeps all of it: the centre crop '
                     f'fraction must be 1, not {fraction}.')
  if size is not None and squash:
    if image.shape[:2] != (size, size):
      image = _resize(image, size, size)
  elif size is not None and (image.shape[:2] != (size, size) or fraction != 1):
    target = size if fraction == 1 else round(size / fraction)
    h, w = image.shape[:2]
    scale = target / min(h, w)
    new_h, new_w = max(target, round(h * scale)), max(target, round(w * scale))
    image = _resize(image, new_h, new_w)
    top, left = (new_h - size) // 2, (new_w - size) // 2
    image = image[top:top + size, left:left + size]
  elif fraction != 1 or squash:
    raise ValueError('a centre crop fraction or a squash needs a size to '
                     'resize to.')
  return np.ascontiguousarray(_to_channels(image, channels), dtype=np.uint8)


def crop_box(rng: np.random.Generator, height: int, width: int,
             scale: Sequence[float], ratio: Sequence[float]
             ) -> tuple[int, int, int, int]:
  """(top, left, h, w) of a random resized crop of a height x width image.

  torchvision's RandomResizedCrop: up to 10 tries of an area fraction
  ~U(scale) and a log aspect ratio (w / h) ~U(log ratio), the first box that
  fits placed uniformly; else the largest centred box whose aspect ratio is
  within `ratio`.
  """
  area = height * width
  log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
  for _ in range(10):
    target = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(log_lo, log_hi))
    w = round(math.sqrt(target * aspect))
    h = round(math.sqrt(target / aspect))
    if 0 < w <= width and 0 < h <= height:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      return top, left, h, w
  in_ratio = width / height
  if in_ratio < min(ratio):
    w, h = width, round(width / min(ratio))
  elif in_ratio > max(ratio):
    h, w = height, round(height * max(ratio))
  else:
    h, w = height, width
  return (height - h) // 2, (width - w) // 2, h, w


@dataclasses.dataclass(frozen=True)
class CenterSquare:
  """The fit of evaluation reads (and of training with
  `train_crop_source='center_square'`): `fit_square`.

  fraction: the share of the resized shorter side the square keeps (1: all
    of it; 0.875: Resize(256) + CenterCrop(224) at 224).
  squash: the whole image resized to the square instead
    (`config.dataset.resize='squash'`).
  """
  fraction: float = 1.0
  squash: bool = False

  def at(self, step: int) -> 'CenterSquare':
    del step
    return self

  def reduction(self, index: int, size: int):
    """(height, width) -> the JPEG scale reduction (`load_image`): the
    largest that keeps both sides >= the resized shorter side."""
    del index
    least = round(size / self.fraction)   # A squash has fraction 1: size.
    return lambda height, width: jpeg_reduction(min(height, width) / least)

  def shape(self, image_shape) -> tuple[int, ...]:
    return tuple(image_shape)

  def __call__(self, image, index: int, size: int, channels: int,
               full_size=None):
    del index, full_size
    return fit_square(image, size, channels, self.fraction, self.squash)


# Tells the crop draws' random stream from the other uses of config.seed.
_CROP_STREAM = 0x63726f70


@dataclasses.dataclass(frozen=True)
class RandomCrops:
  """One random resized crop per view from the full decoded image.

  boxes: per view, (crop_scale, crop_ratio) of its random resized crop
    (`crop_box`), or None for a view without one (its image is the whole
    square, `CenterSquare(1, squash)`'s, e.g. a translation-crop view).
  seed, step: the draws of view v of example i come from
    `default_rng([_CROP_STREAM, seed, step, i, v])`, so they depend on
    nothing else (not the process, the batch, the other views).
  Each crop is resized to size x size (PIL bilinear, antialiased):
  [V, size, size, channels] per example.
  """
  boxes: tuple[tuple[tuple[float, float], tuple[float, float]] | None, ...]
  seed: int
  step: int = 0
  squash: bool = False

  def at(self, step: int) -> 'RandomCrops':
    return dataclasses.replace(self, step=int(step))

  def _boxes(self, index: int, height: int, width: int):
    """Each view's (top, left, h, w) in a height x width image, or None."""
    out = []
    for v, box in enumerate(self.boxes):
      if box is None:
        out.append(None)
        continue
      rng = np.random.default_rng([_CROP_STREAM, self.seed, self.step,
                                   int(index), v])
      out.append(crop_box(rng, height, width, *box))
    return out

  def reduction(self, index: int, size: int):
    """(height, width) -> the JPEG scale reduction (`load_image`): the
    largest that keeps every view's crop box >= `size` on both sides (so
    each crop is still reduced, never enlarged, to `size`), and the
    shorter side >= `size` for a view without a box."""
    def reduce(height, width):
      sides = [min(b[2], b[3]) if b else min(height, width)
               for b in self._boxes(index, height, width)]
      return jpeg_reduction(min(sides) / size)
    return reduce

  def shape(self, image_shape) -> tuple[int, ...]:
    return (len(self.boxes),) + tuple(image_shape)

  def __call__(self, image, index: int, size: int, channels: int,
               full_size=None):
    """`image` [h, w, C] uint8, decoded from a `full_size` (height, width)
    file (a JPEG decoded at a reduced scale, `reduction`), or the file's
    own size (None): the boxes are drawn in the file's pixels either way,
    so the draws never depend on how the file was decoded."""
    if image.ndim == 2:
      image = image[..., None]
    image = _to_channels(image, channels)
    height, width = full_size or image.shape[:2]
    # libjpeg's reduced pixel i covers the file's pixels [i k, (i + 1) k)
    # (the last one fewer when k does not divide the side): scale by 1/k.
    k = max(1, round(width / image.shape[1]))
    pil = _pil(image)
    views = []
    for box in self._boxes(index, height, width):
      if box is None:
        views.append(fit_square(image, size, channels, squash=self.squash))
        continue
      top, left, h, w = box
      if k == 1:    # torchvision's crop, then resize.
        crop = pil.crop((left, top, left + w, top + h)).resize(
            (size, size), _BILINEAR)
      else:   # The same box in the reduced image's coordinates.
        crop = pil.resize((size, size), _BILINEAR, box=(
            left / k, top / k, (left + w) / k, (top + h) / k))
      views.append(_array(crop))
    return np.ascontiguousarray(np.stack(views), dtype=np.uint8)


TRAIN_CROP_SOURCES = ('center_square', 'full_image')
RESIZES = ('shorter_side', 'squash')


def training_fit(dataset_config, views=None, seed: int = 0):
  """The fit training batches read with (`pipeline.TrainBatches`'s `fit`).

  `RandomCrops` of `views` (their crop_scale and crop_ratio) with
  `train_crop_source='full_image'` and views given; else the whole square,
  `CenterSquare()`, when the sources' own fit is another (an
  `eval_crop_fraction` below 1); else None: the source's plain read.
  """
  dc = dataset_config
  squash = dc.resize == 'squash'
  if dc.train_crop_source == 'full_image' and views is not None:
    return RandomCrops(tuple(
        None if v.crop_scale is None else
        (tuple(float(x) for x in v.crop_scale),
         tuple(float(x) for x in v.crop_ratio)) for v in views), int(seed),
                       squash=squash)
  if dc.eval_crop_fraction != 1:   # Never with a squash (its fraction is 1).
    return CenterSquare()
  return None


def source_fit(dataset_config) -> CenterSquare:
  """A decoding source's own fit: what every plain read (each evaluation)
  gives, `config.dataset.eval_crop_fraction` and `resize`."""
  return CenterSquare(float(dataset_config.eval_crop_fraction),
                      dataset_config.resize == 'squash')


def check_crop_options(dataset_config) -> None:
  """Raises for `train_crop_source` / `eval_crop_fraction` / `resize` values
  a dataset cannot take: they act where the host decodes and resizes
  images, so they need a decoding source (an npz split holds fixed squares)
  and an `image_size` to resize to; a crop source or a fraction below 1
  also needs the split streamed (an in-memory one holds one square per
  image, for training and evaluation alike)."""
  dc = dataset_config
  crop_source, fraction = dc.train_crop_source, float(dc.eval_crop_fraction)
  if crop_source not in TRAIN_CROP_SOURCES:
    raise ValueError(f'config.dataset.train_crop_source={crop_source!r}; use '
                     f'one of {", ".join(TRAIN_CROP_SOURCES)}.')
  if dc.resize not in RESIZES:
    raise ValueError(f'config.dataset.resize={dc.resize!r}; use one of '
                     f'{", ".join(RESIZES)}.')
  if not 0 < fraction <= 1:
    raise ValueError(f'config.dataset.eval_crop_fraction={fraction} must be '
                     'in (0, 1] (0.875: Resize(256) + CenterCrop(224)).')
  squash = dc.resize == 'squash'
  if squash and fraction != 1:
    raise ValueError(
        f"config.dataset.resize='squash' resizes the whole image to "
        f'image_size x image_size, so there is nothing to centre-crop, but '
        f'config.dataset.eval_crop_fraction={fraction}; set it to 1.0 (or '
        "resize='shorter_side' for Resize + CenterCrop).")
  asked = [what for what, on in (
      ("train_crop_source='full_image'", crop_source == 'full_image'),
      (f'eval_crop_fraction={fraction}', fraction != 1),
      ("resize='squash'", squash)) if on]
  if not asked:
    return
  if dc.name == 'npz':
    raise ValueError(
        f'config.dataset.{" and ".join(asked)} act where the host decodes '
        'each image, but an npz split holds fixed squares '
        '(config.dataset.name=npz); use an image folder or a TFDS dataset, '
        'or store the arrays already fitted and keep the defaults.')
  streamed = [what for what in asked if what != "resize='squash'"]
  if dc.in_memory and streamed:
    raise ValueError(
        f'config.dataset.{" and ".join(streamed)} act where the host decodes '
        'each image, but this split is held in memory as fixed squares '
        '(config.dataset.in_memory); stream it: config.dataset.in_memory='
        'False with an image folder or a TFDS dataset.')
  if not dc.image_size:
    raise ValueError(
        f'config.dataset.{" and ".join(asked)} resize each image to '
        'config.dataset.image_size, but image_size is None (the dataset\'s '
        'own size, never resized); set image_size or keep the defaults.')


def jpeg_reduction(ratio: float) -> int:
  """The largest JPEG DCT scale reduction (1, 2, 4 or 8) at most `ratio`.

  libjpeg-turbo decodes at 1/2, 1/4 or 1/8 of the size by computing fewer
  DCT coefficients, for a fraction of the work, where the pixels would be
  thrown away by a resize anyway (PIL's `draft()` reductions)."""
  for k in (8, 4, 2):
    if ratio >= k:
      return k
  return 1


def load_image(path, channels: int, reduction=None
               ) -> tuple[np.ndarray, tuple[int, int]]:
  """An image file (a path, or its bytes) -> ([H, W, C] uint8, the file's
  (height, width)); C is 1 or 3.

  Every PIL mode becomes 8-bit grey or RGB: palette images through their
  palette, CMYK by PIL's conversion, alpha dropped (the colour channels as
  stored, as TensorFlow's decoders do), 16-bit grey scaled by 255 / 65535
  (PIL's own conversion would clip it at 255).

  `reduction`: (height, width) -> 1, 2, 4 or 8: a JPEG is decoded at that
  fraction of its size (`jpeg_reduction`), the image's shape then being
  the reduced one. JPEGs that decode to RGB (YCbCr, RGB or greyscale files,
  when `channels` is 3) go through libjpeg-turbo's own API (simplejpeg),
  which skips PIL's conversions: the same decoder with the same settings,
  so the same pixels as PIL at every reduction (tests/test_sources.py),
  in about two thirds of the time on this CPU. The rest go through PIL.
  """
  data = path if isinstance(path, bytes) else storage.read_bytes(path)
  if channels == 3 and data[:2] == b'\xff\xd8':
    try:
      height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
      k = reduction(height, width) if reduction else 1
      # simplejpeg picks the smallest of libjpeg-turbo's M/8 scales that
      # gives the size asked for: 1/k itself unless a side is under 8 k.
      if colorspace in ('YCbCr', 'RGB', 'Gray') and min(height,
                                                          width) >= 8 * k:
        image = simplejpeg.decode_jpeg(
            data, colorspace='RGB', min_height=-(-height // k),
            min_width=-(-width // k))
        return image, (height, width)
    except ValueError:
      # A corrupt or unusual file (simplejpeg raises on libjpeg's warnings
      # too): PIL decides what it is, as for every other file.
      pass
  mode = {1: 'L', 3: 'RGB', 4: 'RGBA'}.get(channels)
  if mode is None:
    raise ValueError(f'images of {channels} channels cannot be decoded; '
                     'use 1, 3 or 4.')
  try:
    im = Image.open(io.BytesIO(data))
  except UnidentifiedImageError:
    if isinstance(path, bytes):
      raise
    # Named by the file, as PIL names a file it opens itself (not by the
    # buffer's address, which differs between processes).
    raise UnidentifiedImageError(
        f'cannot identify image file {str(path)!r}') from None
  with im:
    full = (im.height, im.width)
    if reduction is not None and im.format == 'JPEG':
      # draft() picks the largest reduction within the size (and, for one
      # channel, has libjpeg give the luma plane).
      k = reduction(*full)
      im.draft(mode, (im.width // k, im.height // k))
    if im.mode.startswith('I'):      # 'I;16', 'I;16B', 'I': integer grey.
      image = np.clip(np.round(np.asarray(im, np.float64) / 257), 0,
                      255).astype(np.uint8)
    else:
      image = np.asarray(im if im.mode == mode else im.convert(mode))
  return (image[..., None] if image.ndim == 2 else image), full


class _ThreadedReader:
  """Reads examples one by one on a thread pool (decoders release the GIL).

  `skipped` collects the records that could not be decoded, as they are
  found (each logged once). It is replaced, never changed in place, so a
  reader on another thread (the online kNN while batches are prefetched)
  iterates over a consistent dict.
  """

  num_threads: int = min(16, os.cpu_count() or 1)
  _pool: concurrent.futures.ThreadPoolExecutor | None = None
  classes: tuple[str, ...] | None = None
  # What a plain read gives (every evaluation read): see the module doc.
  fit: CenterSquare = CenterSquare()

  def __init__(self):
    self.skipped: dict[int, str] = {}
    self._skipped_lock = threading.Lock()

  def _skip(self, i: int, why: str, *, log: bool = True) -> None:
    with self._skipped_lock:
      if i in self.skipped:
        return
      self.skipped = {**self.skipped, i: why}
    if log:
      logging.warning('Cannot decode %s; it is replaced by a black image in '
                      'training and left out of evaluation '
                      '(config.dataset.max_bad_fraction).', why)

  def with_threads(self, n: int) -> '_ThreadedReader':
    """A copy that decodes on `n` threads (a decoding worker's share of the
    cores); what it finds undecodable is recorded in the copy."""
    reader = copy.copy(self)     # __getstate__: no pool, a lock of its own.
    reader.num_threads = int(n)
    return reader

  def note_skipped(self, found: dict[int, str]) -> None:
    """Records what a decoding worker process found (it logged them)."""
    for i, why in found.items():
      self._skip(int(i), why, log=False)

  def _read_one(self, i: int, fit) -> tuple[np.ndarray, int]:
    raise NotImplementedError

  def __getstate__(self):
    # Decoding worker processes receive the source pickled; each starts its
    # own pool and lock.
    state = dict(self.__dict__)
    state.pop('_pool', None)
    state.pop('_skipped_lock', None)
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._skipped_lock = threading.Lock()

  def _read_chunk(self, indices: list[int], fit
                  ) -> list[tuple[np.ndarray, int]]:
    return [self._read_one(i, fit) for i in indices]

  def read(self, indices: Sequence[int], fit=None) -> dict[str, np.ndarray]:
    """{'image': [B, *fit.shape(image_shape)] uint8, 'label': [B]}; `fit`
    (a `CenterSquare` or `RandomCrops`) defaults to the source's own."""
    fit = self.fit if fit is None else fit
    indices = [int(i) for i in np.asarray(indices)]
    if self.num_threads == 1:    # A decoding worker process: no pool.
      pairs = self._read_chunk(indices, fit) if indices else []
    else:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(self.num_threads)
      # One contiguous chunk per thread, results in the order asked for.
      chunks = [c.tolist() for c in np.array_split(
          np.asarray(indices, np.int64), self.num_threads) if len(c)]
      pairs = [p for part in self._pool.map(
          functools.partial(self._read_chunk, fit=fit), chunks)
               for p in part]
    if not pairs:
      return {'image': np.zeros((0,) + fit.shape(self.image_shape), np.uint8),
              'label': np.zeros((0,), np.int32)}
    return {'image': np.stack([p[0] for p in pairs]),
            'label': np.asarray([p[1] for p in pairs], np.int32)}

  def read_all(self):
    """The whole split in memory, a `pipeline.ArrayDataset`."""
    from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
    return pipeline.ArrayDataset.from_source(self)


def _remote_fs(path):
  """(fsspec filesystem, path within it) of a remote URL."""
  import fsspec  # pylint: disable=g-import-not-at-top
  storage.configure()
  fs, inner = fsspec.core.url_to_fs(str(path))
  return fs, inner.rstrip('/')


def _entries(path) -> list[str]:
  """The sorted visible (not dot-prefixed) names in folder `path`, folders
  with a trailing '/'."""
  if storage.is_remote(path):
    fs, inner = _remote_fs(path)
    names = [e['name'].rstrip('/').rsplit('/', 1)[-1] +
             ('/' if e['type'] == 'directory' else '')
             for e in fs.ls(inner, detail=True)]
  else:
    # Neither a folder nor a file (a broken link): '?', never an image.
    with os.scandir(path) as it:
      names = [e.name + ('/' if e.is_dir() else '' if e.is_file() else '?')
               for e in it]
  return sorted(n for n in names if not n.startswith('.'))


def _tree(path) -> dict[str, list[str]]:
  """Folder `path` two levels down: {'': `_entries(path)`, d: `_entries` of
  each sub-folder d}. A remote folder is read with one recursive listing of
  its objects (fsspec's `find`): asking an object store about each folder
  or file would be a request per image."""
  if not storage.is_remote(path):
    top = _entries(path)
    return {'': top, **{d: _entries(os.path.join(path, d))
                        for d in _dirs(top)}}
  fs, inner = _remote_fs(path)
  tree: dict[str, set[str]] = {}
  for obj in fs.find(inner, withdirs=False, detail=False):
    parts = obj[len(inner) + 1:].split('/')
    if not parts[-1] or any(p.startswith('.') for p in parts):
      continue
    tree.setdefault('', set()).add(parts[0] + ('/' if len(parts) > 1 else ''))
    if len(parts) > 1:
      tree.setdefault(parts[0], set()).add(
          parts[1] + ('/' if len(parts) > 2 else ''))
  return {k: sorted(v) for k, v in tree.items()}


def _dirs(names) -> list[str]:
  """The folder names among `_entries`' names."""
  return [n[:-1] for n in names if n.endswith('/')]


def folder_classes(root: str | os.PathLike) -> tuple[str, ...]:
  """The class list of an image folder: the sorted union of the class folder
  names of all its splits (as TFDS's ImageFolder builder), so that a class
  has the same id in every split, whichever splits lack it."""
  if not storage.path(root).is_dir():
    return ()
  root = os.fspath(root).rstrip('/')
  return tuple(sorted({c for split in _dirs(_entries(root))
                       for c in _dirs(_entries(f'{root}/{split}'))}))


class ImageFolder(_ThreadedReader):
  """`root/<split>/<class>/<file>` images, as TFDS's ImageFolder lays them out.

  Examples are the files in sorted (class, file name) order, so an index is a
  stable example id. Labels are ids in `classes`: the dataset's class list
  (`folder_classes`, or a run's stored one), never this split's own, so
  every split labels a class alike. Hidden files and folders (".DS_Store",
  "._x.jpg", ".ipynb_checkpoints") are not data; other files that are not
  .jpg/.jpeg/.png in any case are ignored with a warning. A file that does
  not decode becomes a black image and is recorded in `skipped`.
  """

  def __init__(self, root: str | os.PathLike, split: str, *,
               image_size: int, channels: int = 3,
               classes: Sequence[str] | None = None,
               fit: CenterSquare = CenterSquare()):
    super().__init__()
    self.fit = fit
    root = os.fspath(root).rstrip('/')
    split_dir = f'{root}/{split}'
    if not storage.path(split_dir).is_dir():
      have = _dirs(_entries(root)) if storage.path(root).is_dir() else []
      raise FileNotFoundError(
          f'image folder split {str(split_dir)!r} does not exist (splits '
          f'there: {have or "none"}); lay images out as '
          '<config.dataset.data_dir>/<split>/<class>/<image>.')
    self.classes = tuple(folder_classes(root) if classes is None
                         else classes)
    tree = _tree(split_dir)
    found = _dirs(tree.get('', []))
    unknown = sorted(set(found) - set(self.classes))
    if unknown:
      raise ValueError(
          f'{split_dir} has class folders {unknown} outside the run\'s class '
          f'list {list(self.classes)} (<workdir>/classes.json): a run keeps '
          'the class ids it started with; train on new classes in a new '
          '--workdir.')
    self.files, labels, ignored = [], [], []
    # pathlib paths, or epath's for a remote folder (the same interface).
    base = (storage.path(split_dir) if storage.is_remote(split_dir) else
            pathlib.Path(split_dir))
    for label, name in enumerate(self.classes):
      if name not in found:
        continue
      for entry in tree.get(name, []):
        path = base / name / entry
        if os.path.splitext(entry)[1].lower() in IMAGE_EXTENSIONS:
          self.files.append(path)
          labels.append(label)
        else:
          ignored.append(str(path).rstrip('?'))
    ignored += [f'{split_dir}/{entry.rstrip("?")}' for entry in tree.get(
        '', []) if not entry.endswith('/')]
    if ignored:
      logging.warning('%s: ignoring %d entries that are not %s files in a '
                      'class folder: %s', split_dir, len(ignored),
                      '/'.join(IMAGE_EXTENSIONS), ', '.join(ignored[:5]) +
                      (', ...' if len(ignored) > 5 else ''))
    if not self.files:
      raise FileNotFoundError(f'no {"/".join(IMAGE_EXTENSIONS)} images under '
                              f'{split_dir}/<class>/.')
    self.labels = np.asarray(labels, np.int32)
    self.image_shape = (image_size, image_size, channels)
    self._size, self._channels = image_size, channels

  def __len__(self) -> int:
    return len(self.files)

  @property
  def num_classes(self) -> int:
    return len(self.classes)

  def _read_one(self, i, fit):
    try:
      image, full = load_image(self.files[i], self._channels,
                               fit.reduction(i, self._size))
      image = fit(image, i, self._size, self._channels, full_size=full)
    except MemoryError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      # Whatever the decoder raises (not an image, truncated, a broken
      # chunk), it concerns this one file: a deterministic substitute keeps
      # the batch's shape and a resumed run's batches exact.
      self._skip(i, f'{self.files[i]} ({type(e).__name__}: {e})')
      image = fit(np.zeros(self.image_shape, np.uint8), i, self._size,
                  self._channels)
    return image, int(self.labels[i])


class TfdsSource(_ThreadedReader):
  """A TFDS split in the ArrayRecord format, read by `tfds.data_source`."""

  def __init__(self, name: str, split: str, *, data_dir: str | None,
               image_size: int | None, fit: CenterSquare = CenterSquare()):
    from input_pipeline import datasets  # pylint: disable=g-import-not-at-top
    super().__init__()
    self.fit = fit
    builder = datasets.get_builder(name, data_dir)
    if split not in builder.info.splits and '[' not in split:
      raise ValueError(f'{name!r} has no split {split!r}; splits: '
                       f'{", ".join(builder.info.splits)}.')
    # The encoded image bytes, decoded by `load_image` as an image folder's
    # files are (libjpeg-turbo's API for JPEGs, with the fit's DCT-domain
    # reduction), rather than by TFDS's full-size PIL decode. From the
    # builder itself: a dataset prepared elsewhere, whose builder class
    # this process does not have, reads the same way.
    self._source = builder.as_data_source(
        split=split, decoders={'image': tfds.decode.SkipDecoding()})
    features = builder.info.features
    image = features['image']
    self.num_classes = features['label'].num_classes
    self.classes = tuple(features['label'].names)
    channels = image.shape[-1] or 3
    if image_size is None:
      if None in image.shape[:2]:
        raise ValueError(f'{name!r} has images of varying size; set '
                         'config.dataset.image_size.')
      image_size = image.shape[0]
    self.image_shape = (image_size, image_size, channels)
    self._size, self._channels = image_size, channels
    # Where read_all keeps the decoded split: local data_dirs only (a gs://
    # one would take a round trip per run for what decoding gives anyway).
    # Keyed by the split and the build (dataset_info.json's time), so a
    # rebuilt dataset is decoded anew.
    local = '://' not in str(builder.data_dir)
    info = os.path.join(builder.data_dir, 'dataset_info.json')
    built = os.path.getmtime(info) if local and os.path.exists(info) else 0
    # 'load_image 2': decoded by `load_image` (a cache written by TFDS's
    # own decode is decoded anew).
    key = f'{split} {built} load_image 2' + (
        f' {fit.fraction}' if fit.fraction != 1 else '') + (
            ' squash' if fit.squash else '')
    digest = hashlib.sha1(key.encode()).hexdigest()[:8]
    self.decoded_path = None if not local else (
        os.path.join(builder.data_dir, 'decoded',
                     f'{re.sub(r"[^A-Za-z0-9]+", "_", split)}-{digest}-'
                     f'{image_size}x{image_size}x{channels}.npz'))

  def __len__(self) -> int:
    return len(self._source)

  def read_all(self):
    """The whole split as a `pipeline.ArrayDataset`, decoded once per machine.

    Decoding is per-record Python work (Fashion-MNIST's 60k PNGs: 16.5 s at
    every run's start on the 2-core CPU); the decoded arrays (47 MB for
    Fashion-MNIST, 150 MB for CIFAR-10) are kept next to the prepared
    dataset, at `decoded_path`, and read back in well under a second. Written
    to a temporary file and renamed, so processes starting together never
    read half a file; a file that does not match the split (size, shape) is
    decoded anew. A read-only data_dir just decodes every time.
    """
    from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
    if self.decoded_path is None:
      return super().read_all()
    try:
      with np.load(self.decoded_path) as f:
        data = pipeline.ArrayDataset(f['image'], f['label'],
                                     classes=self.classes)
      if len(data) == len(self) and data.image_shape == self.image_shape:
        return data
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
      pass   # Absent or unreadable: decode.
    data = super().read_all()
    tmp = f'{self.decoded_path}.{os.getpid()}.tmp'
    try:
      os.makedirs(os.path.dirname(self.decoded_path), exist_ok=True)
      with open(tmp, 'wb') as f:
        np.savez(f, image=data.images, label=data.labels)
      os.replace(tmp, self.decoded_path)
    except OSError as e:
      logging.info('Not caching the decoded split (%s).', e)
      if os.path.exists(tmp):
        os.remove(tmp)
    return data

  def _read_one(self, i, fit):
    return self._read_chunk([i], fit)[0]

  def _read_chunk(self, indices, fit):
    # One batched ArrayRecord read: ~2x faster per record than one by one.
    out = []
    for i, ex in zip(indices, self._source.__getitems__(indices)):
      image, full = load_image(ex['image'], self._channels,
                               fit.reduction(i, self._size))
      out.append((fit(image, i, self._size, self._channels, full_size=full),
                  int(ex['label'])))
    return out


_SLICE = re.compile(r'^([A-Za-z0-9_-]+)(?:\[(-?\d*):(-?\d*)\])?$')


def read_npz(root: str | os.PathLike, split: str):
  """`root/<name>.npz` as a `pipeline.ArrayDataset`; `split` is `name` or
  `name[a:b]` (integer bounds, TFDS's slice syntax), e.g. 'train[:2048]'.

  Write one with `np.savez(path, image=images, label=labels)` (images
  [M, H, W, C] uint8, labels [M] int; `savez_compressed` to ship it smaller).
  """
  from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
  match = _SLICE.match(split)
  if match is None:
    raise ValueError(f'npz split {split!r}: name a file of '
                     f'{str(root)!r} without ".npz", optionally sliced as '
                     "'name[a:b]' with integer bounds, e.g. 'train[:2048]'.")
  name, start, stop = match.groups()
  path = f'{os.fspath(root).rstrip("/")}/{name}.npz'
  try:
    # A remote file is read whole first (np.load seeks); a local one as is.
    data = (io.BytesIO(storage.read_bytes(path)) if storage.is_remote(path)
            else open(path, 'rb'))   # pylint: disable=consider-using-with
  except (FileNotFoundError, IsADirectoryError):
    have = [n[:-4] for n in _entries(root) if n.endswith('.npz')] if (
        storage.path(root).is_dir()) else []
    raise FileNotFoundError(f'npz split {path!r} does not exist (splits '
                            f'there: {", ".join(have) or "none"}).') from None
  with data, np.load(data) as f:
    if not {'image', 'label'} <= set(f.files):
      raise ValueError(f'{path} holds {f.files}; it needs the arrays "image" '
                       '[M, H, W, C] uint8 and "label" [M] int.')
    images, labels = f['image'], f['label']
  if images.ndim == 3:   # [M, H, W]: one channel.
    images = images[..., None]
  if images.dtype != np.uint8:
    raise ValueError(f'{path}: "image" is {images.dtype}; store uint8 pixels '
                     '(0-255), as the decoders of the other sources give.')
  part = slice(int(start) if start else None, int(stop) if stop else None)
  if match.group(2) is not None and not len(labels[part]):
    raise ValueError(f'npz split {split!r} selects no example of the '
                     f'{len(labels)} in {path}.')
  return pipeline.ArrayDataset(np.ascontiguousarray(images[part]),
                               labels[part].astype(np.int32))


def open_split(dataset_config, split: str,
               classes: Sequence[str] | None = None):
  """The source of `split` for `config.dataset` (name, data_dir, image_size,
  in_memory; eval_crop_fraction and resize: the source's own fit,
  `source_fit`; `check_crop_options`).

  `name='image_folder'` reads `data_dir/<split>/<class>/*`, labelled by
  `classes` (default: the folder's class list, `folder_classes`);
  `name='npz'` reads `data_dir/<split>.npz` (`read_npz`, always in memory);
  any other name is a TFDS dataset (built or checked by
  `datasets.get_builder`). With `in_memory`, the split is read once into an
  `ArrayDataset` (a TFDS split decoded once per machine,
  `TfdsSource.read_all`).
  """
  dc = dataset_config
  check_crop_options(dc)
  fit = source_fit(dc)
  if dc.name == 'npz':
    if not dc.data_dir:
      raise ValueError('config.dataset.name="npz" reads '
                       '<config.dataset.data_dir>/<split>.npz; set '
                       'config.dataset.data_dir.')
    data = read_npz(dc.data_dir, split)
    if dc.image_size and data.image_shape[:2] != (dc.image_size,) * 2:
      raise ValueError(f'config.dataset.image_size={dc.image_size} but the '
                       f'npz images are {data.image_shape[:2]}; store them at '
                       'that size or leave image_size unset (None).')
    return data
  if dc.name == 'image_folder':
    if not dc.data_dir:
      raise ValueError('config.dataset.name="image_folder" reads '
                       '<config.dataset.data_dir>/<split>/<class>/<image>; '
                       'set config.dataset.data_dir.')
    if not dc.image_size:
      raise ValueError('an image folder needs config.dataset.image_size '
                       '(its images are resized and centre-cropped to it).')
    source = ImageFolder(dc.data_dir, split, image_size=dc.image_size,
                         classes=classes, fit=fit)
  else:
    source = TfdsSource(dc.name, split, data_dir=dc.data_dir,
                        image_size=dc.image_size, fit=fit)
  return source.read_all() if dc.in_memory else source


# --------------------------------------------------------------------------
# What a run checks about its splits (data.load): bad records, classes.
# --------------------------------------------------------------------------

def check_skipped(what: str, skipped: dict[int, str], size: int,
                  max_fraction: float) -> None:
  """Raises, listing the bad records, when more than `max_fraction` of the
  `size` records of a split (`what`, e.g. "training split 'train'") are
  undecodable (`skipped`: id -> file and error)."""
  if len(skipped) <= max_fraction * size:
    return
  listed = [skipped[i] for i in sorted(skipped)]
  shown = '; '.join(listed[:20]) + (
      f'; and {len(listed) - 20} more (each logged above)'
      if len(listed) > 20 else '')
  raise ValueError(
      f'{len(skipped)} of the {size} records of the {what} cannot be decoded, '
      f'more than config.dataset.max_bad_fraction={max_fraction} of it: '
      f'{shown}. Remove or replace these files (config.dataset.verify=True '
      'lists every bad file before training starts), or raise '
      'config.dataset.max_bad_fraction to train with black images in their '
      'place.')


def _names(classes, ids) -> str:
  ids = list(ids)
  named = [repr(classes[c]) if classes else f'id {c}' for c in ids[:20]]
  return ', '.join(named) + (f' and {len(ids) - 20} more'
                             if len(ids) > 20 else '')


def class_warnings(train, evaluation, *, train_name: str,
                   eval_name: str) -> list[str]:
  """What a user must know when two splits' classes differ: one message each.

  Compares `num_classes`, and, where the sources know their labels without
  decoding (`labels`: image folders, in-memory splits), which classes have
  examples in which split.
  """
  out = []
  if train.num_classes != evaluation.num_classes:
    out.append(
        f'the {train_name} has {train.num_classes} classes and the '
        f'{eval_name} {evaluation.num_classes}: scores take ids 0..'
        f'{max(train.num_classes, evaluation.num_classes) - 1} to mean the '
        'same classes in both.')
  train_labels = getattr(train, 'labels', None)
  eval_labels = getattr(evaluation, 'labels', None)
  if train_labels is None or eval_labels is None:
    return out
  n = max(train.num_classes, evaluation.num_classes)
  in_train = np.bincount(train_labels, minlength=n) > 0
  in_eval = np.bincount(eval_labels, minlength=n) > 0
  classes = train.classes or evaluation.classes
  if (lacking := np.flatnonzero(in_train & ~in_eval)).size:
    out.append(f'the {eval_name} has no examples of {_names(classes, lacking)}'
               f', which the {train_name} has; every split labels a class '
               'with the same id, so the scores stay correct.')
  if (lacking := np.flatnonzero(in_eval & ~in_train)).size:
    count = int(np.isin(eval_labels, lacking).sum())
    out.append(f'the {train_name} has no examples of '
               f'{_names(classes, lacking)}, which the {eval_name} has: '
               f'nothing can predict them, so its {count} examples of them '
               'count as errors.')
  if classes and (empty := np.flatnonzero(~in_train & ~in_eval)).size:
    out.append(f'{_names(classes, empty)} have no examples in either split '
               '(empty class folders, or slices without them); they keep '
               'their ids.')
  return out


def fingerprint(source) -> bytes:
  """What every process must agree on about a split: its size, class list,
  labels and (image folders) files."""
  h = hashlib.sha256(repr((len(source), source.classes)).encode())
  labels = getattr(source, 'labels', None)
  if labels is not None:
    h.update(np.asarray(labels, np.int32).tobytes())
  for f in getattr(source, 'files', ()):
    h.update(f'{f.parent.name}/{f.name}\n'.encode())
  return h.digest()
