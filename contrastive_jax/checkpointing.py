"""Checkpoints with Orbax: the only module that imports orbax.

Saving is asynchronous and keeps the last 3 steps; a step is listed only
once complete, and an unreadable one is skipped with a warning. `save`
refuses a non-finite state and raises when Orbax declines a step;
`restore_latest` raises when checkpoints exist but none fits the state.
Replica-parallel saving is kept for slices of at least
`REPLICA_PARALLEL_MIN_BYTES` only (docs/performance.md).
"""

from __future__ import annotations

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
  array = ocp.type_handlers.ArrayHandler(
      min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES)
  registry = ocp.type_handlers.create_type_handler_registry(
      *((t, ocp.type_handlers.get_type_handler(t))
        for t in ocp.type_handlers.supported_types() if t is not jax.Array),
      (jax.Array, array))
  return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


def create_manager(workdir: str) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=3,
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
  """Starts writing `state` as checkpoint `step` (asynchronously)."""
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
  """A tree path as plain names (metadata holds a TrainState's as keys)."""
  return tuple(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))
               for k in path)


def _shape_mismatches(manager: ocp.CheckpointManager, step: int,
                      target) -> list[str]:
  """The leaves of `target` whose shape differs from checkpoint `step`'s
  metadata (a failed restore would not name them)."""
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
  """(tree, step, errors) of the first of `steps` that reads (and, with
  `target`, has its shapes); tree and step None when none does."""
  errors = []
  for step in steps:
    if target is not None and (bad := _shape_mismatches(manager, step,
                                                         target)):
      error = f'step {step}: shapes differ: {"; ".join(bad[:4])}'
    else:
      try:
        return manager.restore(step, args=args), step, errors
      except Exception as e:  # pylint: disable=broad-except
        # The first sentence: Orbax's advice after it would change the state.
        error = f'step {step}: {type(e).__name__}: {str(e).split(". ")[0]}'
    logging.warning('Checkpoint %s; trying the previous one.', error)
    errors.append(error[:400])
  return None, None, errors


def restore_latest(manager: ocp.CheckpointManager, target):
  """(state, step) of the newest readable checkpoint in `target`'s structure
  and shardings; (target, None) when there is none. ValueError when none of
  the checkpoints restores (e.g. a memory bank padded to another count)."""
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


def _not_harmless(record) -> bool:
  """A log filter leaving out orbax's notices about read-only managers."""
  return not any(m in record.getMessage() for m in runtime.HARMLESS_WARNINGS)


def restore_variables(workdir: str, model, image_shape: Sequence[int], mesh,
                      step: int | None = None) -> tuple[dict[str, Any], int]:
  """({'params', 'batch_stats'}, step) of checkpoint `step` (None: the newest
  readable one), replicated on `mesh`, as `model.apply` takes them on
  (H, W, C) `image_shape` images. FileNotFoundError when none reads.
  """
  directory = os.path.join(storage.location(workdir), 'checkpoints')
  if not storage.path(directory).is_dir():
    raise FileNotFoundError(f'no checkpoints in {directory}.')
  replicated = NamedSharding(mesh, P())
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0),
                         jnp.zeros((2,) + tuple(image_shape)), train=False))
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      {'params': shapes['params'],
       'batch_stats': shapes.get('batch_stats', {})})
  # The options a read-only manager takes; orbax notes any it has to reset.
  options = ocp.CheckpointManagerOptions(read_only=True, create=False,
                                         save_interval_steps=0)
  logger = logging.get_absl_logger()      # orbax logs through absl.
  logger.addFilter(_not_harmless)
  try:
    with ocp.CheckpointManager(directory, options=options) as manager:
      steps = [step] if step is not None else sorted(manager.all_steps(),
                                                     reverse=True)
      # partial_restore: the rest of the saved TrainState stays on disk.
      out, restored, errors = _restore_first_readable(
          manager, steps, ocp.args.PyTreeRestore(
              item=target, partial_restore=True,
              restore_args=ocp.checkpoint_utils.construct_restore_args(
                  target)))
  finally:
    logger.removeFilter(_not_harmless)
  if restored is not None:
    return {'params': out['params'],
            'batch_stats': out['batch_stats']}, restored
  raise FileNotFoundError(f'no readable checkpoint in {directory}'
                          + (': ' + '; '.join(errors) if errors else '.'))
