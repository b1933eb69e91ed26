"""Contrastive pretraining: train state, a pure train step, and the loop.

`train_and_evaluate(config, workdir)` is the whole job: it validates the config
and the workdir, loads the data, pretrains with checkpoints (resuming from the
latest one), then evaluates the trained encoder and two baselines (raw pixels,
the randomly initialised encoder) and writes `workdir/results.json`.

Parallelism: one 1-D mesh over every device of every process, axis 'data'. The
batch is sharded along it, parameters and optimizer state are replicated, and
`jax.jit` partitions the step. The mesh uses Auto axis types on purpose: the
losses are sharding-agnostic functions of the *global* batch (every embedding
is compared with every other), and Auto lets the partitioner insert the
all-gather of the embeddings that this needs, instead of each loss carrying
explicit `out_sharding` annotations.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from clu import metric_writers
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import checkpointing
from contrastive_jax import evaluate
from contrastive_jax import losses
from contrastive_jax import models
from input_pipeline import augment
from input_pipeline import pipeline


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any


def create_mesh() -> jax.sharding.Mesh:
  """A 1-D data-parallel mesh over all devices (Auto axes: see module doc)."""
  return jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))


def create_optimizer(config, total_steps: int) -> optax.GradientTransformation:
  """The configured optimizer with linear warmup and cosine decay.

  Weight decay skips biases and BatchNorm scales/offsets (1-D leaves), as is
  standard for SimCLR/MoCo-style training.
  """
  opt = config.optimizer
  # Linear scaling rule (Goyal et al. 2017): lr = base_lr * batch / 256.
  peak = opt.base_learning_rate * config.batch_size / 256
  warmup = int(opt.warmup_fraction * total_steps)
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0., peak_value=peak, warmup_steps=max(warmup, 1),
      decay_steps=max(total_steps, warmup + 1), end_value=0.)
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)
  if opt.name == 'adamw':
    return optax.adamw(schedule, weight_decay=opt.weight_decay,
                       mask=decay_mask)
  if opt.name == 'sgd':
    return optax.chain(
        optax.add_decayed_weights(opt.weight_decay, mask=decay_mask),
        optax.sgd(schedule, momentum=opt.momentum, nesterov=False))
  if opt.name == 'lars':
    return optax.lars(schedule, weight_decay=opt.weight_decay,
                      weight_decay_mask=decay_mask,
                      trust_ratio_mask=decay_mask, momentum=opt.momentum)
  raise ValueError(f'unknown optimizer {opt.name!r} (config.optimizer.name); '
                   'known: adamw, sgd, lars.')


def create_train_state(rng, model, tx, image_shape) -> TrainState:
  variables = model.init(rng, jnp.zeros((2,) + tuple(image_shape)),
                         train=False)
  params = variables['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    batch_stats=variables.get('batch_stats', {}),
                    opt_state=tx.init(params))


def train_step(state: TrainState, views: jax.Array, *, model, tx,
               loss_fn) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimisation step. Pure: jit it with the state donated.

  Args:
    state: the current TrainState.
    views: [B, V, H, W, C] augmented views of B instances.
    model: a ContrastiveModel.
    tx: the optax optimizer.
    loss_fn: `z [B, V, D] -> (loss, metrics)`, hyperparameters bound.

  Returns:
    (new_state, metrics) with `loss` and the loss's own metrics.
  """
  b, v = views.shape[:2]

  def objective(params):
    # All views go through the encoder as one batch, so BatchNorm statistics
    # are shared across views (and, under jit, across devices: global BN).
    out, new_vars = model.apply(
        {'params': params, 'batch_stats': state.batch_stats},
        views.reshape((b * v,) + views.shape[2:]), train=True,
        mutable=['batch_stats'])
    z = out['projection'].reshape(b, v, -1)
    loss, metrics = loss_fn(z)
    return loss, (metrics, new_vars['batch_stats'])

  (loss, (metrics, batch_stats)), grads = jax.value_and_grad(
      objective, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
  return state.replace(step=state.step + 1, params=params,
                       batch_stats=batch_stats, opt_state=opt_state), metrics


def _check_workdir(config, workdir: str) -> None:
  """Refuses a workdir that holds a run of a different config."""
  path = os.path.join(workdir, 'config.json')
  current = json.loads(config.to_json_best_effort(sort_keys=True))
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    if previous != current:
      flat_prev, flat_cur = _flatten(previous), _flatten(current)
      diff = ', '.join(
          f'{k}: {flat_prev.get(k)!r} -> {flat_cur.get(k)!r}'
          for k in sorted(set(flat_prev) | set(flat_cur))
          if flat_prev.get(k) != flat_cur.get(k))
      raise ValueError(
          f'workdir {workdir!r} holds a run of a different config ({diff}). '
          'Use a new --workdir, or delete '
          'this one to start over; nothing was changed.')
    return
  os.makedirs(workdir, exist_ok=True)
  with open(path, 'w') as f:
    json.dump(current, f, indent=2, sort_keys=True)


def _flatten(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


def validate_config(config) -> None:
  """Checks everything that can be checked before data or compilation."""
  losses.get_loss(config.loss)
  augment.get_views(config.augment.preset, config.augment.num_views)
  n = jax.device_count()
  if config.batch_size % n:
    raise ValueError(f'config.batch_size={config.batch_size} is not divisible '
                     f'by the {n} devices; use a multiple of {n}.')


def load_data(config) -> tuple[pipeline.ArrayDataset, pipeline.ArrayDataset]:
  ds = config.dataset
  return (pipeline.load_split(ds.name, ds.train_split, ds.data_dir),
          pipeline.load_split(ds.name, ds.eval_split, ds.data_dir))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       data: tuple[pipeline.ArrayDataset,
                                   pipeline.ArrayDataset] | None = None
                       ) -> dict[str, Any]:
  """Pretrains, evaluates and writes `workdir/results.json`.

  Args:
    config: an experiment config (see configs/default.py).
    workdir: where checkpoints, TensorBoard events, plots and results go.
    data: (train, test) datasets to use instead of loading
      `config.dataset.name` (tests inject synthetic data this way).

  Returns:
    The results dict written to results.json.
  """
  validate_config(config)
  _check_workdir(config, workdir)
  train_data, test_data = data if data is not None else load_data(config)

  mesh = create_mesh()
  data_sharding = NamedSharding(mesh, P('data'))
  replicated = NamedSharding(mesh, P())
  batches = pipeline.TrainBatches(train_data,
                                  global_batch_size=config.batch_size,
                                  seed=config.seed, sharding=data_sharding)
  total_steps = max(1, int(config.num_epochs * batches.steps_per_epoch))
  model = models.create_model(config)
  tx = create_optimizer(config, total_steps)
  loss_fn = functools.partial(losses.get_loss(config.loss),
                              **config.loss_kwargs)
  views_cfg = augment.get_views(config.augment.preset,
                                config.augment.num_views)
  image_shape = train_data.images.shape[1:]

  rng = jax.random.key(config.seed)
  init_rng, aug_rng = jax.random.split(rng)
  init_fn = jax.jit(functools.partial(create_train_state, model=model, tx=tx,
                                      image_shape=image_shape),
                    out_shardings=replicated)
  state = init_fn(init_rng)

  manager = checkpointing.create_manager(workdir)
  restored, restored_step = checkpointing.restore_latest(manager, state)
  if restored is not None:
    state = restored
    logging.info('Resumed from the checkpoint at step %d.', restored_step)

  step_fn = jax.jit(
      functools.partial(train_step, model=model, tx=tx, loss_fn=loss_fn),
      in_shardings=(replicated, data_sharding),
      out_shardings=(replicated, replicated), donate_argnums=(0,))
  # Per-step randomness is fold_in(key, step), so a resumed run draws the same
  # views as an uninterrupted one.
  augment_fn = jax.jit(
      lambda step, images: augment.augment_batch(
          jax.random.fold_in(aug_rng, step), images, views_cfg),
      in_shardings=(replicated, data_sharding), out_shardings=data_sharding)

  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)
  start = int(state.step)
  # Entries past the restored step belong to steps that will be redone.
  history = [h for h in _load_history(workdir) if h['step'] <= start]
  t0, last_logged, last_time = time.time(), start, time.time()
  for step in range(start, total_steps):
    batch = batches(step)
    views = augment_fn(step, batch['image'])
    state, metrics = step_fn(state, views)
    done = step + 1
    if done % config.log_every_steps == 0 or done == total_steps:
      metrics = jax.device_get(metrics)
      for name, value in metrics.items():
        if not np.isfinite(value):
          raise FloatingPointError(
              f'{name} is {value} at step {done}; stopping. The last good '
              f'checkpoint in {workdir}/checkpoints is kept.')
      now = time.time()
      ips = (done - last_logged) * config.batch_size / (now - last_time)
      eta = (total_steps - done) * (now - t0) / max(done - start, 1)
      scalars = {k: float(v) for k, v in metrics.items()}
      scalars['images_per_sec'] = ips
      writer.write_scalars(done, scalars)
      history.append({'step': done, **scalars})
      logging.info('step %d/%d  loss %.4f  %.0f img/s  ETA %s', done,
                   total_steps, scalars['loss'], ips, _fmt_time(eta))
      last_logged, last_time = done, now
    if done % config.checkpoint_every_steps == 0 or done == total_steps:
      checkpointing.save(manager, done, state)
      _save_history(workdir, history)
  manager.wait_until_finished()
  train_seconds = time.time() - t0

  results = evaluate.evaluate_all(
      # The donated initial state is gone; init is deterministic, so redo it.
      config, model, {'trained': state, 'random_init': init_fn(init_rng)},
      train_data, test_data, mesh)
  results.update(steps=total_steps, train_seconds=round(train_seconds, 1),
                 resumed_from_step=restored_step)
  if history:
    results['final_loss'] = history[-1]['loss']
    results['images_per_sec'] = float(np.median(
        [h['images_per_sec'] for h in history[1:]] or
        [history[-1]['images_per_sec']]))
  writer.write_scalars(total_steps, {k: v for k, v in results.items()
                                     if isinstance(v, float)})
  writer.flush()
  if jax.process_index() == 0:
    _write_json(os.path.join(workdir, 'results.json'), results)
    evaluate.plot_run(history, results, os.path.join(workdir, 'summary.png'))
    print(evaluate.summary(results, workdir), flush=True)
  return results


def _fmt_time(seconds: float) -> str:
  m, s = divmod(int(seconds), 60)
  return f'{m}m{s:02d}s'


def _write_json(path: str, obj) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)  # Atomic: never a half-written results file.


def _load_history(workdir: str) -> list[dict[str, float]]:
  path = os.path.join(workdir, 'history.json')
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  return []


def _save_history(workdir: str, history) -> None:
  if jax.process_index() == 0:
    _write_json(os.path.join(workdir, 'history.json'), history)
