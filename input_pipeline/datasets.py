"""Building and loading TFDS datasets, including Fashion-MNIST fully offline.

Debian's `dataset-fashion-mnist` ships upstream's compressed streams with
rewritten gzip headers; restoring the upstream FNAME and MTIME gives the
byte-identical files, which TFDS accepts (checksums verified) as a manual
dir. docs/input_pipeline.md.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import socket
import struct

import tensorflow_datasets as tfds  # Imported early: see sources.py.
from absl import logging

from contrastive_jax import storage

DEBIAN_FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
FILE_FORMAT = 'array_record'   # Random access per record.

# Upstream gzip MTIMEs, recovered by matching TFDS's registered SHA-256.
_FASHION_MNIST_MTIME = {
    'train-images-idx3-ubyte.gz': 1504176606,
    'train-labels-idx1-ubyte.gz': 1504176606,
    't10k-images-idx3-ubyte.gz': 1504176627,
    't10k-labels-idx1-ubyte.gz': 1504176627,
}

_GZIP_DEFLATE = b'\x1f\x8b\x08'   # ID1 ID2 CM; then the flags (RFC 1952).
_FNAME, _OPTIONAL_FIELDS = 0x08, 0x1e   # FHCRC | FEXTRA | FNAME | FCOMMENT.

_OFFLINE_HINT = {
    'fashion_mnist': ('install the Debian package: apt-get install '
                      'dataset-fashion-mnist'),
    'imagenet2012': ('put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar '
                     '(from image-net.org) into <data_dir>/downloads/manual/ '
                     'and run `tfds build imagenet2012 --file_format='
                     'array_record --data_dir=<data_dir>`'),
}


class DatasetUnavailableError(RuntimeError):
  """A dataset is neither prepared, nor buildable offline, nor downloadable."""


def restore_gzip_header(data: bytes, *, fname: str, mtime: int) -> bytes:
  """`data`, a gzip file with a bare 10-byte header, with FNAME (latin-1)
  and MTIME set (RFC 1952 2.3); the stream and trailer are unchanged."""
  if data[:3] != _GZIP_DEFLATE:
    raise ValueError('not a gzip (deflate) file: bad magic bytes.')
  flags = data[3]
  if flags & _OPTIONAL_FIELDS:
    raise ValueError(f'gzip header flags {flags:#x} already carry optional '
                     'fields; expected a bare 10-byte header.')
  return (_GZIP_DEFLATE + bytes([flags | _FNAME]) + struct.pack('<I', mtime)
          + data[8:10] + fname.encode('latin-1') + b'\0' + data[10:])


def prepare_fashion_mnist_manual_dir(
    manual_dir: str | os.PathLike,
    source_dir: str | os.PathLike = DEBIAN_FASHION_MNIST_DIR) -> pathlib.Path:
  """Writes the upstream Fashion-MNIST files into `manual_dir` from Debian's
  (files already there are kept) and returns it."""
  manual_dir = pathlib.Path(manual_dir)
  for name, mtime in _FASHION_MNIST_MTIME.items():
    dst = manual_dir / name
    if dst.exists():
      continue
    data = (pathlib.Path(source_dir) / name).read_bytes()
    fixed = data if data[3] & _FNAME else restore_gzip_header(
        data, fname=name[:-len('.gz')], mtime=mtime)
    storage.write_atomic(dst, fixed)   # A killed run leaves no half file.
  return manual_dir


def _tensorflow_on_cpu_only() -> None:
  """Hides the GPUs, whose memory JAX holds, from TensorFlow (before a TFDS
  build, the only thing that imports it)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:   # TensorFlow already initialised its devices.
    pass


def get_builder(name: str, data_dir: str | None = None, *,
                fashion_mnist_source: str | os.PathLike = (
                    DEBIAN_FASHION_MNIST_DIR)):
  """A prepared `tfds` builder for `name`: a copy in `data_dir`, else (for
  fashion_mnist) an offline build from Debian's files, else TFDS's download;
  else a `DatasetUnavailableError` naming the fix."""
  try:
    builder = tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise DatasetUnavailableError(
        f'unknown TFDS dataset {name!r}; check config.dataset.name.') from e
  if builder.is_prepared():
    if builder.info.file_format.value != FILE_FORMAT:
      raise DatasetUnavailableError(
          f'dataset {name!r} in {builder.data_dir} is prepared as '
          f'{builder.info.file_format.value}, but the input pipeline reads '
          f'records at random and needs {FILE_FORMAT}. Fix: convert it once '
          f'with `tfds convert_format --dataset_version_dir={builder.data_dir}'
          f' --out_file_format={FILE_FORMAT}` (or rebuild with `tfds build '
          f'{name} --file_format={FILE_FORMAT}`).')
    return builder

  if (name == 'fashion_mnist' and not storage.is_remote(data_dir or '') and
      all((pathlib.Path(fashion_mnist_source) / n).exists()
          for n in _FASHION_MNIST_MTIME)):
    # One process builds; others starting at once wait and find it prepared.
    os.makedirs(builder.data_dir_root, exist_ok=True)
    lock = os.path.join(builder.data_dir_root, f'.{name}.build.lock')
    with open(lock, 'w') as f:
      fcntl.flock(f, fcntl.LOCK_EX)   # Released when the file closes.
      # Anew: a builder made before another process built holds empty info.
      builder = tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
      if builder.is_prepared():
        return builder
      manual_dir = pathlib.Path(builder.data_dir_root) / 'manual' / name
      prepare_fashion_mnist_manual_dir(manual_dir, fashion_mnist_source)
      logging.info('Building %s offline from %s', name, fashion_mnist_source)
      _tensorflow_on_cpu_only()
      builder.download_and_prepare(
          download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    return builder

  hint = _OFFLINE_HINT.get(name, f'prepare it where there is network (`tfds '
                           f'build {name} --file_format={FILE_FORMAT} '
                           '--data_dir=...`) and copy that data_dir here')
  def unavailable(reason):
    return DatasetUnavailableError(
        f'dataset {name!r} is not prepared in {builder.data_dir_root} and '
        f'cannot be downloaded: {reason}. Fix: {hint}, or point '
        'config.dataset.data_dir at a prepared copy.')

  # Else TFDS retries an unreachable host for minutes; DNS fails at once.
  if not _network_available():
    raise unavailable('no network (DNS lookup failed)')
  _tensorflow_on_cpu_only()
  try:
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except
    raise unavailable(f'{type(e).__name__}: {str(e)[:300]}') from e
  return builder


def _network_available(hosts=('storage.googleapis.com', 'www.tensorflow.org')
                       ) -> bool:
  for host in hosts:
    try:
      socket.getaddrinfo(host, 443)
      return True
    except OSError:
      pass
  return False
