"""Random-access data sources: how every split, small or huge, is read.

A source has `len`, `read(indices)` -> {'image': [B, H, W, C] uint8,
'label': [B]}, `num_classes`, `image_shape`, `classes` (or None) and
`skipped` ({id: why}: undecodable records, read as black images). A *fit*
(`CenterSquare`, `RandomCrops`) makes each decoded image an array.
docs/input_pipeline.md."""

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
# Imported here, never first in a function: a garbage collection during
# TFDS's lazy imports (a patched `__import__`) fails multiprocessing.
import tensorflow_datasets as tfds
from absl import logging

from contrastive_jax import storage
from input_pipeline import datasets
from input_pipeline import pipeline

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
_BILINEAR = Image.Resampling.BILINEAR


def _to_channels(image: np.ndarray, channels: int) -> np.ndarray:
  """[H, W, c] uint8 -> [H, W, channels]: grey repeated, or RGB's luma."""
  have = image.shape[-1]
  if have == channels:
    return image
  if (have, channels) == (1, 3):
    return np.repeat(image, 3, axis=-1)
  if (have, channels) == (3, 1):   # ITU-R 601 luma, as PIL's convert('L').
    return np.round(image @ np.array([0.299, 0.587, 0.114])).astype(
        np.uint8)[..., None]
  raise ValueError(f'cannot convert {have} channels to {channels}.')


def _pil(image: np.ndarray) -> Image.Image:
  return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _array(pil: Image.Image) -> np.ndarray:
  out = np.asarray(pil)
  return out[..., None] if out.ndim == 2 else out


def fit_square(image: np.ndarray, size: int | None, channels: int,
               fraction: float = 1.0, squash: bool = False) -> np.ndarray:
  """[H, W(, C)] uint8 -> [size, size, channels] uint8: torchvision's
  Resize(size / fraction) + CenterCrop(size), or with `squash` (fraction 1)
  Resize((size, size)); size None keeps the image's own size."""
  if image.ndim == 2:
    image = image[..., None]
  if squash and fraction != 1:
    raise ValueError('a squashed image keeps all of it: the centre crop '
                     f'fraction must be 1, not {fraction}.')
  if size is not None and (image.shape[:2] != (size, size) or fraction != 1):
    target = round(size / fraction)
    h, w = image.shape[:2]
    scale = target / min(h, w)
    new_h, new_w = max(target, round(h * scale)), max(target, round(w * scale))
    if squash:   # Resize((size, size)): the whole image, nothing cropped.
      new_h = new_w = size
    # PIL's bilinear filter antialiases when reducing, as torchvision's.
    image = _array(_pil(image).resize((new_w, new_h), _BILINEAR))
    top, left = (new_h - size) // 2, (new_w - size) // 2
    image = image[top:top + size, left:left + size]
  elif size is None and (fraction != 1 or squash):
    raise ValueError('a centre crop fraction or a squash needs a size to '
                     'resize to.')
  return np.ascontiguousarray(_to_channels(image, channels), dtype=np.uint8)


def crop_box(rng: np.random.Generator, height: int, width: int,
             scale: Sequence[float], ratio: Sequence[float]
             ) -> tuple[int, int, int, int]:
  """(top, left, h, w) of torchvision's RandomResizedCrop box: 10 tries of
  area ~U(scale), log aspect ~U(log ratio); else the centred fallback."""
  area = height * width
  log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
  for _ in range(10):
    target = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(log_lo, log_hi))
    w = round(math.sqrt(target * aspect))
    h = round(math.sqrt(target / aspect))
    if 0 < w <= width and 0 < h <= height:
      return (int(rng.integers(0, height - h + 1)),
              int(rng.integers(0, width - w + 1)), h, w)
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
  """`fit_square` with `fraction` (0.875: Resize(256) + CenterCrop(224)) or
  `squash` (`config.dataset.resize='squash'`)."""
  fraction: float = 1.0
  squash: bool = False

  def at(self, step: int) -> 'CenterSquare':
    del step
    return self

  def reduction(self, index: int, size: int):
    """(height, width) -> the largest JPEG reduction keeping the resize's
    shorter side."""
    least = round(size / self.fraction)
    return lambda height, width: jpeg_reduction(min(height, width) / least)

  def __call__(self, image, index: int, size: int, channels: int,
               full_size=None):
    return fit_square(image, size, channels, self.fraction, self.squash)


