"""MACL: Model-Aware Contrastive Learning (Huang et al. 2022).

InfoNCE with (i) one temperature per step that grows with the batch's mean
positive alignment m (Eqs. 8, 9) and (ii) each anchor's loss divided by
sg(W_i), the softmax mass on its negatives (Eqs. 11, 14), which removes the
"gradient reduction" of easy anchors. With the temperature held fixed, Eq. 14
has exactly the gradients of DCL (Yeh et al. 2021) with the same negative set:
-1 on the positive logit and P_hat_ij on each negative (docs/losses.md, MACL).

Numerics (docs/losses.md, MACL). Per (anchor, positive) let
x = logsumexp(negative logits) - positive logit. Then -log P_pos = softplus(x),
log W = log_sigmoid(x) (never 1 - P_pos, which cancels to 0 in float32 for
easy anchors) and Eq. 14's value is softplus(x) / sigmoid(x) >= 1. The loss is
built as mean(x) + sg(mean(Eq. 14) - mean(x)): its value is Eq. 14 and its
gradient is that of Eq. 14 (equal to DCL's), which stays exact even when
W ~ 1e-15 and log P_pos rounds to 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.losses import common

_MASKED = -1e30


def adaptive_temperature(m: jax.Array, *, temperature: float, variant: str,
                         alpha: float, beta: float) -> jax.Array:
  """tau' of Eq. 8 (variant 'a': tau0 alpha^m) or Eq. 9 ('b': tau0 (1+beta m)).

  m in [-1, 1] is the batch mean positive cosine; the floor 1e-4 only matters
  for beta >= 1 with m -> -1, where Eq. 9 reaches 0.
  """
  if variant == 'a':
    tau = temperature * alpha ** m
  elif variant == 'b':
    tau = temperature * (1. + beta * m)
  else:
    raise ValueError(f"variant must be 'a' or 'b'; got {variant!r}.")
  return jnp.maximum(tau, 1e-4)


def _eq14_value(x: jax.Array) -> jax.Array:
  """-log(P_pos) / W = softplus(x) / sigmoid(x), finite for every x."""
  # For x << 0 both numerator and denominator underflow; the ratio is
  # 1 + e^x / 2 + O(e^2x) there.
  xs = jnp.maximum(x, -20.)
  ratio = jnp.exp(jnp.log(jax.nn.softplus(xs)) - jax.nn.log_sigmoid(xs))
  return jnp.where(x < -20., 1. + 0.5 * jnp.exp(x), ratio)


@common.float32_matmuls
def macl(
    z: jax.Array,
    *,
    temperature: float = 0.1,
    variant: str = 'a',
    alpha: float = 2.0,
    beta: float = 0.5,
    layout: str = 'cross_view',
    reweight: bool = True,
) -> common.LossOutput:
  """MACL loss (paper Eq. 14 with the adaptive temperature of Eq. 8 or 9).

  The temperature tau' is computed from m = sg(mean positive cosine) over all
  ordered pairs of distinct views of the same instance, and is itself
  stop-gradiented (Eq. 10): one scalar per step, shared by all anchors.

  Layouts (docs/losses.md, MACL):
    * 'cross_view' (default; the equations and the released code, made
      symmetric): anchor z_i^(v) against the keys of one other view u:
      positive z_i^(u), negatives z_j^(u), j != i (N - 1). For V > 2 every
      ordered pair (v, u), u != v, is one term.
    * 'simclr' (SimCLR's 2N x 2N layout): anchor z_i^(v), positive z_i^(u),
      negatives every z_j^(w) with j != i (N*V - V of them). With V = 2 this is
      NT-Xent's candidate set; the other positives of the anchor are left out.

  Args:
    z: [N, V, D] embeddings, V >= 2 (any float dtype).
    temperature: tau_0, the base temperature.
    variant: 'a' (tau' = tau_0 alpha^m, Eq. 8) or 'b' (tau' = tau_0 (1 + beta
      m), Eq. 9).
    alpha: base of Eq. 8 (> 1; alpha = 1 disables the adaptation).
    beta: slope of Eq. 9 (0.5 in the paper; the released code uses 1.0).
    layout: 'cross_view' or 'simclr', see above.
    reweight: True for Eq. 14; False gives Eq. 10 (InfoNCE at tau', no 1/W).

  Returns:
    (loss, metrics): metrics hold `tau` (the adaptive temperature), `pos_sim`
    (m), `log_w` (mean log W_i) and `dcl` (the DCL value with the same logits,
    whose gradient Eq. 14 shares).

  Raises:
    ValueError: on wrong shapes, V < 2, N < 2, or an unknown option.
  """
  common.check_views(z, 'z', min_views=2)
  if layout not in ('cross_view', 'simclr'):
    raise ValueError(f"layout must be 'cross_view' or 'simclr'; got "
                     f'{layout!r}.')
  n, v, _ = z.shape
  if n < 2:
    raise ValueError(f'macl needs N >= 2 instances for negatives; got z of '
                     f'shape {tuple(z.shape)}.')
  zf = common.l2_normalize(z)
  off_view = ~jnp.eye(v, dtype=bool)                          # [V, V]
  pos_cos = jnp.einsum('nvd,nud->nvu', zf, zf)                # [N, V, V]
  m = jax.lax.stop_gradient(
      jnp.sum(jnp.where(off_view, pos_cos, 0.)) / (n * v * (v - 1)))
  # The temperature is a training signal, not a parameter (Eq. 10's sg).
  tau = jax.lax.stop_gradient(adaptive_temperature(
      m, temperature=temperature, variant=variant, alpha=alpha, beta=beta))

  if layout == 'cross_view':
    # One [N, N] block per unordered view pair a < b serves both directions:
    # its rows are anchors of view a against keys of view b, its columns
    # anchors of view b against keys of view a (at most half of the [NV, NV]
    # matrix the 'simclr' layout needs).
    a_idx, b_idx = np.triu_indices(v, 1)
    logits = jnp.einsum('ipd,jpd->pij', zf[:, a_idx], zf[:, b_idx]) / tau
    other = ~jnp.eye(n, dtype=bool)[None]                     # j != i
    masked = jnp.where(other, logits, _MASKED)
    pos = jnp.diagonal(logits, axis1=1, axis2=2)              # [P, N]
    x = jnp.concatenate([jax.nn.logsumexp(masked, axis=2) - pos,
                         jax.nn.logsumexp(masked, axis=1) - pos])  # [2P, N]
    valid = jnp.ones_like(x, dtype=bool)
  else:
    flat = zf.reshape(n * v, -1)
    inst = np.repeat(np.arange(n), v)
    other = inst[:, None] != inst[None, :]                    # [NV, NV]
    lse_neg = jax.nn.logsumexp(
        jnp.where(other, flat @ flat.T / tau, _MASKED), axis=-1)
    x = lse_neg.reshape(n, v, 1) - pos_cos / tau              # [N, V, V]
    valid = jnp.broadcast_to(off_view, x.shape)
  count = n * v * (v - 1)
  dcl_value = jnp.sum(jnp.where(valid, x, 0.)) / count
  if reweight:
    per = _eq14_value(x)
  else:
    per = jax.nn.softplus(x)                                  # -log P_pos
  value = jnp.sum(jnp.where(valid, per, 0.)) / count
  if reweight:
    # Value of Eq. 14, gradient of Eq. 14 (== DCL's), see the module doc.
    loss = dcl_value + jax.lax.stop_gradient(value - dcl_value)
  else:
    loss = value
  metrics = {
      'tau': tau,
      'pos_sim': m,
      'log_w': jnp.sum(jnp.where(valid, jax.nn.log_sigmoid(x), 0.)) / count,
      'dcl': dcl_value,
  }
  return loss, metrics


LOSSES = {'macl': macl}
