"""Checkpoints with Orbax: the only module that imports orbax.

Saving is asynchronous (training continues while the previous state is written)
and the last `max_to_keep` checkpoints are kept. Orbax writes each step to a
temporary directory and renames it when complete (on `gs://`, where nothing
renames, into the step's directory, completed by a last `commit_success.txt`
object), so a run killed mid-save leaves at most an unfinished directory that
is never listed; a finished but
unreadable checkpoint is skipped with a warning in favour of the one before.
A run never loses its progress silently: `save` refuses a state with a
non-finite value and raises when Orbax declines to write a step, and
`restore_latest` raises when checkpoints exist but none fits the state
(a new run in that workdir would stop writing checkpoints until it passed
the newest step on disk).

Replicated arrays are written by one replica each, except large ones:
orbax's replica-parallel saving cuts every replicated array into one slice
per replica, each cut a small jitted `slice` compiled per array shape and
device, which costs more than it saves for small arrays. Slicing is kept for
slices of at least `REPLICA_PARALLEL_MIN_BYTES`, where several hosts sharing
the write of a large array pays off (docs/performance.md has the figures).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import runtime
from contrastive_jax import storage


REPLICA_PARALLEL_MIN_BYTES = 1 << 20


def _handler() -> ocp.PyTreeCheckpointHandler:
  """Orbax's standard handler, with replica-parallel saving for large arrays
  only (module docstring)."""
  array = ocp.type_handlers.ArrayHandler(
      min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES)
  registry = ocp.type_handlers.create_type_handler_registry(
      *((t, ocp.type_handlers.get_type_handler(t))
        for t in ocp.type_handlers.supported_types() if t is not jax.Array),
      (jax.Array, array))
  return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


def create_manager(workdir: str, *, max_to_keep: int = 3
                   ) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                         enable_async_checkpointing=True)
  return ocp.CheckpointManager(
      os.path.join(storage.location(workdir), 'checkpoints'), options=options,
      item_handlers=_handler())


@jax.jit
def _all_finite(leaves):
  return [jnp.all(jnp.isfinite(x)) for x in leaves]


def nonfinite_leaves(tree) -> list[str]:
  """The paths of `tree`'s floating-point leaves holding a NaN or inf."""
  floats = [(path, x) for path, x in jax.tree.leaves_with_path(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  # Each flag is replicated, so every process fetches the same answer.
  finite = jax.device_get(_all_finite([x for _, x in floats]))
  return [jax.tree_util.keystr(path)
          for (path, _), ok in zip(floats, finite) if not ok]


def save(manager: ocp.CheckpointManager, step: int, state) -> None:
  """Starts writing `state` as checkpoint `step` (asynchronously).

  Raises:
    FloatingPointError: `state` holds a NaN or inf (nothing is written, so
      every checkpoint on disk can be resumed from).
    RuntimeError: Orbax declined to write `step` (a checkpoint at this or
      a later step is already on disk).
  """
  if bad := nonfinite_leaves(state):
    raise FloatingPointError(
        f'the state at step {step} is not finite ({", ".join(bad[:4])}'
        f'{", ..." if len(bad) > 4 else ""}); stopping without saving it. '
        f'The last good checkpoint in {manager.directory} is kept.')
  if not manager.save(step, args=ocp.args.PyTreeSave(state)):
    raise RuntimeError(
        f'checkpoint step {step} was not written: {manager.directory} '
        f'already holds steps {sorted(manager.all_steps())}. Move them away '
        'or use another --workdir.')


def _names(path) -> tuple:
  """A tree path as plain names: a saved TrainState's fields come back from
  the checkpoint's metadata as dict keys."""
  return tuple(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))
               for k in path)


def _shape_mismatches(manager: ocp.CheckpointManager, step: int,
                      target) -> list[str]:
  """The leaves of `target` whose shape differs from checkpoint `step`'s,
  read from its metadata (a restore that fails part-way leaves Orbax's
  pending reads behind, and its error does not name the leaf)."""
  try:
    stored = {_names(path): getattr(leaf, 'shape', None) for path, leaf in
              jax.tree.leaves_with_path(manager.item_metadata(step))}
  except Exception:  # pylint: disable=broad-except
    return []   # No metadata to compare with: the restore will tell.
  out = []
  for path, leaf in jax.tree.leaves_with_path(target):
    saved = stored.get(_names(path))
    if saved is not None and tuple(saved) != tuple(leaf.shape):
      out.append(f'{jax.tree_util.keystr(path)} is {tuple(saved)} there, '
                 f'{tuple(leaf.shape)} here')
  return out


