"""Regression of one network's output on another's, no negatives (BYOL)."""

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common


@common.float32_matmuls
def byol(query: jax.Array, key: jax.Array) -> common.LossOutput:
  """BYOL's loss (Grill et al. 2020, Eq. 2), the mean over instances and views.

  L = 2 - 2 <q, k> / (||q|| ||k||) = ||q / ||q|| - k / ||k|| ||^2, with query
  [N, V, D] the online predictions and key [N, V, D] the target projections
  (view v pairs with query view v).
  """
  common.check_views(query, 'query')
  common.check_views(key, 'key')
  if jnp.shape(query) != jnp.shape(key):
    raise ValueError(f'query and key must have the same shape [N, V, D]; got '
                     f'{jnp.shape(query)} and {jnp.shape(key)}.')
  cos = jnp.sum(common.l2_normalize(query) * common.l2_normalize(key), -1)
  return jnp.mean(2. - 2. * cos), {'cosine': jnp.mean(cos)}
