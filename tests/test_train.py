"""The whole `main` path on synthetic data: train, checkpoint, resume, evaluate."""

import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import test as test_config
from contrastive_jax import train
import synthetic_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


DATA = (synthetic_data.stripes_and_brightness(256, 0),
        synthetic_data.stripes_and_brightness(64, 1))


def _config():
  config = test_config.get_config()   # 256 / 32 = 8 steps.
  return config


def _final_params(workdir):
  with ocp.CheckpointManager(os.path.join(workdir, 'checkpoints')) as m:
    restored = m.restore(m.latest_step(), args=ocp.args.StandardRestore())
  return m.latest_step(), restored


@pytest.fixture(scope='module')
def full_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('full'))
  results = train.train_and_evaluate(_config(), workdir, data=DATA)
  return workdir, results


def test_run_writes_results_plot_events_and_checkpoints(full_run):
  workdir, results = full_run
  with open(os.path.join(workdir, 'results.json')) as f:
    on_disk = json.load(f)
  assert on_disk == json.loads(json.dumps(results))
  for name in ('raw_pixels', 'random_init', 'trained'):
    for metric in ('knn_weighted_top1@5', 'linear_top1'):
      assert 0. <= results[f'{name}/{metric}'] <= 1.
  assert results['steps'] == 8
  assert np.isfinite(results['final_loss'])
  assert os.path.getsize(os.path.join(workdir, 'summary.png')) > 1000
  with open(os.path.join(workdir, 'history.json')) as f:
    history = json.load(f)
  assert [h['step'] for h in history] == [2, 4, 6, 8]

  # TensorBoard's own reader finds in the event file every logged scalar of
  # history.json at its step, and at the last step the results' floats
  # under the other tags (one value per tag and step).
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = [f for f in os.listdir(workdir) if f.startswith('events.out.tfevents')]
  assert len(events) == 1, events
  acc = event_accumulator.EventAccumulator(os.path.join(workdir, events[0]))
  acc.Reload()
  scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)}
             for tag in acc.Tags()['scalars']}
  floats = {k: v for k, v in results.items() if isinstance(v, float)}
  assert 'final_loss' in floats and 'trained/linear_top1' in floats
  for h in history:
    for tag, value in h.items():
      if tag != 'step':
        assert scalars[tag][h['step']] == pytest.approx(value, rel=1e-6), tag
  logged = {tag for h in history for tag in h}
  assert 'images_per_sec' in floats and 'images_per_sec' in logged
  for tag, value in floats.items():
    if tag not in logged:
      assert scalars[tag][8] == pytest.approx(value, rel=1e-6), tag
  assert all(len({e.step for e in acc.Scalars(tag)}) ==
             len(acc.Scalars(tag)) for tag in scalars)


class _SlowSource:
  """An in-memory split whose every read takes `delay` seconds more: a
  stand-in for a decoder too slow for the step (an input-bound run)."""

  def __init__(self, data, delay):
    self.data, self.delay = data, delay
    self.num_classes, self.image_shape = data.num_classes, data.image_shape
    self.classes, self.skipped = data.classes, {}

  def __len__(self):
    return len(self.data)

  def read(self, indices, fit=None):
    time.sleep(self.delay)
    return self.data.read(indices, fit)


def test_input_wait_shows_an_input_bound_run(full_run, tmp_path, capsys):
  # Each training batch takes 1 s to read on one of two prefetch threads
  # while the tiny step and the checkpoint of every log interval take a
  # fraction of that, even on a loaded machine: once the batches read ahead
  # during the first step's compilation are used, the loop waits most of
  # the time.
  config = _config()
  results = train.train_and_evaluate(
      config, str(tmp_path), data=(_SlowSource(DATA[0], 1.0), DATA[1]))
  printed = capsys.readouterr().out
  assert 0.5 < results['input_wait'] <= 1.0
  with open(tmp_path / 'results.json') as f:
    assert json.load(f)['input_wait'] == results['input_wait']
  with open(tmp_path / 'history.json') as f:
    history = json.load(f)
  # Every log step after the compiling first one has its interval's share
  # (test_run_writes_results_plot_events_and_checkpoints finds the history's
  # scalars in TensorBoard).
  waits = [h['input_wait'] for h in history if 'loss' in h]
  assert len(waits) == 4 and all(0.5 < w <= 1.0 for w in waits[1:]), waits
  assert 'input-bound' in printed and 'input wait' in printed
  # The same run fed from memory waits for a smaller share of its time.
  _, fast = full_run
  assert 0.0 <= fast['input_wait'] < results['input_wait']


def test_main_and_the_modules_of_a_run_import_without_tensorflow():
  # TensorFlow (~9 s of CPU to import) is for building TFDS datasets only:
  # main.py's modules, the pipeline and the TensorBoard writer do without it.
  code = ('import sys, main; from contrastive_jax import train, '
          'evaluators, encoder; from input_pipeline import pipeline, sources; '
          'print(sorted(m for m in sys.modules if m == "tensorflow" or '
          'm.startswith(("tensorflow.", "keras"))))')
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == '[]', out.stdout[-500:]


