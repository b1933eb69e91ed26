"""Instance discrimination: NT-Xent (SimCLR), InfoNCE (MoCo), InsDis, CMC."""

import math

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common

_MASKED = common.MASKED


@common.float32_matmuls
def ntxent(z: jax.Array, *, temperature: float = 0.1) -> common.LossOutput:
  """NT-Xent of SimCLR (Chen et al. 2020, Eq. 1) on z [N, V >= 2, D].

  L_i = -mean_{p in P(i)} log(e^{s_ip / tau} / sum_{a != i} e^{s_ia / tau}),
  the mean over the N*V anchors (SupCon's L_out with instance labels for
  V > 2). `acc`: the nearest non-self embedding is a positive.
  """
  _, sim, pos_mask, neg_mask, self_mask = common.in_batch(z)  # [NV, NV]
  common.check_temperature(temperature)
  n, v, _ = z.shape
  logits = jnp.where(self_mask, _MASKED, sim / temperature)
  lse = jax.nn.logsumexp(logits, axis=-1)
  mean_pos_logit = jnp.sum(jnp.where(pos_mask, logits, 0.), -1) / (v - 1)
  metrics = {
      'pos_sim': common.masked_mean(sim, pos_mask),
      'neg_sim': common.masked_mean(sim, neg_mask),
      'acc': jnp.mean(pos_mask[jnp.arange(n * v), jnp.argmax(logits, -1)]
                      ).astype(jnp.float32),
  }
  return jnp.mean(lse - mean_pos_logit), metrics


def _add_queue(lse, max_neg, anchors, queue, temperature, a_idx):
  """Merges queue logits into [P, N] `lse` and `max_neg`; also qlog [N, V, Q].

  The queue part of a denominator depends on the anchor's view alone (view
  a_idx[p] of pair p), so it is computed once per view.
  """
  n, v, d = anchors.shape
  qlog = common.queue_logits(anchors.reshape(n * v, d), queue, temperature)
  qlog = qlog.reshape(n, v, -1)
  return (jnp.logaddexp(lse, jax.nn.logsumexp(qlog, -1).T[a_idx]),
          jnp.maximum(max_neg, jnp.max(qlog, -1).T[a_idx]), qlog)


def _check_key_inputs(query, key, queue) -> None:
  common.check_views(query, 'query')
  common.check_views(key, 'key')
  common.check_same_dim(query, key, 'query', 'key')
  if jnp.shape(query)[0] != jnp.shape(key)[0]:
    raise ValueError(
        f'query and key must hold the same N instances; got shapes '
        f'{tuple(jnp.shape(query))} and {tuple(jnp.shape(key))}.')
  common.check_queue(queue, jnp.shape(query)[-1])


