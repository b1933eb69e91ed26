"""What a run reports when it is short or resumed, through main.py: the
training time and rate of the steps each invocation ran, TensorBoard's view
of the events of several invocations (every (tag, step) once), summary.png's
panels with one logged point, the summary table's columns, and where
contrastive-jax-eval writes its results."""

import collections
import json
import logging
import os
import re
import signal
import subprocess
import time
import types

import numpy as np
import pytest

from contrastive_jax import eval_checkpoint
from contrastive_jax import progress
from contrastive_jax import reporting
from synthetic_data import main_argv
from synthetic_data import make_jpeg_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8')


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('jpeg'))
  make_jpeg_folder(root, num_train=256, num_test=64)   # 8 steps of 32.
  return root


def _flags(folder, workdir, *extra):
  return main_argv(folder, workdir, '--config.eval.embedding_points=64',
                   *extra)


def _main(folder, workdir, *extra):
  """Runs main.py; (the completed process, its wall seconds)."""
  t = time.time()
  out = subprocess.run(_flags(folder, workdir, *extra), cwd=REPO,
                       capture_output=True, text=True, timeout=600, env=ENV)
  assert out.returncode == 0, out.stderr[-3000:]
  return out, time.time() - t


def _results(workdir):
  with open(os.path.join(workdir, 'results.json')) as f:
    return json.load(f)


