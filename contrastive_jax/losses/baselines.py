"""Baselines of the CACR and MACL papers: AU-CL, HN-CL and DCL."""

import functools
import math

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common

_MASKED = common.MASKED
_PAIR_BLOCK = 1024   # Rows per block in `uniformity`: memory is [block, N].


@functools.partial(jax.jit, static_argnames='alpha')
def alignment(z_a: jax.Array, z_b: jax.Array, alpha: float = 2.) -> jax.Array:
  """Mean ||f(x) - f(y)||^alpha over pairs (z_a[i], z_b[i]) (Wang & Isola).

  z_a, z_b: [N, D] (normalised here); alpha > 0 (2 in the paper). A float32
  scalar in [0, 2^alpha]; identical rows give 0 with a zero, not NaN, gradient.
  """
  d = common.l2_normalize(z_a) - common.l2_normalize(z_b)
  sq = jnp.sum(d * d, axis=-1)
  if alpha == 2:
    return jnp.mean(sq)
  nonzero = sq > 0
  safe = jnp.where(nonzero, sq, 1.)
  return jnp.mean(jnp.where(nonzero, safe ** (alpha / 2), 0.))


@jax.jit
def uniformity(z: jax.Array, t: float = 2.) -> jax.Array:
  """log mean_{i<j} exp(-t ||f_i - f_j||^2) (Wang & Isola 2020), exact.

  z: [N, D] (normalised here), N >= 2. A float32 scalar in [-4t, 0].
  """
  z = common.l2_normalize(z)
  n = z.shape[0]
  block = min(_PAIR_BLOCK, n)
  pad = -n % block
  rows = jnp.pad(z, ((0, pad), (0, 0))).reshape(-1, block, z.shape[1])
  starts = jnp.arange(rows.shape[0]) * block

  def block_lse(args):
    zb, start = args
    sq = jnp.maximum(2. - 2. * (zb @ z.T), 0.)               # [block, N]
    i = start + jnp.arange(block)[:, None]
    j = jnp.arange(n)[None, :]
    return jax.nn.logsumexp(jnp.where((i < j) & (i < n), -t * sq, -jnp.inf))

  lse = jax.nn.logsumexp(jax.lax.map(block_lse, (rows, starts)))
  return lse - jnp.log(n * (n - 1) / 2.)


def _nn_acc(sim, pos, self_mask):
  """Fraction of anchors whose most similar non-self embedding is a positive."""
  best = jnp.argmax(jnp.where(self_mask, _MASKED, sim), axis=-1)
  return jnp.mean(pos[jnp.arange(sim.shape[0]), best]).astype(jnp.float32)


@common.float32_matmuls
def align_uniform(z: jax.Array, *, alpha: float = 2., t: float = 2.,
                  uniform_weight: float = 1.) -> common.LossOutput:
  """Alignment + uniformity (Wang & Isola 2020, Sec. 4.1), "AU-CL".

  L = E ||f(x) - f(x+)||^alpha + uniform_weight log E e^{-t ||f(x) - f(y)||^2}
  on z [N >= 2, V >= 2, D]: the alignment over all view pairs, the uniformity
  within each view, averaged over views (the reference `SsnL/align_uniform`).
  """
  _, sim, pos, neg, self_mask = common.in_batch(z, 2)
  v = z.shape[1]
  align = jnp.mean(jnp.stack([alignment(z[:, a], z[:, b], alpha=alpha)
                              for a in range(v) for b in range(a + 1, v)]))
  uniform = jnp.mean(jnp.stack([uniformity(z[:, i], t) for i in range(v)]))
  metrics = {
      'align': align,
      'uniform': uniform,
      'pos_sim': common.masked_mean(sim, pos),
      'neg_sim': common.masked_mean(sim, neg),
      'acc': _nn_acc(sim, pos, self_mask),
  }
  return align + uniform_weight * uniform, metrics