@common.float32_matmuls
def infonce(query: jax.Array, key: jax.Array, *,
            queue: jax.Array | None = None, temperature: float = 0.2,
            in_batch_negatives: bool = True) -> common.LossOutput:
  """InfoNCE with a key encoder: MoCo v1/v2 (He et al. 2020, Eq. 1) and v3.

  L = -log e^{q.k+ / tau} / (e^{q.k+ / tau} + sum_{k-} e^{q.k- / tau}),
  the mean over (view pair, instance) anchors; query [N, Vq, D], key
  [N, Vk, D] (no gradient), queue [Q, D] negatives (empty or None: in-batch
  InfoNCE). Vk = 1 pairs every query view with key view 0 (MoCo v1/v2);
  Vk = Vq pairs views a != b (MoCo v3, whose code returns 4 tau times this:
  `config.loss_scale`). `acc`: the positive beats every negative.
  """
  _check_key_inputs(query, key, queue)
  common.check_temperature(temperature)
  n, vq, d = query.shape
  vk = key.shape[1]
  if not (vk == 1 or vk == vq):
    raise ValueError(
        f'key must have 1 view or as many views as query ({vq}); got key shape '
        f'{tuple(key.shape)}.')
  use_queue = queue is not None and jnp.shape(queue)[0] > 0
  if not (in_batch_negatives or use_queue):
    raise ValueError('infonce has no negatives: pass a non-empty queue=[Q, '
                     f'{d}] or in_batch_negatives=True.')
  pairs = [(a, b) for a in range(vq) for b in range(vk) if vk == 1 or a != b]
  a_idx = jnp.array([p[0] for p in pairs])
  q = common.l2_normalize(query)                           # [N, Vq, D]
  k = common.l2_normalize(jax.lax.stop_gradient(key))      # EMA, not trained
  sim = common.pair_sims(q, k, pairs)                      # [P, N, N]
  eye = jnp.eye(n, dtype=bool)
  pos_sim = jnp.diagonal(sim, axis1=1, axis2=2)            # [P, N]
  pos_logit = pos_sim / temperature
  if in_batch_negatives:
    lse = jax.nn.logsumexp(sim / temperature, axis=-1)     # [P, N]
    max_neg = jnp.max(jnp.where(eye, _MASKED, sim / temperature), axis=-1)
    neg_sum = jnp.sum(jnp.where(eye, 0., sim))
    neg_count = len(pairs) * n * (n - 1)
  else:
    lse = pos_logit
    max_neg = jnp.full_like(pos_logit, _MASKED)
    neg_sum, neg_count = 0., 0
  if use_queue:
    lse, max_neg, qlog = _add_queue(lse, max_neg, q, queue, temperature, a_idx)
    neg_sum = neg_sum + jnp.sum(
        jnp.sum(qlog, axis=(0, 2))[a_idx]) * temperature
    neg_count = neg_count + len(pairs) * n * queue.shape[0]
  metrics = {
      'pos_sim': jnp.mean(pos_sim),
      'neg_sim': (neg_sum / max(neg_count, 1)) * jnp.ones((), jnp.float32),
      'acc': jnp.mean(pos_logit > max_neg).astype(jnp.float32),
  }
  return jnp.mean(lse - pos_logit), metrics


@common.float32_matmuls
def insdis(query: jax.Array, key: jax.Array, *, queue: jax.Array,
           num_data: int, temperature: float = 0.07,
           proximal_weight: float = 50.) -> common.LossOutput:
  """InsDis: instance discrimination with NCE (Wu et al. 2018, Secs. 3.2-3.3).

  J_i = -log h(i, v_i) - sum_{k=1..m} log(1 - h(j_k, v_jk))
        + proximal_weight ||f_i - v_i||^2,  h = P(i|v) / (P(i|v) + m / n),
  P(i|v) = e^{v.f / tau} / Z, Z estimated from the batch's noise rows; the
  batch mean. query [N, 1, D]: features f_i; key [N, 1, D]: their bank rows
  v_i; queue: noise rows, [N, m, D] per instance or [m, D] shared; num_data:
  n, the bank size. Metrics include `nce_z` (Z) and `h_pos` (mean h(i, v_i)).
  """
  common.check_views(query, 'query', min_views=1, max_views=1)
  common.check_views(key, 'key', min_views=1, max_views=1)
  if queue is None:
    raise ValueError('insdis needs noise rows: pass queue=[N, m, D] or '
                     '[m, D] sampled from the memory bank.')
  per_instance = jnp.ndim(queue) == 3
  _check_key_inputs(query, key, None)
  n, _, d = query.shape
  if not per_instance:
    common.check_queue(queue, d)
  elif tuple(jnp.shape(queue))[::2] != (n, d):
    raise ValueError(f'per-instance noise must have shape [{n}, m, {d}] '
                     f'(instances, samples, dim); got shape '
                     f'{tuple(jnp.shape(queue))}.')
  common.check_temperature(temperature)
  m = queue.shape[-2]
  if m < 1:
    raise ValueError(f'insdis needs at least one noise row; got queue shape '
                     f'{tuple(queue.shape)}.')
  if isinstance(num_data, (int, float)) and num_data < 1:
    raise ValueError(f'num_data must be >= 1; got {num_data}.')

  f = common.l2_normalize(query)[:, 0]                     # [N, D]
  v = common.l2_normalize(jax.lax.stop_gradient(key))[:, 0]  # stored rows
  s_pos = jnp.sum(f * v, axis=-1)                          # [N]
  if per_instance:
    noise, inv_norm = common.unit_queue(queue)
    noise_logit = (jnp.einsum('nd,nmd->nm', f, noise) * inv_norm
                   / temperature)                          # [N, m]
  else:
    noise_logit = common.queue_logits(f, queue, temperature)  # [N, m]
  log_z = jax.lax.stop_gradient(
      math.log(num_data) + jax.nn.logsumexp(noise_logit) - math.log(n * m))
  log_m_pn = math.log(m) - jnp.log(jnp.asarray(num_data, jnp.float32))
  a_pos = s_pos / temperature - log_z - log_m_pn
  a_noise = noise_logit - log_z - log_m_pn
  nce = jax.nn.softplus(-a_pos) + jnp.sum(jax.nn.softplus(a_noise), -1)
  proximal = jnp.sum(jnp.square(f - v), axis=-1)
  metrics = {
      'pos_sim': jnp.mean(s_pos),
      'neg_sim': jnp.mean(noise_logit) * temperature,
      'acc': jnp.mean(s_pos / temperature > jnp.max(noise_logit, -1)
                      ).astype(jnp.float32),
      'nce': jnp.mean(nce),
      'proximal': jnp.mean(proximal),
      'nce_z': jnp.exp(log_z).astype(jnp.float32),
      'h_pos': jnp.mean(jax.nn.sigmoid(a_pos)),
  }
  return jnp.mean(nce + proximal_weight * proximal), metrics


