"""Random-access data sources: how every split, small or huge, is read.

A source is a sized, indexable split:

    len(source)                    number of examples M
    source.read(indices)           {'image': [B, H, W, C] uint8, 'label': [B]}
    source.num_classes, source.image_shape

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
  layout), classes in sorted order: custom data, and the tests' JPEG sets.
* `read_npz`: `root/<split>.npz` holding `image` [M, H, W, C] uint8 and
  `label` [M] int arrays, read whole into an `ArrayDataset`: data that is
  already arrays, and hosts without TensorFlow (TFDS needs it to build).

Images of varying size (JPEG sources) are decoded on the host, their shorter
side resized to `image_size` and centre-cropped to a square, so batches stack;
the random augmentations then run on the devices (`augment.py`). Decoding a
JPEG needs a CPU codec and varies in shape, which is why it is the host's job;
everything after it is fixed-shape array work that the accelerators do far
faster than the host (see README "Input pipeline").
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import pathlib
import re
import zipfile
from collections.abc import Sequence

import numpy as np
from absl import logging

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')


def fit_square(image: np.ndarray, size: int | None, channels: int
               ) -> np.ndarray:
  """[H, W(, C)] uint8 -> [size, size, channels] uint8.

  Resizes the shorter side to `size` (bilinear, antialiased: PIL's reducing
  filter) and cuts the central square. None keeps the image's own size (it
  must then already be square and the same for every example).
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if image.ndim == 2:
    image = image[..., None]
  if size is not None and image.shape[:2] != (size, size):
    h, w = image.shape[:2]
    scale = size / min(h, w)
    new_h, new_w = max(size, round(h * scale)), max(size, round(w * scale))
    pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    pil = pil.resize((new_w, new_h), Image.BILINEAR)
    image = np.asarray(pil)
    if image.ndim == 2:
      image = image[..., None]
    top, left = (new_h - size) // 2, (new_w - size) // 2
    image = image[top:top + size, left:left + size]
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
  return np.ascontiguousarray(image, dtype=np.uint8)


class _ThreadedReader:
  """Reads examples one by one on a thread pool (decoders release the GIL)."""

  num_threads: int = min(16, os.cpu_count() or 1)
  _pool: concurrent.futures.ThreadPoolExecutor | None = None

  def _read_one(self, i: int) -> tuple[np.ndarray, int]:
    raise NotImplementedError

  def __getstate__(self):
    # Decoding worker processes receive the source pickled; each starts its
    # own pool.
    state = dict(self.__dict__)
    state.pop('_pool', None)
    return state

  def _read_chunk(self, indices: list[int]) -> list[tuple[np.ndarray, int]]:
    return [self._read_one(i) for i in indices]

  def read(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
    indices = [int(i) for i in np.asarray(indices)]
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(self.num_threads)
    # One contiguous chunk per thread, results in the order asked for.
    chunks = [c.tolist() for c in np.array_split(
        np.asarray(indices, np.int64), self.num_threads) if len(c)]
    pairs = [p for part in self._pool.map(self._read_chunk, chunks)
             for p in part]
    if not pairs:
      return {'image': np.zeros((0,) + self.image_shape, np.uint8),
              'label': np.zeros((0,), np.int32)}
    return {'image': np.stack([p[0] for p in pairs]),
            'label': np.asarray([p[1] for p in pairs], np.int32)}

  def read_all(self):
    """The whole split in memory, a `pipeline.ArrayDataset`."""
    from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
    return pipeline.ArrayDataset.from_source(self)


class ImageFolder(_ThreadedReader):
  """`root/<split>/<class>/<file>` images, as TFDS's ImageFolder lays them out.

  Examples are the files in sorted (class, file name) order, so an index is a
  stable example id. Labels are class ids in sorted class-name order.
  """

  def __init__(self, root: str | os.PathLike, split: str, *,
               image_size: int, channels: int = 3):
    split_dir = pathlib.Path(root) / split
    if not split_dir.is_dir():
      have = sorted(p.name for p in pathlib.Path(root).iterdir()
                    if p.is_dir()) if pathlib.Path(root).is_dir() else []
      raise FileNotFoundError(
          f'image folder split {str(split_dir)!r} does not exist (splits '
          f'there: {have or "none"}); lay images out as '
          '<config.dataset.data_dir>/<split>/<class>/<image>.')
    self.classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    self.files, labels = [], []
    for label, name in enumerate(self.classes):
      for f in sorted((split_dir / name).iterdir()):
        if f.suffix.lower() in IMAGE_EXTENSIONS:
          self.files.append(f)
          labels.append(label)
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

  def _read_one(self, i):
    from PIL import Image  # pylint: disable=g-import-not-at-top
    with Image.open(self.files[i]) as im:
      # draft() lets the JPEG decoder skip resolution we would throw away.
      im.draft('RGB' if self._channels == 3 else 'L',
               (self._size, self._size))
      image = np.asarray(im.convert('RGB' if self._channels == 3 else 'L'))
    return fit_square(image, self._size, self._channels), int(self.labels[i])


class TfdsSource(_ThreadedReader):
  """A TFDS split in the ArrayRecord format, read by `tfds.data_source`."""

  def __init__(self, name: str, split: str, *, data_dir: str | None,
               image_size: int | None):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from input_pipeline import datasets  # pylint: disable=g-import-not-at-top
    builder = datasets.get_builder(name, data_dir)
    if split not in builder.info.splits and '[' not in split:
      raise ValueError(f'{name!r} has no split {split!r}; splits: '
                       f'{", ".join(builder.info.splits)}.')
    self._source = tfds.data_source(name, split=split,
                                    data_dir=builder.data_dir_root,
                                    builder_kwargs={'file_format':
                                                    'array_record'})
    features = builder.info.features
    image = features['image']
    self.num_classes = features['label'].num_classes
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
    digest = hashlib.sha1(f'{split} {built}'.encode()).hexdigest()[:8]
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
        data = pipeline.ArrayDataset(f['image'], f['label'])
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

  def _read_one(self, i):
    return self._read_chunk([i])[0]

  def _read_chunk(self, indices):
    # One batched ArrayRecord read: ~2x faster per record than one by one.
    return [(fit_square(np.asarray(ex['image']), self._size, self._channels),
             int(ex['label'])) for ex in self._source.__getitems__(indices)]


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
  path = pathlib.Path(root) / f'{name}.npz'
  if not path.is_file():
    have = sorted(p.stem for p in pathlib.Path(root).glob('*.npz'))
    raise FileNotFoundError(f'npz split {str(path)!r} does not exist (splits '
                            f'there: {", ".join(have) or "none"}).')
  with np.load(path) as f:
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


def open_split(dataset_config, split: str):
  """The source of `split` for `config.dataset` (name, data_dir, image_size,
  in_memory).

  `name='image_folder'` reads `data_dir/<split>/<class>/*`; `name='npz'`
  reads `data_dir/<split>.npz` (`read_npz`, always in memory); any other
  name is a TFDS dataset (built or checked by `datasets.get_builder`). With
  `in_memory`, the split is read once into an `ArrayDataset` (a TFDS split
  decoded once per machine, `TfdsSource.read_all`).
  """
  dc = dataset_config
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
    source = ImageFolder(dc.data_dir, split, image_size=dc.image_size)
  else:
    source = TfdsSource(dc.name, split, data_dir=dc.data_dir,
                        image_size=dc.image_size)
  return source.read_all() if dc.in_memory else source
