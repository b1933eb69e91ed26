"""Instance-discrimination losses: NT-Xent (SimCLR), InfoNCE (MoCo), InsDis, CMC."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common


def ntxent(z: jax.Array, *, temperature: float = 0.1) -> common.LossOutput:
  """NT-Xent of SimCLR (Chen et al. 2020, eq. 1), generalised to V >= 2 views.

  Each of the N*V embeddings is an anchor; every other view of the same instance
  is a positive and the other N*V - V embeddings are negatives. With V = 2 this is
  SimCLR's loss averaged over all 2N anchors. For V > 2 the per-anchor loss is
  the mean over its V - 1 positives of -log softmax(positive) over the
  non-self similarities (SupCon's L_out with instance labels).

  Args:
    z: [N, V, D] embeddings (any float dtype; normalised here).
    temperature: softmax temperature tau.

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim` (mean cosine
    similarity) and `acc` (fraction of anchors whose most similar non-self
    embedding is a positive).
  """
  common.check_views(z, 'z', min_views=2)
  n, v, _ = z.shape
  zf = common.l2_normalize(z).reshape(n * v, -1)
  sim = zf @ zf.T                                          # [NV, NV]
  inst = jnp.repeat(jnp.arange(n), v)
  self_mask = jnp.eye(n * v, dtype=bool)
  pos_mask = (inst[:, None] == inst[None, :]) & ~self_mask
  logits = jnp.where(self_mask, -jnp.inf, sim / temperature)
  log_prob = jax.nn.log_softmax(logits, axis=-1)
  per_anchor = -jnp.sum(jnp.where(pos_mask, log_prob, 0.), axis=-1) / (v - 1)
  neg_mask = ~pos_mask & ~self_mask
  metrics = {
      'pos_sim': jnp.sum(jnp.where(pos_mask, sim, 0.)) / jnp.sum(pos_mask),
      'neg_sim': jnp.sum(jnp.where(neg_mask, sim, 0.)) / jnp.sum(neg_mask),
      'acc': jnp.mean(pos_mask[jnp.arange(n * v), jnp.argmax(logits, -1)]),
  }
  return jnp.mean(per_anchor), metrics


LOSSES = {'ntxent': ntxent}