@common.float32_matmuls
def hard_negative(z: jax.Array, *, temperature: float = 0.5, beta: float = 1.,
                  tau_plus: float = 0.1) -> common.LossOutput:
  """Hard-negative contrastive loss (Robinson et al. 2021), "HN-CL".

  L_ip = -log(e^{l_p} / (e^{l_p} + Ng)), l = cos / tau, with
  Ng = max((sum_n w_n e^{l_n} - tau_plus K e^{l_p}) / (1 - tau_plus),
  K e^{-1/tau}) and w_n = e^{beta l_n} / mean_n' e^{beta l_n'} over the
  K = (N-1) V negatives of z [N >= 2, V >= 2, D]; for V = 2 the reference
  `joshr17/HCL`. `clamp_frac`: the fraction of pairs where the floor binds.
  """
  common.check_temperature(temperature)
  if not 0. <= tau_plus < 1.:
    raise ValueError(f'tau_plus must be in [0, 1); got {tau_plus}.')
  zf, sim, pos, neg, self_mask = common.in_batch(z, 2)
  n, v, d = z.shape
  k = (n - 1) * v                                          # negatives/anchor
  sg = jax.lax.stop_gradient
  logits = sim / temperature                               # [M, M]
  # One shift, the largest negative logit, for both sums; non-negatives are
  # zeroed before the exp (their e^{(1+beta)(l - shift)} would overflow).
  shift = sg(jnp.max(jnp.where(neg, logits, _MASKED), -1, keepdims=True))
  centred = jnp.where(neg, logits - shift, 0.)
  e_beta = jnp.where(neg, jnp.exp(beta * centred), 0.)
  s_beta = jnp.sum(e_beta, -1, keepdims=True)
  s_hard = jnp.sum(jnp.where(neg, jnp.exp((1. + beta) * centred), 0.), -1,
                   keepdims=True)
  # log sum_n w_n e^{l_n} = log K + lse((1+beta) l) - lse(beta l).
  log_rw = (math.log(k) + shift + jnp.log(s_hard) - jnp.log(s_beta))
  # Per (anchor, positive) pair on the [N, V, V] logits; a view with itself
  # gets safe placeholder inputs (logit 0, no debiasing) under the mask.
  zv = zf.reshape(n, v, d)
  pos_logits = jnp.einsum('nad,nbd->nab', zv, zv) / temperature
  is_pos = ~jnp.eye(v, dtype=bool)                         # [V, V]
  pos_logits = jnp.where(is_pos, pos_logits, 0.)
  log_rw = log_rw.reshape(n, v, 1)
  if tau_plus > 0:
    x_pos = jnp.where(is_pos, math.log(tau_plus * k) + pos_logits, _MASKED)
  else:
    x_pos = jnp.full_like(pos_logits, _MASKED)             # no debiasing
  # The difference of exponentials after factoring out the larger (c); the
  # floor is compared and taken in log space.
  c = sg(jnp.maximum(log_rw, x_pos))                       # [N, V, V]
  diff = jnp.exp(log_rw - c) - jnp.exp(x_pos - c)
  log_floor = math.log(k) - 1. / temperature + math.log1p(-tau_plus)
  floor_scaled = jnp.exp(log_floor - c)
  above = diff > floor_scaled
  log_ng = (jnp.where(above, c + jnp.log(jnp.where(above, diff, 1.)),
                      log_floor) - math.log1p(-tau_plus))
  per_pair = jax.nn.softplus(log_ng - pos_logits)          # -log(p / (p + Ng))
  loss = jnp.sum(jnp.where(is_pos, per_pair, 0.)) / (n * v * (v - 1))
  metrics = {
      'pos_sim': common.masked_mean(sim, pos),
      'neg_sim': common.masked_mean(sim, neg),
      'acc': _nn_acc(sim, pos, self_mask),
      'neg_weight_max': jnp.mean(k / sg(s_beta)),          # max w_n = K / s
      'weighted_neg_sim': jnp.mean(
          jnp.sum(sg(e_beta * sim), -1, keepdims=True) / sg(s_beta)),
      'clamp_frac': common.masked_mean(
          ~above, jnp.broadcast_to(is_pos, above.shape)),
  }
  return loss, metrics


@common.float32_matmuls
def dcl(z: jax.Array, *, temperature: float = 0.1,
        layout: str = 'cross_view') -> common.LossOutput:
  """Decoupled contrastive loss (Yeh et al. 2021) on z [N >= 2, V >= 2, D].

  L_i = -l_ip + log sum_{n in N(i)} e^{l_in}, l = cos / tau: InfoNCE without
  the positive in the denominator, the mean over anchors (it can be < 0).
  'cross_view' (MACL's Eq. 1 and code): anchor z_i^a, positive z_i^b,
  negatives z_j^b, over ordered view pairs a != b. 'simclr': the other V (N-1)
  views as negatives, averaged over the anchor's positives.
  """
  common.check_temperature(temperature)
  common.check_choice('layout', layout, ('cross_view', 'simclr'))
  _, sim, pos, neg, self_mask = common.in_batch(z, 2)
  n, v, _ = z.shape
  if layout == 'simclr':
    logits = sim / temperature
    lse_neg = jax.nn.logsumexp(jnp.where(neg, logits, _MASKED), -1)
    n_pos = v - 1
    per_anchor = lse_neg - jnp.sum(jnp.where(pos, logits, 0.), -1) / n_pos
    max_neg = jnp.max(jnp.where(neg, logits, _MASKED), -1, keepdims=True)
    acc = jnp.sum(jnp.where(pos, logits > max_neg, False)) / (n * v * n_pos)
    metrics = {'pos_sim': common.masked_mean(sim, pos),
               'neg_sim': common.masked_mean(sim, neg)}
  else:
    zn = common.l2_normalize(z)
    s = common.pair_sims(
        zn, zn, [(a, b) for a in range(v) for b in range(v) if a != b])
    eye = jnp.eye(n, dtype=bool)
    neg_logits = jnp.where(eye, _MASKED, s / temperature)
    pos_logit = jnp.diagonal(s, axis1=1, axis2=2) / temperature
    per_anchor = jax.nn.logsumexp(neg_logits, -1) - pos_logit
    acc = jnp.mean(pos_logit > jnp.max(neg_logits, -1))
    metrics = {'pos_sim': jnp.mean(pos_logit) * temperature,
               'neg_sim': common.masked_mean(
                   s, jnp.broadcast_to(~eye, s.shape))}
  metrics['acc'] = jnp.asarray(acc, jnp.float32)
  return jnp.mean(per_anchor), metrics
