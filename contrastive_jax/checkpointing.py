"""Checkpoints with Orbax: the only module that imports orbax.

Saving is asynchronous (training continues while the previous state is written)
and the last `max_to_keep` checkpoints are kept. Orbax writes each step to a
temporary directory and renames it when complete, so a run killed mid-save
leaves at most an unfinished directory that is never listed; a finished but
unreadable checkpoint is skipped with a warning in favour of the one before.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from absl import logging


def create_manager(workdir: str, *, max_to_keep: int = 3
                   ) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                         enable_async_checkpointing=True)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'), options=options)


def save(manager: ocp.CheckpointManager, step: int, state) -> None:
  manager.save(step, args=ocp.args.StandardSave(state))


def restore_latest(manager: ocp.CheckpointManager, target):
  """Restores the newest readable checkpoint into the structure of `target`.

  Args:
    manager: the run's checkpoint manager.
    target: a state (or `jax.eval_shape` of one) whose leaves carry the
      shardings to restore onto.

  Returns:
    (state, step), or (None, None) when there is no checkpoint.
  """
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      state = manager.restore(step, args=ocp.args.StandardRestore(abstract))
      return state, step
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('Checkpoint at step %d is unreadable (%s: %s); trying '
                      'the previous one.', step, type(e).__name__, e)
  return None, None
