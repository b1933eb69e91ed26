"""Contrastive pretraining: train state, a pure train step, and the loop.

`train_and_evaluate(config, workdir)` is the whole job: it validates the config
and the workdir, loads the data, pretrains with checkpoints (resuming from the
latest one), then evaluates the trained encoder and two baselines (raw pixels,
the randomly initialised encoder) and writes `workdir/results.json`.

Parallelism: one 1-D mesh over every device of every process, axis 'data'
(`runtime.create_mesh`, Auto axes: see there why). The batch is sharded along
it, parameters and optimizer state are replicated, the MoCo queue and the
memory bank are sharded by rows and stay so (`state_shardings`), and `jax.jit`
partitions the step. Each process feeds only its part of every batch
(`input_pipeline/pipeline.py`).

Stopping: SIGTERM (a preemption notice, on any host) saves the step all
processes agree on and raises `Preempted`; a non-finite metric raises
`FloatingPointError`. Either way the asynchronous checkpointer finishes first,
so the error is the last thing printed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import checkpointing
from contrastive_jax import evaluate
from contrastive_jax import event_writer
from contrastive_jax.evaluators import diagnostics
from contrastive_jax.evaluators import linear_eval
from contrastive_jax import losses
from contrastive_jax import methods
from contrastive_jax import models
from contrastive_jax import progress
from contrastive_jax import runtime
from contrastive_jax import schedules
from contrastive_jax import state as state_lib
from input_pipeline import augment
from input_pipeline import pipeline
from input_pipeline import sources


TrainState = state_lib.TrainState


create_mesh = runtime.create_mesh


def learning_rate_schedule(config, total_steps: int) -> optax.Schedule:
  """Step -> learning rate: linear warmup, then cosine decay to 0 or steps.

  `config.optimizer.schedule`: 'cosine' (SimCLR, MoCo v2/v3) or 'step'
  (InsDis, MoCo v1: multiplied by `lr_decay` at each of `decay_epochs`).
  The warmup rises linearly from `warmup_init_lr` (an absolute learning
  rate: 0 for SimCLR and MoCo v3, 0.01 for SupContrast) to the peak.
  """
  opt = config.optimizer
  # Linear scaling rule (Goyal et al. 2017): lr = base_lr * batch / 256.
  peak = opt.base_learning_rate * config.batch_size / 256
  warmup = int(opt.warmup_fraction * total_steps)
  init = opt.get('warmup_init_lr', 0.)   # .get: configs from before it.
  kind = opt.get('schedule', 'cosine')   # .get: configs from before 'step'.
  if kind == 'cosine' and not opt.warmup_fraction:
    # No warmup configured (MoCo v2): the peak from step 0. (A warmup that
    # rounds to 0 steps keeps optax's 1-step warmup, as runs always have.)
    return optax.cosine_decay_schedule(peak, max(total_steps, 1))
  if kind == 'cosine':
    # warmup + 2: a run of 0 or 1 steps (the study's untrained baselines)
    # still gets a valid schedule; from 2 steps on this is total_steps.
    return optax.warmup_cosine_decay_schedule(
        init_value=init, peak_value=peak, warmup_steps=max(warmup, 1),
        decay_steps=max(total_steps, warmup + 2), end_value=0.)
  if kind != 'step':
    raise ValueError(f'config.optimizer.schedule={kind!r}; known: cosine, '
                     'step.')
  steps_per_epoch = total_steps / float(config.num_epochs)
  steps = optax.piecewise_constant_schedule(peak, {
      int(round(e * steps_per_epoch)): opt.lr_decay
      for e in opt.decay_epochs})
  if not warmup:
    return steps
  return optax.join_schedules(
      [optax.linear_schedule(init, peak, warmup),
       lambda step: steps(step + warmup)], [warmup])


def scale_by_clipped_trust_ratio(trust_coefficient: float,
                                 weight_decay: float,
                                 learning_rate: optax.Schedule, *, mask,
                                 eps: float = 1e-8
                                 ) -> optax.GradientTransformation:
  """solo-learn's LARS adaptation with `clip_lr` (solo/utils/lars.py).

  For a leaf w of `mask` with gradient g (both nonzero) at learning rate lr:
    ratio = eta ||w|| / (||g|| + wd ||w|| + eps)
    u = min(ratio / lr, 1) (g + wd w)
  so that after the momentum trace and the step's x lr, the layer's rate is
  min(eta ||w|| / (||g|| + wd ||w||), lr): the trust ratio caps the global lr
  and never raises it. Other leaves (biases, BN) and zero w or g pass g
  unchanged, without weight decay, as solo-learn's `exclude_bias_n_norm`.
  lr is `learning_rate` at this transformation's own step count, which
  advances with `optax.scale_by_learning_rate`'s.
  """

  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params):
    lr = learning_rate(state.count)

    def leaf(g, w, adapt):
      if not adapt:
        return g
      w_norm, g_norm = jnp.linalg.norm(w), jnp.linalg.norm(g)
      ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm
                                            + eps)
      factor = jnp.where(ratio < lr, ratio / jnp.where(lr > 0, lr, 1.), 1.)
      return jnp.where((w_norm > 0) & (g_norm > 0),
                       factor * (g + weight_decay * w), g)

    out = jax.tree.map(leaf, updates, params, mask(params))
    return out, optax.ScaleByScheduleState(
        count=optax.safe_int32_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def create_optimizer(config, schedule: optax.Schedule
                     ) -> optax.GradientTransformation:
  """The configured optimizer on `schedule` (`learning_rate_schedule`).

  Weight decay skips biases and BatchNorm scales/offsets (1-D leaves), as is
  standard for SimCLR/MoCo-style training. LARS takes its trust coefficient
  from `trust_coefficient` (SimCLR and MoCo v3: 0.001; solo-learn's `eta`)
  and with `clip_lr` caps each layer's rate at the global lr, as solo-learn
  (`scale_by_clipped_trust_ratio`).
  """
  opt = config.optimizer
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)
  if opt.name == 'adamw':
    return optax.adamw(schedule, weight_decay=opt.weight_decay,
                       mask=decay_mask)
  if opt.name == 'sgd':
    return optax.chain(
        optax.add_decayed_weights(opt.weight_decay, mask=decay_mask),
        optax.sgd(schedule, momentum=opt.momentum, nesterov=False))
  if opt.name == 'lars':
    trust = opt.get('trust_coefficient', 0.001)   # .get: older configs.
    if not opt.get('clip_lr', False):
      return optax.lars(schedule, weight_decay=opt.weight_decay,
                        weight_decay_mask=decay_mask,
                        trust_ratio_mask=decay_mask, momentum=opt.momentum,
                        trust_coefficient=trust)
    return optax.chain(
        scale_by_clipped_trust_ratio(trust, opt.weight_decay, schedule,
                                     mask=decay_mask),
        optax.trace(decay=opt.momentum),
        optax.scale_by_learning_rate(schedule))
  raise ValueError(f'unknown optimizer {opt.name!r} (config.optimizer.name); '
                   'known: adamw, sgd, lars.')


# --------------------------------------------------------------------------
# The step: method prepares, forward, loss, optimiser, method updates.
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Loss:
  """The configured loss: its name, fixed hyperparameters and schedules.

  `schedules` maps a loss keyword to a function step -> value (e.g. JCL's
  lambda ramp, `config.loss_schedules`); the step passes their values traced,
  so a changing value does not recompile it.
  """
  name: str
  kwargs: dict[str, Any]
  schedules: dict[str, Any]

  @classmethod
  def from_config(cls, config, method: methods.base.Method,
                  ctx: methods.base.Context) -> 'Loss':
    kwargs = {**dict(config.loss_kwargs), **method.loss_kwargs()}
    scheduled = {}
    for name, kind in dict(config.loss_schedules).items():
      base_value = kwargs.pop(name) if name in kwargs else losses.default_kwarg(
          config.loss, name)
      scheduled[name] = schedules.build(
          kind, float(base_value), total_steps=ctx.total_steps,
          steps_per_epoch=ctx.steps_per_epoch, num_epochs=ctx.num_epochs,
          name=f'config.loss_schedules.{name}')
    return cls(name=config.loss, kwargs=kwargs, schedules=scheduled)


@dataclasses.dataclass(frozen=True)
class OnlineProbe:
  """The online linear monitor's settings (`config.online`)."""
  num_classes: int
  learning_rate: float

  @property
  def tx(self) -> optax.GradientTransformation:
    return optax.adam(self.learning_rate)


def online_probe_step(probe_params, probe_opt_state, features, labels, *,
                      probe: OnlineProbe):
  """One step of the online linear monitor on frozen features.

  Args:
    probe_params: {'w': [F, C], 'b': [C]}.
    probe_opt_state: its Adam state.
    features: [B, F] backbone features of the batch (one view).
    labels: [B] int class ids.
    probe: its settings.

  Returns:
    (probe_params, probe_opt_state, metrics) with `online/linear_acc` (top-1
    on this batch, before the update) and `online/linear_loss`.
  """
  # The monitor must not train the encoder: labels would leak into what is
  # meant to be self-supervised pretraining (BYOL's online classifier is
  # trained on stop_gradient features for the same reason).
  features = jax.lax.stop_gradient(features.astype(jnp.float32))

  def loss_fn(p):
    logits = features @ p['w'] + p['b']
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, labels).mean(), logits

  (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      probe_params)
  updates, probe_opt_state = probe.tx.update(grads, probe_opt_state)
  metrics = {'online/linear_acc': jnp.mean(jnp.argmax(logits, -1) == labels),
             'online/linear_loss': loss}
  return optax.apply_updates(probe_params, updates), probe_opt_state, metrics


