"""Regression of one network's output on another's: no negatives (BYOL).

BYOL (Grill et al. 2020) trains an online network with a predictor to regress
the projection of an EMA target network (`methods/byol.py` drives it); the
loss is Eq. 2 per pair, symmetrised over the views by pairing query view v
with key view v.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common


@common.float32_matmuls
def byol(query: jax.Array, key: jax.Array) -> common.LossOutput:
  """BYOL's loss, Eq. 2 per pair, averaged over instances and views.

  L = 2 - 2 <q, k> / (||q|| ||k||), which is || q / ||q|| - k / ||k|| ||^2.

  Args:
    query: [N, V, D] online predictions (gradients flow here).
    key: [N, V, D] target projections of the paired views (view v of query
      pairs with view v of key).

  Returns:
    (loss, metrics) with `cosine`, the mean cosine similarity of the pairs.
  """
  common.check_views(query, 'query')
  common.check_views(key, 'key')
  if jnp.shape(query) != jnp.shape(key):
    raise ValueError(f'query and key must have the same shape [N, V, D]; got '
                     f'{jnp.shape(query)} and {jnp.shape(key)}.')
  cos = jnp.sum(common.l2_normalize(query) * common.l2_normalize(key), -1)
  loss = jnp.mean(2. - 2. * cos)
  return loss, {'cosine': jnp.mean(cos)}


LOSSES = {'byol': byol}
