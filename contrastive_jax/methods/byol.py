"""BYOL (Grill et al. 2020): a predictor on the online side, an EMA target,
no negatives.

The README's worked example of adding a method: this module, configs/byol.py
and tests/test_byol.py are all it took. It reuses the key-encoder method
(`moco.Method`: EMA target updated before the keys, stop_gradient on them,
the momentum schedule of `config.moco`) and adds what BYOL changes:

  * the online network has a predictor q_theta, an MLP on the projection
    (`config.moco.predictor_hidden_dim`, shared with MoCo v3); the loss takes
    its output, the target its projection;
  * the loss is the normalised regression of Eq. 2, registered here as
    'byol', symmetrised over the two views (Eq. 3: query view v is
    regressed on the target's other view, `config.moco.key_views = (1, 0)`);
  * no queue (Sec. 3.1: no negatives).

The target's parameters are an EMA of the whole online tree, predictor
included (the predictor's copy is never used; its EMA is a few [512, 128]
multiply-adds, which keeps the key encoder the moco method's own).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from contrastive_jax import losses
from contrastive_jax.methods import moco


@losses.register('byol')
@losses.common.float32_matmuls
def regression(query: jax.Array, key: jax.Array) -> losses.common.LossOutput:
  """BYOL's loss, Eq. 2 per pair, averaged over instances and views.

  L = 2 - 2 <q, k> / (||q|| ||k||), which is || q / ||q|| - k / ||k|| ||^2.

  Args:
    query: [N, V, D] online predictions (gradients flow here).
    key: [N, V, D] target projections of the paired views (view v of query
      pairs with view v of key).

  Returns:
    (loss, metrics) with `cosine`, the mean cosine similarity of the pairs.
  """
  losses.common.check_views(query, 'query')
  losses.common.check_views(key, 'key')
  if jnp.shape(query) != jnp.shape(key):
    raise ValueError(f'query and key must have the same shape [N, V, D]; got '
                     f'{jnp.shape(query)} and {jnp.shape(key)}.')
  cos = jnp.sum(losses.l2_normalize(query) * losses.l2_normalize(key), -1)
  loss = jnp.mean(2. - 2. * cos)
  return loss, {'cosine': jnp.mean(cos)}


@dataclasses.dataclass(frozen=True)
class Method(moco.Method):
  losses = ('byol',)

  @classmethod
  def validate(cls, config, num_devices: int) -> None:
    super().validate(config, num_devices)
    if config.moco.queue_size:
      raise ValueError('BYOL uses no negatives; set config.moco.queue_size=0 '
                       f'(got {config.moco.queue_size}).')
    if config.moco.predictor_hidden_dim <= 0:
      raise ValueError('BYOL regresses a predictor\'s output on the target; '
                       'set config.moco.predictor_hidden_dim > 0 (the paper: '
                       '4096).')
    if len(config.moco.query_views) != len(config.moco.key_views):
      raise ValueError('BYOL pairs query view v with key view v: '
                       'config.moco.query_views and .key_views need the same '
                       'length.')
