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
from clu import metric_writers
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import checkpointing
from contrastive_jax import evaluate
from contrastive_jax import losses
from contrastive_jax import models
from contrastive_jax import runtime
from contrastive_jax import state as state_lib
from input_pipeline import augment
from input_pipeline import pipeline
from input_pipeline import sources


TrainState = state_lib.TrainState


create_mesh = runtime.create_mesh


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


# --------------------------------------------------------------------------
# The method layer: how a batch becomes the loss's inputs.
# --------------------------------------------------------------------------

METHODS = ('in_batch', 'moco', 'memory_bank')
# Losses each method can feed (the others need inputs the method lacks).
_METHOD_LOSSES = {
    'in_batch': ('ntxent', 'supcon', 'tcl', 'cacr', 'macl', 'dcl',
                 'align_uniform', 'hard_negative', 'cmc'),
    'moco': ('infonce', 'jcl', 'cacr'),
    'memory_bank': ('insdis', 'cmc'),
}
_SUPERVISED_LOSSES = ('supcon', 'tcl')


@dataclasses.dataclass(frozen=True)
class Method:
  """Static (compile-time) settings of the method, derived from the config.

  `name` selects how `train_step` turns a batch into loss inputs:
    * 'in_batch': z [B, V, D] from all V views through the online encoder
      (SimCLR, SupCon/TCL with `use_labels`, CACR in-batch, MACL, DCL, AU-CL,
      HN-CL, CMC without a bank);
    * 'moco': query = online encoder on `query_views`, key = EMA encoder on
      `key_views` (under stop_gradient), negatives from the queue if
      `queue_size` > 0 (MoCo v2, MoCo v3-style symmetric, CACR-MoCo, JCL);
    * 'memory_bank': z from all views; positives = the bank rows of the
      batch's `index`, negatives = `num_negatives` uniformly sampled rows;
      the bank is updated with momentum after the step (InsDis, CMC).
  """
  name: str
  loss: str
  use_labels: bool
  total_steps: int
  steps_per_epoch: int
  num_epochs: float
  # moco
  momentum: float
  momentum_schedule: str
  query_views: tuple[int, ...]
  key_views: tuple[int, ...]
  queue_size: int
  shuffle_bn: bool
  lambda_ramp: bool
  lam: float
  # memory_bank
  num_examples: int
  bank_momentum: float
  num_negatives: int
  # Online linear monitor (0 classes: off).
  probe_classes: int = 0
  probe_learning_rate: float = 1e-3

  @classmethod
  def from_config(cls, config, *, total_steps: int, steps_per_epoch: int,
                  num_examples: int, num_classes: int = 0) -> 'Method':
    mc, mb = config.moco, config.memory_bank
    probe = config.online.linear_probe and num_classes > 1
    return cls(
        name=config.method, loss=config.loss,
        use_labels=bool(config.use_labels), total_steps=total_steps,
        steps_per_epoch=steps_per_epoch, num_epochs=float(config.num_epochs),
        momentum=float(mc.momentum), momentum_schedule=mc.momentum_schedule,
        query_views=tuple(mc.query_views), key_views=tuple(mc.key_views),
        queue_size=int(mc.queue_size), shuffle_bn=bool(mc.shuffle_bn),
        lambda_ramp=bool(mc.lambda_ramp),
        # One source for JCL's default lambda: the jcl loss's own signature
        # (a missing `lam` used to mean 0 here but 4.0 in the loss). Looked
        # up rather than copied so that the two can never drift apart again.
        lam=float(config.loss_kwargs.get('lam', losses.default_kwarg(
            'jcl', 'lam')) if config.loss == 'jcl' else 0.),
        num_examples=num_examples, bank_momentum=float(mb.momentum),
        num_negatives=int(mb.num_negatives),
        probe_classes=num_classes if probe else 0,
        probe_learning_rate=float(config.online.probe_learning_rate))

  @property
  def has_key_encoder(self) -> bool:
    return self.name == 'moco'

  def lam_at(self, step: jax.Array) -> jax.Array:
    """JCL's ramp, lambda_t = lambda_max (epoch + 1) / num_epochs (traced)."""
    if not self.lambda_ramp:
      return jnp.asarray(self.lam, jnp.float32)
    epoch = (step // self.steps_per_epoch).astype(jnp.float32)
    epochs = float(max(math.ceil(self.num_epochs), 1))
    return self.lam * jnp.minimum((epoch + 1.) / epochs, 1.)


def _probe_tx(method: Method) -> optax.GradientTransformation:
  return optax.adam(method.probe_learning_rate)


def online_probe_step(probe_params, probe_opt_state, features, labels, *,
                      method: Method):
  """One step of the online linear monitor on frozen features.

  Args:
    probe_params: {'w': [F, C], 'b': [C]}.
    probe_opt_state: its Adam state.
    features: [B, F] backbone features of the batch (one view).
    labels: [B] int class ids.
    method: for the learning rate.

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
  updates, probe_opt_state = _probe_tx(method).update(grads, probe_opt_state)
  metrics = {'online/linear_acc': jnp.mean(jnp.argmax(logits, -1) == labels),
             'online/linear_loss': loss}
  return optax.apply_updates(probe_params, updates), probe_opt_state, metrics


def bank_rows(num_examples: int, num_devices: int) -> int:
  """Bank rows: the data size rounded up so the bank shards evenly."""
  return -(-num_examples // num_devices) * num_devices


def create_train_state(rng, *, model, tx, image_shape, method: Method,
                       num_devices: int) -> TrainState:
  """The initial state; the key encoder starts as a copy of the online one."""
  init_rng, queue_rng, bank_rng = jax.random.split(rng, 3)
  variables = model.init(init_rng, jnp.zeros((2,) + tuple(image_shape)),
                         train=False)
  params = variables['params']
  batch_stats = variables.get('batch_stats', {})
  out_dim = model.head.out_dim
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     batch_stats=batch_stats, opt_state=tx.init(params))
  if method.has_key_encoder:
    state = state.replace(key_params=jax.tree.map(jnp.copy, params),
                          key_batch_stats=jax.tree.map(jnp.copy, batch_stats))
    if method.queue_size:
      state = state.replace(
          queue=state_lib.init_queue(queue_rng, method.queue_size, out_dim),
          queue_ptr=jnp.zeros((), jnp.int32))
  if method.name == 'memory_bank':
    state = state.replace(bank=state_lib.init_bank(
        bank_rng, bank_rows(method.num_examples, num_devices), out_dim))
  if method.probe_classes:
    feature_dim = model.apply(variables, jnp.zeros((1,) + tuple(image_shape)),
                              train=False)['features'].shape[-1]
    probe = {'w': jnp.zeros((feature_dim, method.probe_classes)),
             'b': jnp.zeros((method.probe_classes,))}
    state = state.replace(probe_params=probe,
                          probe_opt_state=_probe_tx(method).init(probe))
  return state


def state_shardings(abstract_state: TrainState, mesh) -> TrainState:
  """Replicated everywhere except the queue and the bank, sharded by rows.

  The step keeps the queue sharded: its logits are computed where its rows
  live and its write is a per-device scatter (`train_step`, `state.enqueue`),
  so no device ever holds the whole [Q, D] queue.
  """
  replicated = NamedSharding(mesh, P())
  rows = NamedSharding(mesh, P('data', None))
  shardings = jax.tree.map(lambda _: replicated, abstract_state)
  return shardings.replace(
      queue=None if abstract_state.queue is None else rows,
      bank=None if abstract_state.bank is None else rows)


def _forward(model, variables, views):
  """[B, V, ...] views -> (z [B, V, D], features [B, V, F], new batch_stats).

  All views go through the encoder as one batch, so BatchNorm statistics are
  shared across views (and, under jit, across devices: global BN).
  """
  b, v = views.shape[:2]
  out, new_vars = model.apply(variables, views.reshape((b * v,) +
                                                       views.shape[2:]),
                              train=True, mutable=['batch_stats'])
  return (out['projection'].reshape(b, v, -1),
          out['features'].reshape(b, v, -1), new_vars['batch_stats'])


def _key_forward(model, variables, views, rng, *, shuffle_bn: bool, mesh):
  """The key encoder's embeddings [B, Vk, D] and its new BN statistics.

  Global BN (default): one forward under jit, statistics over the whole key
  batch. Shuffle-BN (MoCo): the B * Vk key images are permuted across the
  global batch, each device normalises its own shard with per-device BN
  (`jax.shard_map`), and the inverse permutation restores the order; the
  running statistics are averaged over devices. Per-device BN on a shuffled
  batch keeps a query and its key from sharing BN statistics, which MoCo found
  otherwise leaks the positive.
  """
  if not shuffle_bn:
    z, _, bs = _forward(model, variables, views)
    return z, bs
  b, v = views.shape[:2]
  flat = views.reshape((b * v,) + views.shape[2:])
  perm = jax.random.permutation(rng, b * v)

  def per_device(variables, x):
    out, new_vars = model.apply(variables, x, train=True,
                                mutable=['batch_stats'])
    return out['projection'], jax.lax.pmean(new_vars['batch_stats'], 'data')

  z, bs = jax.shard_map(per_device, mesh=mesh,
                        in_specs=(P(), P('data')),
                        out_specs=(P('data'), P()))(variables, flat[perm])
  z = z[jnp.argsort(perm)]
  return z.reshape(b, v, -1), bs


def train_step(state: TrainState, batch: dict[str, jax.Array],
               rng: jax.Array, *, model, tx, loss_fn, method: Method,
               mesh=None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimisation step. Pure: jit it with the state donated.

  Args:
    state: the current TrainState.
    batch: {'views': [B, V, H, W, C] float, 'label': [B] int32,
      'index': [B] int32 example ids}.
    rng: a base PRNG key; the step's randomness is fold_in(rng, step).
    model: a ContrastiveModel.
    tx: the optax optimizer.
    loss_fn: the configured loss with its hyperparameters bound.
    method: the static method settings (see `Method`).
    mesh: the mesh (needed only for shuffle-BN's shard_map).

  Returns:
    (new_state, metrics) with `loss`, `grad_norm` and the loss's metrics.
  """
  rng = jax.random.fold_in(rng, state.step)
  views, labels, index = batch['views'], batch['label'], batch['index']
  extra_metrics = {}
  new = {}

  if method.name == 'moco':
    m = state_lib.momentum_schedule(
        state.step, base=method.momentum, total_steps=method.total_steps,
        schedule=method.momentum_schedule)
    # MoCo order: update the key encoder from the current online weights,
    # then compute the keys with it.
    key_params = state_lib.ema_update(state.key_params, state.params, m)
    key_z, key_bs = _key_forward(
        model, {'params': key_params, 'batch_stats': state.key_batch_stats},
        views[:, list(method.key_views)], rng, shuffle_bn=method.shuffle_bn,
        mesh=mesh)
    # Keys are targets: the key encoder is an EMA, never trained, and the loss
    # must not push gradients into it (MoCo computes k under no_grad).
    key_z = jax.lax.stop_gradient(key_z)
    new.update(key_params=key_params, key_batch_stats=key_bs)
    extra_metrics['momentum'] = m
    query_views = views[:, list(method.query_views)]
  else:
    query_views = views
  queue = state.queue
  if queue is not None and mesh is not None:
    # The queue's rows stay on their devices: the loss's [B, Q] queue logits
    # are formed per device as [B, Q / devices] from the all-gathered [B, D]
    # queries, and the log-sum-exp over Q is combined with [B]-sized
    # all-reduces (max, sum), as is the gradient to the queries. XLA's
    # partitioner does this itself once the queue's row sharding is fixed
    # here, so the losses stay mesh-agnostic and the 1-device path (mesh of
    # 1, or no mesh in a notebook) is the same code. (The enqueue below is
    # a scatter for the same reason: see `state.enqueue`.)
    # tests/test_queue_sharding.py checks that the compiled step never
    # all-gathers the [Q, D] queue.
    queue = jax.lax.with_sharding_constraint(
        queue, NamedSharding(mesh, P('data', None)))

  if method.name == 'memory_bank':
    # InsDis draws its noise rows per instance, [B, K] (lemniscate's
    # NCEAverage: idx = multinomial.draw(B * (K + 1)).view(B, -1)). Each
    # device draws K / devices of them from the data rows of its own bank
    # shard and reads them there, so the row-sharded bank is never gathered
    # and the [B, K, D] rows stay sharded along K (see
    # `state.sample_bank_noise` for why stratified draws are still NCE's
    # uniform noise). CMC's bank sample is one [K] set shared by the batch,
    # which XLA reads as a masked local gather plus an all-reduce of the
    # [K, D] rows, never a gather of the bank. tests/test_queue_sharding.py
    # checks both compiled steps; tests/test_bank_sharding.py the draws.
    if method.loss == 'insdis':
      negatives = state_lib.sample_bank_noise(
          state.bank, rng, batch=index.shape[0],
          num_negatives=method.num_negatives,
          num_examples=method.num_examples, mesh=mesh)     # [B, K, D]
    else:
      neg_idx = jax.random.randint(rng, (method.num_negatives,), 0,
                                   method.num_examples)
      negatives = state.bank[neg_idx]                      # [K, D]
    # Bank rows are records of past features, not functions of the params.
    negatives = jax.lax.stop_gradient(negatives)
    positives = jax.lax.stop_gradient(state.bank[index])[:, None]

  def objective(params):
    z, features, batch_stats = _forward(
        model, {'params': params, 'batch_stats': state.batch_stats},
        query_views)
    if method.name == 'in_batch':
      loss, metrics = (loss_fn(z, labels) if method.use_labels
                       else loss_fn(z))
    elif method.name == 'moco':
      if method.loss == 'cacr':
        loss, metrics = loss_fn(z, key=key_z, queue=queue)
      elif method.loss == 'jcl':
        loss, metrics = loss_fn(z, key_z, queue=queue,
                                lam=method.lam_at(state.step))
      else:
        loss, metrics = loss_fn(z, key_z, queue=queue)
    else:  # memory_bank
      if method.loss == 'insdis':
        loss, metrics = loss_fn(z, positives, queue=negatives,
                                num_data=method.num_examples)
      else:
        loss, metrics = loss_fn(z, queue=negatives)
    return loss, (metrics, batch_stats, z, features)

  (loss, (metrics, batch_stats, z, features)), grads = jax.value_and_grad(
      objective, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)

  if state.queue is not None:
    if method.loss == 'jcl':
      # JCL enqueues the mean of the normalised keys, not re-normalised.
      keys = losses.l2_normalize(key_z).mean(axis=1)
    else:
      keys = losses.l2_normalize(key_z[:, 0])
    new['queue'], new['queue_ptr'] = state_lib.enqueue(
        state.queue, state.queue_ptr, keys)
  if method.name == 'memory_bank':
    # One bank row per instance: the normalised mean of its views' features.
    feats = losses.l2_normalize(losses.l2_normalize(z).mean(axis=1))
    new['bank'] = state_lib.update_bank(state.bank, index, feats,
                                        method.bank_momentum)
  if method.lambda_ramp:
    extra_metrics['lam'] = method.lam_at(state.step)
  if method.probe_classes:
    (new['probe_params'], new['probe_opt_state'],
     probe_metrics) = online_probe_step(
         state.probe_params, state.probe_opt_state, features[:, 0], labels,
         method=method)
    extra_metrics.update(probe_metrics)

  metrics = dict(metrics, **extra_metrics, loss=loss,
                 grad_norm=optax.global_norm(grads))
  metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
  return state.replace(step=state.step + 1, params=params,
                       batch_stats=batch_stats, opt_state=opt_state,
                       **new), metrics


def create_step_fns(config, model, tx, mesh, method: Method, image_shape):
  """Jitted (init_fn, step_fn, state_sharding) with explicit shardings.

  init_fn(rng) -> state; step_fn(state, batch, rng) -> (state, metrics), the
  state donated. The batch is sharded along 'data'; the state is replicated
  except the queue and bank (rows sharded along 'data').
  """
  init = functools.partial(create_train_state, model=model, tx=tx,
                           image_shape=image_shape, method=method,
                           num_devices=mesh.size)
  abstract = jax.eval_shape(init, jax.random.key(0))
  shardings = state_shardings(abstract, mesh)
  replicated = NamedSharding(mesh, P())
  data = NamedSharding(mesh, P('data'))
  init_fn = jax.jit(init, out_shardings=shardings)
  loss_fn = functools.partial(losses.get_loss(config.loss),
                              **_loss_kwargs(config))
  step_fn = jax.jit(
      functools.partial(train_step, model=model, tx=tx, loss_fn=loss_fn,
                        method=method, mesh=mesh),
      in_shardings=(shardings, {'views': data, 'label': data, 'index': data},
                    replicated),
      out_shardings=(shardings, replicated), donate_argnums=(0,))
  return init_fn, step_fn, shardings


def _loss_kwargs(config) -> dict[str, Any]:
  kwargs = dict(config.loss_kwargs)
  if config.loss == 'jcl':
    kwargs.pop('lam', None)   # Passed per step (the ramp), see Method.lam_at.
  return kwargs


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
  if config.method not in METHODS:
    raise ValueError(f'unknown method {config.method!r} (config.method); '
                     f'known: {", ".join(METHODS)}.')
  if config.loss not in _METHOD_LOSSES[config.method]:
    raise ValueError(
        f'config.loss={config.loss!r} cannot be fed by '
        f'config.method={config.method!r}; that method feeds: '
        f'{", ".join(_METHOD_LOSSES[config.method])}.')
  if config.use_labels and config.loss not in _SUPERVISED_LOSSES:
    raise ValueError(f'config.use_labels=True but {config.loss!r} takes no '
                     f'labels; supervised losses: '
                     f'{", ".join(_SUPERVISED_LOSSES)}.')
  if config.use_labels and config.method != 'in_batch':
    raise ValueError('config.use_labels needs config.method="in_batch".')
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
  if config.method == 'moco':
    mc = config.moco
    for name in ('query_views', 'key_views'):
      views = tuple(mc[name])
      if not views or any(not 0 <= i < v for i in views):
        raise ValueError(f'config.moco.{name}={views} must be a non-empty '
                         f'list of view ids in [0, {v}) '
                         f'(config.augment.num_views={v}).')
    q = mc.queue_size
    if q < 0 or (q and q % b):
      raise ValueError(
          f'config.moco.queue_size={q} must be 0 (no queue) or a multiple of '
          f'the global batch size {b} (MoCo writes whole batches into the '
          'queue; a batch must never wrap around its end).')
    if not 0. <= mc.momentum <= 1.:
      raise ValueError(f'config.moco.momentum={mc.momentum} must be in [0, 1].')
    state_lib.momentum_schedule(0, base=mc.momentum, total_steps=1,
                                schedule=mc.momentum_schedule)
    if config.loss == 'jcl' and not q and not config.loss_kwargs.get(
        'in_batch_negatives', False):
      raise ValueError('JCL needs negatives: set config.moco.queue_size > 0 '
                       'or config.loss_kwargs.in_batch_negatives=True.')
    if mc.lambda_ramp and config.loss != 'jcl':
      raise ValueError('config.moco.lambda_ramp is JCL\'s lambda ramp; it '
                       f'needs config.loss="jcl", not {config.loss!r}.')
  if config.method == 'memory_bank':
    mb = config.memory_bank
    if mb.num_negatives < 1:
      raise ValueError(f'config.memory_bank.num_negatives={mb.num_negatives} '
                       'must be >= 1.')
    if not 0. <= mb.momentum < 1.:
      raise ValueError(f'config.memory_bank.momentum={mb.momentum} must be in '
                       '[0, 1).')
    if config.loss == 'insdis' and v != 1:
      raise ValueError(f'InsDis uses one view per instance; set '
                       f'config.augment.num_views=1 (got {v}).')
    if config.loss == 'insdis' and mb.num_negatives % n:
      raise ValueError(
          f'config.memory_bank.num_negatives={mb.num_negatives} is not '
          f'divisible by the {n} devices: each device draws the same share '
          'of the InsDis noise rows from its own shard of the memory bank '
          f'(state.sample_bank_noise); use a multiple of {n}.')


def load_data(config):
  """(train, eval) sources of `config.dataset` (input_pipeline/sources.py).

  With `config.dataset.in_memory` each process holds the split in memory (an
  optimisation for small datasets); otherwise every read goes to the files.
  The training split becomes the training data after
  `config.dataset.validation_size` (a fixed stratified holdout) and
  `config.dataset.imbalance` (CACR's subsets), see input_pipeline/splits.py.
  The eval source is the test split (`config.dataset.eval_split`), or the
  holdout when `config.eval.split == 'validation'`.
  """
  from input_pipeline import splits  # pylint: disable=g-import-not-at-top
  ds = config.dataset
  train, validation = splits.prepare_train(
      sources.open_split(ds, ds.train_split), ds)
  if config.eval.split == 'validation':
    return train, validation
  return train, sources.open_split(ds, ds.eval_split)


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
  views_cfg = augment.build_views(config.augment.preset,
                                  config.augment.num_views,
                                  config.augment.overrides)
  image_shape = tuple(train_data.image_shape)
  method = Method.from_config(config, total_steps=total_steps,
                              steps_per_epoch=batches.steps_per_epoch,
                              num_examples=len(train_data),
                              num_classes=train_data.num_classes)

  rng = jax.random.key(config.seed)
  init_rng, aug_rng, step_rng = jax.random.split(rng, 3)
  init_fn, step_fn, _ = create_step_fns(config, model, tx, mesh, method,
                                        image_shape)
  feature_fn = evaluate.make_feature_fn(model, mesh)
  state = init_fn(init_rng)

  manager = checkpointing.create_manager(workdir)
  restored, restored_step = checkpointing.restore_latest(manager, state)
  if restored is not None:
    state = restored
    logging.info('Resumed from the checkpoint at step %d.', restored_step)

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
  preempted = _preemption_check()
  t0, last_logged, last_time = time.time(), start, time.time()
  try:
    for step, batch in zip(range(start, total_steps),
                           batches.iterate(start, total_steps)):
      views = augment_fn(step, batch['image'])
      state, metrics = step_fn(
          state, {'views': views, 'label': batch['label'],
                  'index': batch['index']}, step_rng)
      done = step + 1
      if done % config.log_every_steps == 0 or done == total_steps:
        metrics = jax.device_get(metrics)   # Replicated: every process has it.
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
      every = config.online.knn_every_steps
      if every and (done % every == 0 or done == total_steps):
        online = evaluate.online_knn(config, feature_fn, state, train_data,
                                     test_data, mesh)
        writer.write_scalars(done, online)
        if history and history[-1]['step'] == done:
          history[-1].update(online)
        else:
          history.append({'step': done, **online})
        logging.info('step %d  %s', done, online)
      stop = preempted(done)
      if (stop or done % config.checkpoint_every_steps == 0 or
          done == total_steps):
        checkpointing.save(manager, done, state)
        _save_history(workdir, history)
      if stop:
        raise Preempted(
            f'preempted (SIGTERM) at step {done}: its checkpoint is saved in '
            f'{workdir}/checkpoints; rerun the same command to resume.')
  finally:
    # Let in-flight asynchronous saves finish (or fail) before any error
    # propagates, so the error is the last thing printed and no half-written
    # checkpoint directory is left behind.
    manager.wait_until_finished()
    manager.close()
  train_seconds = time.time() - t0

  results = evaluate.evaluate_all(
      # The donated initial state is gone; init is deterministic, so redo it.
      config, feature_fn, {'trained': state, 'random_init': init_fn(init_rng)},
      train_data, test_data, mesh)
  results.update(steps=total_steps, train_seconds=round(train_seconds, 1),
                 resumed_from_step=restored_step)
  logged = [h for h in history if 'loss' in h]
  if logged:
    results['final_loss'] = logged[-1]['loss']
    results['images_per_sec'] = float(np.median(
        [h['images_per_sec'] for h in logged[1:]] or
        [logged[-1]['images_per_sec']]))
  for h in reversed(history):   # The last online monitor values, labelled.
    for k, v in h.items():
      if k.startswith('online/'):
        results.setdefault(k, v)
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
