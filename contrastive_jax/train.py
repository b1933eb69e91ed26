"""The training job: `train_and_evaluate(config, workdir)` checks, loads the
data, pretrains (resuming from the latest checkpoint) with online evaluators
on schedule, runs the final evaluators on the trained encoder and baselines,
and writes `workdir/results.json`. SIGTERM or Ctrl-C saves the step and
raises `Preempted`; a non-finite metric raises FloatingPointError.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import jax
import ml_collections
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import checkpointing
from contrastive_jax import config_lib
from contrastive_jax import data as data_lib
from contrastive_jax import evaluators
from contrastive_jax import progress
from contrastive_jax import reporting
from contrastive_jax import runtime
from contrastive_jax import step as step_lib
from contrastive_jax import storage
from contrastive_jax import workdir as workdir_lib
from contrastive_jax.evaluators import features
from input_pipeline import augment
from input_pipeline import pipeline
from input_pipeline import sources


class Preempted(Exception):
  """SIGTERM or SIGINT stopped the job at `step`, which is saved."""

  def __init__(self, signal_name: str, step: int, workdir: str):
    self.signal, self.step = signal_name, step
    what = 'interrupted' if signal_name == 'SIGINT' else 'preempted'
    super().__init__(
        f'{what} ({signal_name}) at step {step}: its checkpoint is saved in '
        f'{workdir}/checkpoints; rerun the same command to resume.')


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A run's (init, augmentation, step) keys, all from `config.seed`."""
  return tuple(jax.random.split(jax.random.key(seed), 3))


def make_augment_fn(views, fit, mesh, aug_rng):
  """augment_fn(step, images uint8) -> views [B, V, h, w, C] sharded on `mesh`;
  step s draws from fold_in(aug_rng, s), so a resumed run repeats its views."""
  rows, replicated = NamedSharding(mesh, P('data')), NamedSharding(mesh, P())
  host_cropped = isinstance(fit, sources.RandomCrops)
  return jax.jit(lambda step, images: augment.augment_batch(
      jax.random.fold_in(aug_rng, step), images, views,
      host_cropped=host_cropped), in_shardings=(replicated, rows),
                 out_shardings=rows)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       data=None) -> dict[str, Any]:
  """Pretrains `config` (configs/*.py) in `workdir`, evaluates, and returns
  the results written to results.json; `data`: (train, eval) sources used
  instead of `config.dataset` (tests). Raises `Preempted`,
  FloatingPointError or `errors.ConfigError` (before anything is written).
  """
  config, train_data, test_data = _prepare(config, workdir, data)
  splits = {'training data': train_data, 'evaluation data': test_data}
  mesh = runtime.create_mesh()
  rows = NamedSharding(mesh, P('data'))
  views = augment.build_views(config.augment.preset, config.augment.num_views,
                              config.augment.overrides, config.augment.op_order)
  fit = sources.training_fit(config.dataset, views, config.seed)
  batches = pipeline.TrainBatches(
      train_data, global_batch_size=config.batch_size, seed=config.seed,
      sharding=rows, num_workers=config.dataset.num_workers, fit=fit)
  total_steps = max(1, int(config.num_epochs * batches.steps_per_epoch))
  setup = step_lib.build(
      config, mesh, total_steps=total_steps,
      steps_per_epoch=batches.steps_per_epoch, num_examples=len(train_data),
      image_shape=train_data.image_shape, num_classes=train_data.num_classes)
  init_rng, aug_rng, step_rng = seed_keys(config.seed)
  augment_fn = make_augment_fn(views, fit, mesh, aug_rng)
  evals = evaluators.build(config)
  env = evaluators.Env(config, setup.model, mesh, train_data, test_data,
                       features.make_feature_fn(setup.model, mesh))

  manager = checkpointing.create_manager(workdir)
  state, restored_step = checkpointing.restore_latest(
      manager, setup.init_fn(init_rng))
  start = int(state.step)
  log = reporting.TrainLog(workdir, config, start=start,
                           total_steps=total_steps)
  # On any exit: saves in flight finish before an error propagates.
  with contextlib.ExitStack() as stack:
    preempted = stack.enter_context(_stop_signals())
    stack.callback(manager.close)
    stack.callback(manager.wait_until_finished)
    stream = stack.enter_context(contextlib.closing(
        batches.iterate(start, total_steps)))
    with progress.bar(total_steps, 'pretraining', initial=start) as bar:
      for step, batch in zip(range(start, total_steps), log.input(stream)):
        state, metrics = setup.step_fn(
            state, {'views': augment_fn(step, batch['image']),
                    'label': batch['label'], 'index': batch['index']},
            step_rng)
        done = step + 1
        if log.step(done, metrics, setup.learning_rate(step), bar):
          data_lib.count_skipped(config, splits)   # Too many bad records?
        if due := evaluators.due(evals, done, total_steps):
          log.online(done, evaluators.run_online(
              due, features.variables_of(state), env))
        stop = preempted(done)
        if (stop or done % config.checkpoint_every_steps == 0 or
            done == total_steps):
          checkpointing.save(manager, done, state)
          log.save()
        if stop:
          raise Preempted(stop, done, workdir)
  log.end_training()
  # The donated initial state is gone; init is deterministic: redo it.
  results, embeddings = _evaluate(evals, env, state,
                                  setup.init_fn(init_rng), splits)
  results.update(log.results(), resumed_from_step=restored_step)
  log.finish(results, embeddings, classes=train_data.classes)
  return results


