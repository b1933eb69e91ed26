"""Supervised contrastive losses: SupCon (Khosla et al. 2020) and TCL.

Both use the multi-positive batch of SupCon: the N*V embeddings of `z` are the
anchors I; P(i) holds the other embeddings with anchor i's label (including
i's other views), N(i) those with a different label, A(i) = I \\ {i}. With
instance labels (each instance its own class) both reduce to NT-Xent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common
from contrastive_jax.losses import instance

_MASKED = instance._MASKED  # pylint: disable=protected-access
_masked_mean = instance._masked_mean  # pylint: disable=protected-access


def _label_batch(z, labels, *, supervised: bool):
  """Validates inputs; returns the batch's similarities, masks and counts.

  Returns (sim, pos, neg, self_mask, n_pos, n_neg): sim [M, M] cosines of the
  M = N*V flattened embeddings; pos, neg, self_mask [M, M] bool masks of P(i),
  N(i) and {i}; n_pos = |P(i)|, n_neg = |N(i)| [M] int32. The counts come
  from the sorted labels (O(M log M)) rather than from summing the [M, M]
  masks: on CPU each masked count is a full pass over M^2 entries.
  """
  common.check_views(z, 'z', min_views=1 if supervised else 2)
  n, v, _ = z.shape
  if supervised:
    common.check_labels(labels, n)
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


def _reduce(per_anchor: jax.Array, n_pos: jax.Array) -> jax.Array:
  """Mean over anchors that have at least one positive.

  An anchor without positives (V = 1 and a class seen once in the batch) has
  an undefined loss; it is left out of the mean instead of producing NaN.
  """
  valid = n_pos > 0
  return (jnp.sum(jnp.where(valid, per_anchor, 0.))
          / jnp.maximum(jnp.sum(valid), 1)).astype(jnp.float32)


def _mean_over(x: jax.Array, mask: jax.Array, counts: jax.Array) -> jax.Array:
  """Mean of x [M, M] over mask, given the mask's row counts [M] (float32)."""
  return (jnp.sum(jnp.where(mask, x, 0.))
          / jnp.maximum(jnp.sum(counts), 1)).astype(jnp.float32)


def _base_metrics(sim, logits, pos, neg, n_pos, n_neg):
  """pos_sim, neg_sim, acc, num_pos; `logits` has the self entries masked."""
  m = sim.shape[0]
  has_pos = n_pos > 0
  hit = pos[jnp.arange(m), jnp.argmax(logits, -1)]
  return {
      'pos_sim': _mean_over(sim, pos, n_pos),
      'neg_sim': _mean_over(sim, neg, n_neg),
      'acc': _masked_mean(hit, has_pos),
      'num_pos': jnp.mean(n_pos).astype(jnp.float32),
  }


