"""Instance discrimination: NT-Xent (SimCLR), InfoNCE (MoCo), InsDis, CMC.

Every instance is its own class: the views of one instance are positives and
everything else (other instances' views, a queue, memory-bank rows) is a
negative. The private helpers at the top are shared with `supervised.py` and
`baselines.py`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common

# Logit used for masked-out entries. A large finite value (rather than -inf)
# keeps a fully masked row finite (logsumexp = _MASKED + log(count)), so
# jnp.where never has to route a NaN/inf through its unselected branch, where
# it would poison the gradient; exp(_MASKED - max) is exactly 0 in float32.
_MASKED = -1e9


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of x over mask (0 when the mask is empty), as a float32 scalar."""
  total = jnp.sum(jnp.where(mask, x, 0.))
  return (total / jnp.maximum(jnp.sum(mask), 1)).astype(jnp.float32)


def _flat_unit(z: jax.Array) -> jax.Array:
  """[N, V, D] -> [N*V, D] unit rows in float32, instance-major (row i*V+v)."""
  n, v, d = z.shape
  return common.l2_normalize(z).reshape(n * v, d)


def _instance_ids(n: int, v: int) -> jax.Array:
  """Instance id of each row of `_flat_unit` output: [N*V]."""
  return jnp.repeat(jnp.arange(n), v)


def _queue_logits(anchors: jax.Array, queue: jax.Array,
                  temperature: float) -> jax.Array:
  """Cosine logits of unit `anchors` [A, D] against raw `queue` rows [Q, D].

  The queue is normalised by scaling the [A, Q] product's columns with the
  rows' inverse norms instead of building a normalised [Q, D] copy: a MoCo
  queue or memory bank can be far larger than the batch.
  """
  # No gradient may reach the queue: it holds keys of past batches (MoCo) or
  # memory-bank rows, neither of which is a function of the current
  # parameters; differentiating through them would be wrong and wasteful.
  queue = jax.lax.stop_gradient(jnp.asarray(queue, jnp.float32))
  inv_norm = jax.lax.rsqrt(jnp.maximum(jnp.sum(queue * queue, axis=-1), 1e-12))
  return (anchors @ queue.T) * (inv_norm / temperature)[None, :]


def _has_queue(queue) -> bool:
  return queue is not None and jnp.shape(queue)[0] > 0


def _check_temperature(temperature) -> None:
  if isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f'temperature must be > 0; got {temperature}.')


@common.float32_matmuls
def ntxent(z: jax.Array, *, temperature: float = 0.1) -> common.LossOutput:
  """NT-Xent of SimCLR (Chen et al. 2020, eq. 1), generalised to V >= 2 views.

  Each of the N*V embeddings is an anchor; every other view of the same
  instance is a positive and the other N*V - V embeddings are negatives. With
  V = 2 this is SimCLR's loss averaged over all 2N anchors. For V > 2 the
  per-anchor loss is the mean over its V - 1 positives of -log softmax(positive)
  over the non-self similarities (SupCon's L_out, eq. 2, with instance labels).

  Args:
    z: [N, V, D] embeddings (any float dtype; normalised here), V >= 2.
    temperature: softmax temperature tau.

  Returns:
    (loss, metrics): scalar mean loss over the N*V anchors; metrics hold
    `pos_sim`, `neg_sim` (mean cosine similarity) and `acc` (fraction of
    anchors whose most similar non-self embedding is a positive).
  """
  common.check_views(z, 'z', min_views=2)
  _check_temperature(temperature)
  n, v, _ = z.shape
  zf = _flat_unit(z)
  sim = zf @ zf.T                                          # [NV, NV]
  inst = _instance_ids(n, v)
  self_mask = jnp.eye(n * v, dtype=bool)
  pos_mask = (inst[:, None] == inst[None, :]) & ~self_mask
  neg_mask = ~pos_mask & ~self_mask
  logits = jnp.where(self_mask, _MASKED, sim / temperature)
  # -log softmax(p) = lse_i - s_ip / tau; averaging the positive logits first
  # avoids materialising a second [NV, NV] log-prob matrix.
  lse = jax.nn.logsumexp(logits, axis=-1)
  mean_pos_logit = jnp.sum(jnp.where(pos_mask, logits, 0.), -1) / (v - 1)
  per_anchor = lse - mean_pos_logit
  metrics = {
      'pos_sim': _masked_mean(sim, pos_mask),
      'neg_sim': _masked_mean(sim, neg_mask),
      'acc': jnp.mean(pos_mask[jnp.arange(n * v), jnp.argmax(logits, -1)]
                      ).astype(jnp.float32),
  }
  return jnp.mean(per_anchor), metrics


