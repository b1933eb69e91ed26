"""Baseline objectives of the CACR and MACL papers: AU-CL, HN-CL and DCL.

* `align_uniform`: alignment + uniformity (Wang & Isola 2020), "AU-CL".
* `hard_negative`: debiased, hard-negative-reweighted InfoNCE (Robinson et al.
  2021, "HCL"), "HN-CL".
* `dcl`: decoupled contrastive learning (Yeh et al. 2021), the MACL baseline.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common
from contrastive_jax.losses import instance

_MASKED = instance._MASKED  # pylint: disable=protected-access
_masked_mean = instance._masked_mean  # pylint: disable=protected-access
# pylint: disable-next=protected-access
_check_temperature = instance._check_temperature


# Rows of the pairwise block in `uniformity`: bounds memory to [block, N].
_PAIR_BLOCK = 1024


@functools.partial(jax.jit, static_argnames='alpha')
def alignment(z_a: jax.Array, z_b: jax.Array, alpha: float = 2.) -> jax.Array:
  """Mean ||f(x) - f(y)||^alpha over positive pairs (Wang & Isola 2020).

  ||d||^alpha has an infinite derivative at d = 0 for alpha < 2 (and a
  0 * inf NaN through the square root); identical rows contribute 0 with a
  zero gradient instead.

  Args:
    z_a: [N, D] embeddings of one view (normalised here).
    z_b: [N, D] embeddings of the other view; row i pairs with z_a[i].
    alpha: exponent (the paper uses 2), > 0.

  Returns:
    Scalar float32: 0 for identical views, 2^alpha for antipodal ones.
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
  """log mean_{i<j} exp(-t ||f_i - f_j||^2) (Wang & Isola 2020).

  Computed as a log-sum-exp over blocks of rows, so memory is [block, N] and
  the result is exact (not sampled) for any N.

  Args:
    z: [N, D] embeddings (normalised here), N >= 2.
    t: the paper's t (2 by default).

  Returns:
    Scalar float32 in [-4t, 0]: 0 when all embeddings coincide.
  """
  z = common.l2_normalize(z)
  n = z.shape[0]
  block = min(_PAIR_BLOCK, n)
  pad = -n % block
  rows = jnp.pad(z, ((0, pad), (0, 0))).reshape(-1, block, z.shape[1])
  starts = jnp.arange(rows.shape[0]) * block

  def block_lse(args):
    zb, start = args
    # ||a - b||^2 = 2 - 2 a.b for unit vectors; clip the rounding below 0.
    sq = jnp.maximum(2. - 2. * (zb @ z.T), 0.)               # [block, N]
    i = start + jnp.arange(block)[:, None]
    j = jnp.arange(n)[None, :]
    logits = jnp.where((i < j) & (i < n), -t * sq, -jnp.inf)
    return jax.nn.logsumexp(logits)

  lse = jax.nn.logsumexp(jax.lax.map(block_lse, (rows, starts)))
  return lse - jnp.log(n * (n - 1) / 2.)


def _batch(z, min_instances: int = 2):
  """Unit rows [M, D], cosine matrix [M, M] and pos/neg/self masks, M = N*V."""
  common.check_views(z, 'z', min_views=2)
  n, v, _ = z.shape
  if n < min_instances:
    raise ValueError(f'z must hold at least {min_instances} instances (shape '
                     f'[N, V, D]); got shape {tuple(z.shape)}.')
  zf = instance._flat_unit(z)  # pylint: disable=protected-access
  sim = zf @ zf.T
  inst = instance._instance_ids(n, v)  # pylint: disable=protected-access
  self_mask = jnp.eye(n * v, dtype=bool)
  same = inst[:, None] == inst[None, :]
  return zf, sim, same & ~self_mask, ~same, self_mask


def _nn_acc(sim, pos, self_mask):
  """Fraction of anchors whose most similar non-self embedding is a positive."""
  best = jnp.argmax(jnp.where(self_mask, _MASKED, sim), axis=-1)
  return jnp.mean(pos[jnp.arange(sim.shape[0]), best]).astype(jnp.float32)


