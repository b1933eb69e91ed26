"""A method turns a batch's views [B, V, H, W, C] into its loss's inputs.

It owns its config checks, its train state (`TrainState.method_state`) and
shardings, `prepare` (outside the gradient), the model output the loss takes
(`embedding`) and `update` (after the optimiser step), which `step.train_step`
calls in that order. A frozen dataclass: a static argument of the step.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses
from contrastive_jax import models


@dataclasses.dataclass(frozen=True)
class Context:
  """What the data and the run tell a method at build time."""
  total_steps: int
  steps_per_epoch: int
  num_examples: int
  num_devices: int
  num_epochs: float


@flax.struct.dataclass
class Prepared:
  """`prepare`'s output for the step."""
  views: jax.Array                 # [B, V', H, W, C] for the online encoder.
  inputs: losses.LossInputs        # z None: the step fills it in.
  method_state: Any = None         # After the pre-step update (e.g. an EMA).
  metrics: dict[str, jax.Array] = flax.struct.field(default_factory=dict)
  aux: Any = None                  # For `update` (e.g. the keys).


@dataclasses.dataclass(frozen=True)
class Method:
  """Every view through the online encoder, no state; subclasses set
  `losses` (those they can feed) and override hooks."""
  loss: str
  ctx: Context
  # The model output the loss takes as z (a wrapper may add 'prediction').
  embedding: ClassVar[str] = 'projection'
  losses: ClassVar[tuple[str, ...]] = ()

  @classmethod
  def validate(cls, config, num_devices: int) -> None:
    """Config checks specific to the method (its `config.<section>`)."""
    del num_devices
    if config.loss not in cls.losses:
      raise ValueError(
          f'config.loss={config.loss!r} cannot be fed by '
          f'config.method={config.method!r}; that method feeds: '
          f'{", ".join(cls.losses)}.')
    accepted, _ = losses.inputs_of(config.loss)
    if config.use_labels and 'labels' not in accepted:
      supervised = sorted(n for n in losses.LOSSES
                          if 'labels' in losses.inputs_of(n)[0])
      raise ValueError(f'config.use_labels=True but {config.loss!r} takes no '
                       f'labels; supervised losses: {", ".join(supervised)}.')

  @classmethod
  def from_config(cls, config, ctx: Context) -> 'Method':
    return cls(loss=config.loss, ctx=ctx)

  @classmethod
  def wrap_model(cls, config, model):
    """The model the method trains (default: the configured one as is)."""
    del config
    return model

  def init(self, rngs: dict[str, jax.Array], variables, *,
           out_dim: int) -> Any:
    """The initial state (default: none); `rngs`: 'queue', 'bank'."""
    del rngs, variables, out_dim
    return None

  def shardings(self, abstract_state: Any, mesh) -> Any:
    """Shardings of the method's state (default: replicated)."""
    replicated = NamedSharding(mesh, P())
    return jax.tree.map(lambda _: replicated, abstract_state)

  def prepare(self, state, batch: dict[str, Any], rng: jax.Array, *,
              model, mesh) -> Prepared:
    """Loss inputs not differentiated: default, all views, no targets."""
    del rng, model, mesh
    return Prepared(views=batch['views'],
                    inputs=losses.LossInputs(z=None),
                    method_state=state.method_state)

  def loss_kwargs(self) -> dict[str, Any]:
    """Loss hyperparameters the method supplies (default: none)."""
    return {}

  def update(self, prepared: Prepared, z: jax.Array,
             batch: dict[str, Any]) -> Any:
    """The method's state after the step (default: as `prepare` left it)."""
    del z, batch
    return prepared.method_state


def loss_parameters(name: str) -> tuple[str, ...]:
  """The parameter names of loss `name`'s signature."""
  return tuple(inspect.signature(losses.get_loss(name)).parameters)


def forward(model, variables, views, *, embedding: str = 'projection'):
  """(z [B, V, D] `embedding` outputs, features [B, F] of view 0, new BN
  statistics) of views [B, V, H, W, C].

  The B V images form one batch, so BN statistics span views and devices;
  with split BN (config.model.bn_splits > 0) each view goes through alone,
  as the papers' code does, so a BN group never holds two views of an image.
  """
  batch_stats = variables.get('batch_stats', {})
  v = views.shape[1]
  groups = ([views[:, i:i + 1] for i in range(v)]
            if models.bn_splits_of(model) else [views])
  zs, features = [], None
  for group in groups:
    b, v = group.shape[:2]
    out, new_vars = model.apply(
        {'params': variables['params'], 'batch_stats': batch_stats},
        group.reshape((b * v,) + group.shape[2:]), train=True,
        mutable=['batch_stats'])
    batch_stats = new_vars['batch_stats']
    zs.append(out[embedding].reshape(b, v, -1))
    if features is None:
      features = out['features'].reshape(b, v, -1)[:, 0]
  z = zs[0] if len(zs) == 1 else jnp.concatenate(zs, axis=1)
  return z, features, batch_stats
