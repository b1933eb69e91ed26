"""main.py as a user runs it: how a run stops (NaN guard, Ctrl-C).

Each must end with its own message last, after the asynchronous
checkpointer has finished, and leave no half-written checkpoint behind.
(Several processes: scripts/multiprocess_check.py, run by .ci/run.)
"""

import json
import math
import os
import re
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

from synthetic_data import add_bad_files
from synthetic_data import make_colour_folder
from synthetic_data import main_argv
from synthetic_data import make_jpeg_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('jpeg'))
  make_jpeg_folder(root, num_train=256, num_test=64)
  return root




def _checkpoint_dirs(workdir):
  d = os.path.join(workdir, 'checkpoints')
  return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_nan_guard_message_is_last_and_checkpoints_are_complete(
    folder, tmp_path):
  out = subprocess.run(
      main_argv(folder, tmp_path, '--config.optimizer.base_learning_rate=1e30',
             '--config.log_every_steps=1', '--config.checkpoint_every_steps=1'),
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8'))
  assert out.returncode != 0
  last = out.stderr.strip().splitlines()[-1]
  assert 'FloatingPointError' in last and 'at step' in last, last
  assert 'cannot schedule new futures' not in out.stderr
  # Only complete (renamed) checkpoints remain: no orbax temporary dirs.
  assert all(d.isdigit() for d in _checkpoint_dirs(tmp_path)), (
      _checkpoint_dirs(tmp_path))


def test_ctrl_c_saves_the_step_reached_and_resumes(folder, tmp_path):
  """Ctrl-C stops as SIGTERM (a preemption; tests/test_reports.py,
  tests/test_storage.py) does: the step reached is saved, the message is
  last, the same command resumes. Sent as a terminal sends it, to the whole
  process group, with the batches decoded in worker processes (which must
  leave it to the training process)."""
  # 8 steps of 32; Ctrl-C once the first regular checkpoint (step 2) exists.
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8')
  flags = main_argv(folder, tmp_path, '--config.checkpoint_every_steps=2',
                    '--config.log_every_steps=1',
                    '--config.dataset.num_workers=2')
  proc = subprocess.Popen(flags, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True)
  deadline = time.time() + 300
  while '2' not in _checkpoint_dirs(tmp_path) and time.time() < deadline:
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    time.sleep(0.1)
  os.killpg(proc.pid, signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert 'interrupted (SIGINT) at step' in last, last
  assert 'Traceback' not in err, err[-2000:]
  saved = int(last.split('at step ')[1].split(':')[0])
  # The step reached when the signal was handled was saved, even though it is
  # off the every-2-steps schedule when odd; nothing was half-written.
  assert str(saved) in _checkpoint_dirs(tmp_path)
  assert saved >= 2
  assert all(d.isdigit() for d in _checkpoint_dirs(tmp_path))
  # Rerunning the same command resumes there and finishes.
  out = subprocess.run(flags, cwd=REPO, capture_output=True, text=True,
                       timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / 'results.json') as f:
    results = json.load(f)
  assert results['resumed_from_step'] == saved and results['steps'] == 8


def test_a_second_ctrl_c_raises_at_once(capfd):
  """The first SIGINT asks for a save at the end of the step, and says so;
  a second one raises KeyboardInterrupt at once, mid-step (the training
  process's own handlers, one process), and the previous handlers return."""
  from contrastive_jax import train  # pylint: disable=g-import-not-at-top
  before = signal.getsignal(signal.SIGINT)
  with train._stop_signals() as check:  # pylint: disable=protected-access
    assert check(1) == ''
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)
    assert check(2) == 'SIGINT'
    assert 'Ctrl-C: saving this step' in capfd.readouterr().err
    t = time.time()
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(10)               # A step that would take 10 s.
    assert time.time() - t < 5
  assert signal.getsignal(signal.SIGINT) is before


def test_what_a_person_sees(folder, tmp_path):
  """A run with progress bars (forced on: stderr is a pipe here) through
  main.py: the bars, log lines whole above them, a lasting step line every
  ~10% of the run, the results table last on stdout, and summary.png's
  curves (learning rate against its closed form) in history.json."""
  total, every = 32, 3      # 4 epochs of 256 / 32; 32 // 10 = 3.
  out = subprocess.run(
      main_argv(folder, tmp_path, '--progress=on', '--config.num_epochs=4',
             '--config.log_every_steps=1', '--config.eval.baselines=True',
             '--config.evals.online_knn.every_steps=16',
             '--config.evals.online_knn.bank_size=128',
             '--config.evals.online_knn.num_queries=64'),
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8'))
  assert out.returncode == 0, out.stderr[-2000:]
  segments = [s for line in out.stderr.split('\n') for s in line.split('\r')]
  assert any(s.startswith(f'pretraining: 100%') and f'{total}/{total}' in s
             and 'img/s' in s for s in segments), out.stderr[-2000:]
  for rep in ('raw_pixels', 'random_init', 'trained'):
    assert any(s.startswith(f'evaluating {rep}: 100%') for s in segments)
  # Log records are whole lines: a bar never cuts into one.
  records = [s for s in segments if ' train.py:' in s or ' reporting.py:' in s or ' __init__.py:' in s]
  assert records and all(re.match(r'[IWE]\d{4} ', s) for s in records), records
  logged = [int(m.group(1)) for s in records
            for m in [re.search(r'\] step (\d+)/', s)] if m]
  assert logged == list(range(every, total, every)) + [total], logged
  # No library INFO noise (orbax, TFDS, TensorFlow's C++ start-up lines).
  assert 'orbax' not in out.stderr and 'oneDNN' not in out.stderr

  # stdout ends with the results table; its numbers are results.json's.
  with open(tmp_path / 'results.json') as f:
    results = json.load(f)
  table = out.stdout.strip().splitlines()
  assert table[-1] == '=' * 64
  for rep in ('raw_pixels', 'random_init', 'trained'):
    row = next(line for line in table if line.startswith(rep))
    knn_v, lin_v = (float(x.rstrip('%')) for x in row.split()[1:])
    assert knn_v == round(100 * results[f'{rep}/knn_weighted_top1@5'], 2)
    assert lin_v == round(100 * results[f'{rep}/linear_top1'], 2)
  # Each representation's line times its three parts; the whole
  # evaluation's time, logged, is results.json's and covers them (the parts
  # are rounded to 0.1 s).
  parts = {m.group(1): [float(t) for t in re.findall(r'([\d.]+) s', m.group(2))]
           for s in records
           for m in [re.search(r'\] (\w+): .*\((features .*)\)$', s)] if m}
  assert sorted(parts) == ['random_init', 'raw_pixels', 'trained'], records
  assert all(len(p) == 3 for p in parts.values()), parts
  eval_s = float(re.search(r'Evaluation: 3 representation\(s\) in ([\d.]+) s',
                           out.stderr).group(1))
  assert eval_s == results['eval_seconds']
  assert sum(map(sum, parts.values())) <= eval_s + 0.5, (parts, eval_s)

  with open(tmp_path / 'history.json') as f:
    history = json.load(f)
  steps = [h['step'] for h in history if 'loss' in h]
  assert steps == list(range(1, total + 1))
  # Warmup (int(0.05 * 32) = 1 step) then cosine to 0; peak 1e-3 * 32 / 256;
  # logged at step s is the rate step s - 1 used.
  peak, warm = 1e-3 * 32 / 256, 1
  def lr(t):
    if t < warm:
      return peak * t / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (t - warm) / (total - warm)))
  np.testing.assert_allclose([h['learning_rate'] for h in history
                              if 'loss' in h],
                             [lr(s - 1) for s in steps], rtol=1e-5, atol=1e-9)
  for h in history:
    if 'loss' in h:
      # Unit vectors: 0 <= ||a - b||^2 <= 4, and -2 * 4 <= uniformity <= 0.
      assert 0 <= h['alignment'] <= 4 and -8 <= h['uniformity'] <= 0, h
      assert 0 <= h['online/linear_acc'] <= 1
  assert [h['step'] for h in history if 'online/knn_weighted_top1@20' in h] == [16, 32]
  with open(tmp_path / 'summary.png', 'rb') as f:
    png = f.read()
  assert png[:8] == b'\x89PNG\r\n\x1a\n'
  # 16 x 9 inches at 90 dpi: the six-panel figure.
  assert struct.unpack('>II', png[16:24]) == (1440, 810)