def test_training_learns_the_synthetic_classes(full_run):
  # Classes differ in brightness and stripes: a trained encoder separates them
  # far above the 25% chance level.
  _, results = full_run
  assert results['trained/knn_weighted_top1@5'] > 0.6


def test_killed_run_resumes_to_the_same_final_state(full_run, tmp_path):
  workdir, _ = full_run
  # A copy of the run as if it had been killed right after the step-4
  # checkpoint: later checkpoints never got written.
  killed = str(tmp_path / 'killed')
  shutil.copytree(workdir, killed)
  for step in os.listdir(os.path.join(killed, 'checkpoints')):
    if step.isdigit() and int(step) > 4:
      shutil.rmtree(os.path.join(killed, 'checkpoints', step))
  os.remove(os.path.join(killed, 'results.json'))
  results = train.train_and_evaluate(_config(), killed, data=DATA)
  assert results['resumed_from_step'] == 4
  step_a, a = _final_params(workdir)
  step_b, b = _final_params(killed)
  assert step_a == step_b == 8
  assert len(jax.tree.leaves(a['params'])) > 5 and int(a['step']) == 8
  jax.tree.map(np.testing.assert_array_equal, a, b)   # Bit-identical.


def test_workdir_of_another_config_is_refused_untouched(full_run):
  workdir, _ = full_run
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints')))
  config = _config()
  old = config.loss_kwargs.temperature
  config.loss_kwargs.temperature = old + 0.5
  with pytest.raises(ValueError, match=rf'different config \(loss_kwargs.'
                     rf'temperature: {old} -> {old + 0.5}\)'):
    train.train_and_evaluate(config, workdir, data=DATA)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == before


def test_nan_loss_stops_with_the_step_and_metric(tmp_path):
  config = _config()
  config.optimizer.base_learning_rate = 1e30   # Diverges at once.
  with pytest.raises(FloatingPointError, match=r'at step \d+'):
    train.train_and_evaluate(config, str(tmp_path), data=DATA)


def test_bad_config_values_fail_before_training(tmp_path):
  config = _config()
  config.loss = 'no_such_loss'
  with pytest.raises(ValueError, match='unknown loss'):
    train.train_and_evaluate(config, str(tmp_path / 'a'), data=DATA)
  config = _config()
  config.batch_size = 30          # Not divisible by 8 devices.
  with pytest.raises(ValueError, match='divisible'):
    train.train_and_evaluate(config, str(tmp_path / 'b'), data=DATA)
  # Nothing written: neither workdir exists.
  assert not os.path.exists(tmp_path / 'a')
  assert not os.path.exists(tmp_path / 'b')


def _main(*args):
  return subprocess.run(
      [sys.executable, 'main.py', '--config=configs/test.py', *args],
      cwd=REPO, capture_output=True, text=True, timeout=120)


def test_main_rejects_a_misspelt_config_field(tmp_path):
  out = _main(f'--workdir={tmp_path}', '--config.optimzer.name=sgd')
  assert out.returncode != 0
  assert 'optimzer' in out.stderr
  assert not os.listdir(tmp_path)


def test_main_requires_workdir():
  out = _main()
  assert out.returncode != 0 and 'workdir' in out.stderr


def test_killed_moco_run_resumes_queue_pointer_and_key_encoder(tmp_path):
  # MoCo v2 with a queue and key encoder; 4 steps, killed after step 2.
  config = _config()
  config.method, config.loss = 'moco', 'infonce'
  config.loss_kwargs = {'temperature': 0.2, 'in_batch_negatives': False}
  config.moco.momentum, config.moco.queue_size = 0.9, 96
  config.model.encoder_kwargs.widths = (4,)
  config.eval.baselines = False
  full, killed = str(tmp_path / 'full'), str(tmp_path / 'killed')
  data = (DATA[0].__class__(DATA[0].images[:128], DATA[0].labels[:128]),
          DATA[1])
  train.train_and_evaluate(config, full, data=data)
  shutil.copytree(full, killed)
  for step in os.listdir(os.path.join(killed, 'checkpoints')):
    if step.isdigit() and int(step) > 2:
      shutil.rmtree(os.path.join(killed, 'checkpoints', step))
  assert train.train_and_evaluate(config, killed,
                                  data=data)['resumed_from_step'] == 2
  (sa, a), (sb, b) = _final_params(full), _final_params(killed)
  ma = a['method_state']
  assert sa == sb == 4 and int(ma['queue_ptr']) == 4 * 32 % 96
  assert ma['key_params'] is not None and np.shape(ma['queue']) == (96, 16)
  jax.tree.map(np.testing.assert_array_equal, a, b)   # Bit-identical.
