"""The train state, the pure train step, and `build`, which makes both.

One 1-D mesh, axis 'data', over every device: the batch is sharded along it,
parameters and optimizer state are replicated, a MoCo queue or memory bank
is sharded by rows, and `jax.jit` partitions the step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses
from contrastive_jax import methods
from contrastive_jax import models
from contrastive_jax import optim
from contrastive_jax import schedules
from contrastive_jax.evaluators import diagnostics


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training, as one pytree."""
  step: jax.Array                 # int32 scalar: steps done.
  params: Any                     # Online (query) encoder + head.
  batch_stats: Any                # Its BatchNorm running statistics.
  opt_state: Any
  method_state: Any = None        # methods/*.py State, or None.
  classifier_params: Any = None     # The online classifier's (config.online),
  classifier_opt_state: Any = None  # None when it is off.


@dataclasses.dataclass(frozen=True)
class Loss:
  """The configured loss: name, fixed kwargs, schedules and scale.

  `schedules`: loss keyword -> (step -> value), traced so that a changing
  value does not recompile. `scale`: `config.loss_scale` (MoCo v3's 4 tau).
  """
  name: str
  kwargs: dict[str, Any]
  schedules: dict[str, Any]
  scale: float = 1.0

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
    return cls(name=config.loss, kwargs=kwargs, schedules=scheduled,
               scale=float(config.loss_scale))


@dataclasses.dataclass(frozen=True)
class OnlineClassifier:
  """The online linear classifier (`config.online`), a monitor on view 0."""
  num_classes: int
  tx = optax.adam(1e-3)


def online_classifier_step(params, opt_state, features, labels, *,
                           classifier: OnlineClassifier):
  """One Adam step of the online linear classifier on frozen features.

  params {'w': [F, C], 'b': [C]}; features [B, F]; labels [B]. Metrics:
  `online/linear_acc` (before the update), `online/linear_loss`.
  """
  features = jax.lax.stop_gradient(features.astype(jnp.float32))

  def loss_fn(p):
    logits = features @ p['w'] + p['b']
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, labels).mean(), logits

  (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = classifier.tx.update(grads, opt_state)
  metrics = {'online/linear_acc': jnp.mean(jnp.argmax(logits, -1) == labels),
             'online/linear_loss': loss}
  return optax.apply_updates(params, updates), opt_state, metrics


def create_train_state(rng, *, model, tx, image_shape,
                       method: methods.base.Method,
                       classifier: OnlineClassifier | None = None
                       ) -> TrainState:
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
  if classifier is not None:
    c = classifier.num_classes
    w = {'w': jnp.zeros((out['features'].shape[-1], c)), 'b': jnp.zeros((c,))}
    state = state.replace(classifier_params=w,
                          classifier_opt_state=classifier.tx.init(w))
  return state


def train_step(state: TrainState, batch: dict[str, Any], rng: jax.Array, *,
               model, tx, method: methods.base.Method, loss: Loss,
               classifier: OnlineClassifier | None = None,
               mesh=None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimisation step. Pure: jit it with the state donated.

  batch: {'views': [B, V, H, W, C] float, 'label': [B], 'index': [B]}; the
  step's randomness is fold_in(rng, step). Metrics: `loss` (times
  `loss.scale`), `grad_norm`, the loss's, the method's, the scheduled values
  and the monitors.
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
    if loss.scale != 1.0:
      value = value * loss.scale
    return value, (metrics, batch_stats, z, features)

  (value, (metrics, batch_stats, z, features)), grads = jax.value_and_grad(
      objective, has_aux=True)(state.params)
  # 3. The optimiser.
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new = dict(step=state.step + 1,
             params=optax.apply_updates(state.params, updates),
             batch_stats=batch_stats, opt_state=opt_state,
             # 4. The method's state after the step (enqueue, bank write).
             method_state=method.update(prepared, z, batch))
  metrics = dict(metrics, **prepared.metrics, **scheduled, loss=value,
                 grad_norm=optax.global_norm(grads),
                 **alignment_uniformity(z, prepared.inputs.key))
  if classifier is not None:
    new['classifier_params'], new['classifier_opt_state'], online = (
        online_classifier_step(state.classifier_params,
                               state.classifier_opt_state, features,
                               batch['label'], classifier=classifier))
    metrics.update(online)
  metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
  return state.replace(**new), metrics


def alignment_uniformity(z: jax.Array, key: jax.Array | None
                         ) -> dict[str, jax.Array]:
  """Wang & Isola (2020)'s monitors, lower better: `uniformity` of view 0,
  `alignment` of view 0 with view 1 (one view: the key). z: [B, V, D]; key:
  [B, Vk, D] or None. The barrier keeps XLA from fusing these with the
  loss's ops, which would change its floats."""
  z, key = jax.lax.optimization_barrier((z, key))
  out = {'uniformity': diagnostics.uniformity(z[:, 0])}
  partner = z[:, 1] if z.shape[1] > 1 else None if key is None else key[:, 0]
  if partner is not None:
    out['alignment'] = diagnostics.alignment(z[:, 0], partner)
  return out


def create_model(config):
  """The configured model as the method wraps it (e.g. with a predictor)."""
  return methods.get(config.method).wrap_model(config,
                                               models.create_model(config))


@dataclasses.dataclass(frozen=True)
class Setup:
  """What `build` makes: `init_fn(rng) -> state`, `step_fn(state, batch,
  rng) -> (state, metrics)` (state donated) and what they close over."""
  model: Any
  tx: optax.GradientTransformation
  learning_rate: optax.Schedule
  method: methods.base.Method
  loss: Loss
  classifier: OnlineClassifier | None
  init_fn: Any
  step_fn: Any
  shardings: TrainState


def build(config, mesh, *, total_steps: int, steps_per_epoch: int,
          num_examples: int, image_shape, num_classes: int = 0) -> Setup:
  """The model, optimizer, method, loss and jitted step of `config`."""
  ctx = methods.base.Context(
      total_steps=total_steps, steps_per_epoch=steps_per_epoch,
      num_examples=num_examples, num_devices=mesh.size,
      num_epochs=float(config.num_epochs))
  method = methods.get(config.method).from_config(config, ctx)
  model = create_model(config)
  learning_rate = optim.learning_rate_schedule(config, total_steps)
  tx = optim.create_optimizer(config, learning_rate)
  loss = Loss.from_config(config, method, ctx)
  classifier = (OnlineClassifier(num_classes)
                if config.online.classifier and num_classes > 1 else None)
  init = functools.partial(create_train_state, model=model, tx=tx,
                           image_shape=tuple(image_shape), method=method,
                           classifier=classifier)
  # The state replicated but where the method says (queue, bank rows).
  replicated = NamedSharding(mesh, P())
  abstract = jax.eval_shape(init, jax.random.key(0))
  shardings = jax.tree.map(lambda _: replicated, abstract).replace(
      method_state=method.shardings(abstract.method_state, mesh))
  data = NamedSharding(mesh, P('data'))
  step_fn = jax.jit(
      functools.partial(train_step, model=model, tx=tx, method=method,
                        loss=loss, classifier=classifier, mesh=mesh),
      in_shardings=(shardings, {'views': data, 'label': data, 'index': data},
                    replicated),
      out_shardings=(shardings, replicated), donate_argnums=(0,))
  return Setup(model=model, tx=tx, learning_rate=learning_rate,
               method=method, loss=loss, classifier=classifier,
               init_fn=jax.jit(init, out_shardings=shardings),
               step_fn=step_fn, shardings=shardings)
