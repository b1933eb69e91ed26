"""CACR: Contrastive Attraction and Contrastive Repulsion (Zheng et al. 2023).

Regimes, stop-gradient variants and numerics: docs/losses.md (CACR).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.losses import common

# Masked logits: their weights are an exact 0 and no inf * 0 reaches a gradient.
_MASKED = -1e30


@common.float32_matmuls
def cacr(z: jax.Array, *, key: jax.Array | None = None,
         queue: jax.Array | None = None, t_pos: float = 1.0,
         t_neg: float = 2.0, negatives: str = 'cross_view',
         intra_batch: bool = True, sg_pos: bool | None = None,
         sg_neg: bool = False) -> common.LossOutput:
  """CACR loss (Eqs. 2-4, Sec. 3.2 estimator; App. C.2 Alg. 3 with a queue).

  L = E[sum_k pi+_k c(z, z+_k)] - E[sum_j pi-_j c(z, z-_j)], c = ||a - b||^2
  on the unit sphere, pi+ = softmax(t_pos c), pi- = softmax(-t_neg c); each
  of the V = K + 1 views of z [N, V, D] is the query in turn, the other K its
  positives. In-batch (`key=None`, the released small-scale code): negatives
  z_j^u, j != i, of view pairs v < u ('cross_view'). With `key` [N, V, D]
  (Algorithm 3, MoCo v2): a queue [Q, D] plus, with `intra_batch`, the other
  same-view queries. `sg_pos` (None: True iff `key`) and `sg_neg` stop the
  gradient through pi+ and pi-. Metrics: `ca`, `cr`, the mean entropies
  `pos_entropy`, `neg_entropy` (Eq. 8) and `pos_sim`.
  """
  common.check_views(z, 'z', min_views=2)
  common.check_choice('negatives', negatives, ('cross_view',))
  n, v, d = z.shape
  if key is not None:
    if jnp.shape(key) != tuple(z.shape):
      raise ValueError(
          f'key must have the shape of z, [N, V, D] = {tuple(z.shape)} (one '
          f'momentum key per query view); got shape {tuple(jnp.shape(key))}.')
  elif queue is not None:
    raise ValueError('queue negatives need the MoCo regime: pass key=... '
                     '([N, V, D] momentum-encoder embeddings) as well.')
  common.check_queue(queue, d)
  if key is not None and queue is None and (not intra_batch or n < 2):
    raise ValueError('no negatives: pass a queue or use intra_batch=True with '
                     'N >= 2.')
  if key is None and n < 2:
    raise ValueError(f'in-batch CACR needs N >= 2 instances; got z of shape '
                     f'{tuple(z.shape)}.')
  if sg_pos is None:
    sg_pos = key is not None

  q = common.l2_normalize(z)                                  # [N, V, D]
  k = q if key is None else jax.lax.stop_gradient(common.l2_normalize(key))
  # Attraction: K positives per (instance, query view).
  off_view = ~jnp.eye(v, dtype=bool)                          # [V, V]
  c_pos = 2. - 2. * jnp.einsum('nvd,nud->nvu', q, k)          # [N, V, V]
  log_wp = jax.nn.log_softmax(
      jnp.where(off_view, t_pos * c_pos, _MASKED), axis=-1)
  w_pos = jnp.exp(log_wp)                     # masked entries: exactly 0
  pos_entropy = jnp.mean(
      -jnp.sum(jnp.where(w_pos > 0, w_pos * log_wp, 0.), axis=-1))
  if sg_pos:
    w_pos = jax.lax.stop_gradient(w_pos)
  ca = jnp.mean(jnp.sum(jnp.where(off_view, w_pos * c_pos, 0.), axis=-1))

  # Repulsion: (cost [..., M], mask or None) for each set of negatives.
  if key is None:
    a_idx, b_idx = np.triu_indices(v, 1)                      # pairs v < u
    c = 2. - 2. * jnp.einsum('ipd,jpd->pij', q[:, a_idx], q[:, b_idx])
    parts = [(c, ~jnp.eye(n, dtype=bool)[None])]              # j != i
  else:
    parts = []
    if queue is not None:
      kq, inv_norm = common.unit_queue(queue)
      c_q = 2. - 2. * jnp.einsum('nvd,qd->nvq', q, kq) * inv_norm  # [N, V, Q]
      parts.append((c_q, None))
    if intra_batch:
      c_b = 2. - 2. * jnp.einsum('ivd,jvd->ivj', q, q)         # [N, V, N]
      parts.append((c_b, ~jnp.eye(n, dtype=bool)[:, None, :]))
  per_row, entropy = _repulsion(parts, t_neg, sg_neg)
  cr, neg_entropy = -jnp.mean(per_row), jnp.mean(entropy)
  pos_sim = (jnp.sum(jnp.where(off_view, 1. - c_pos / 2., 0.))
             / (n * v * (v - 1)))
  metrics = {'ca': ca, 'cr': cr, 'pos_entropy': pos_entropy,
             'neg_entropy': neg_entropy, 'pos_sim': pos_sim}
  return ca + cr, metrics


def _repulsion(parts, t_neg, sg_neg):
  """Per-row (sum_j pi-_j c_j, H(pi-)) over a union of negative sets.

  One exp per entry: pi- = e / S, e = exp(logit - max).
  """
  logits = [-t_neg * c if m is None else jnp.where(m, -t_neg * c, _MASKED)
            for c, m in parts]
  top = jax.lax.stop_gradient(
      functools.reduce(jnp.maximum, [jnp.max(lg, axis=-1) for lg in logits]))
  num, den, wc = 0., 0., 0.
  for (c, _), lg in zip(parts, logits):
    e = jnp.exp(lg - top[..., None])               # masked entries: exactly 0
    e_used = jax.lax.stop_gradient(e) if sg_neg else e
    num = num + jnp.sum(e_used * c, axis=-1)
    den = den + jnp.sum(e_used, axis=-1)
    wc = wc + jax.lax.stop_gradient(jnp.sum(e * c, axis=-1))
  den_v = jax.lax.stop_gradient(den)
  entropy = jnp.log(den_v) + top + t_neg * wc / den_v  # log S + top - E[lg]
  return num / den, entropy
