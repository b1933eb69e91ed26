"""Offline Fashion-MNIST: gzip header restoration and clear dataset errors."""

import gzip
import hashlib
import io
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

from input_pipeline import datasets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_TFDS_CHECKSUMS = None


def _tfds_checksums():
  """TFDS's registered SHA-256 of the upstream files, read from tfds itself."""
  import tensorflow_datasets as tfds
  path = pathlib.Path(tfds.__file__).parent / 'url_checksums' / (
      'fashion_mnist.txt')
  out = {}
  for line in path.read_text().splitlines():
    url, size, sha, name = line.split()
    out[name] = (int(size), sha)
  return out


def _idx_images(n, seed):
  """A small IDX3 file: magic 2051, n images of 28x28 uint8."""
  rng = np.random.default_rng(seed)
  return struct.pack('>IIII', 2051, n, 28, 28) + rng.integers(
      0, 256, (n, 28, 28), dtype=np.uint8).tobytes()


def _gzip(data, *, filename, mtime):
  buf = io.BytesIO()
  with gzip.GzipFile(filename=filename, mode='wb', fileobj=buf, mtime=mtime,
                     compresslevel=9) as f:
    f.write(data)
  return buf.getvalue()


def test_restore_header_gives_upstream_bytes_on_fake_idx():
  raw = _idx_images(5, seed=0)
  upstream = _gzip(raw, filename='train-images-idx3-ubyte', mtime=1504176606)
  stripped = _gzip(raw, filename='', mtime=0)  # What Debian's rewrite leaves.
  assert stripped != upstream
  restored = datasets.restore_gzip_header(
      stripped, fname='train-images-idx3-ubyte', mtime=1504176606)
  assert restored == upstream
  assert gzip.decompress(restored) == raw


def test_restore_header_rejects_non_gzip_and_named_files():
  with pytest.raises(ValueError, match='not a gzip'):
    datasets.restore_gzip_header(b'hello world', fname='x', mtime=0)
  named = _gzip(b'abc', filename='x', mtime=0)
  with pytest.raises(ValueError, match='optional'):
    datasets.restore_gzip_header(named, fname='x', mtime=0)


def test_manual_dir_from_fake_debian_files_is_rejected_by_tfds_checksums(
    tmp_path):
  """Fake files get upstream-style headers, yet TFDS still verifies content.

  This is what keeps TFDS's checksum check meaningful: only the real upstream
  bytes pass it.
  """
  src = tmp_path / 'debian'
  src.mkdir()
  for i, name in enumerate(datasets._FASHION_MNIST_MTIME):
    (src / name).write_bytes(_gzip(_idx_images(3, seed=i), filename='',
                                   mtime=0))
  manual = datasets.prepare_fashion_mnist_manual_dir(tmp_path / 'manual', src)
  for name, mtime in datasets._FASHION_MNIST_MTIME.items():
    data = (manual / name).read_bytes()
    assert struct.unpack('<I', data[4:8])[0] == mtime
    assert data[10:10 + len(name) - 2] == name[:-3].encode() + b'\0'
  import tensorflow_datasets as tfds
  builder = tfds.builder('fashion_mnist', data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(Exception, match='(?i)checksum'):
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual))


def test_real_debian_files_restore_to_tfds_registered_checksums(tmp_path):
  """The Debian package's files become byte-identical to upstream's.

  CI installs `dataset-fashion-mnist`; without it this test fails and says so.
  """
  src = pathlib.Path(datasets.DEBIAN_FASHION_MNIST_DIR)
  assert src.is_dir(), ('install the Debian package dataset-fashion-mnist '
                        '(apt-get install dataset-fashion-mnist)')
  manual = datasets.prepare_fashion_mnist_manual_dir(tmp_path / 'm', src)
  for name, (size, sha) in _tfds_checksums().items():
    data = (manual / name).read_bytes()
    assert len(data) == size, name
    assert hashlib.sha256(data).hexdigest() == sha, name


def test_missing_dataset_without_network_fails_fast_with_fix(tmp_path,
                                                             monkeypatch):
  monkeypatch.setattr(datasets, '_network_available', lambda *a: False)
  with pytest.raises(datasets.DatasetUnavailableError) as e:
    datasets.get_builder('cifar10', str(tmp_path))
  assert 'cifar10' in str(e.value) and 'Fix:' in str(e.value)
  with pytest.raises(datasets.DatasetUnavailableError,
                     match='apt-get install dataset-fashion-mnist'):
    datasets.get_builder('fashion_mnist', str(tmp_path),
                         fashion_mnist_source=tmp_path / 'nowhere')


def test_unknown_dataset_name(tmp_path):
  with pytest.raises(datasets.DatasetUnavailableError, match='unknown TFDS'):
    datasets.get_builder('no_such_dataset_xyz', str(tmp_path))


def test_concurrent_first_builds_of_fashion_mnist_both_succeed(tmp_path):
  """Two processes (test workers, a notebook beside a run) asking for the
  unprepared dataset at once: one builds under the lock, the other waits
  and reads the same prepared copy (without the lock the second rename of
  TFDS's temporary directory fails)."""
  code = ('import sys; from input_pipeline import datasets; '
          'b = datasets.get_builder("fashion_mnist", sys.argv[1]); '
          'print(b.info.splits["train"].num_examples)')
  procs = [subprocess.Popen([sys.executable, '-c', code, str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
    assert out.split()[-1] == '60000'
  assert not [d for d in os.listdir(tmp_path / 'fashion_mnist')
              if 'incomplete' in d]