@common.float32_matmuls
def align_uniform(z: jax.Array, *, alpha: float = 2., t: float = 2.,
                  uniform_weight: float = 1.) -> common.LossOutput:
  """Alignment + uniformity (Wang & Isola 2020, Sec. 4.1), "AU-CL".

  The equations, as the CACR paper restates them for its AU-CL baseline:

    L_align(alpha) = E_{(x, x+)} ||f(x) - f(x+)||_2^alpha
    L_uniform(t)   = log E_{x, y iid} exp(-t ||f(x) - f(y)||_2^2)
    L = L_align + uniform_weight * L_uniform

  As in the reference code (`SsnL/align_uniform`, used by CACR): L_align is the
  mean over instances (and, for V > 2, over all view pairs a < b) and
  L_uniform is computed within each view over the N(N-1)/2 pairs i < j and
  averaged over views; for V = 2 that is align(z1, z2) + w * (uniform(z1) +
  uniform(z2)) / 2. CACR's small-scale AU-CL uses these defaults; its ImageNet
  runs use t = 3 and a 3:1 align:uniform weighting (pass uniform_weight=1/3
  and rescale, or weight outside). There is no temperature.

  Args:
    z: [N, V, D] embeddings, N >= 2, V >= 2.
    alpha: exponent of the alignment distance (alpha > 0).
    t: uniformity kernel scale (t > 0).
    uniform_weight: weight of L_uniform.

  Returns:
    (loss, metrics): scalar loss; metrics hold `align`, `uniform`, `pos_sim`,
    `neg_sim` and `acc` (nearest non-self embedding is another view).
  """
  _, sim, pos, neg, self_mask = _batch(z)
  v = z.shape[1]
  # The monitors' own terms (evaluators/diagnostics.py reads these): every
  # view pair a < b has N pairs, so the mean of the pairs' alignments is
  # the mean over all positive pairs.
  align = jnp.mean(jnp.stack([alignment(z[:, a], z[:, b], alpha=alpha)
                              for a in range(v) for b in range(a + 1, v)]))
  uniform = jnp.mean(jnp.stack([uniformity(z[:, i], t) for i in range(v)]))
  metrics = {
      'align': align,
      'uniform': uniform,
      'pos_sim': _masked_mean(sim, pos),
      'neg_sim': _masked_mean(sim, neg),
      'acc': _nn_acc(sim, pos, self_mask),
  }
  return align + uniform_weight * uniform, metrics