@common.float32_matmuls
def supcon(z: jax.Array, labels: jax.Array, *, temperature: float = 0.1,
           variant: str = 'out') -> common.LossOutput:
  """Supervised contrastive loss (Khosla et al. 2020), L_out or L_in.

  With P(i), A(i) as in the module docstring and s = cos / tau:

    L_out,i = -1/|P(i)| sum_{p in P(i)} log( e^{s_ip} / sum_{a in A(i)}
              e^{s_ia} )                                         (eq. 2)
    L_in,i  = -log( 1/|P(i)| sum_{p in P(i)} e^{s_ip} / sum_{a in A(i)}
              e^{s_ia} )                                         (eq. 3)

  The loss is the mean over anchors (the paper writes a sum; the reference
  code and TCL's code take the mean). SupContrast's extra tau / 0.07 factor is
  not applied here (TCL's code drops it too); `config.loss_scale` applies it
  in the train step (configs/papers/supcon.py).
  L_in <= L_out by Jensen. With instance labels and V = 2, L_out is NT-Xent.
  Anchors without any positive (V = 1, singleton class) are excluded.

  Args:
    z: [N, V, D] embeddings, V >= 1.
    labels: [N] int class ids.
    temperature: tau (0.1 as in SupCon's CIFAR runs and TCL).
    variant: 'out' (eq. 2, recommended by the paper) or 'in' (eq. 3).

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim`, `acc`
    (nearest non-self embedding shares the label) and `num_pos` (mean |P(i)|).
  """
  if variant not in ('out', 'in'):
    raise ValueError(f"variant must be 'out' or 'in'; got {variant!r}.")
  sim, pos, neg, self_mask, n_pos, n_neg = _label_batch(z, labels,
                                                        supervised=True)
  instance._check_temperature(temperature)  # pylint: disable=protected-access
  logits = jnp.where(self_mask, _MASKED, sim / temperature)
  lse_all = jax.nn.logsumexp(logits, axis=-1)
  if variant == 'out':
    mean_pos = (jnp.sum(jnp.where(pos, logits, 0.), -1)
                / jnp.maximum(n_pos, 1))
    per_anchor = lse_all - mean_pos
  else:
    lse_pos = jax.nn.logsumexp(jnp.where(pos, logits, _MASKED), axis=-1)
    per_anchor = lse_all - lse_pos + jnp.log(jnp.maximum(n_pos, 1))
  return _reduce(per_anchor, n_pos), _base_metrics(sim, logits, pos, neg,
                                                   n_pos, n_neg)


