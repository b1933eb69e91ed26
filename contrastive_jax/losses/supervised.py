"""Supervised contrastive losses: SupCon (Khosla et al. 2020) and TCL.

Of the N*V embeddings, P(i) holds the others with anchor i's label (its other
views included), N(i) those with another label.
"""

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common

_MASKED = common.MASKED


def _label_batch(z, labels, *, supervised: bool):
  """Checks inputs; (cosines, P, N, self masks, |P(i)|, |N(i)|) over M = N*V.

  The [M, M] masks' counts [M] come from the sorted labels, in O(M log M).
  """
  common.check_views(z, 'z', min_views=1 if supervised else 2)
  n, v, _ = z.shape
  if supervised:
    if labels is None:
      raise ValueError(f'this loss is supervised: pass labels=... (int class '
                       f'ids of shape [{n}]).')
    if jnp.shape(labels) != (n,):
      raise ValueError(f'labels must have shape [{n}] (one id per instance); '
                       f'got shape {tuple(jnp.shape(labels))}.')
    if not jnp.issubdtype(jnp.asarray(labels).dtype, jnp.integer):
      raise ValueError(f'labels must be int class ids of shape [{n}]; got '
                       f'dtype {jnp.asarray(labels).dtype}.')
    y = jnp.repeat(jnp.asarray(labels), v)
  else:
    y = jnp.repeat(jnp.arange(n), v)                       # instance labels
  zf = common.l2_normalize(z).reshape(n * v, -1)
  sim = zf @ zf.T                                          # [M, M]
  self_mask = jnp.eye(n * v, dtype=bool)
  same = y[:, None] == y[None, :]
  y_sorted = jnp.sort(y)
  n_same = (jnp.searchsorted(y_sorted, y, side='right')
            - jnp.searchsorted(y_sorted, y, side='left'))  # |{j: y_j = y_i}|
  return (sim, same & ~self_mask, ~same, self_mask, n_same - 1,
          n * v - n_same)


def _base_metrics(sim, logits, pos, neg, n_pos):
  """pos_sim, neg_sim, acc, num_pos; `logits` has the self entries masked."""
  hit = pos[jnp.arange(sim.shape[0]), jnp.argmax(logits, -1)]
  return {
      'pos_sim': common.masked_mean(sim, pos),
      'neg_sim': common.masked_mean(sim, neg),
      'acc': common.masked_mean(hit, n_pos > 0),
      'num_pos': jnp.mean(n_pos).astype(jnp.float32),
  }


@common.float32_matmuls
def supcon(z: jax.Array, labels: jax.Array, *, temperature: float = 0.1,
           variant: str = 'out') -> common.LossOutput:
  """Supervised contrastive loss (Khosla et al. 2020), L_out or L_in.

  L_out,i = -1/|P(i)| sum_{p in P(i)} log(e^{s_ip} / sum_{a != i} e^{s_ia})
  (Eq. 2); L_in puts the mean over P(i) inside the log (Eq. 3); s = cos / tau;
  z [N, V, D], labels [N] int. The mean over anchors with a positive, as the
  SupContrast code, without its tau / 0.07 factor (`config.loss_scale`).
  """
  common.check_choice('variant', variant, ('out', 'in'))
  sim, pos, neg, self_mask, n_pos, n_neg = _label_batch(z, labels,
                                                        supervised=True)
  common.check_temperature(temperature)
  logits = jnp.where(self_mask, _MASKED, sim / temperature)
  lse_all = jax.nn.logsumexp(logits, axis=-1)
  if variant == 'out':
    mean_pos = (jnp.sum(jnp.where(pos, logits, 0.), -1)
                / jnp.maximum(n_pos, 1))
    per_anchor = lse_all - mean_pos
  else:
    lse_pos = jax.nn.logsumexp(jnp.where(pos, logits, _MASKED), axis=-1)
    per_anchor = lse_all - lse_pos + jnp.log(jnp.maximum(n_pos, 1))
  return (common.masked_mean(per_anchor, n_pos > 0),
          _base_metrics(sim, logits, pos, neg, n_pos))