def _tensorboard(workdir):
  """{tag: [(step, value), ...]} as TensorBoard's event accumulator loads the
  workdir's event files (all of them, in the order of their names)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(str(workdir),
                                           size_guidance={'scalars': 0})
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
          for tag in acc.Tags()['scalars']}


def _assert_each_step_once(scalars):
  repeated = {tag: sorted(s for s, n in collections.Counter(
      step for step, _ in points).items() if n > 1)
              for tag, points in scalars.items()}
  assert not any(repeated.values()), {t: s for t, s in repeated.items() if s}


def _training_line(stdout):
  return next(line for line in stdout.splitlines()
              if line.startswith('training: '))


def test_a_run_stopped_resumed_and_rerun_reports_each_invocation(
    folder, tmp_path, caplog):
  """One run in three invocations of the same command: SIGTERM once the
  step-2 checkpoint exists; the rerun resumes there and finishes; a third
  finds the run at its last step and only evaluates."""
  flags = ('--config.checkpoint_every_steps=2', '--config.log_every_steps=1')
  t = time.time()
  proc = subprocess.Popen(_flags(folder, tmp_path, *flags), cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=ENV)
  ckpt = tmp_path / 'checkpoints'
  while not (ckpt / '2').is_dir() and time.time() < t + 300:
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  first_wall = time.time() - t
  assert proc.returncode == 143, err[-2000:]
  saved = int(re.search(r'at step (\d+)', err.strip().splitlines()[-1])[1])
  assert 2 <= saved < 8, saved

  resumed, resumed_wall = _main(folder, tmp_path, *flags)
  r = _results(tmp_path)
  assert (r['steps'], r['steps_this_run'], r['resumed_from_step']) == (
      8, 8 - saved, saved)
  # This invocation's loop took part of its wall time; the total adds the
  # first invocation's training, which took part of that one's.
  assert 0 < r['train_seconds_this_run'] < resumed_wall
  earlier = r['train_seconds'] - r['train_seconds_this_run']
  assert 0 < earlier < first_wall, (earlier, first_wall)
  assert 'images_per_sec' in r
  assert _training_line(resumed.stdout) == (
      f'training: {8 - saved} steps in {r["train_seconds_this_run"]:.1f} s '
      f'in this invocation (resumed at step {saved} of 8); all invocations: '
      f'8 steps in {r["train_seconds"]:.1f} s')

  # The same command once more: the run is at its last step.
  rerun, _ = _main(folder, tmp_path, *flags)
  b = _results(tmp_path)
  assert (b['steps'], b['steps_this_run'], b['resumed_from_step']) == (
      8, 0, 8)
  # No training time of its own, the earlier invocations' total, and their
  # intervals' rate: nothing is divided by this one's 0 steps.
  assert b['train_seconds_this_run'] == 0.0
  assert b['train_seconds'] == r['train_seconds']
  assert b['images_per_sec'] == r['images_per_sec']
  assert _training_line(rerun.stdout) == (
      'training: none in this invocation (resumed at step 8 of 8); earlier '
      f'invocations: 8 steps in {r["train_seconds"]:.1f} s')
  assert 'of the earlier invocations' in rerun.stdout

  # TensorBoard: the three invocations' files, each (tag, step) once; the
  # loss at every step with history.json's values, the results at the last
  # step with the last invocation's.
  scalars = _tensorboard(tmp_path)
  _assert_each_step_once(scalars)
  with open(tmp_path / 'history.json') as f:
    history = json.load(f)
  assert [h['step'] for h in history] == list(range(1, 9))
  assert scalars['loss'] == [(h['step'], pytest.approx(h['loss'], rel=1e-6))
                             for h in history]
  assert scalars['trained/linear_top1'] == [
      (8, pytest.approx(b['trained/linear_top1'], rel=1e-6))]

  # contrastive-jax-eval's function says where its results went.
  with caplog.at_level(logging.INFO, logger='absl'):
    eval_checkpoint.evaluate_checkpoint(str(tmp_path), knn_ks=(5,),
                                        diagnostics=False)
  path = str(tmp_path / 'eval' / 'results.json')
  assert os.path.exists(path)
  assert eval_checkpoint.results_path(str(tmp_path)) == path
  assert any(path in rec.getMessage() for rec in caplog.records), caplog.text


class _Config(types.SimpleNamespace):
  log_every_steps = 1
  batch_size = 8


def _log_steps(log, steps, loss):
  with progress.bar(8, 'test', initial=log.start) as bar:
    for done in steps:
      log.step(done, {'loss': np.float32(loss(done))}, 0.1, bar)


def test_steps_redone_after_a_kill_are_shown_once(tmp_path):
  """A process killed after its step-4 checkpoint had logged steps 5 and 6;
  the next one resumes at 4 and logs 5 to 8 again: TensorBoard shows the
  second values only."""
  first = reporting.TrainLog(str(tmp_path), _Config(), start=0, total_steps=8)
  _log_steps(first, range(1, 5), lambda s: 10. + s)
  first.save()                                  # The step-4 checkpoint.
  _log_steps(first, range(5, 7), lambda s: 10. + s)
  first.writer.close()                          # Killed.
  second = reporting.TrainLog(str(tmp_path), _Config(), start=4,
                              total_steps=8)
  _log_steps(second, range(5, 9), lambda s: 20. + s)
  second.writer.close()
  scalars = _tensorboard(tmp_path)
  _assert_each_step_once(scalars)
  assert scalars['loss'] == [(1, 11.), (2, 12.), (3, 13.), (4, 14.),
                             (5, 25.), (6, 26.), (7, 27.), (8, 28.)]


def _panel(fig, title_start):
  return next(ax for ax in fig.axes if ax.get_title().startswith(title_start))


def _shows_a_point(ax):
  return any(len(line.get_xdata()) == 1 and
             line.get_marker() not in (None, '', ' ', 'None')
             for line in ax.lines)


def test_summary_plot_of_one_logged_step_without_baselines(tmp_path):
  history = [{'step': 20, 'loss': 3.1, 'learning_rate': 0.1,
              'alignment': 0.7, 'uniformity': -2.5,
              'online/linear_acc': 0.995}]
  results = {'trained/knn_weighted_top1@5': 0.97, 'trained/linear_top1': 0.99}
  fig = reporting.plot_run(history, results, {}, str(tmp_path / 's.png'))
  assert os.path.getsize(tmp_path / 's.png') > 1000
  for title in ('Loss', 'Online monitors', 'Alignment'):
    ax = _panel(fig, title)
    assert _shows_a_point(ax), title
    assert any('too few points' in t.get_text() for t in ax.texts), title
  assert _panel(fig, 'Online monitors').get_ylim()[1] <= 1.0
  ax = _panel(fig, 'Frozen features')
  lo, hi = ax.get_xlim()
  assert lo <= 97 and 99 <= hi <= 100, (lo, hi)
  assert 'baseline' not in ax.get_title() and ' vs ' not in ax.get_title()

  results.update({'random_init/knn_weighted_top1@5': 0.4,
                  'random_init/linear_top1': 0.5})
  history = history + [{**history[0], 'step': 40}]
  fig = reporting.plot_run(history, results, {}, str(tmp_path / 't.png'))
  assert 'random_init' in _panel(fig, 'Frozen features').get_title()
  ax = _panel(fig, 'Loss')
  assert not any('too few points' in t.get_text() for t in ax.texts)


def test_summary_table_columns_line_up():
  results = {'steps': 8, 'steps_this_run': 8, 'resumed_from_step': None,
             'train_seconds': 2.5, 'train_seconds_this_run': 2.5,
             'final_loss': 1.25, 'trained/linear_eval_top1': 0.875}
  for rep, knn, lin in (('raw_pixels', 0.25, 0.5), ('random_init', 0.375,
                                                    0.625),
                        ('trained', 0.75, 0.8125)):
    results[f'{rep}/knn_weighted_top1@5'] = knn
    results[f'{rep}/linear_top1'] = lin
  lines = reporting.summary(results, '/w').splitlines()
  header = next(line for line in lines if line.startswith('representation'))
  end = header.index('linear_top1') + len('linear_top1')
  knn_end = header.index('knn_weighted_top1@5') + len('knn_weighted_top1@5')
  rows = {line.split('  ')[0]: line for line in lines
          if line.startswith(('raw', 'random', 'trained'))}
  assert len(rows) == 4, rows
  for name, row in rows.items():
    assert len(row) == end, (name, row)
  assert rows['trained'][:knn_end].endswith('75.00%')
  assert rows['trained'].endswith('81.25%')
  assert rows["trained, the papers' linear evaluation"].endswith('87.50%')
  text = reporting.summary(results, '/w')
  assert 'training: 8 steps in 2.5 s\n' in text
  assert 'images/s not measured' in text
