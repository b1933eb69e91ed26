"""JCL: Joint Contrastive Learning with infinite possibilities (Cai et al.).

MoCo v2 with M' positive keys per query. Treating the positive key as Gaussian
with the keys' mean mu_i and (biased) covariance Sigma_i, the expected InfoNCE
over infinitely many positives is bounded (Jensen + the Gaussian MGF) by the
closed form of Eq. 8:

  L_i = -log  exp(a_i) / (exp(a_i + c_i) + sum_j exp(b_ij))
      = -a_i + logsumexp(a_i + c_i, b_i1, ..., b_iK),

with a_i = q_i.mu_i / tau, b_ij = q_i.n_j / tau over the negatives n_j and the
variance term c_i = lambda / (2 tau^2) q_i^T Sigma_i q_i >= 0. The batch loss is
the mean over queries (Eq. 9).

q^T Sigma q is computed as mean_m ((k_m - mu) . q)^2 over the centred keys, so
no [D, D] matrix is formed (O(N M' D) instead of O(N D^2)).

The lambda ramp. The official code ramps lambda linearly per epoch,
lambda_t = lambda_max * (epoch + 1) / num_epochs (epoch counted from 0;
lambda_max = 2.0 in the released ImageNet script, 4.0 in the paper's ablations).
This function holds no state: the train loop computes the current lambda and
passes it as `lam` on every step. Pass it as a traced scalar (not a Python
float) so that a jitted step does not recompile when lambda changes.

The queue. After the step, enqueue the batch's key means
`l2_normalize(key).mean(axis=1)` ([N, D], NOT re-normalised: "we enqueue the
average values of keys"), so queue rows have norm <= 1; this loss therefore
does not normalise the queue.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contrastive_jax.losses import common

_MASKED = -1e30


@common.float32_matmuls
def jcl(
    query: jax.Array,
    key: jax.Array,
    *,
    queue: jax.Array | None,
    lam: float | jax.Array = 4.0,
    temperature: float = 0.2,
    in_batch_negatives: bool = False,
) -> common.LossOutput:
  """JCL loss (paper Eq. 8 per query, Eq. 9 for the batch).

  With one key (M' = 1) Sigma = 0 and this is MoCo v2's InfoNCE; with
  lambda = 0 it is InfoNCE against the key mean mu.

  Args:
    query: [N, Vq, D] query-encoder embeddings (Vq >= 1; each query view is an
      anchor and all share the instance's mu and Sigma; JCL uses Vq = 1).
    key: [N, M', D] momentum-encoder embeddings of the M' positive crops
      (M' >= 1; 4 in the released script, 5 in the paper's ablations). Each
      key is L2-normalised before mu and the biased Sigma (1/M') are taken.
    queue: [Q, D] negatives (past key means, used as given), or None when
      `in_batch_negatives` supplies them.
    lam: current lambda, the scale on Sigma (see the module doc for the ramp).
    temperature: softmax temperature tau (0.2).
    in_batch_negatives: also use the other instances' key means mu_j, j != i,
      as negatives (not in the paper; lets the loss run without a queue).

  Returns:
    (loss, metrics): metrics hold `var_term` (mean c_i, the variance term),
    `q_sigma_q` (mean q^T Sigma q), `key_var` (mean tr Sigma) and `pos_sim`
    (mean q . mu).

  Raises:
    ValueError: on wrong shapes or when there are no negatives.
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
  # Keys come from the momentum encoder: mu and Sigma are constants.
  k = jax.lax.stop_gradient(common.l2_normalize(key))         # [N, M', D]
  mu = jnp.mean(k, axis=1)                                    # [N, D]
  kc = k - mu[:, None]                                        # centred keys
  proj = jnp.einsum('nmd,nvd->nvm', kc, q)                    # [N, Vq, M']
  q_sigma_q = jnp.mean(proj * proj, axis=-1)                  # q^T Sigma q
  a = jnp.einsum('nd,nvd->nv', mu, q) / temperature           # [N, Vq]
  c = lam / (2. * temperature ** 2) * q_sigma_q               # [N, Vq]

  qf = q.reshape(n * vq, d)
  lse_neg = None
  if queue is not None:
    # Past key means: constants; cast is a no-op for a float32 queue.
    neg = jax.lax.stop_gradient(jnp.asarray(queue, jnp.float32))
    lse_neg = jax.nn.logsumexp(qf @ neg.T / temperature, axis=-1)
  if in_batch_negatives:
    b = (qf @ mu.T / temperature).reshape(n, vq, n)
    other = ~jnp.eye(n, dtype=bool)[:, None, :]
    lse_b = jax.nn.logsumexp(jnp.where(other, b, _MASKED), axis=-1).reshape(-1)
    lse_neg = lse_b if lse_neg is None else jnp.logaddexp(lse_neg, lse_b)
  lse_neg = lse_neg.reshape(n, vq)
  # Eq. 8 without concatenating the positive onto the [N*Vq, Q] logits.
  per = -a + jnp.logaddexp(a + c, lse_neg)
  metrics = {
      'var_term': jnp.mean(c),
      'q_sigma_q': jnp.mean(q_sigma_q),
      'key_var': jnp.mean(jnp.sum(kc * kc, axis=-1)),
      'pos_sim': jnp.mean(a) * temperature,
  }
  return jnp.mean(per), metrics


LOSSES = {'jcl': jcl}
