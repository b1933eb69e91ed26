"""Tests for contrastive_jax.losses.jcl (losses/joint.py) against the JCL paper (Cai et al. 2020)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from contrastive_jax.losses import jcl as jcl_eager
import numpy_reference_methods as ref

jcl = jax.jit(jcl_eager, static_argnames=('in_batch_negatives',))


def _rand(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _close(a, b, tol=1e-5):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=tol, atol=tol)


def _inputs(seed, n=5, vq=1, mk=4, d=6, q=9):
  return _rand(seed, n, vq, d), _rand(seed + 1, n, mk, d), _rand(seed + 2, q, d)


@pytest.mark.parametrize('kw', [
    dict(),
    dict(lam=2.0, temperature=0.3),
    dict(vq=2, mk=3),
    dict(in_batch_negatives=True),
    dict(in_batch_negatives=True, no_queue=True, lam=1.0),
])
def test_matches_numpy(kw):
  kw = dict(kw)
  shape = {k: kw.pop(k) for k in ('vq', 'mk') if k in kw}
  query, key, queue = _inputs(0, **shape)
  if kw.pop('no_queue', False):
    queue = None
  loss, metrics = jcl(query, key, queue=queue, **kw)
  want, want_m = ref.jcl(query, key, queue, **kw)
  assert loss.dtype == jnp.float32 and loss.shape == ()
  _close(loss, want)
  _close(metrics['var_term'], want_m['var_term'])
  assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())


def test_lambda_zero_is_infonce_at_key_mean():
  query, key, queue = _inputs(1)
  mu = ref.normalize(key).mean(axis=1)       # not re-normalised
  want = ref.infonce(query[:, 0], mu, queue, temperature=0.2)
  _close(jcl(query, key, queue=queue, lam=0.0)[0], want)


def test_single_key_is_moco_infonce_for_any_lambda():
  from contrastive_jax.losses import infonce
  query, key, queue = _inputs(2, mk=1)
  queue = ref.normalize(queue).astype(np.float32)
  want = ref.infonce(query[:, 0], ref.normalize(key[:, 0]), queue,
                     temperature=0.2)
  moco = jax.jit(lambda qq, kk, qu: infonce(
      qq, kk, queue=qu, temperature=0.2, in_batch_negatives=False))
  lib, _ = moco(query, key, queue)
  _close(lib, want)
  for lam in (0.0, 4.0, 100.0):
    loss, metrics = jcl(query, key, queue=queue, lam=lam)
    _close(loss, want)
    _close(metrics['var_term'], 0.0)


def test_identical_keys_close_the_jensen_gap():
  query, key, queue = _inputs(3)
  key = np.repeat(key[:, :1], 4, axis=1) * np.array([1., 2., 3., .5],
                                                    np.float32)[None, :, None]
  want = ref.infonce(query[:, 0], ref.normalize(key[:, 0]), queue,
                     temperature=0.2)
  _close(jcl(query, key, queue=queue, lam=4.0)[0], want)


def test_monotone_in_lambda_and_bounded_below_by_infonce_at_mean():
  query, key, queue = _inputs(4)
  vals = [float(jcl(query, key, queue=queue, lam=lam)[0])
          for lam in (0.0, 1.0, 2.0, 4.0)]
  assert np.all(np.diff(vals) > 0)
  # Jensen's lower side: l(mu) <= average of l(k_m) (exact, any keys).
  u = ref.normalize(key)
  vanilla = np.mean([ref.infonce(query[:, 0], u[:, m], queue, temperature=0.2)
                     for m in range(u.shape[1])])
  assert vals[0] <= vanilla


def test_variance_metrics():
  query, key, queue = _inputs(5)
  _, metrics = jcl(query, key, queue=queue, lam=3.0, temperature=0.25)
  q, k = ref.normalize(query)[:, 0], ref.normalize(key)
  qsq, tr = [], []
  for i in range(len(q)):
    sigma = np.cov(k[i].T, bias=True)
    qsq.append(q[i] @ sigma @ q[i])
    tr.append(np.trace(sigma))
    # tr Sigma = 1 - ||mu||^2 for unit keys (Sigma is the keys' biased covariance).
    assert np.trace(sigma) == pytest.approx(1 - np.sum(k[i].mean(0) ** 2))
  _close(metrics['q_sigma_q'], np.mean(qsq))
  _close(metrics['var_term'], 3.0 / (2 * 0.25 ** 2) * np.mean(qsq))
  _close(metrics['key_var'], np.mean(tr))


def test_large_lambda_drowns_the_negatives():
  # lambda -> inf: "the effect of negative keys completely vanishes owing to
  # the overwhelming lambda Sigma" (the paper's Sec. 4.4). Per query
  # L_i - c_i = log(1 + sum_j e^{b_ij - a_i - c_i}) > 0, so the relative gap
  # (L - c) / c, with c = var_term, shrinks to 0 as lambda grows.
  query, key, queue = _inputs(6)
  n = query.shape[0] * query.shape[1]          # 5 per-query terms averaged
  # float32 bound on |L - c| / c once the exact gap is below rounding: per
  # query, -a + (a + c) rounds twice at size c + |a| (|a| <= 1/tau = 5 << c),
  # <= eps c; each of the two means over n terms (loss and var_term) adds
  # <= (n - 1) eps/2 c for the sum and eps/2 c for the division. Total
  # (n + 1) eps c, +1 eps for |a| / c: (n + 2) eps = 8.3e-7 here.
  bound = (n + 2) * float(np.finfo(np.float32).eps)
  gaps = {}
  for lam in (0.1, 1., 10., 100., 1e3, 1e4):
    loss, metrics = jcl(query, key, queue=queue, lam=lam)
    c = float(metrics['var_term'])
    gaps[lam] = (float(loss) - c) / c
  # Where the exact gap is above rounding (30, 2.1, 1.1e-5 in float64) it is
  # positive and falls strictly with lambda.
  assert gaps[0.1] > gaps[1.] > gaps[10.] > bound
  # Beyond, L equals c to float32 precision. A loss that lost its variance
  # term (-1), doubled it (+1) or flipped its sign (-2) fails by 1e6.
  assert float(metrics['var_term']) > 100
  for lam in (100., 1e3, 1e4):
    assert abs(gaps[lam]) <= bound, (lam, gaps[lam], bound)


def test_closed_form_gradient():
  # The gradient of the closed form (the paper's Eq. 8) with respect to q,
  # derived by hand, on a unit query (so the raw gradient is the tangent
  # projection of the closed form).
  query, key, queue = _inputs(7, n=1)
  q = ref.normalize(query)[0, 0]
  k = ref.normalize(key)[0]
  mu = k.mean(0)
  sigma = np.cov(k.T, bias=True)
  lam, tau = 2.0, 0.2
  a = q @ mu / tau
  c = lam / (2 * tau ** 2) * q @ sigma @ q
  b = queue.astype(np.float64) @ q / tau
  z = np.exp(a + c) + np.exp(b).sum()
  p0, p = np.exp(a + c) / z, np.exp(b) / z
  g = (-(1 - p0) * mu + p0 * lam / tau * sigma @ q
       + (p[:, None] * queue).sum(0)) / tau
  g_t = g - (g @ q) * q
  got = jax.grad(lambda x: jcl(x, key, queue=queue, lam=lam)[0])(
      jnp.asarray(q[None, None], jnp.float32))
  np.testing.assert_allclose(np.asarray(got)[0, 0], g_t, atol=1e-4)


def test_check_grads_and_no_gradient_into_keys_or_queue():
  query, key, queue = map(jnp.asarray, _inputs(8, n=3))
  check_grads(jax.jit(lambda x: jcl(x, key, queue=queue, lam=2.0)[0]),
              (query,), order=1, modes=['rev'], atol=5e-3, rtol=5e-3,
              eps=1e-3)
  gk, gq = jax.grad(
      lambda k, qu: jcl(query, k, queue=qu, lam=2.0,
                        in_batch_negatives=True)[0], argnums=(0, 1))(key, queue)
  assert np.all(np.asarray(gk) == 0) and np.all(np.asarray(gq) == 0)
  assert np.abs(np.asarray(jax.grad(
      lambda x: jcl(x, key, queue=queue)[0])(query))).max() > 1e-3


def test_value_errors():
  q, k, qu = jnp.zeros((4, 1, 8)), jnp.zeros((4, 3, 8)), jnp.zeros((6, 8))
  with pytest.raises(ValueError, match=r'query must have shape \[N, V, D\]'):
    jcl_eager(jnp.zeros((4, 8)), k, queue=qu)
  with pytest.raises(ValueError, match=r'key must have shape \[N, V, D\]'):
    jcl_eager(q, jnp.zeros((4, 8)), queue=qu)
  with pytest.raises(ValueError, match='at least 1 views'):
    jcl_eager(q, jnp.zeros((4, 0, 8)), queue=qu)
  with pytest.raises(ValueError, match='embedding dim'):
    jcl_eager(q, jnp.zeros((4, 3, 7)), queue=qu)
  with pytest.raises(ValueError, match='same N'):
    jcl_eager(q, jnp.zeros((5, 3, 8)), queue=qu)
  with pytest.raises(ValueError, match=r'queue must have shape \[Q, 8\]'):
    jcl_eager(q, k, queue=jnp.zeros((6, 7)))
  with pytest.raises(ValueError, match='needs negatives'):
    jcl_eager(q, k, queue=None)
