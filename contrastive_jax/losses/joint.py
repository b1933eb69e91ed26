"""JCL: Joint Contrastive Learning (Cai et al. 2020); docs/losses.md (JCL)."""

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common

_MASKED = -1e30


@common.float32_matmuls
def jcl(query: jax.Array, key: jax.Array, *, queue: jax.Array | None,
        lam: float | jax.Array = 4.0, temperature: float = 0.2,
        in_batch_negatives: bool = False) -> common.LossOutput:
  """JCL loss (Eq. 8 per query, its mean over queries Eq. 9).

  L_i = -a_i + log(e^{a_i + c_i} + sum_j e^{b_ij}), a_i = q_i.mu_i / tau,
  b_ij = q_i.n_j / tau, c_i = lam / (2 tau^2) q_i^T Sigma_i q_i, with mu_i and
  Sigma_i the mean and biased covariance of the key [N, M', D] rows of
  query [N, Vq, D]'s instance; queue [Q, D]: past key means, used as given.
  M' = 1 is MoCo v2's InfoNCE. `lam` may be traced (the per-epoch ramp);
  `in_batch_negatives` (not in the paper) adds the other instances' key means.
  """
  common.check_views(query, 'query', min_views=1)
  common.check_views(key, 'key', min_views=1)
  common.check_same_dim(query, key, 'query', 'key')
  n, vq, d = query.shape
  if key.shape[0] != n:
    raise ValueError(f'query and key must have the same N (one set of keys '
                     f'per instance); got {tuple(query.shape)} and '
                     f'{tuple(key.shape)}.')
  common.check_queue(queue, d)
  if queue is None and not (in_batch_negatives and n >= 2):
    raise ValueError('jcl needs negatives: pass queue=[Q, D] or '
                     'in_batch_negatives=True with N >= 2.')

  q = common.l2_normalize(query)                              # [N, Vq, D]
  k = jax.lax.stop_gradient(common.l2_normalize(key))         # [N, M', D]
  mu = jnp.mean(k, axis=1)                                    # [N, D]
  kc = k - mu[:, None]                                        # centred keys
  proj = jnp.einsum('nmd,nvd->nvm', kc, q)                    # [N, Vq, M']
  q_sigma_q = jnp.mean(proj * proj, axis=-1)                  # no [D, D]
  a = jnp.einsum('nd,nvd->nv', mu, q) / temperature           # [N, Vq]
  c = lam / (2. * temperature ** 2) * q_sigma_q               # [N, Vq]

  qf = q.reshape(n * vq, d)
  lse_neg = None
  if queue is not None:
    neg = jax.lax.stop_gradient(jnp.asarray(queue, jnp.float32))
    lse_neg = jax.nn.logsumexp(qf @ neg.T / temperature, axis=-1)
  if in_batch_negatives:
    b = (qf @ mu.T / temperature).reshape(n, vq, n)
    other = ~jnp.eye(n, dtype=bool)[:, None, :]
    lse_b = jax.nn.logsumexp(jnp.where(other, b, _MASKED), axis=-1).reshape(-1)
    lse_neg = lse_b if lse_neg is None else jnp.logaddexp(lse_neg, lse_b)
  per = -a + jnp.logaddexp(a + c, lse_neg.reshape(n, vq))
  metrics = {
      'var_term': jnp.mean(c),
      'q_sigma_q': jnp.mean(q_sigma_q),
      'key_var': jnp.mean(jnp.sum(kc * kc, axis=-1)),
      'pos_sim': jnp.mean(a) * temperature,
  }
  return jnp.mean(per), metrics