def create_train_state(rng, *, model, tx, image_shape,
                       method: methods.base.Method,
                       probe: OnlineProbe | None = None) -> TrainState:
  """The initial state: the model's, the method's and the monitor's."""
  init_rng, queue_rng, bank_rng = jax.random.split(rng, 3)
  dummy = jnp.zeros((2,) + tuple(image_shape))
  variables = model.init(init_rng, dummy, train=False)
  params = variables['params']
  out = jax.eval_shape(lambda: model.apply(variables, dummy, train=False))
  state = TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      batch_stats=variables.get('batch_stats', {}), opt_state=tx.init(params),
      method_state=method.init({'queue': queue_rng, 'bank': bank_rng},
                               variables,
                               out_dim=out[method.embedding].shape[-1]))
  if probe is not None:
    w = {'w': jnp.zeros((out['features'].shape[-1], probe.num_classes)),
         'b': jnp.zeros((probe.num_classes,))}
    state = state.replace(probe_params=w, probe_opt_state=probe.tx.init(w))
  return state


def state_shardings(abstract_state: TrainState, method: methods.base.Method,
                    mesh) -> TrainState:
  """Replicated everywhere except where the method says (queue, bank rows)."""
  replicated = NamedSharding(mesh, P())
  shardings = jax.tree.map(lambda _: replicated, abstract_state)
  return shardings.replace(method_state=method.shardings(
      abstract_state.method_state, mesh))