@common.float32_matmuls
def tcl(z: jax.Array, labels: jax.Array | None = None, *,
        k1: float | None = None, k2: float | None = None,
        temperature: float | None = None) -> common.LossOutput:
  """Tuned Contrastive Learning (Animesh 2023, eqs. 4.1-4.4).

  SupCon L_out with two extra terms in the denominator (s = cosine):

    L_i = -1/|P(i)| sum_{p in P(i)} log( e^{s_ip / tau} / D_i )
    D_i = sum_{p in P(i)} e^{s_ip / tau} + k1 sum_{p in P(i)} e^{-s_ip}
          + k2 sum_{n in N(i)} e^{s_in / tau}

  The k1 term has no temperature (eq. 4.3; confirmed by eq. 4.8 and the
  official code). Evaluated stably as log D_i - mean_p s_ip / tau with log D_i
  a logsumexp over the three groups. Mean over anchors (the official code; the
  thesis writes a sum). k1 = 0, k2 = 1 gives exactly SupCon L_out; with
  additionally V = 2 and labels=None, NT-Xent. k1 = k2 = 0 is *not* SupCon
  (the negatives vanish). The thesis requires k1, k2 >= 1; any k1 >= 0,
  k2 > 0 is accepted so that the reductions can be used.

  Defaults depend on the mode (the thesis's settings):

    | mode                         | k1   | k2  | tau |
    | supervised (labels given)    | 5000 | 1   | 0.1 |
    | self-supervised (labels=None)| 1    | 1.5 | 0.2 |

  (the self-supervised tau is not stated in the thesis; 0.2 is solo-learn's
  SimCLR value, the note's recommendation). Self-supervised TCL uses V = 3
  views ("positive triplets") and instance labels.

  Args:
    z: [N, V, D] embeddings; V >= 1 with labels, V >= 2 without.
    labels: [N] int class ids, or None for self-supervised TCL.
    k1: weight of the positives' e^{-s} term (None: mode default).
    k2: weight of the negatives' sum (None: mode default).
    temperature: tau (None: mode default).

  Returns:
    (loss, metrics): scalar loss; metrics hold `pos_sim`, `neg_sim`, `acc`,
    `num_pos`, and the thesis's gradient diagnostics (Sec. 3.4, Figs. 5.5 and
    5.7): `pos_grad_coef`, the batch mean of the per-anchor mean of
    |X_ip - P_ip + Y_ip| over positives, and `neg_grad_coef`, the batch mean of
    the per-anchor mean of P_in over negatives.
  """
  supervised = labels is not None
  if k1 is None:
    k1 = 5000. if supervised else 1.
  if k2 is None:
    k2 = 1. if supervised else 1.5
  if temperature is None:
    temperature = 0.1 if supervised else 0.2
  if isinstance(k1, (int, float)) and k1 < 0:
    raise ValueError(f'k1 must be >= 0; got {k1}.')
  if isinstance(k2, (int, float)) and k2 <= 0:
    raise ValueError(f'k2 must be > 0; got {k2}.')
  instance._check_temperature(temperature)  # pylint: disable=protected-access
  sim, pos, neg, self_mask, n_pos, n_neg = _label_batch(
      z, labels, supervised=supervised)
  logits = sim / temperature
  # log D = log(sum_pos e^l + k2 sum_neg e^l + k1 sum_pos e^{-s}). The first
  # two sums share e = e^{l - shift}, shifted by the row's largest non-self
  # logit (their sum is then >= min(1, k2) > 0); the self entry goes to -inf
  # before the exp, so e_ii = 0 with a zero (not NaN) gradient. e^{-s} <= e
  # needs no shift. pos | neg is every non-self entry.
  shift = jax.lax.stop_gradient(jnp.max(
      jnp.where(self_mask, _MASKED, logits), axis=-1, keepdims=True))
  e = jnp.exp(jnp.where(self_mask, -jnp.inf, logits - shift))   # [M, M]
  s_pos = jnp.sum(jnp.where(pos, e, 0.), axis=-1)
  s_neg = jnp.sum(jnp.where(neg, e, 0.), axis=-1)
  log_d = shift[:, 0] + jnp.log(s_pos + k2 * s_neg)
  use_k1 = not (isinstance(k1, (int, float)) and k1 == 0)
  if use_k1:
    e_k1 = jnp.where(pos, jnp.exp(-sim), 0.)                   # [M, M]
    tuned = k1 * jnp.sum(e_k1, axis=-1)
    # No positives (an excluded anchor): e^-inf = 0, not log 0.
    log_tuned = jnp.where(n_pos > 0, jnp.log(jnp.where(n_pos > 0, tuned, 1.)),
                          -jnp.inf)
    log_d = jnp.logaddexp(log_d, log_tuned)                   # [M]
  mean_pos = jnp.sum(jnp.where(pos, logits, 0.), -1) / jnp.maximum(n_pos, 1)
  per_anchor = log_d - mean_pos

  metrics = _base_metrics(sim, jnp.where(self_mask, _MASKED, logits), pos, neg,
                          n_pos, n_neg)
  # Gradient coefficients of Lemma 2 (eqs. 4.6-4.9), diagnostics only. They
  # reuse the loss's exponentials rather than taking new ones over [M, M]:
  # P_ij = e^{l_ij - log D_i} = e_ij e^{shift_i - log D_i} and
  # Y_ij = tau k1 e^{-s_ij - log D_i}.
  sg = jax.lax.stop_gradient
  log_d_c = sg(log_d)
  x = 1. / jnp.maximum(n_pos, 1)
  p_scale = jnp.exp(shift[:, 0] - log_d_c)     # P_ij = e_ij p_scale_i; shift
  p_t = sg(e) * p_scale[:, None]               # is already stop_gradient.
  y_t = ((temperature * k1) * sg(e_k1) * jnp.exp(-log_d_c)[:, None]
         if use_k1 else 0.)
  pos_coef = jnp.sum(jnp.where(pos, jnp.abs(x[:, None] - p_t + y_t), 0.),
                     -1) * x
  # sum_{n in N(i)} P_in = s_neg,i p_scale_i: no pass over [M, M].
  neg_coef = k2 * sg(s_neg) * p_scale / jnp.maximum(n_neg, 1)
  metrics['pos_grad_coef'] = _masked_mean(pos_coef, n_pos > 0)
  metrics['neg_grad_coef'] = _masked_mean(neg_coef, n_neg > 0)
  return _reduce(per_anchor, n_pos), metrics


LOSSES = {'supcon': supcon, 'tcl': tcl}