# Tells the crop draws' random stream from the other uses of config.seed.
_CROP_STREAM = 0x63726f70


@dataclasses.dataclass(frozen=True)
class RandomCrops:
  """One random resized crop per view from the full image: [V, S, S, C].

  boxes: per view, (crop_scale, crop_ratio), or None for the whole square.
  View v of example i draws from `default_rng([_CROP_STREAM, seed, step, i,
  v])` alone, so any number of processes reads the same crops."""
  boxes: tuple[tuple[tuple[float, float], tuple[float, float]] | None, ...]
  seed: int
  step: int = 0
  squash: bool = False

  def at(self, step: int) -> 'RandomCrops':
    return dataclasses.replace(self, step=int(step))

  def _boxes(self, index: int, height: int, width: int):
    return [None if box is None else crop_box(
        np.random.default_rng([_CROP_STREAM, self.seed, self.step,
                               int(index), v]), height, width, *box)
            for v, box in enumerate(self.boxes)]

  def reduction(self, index: int, size: int):
    """(height, width) -> the largest JPEG reduction keeping every box's
    shorter side (the image's, for a None box) >= `size`."""
    return lambda height, width: jpeg_reduction(min(
        min(b[2], b[3]) if b else min(height, width)
        for b in self._boxes(index, height, width)) / size)

  def __call__(self, image, index: int, size: int, channels: int,
               full_size=None):
    """`image` decoded from a `full_size` file (None: its own size); boxes
    are drawn in the file's pixels, whatever the decode's reduction."""
    image = _to_channels(image, channels)
    height, width = full_size or image.shape[:2]
    # libjpeg's reduced pixel i covers the file's [i k, (i + 1) k).
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
      else:
        crop = pil.resize((size, size), _BILINEAR, box=(
            left / k, top / k, (left + w) / k, (top + h) / k))
      views.append(_array(crop))
    return np.ascontiguousarray(np.stack(views), dtype=np.uint8)


def training_fit(dataset_config, views=None, seed: int = 0):
  """The fit of training reads: `RandomCrops` of `views` (full_image), the
  whole square when evaluation's fraction is below 1, else None (plain)."""
  dc = dataset_config
  if dc.train_crop_source == 'full_image' and views is not None:
    return RandomCrops(tuple(
        None if v.crop_scale is None else
        (tuple(float(x) for x in v.crop_scale),
         tuple(float(x) for x in v.crop_ratio)) for v in views), int(seed),
                       squash=dc.resize == 'squash')
  # Never with a squash (its fraction is 1).
  return CenterSquare() if dc.eval_crop_fraction != 1 else None


def source_fit(dataset_config) -> CenterSquare:
  """A decoding source's own fit (every plain read)."""
  return CenterSquare(float(dataset_config.eval_crop_fraction),
                      dataset_config.resize == 'squash')


def check_crop_options(dataset_config) -> None:
  """Raises for crop options a dataset cannot take: they need a decoding
  source, an `image_size`, and (crops, fractions) a streamed split."""
  dc = dataset_config
  crop_source, fraction = dc.train_crop_source, float(dc.eval_crop_fraction)
  for key, known in (('train_crop_source', ('center_square', 'full_image')),
                     ('resize', ('shorter_side', 'squash'))):
    if getattr(dc, key) not in known:
      raise ValueError(f'config.dataset.{key}={getattr(dc, key)!r}; use one '
                       f'of {", ".join(known)}.')
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
  if asked and dc.name == 'npz':
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
  if asked and not dc.image_size:
    raise ValueError(
        f'config.dataset.{" and ".join(asked)} resize each image to '
        'config.dataset.image_size, but image_size is None (the dataset\'s '
        'own size, never resized); set image_size or keep the defaults.')


def jpeg_reduction(ratio: float) -> int:
  """The largest JPEG DCT scale reduction (1, 2, 4 or 8) at most `ratio`."""
  return next((k for k in (8, 4, 2) if ratio >= k), 1)


