"""Building and loading TFDS datasets, including Fashion-MNIST fully offline.

TFDS's `fashion_mnist` normally downloads four gzipped IDX files and checks
their SHA-256. Debian's package `dataset-fashion-mnist` ships the same
compressed streams, but Debian rewrote the gzip headers (no original file name,
a 2020 modification time), so the bytes differ and TFDS rejects them. The gzip
header is metadata only: putting back the upstream FNAME and MTIME fields gives
the byte-identical upstream files, which TFDS then accepts through
`DownloadConfig(manual_dir=...)` with its checksum verification untouched.

Everything here runs before training starts, so a missing dataset fails fast
with an error that says how to fix it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import socket
import struct

import tensorflow_datasets as tfds  # Imported early: see sources.py.
from absl import logging

from contrastive_jax import storage

DEBIAN_FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
FILE_FORMAT = 'array_record'

# Upstream (zalandoresearch) gzip header fields of each file: the MTIME was
# recovered by matching TFDS's registered SHA-256 of the upstream file; the
# FNAME is the file name without `.gz`, as gzip(1) writes it.
_FASHION_MNIST_MTIME = {
    'train-images-idx3-ubyte.gz': 1504176606,
    'train-labels-idx1-ubyte.gz': 1504176606,
    't10k-images-idx3-ubyte.gz': 1504176627,
    't10k-labels-idx1-ubyte.gz': 1504176627,
}

_GZIP_MAGIC = b'\x1f\x8b'
_FNAME = 0x08
_FEXTRA, _FCOMMENT, _FHCRC = 0x04, 0x10, 0x02

# Datasets we know how to build without network, and what to install for them.
_OFFLINE_HINT = {
    'fashion_mnist': ('install the Debian package: apt-get install '
                      'dataset-fashion-mnist'),
    # ImageNet is never downloaded by TFDS: it reads the two archives from
    # <data_dir>/downloads/manual/.
    'imagenet2012': ('put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar '
                     '(from image-net.org) into <data_dir>/downloads/manual/ '
                     'and run `tfds build imagenet2012 --file_format='
                     'array_record --data_dir=<data_dir>`'),
}


class DatasetUnavailableError(RuntimeError):
  """A dataset is neither prepared, nor buildable offline, nor downloadable."""


def restore_gzip_header(data: bytes, *, fname: str, mtime: int) -> bytes:
  """Returns `data` (a gzip file) with its FNAME and MTIME header fields set.

  The compressed stream and trailer are kept byte for byte; only the 10-byte
  fixed header gains the FNAME flag and MTIME, and the name follows it (RFC 1952
  section 2.3).

  Args:
    data: a gzip file whose header has no FNAME, FEXTRA, FCOMMENT or FHCRC.
    fname: original file name (latin-1), written zero-terminated.
    mtime: modification time, seconds since the epoch.
  """
  if data[:3] != _GZIP_MAGIC + b'\x08':
    raise ValueError('not a gzip (deflate) file: bad magic bytes.')
  flags = data[3]
  if flags & (_FNAME | _FEXTRA | _FCOMMENT | _FHCRC):
    raise ValueError(f'gzip header flags {flags:#x} already carry optional '
                     'fields; expected a bare 10-byte header.')
  header = (_GZIP_MAGIC + b'\x08' + bytes([flags | _FNAME]) +
            struct.pack('<I', mtime) + data[8:10])
  return header + fname.encode('latin-1') + b'\0' + data[10:]


def prepare_fashion_mnist_manual_dir(
    manual_dir: str | os.PathLike,
    source_dir: str | os.PathLike = DEBIAN_FASHION_MNIST_DIR) -> pathlib.Path:
  """Writes the upstream Fashion-MNIST files into `manual_dir` from Debian's.

  Files already present are left alone (TFDS verifies their checksums anyway).

  Returns:
    The manual directory, ready for `tfds.download.DownloadConfig(manual_dir=)`.

  Raises:
    FileNotFoundError: a source file is missing.
  """
  manual_dir = pathlib.Path(manual_dir)
  manual_dir.mkdir(parents=True, exist_ok=True)
  for name, mtime in _FASHION_MNIST_MTIME.items():
    dst = manual_dir / name
    if dst.exists():
      continue
    src = pathlib.Path(source_dir) / name
    data = src.read_bytes()
    fixed = data if data[3] & _FNAME else restore_gzip_header(
        data, fname=name[:-len('.gz')], mtime=mtime)
    tmp = dst.with_suffix('.tmp')
    tmp.write_bytes(fixed)
    tmp.replace(dst)  # Atomic: a killed run never leaves a half-written file.
  return manual_dir


def _debian_files_present(source_dir: str | os.PathLike) -> bool:
  return all((pathlib.Path(source_dir) / n).exists()
             for n in _FASHION_MNIST_MTIME)


def _tensorflow_on_cpu_only() -> None:
  """Hides the GPUs, whose memory JAX holds, from TensorFlow before it first
  runs (a no-op after). Called just before a TFDS build, the only thing in a
  run that imports TensorFlow, so that failing fast imports none of it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:   # TensorFlow already initialised its devices.
    pass


def get_builder(name: str, data_dir: str | None = None, *,
                fashion_mnist_source: str | os.PathLike = (
                    DEBIAN_FASHION_MNIST_DIR)):
  """Returns a prepared `tfds` builder for `name`, building it if needed.

  Order of attempts: an already prepared copy in `data_dir`; for
  `fashion_mnist`, an offline build from Debian's files (checksums verified by
  TFDS); the normal TFDS download. If all fail, raises a
  `DatasetUnavailableError` that names the dataset, the data_dir and the fix.
  """
  try:
    # ArrayRecord: random access per record (`tfds.data_source`), which the
    # input pipeline needs to read any example of any global batch.
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
      _debian_files_present(fashion_mnist_source)):
    # Several processes may start at once (test workers, a notebook next to a
    # run): one builds, the others wait and find it prepared (a local lock
    # file: an object store data_dir holds a copy prepared elsewhere).
    with _build_lock(builder.data_dir_root, name):
      # Anew: a builder made before another process prepared the data holds
      # empty dataset info.
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

  # Without this probe, TFDS retries an unreachable host for minutes before
  # failing; name resolution fails at once when there is no network.
  if not _network_available():
    raise unavailable('no network (DNS lookup failed)')
  _tensorflow_on_cpu_only()
  try:
    builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except
    raise unavailable(f'{type(e).__name__}: {str(e)[:300]}') from e
  return builder


@contextlib.contextmanager
def _build_lock(data_dir_root: str, name: str):
  """An exclusive lock file (flock) for building `name` in `data_dir_root`."""
  os.makedirs(data_dir_root, exist_ok=True)
  with open(os.path.join(data_dir_root, f'.{name}.build.lock'), 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _network_available(hosts=('storage.googleapis.com', 'www.tensorflow.org')
                       ) -> bool:
  for host in hosts:
    try:
      socket.getaddrinfo(host, 443)
      return True
    except OSError:
      continue
  return False
