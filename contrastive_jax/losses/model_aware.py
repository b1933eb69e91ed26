"""MACL: Model-Aware Contrastive Learning (Huang et al. 2022).

Why its gradient equals DCL's, and its numerics: docs/losses.md (MACL).
"""

import jax
import jax.numpy as jnp
import numpy as np

from contrastive_jax.losses import common

_MASKED = -1e30


@common.float32_matmuls
def macl(z: jax.Array, *, temperature: float = 0.1, variant: str = 'a',
         alpha: float = 2.0, beta: float = 0.5,
         layout: str = 'cross_view') -> common.LossOutput:
  """MACL loss (Eq. 14 at the adaptive temperature of Eq. 8 or 9).

  L_i = -log P_pos,i / sg(W_i), W_i = sum_{j in N(i)} P_ij, at
  tau' = sg(tau(m)), m = sg(mean positive cosine) (Eq. 10): one temperature
  per step: 'a' tau_0 alpha^m (Eq. 8), 'b' tau_0 (1 + beta m) (Eq. 9),
  floored at 1e-4; z [N >= 2, V >= 2, D]. 'cross_view' (the released code,
  symmetric): anchor z_i^v, positive z_i^u, negatives z_j^u, j != i, over
  ordered pairs u != v; 'simclr': negatives every z_j^w, j != i. Metrics:
  `tau` (tau'), `pos_sim` (m), `log_w` (mean log W_i), `dcl` (DCL's value).
  """
  common.check_views(z, 'z', min_views=2)
  common.check_choice('layout', layout, ('cross_view', 'simclr'))
  n, v, _ = z.shape
  if n < 2:
    raise ValueError(f'macl needs N >= 2 instances for negatives; got z of '
                     f'shape {tuple(z.shape)}.')
  zf = common.l2_normalize(z)
  off_view = ~jnp.eye(v, dtype=bool)                          # [V, V]
  pos_cos = jnp.einsum('nvd,nud->nvu', zf, zf)                # [N, V, V]
  count = n * v * (v - 1)
  m = jax.lax.stop_gradient(jnp.sum(jnp.where(off_view, pos_cos, 0.)) / count)
  common.check_choice('variant', variant, ('a', 'b'))
  tau = jax.lax.stop_gradient(jnp.maximum(
      temperature * alpha ** m if variant == 'a' else
      temperature * (1. + beta * m), 1e-4))

  if layout == 'cross_view':
    # One [N, N] block per view pair a < b serves both directions (rows:
    # anchors of view a; columns: anchors of view b).
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
  # x = lse(negatives) - positive: -log P_pos = softplus(x), W = sigmoid(x).
  dcl_value = jnp.sum(jnp.where(valid, x, 0.)) / count
  # Eq. 14's term softplus(x) / sigmoid(x), finite for every x: below -20 it
  # is 1 + e^x / 2 to float32 precision, where both factors underflow.
  xs = jnp.maximum(x, -20.)
  ratio = jnp.exp(jnp.log(jax.nn.softplus(xs)) - jax.nn.log_sigmoid(xs))
  eq14 = jnp.where(x < -20., 1. + 0.5 * jnp.exp(x), ratio)
  value = jnp.sum(jnp.where(valid, eq14, 0.)) / count
  # Eq. 14's value with its gradient, DCL's: exact where log P_pos rounds to 0.
  loss = dcl_value + jax.lax.stop_gradient(value - dcl_value)
  metrics = {
      'tau': tau,
      'pos_sim': m,
      'log_w': jnp.sum(jnp.where(valid, jax.nn.log_sigmoid(x), 0.)) / count,
      'dcl': dcl_value,
  }
  return loss, metrics