def load_image(path, channels: int, reduction=None
               ) -> tuple[np.ndarray, tuple[int, int]]:
  """An image file (a path, or its bytes) -> ([H, W, C] uint8, the file's
  (height, width)), C = `channels` (1, 3 or 4); `reduction`: (height, width)
  -> k, a JPEG decoded at 1/k. simplejpeg decodes RGB JPEGs (PIL's pixels,
  faster), PIL the rest; 16-bit grey scales by 255 / 65535."""
  data = path if isinstance(path, bytes) else storage.read_bytes(path)
  if channels == 3 and data[:2] == b'\xff\xd8':
    try:
      height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
      k = reduction(height, width) if reduction else 1
      # simplejpeg picks 1/k itself unless a side is under 8 k.
      if colorspace in ('YCbCr', 'RGB', 'Gray') and min(height,
                                                          width) >= 8 * k:
        return simplejpeg.decode_jpeg(
            data, colorspace='RGB', min_height=-(-height // k),
            min_width=-(-width // k)), (height, width)
    except ValueError:
      pass   # Corrupt or unusual (or a libjpeg warning): PIL decides.
  mode = {1: 'L', 3: 'RGB', 4: 'RGBA'}.get(channels)
  if mode is None:
    raise ValueError(f'images of {channels} channels cannot be decoded; '
                     'use 1, 3 or 4.')
  try:
    im = Image.open(io.BytesIO(data))
  except UnidentifiedImageError:
    if isinstance(path, bytes):
      raise
    # Named by the file, not the buffer's address (differs by process).
    raise UnidentifiedImageError(
        f'cannot identify image file {str(path)!r}') from None
  with im:
    full = (im.height, im.width)
    if reduction is not None and im.format == 'JPEG':
      k = reduction(*full)
      im.draft(mode, (im.width // k, im.height // k))
    if im.mode.startswith('I'):      # 'I;16', 'I;16B', 'I': integer grey.
      image = np.clip(np.round(np.asarray(im, np.float64) / 257), 0,
                      255).astype(np.uint8)
    else:
      image = np.asarray(im if im.mode == mode else im.convert(mode))
  return (image[..., None] if image.ndim == 2 else image), full


class _ThreadedReader:
  """Reads examples on a thread pool (decoders release the GIL); `skipped`
  is replaced, never changed in place, so other threads see a whole dict."""

  num_threads: int = min(16, os.cpu_count() or 1)
  _pool: concurrent.futures.ThreadPoolExecutor | None = None

  def __init__(self, fit, image_size: int, channels: int):
    self.fit = fit
    self.image_shape = (image_size, image_size, channels)
    self._size, self._channels = image_size, channels
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
    """A copy decoding on `n` threads (a worker process's share)."""
    reader = copy.copy(self)     # __getstate__: no pool, a lock of its own.
    reader.num_threads = int(n)
    return reader

  def note_skipped(self, found: dict[int, str]) -> None:
    """Records what a decoding worker process found (and logged)."""
    for i, why in found.items():
      self._skip(int(i), why, log=False)

  def __getstate__(self):   # Pickled to worker processes: no pool or lock.
    return {k: v for k, v in self.__dict__.items()
            if k not in ('_pool', '_skipped_lock')}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._skipped_lock = threading.Lock()

  def _decode(self, data, i: int, fit) -> np.ndarray:
    """An image file (a path or its bytes) -> `fit`'s array of example i."""
    image, full = load_image(data, self._channels, fit.reduction(i, self._size))
    return fit(image, i, self._size, self._channels, full_size=full)

  def _read_chunk(self, indices: list[int], fit
                  ) -> list[tuple[np.ndarray, int]]:
    return [self._read_one(i, fit) for i in indices]

  def read(self, indices: Sequence[int], fit=None) -> dict[str, np.ndarray]:
    """{'image': [B, H, W, C] uint8 ([B, V, H, W, C] from `RandomCrops`),
    'label': [B]}."""
    fit = self.fit if fit is None else fit
    chunks = [c.tolist() for c in np.array_split(
        np.asarray(indices, np.int64), self.num_threads) if len(c)]
    mapper = map
    if self.num_threads > 1:    # Else a decoding worker process: no pool.
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(self.num_threads)
      mapper = self._pool.map
    pairs = [p for part in mapper(functools.partial(
        self._read_chunk, fit=fit), chunks) for p in part]
    if not pairs:   # The shape of a fitted image, from a black one.
      black = fit(np.zeros(self.image_shape, np.uint8), 0, self._size,
                  self._channels)
      return {'image': np.zeros((0,) + black.shape, np.uint8),
              'label': np.zeros((0,), np.int32)}
    return {'image': np.stack([p[0] for p in pairs]),
            'label': np.asarray([p[1] for p in pairs], np.int32)}

  def read_all(self):
    """The whole split as a `pipeline.ArrayDataset`."""
    return pipeline.ArrayDataset.from_source(self)


def _remote_fs(path):
  import fsspec  # pylint: disable=g-import-not-at-top
  storage.configure()
  fs, inner = fsspec.core.url_to_fs(str(path))
  return fs, inner.rstrip('/')


def _entries(path) -> list[str]:
  """Sorted visible names in folder `path`, folders with a trailing '/'."""
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
  """{'': `_entries(path)`, d: `_entries` of each sub-folder d}; a remote
  folder in one recursive listing, not a request per folder."""
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
  return [n[:-1] for n in names if n.endswith('/')]


def folder_classes(root: str | os.PathLike) -> tuple[str, ...]:
  """The sorted union of every split's class folders (TFDS ImageFolder's
  list): a class has the same id in every split."""
  if not storage.path(root).is_dir():
    return ()
  root = os.fspath(root).rstrip('/')
  return tuple(sorted({c for split in _dirs(_entries(root))
                       for c in _dirs(_entries(f'{root}/{split}'))}))


class ImageFolder(_ThreadedReader):
  """`root/<split>/<class>/<file>` images (TFDS ImageFolder's layout).

  The files in sorted (class, file) order, labelled by ids in `classes` (the
  dataset's list, not this split's). Hidden entries are not data, other
  files are ignored with a warning, an undecodable one is `skipped`."""

  def __init__(self, root: str | os.PathLike, split: str, *,
               image_size: int, channels: int = 3,
               classes: Sequence[str] | None = None,
               fit: CenterSquare = CenterSquare()):
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
    self.num_classes = len(self.classes)
    tree = _tree(split_dir)
    top = tree.get('', [])
    found = _dirs(top)
    unknown = sorted(set(found) - set(self.classes))
    if unknown:
      raise ValueError(
          f'{split_dir} has class folders {unknown} outside the run\'s class '
          f'list {list(self.classes)} (<workdir>/classes.json): a run keeps '
          'the class ids it started with; train on new classes in a new '
          '--workdir.')
    self.files, labels, ignored = [], [], []
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
    ignored += [f'{split_dir}/{entry.rstrip("?")}' for entry in top
                if not entry.endswith('/')]
    if ignored:
      logging.warning('%s: ignoring %d entries that are not %s files in a '
                      'class folder: %s', split_dir, len(ignored),
                      '/'.join(IMAGE_EXTENSIONS), ', '.join(ignored[:5]) +
                      (', ...' if len(ignored) > 5 else ''))
    if not self.files:
      raise FileNotFoundError(f'no {"/".join(IMAGE_EXTENSIONS)} images under '
                              f'{split_dir}/<class>/.')
    self.labels = np.asarray(labels, np.int32)
    super().__init__(fit, image_size, channels)

  def __len__(self) -> int:
    return len(self.files)

  def _read_one(self, i, fit):
    try:
      image = self._decode(self.files[i], i, fit)
    except MemoryError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      # A deterministic substitute keeps the batch's shape and resumes exact.
      self._skip(i, f'{self.files[i]} ({type(e).__name__}: {e})')
      image = fit(np.zeros(self.image_shape, np.uint8), i, self._size,
                  self._channels)
    return image, int(self.labels[i])


class TfdsSource(_ThreadedReader):
  """A TFDS split in the ArrayRecord format, read by `tfds.data_source`."""

  def __init__(self, name: str, split: str, *, data_dir: str | None,
               image_size: int | None, fit: CenterSquare = CenterSquare()):
    builder = datasets.get_builder(name, data_dir)
    if split not in builder.info.splits and '[' not in split:
      raise ValueError(f'{name!r} has no split {split!r}; splits: '
                       f'{", ".join(builder.info.splits)}.')
    # Encoded bytes, decoded by `load_image` with the fit's reduction.
    self._source = builder.as_data_source(
        split=split, decoders={'image': tfds.decode.SkipDecoding()})
    features = builder.info.features
    image, label = features['image'], features['label']
    self.num_classes, self.classes = label.num_classes, tuple(label.names)
    channels = image.shape[-1] or 3
    if image_size is None:
      if None in image.shape[:2]:
        raise ValueError(f'{name!r} has images of varying size; set '
                         'config.dataset.image_size.')
      image_size = image.shape[0]
    super().__init__(fit, image_size, channels)
    # read_all's cache: local data_dirs only, keyed by the split, the build
    # time and the fit, so a rebuilt dataset is decoded anew.
    local = '://' not in str(builder.data_dir)
    info = os.path.join(builder.data_dir, 'dataset_info.json')
    built = os.path.getmtime(info) if local and os.path.exists(info) else 0
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
    """The whole split as a `pipeline.ArrayDataset`, decoded once per machine
    into `decoded_path` (a file that does not match is decoded anew)."""
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
    buffer = io.BytesIO()
    np.savez(buffer, image=data.images, label=data.labels)
    try:
      storage.write_atomic(self.decoded_path, buffer.getvalue())
    except OSError as e:
      logging.info('Not caching the decoded split (%s).', e)
    return data

  def _read_chunk(self, indices, fit):
    # One batched ArrayRecord read: ~2x faster per record than one by one.
    return [(self._decode(ex['image'], i, fit), int(ex['label']))
            for i, ex in zip(indices, self._source.__getitems__(indices))]


_SLICE = re.compile(r'^([A-Za-z0-9_-]+)(?:\[(-?\d*):(-?\d*)\])?$')


def read_npz(root: str | os.PathLike, split: str):
  """`root/<name>.npz` ('image' [M, H, W(, C)] uint8, 'label' [M] int) as a
  `pipeline.ArrayDataset`; `split` is `name` or `name[a:b]`."""
  match = _SLICE.match(split)
  if match is None:
    raise ValueError(f'npz split {split!r}: name a file of '
                     f'{str(root)!r} without ".npz", optionally sliced as '
                     "'name[a:b]' with integer bounds, e.g. 'train[:2048]'.")
  name, start, stop = match.groups()
  path = f'{os.fspath(root).rstrip("/")}/{name}.npz'
  try:
    data = io.BytesIO(storage.read_bytes(path))   # np.load seeks.
  except (FileNotFoundError, IsADirectoryError):
    have = [n[:-4] for n in _entries(root) if n.endswith('.npz')] if (
        storage.path(root).is_dir()) else []
    raise FileNotFoundError(f'npz split {path!r} does not exist (splits '
                            f'there: {", ".join(have) or "none"}).') from None
  with np.load(data) as f:
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
  """The source of `split` for `config.dataset`: an image folder labelled by
  `classes` (default `folder_classes`), an npz split, or a TFDS dataset;
  read whole into memory with `in_memory`."""
  dc = dataset_config
  check_crop_options(dc)
  layout = {'npz': '<split>.npz', 'image_folder': '<split>/<class>/<image>'}
  if dc.name in layout and not dc.data_dir:
    raise ValueError(f'config.dataset.name="{dc.name}" reads <config.dataset.'
                     f'data_dir>/{layout[dc.name]}; set config.dataset.'
                     'data_dir.')
  if dc.name == 'npz':
    data = read_npz(dc.data_dir, split)
    if dc.image_size and data.image_shape[:2] != (dc.image_size,) * 2:
      raise ValueError(f'config.dataset.image_size={dc.image_size} but the '
                       f'npz images are {data.image_shape[:2]}; store them at '
                       'that size or leave image_size unset (None).')
    return data
  if dc.name == 'image_folder':
    if not dc.image_size:
      raise ValueError('an image folder needs config.dataset.image_size '
                       '(its images are resized and centre-cropped to it).')
    source = ImageFolder(dc.data_dir, split, image_size=dc.image_size,
                         classes=classes, fit=source_fit(dc))
  else:
    source = TfdsSource(dc.name, split, data_dir=dc.data_dir,
                        image_size=dc.image_size, fit=source_fit(dc))
  return source.read_all() if dc.in_memory else source
