"""CACR: Contrastive Attraction and Contrastive Repulsion (Zheng et al. 2023).

The loss is L = L_CA + L_CR (paper Eqs. 2-4, mini-batch estimator of Sec. 3.2):

* contrastive attraction: each query is pulled towards its K positives with
  weights pi+ = softmax_k(+t_pos * ||z - z+_k||^2), so the farthest positive is
  pulled hardest;
* contrastive repulsion: each query is pushed from its negatives with weights
  pi- = softmax_j(-t_neg * ||z - z-_j||^2), so the nearest negative is pushed
  hardest; L_CR carries a minus sign.

`t_pos` and `t_neg` MULTIPLY squared distances (inverse temperatures). On the
unit sphere ||a - b||^2 = 2 - 2 a.b, which is how every cost is computed here:
it is exact, and unlike a norm it has a finite gradient at zero distance.

Two regimes (docs/losses.md, CACR):

* in-batch (`key=None`, the released small-scale code): `z: [N, K+1, D]` from
  one trainable encoder. Every view takes a turn as the query; its positives are
  the other K views of the same instance. Negatives are the other instances,
  from the other view of each unordered view pair v < u (`negatives=
  'cross_view'`, the code) or from the query's own view (`'same_view'`, the
  paper's Sec. 3.2 estimator).
* MoCo-v2 (`key` given, paper App. C.2 Algorithm 3): queries `z: [N, K+1, D]`
  from the online encoder, `key: [N, K+1, D]` from the momentum encoder. The
  positives of query view v are the keys of the other K views; negatives are
  the `queue` plus (if `intra_batch`) the other same-view queries.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.losses import common

# Finite stand-in for -inf in masked logits: the masked weights come out as an
# exact 0, and nothing in the backward pass can form inf * 0.
_MASKED = -1e30


def _entropy(log_w: jax.Array, axis: int) -> jax.Array:
  """-sum w log w along `axis`, treating masked (w == 0) entries as 0."""
  w = jnp.exp(log_w)
  return -jnp.sum(jnp.where(w > 0, w * log_w, 0.), axis=axis)


@common.float32_matmuls
def cacr(
    z: jax.Array,
    *,
    key: jax.Array | None = None,
    queue: jax.Array | None = None,
    t_pos: float = 1.0,
    t_neg: float = 2.0,
    cost: str = 'euclidean',
    rbf_t: float = 2.0,
    negatives: str = 'cross_view',
    intra_batch: bool = True,
    sg_pos: bool | None = None,
    sg_neg: bool = False,
    sg_neg_queue: bool = False,
) -> common.LossOutput:
  """CACR loss (paper Eqs. 2-4; Sec. 3.2 estimator; App. C.2 for the queue).

  View layout: V = K + 1 views per instance. Every view is the query in turn
  and the other K views are its positives; the loss averages over the V
  choices of query view (as the released code does).

  Stop-gradient regimes (docs/losses.md, CACR); the flags change the
  gradient only, never the loss value:
    * small-scale code / paper Sec. 3.2: `sg_pos=False, sg_neg=False` (the
      default when `key is None`);
    * paper Algorithm 3 (MoCo-v2): `sg_pos=True, sg_neg=False` (the default
      when `key` is given);
    * released MoCo-v2 code: additionally `sg_neg_queue=True` (only the queue
      part of the distances inside pi- is detached);
    * released MoCo-v3 code: `sg_pos=True, sg_neg=True`.

  Args:
    z: [N, V, D] query embeddings, V = K + 1 >= 2 (any float dtype).
    key: optional [N, V, D] momentum-encoder embeddings (MoCo-v2 regime). The
      positives of query view v are key views u != v.
    queue: optional [Q, D] negatives (MoCo queue of past keys); needs `key`.
    t_pos: multiplies ||z - z+||^2 inside pi+ (1.0 in every paper setting).
    t_neg: multiplies ||z - z-||^2 inside pi- (2.0 for K=1 CIFAR-10 and for
      ImageNet; 0.9 for K=4 CIFAR-10, the released code's defaults).
    cost: 'euclidean' (c = ||a - b||^2) or 'rbf' (App. B.5 Eq. 14: L_CR =
      log of the pi- weighted mean of exp(-rbf_t ||a - b||^2); attraction
      keeps the Euclidean cost). The weights are the same for both.
    rbf_t: precision of the RBF kernel (2.0 in the released code).
    negatives: in-batch regime only: 'cross_view' (query z_i^(v), negatives
      z_j^(u), j != i, for view pairs v < u; the released code) or
      'same_view' (negatives z_j^(v), j != i; paper Sec. 3.2).
    intra_batch: MoCo regime only: add the other same-view queries (N - 1) to
      the queue negatives (the default of Algorithm 3).
    sg_pos: stop the gradient through pi+ (None: regime default, see above).
    sg_neg: stop the gradient through all of pi-.
    sg_neg_queue: stop the gradient through the queue distances inside pi-.

  Returns:
    (loss, metrics): metrics hold `ca` and `cr` (the two terms),
    `pos_entropy` and `neg_entropy` (mean entropy of the pi+ and pi- rows, the
    paper's conditional entropies H(X+|X), H(X-|X), Eq. 8) and `pos_sim`.

  Raises:
    ValueError: on wrong shapes, V < 2, or an unknown option.
  """
  common.check_views(z, 'z', min_views=2)
  if cost not in ('euclidean', 'rbf'):
    raise ValueError(f"cost must be 'euclidean' or 'rbf'; got {cost!r}.")
  if negatives not in ('cross_view', 'same_view'):
    raise ValueError(
        f"negatives must be 'cross_view' or 'same_view'; got {negatives!r}.")
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
  # Keys come from the momentum encoder, which is never trained by gradient.
  k = q if key is None else jax.lax.stop_gradient(common.l2_normalize(key))

  # --- Contrastive attraction: K positives per (instance, query view). ------
  off_view = ~jnp.eye(v, dtype=bool)                          # [V, V]
  c_pos = 2. - 2. * jnp.einsum('nvd,nud->nvu', q, k)          # [N, V, V]
  log_wp = jax.nn.log_softmax(
      jnp.where(off_view, t_pos * c_pos, _MASKED), axis=-1)
  w_pos = jnp.exp(log_wp)
  if sg_pos:
    w_pos = jax.lax.stop_gradient(w_pos)
  ca = jnp.mean(jnp.sum(jnp.where(off_view, w_pos * c_pos, 0.), axis=-1))
  pos_entropy = jnp.mean(_entropy(log_wp, -1))

  if key is None:
    cr, neg_entropy = _repulsion_in_batch(q, t_neg, cost, rbf_t, negatives,
                                          sg_neg)
  else:
    cr, neg_entropy = _repulsion_moco(q, queue, t_neg, cost, rbf_t,
                                      intra_batch, sg_neg, sg_neg_queue)
  pos_sim = (jnp.sum(jnp.where(off_view, 1. - c_pos / 2., 0.))
             / (n * v * (v - 1)))
  metrics = {'ca': ca, 'cr': cr, 'pos_entropy': pos_entropy,
             'neg_entropy': neg_entropy, 'pos_sim': pos_sim}
  return ca + cr, metrics


def _repulsion(parts, t_neg, cost, rbf_t, sg_neg):
  """Per-row pi- weighted cost and pi- entropy over a union of negative sets.

  Args:
    parts: list of (c, cw, mask): costs [..., M_p], the costs used inside the
      weights (c itself, or a detached copy) and a mask broadcastable to c or
      None. The rows of all parts share the leading dims.

  Returns:
    (sum_j pi-_j val_j, H(pi-)) per row, with val = c (euclidean) or
    exp(-rbf_t c) (rbf).
  """
  # A single exp per entry: pi- = e / S with e = exp(logit - max). Forming
  # log-softmax first and exponentiating it would cost a second pass over
  # the (possibly [N*V, Q]) matrix in both the forward and backward pass.
  logits = [-t_neg * cw if m is None else jnp.where(m, -t_neg * cw, _MASKED)
            for _, cw, m in parts]
  # The max only stabilises the exponent; pi- does not depend on it.
  top = jax.lax.stop_gradient(
      functools.reduce(jnp.maximum, [jnp.max(lg, axis=-1) for lg in logits]))
  num, den, wcw = 0., 0., 0.
  for (c, cw, _), lg in zip(parts, logits):
    e = jnp.exp(lg - top[..., None])               # masked entries: exactly 0
    val = c if cost == 'euclidean' else jnp.exp(-rbf_t * c)
    e_used = jax.lax.stop_gradient(e) if sg_neg else e
    num = num + jnp.sum(e_used * val, axis=-1)
    den = den + jnp.sum(e_used, axis=-1)
    # Entropy = log S + top - sum_j pi_j logit_j (a metric: no gradient).
    wcw = wcw + jax.lax.stop_gradient(jnp.sum(e * cw, axis=-1))
  den_v = jax.lax.stop_gradient(den)
  entropy = jnp.log(den_v) + top + t_neg * wcw / den_v
  return num / den, entropy


def _repulsion_in_batch(q, t_neg, cost, rbf_t, negatives, sg_neg):
  """L_CR and mean H(pi-) with in-batch negatives; q: [N, V, D] unit."""
  n, v, _ = q.shape
  if negatives == 'cross_view':
    a_idx, b_idx = np.triu_indices(v, 1)                     # pairs v < u
  else:
    a_idx = b_idx = np.arange(v)                             # u == v
  # Only the view pairs in use: [P, N, N], at most half of the [NV, NV]
  # matrix (a quarter for V = 2).
  c = 2. - 2. * jnp.einsum('ipd,jpd->pij', q[:, a_idx], q[:, b_idx])
  other = ~jnp.eye(n, dtype=bool)[None]                      # j != i
  per_row, entropy = _repulsion([(c, c, other)], t_neg, cost, rbf_t, sg_neg)
  if cost == 'euclidean':
    cr = -jnp.mean(per_row)
  else:
    cr = jnp.mean(jnp.log(jnp.mean(per_row, axis=-1)))       # per view pair
  return cr, jnp.mean(entropy)


def _repulsion_moco(q, queue, t_neg, cost, rbf_t, intra_batch, sg_neg,
                    sg_neg_queue):
  """L_CR and mean H(pi-) with queue (+ same-view in-batch) negatives."""
  n, _, _ = q.shape
  parts = []
  if queue is not None:
    # The queue holds past momentum keys: constants for this step.
    kq = jax.lax.stop_gradient(jnp.asarray(queue, jnp.float32))
    # Normalise the queue rows by scaling the product's columns: no
    # normalised [Q, D] copy of a possibly huge queue.
    inv_norm = jax.lax.rsqrt(jnp.maximum(jnp.sum(kq * kq, axis=-1), 1e-12))
    c_q = 2. - 2. * jnp.einsum('nvd,qd->nvq', q, kq) * inv_norm  # [N, V, Q]
    parts.append((c_q, jax.lax.stop_gradient(c_q) if sg_neg_queue else c_q,
                  None))
  if intra_batch:
    # Gradient flows into both q_i and q_j here (Algorithm 3).
    c_b = 2. - 2. * jnp.einsum('ivd,jvd->ivj', q, q)           # [N, V, N]
    parts.append((c_b, c_b, ~jnp.eye(n, dtype=bool)[:, None, :]))
  # The union of the two negative sets is normalised jointly without
  # concatenating them (a concatenated copy would duplicate [N, V, Q]).
  per_row, entropy = _repulsion(parts, t_neg, cost, rbf_t, sg_neg)
  if cost == 'euclidean':
    cr = -jnp.mean(per_row)
  else:
    cr = jnp.mean(jnp.log(jnp.mean(per_row, axis=0)))          # per view
  return cr, jnp.mean(entropy)


LOSSES = {'cacr': cacr}
