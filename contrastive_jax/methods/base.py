"""What a method is, and the helpers every method shares.

A method decides how a batch of views becomes its loss's inputs. It owns:

  * its config checks (`validate`, run before any data is read);
  * its extra train state, one pytree in `TrainState.method_state` (a key
    encoder, a queue, a memory bank), and that state's shardings;
  * `prepare`: what it computes before the gradient, outside it (targets,
    negatives, its state's pre-step update such as an EMA);
  * which views the online encoder sees and which of the model's outputs
    feeds the loss (`embedding`);
  * `update`: its state after the optimiser step (enqueue, bank write).

`step.train_step` calls these in that order and never looks at a method's or
a loss's name. A method is a frozen dataclass: it is a static argument of the
jitted step, built once by `from_config`.

Views. A batch's views are a tuple of groups, each [B, V_g, H_g, W_g, C], the
runs of consecutive views that share a size (one group unless the views are
multi-crop, e.g. 2 x 224 px + 6 x 96 px). `forward` runs the encoder once per
group and concatenates the embeddings in view order, so a loss sees
z [B, V, D] whatever the views' sizes (SwAV's multi-crop forward).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses
from contrastive_jax import models
from contrastive_jax import schedules
from input_pipeline import augment

Views = tuple[jax.Array, ...]


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
  """A method's `prepare` output, consumed by the step.

  Attributes:
    views: the view groups the online encoder sees.
    inputs: the loss's inputs except `z` (which the step fills in from the
      online forward), with `z` a placeholder None.
    method_state: the method's state after its pre-step update (e.g. the EMA
      of a key encoder), handed to `update`.
    metrics: scalars to log (e.g. the momentum).
    aux: anything `update` needs that `prepare` computed (e.g. the keys).
  """
  views: Views
  inputs: losses.LossInputs
  method_state: Any = None
  metrics: dict[str, jax.Array] = flax.struct.field(default_factory=dict)
  aux: Any = None


@dataclasses.dataclass(frozen=True)
class Method:
  """The base method: every view through the online encoder, nothing else.

  Subclasses set `losses` (the losses the method can feed) and override the
  hooks they need; the defaults hold no state and update nothing.
  """
  loss: str
  ctx: Context
  # The model output the loss takes as z: 'projection' (the head's) or an
  # output a method's model wrapper adds (e.g. a predictor's).
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
      raise ValueError(f'config.use_labels=True but {config.loss!r} takes no '
                       'labels; supervised losses: '
                       f'{", ".join(supervised_losses())}.')

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
    """The method's initial state (default: none).

    Args:
      rngs: named PRNG streams of the state's initialisation, as flax names
        its rngs: 'queue' and 'bank' (a method uses the one for its buffer).
      variables: the initialised model variables {'params', 'batch_stats'}.
      out_dim: D, the dimension of the embeddings the loss sees.
    """
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


def supervised_losses() -> tuple[str, ...]:
  return tuple(sorted(name for name in losses.LOSSES
                      if 'labels' in losses.inputs_of(name)[0]))


def momentum(config, ctx: Context):
  """The key encoder's EMA momentum schedule (config.moco)."""
  return schedules.build(config.moco.momentum_schedule,
                         float(config.moco.momentum),
                         total_steps=ctx.total_steps,
                         steps_per_epoch=ctx.steps_per_epoch,
                         num_epochs=ctx.num_epochs,
                         name='config.moco.momentum_schedule')


# --------------------------------------------------------------------------
# Views and the forward pass.
# --------------------------------------------------------------------------

def num_views(views: Views) -> int:
  return sum(g.shape[1] for g in views)


def select_views(views: Views, ids: Sequence[int]) -> Views:
  """Views `ids` (in that order) as groups of consecutive equal-size runs."""
  flat = [g[:, i] for g in views for i in range(g.shape[1])]
  return augment.group_by_size([flat[i] for i in ids])


def forward(model, variables, views: Views, *, embedding: str = 'projection'):
  """The encoder on every view group: (z [B, V, D], features, batch_stats).

  A group's views go through the encoder as one batch, so BatchNorm
  statistics are shared across its views (and, under jit, across devices:
  global BN). Groups of different sizes run one after the other, each
  updating the running statistics (SwAV and DINO's multi-crop forward).
  With an encoder whose BatchNorm is split (config.model.bn_splits > 0)
  every view goes through it on its own, as the papers' code forwards each
  view (lightly's benchmark, MoCo's im_q / im_k): each view's B images are
  cut into the groups, so a group never holds two views of an image.

  Returns:
    z: [B, V, D] `embedding` outputs in view order.
    features: [B, F] backbone features of view 0 (the online monitor's).
    batch_stats: the updated BatchNorm statistics.
  """
  batch_stats = variables.get('batch_stats', {})
  if models.bn_splits_of(model):
    views = [group[:, i:i + 1] for group in views
             for i in range(group.shape[1])]
  zs, features = [], None
  for group in views:
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
