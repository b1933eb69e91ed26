"""Where a run's files live: local or shared filesystems, and object stores.

Every file outside the checkpoints goes through `etils.epath`, so a workdir
or data_dir may be an object store URL (`gs://bucket/run`). `gs://` uses
gcsfs (no TensorFlow); with `STORAGE_EMULATOR_HOST` set, TensorStore and
google-cloud-cpp are pointed at the same endpoint (`configure`).
"""

from __future__ import annotations

import importlib.util
import io
import os
import socket
import urllib.parse
import uuid
from typing import Any

from etils import epath
from etils.epath import gpath

# Object stores (and other fsspec schemes) epath understands.
_SCHEMES = ('gs://', 's3://', 'az://', 'hf://')


class StorageError(OSError):
  """A workdir or data_dir that cannot be reached, with what to set."""


def is_remote(p: Any) -> bool:
  """Whether `p` names an object store (`gs://...`), not a local path."""
  return str(p).startswith(_SCHEMES)


def configure() -> None:
  """Process set-up for remote paths; idempotent, keeps what the user set."""
  if 'EPATH_USE_TF' not in os.environ:
    os.environ['EPATH_USE_TF'] = 'false'
    # etils decides once per process, at its first path of any kind.
    cached = getattr(gpath, '_is_tf_installed', None)
    if hasattr(cached, 'cache_clear'):
      cached.cache_clear()
  # No listing cache: other hosts and Orbax add files.
  try:
    import fsspec  # pylint: disable=g-import-not-at-top
    for protocol in ('gs', 'gcs'):
      fsspec.config.conf.setdefault(protocol, {}).setdefault(
          'use_listings_cache', False)
  except ImportError:
    pass
  emulator = os.environ.get('STORAGE_EMULATOR_HOST')
  if emulator:
    if '://' not in emulator:
      emulator = 'http://' + emulator
    os.environ.setdefault('TENSORSTORE_GCS_HTTP_URL', emulator)
    os.environ.setdefault('CLOUD_STORAGE_EMULATOR_ENDPOINT', emulator)
    # gcsfs would ask Google, not the emulator, whether a bucket is zonal.
    os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')


def path(p: Any) -> epath.Path:
  """`p` as an `epath.Path`: remote URLs as they are, local paths absolute."""
  if is_remote(p):
    configure()
    return epath.Path(str(p))
  return epath.Path(os.path.abspath(os.fspath(p)))


def location(p: Any) -> str:
  """`p` as the string Orbax and TFDS take (a URL as is, a path absolute)."""
  return os.fspath(path(p))


def write_atomic(p: Any, data: bytes | str) -> None:
  """Writes `data` to `p` so that no reader ever sees it half written: a
  temporary file renamed over a local `p`, one object in one request remote."""
  data = data.encode() if isinstance(data, str) else data
  target = path(p)
  if is_remote(p):
    target.write_bytes(data)
    return
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = f'{target}.{os.getpid()}.tmp'
  try:
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def read_bytes(p: Any) -> bytes:
  """The bytes of file `p` (a local one read directly)."""
  if is_remote(p):
    return path(p).read_bytes()
  with open(p, 'rb') as f:
    return f.read()


def read_text(p: Any) -> str | None:
  """The text of `p`, or None when there is no such file."""
  try:
    return read_bytes(p).decode()
  except FileNotFoundError:
    return None


def save_figure(fig, p: Any) -> None:
  """A matplotlib figure as a PNG at `p`, local or remote."""
  buf = io.BytesIO()
  fig.savefig(buf, format='png')
  write_atomic(p, buf.getvalue())


def check(p: Any, *, what: str, write: bool) -> None:
  """A `StorageError` naming `p` and the fix when remote `p` is unusable:
  with `write`, a probe object under it cannot be written and deleted; else
  nothing is stored under it. Local paths pass."""
  if not is_remote(p):
    return
  configure()
  scheme, rest = str(p).split('://', 1)
  bucket = rest.split('/', 1)[0]
  emulator = os.environ.get('STORAGE_EMULATOR_HOST')
  if scheme == 'gs':
    if importlib.util.find_spec('gcsfs') is None:
      raise StorageError(
          f'{what} {p!r} is on Google Cloud Storage, which needs gcsfs: '
          "pip install 'contrastive_jax[gcs]' (or gcsfs).")
    if write and not emulator and not _has_google_credentials():
      raise StorageError(f'{what} {p!r}: {_NO_CREDENTIALS}')
    _check_reachable(p, what, emulator)
  target = epath.Path(str(p).rstrip('/'))
  try:
    if write:
      probe = target / (f'.write_check.{socket.gethostname()}.{os.getpid()}.'
                        f'{uuid.uuid4().hex[:8]}')
      probe.write_bytes(b'')
      probe.unlink()
    elif not target.exists():
      raise StorageError(
          f'{what} {p!r} does not exist (nothing is stored under it). Check '
          'the path.')
  except FileNotFoundError:
    raise StorageError(
        f'{what} {p!r}: the bucket {scheme}://{bucket} does not exist. Create '
        f'it (`gcloud storage buckets create {scheme}://{bucket}`) or fix the '
        'path.') from None
  except StorageError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    why = f'{type(e).__name__}: {str(e).splitlines()[0][:200]}'
    failed = f'{what} {p!r} cannot be {"written" if write else "read"}'
    if 'Forbidden' in str(e) or isinstance(e, PermissionError) or (
        '401' in str(e)):
      fix = (_NO_CREDENTIALS if scheme == 'gs' and not emulator and not
             _has_google_credentials() else
             f'give these credentials {"write" if write else "read"} access '
             f'to {scheme}://{bucket} (roles/storage.'
             f'{"objectAdmin" if write else "objectViewer"}).')
      raise StorageError(f'{failed} ({why}): {fix}') from None
    raise StorageError(f'{failed} ({why}).') from None


_NO_CREDENTIALS = (
    'no Google Cloud credentials found. On a Cloud TPU or GCE VM the VM\'s '
    'service account is used (give it access to the bucket); elsewhere run '
    '`gcloud auth application-default login` or set '
    'GOOGLE_APPLICATION_CREDENTIALS to a key file.')


def _check_reachable(p: Any, what: str, emulator: str | None) -> None:
  """One TCP connection to the GCS endpoint (gcsfs retries for a minute)."""
  endpoint = urllib.parse.urlsplit(
      emulator if emulator and '://' in emulator else
      f'http://{emulator}' if emulator else 'https://storage.googleapis.com')
  try:
    socket.create_connection(
        (endpoint.hostname, endpoint.port or
         (443 if endpoint.scheme == 'https' else 80)), timeout=10).close()
  except OSError as e:
    raise StorageError(
        f'{what} {p!r}: cannot reach {endpoint.geturl()} ({e})' +
        (f'; STORAGE_EMULATOR_HOST is {emulator!r}: is the emulator '
         'running?' if emulator else '; this host needs network access '
         'to Google Cloud Storage.')) from None


def _has_google_credentials() -> bool:
  import google.auth  # pylint: disable=g-import-not-at-top
  import google.auth.exceptions  # pylint: disable=g-import-not-at-top
  try:
    google.auth.default()
    return True
  except google.auth.exceptions.DefaultCredentialsError:
    return False
