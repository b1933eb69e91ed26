"""In-batch contrast (SimCLR-style): the other instances of the global batch
are the negatives. Feeds NT-Xent, SupCon/TCL (`config.use_labels`), CACR,
MACL, DCL, AU-CL, HN-CL and bank-less CMC with z [B, V, D] (and labels).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from contrastive_jax import losses
from contrastive_jax.methods import base


@dataclasses.dataclass(frozen=True)
class Method(base.Method):
  use_labels: bool = False
  losses = ('ntxent', 'supcon', 'tcl', 'cacr', 'macl', 'dcl', 'align_uniform',
            'hard_negative', 'cmc')

  @classmethod
  def validate(cls, config, num_devices: int) -> None:
    super().validate(config, num_devices)
    # The loss traced on the batch's shapes, so a bad V fails here, naming
    # the config fields.
    b, v = config.batch_size, config.augment.num_views
    if not all(isinstance(n, int) and n >= 1 for n in (b, v)):
      return           # Their own checks name them.
    z = jax.ShapeDtypeStruct((b, v, config.model.head_out_dim), jnp.float32)
    labels = (jax.ShapeDtypeStruct((b,), jnp.int32) if config.use_labels
              else None)
    try:
      jax.eval_shape(lambda z, labels: losses.apply(
          config.loss, losses.LossInputs(z=z, labels=labels),
          **dict(config.loss_kwargs)), z, labels)
    except (TypeError, ValueError) as e:
      raise ValueError(
          f'config.loss={config.loss!r} cannot take the batch that '
          f'config.batch_size={b} and config.augment.num_views={v} make: '
          f'{e}') from None

  @classmethod
  def from_config(cls, config, ctx: base.Context) -> 'Method':
    return cls(loss=config.loss, ctx=ctx, use_labels=bool(config.use_labels))

  def prepare(self, state, batch, rng, *, model, mesh) -> base.Prepared:
    del rng, model, mesh
    labels = batch['label'] if self.use_labels else None
    return base.Prepared(views=batch['views'],
                         inputs=losses.LossInputs(z=None, labels=labels),
                         method_state=state.method_state)