@common.float32_matmuls
def hard_negative(z: jax.Array, *, temperature: float = 0.5, beta: float = 1.,
                  tau_plus: float = 0.1) -> common.LossOutput:
  """Hard-negative contrastive loss (Robinson et al. 2021), "HN-CL".

  The equations as the CACR paper restates them for its HN-CL baseline,
  and the reference code.

  SimCLR layout: anchor i, positive p (another view of i), the K = (N-1) V
  views of other instances as negatives, l = cos / tau. The negatives' term is
  debiased (Chuang et al. 2020) and importance-weighted towards hard
  negatives, w_n = e^{beta l_n} / mean_{n'} e^{beta l_n'}:

    Ng = max( (sum_n w_n e^{l_n} - tau_plus K e^{l_p}) / (1 - tau_plus),
              K e^{-1/tau} )
    L_ip = -log( e^{l_p} / (e^{l_p} + Ng) )

  averaged over the positives of each anchor and over anchors; for V = 2 this
  is the reference `joshr17/HCL` code (2N anchors, 2N - 2 negatives). The
  importance weights are not detached (as in that code and in CACR's use).
  Everything is evaluated in log space (the code's e^{(1+beta) l} overflows
  float32 at small tau).

  Defaults are the CACR paper's (tau = 0.5, beta = 1) and HCL's class prior
  tau_plus = 0.1. With beta = 0, tau_plus = 0
  the floor never binds and, for V = 2, the loss is exactly NT-Xent.

  Args:
    z: [N, V, D] embeddings, N >= 2, V >= 2.
    temperature: tau.
    beta: hardness concentration (0 = uniform weights).
    tau_plus: class prior of the debiasing term, in [0, 1).

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim`, `acc`,
    `neg_weight_max` (mean over anchors of the largest importance weight w_n;
    1 = uniform, K = all mass on one negative), `weighted_neg_sim` (mean
    w-weighted negative cosine) and `clamp_frac` (fraction of terms where the
    K e^{-1/tau} floor is active).
  """
  _check_temperature(temperature)
  if not 0. <= tau_plus < 1.:
    raise ValueError(f'tau_plus must be in [0, 1); got {tau_plus}.')
  zf, sim, pos, neg, self_mask = _batch(z)
  n, v, d = z.shape
  k = (n - 1) * v                                          # negatives/anchor
  sg = jax.lax.stop_gradient
  logits = sim / temperature                               # [M, M]
  # The negatives' two log-sum-exps share one shift, the anchor's largest
  # negative logit (exact for any shift; exp <= 1), so that the [M, M]
  # matrix is read once for both sums: the loss's cost is the matmul's.
  shift = sg(jnp.max(jnp.where(neg, logits, _MASKED), -1, keepdims=True))
  # 0 in place of the non-negatives before the exp, not only after: their
  # logits exceed the shift (a view with itself: 1 / tau), where e^{(1+beta)
  # (l - shift)} overflows and its masked gradient would be 0 * inf = NaN.
  centred = jnp.where(neg, logits - shift, 0.)
  e_beta = jnp.where(neg, jnp.exp(beta * centred), 0.)
  s_beta = jnp.sum(e_beta, -1, keepdims=True)
  s_hard = jnp.sum(jnp.where(neg, jnp.exp((1. + beta) * centred), 0.), -1,
                   keepdims=True)
  # log sum_n w_n e^{l_n} = log K + lse((1+beta) l) - lse(beta l).
  log_rw = (math.log(k) + shift + jnp.log(s_hard) - jnp.log(s_beta))
  # Per (anchor, positive) pair, on the V x V logits of each instance only
  # ([N, V, V]; pair (a, b != a)): a difference of two exponentials,
  # evaluated after factoring out the larger one (c, a constant shift) so
  # neither overflows; the floor is compared and taken in log space.
  zv = zf.reshape(n, v, d)
  pos_logits = jnp.einsum('nad,nbd->nab', zv, zv) / temperature
  is_pos = ~jnp.eye(v, dtype=bool)                         # [V, V]
  # A view with itself is no pair: its terms get safe placeholder inputs
  # (logit 0, no debiasing), whose gradients stay finite under the mask.
  pos_logits = jnp.where(is_pos, pos_logits, 0.)
  log_rw = log_rw.reshape(n, v, 1)
  if tau_plus > 0:
    x_pos = jnp.where(is_pos, math.log(tau_plus * k) + pos_logits, _MASKED)
  else:
    x_pos = jnp.full_like(pos_logits, _MASKED)             # no debiasing
  c = sg(jnp.maximum(log_rw, x_pos))                       # [N, V, V]
  diff = jnp.exp(log_rw - c) - jnp.exp(x_pos - c)
  log_floor = math.log(k) - 1. / temperature + math.log1p(-tau_plus)
  floor_scaled = jnp.exp(log_floor - c)
  above = diff > floor_scaled
  log_ng = (jnp.where(above, c + jnp.log(jnp.where(above, diff, 1.)),
                      log_floor) - math.log1p(-tau_plus))
  per_pair = jax.nn.softplus(log_ng - pos_logits)          # -log(p / (p + Ng))
  loss = jnp.sum(jnp.where(is_pos, per_pair, 0.)) / (n * v * (v - 1))
  # Importance weights w_n = K e^{beta l_n} / sum_n' e^{beta l_n'}: the
  # largest is K / s_beta (its term is e^0 = 1).
  metrics = {
      'pos_sim': _masked_mean(sim, pos),
      'neg_sim': _masked_mean(sim, neg),
      'acc': _nn_acc(sim, pos, self_mask),
      'neg_weight_max': jnp.mean(k / sg(s_beta)),
      'weighted_neg_sim': jnp.mean(
          jnp.sum(sg(e_beta * sim), -1, keepdims=True) / sg(s_beta)),
      'clamp_frac': _masked_mean(~above, jnp.broadcast_to(is_pos, above.shape)),
  }
  return loss, metrics


