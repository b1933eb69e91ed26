"""A run never loses its progress silently: what `checkpointing` refuses.

Saving a non-finite state, a step Orbax declines to write, and resuming
from checkpoints none of which fits the run's state all stop with a message
naming the problem; an unreadable newest checkpoint falls back to the one
before it.
"""

import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from configs import test as test_config
from contrastive_jax import checkpointing
from contrastive_jax import train
import synthetic_data


def _state(rows: int, fill: float = 1.):
  return {'bank': jnp.full((rows, 4), fill), 'params': {'w': jnp.ones(3)},
          'step': jnp.int32(7)}


def _save(workdir, step, state):
  manager = checkpointing.create_manager(str(workdir))
  checkpointing.save(manager, step, state)
  manager.wait_until_finished()
  return manager


def _steps(workdir):
  return sorted(os.listdir(os.path.join(workdir, 'checkpoints')))


def test_restore_raises_when_no_checkpoint_fits_the_state(tmp_path):
  manager = _save(tmp_path, 500, _state(10))
  with pytest.raises(ValueError) as e:
    checkpointing.restore_latest(manager, _state(12))
  message = str(e.value)
  assert 'no checkpoint in' in message and 'step 500' in message
  assert "['bank'] is (10, 4) there, (12, 4) here" in message
  assert 'new --workdir' in message and 'strict=False' not in message
  assert _steps(tmp_path) == ['500']          # Nothing is removed.


def test_restore_without_checkpoints_returns_the_target(tmp_path):
  manager = checkpointing.create_manager(str(tmp_path))
  target = _state(10)
  state, step = checkpointing.restore_latest(manager, target)
  assert step is None and state is target


def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(
    tmp_path):
  manager = _save(tmp_path, 1, _state(10, 1.))
  checkpointing.save(manager, 2, _state(10, 2.))
  manager.wait_until_finished()
  # Step 2's array data goes missing (a truncated copy, a lost file).
  newest = os.path.join(tmp_path, 'checkpoints', '2')
  for entry in os.listdir(newest):
    path = os.path.join(newest, entry)
    if os.path.isdir(path):
      shutil.rmtree(path)
  state, step = checkpointing.restore_latest(manager, _state(10, 0.))
  assert step == 1
  np.testing.assert_array_equal(state['bank'], np.ones((10, 4)))


def test_save_refuses_a_state_with_a_nan_and_names_it(tmp_path):
  manager = _save(tmp_path, 1, _state(10))
  state = _state(10)
  state['params']['w'] = state['params']['w'].at[1].set(jnp.inf)
  with pytest.raises(FloatingPointError,
                     match=r"step 2 is not finite \(\['params'\]\['w'\]\)"):
    checkpointing.save(manager, 2, state)
  manager.wait_until_finished()
  assert _steps(tmp_path) == ['1']


def test_save_raises_when_orbax_declines_the_step(tmp_path):
  manager = _save(tmp_path, 500, _state(10))
  with pytest.raises(RuntimeError,
                     match=r'step 100 was not written: .* holds steps \[500\]'):
    checkpointing.save(manager, 100, _state(10))


def _insdis_config():
  config = test_config.get_config()
  config.method, config.loss = 'memory_bank', 'insdis'
  config.loss_kwargs = {'temperature': 0.07}
  config.augment.num_views = 1
  config.memory_bank.num_negatives = 16
  config.eval.baselines = False
  config.checkpoint_every_steps = 2
  return config


def test_a_memory_bank_run_resumed_on_other_data_stops_before_training(
    tmp_path):
  # The bank has a row per training image: a checkpoint of a 256-image run
  # does not fit a 200-image one. Unchecked, the run would restart from
  # step 0 and Orbax would decline every save up to the newest step on disk.
  data = (synthetic_data.stripes_and_brightness(256, 0),
          synthetic_data.stripes_and_brightness(64, 1))
  config = _insdis_config()
  config.num_epochs = 2 / 8                   # 2 steps of 32.
  train.train_and_evaluate(config, str(tmp_path), data=data)
  assert _steps(tmp_path) == ['2']
  fewer = (synthetic_data.stripes_and_brightness(200, 0), data[1])
  with pytest.raises(ValueError, match=r"no checkpoint in .* restores into "
                     r"this run's state \(step 2: shapes differ: "
                     r".*\(256, .*\(200, "):
    train.train_and_evaluate(config, str(tmp_path), data=fewer)
  assert _steps(tmp_path) == ['2']


# Restoring without a target (any state on disk) reads its shardings from
# the checkpoint, which Orbax warns about.
@pytest.mark.filterwarnings('ignore:Sharding info not provided')
def test_a_diverging_run_never_saves_a_nonfinite_state(tmp_path):
  # Saves every step, logs (and so checks the loss) only at the end: the
  # save itself stops the run, at the first step whose state is not finite.
  config = test_config.get_config()
  config.optimizer.base_learning_rate = 1e30
  config.log_every_steps = 8
  config.checkpoint_every_steps = 1
  data = (synthetic_data.stripes_and_brightness(256, 0),
          synthetic_data.stripes_and_brightness(64, 1))
  with pytest.raises(FloatingPointError, match=r'is not finite .* stopping '
                     'without saving it'):
    train.train_and_evaluate(config, str(tmp_path), data=data)
  manager = checkpointing.create_manager(str(tmp_path))
  for step in manager.all_steps():
    restored = manager.restore(step)
    assert not checkpointing.nonfinite_leaves(restored), step