@common.float32_matmuls
def cmc(z: jax.Array, *, temperature: float = 0.07, graph: str = 'core',
        queue: jax.Array | None = None) -> common.LossOutput:
  """Contrastive Multiview Coding (Tian et al. 2019), z: [N, V >= 2, D].

  L(V_a, V_b) = L^{a,b} + L^{b,a}, L^{a,b} the mean over anchors z_i^a of
  -log softmax over view b (positive z_i^b, negatives z_j^b and the optional
  queue [Q, D]); graph 'core' sums L(V_0, V_j) over j >= 1, 'full' sums
  L(V_a, V_b) over a < b (Eq. 8), as the reference code's l_loss + ab_loss.
  """
  common.check_views(z, 'z', min_views=2)
  common.check_temperature(temperature)
  common.check_choice('graph', graph, ('core', 'full'))
  n, v, d = z.shape
  common.check_queue(queue, d)
  if graph == 'core':
    pairs = [(0, j) for j in range(1, v)]
  else:
    pairs = [(a, b) for a in range(v) for b in range(a + 1, v)]
  directed = pairs + [(b, a) for a, b in pairs]
  a_idx = jnp.array([p[0] for p in directed])
  zn = common.l2_normalize(z)                              # [N, V, D]
  sim = common.pair_sims(zn, zn, directed)                 # [P, N, N]
  eye = jnp.eye(n, dtype=bool)
  pos_sim = jnp.diagonal(sim, axis1=1, axis2=2)            # [P, N]
  pos_logit = pos_sim / temperature
  lse = jax.nn.logsumexp(sim / temperature, axis=-1)       # [P, N]
  max_neg = jnp.max(jnp.where(eye, _MASKED, sim / temperature), axis=-1)
  if queue is not None and jnp.shape(queue)[0] > 0:
    lse, max_neg, _ = _add_queue(lse, max_neg, zn, queue, temperature, a_idx)
  metrics = {
      'pos_sim': jnp.mean(pos_sim),
      'neg_sim': common.masked_mean(sim, jnp.broadcast_to(~eye, sim.shape)),
      'acc': jnp.mean(pos_logit > max_neg).astype(jnp.float32),
      'num_pairs': jnp.asarray(len(pairs), jnp.float32),
  }
  return jnp.sum(jnp.mean(lse - pos_logit, axis=-1)), metrics