def train_step(state: TrainState, batch: dict[str, Any], rng: jax.Array, *,
               model, tx, method: methods.base.Method, loss: Loss,
               probe: OnlineProbe | None = None,
               mesh=None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimisation step. Pure: jit it with the state donated.

  Args:
    state: the current TrainState.
    batch: {'views': view groups (see methods/base.py), each [B, V_g, H_g,
      W_g, C] float, 'label': [B] int32, 'index': [B] int32 example ids}.
    rng: a base PRNG key; the step's randomness is fold_in(rng, step).
    model: the (method-wrapped) ContrastiveModel.
    tx: the optax optimizer.
    method: how the batch becomes the loss's inputs (contrastive_jax/methods).
    loss: the configured loss.
    probe: the online linear monitor, or None.
    mesh: the mesh (for the methods' sharded state and shard_maps).

  Returns:
    (new_state, metrics) with `loss`, `grad_norm`, the loss's metrics, the
    method's (e.g. `momentum`) and the scheduled hyperparameters' values.
  """
  rng = jax.random.fold_in(rng, state.step)
  # 1. The method's inputs computed without gradient (keys, negatives).
  prepared = method.prepare(state, batch, rng, model=model, mesh=mesh)
  scheduled = {k: fn(state.step) for k, fn in loss.schedules.items()}

  # 2. The online forward and the loss, differentiated.
  def objective(params):
    z, features, batch_stats = methods.base.forward(
        model, {'params': params, 'batch_stats': state.batch_stats},
        prepared.views, embedding=method.embedding)
    value, metrics = losses.apply(loss.name, prepared.inputs.replace(z=z),
                                  **loss.kwargs, **scheduled)
    return value, (metrics, batch_stats, z, features)

  (value, (metrics, batch_stats, z, features)), grads = jax.value_and_grad(
      objective, has_aux=True)(state.params)
  # 3. The optimiser.
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new = dict(step=state.step + 1, params=optax.apply_updates(state.params,
                                                             updates),
             batch_stats=batch_stats, opt_state=opt_state,
             # 4. The method's state after the step (enqueue, bank write).
             method_state=method.update(prepared, z, batch))
  metrics = dict(metrics, **prepared.metrics, **scheduled, loss=value,
                 grad_norm=optax.global_norm(grads),
                 **alignment_uniformity(z, prepared.inputs.key))
  if probe is not None:
    new['probe_params'], new['probe_opt_state'], probe_metrics = (
        online_probe_step(state.probe_params, state.probe_opt_state,
                          features, batch['label'], probe=probe))
    metrics.update(probe_metrics)
  metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
  return state.replace(**new), metrics


def alignment_uniformity(z: jax.Array, key: jax.Array | None
                         ) -> dict[str, jax.Array]:
  """Wang & Isola (2020)'s monitors of the batch's embeddings, lower better.

  `uniformity` of view 0 over the batch; `alignment` of view 0 with its
  positive: view 1, or with one view, the key (MoCo's key encoder, InsDis's
  bank row). z: [B, V, D]; key: [B, Vk, D] or None. Monitoring only: `z` is
  the differentiated output's value, so nothing here reaches a gradient.
  """
  # The barrier keeps XLA from merging these ops with the loss's own (e.g.
  # one shared normalisation of z), which would reorder the loss's float
  # arithmetic: with it, the step's numbers are those of a step without
  # monitors, bit for bit (checked on configs/default.py).
  z, key = jax.lax.optimization_barrier((z, key))
  out = {'uniformity': diagnostics.uniformity(z[:, 0])}
  partner = z[:, 1] if z.shape[1] > 1 else None if key is None else key[:, 0]
  if partner is not None:
    out['alignment'] = diagnostics.alignment(z[:, 0], partner)
  return out


def create_model(config):
  """The configured model, as the configured method wraps it (e.g. with a
  predictor), so checkpoints restore into the same parameter tree."""
  return methods.get(config.method).wrap_model(config,
                                               models.create_model(config))


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything `build` makes: the jitted step and what it closes over.

  `init_fn(rng) -> state`; `step_fn(state, batch, rng) -> (state, metrics)`,
  the state donated; the batch is sharded along 'data', the state as
  `shardings` says. `learning_rate(step)` is the rate `tx` applies at `step`.
  """
  model: Any
  tx: optax.GradientTransformation
  learning_rate: optax.Schedule
  method: methods.base.Method
  loss: Loss
  probe: OnlineProbe | None
  init_fn: Any
  step_fn: Any
  shardings: TrainState


def build(config, mesh, *, total_steps: int, steps_per_epoch: int,
          num_examples: int, image_shape, num_classes: int = 0) -> Setup:
  """The model, optimizer, method, loss and jitted step of `config`.

  The one place a run's pieces are made: the training job, eval_checkpoint,
  the benchmarks and the tests all build through it.
  """
  ctx = methods.base.Context(
      total_steps=total_steps, steps_per_epoch=steps_per_epoch,
      num_examples=num_examples, num_devices=mesh.size,
      num_epochs=float(config.num_epochs))
  method = methods.get(config.method).from_config(config, ctx)
  model = create_model(config)
  learning_rate = learning_rate_schedule(config, total_steps)
  tx = create_optimizer(config, learning_rate)
  loss = Loss.from_config(config, method, ctx)
  probe = (OnlineProbe(num_classes, float(config.online.probe_learning_rate))
           if config.online.linear_probe and num_classes > 1 else None)
  init = functools.partial(create_train_state, model=model, tx=tx,
                           image_shape=tuple(image_shape), method=method,
                           probe=probe)
  shardings = state_shardings(jax.eval_shape(init, jax.random.key(0)),
                              method, mesh)
  replicated = NamedSharding(mesh, P())
  data = NamedSharding(mesh, P('data'))
  step_fn = jax.jit(
      functools.partial(train_step, model=model, tx=tx, method=method,
                        loss=loss, probe=probe, mesh=mesh),
      in_shardings=(shardings, {'views': data, 'label': data, 'index': data},
                    replicated),
      out_shardings=(shardings, replicated), donate_argnums=(0,))
  return Setup(model=model, tx=tx,
               learning_rate=learning_rate,
               method=method, loss=loss, probe=probe,
               init_fn=jax.jit(init, out_shardings=shardings),
               step_fn=step_fn, shardings=shardings)


def _check_workdir(config, workdir: str) -> None:
  """Refuses a workdir that holds a run of a different config."""
  path = os.path.join(workdir, 'config.json')
  current = json.loads(config.to_json_best_effort(sort_keys=True))
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    flat_prev, flat_cur = _flatten(previous), _flatten(current)
    # Options added to the code since the run started are absent from its
    # config.json; new options default to the old behaviour, so they are
    # accepted (and said), not taken for a different config.
    added = sorted(set(flat_cur) - set(flat_prev))
    if added:
      logging.info('%s predates the options %s; resuming with their current '
                   'values.', path, ', '.join(
                       f'{k}={flat_cur[k]!r}' for k in added))
    diff = ', '.join(
        f'{k}: {flat_prev.get(k)!r} -> {flat_cur.get(k)!r}'
        for k in sorted(flat_prev) if flat_prev.get(k) != flat_cur.get(k))
    if diff:
      raise ValueError(
          f'workdir {workdir!r} holds a run of a different config ({diff}). '
          'Use a new --workdir, or delete '
          'this one to start over; nothing was changed.')
    return
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    _write_json(path, current)


def _flatten(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


def validate_config(config, num_devices: int | None = None) -> None:
  """Checks everything that can be checked before data or compilation."""
  method = methods.get(config.method)   # First: it may register its loss.
  losses.get_loss(config.loss)
  v = config.augment.num_views
  augment.build_views(config.augment.preset, v, config.augment.overrides)
  n = jax.device_count() if num_devices is None else num_devices
  b = config.batch_size
  if b % n:
    raise ValueError(f'config.batch_size={b} is not divisible '
                     f'by the {n} devices; use a multiple of {n}.')
  if config.eval.batch_size % n:
    raise ValueError(f'config.eval.batch_size={config.eval.batch_size} is not '
                     f'divisible by the {n} devices; use a multiple of {n}.')
  method.validate(config, n)
  for name, kind in dict(config.loss_schedules).items():
    if name not in methods.base.loss_parameters(config.loss):
      raise ValueError(f'config.loss_schedules.{name}: {config.loss!r} has no '
                       f'keyword argument {name!r}.')
    schedules.build(kind, 0., total_steps=1, steps_per_epoch=1, num_epochs=1,
                    name=f'config.loss_schedules.{name}')
  if config.optimizer.schedule not in ('cosine', 'step'):
    raise ValueError(f'config.optimizer.schedule='
                     f'{config.optimizer.schedule!r}; known: cosine, step.')
  ev = config.eval
  if ev.linear_eval:
    cfg = linear_eval.get_config(ev.linear_eval,
                                 batch_size=ev.linear_eval_batch_size)
    if cfg.batch_size % n:
      raise ValueError(f'the {ev.linear_eval!r} linear evaluation batch '
                       f'{cfg.batch_size} is not divisible by the {n} '
                       'devices; set config.eval.linear_eval_batch_size to a '
                       f'multiple of {n}.')
  ds = config.dataset
  if not isinstance(ds.validation_size, int) or ds.validation_size < 0:
    raise ValueError(f'config.dataset.validation_size={ds.validation_size!r} '
                     'must be an int >= 0 (0: no validation holdout).')
  if config.eval.split not in ('test', 'validation'):
    raise ValueError(f'config.eval.split={config.eval.split!r} must be '
                     '"test" or "validation".')
  if config.eval.split == 'validation' and not ds.validation_size:
    raise ValueError('config.eval.split="validation" scores the holdout; set '
                     'config.dataset.validation_size > 0 (e.g. 10000).')
  if ds.imbalance not in ('none', 'linear', 'exponential'):
    raise ValueError(f'config.dataset.imbalance={ds.imbalance!r}; known: '
                     'none, linear, exponential.')
  if ds.imbalance_levels < 0:
    raise ValueError(f'config.dataset.imbalance_levels={ds.imbalance_levels} '
                     'must be >= 0 (0: min(num_classes, 10)).')
  if (ds.validation_size or ds.imbalance != 'none') and not ds.in_memory:
    raise ValueError('config.dataset.validation_size and .imbalance need '
                     'config.dataset.in_memory=True.')
  if not 0 <= ds.max_bad_fraction <= 1:
    raise ValueError(f'config.dataset.max_bad_fraction={ds.max_bad_fraction} '
                     'must be in [0, 1] (0: stop at the first bad record).')


def check_data_sizes(config, num_train: int) -> None:
  """What needs the training-set size, checked before any training."""
  ks = tuple(config.eval.knn_ks)
  if max(ks) > num_train:
    raise ValueError(f'config.eval.knn_ks={ks} asks for more neighbours than '
                     f'the {num_train} training examples (the kNN bank); '
                     f'use values <= {num_train}.')
  if config.optimizer.schedule not in ('cosine', 'step'):
    raise ValueError(f'config.optimizer.schedule='
                     f'{config.optimizer.schedule!r}; known: cosine, step.')
  ev = config.eval
  if ev.linear_eval:
    batch = min(linear_eval.get_config(
        ev.linear_eval, batch_size=ev.linear_eval_batch_size).batch_size,
                num_train)
    if batch % jax.device_count():
      raise ValueError(
          f'the linear evaluation batch would be {batch} (the training '
          f'set\'s size), not divisible by the {jax.device_count()} devices; '
          'set config.eval.linear_eval_batch_size to a multiple of them below '
          f'{num_train}.')


def load_data(config, classes=None):
  """(train, eval) sources of `config.dataset` (input_pipeline/sources.py).

  With `config.dataset.in_memory` each process holds the split in memory (an
  optimisation for small datasets); otherwise every read goes to the files.
  The training split becomes the training data after
  `config.dataset.validation_size` (a fixed stratified holdout) and
  `config.dataset.imbalance` (CACR's subsets), see input_pipeline/splits.py.
  The eval source is the test split (`config.dataset.eval_split`), or the
  holdout when `config.eval.split == 'validation'`.

  `classes` is a run's stored class list (`load_classes`): an image folder's
  ids follow it, not the folder's current contents. Before returning, the
  splits are checked: the same on every process, no more undecodable records
  than `config.dataset.max_bad_fraction` (all of them decoded first with
  `config.dataset.verify`), and any difference in their classes logged.
  """
  from input_pipeline import splits  # pylint: disable=g-import-not-at-top
  ds = config.dataset
  if ds.name == 'image_folder' and classes is None and ds.data_dir:
    classes = sources.folder_classes(ds.data_dir)   # One list, both splits.
  train_name = f'training split {ds.train_split!r}'
  eval_name = (f'evaluation split {ds.eval_split!r}'
               if config.eval.split == 'test' else 'validation holdout')
  opened = {train_name: sources.open_split(ds, ds.train_split, classes)}
  if config.eval.split == 'test':
    opened[eval_name] = sources.open_split(ds, ds.eval_split, classes)
  for what, source in opened.items():
    pipeline.check_same_on_every_process(what, sources.fingerprint(source))
    if ds.get('verify', False) and not ds.in_memory:
      logging.info('Decoding every record of the %s (config.dataset.verify).',
                   what)
      pipeline.scan(source)
  count_skipped(config, opened)
  train, validation = splits.prepare_train(opened[train_name], ds)
  evaluation = opened.get(eval_name, validation)
  for message in sources.class_warnings(train, evaluation,
                                        train_name=train_name,
                                        eval_name=eval_name):
    logging.warning('Classes: %s', message)
  return train, evaluation


def count_skipped(config, named: dict[str, Any]) -> dict[str, Any]:
  """The undecodable records found so far in each named split, agreed by
  every process (a collective: call it on all at the same point).

  Raises when a split has more than `config.dataset.max_bad_fraction` of
  them. Returns results.json's entries: 'data/skipped_records' (all splits)
  and 'data/skipped_files' (the first 100, sorted).
  """
  fraction = config.dataset.get('max_bad_fraction', 0.01)
  found = []
  for what, source in named.items():
    skipped = pipeline.sync_skipped(source)
    sources.check_skipped(what, skipped, len(source), fraction)
    found += skipped.values()
  return {'data/skipped_records': len(found),
          'data/skipped_files': sorted(found)[:100]}


def load_classes(workdir: str) -> tuple[str, ...] | None:
  """The class list a run stored in `<workdir>/classes.json`, if any."""
  path = os.path.join(workdir, 'classes.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return tuple(json.load(f)['classes'])


def _store_classes(workdir: str, stored, classes) -> None:
  """Writes the run's class list once; refuses data with another one."""
  if classes is None:
    return
  if stored is None:
    if jax.process_index() == 0:
      _write_json(os.path.join(workdir, 'classes.json'),
                  {'classes': list(classes)})
  elif tuple(stored) != tuple(classes):
    raise ValueError(
        f'workdir {workdir!r} holds a run with the classes {list(stored)} '
        f'(classes.json); the data has {list(classes)}. Use a new --workdir.')


class Preempted(Exception):
  """SIGTERM (a pod preemption) was received; a checkpoint was saved."""


def _preemption_check():
  """A function step -> bool: True once this job must save and stop.

  Multi-process: JAX's preemption sync manager catches SIGTERM on any host and
  agrees on one step for every process (`reached_preemption_sync_point`), so
  all of them save the same step. Single process: our own SIGTERM handler.
  """
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1:
    return multihost_utils.reached_preemption_sync_point
  received = []
  signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
  return lambda step: bool(received)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       data=None) -> dict[str, Any]:
  """Pretrains, evaluates and writes `workdir/results.json`.

  Args:
    config: an experiment config (see configs/default.py).
    workdir: where checkpoints, TensorBoard events, plots and results go.
    data: (train, eval) sources (e.g. `pipeline.ArrayDataset`s) to use instead
      of opening `config.dataset` (tests inject synthetic data this way).

  Returns:
    The results dict written to results.json.

  Raises:
    Preempted: SIGTERM arrived; the checkpoint of the step reached is saved.
    FloatingPointError: a non-finite metric; earlier checkpoints are kept.
    ValueError: a bad config or data, e.g. more undecodable records than
      config.dataset.max_bad_fraction (at load, at a log step or after the
      evaluation; docs/input_pipeline.md).
  """
  validate_config(config)
  _check_workdir(config, workdir)
  stored_classes = load_classes(workdir)
  train_data, test_data = data if data is not None else load_data(
      config, stored_classes)
  _store_classes(workdir, stored_classes, train_data.classes)
  check_data_sizes(config, len(train_data))
  logging.info('Data: %d training and %d evaluation examples of shape %s; '
               'compiling the step.', len(train_data), len(test_data),
               tuple(train_data.image_shape))

  mesh = create_mesh()
  data_sharding = NamedSharding(mesh, P('data'))
  replicated = NamedSharding(mesh, P())
  batches = pipeline.TrainBatches(train_data,
                                  global_batch_size=config.batch_size,
                                  seed=config.seed, sharding=data_sharding,
                                  num_workers=config.dataset.num_workers)
  total_steps = max(1, int(config.num_epochs * batches.steps_per_epoch))
  setup = build(config, mesh, total_steps=total_steps,
                steps_per_epoch=batches.steps_per_epoch,
                num_examples=len(train_data),
                image_shape=train_data.image_shape,
                num_classes=train_data.num_classes)
  views_cfg = augment.build_views(config.augment.preset,
                                  config.augment.num_views,
                                  config.augment.overrides)

  rng = jax.random.key(config.seed)
  init_rng, aug_rng, step_rng = jax.random.split(rng, 3)
  feature_fn = evaluate.make_feature_fn(setup.model, mesh)
  state = setup.init_fn(init_rng)

  manager = checkpointing.create_manager(workdir)
  restored, restored_step = checkpointing.restore_latest(manager, state)
  if restored is not None:
    state = restored
    logging.info('Resumed from the checkpoint at step %d.', restored_step)

  # Per-step randomness is fold_in(key, step), so a resumed run draws the same
  # views as an uninterrupted one.
  # Views come as groups of equal size (one group unless multi-crop).
  augment_fn = jax.jit(
      lambda step, images: augment.augment_groups(
          jax.random.fold_in(aug_rng, step), images, views_cfg),
      in_shardings=(replicated, data_sharding), out_shardings=data_sharding)

  # TensorBoard events from process 0 only.
  writer = event_writer.EventWriter(workdir if jax.process_index() == 0
                                    else None)
  start = int(state.step)
  # Entries past the restored step belong to steps that will be redone.
  history = [h for h in _load_history(workdir) if h['step'] <= start]
  preempted = _preemption_check()
  splits_read = {'training data': train_data, 'evaluation data': test_data}
  # A log line every log_every_steps; under a progress bar (a terminal), the
  # bar shows every step, so a lasting line only every ~10% of the run.
  line_every = config.log_every_steps
  if progress.enabled():
    line_every *= max(1, total_steps // 10 // config.log_every_steps)
  t0, last_logged, last_time, timed_from = time.time(), start, time.time(), start
  try:
    with progress.bar(total_steps, 'pretraining', initial=start) as bar:
      for step, batch in zip(range(start, total_steps),
                             batches.iterate(start, total_steps)):
        views = augment_fn(step, batch['image'])
        state, metrics = setup.step_fn(
            state, {'views': views, 'label': batch['label'],
                    'index': batch['index']}, step_rng)
        done = step + 1
        bar.update(1)
        if step == start:
          # The first step compiles: time from its end, so images/s and the
          # ETA are the steady state's, not diluted by compilation.
          jax.block_until_ready(metrics)
          t0 = last_time = time.time()
          last_logged = timed_from = done
          bar.restart_clock()
        if done % config.log_every_steps == 0 or done == total_steps:
          metrics = jax.device_get(metrics)  # Replicated: every process has it.
          for name, value in metrics.items():
            if not np.isfinite(value):
              raise FloatingPointError(
                  f'{name} is {value} at step {done}; stopping. The last good '
                  f'checkpoint in {workdir}/checkpoints is kept.')
          now = time.time()
          scalars = {k: float(v) for k, v in metrics.items()}
          scalars['learning_rate'] = float(setup.learning_rate(step))
          speed = eta = ''
          if done > timed_from:     # Not the compiling first step alone.
            scalars['images_per_sec'] = ((done - last_logged) *
                                         config.batch_size / (now - last_time))
            speed = f'  {scalars["images_per_sec"]:.0f} img/s'
            eta = '  ETA ' + _fmt_time((total_steps - done) * (now - t0) /
                                       (done - timed_from))
          # Stops a streamed run once too many bad records have turned up.
          count_skipped(config, splits_read)
          writer.write_scalars(done, scalars)
          history.append({'step': done, **scalars})
          bar.set_postfix_str(f'loss {scalars["loss"]:.4f}{speed}')
          if done % line_every == 0 or done == total_steps:
            logging.info('step %d/%d  loss %.4f%s%s', done, total_steps,
                         scalars['loss'], speed, eta)
          last_logged, last_time = done, now
        every = config.online.knn_every_steps
        if every and (done % every == 0 or done == total_steps):
          online = evaluate.online_knn(config, feature_fn, state, train_data,
                                       test_data, mesh)
          writer.write_scalars(done, online)
          if history and history[-1]['step'] == done:
            history[-1].update(online)
          else:
            history.append({'step': done, **online})
          logging.info('step %d  %s', done, ', '.join(
              f'{k} {v:.4f}' for k, v in online.items()))
        stop = preempted(done)
        if (stop or done % config.checkpoint_every_steps == 0 or
            done == total_steps):
          checkpointing.save(manager, done, state)
          _save_history(workdir, history)
        if stop:
          raise Preempted(
              f'preempted (SIGTERM) at step {done}: its checkpoint is saved '
              f'in {workdir}/checkpoints; rerun the same command to resume.')
  finally:
    # Let in-flight asynchronous saves finish (or fail) before any error
    # propagates, so the error is the last thing printed and no half-written
    # checkpoint directory is left behind.
    manager.wait_until_finished()
    manager.close()
  train_seconds = time.time() - t0

  results, embeddings = evaluate.evaluate_all(
      # The donated initial state is gone; init is deterministic, so redo it.
      config, feature_fn, {'trained': state, 'random_init': setup.init_fn(init_rng)},
      train_data, test_data, mesh)
  if config.eval.linear_eval:
    # The papers' protocol, trained encoder only (epochs of encoder forwards).
    results.update(evaluate.papers_linear_eval(
        config, setup.model, evaluate.variables_of(state), train_data,
        test_data, mesh))
  # Evaluation has read every record of both splits: the full count.
  results.update(count_skipped(config, splits_read))
  if results['data/skipped_records']:
    logging.warning('%d undecodable records were replaced by black images in '
                    'training and left out of evaluation: %s',
                    results['data/skipped_records'],
                    ', '.join(results['data/skipped_files']))
  results.update(steps=total_steps, train_seconds=round(train_seconds, 1),
                 resumed_from_step=restored_step)
  logged = [h for h in history if 'loss' in h]
  if logged:
    results['final_loss'] = logged[-1]['loss']
    speeds = [h['images_per_sec'] for h in logged if 'images_per_sec' in h]
    if speeds:
      results['images_per_sec'] = float(np.median(speeds))
  for h in reversed(history):   # The last online monitor values, labelled.
    for k, v in h.items():
      if k.startswith('online/'):
        results.setdefault(k, v)
  writer.write_scalars(total_steps, {k: v for k, v in results.items()
                                     if isinstance(v, float)})
  writer.close()
  if jax.process_index() == 0:
    _write_json(os.path.join(workdir, 'results.json'), results)
    t_plot = time.time()
    evaluate.plot_run(history, results, embeddings,
                      os.path.join(workdir, 'summary.png'))
    logging.info('Wrote summary.png (%.0f s, mostly t-SNE).',
                 time.time() - t_plot)
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