def _restore_first_readable(manager: ocp.CheckpointManager, steps, args,
                            target=None):
  """Restores the first of `steps` that reads: (tree, step, errors), tree
  and step None when none does; each unreadable one is warned about. With
  `target`, a checkpoint whose shapes differ from it is not read."""
  errors = []
  for step in steps:
    if target is not None and (bad := _shape_mismatches(manager, step,
                                                         target)):
      error = f'step {step}: shapes differ: {"; ".join(bad[:4])}'
    else:
      try:
        return manager.restore(step, args=args), step, errors
      except Exception as e:  # pylint: disable=broad-except
        # The first sentence: Orbax's advice after it (padding and
        # truncation) would silently change the state.
        error = f'step {step}: {type(e).__name__}: {str(e).split(". ")[0]}'
    logging.warning('Checkpoint %s; trying the previous one.', error)
    errors.append(error[:400])
  return None, None, errors


def restore_latest(manager: ocp.CheckpointManager, target):
  """Restores the newest readable checkpoint into the structure of `target`.

  Args:
    manager: the run's checkpoint manager.
    target: a state (or `jax.eval_shape` of one) whose leaves carry the
      shardings to restore onto.

  Returns:
    (state, step): the restored state and its step, or (target, None) when
    there is no checkpoint.

  Raises:
    ValueError: there are checkpoints and none restores into `target`.
      The config is checked against the workdir's before this
      (workdir.check_config), so the usual cause is a state whose shapes
      depend on the device count: a memory bank's rows are padded to a
      multiple of it (memory_bank.bank_rows).
  """
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  state, step, errors = _restore_first_readable(
      manager, sorted(manager.all_steps(), reverse=True),
      ocp.args.PyTreeRestore(abstract, restore_args=(
          ocp.checkpoint_utils.construct_restore_args(abstract))), abstract)
  if step is None and errors:
    raise ValueError(
        f'no checkpoint in {manager.directory} restores into this run\'s '
        f'state ({"; ".join(errors)}). A checkpoint resumes only the run '
        'that wrote it: the same config, the same training data and, with a '
        'memory bank, the same number of devices (its rows are padded to a '
        'multiple of it). Resume as it was written, or start over in a new '
        '--workdir.')
  if step is None:
    return target, None
  logging.info('Resumed from the checkpoint at step %d.', step)
  return state, step


@contextlib.contextmanager
def _without_read_only_notices():
  """Leaves out the notices orbax logs for every read-only checkpoint
  manager (the options it resets, 'Given directory is read only'): they ask
  nothing of whoever loads an encoder. Every other record, the restore's own
  warnings included, goes through."""
  def keep(record) -> bool:
    return not any(m in record.getMessage() for m in runtime.HARMLESS_WARNINGS)
  logger = logging.get_absl_logger()      # orbax logs through absl.
  logger.addFilter(keep)
  try:
    yield
  finally:
    logger.removeFilter(keep)


def restore_variables(workdir: str, model, image_shape: Sequence[int], mesh,
                      step: int | None = None) -> tuple[dict[str, Any], int]:
  """Restores params and batch_stats of the newest readable checkpoint.

  Args:
    workdir: the run directory (checkpoints in `<workdir>/checkpoints`).
    model: the run's ContrastiveModel (defines the expected shapes).
    image_shape: (H, W, C) of the training images.
    mesh: the mesh to place the (replicated) variables on.
    step: a specific step; None takes the newest one that reads.

  Returns:
    (variables, step): variables {'params', 'batch_stats'}, as model.apply
    takes them.

  Raises:
    FileNotFoundError: no (readable) checkpoint.
  """
  directory = os.path.join(storage.location(workdir), 'checkpoints')
  if not storage.path(directory).is_dir():
    raise FileNotFoundError(f'no checkpoints in {directory}.')
  replicated = NamedSharding(mesh, P())
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0),
                         jnp.zeros((2,) + tuple(image_shape)), train=False))
  target = {'params': shapes['params'],
            'batch_stats': shapes.get('batch_stats', {})}
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      target)
  restore_args = ocp.checkpoint_utils.construct_restore_args(target)
  # The options a read-only manager takes; orbax notes any it has to reset.
  options = ocp.CheckpointManagerOptions(read_only=True, create=False,
                                         save_interval_steps=0)
  with _without_read_only_notices(), ocp.CheckpointManager(
      directory, options=options) as manager:
    steps = [step] if step is not None else sorted(manager.all_steps(),
                                                   reverse=True)
    # partial_restore: every other field of the saved TrainState (opt state,
    # key encoder, queue, bank, ...) is left on disk.
    out, restored, errors = _restore_first_readable(
        manager, steps, ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True))
  if restored is not None:
    return {'params': out['params'],
            'batch_stats': out['batch_stats']}, restored
  raise FileNotFoundError(f'no readable checkpoint in {directory}'
                          + (': ' + '; '.join(errors) if errors else '.'))