def _check_key_inputs(query, key, queue) -> None:
  common.check_views(query, 'query')
  common.check_views(key, 'key')
  common.check_same_dim(query, key, 'query', 'key')
  if jnp.shape(query)[0] != jnp.shape(key)[0]:
    raise ValueError(
        f'query and key must hold the same N instances; got shapes '
        f'{tuple(jnp.shape(query))} and {tuple(jnp.shape(key))}.')
  if queue is not None:
    common.check_queue(queue, jnp.shape(query)[-1])


@common.float32_matmuls
def infonce(query: jax.Array, key: jax.Array, *,
            queue: jax.Array | None = None, temperature: float = 0.2,
            in_batch_negatives: bool = True) -> common.LossOutput:
  """InfoNCE with a key encoder: MoCo v1/v2 (He et al. 2020, eq. 1) and v3.

  Each query view a of instance i is contrasted against key view b of the same
  instance (the positive) and against negatives: the queue rows and, if
  `in_batch_negatives`, key view b of the other N - 1 instances:

    L = -log exp(q.k+ / tau) / (exp(q.k+ / tau) + sum_neg exp(q.k- / tau)).

  Positive pairs (a, b):
    * Vk = 1: every query view with key view 0. Vq = Vk = 1 is MoCo v1/v2
      (which uses only queue negatives: pass in_batch_negatives=False).
    * Vq = Vk = V >= 2: every ordered pair a != b. V = 2 is MoCo v3's
      symmetric ctr(q1, k2) + ctr(q2, k1) with in-batch negatives and no
      queue (Chen et al. 2021, Alg. 1).
  The loss is the mean over all (pair, instance) anchors. MoCo v3's code
  returns the sum of its two directions times 2 * tau, i.e. 4 * tau * this
  value: `config.loss_scale` applies that factor in the train step.

  An empty queue ([0, D]) or None gives in-batch InfoNCE. The queue logits are
  computed as a separate [N*Vq, Q] product and merged through logaddexp, so
  the queue is never concatenated with the batch logits.

  Args:
    query: [N, Vq, D] query-encoder embeddings (gradients flow here).
    key: [N, Vk, D] key (momentum) encoder embeddings; Vk = 1 or Vk = Vq.
    queue: optional [Q, D] negatives (past keys); never receives gradients.
    temperature: softmax temperature tau (0.2 for MoCo v2; MoCo v1 used 0.07).
    in_batch_negatives: also use the other instances' keys as negatives.

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim` (mean
    cosine over the negatives used), `acc` (positive beats every negative).
  """
  _check_key_inputs(query, key, queue)
  _check_temperature(temperature)
  n, vq, d = query.shape
  vk = key.shape[1]
  if not (vk == 1 or vk == vq):
    raise ValueError(
        f'key must have 1 view or as many views as query ({vq}); got key shape '
        f'{tuple(key.shape)}.')
  use_queue = _has_queue(queue)
  if not (in_batch_negatives or use_queue):
    raise ValueError('infonce has no negatives: pass a non-empty queue=[Q, '
                     f'{d}] or in_batch_negatives=True.')
  pairs = [(a, b) for a in range(vq) for b in range(vk) if vk == 1 or a != b]
  a_idx = jnp.array([p[0] for p in pairs])
  b_idx = jnp.array([p[1] for p in pairs])

  q = common.l2_normalize(query)                           # [N, Vq, D]
  # Keys come from the momentum encoder, which is updated by an EMA of the
  # query encoder, not by backprop: MoCo blocks their gradient explicitly.
  k = common.l2_normalize(jax.lax.stop_gradient(key))      # [N, Vk, D]
  # Only the P needed [N, N] blocks are formed (gathering the [N, P, D] views
  # is cheap), not the full [N*Vq, N*Vk] similarity matrix.
  sim = jnp.einsum('npd,mpd->pnm', q[:, a_idx], k[:, b_idx])  # [P, N, N]
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
    qlog = _queue_logits(q.reshape(n * vq, d), queue, temperature)
    qlog = qlog.reshape(n, vq, -1)                         # [N, Vq, Q]
    # Per query view, then gathered per pair: the queue part of an anchor's
    # denominator does not depend on which key view is its positive.
    lse = jnp.logaddexp(lse, jax.nn.logsumexp(qlog, -1).T[a_idx])
    max_neg = jnp.maximum(max_neg, jnp.max(qlog, -1).T[a_idx])
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
           nce_z: float | jax.Array | None = None,
           proximal_weight: float = 50.) -> common.LossOutput:
  """InsDis: non-parametric instance discrimination with NCE (Wu et al. 2018).

  The non-parametric softmax P(i|f) = exp(v_i.f / tau) / Z over all
  `num_data` memory-bank rows (Wu et al. 2018, Sec. 3.1) is replaced by
  noise-contrastive estimation against m = Q bank rows drawn uniformly,
  P_n = 1 / num_data. With h(i, v) = P(i|v) / (P(i|v) + m P_n), the
  per-instance objective (J_NCE with the proximal term, Wu et al.
  Secs. 3.2-3.3) is

    J_i = -log h(i, v_i) - sum_{k=1..m} log(1 - h(j_k, v_jk))
          + proximal_weight * ||f_i - v_i||^2,

  where f_i = query[i] is the current feature v_i^{(t)} and v_i = key[i] its
  memory-bank row v_i^{(t-1)}. (The m * E_Pn expectation over noise becomes
  the sum over the m sampled rows, as in the released code.) With the logit
  a = v.f / tau - log Z - log(m P_n), log h = log sigmoid(a) and
  log(1 - h) = log sigmoid(-a); both are evaluated with softplus, so no
  probability is ever formed. The loss is the batch mean.

  Normalising constant Z: the paper approximates Z_i ~ (n/m) sum_k
  exp(v_jk.f_i / tau) by Monte Carlo, and its released code fixes Z after the
  first batch. Here, with `nce_z=None`, Z is the Monte-Carlo estimate pooled
  over the whole batch: Z = num_data * mean over the N x m noise logits of
  exp(logit), computed in log space and under stop_gradient (Z is treated as
  a constant, not as a path for gradients). It is returned as
  `metrics['nce_z']`, so a train step can store the first step's value and
  pass it back as `nce_z` to reproduce the paper's fixed Z.

  Args:
    query: [N, 1, D] current embeddings f_i (gradients flow here).
    key: [N, 1, D] memory-bank rows of the same N instances (the positives).
    queue: noise rows sampled uniformly from the memory bank, either
      [N, m, D] (m rows per instance, drawn independently for each: the
      reference lemniscate code's NCEAverage) or [m, D] (one set shared by
      the batch). m >= 1; the paper uses m = 4096. No gradient reaches key
      or queue.
    num_data: n, the number of instances in the data set (the bank size).
    temperature: tau (0.07 in the paper).
    nce_z: optional fixed normalising constant Z > 0; None estimates it from
      the batch as described above.
    proximal_weight: lambda of the proximal regulariser lambda *
      ||v_i^{(t)} - v_i^{(t-1)}||^2 (squared, as in the paper). The default
      50 is not verified against the paper's text; the released lemniscate
      code has no proximal term, and configs/papers/insdis.py passes 0 to
      match it.

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim`, `acc`
    (positive logit beats every noise logit), `nce` (the NCE part),
    `proximal` (mean ||f_i - v_i||^2), `nce_z` (the Z used) and `h_pos` (mean
    posterior h of the positives).
  """
  common.check_views(query, 'query', min_views=1, max_views=1)
  common.check_views(key, 'key', min_views=1, max_views=1)
  if queue is None:
    raise ValueError('insdis needs noise rows: pass queue=[N, m, D] or '
                     '[m, D] sampled from the memory bank.')
  per_instance = jnp.ndim(queue) == 3
  _check_key_inputs(query, key, None)
  n, _, d = query.shape
  if per_instance:
    if tuple(jnp.shape(queue))[::2] != (n, d):
      raise ValueError(f'per-instance noise must have shape [{n}, m, {d}] '
                       f'(instances, samples, dim); got shape '
                       f'{tuple(jnp.shape(queue))}.')
  else:
    common.check_queue(queue, d)
  _check_temperature(temperature)
  m = queue.shape[-2]
  if m < 1:
    raise ValueError(f'insdis needs at least one noise row; got queue shape '
                     f'{tuple(queue.shape)}.')
  if isinstance(num_data, (int, float)) and num_data < 1:
    raise ValueError(f'num_data must be >= 1; got {num_data}.')

  f = common.l2_normalize(query)[:, 0]                     # [N, D]
  # The bank row is last epoch's feature, a stored constant: no gradient.
  v = common.l2_normalize(jax.lax.stop_gradient(key))[:, 0]
  s_pos = jnp.sum(f * v, axis=-1)                          # [N]
  if per_instance:
    # Same normalisation as `_queue_logits`, row by row of each instance's
    # own [m, D] noise: no gradient reaches the bank rows.
    noise = jax.lax.stop_gradient(jnp.asarray(queue, jnp.float32))
    inv_norm = jax.lax.rsqrt(jnp.maximum(jnp.sum(noise * noise, -1), 1e-12))
    noise_logit = (jnp.einsum('nd,nmd->nm', f, noise) * inv_norm
                   / temperature)                          # [N, m]
  else:
    noise_logit = _queue_logits(f, queue, temperature)     # [N, m]
  if nce_z is None:
    log_z = (math.log(num_data) + jax.nn.logsumexp(noise_logit)
             - math.log(n * m))
    log_z = jax.lax.stop_gradient(log_z)
  else:
    log_z = jnp.log(jnp.asarray(nce_z, jnp.float32))
  log_m_pn = math.log(m) - jnp.log(jnp.asarray(num_data, jnp.float32))
  a_pos = s_pos / temperature - log_z - log_m_pn
  a_noise = noise_logit - log_z - log_m_pn
  nce = jax.nn.softplus(-a_pos) + jnp.sum(jax.nn.softplus(a_noise), -1)
  proximal = jnp.sum(jnp.square(f - v), axis=-1)
  per_instance = nce + proximal_weight * proximal
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
  return jnp.mean(per_instance), metrics


