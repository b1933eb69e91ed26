"""main.py as a user runs it: how a run stops (NaN guard, SIGTERM).

Both must end with their own message last, after the asynchronous
checkpointer has finished, and leave no half-written checkpoint behind.
(Several processes: scripts/multiprocess_check.py, run by .ci/run.)
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from synthetic_data import make_jpeg_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('jpeg'))
  make_jpeg_folder(root, num_train=256, num_test=64)
  return root


def _flags(folder, workdir, *extra):
  return [sys.executable, 'main.py', '--config=configs/test.py',
          f'--workdir={workdir}', '--config.dataset.name=image_folder',
          '--config.dataset.train_split=train',
          '--config.dataset.eval_split=test',
          f'--config.dataset.data_dir={folder}',
          '--config.dataset.image_size=16', '--config.dataset.in_memory=False',
          '--config.model.encoder_kwargs.widths=(4,8)',
          '--config.eval.baselines=False', '--config.online.knn_every_steps=0',
          '--config.eval.linear_max_iter=5', *extra]


def _checkpoint_dirs(workdir):
  d = os.path.join(workdir, 'checkpoints')
  return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_nan_guard_message_is_last_and_checkpoints_are_complete(
    folder, tmp_path):
  out = subprocess.run(
      _flags(folder, tmp_path, '--config.optimizer.base_learning_rate=1e30',
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


def test_sigterm_saves_the_step_reached_and_exits_143(folder, tmp_path):
  # 8 steps of 32; SIGTERM once the first regular checkpoint (step 2) exists.
  proc = subprocess.Popen(
      _flags(folder, tmp_path, '--config.checkpoint_every_steps=2',
             '--config.log_every_steps=1'),
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8'))
  deadline = time.time() + 300
  while '2' not in _checkpoint_dirs(tmp_path) and time.time() < deadline:
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 143, err[-2000:]
  last = err.strip().splitlines()[-1]
  assert 'preempted (SIGTERM) at step' in last, last
  saved = int(last.split('at step ')[1].split(':')[0])
  # The step reached when the signal was handled was saved, even though it is
  # off the every-2-steps schedule when odd; nothing was half-written.
  assert str(saved) in _checkpoint_dirs(tmp_path)
  assert saved >= 2
  assert all(d.isdigit() for d in _checkpoint_dirs(tmp_path))
  # Rerunning the same command resumes there and finishes.
  out = subprocess.run(
      _flags(folder, tmp_path, '--config.checkpoint_every_steps=2',
             '--config.log_every_steps=1'),
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8'))
  assert out.returncode == 0, out.stderr[-2000:]
  with open(tmp_path / 'results.json') as f:
    results = json.load(f)
  assert results['resumed_from_step'] == saved and results['steps'] == 8