def test_a_folder_lacking_a_class_with_bad_files_ends_correctly(tmp_path):
  """The image-folder troubles a new user meets, through main.py: a test
  split lacking a training class is scored with the dataset's ids (a
  warning names the class); bad files are named, replaced and counted, or,
  past config.dataset.max_bad_fraction, stop the run before its first step
  with the list."""
  data = tmp_path / 'data'
  make_colour_folder(str(data), {'train': dict(a=32, b=32, c=32),
                                 'test': dict(a=16, c=16)})
  bad = add_bad_files(str(data / 'train' / 'b'))
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8')
  out = subprocess.run(
      main_argv(data, tmp_path / 'run', '--config.eval.baselines=True',
             '--config.dataset.max_bad_fraction=0.05'),
      cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  assert ("Classes: the evaluation split 'test' has no examples of 'b'"
          in out.stderr), out.stderr[-3000:]
  for path in bad:
    assert f'Cannot decode {path} (' in out.stderr, path
  with open(tmp_path / 'run' / 'results.json') as f:
    results = json.load(f)
  # One colour per class: raw pixels tell them apart, when the ids agree.
  assert results['raw_pixels/knn_weighted_top1@5'] >= 0.95, results
  assert results['data/skipped_records'] == 3
  assert [s.split(' (')[0] for s in results['data/skipped_files']] == sorted(
      bad)
  with open(tmp_path / 'run' / 'classes.json') as f:
    assert json.load(f) == {'classes': ['a', 'b', 'c']}
  # In memory, with the default fraction (1%): 3 of 99 stop the run while
  # the data loads, the files listed last.
  out = subprocess.run(
      main_argv(data, tmp_path / 'refused', '--config.dataset.in_memory=True'),
      cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode != 0
  last = out.stderr.strip().splitlines()[-1]
  assert "3 of the 99 records of the training split 'train'" in last, last
  assert all(path in last for path in bad), last
  assert not _checkpoint_dirs(tmp_path / 'refused')