@common.float32_matmuls
def cmc(z: jax.Array, *, temperature: float = 0.07, graph: str = 'core',
        queue: jax.Array | None = None) -> common.LossOutput:
  """Contrastive Multiview Coding (Tian et al. 2019, Sec. 3).

  For two views V_a, V_b, L(V_a, V_b) = L_contrast^{a,b} + L_contrast^{b,a}
  (the paper's two-view objective), where L_contrast^{a,b} fixes view a of each instance as the
  anchor and enumerates view b: the same instance's view b is the positive,
  view b of the other N - 1 instances (and every queue row, if given) are the
  negatives (a (K+1)-way softmax with h = exp(cos / tau)). Each
  directional term is a mean over the N anchors.

  With V views (the paper's "Contrastive Learning with More than Two Views"):
    * graph='core': L_C = sum_{j>=1} L(V_0, V_j), view 0 is the core view;
    * graph='full': L_F = sum_{a<b} L(V_a, V_b) (the CMC paper's eq. 8, the
      form the CACR paper's CMC baseline uses).
  The pair terms are summed, as in the paper (and its code's l_loss + ab_loss),
  so the loss scales with the number of pairs. For V = 2 both graphs agree.

  Negatives: in-batch (same view as the positive, other instances); an
  optional `queue` of [Q, D] rows (e.g. a memory bank sample, as in CMC's own
  implementation) is shared by every direction and receives no gradient.

  Args:
    z: [N, V, D] embeddings, V >= 2 (view v may come from its own encoder).
    temperature: tau (0.07 in CMC).
    graph: 'core' or 'full'.
    queue: optional [Q, D] extra negatives.

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim`, `acc`
    (mean over directions) and `num_pairs` (view pairs in the graph).
  """
  common.check_views(z, 'z', min_views=2)
  _check_temperature(temperature)
  if graph not in ('core', 'full'):
    raise ValueError(f"graph must be 'core' or 'full'; got {graph!r}.")
  n, v, d = z.shape
  if queue is not None:
    common.check_queue(queue, d)
  if graph == 'core':
    pairs = [(0, j) for j in range(1, v)]
  else:
    pairs = [(a, b) for a in range(v) for b in range(a + 1, v)]
  directed = pairs + [(b, a) for a, b in pairs]
  a_idx = jnp.array([p[0] for p in directed])
  b_idx = jnp.array([p[1] for p in directed])

  zn = common.l2_normalize(z)                              # [N, V, D]
  sim = jnp.einsum('npd,mpd->pnm', zn[:, a_idx], zn[:, b_idx])  # [P, N, N]
  eye = jnp.eye(n, dtype=bool)
  pos_sim = jnp.diagonal(sim, axis1=1, axis2=2)            # [P, N]
  pos_logit = pos_sim / temperature
  lse = jax.nn.logsumexp(sim / temperature, axis=-1)       # [P, N]
  max_neg = jnp.max(jnp.where(eye, _MASKED, sim / temperature), axis=-1)
  if _has_queue(queue):
    qlog = _queue_logits(zn.reshape(n * v, d), queue, temperature)
    qlog = qlog.reshape(n, v, -1)                          # [N, V, Q]
    lse = jnp.logaddexp(lse, jax.nn.logsumexp(qlog, -1).T[a_idx])
    max_neg = jnp.maximum(max_neg, jnp.max(qlog, -1).T[a_idx])
  per_direction = jnp.mean(lse - pos_logit, axis=-1)       # [P]
  metrics = {
      'pos_sim': jnp.mean(pos_sim),
      'neg_sim': _masked_mean(sim, jnp.broadcast_to(~eye, sim.shape)),
      'acc': jnp.mean(pos_logit > max_neg).astype(jnp.float32),
      'num_pairs': jnp.asarray(len(pairs), jnp.float32),
  }
  return jnp.sum(per_direction), metrics


LOSSES = {'ntxent': ntxent, 'infonce': infonce, 'insdis': insdis, 'cmc': cmc}