@common.float32_matmuls
def dcl(z: jax.Array, *, temperature: float = 0.1,
        layout: str = 'cross_view') -> common.LossOutput:
  """Decoupled contrastive loss (Yeh et al. 2021), the MACL baseline.

  InfoNCE (MACL paper eq. 1) with the positive removed from the denominator
  (Yeh et al.'s decoupling, as the MACL paper compares with it): for
  anchor i, positive p and negative set N(i), with l = cos / tau,

    L_i = -l_ip + log sum_{n in N(i)} e^{l_in}.

  Negative sets (`layout`); a comparison with MACL uses one layout for every
  baseline:
    * 'cross_view' (default; MACL's Eq. 1/14 and released code): for each
      ordered view pair (a, b), a != b, anchor z[i, a], positive z[i, b],
      negatives z[j, b], j != i (K = N - 1). For V = 2 this is the symmetric
      N x N form: the mean of both directions.
    * 'simclr' (Yeh et al.'s SimCLR form): anchor z[i, a], each other view of
      i as a positive, all V (N - 1) views of other instances as negatives;
      averaged over the positives.
  The loss is the mean over anchors. It can be negative.

  Args:
    z: [N, V, D] embeddings, N >= 2, V >= 2.
    temperature: tau (MACL's tau_0 = 0.1).
    layout: 'cross_view' or 'simclr'.

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim`, `acc`
    (positive beats every negative of its anchor).
  """
  _check_temperature(temperature)
  if layout not in ('cross_view', 'simclr'):
    raise ValueError(
        f"layout must be 'cross_view' or 'simclr'; got {layout!r}.")
  _, sim, pos, neg, self_mask = _batch(z)
  n, v, _ = z.shape
  if layout == 'simclr':
    logits = sim / temperature
    lse_neg = jax.nn.logsumexp(jnp.where(neg, logits, _MASKED), -1)
    n_pos = v - 1
    per_anchor = lse_neg - jnp.sum(jnp.where(pos, logits, 0.), -1) / n_pos
    max_neg = jnp.max(jnp.where(neg, logits, _MASKED), -1, keepdims=True)
    acc = jnp.sum(jnp.where(pos, logits > max_neg, False)) / (n * v * n_pos)
    metrics = {'pos_sim': _masked_mean(sim, pos),
               'neg_sim': _masked_mean(sim, neg)}
  else:
    zn = common.l2_normalize(z)
    pairs = [(a, b) for a in range(v) for b in range(v) if a != b]
    a_idx = jnp.array([p[0] for p in pairs])
    b_idx = jnp.array([p[1] for p in pairs])
    s = jnp.einsum('npd,mpd->pnm', zn[:, a_idx], zn[:, b_idx])  # [P, N, N]
    eye = jnp.eye(n, dtype=bool)
    neg_logits = jnp.where(eye, _MASKED, s / temperature)
    pos_logit = jnp.diagonal(s, axis1=1, axis2=2) / temperature
    per_anchor = jax.nn.logsumexp(neg_logits, -1) - pos_logit
    acc = jnp.mean(pos_logit > jnp.max(neg_logits, -1))
    metrics = {'pos_sim': jnp.mean(pos_logit) * temperature,
               'neg_sim': _masked_mean(s, jnp.broadcast_to(~eye, s.shape))}
  metrics['acc'] = jnp.asarray(acc, jnp.float32)
  return jnp.mean(per_anchor), metrics


LOSSES = {
    'align_uniform': align_uniform,
    'hard_negative': hard_negative,
    'dcl': dcl,
}