def _prepare(config, workdir: str, data):
  """The config (with defaults), data and bound workdir, all checked first."""
  config = config_lib.with_defaults(config)
  config_lib.validate(config)
  # An unreachable bucket fails here, on every host, not at a checkpoint.
  storage.check(workdir, what='--workdir', write=True)
  if config.dataset.data_dir:
    storage.check(config.dataset.data_dir, what='config.dataset.data_dir',
                  write=False)
  workdir_lib.check_config(config, workdir)
  stored_classes = workdir_lib.load_classes(workdir)
  train_data, test_data = data or data_lib.load(config, stored_classes)
  workdir_lib.check_classes(workdir, stored_classes, train_data.classes)
  config_lib.validate_data(config, num_train=len(train_data))
  workdir_lib.bind(workdir, config, classes=train_data.classes,
                   image_shape=train_data.image_shape)
  logging.info('Data: %d training and %d evaluation examples of shape %s; '
               'compiling the step.', len(train_data), len(test_data),
               tuple(train_data.image_shape))
  return config, train_data, test_data


def _evaluate(evals, env, state, initial_state, splits):
  """(results, embeddings) of the final evaluators, trained and initial."""
  results, embeddings = evaluators.run_final(
      evals, {'trained': features.variables_of(state),
              'random_init': features.variables_of(initial_state)},
      env, baselines=env.config.eval.baselines)
  results.update(data_lib.count_skipped(env.config, splits))
  if results['data/skipped_records']:
    logging.warning('%d undecodable records were replaced by black images in '
                    'training and left out of evaluation: %s',
                    results['data/skipped_records'],
                    ', '.join(results['data/skipped_files']))
  return results, embeddings


@contextlib.contextmanager
def _stop_signals():
  """Yields check(step) -> 'SIGTERM' or 'SIGINT' if the job stops at `step`,
  else ''. A second Ctrl-C aborts at once; with several processes JAX's
  preemption sync agrees on the step (SIGINT is passed on as SIGTERM).
  Handlers are set only from the main thread and restored on exit."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  several = jax.process_count() > 1
  received = []

  def on_sigint(signum, frame):
    del frame
    received.append(signum)
    os.write(2, b'\nCtrl-C: saving this step, then stopping (Ctrl-C again '
                b'aborts).\n')
    signal.signal(signal.SIGINT, (lambda *_: os._exit(130)) if several
                  else signal.default_int_handler)
    if several:
      os.kill(os.getpid(), signal.SIGTERM)

  previous = {}
  if threading.current_thread() is threading.main_thread():
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
    if not several:
      previous[signal.SIGTERM] = signal.signal(
          signal.SIGTERM, lambda signum, frame: received.append(signum))

  def check(step: int) -> str:
    stop = (multihost_utils.reached_preemption_sync_point(step) if several
            else bool(received))
    if not stop:
      return ''
    return 'SIGINT' if signal.SIGINT in received else 'SIGTERM'

  try:
    yield check
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