@common.float32_matmuls
def tcl(z: jax.Array, labels: jax.Array | None = None, *,
        k1: float | None = None, k2: float | None = None,
        temperature: float | None = None) -> common.LossOutput:
  """Tuned Contrastive Learning (Animesh 2023, Eqs. 4.1-4.4).

  L_i = -1/|P(i)| sum_{p in P(i)} log(e^{s_ip / tau} / D_i), with
  D_i = sum_P e^{s_ip / tau} + k1 sum_P e^{-s_ip} + k2 sum_{N(i)} e^{s_in / tau}
  (s = cosine), the mean over anchors as in the official code. z [N, V, D]
  with labels [N] int, or V >= 2 and labels=None (instance labels). None
  takes the mode's default: k1, k2, tau = 5000, 1, 0.1 with labels; 1, 1.5,
  0.2 without. `pos_grad_coef`, `neg_grad_coef`: Lemma 2's coefficients.
  """
  supervised = labels is not None
  defaults = (5000., 1., 0.1) if supervised else (1., 1.5, 0.2)
  k1, k2, temperature = (d if x is None else x for x, d in
                         zip((k1, k2, temperature), defaults))
  if isinstance(k1, (int, float)) and k1 < 0:
    raise ValueError(f'k1 must be >= 0; got {k1}.')
  if isinstance(k2, (int, float)) and k2 <= 0:
    raise ValueError(f'k2 must be > 0; got {k2}.')
  common.check_temperature(temperature)
  sim, pos, neg, self_mask, n_pos, n_neg = _label_batch(
      z, labels, supervised=supervised)
  logits = sim / temperature
  # log D: the positives' and negatives' sums share e = e^{l - shift}
  # (the self entry -> -inf, so e_ii = 0 with a zero gradient); e^{-s} <= e.
  masked = jnp.where(self_mask, _MASKED, logits)
  shift = jax.lax.stop_gradient(jnp.max(masked, axis=-1, keepdims=True))
  e = jnp.exp(jnp.where(self_mask, -jnp.inf, logits - shift))   # [M, M]
  s_pos = jnp.sum(jnp.where(pos, e, 0.), axis=-1)
  s_neg = jnp.sum(jnp.where(neg, e, 0.), axis=-1)
  log_d = shift[:, 0] + jnp.log(s_pos + k2 * s_neg)
  use_k1 = not (isinstance(k1, (int, float)) and k1 == 0)
  if use_k1:
    e_k1 = jnp.where(pos, jnp.exp(-sim), 0.)                   # [M, M]
    tuned = k1 * jnp.sum(e_k1, axis=-1)
    log_tuned = jnp.where(n_pos > 0, jnp.log(jnp.where(n_pos > 0, tuned, 1.)),
                          -jnp.inf)
    log_d = jnp.logaddexp(log_d, log_tuned)                   # [M]
  mean_pos = jnp.sum(jnp.where(pos, logits, 0.), -1) / jnp.maximum(n_pos, 1)
  per_anchor = log_d - mean_pos

  metrics = _base_metrics(sim, masked, pos, neg, n_pos)
  # Lemma 2's coefficients (Eqs. 4.6-4.9) from the loss's exponentials:
  # P_ij = e_ij e^{shift_i - log D_i}, Y_ij = tau k1 e^{-s_ij - log D_i}.
  sg = jax.lax.stop_gradient
  log_d_c = sg(log_d)
  x = 1. / jnp.maximum(n_pos, 1)
  p_scale = jnp.exp(shift[:, 0] - log_d_c)
  p_t = sg(e) * p_scale[:, None]
  y_t = ((temperature * k1) * sg(e_k1) * jnp.exp(-log_d_c)[:, None]
         if use_k1 else 0.)
  pos_coef = jnp.sum(jnp.where(pos, jnp.abs(x[:, None] - p_t + y_t), 0.),
                     -1) * x
  neg_coef = k2 * sg(s_neg) * p_scale / jnp.maximum(n_neg, 1)
  metrics['pos_grad_coef'] = common.masked_mean(pos_coef, n_pos > 0)
  metrics['neg_grad_coef'] = common.masked_mean(neg_coef, n_neg > 0)
  return common.masked_mean(per_anchor, n_pos > 0), metrics
