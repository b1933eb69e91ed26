"""Tests for the baseline losses: align_uniform, hard_negative, dcl."""

import jax
from jax.test_util import check_grads
import numpy as np
import pytest

from contrastive_jax.losses import baselines
from contrastive_jax.losses import instance
import numpy_reference as ref

TOL = dict(rtol=1e-5, atol=1e-5)
J = ref.jit_call


def rand(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# ---------------------------------------------------------- align_uniform ---

@pytest.mark.parametrize('v,alpha,t,w', [(2, 2., 2., 1.), (3, 1., 3., 0.5),
                                         (4, 2., 2., 1.)])
def test_align_uniform_matches_reference(v, alpha, t, w):
  z = rand(6, v, 8, seed=v)
  loss, m = J(baselines.align_uniform, z, alpha=alpha, t=t, uniform_weight=w)
  want, align, uniform = ref.align_uniform(z, alpha, t, w)
  np.testing.assert_allclose(loss, want, **TOL)
  np.testing.assert_allclose(m['align'], align, **TOL)
  np.testing.assert_allclose(m['uniform'], uniform, **TOL)


def test_align_uniform_extremes():
  # Identical views: zero alignment. Uniformity is bounded below by the
  # value for maximally spread points and is 0 when all points coincide.
  z = np.repeat(rand(6, 1, 8, seed=5), 2, axis=1)
  _, m = J(baselines.align_uniform, z)
  assert m['align'] < 1e-12
  dup = np.broadcast_to(rand(1, 1, 8, seed=6), (6, 2, 8)).copy()
  loss, m = J(baselines.align_uniform, dup)
  # 0 = lse - log(15 pairs): float32 values of size log(15) = 2.7 cancel,
  # plus t ||z - z||^2 = t (2 - 2 z.z) with z.z = 1 to a few ulps (t = 2).
  atol = ref.f32_rtol() * (np.log(15) + 2 * 2.)
  np.testing.assert_allclose(m['uniform'], 0., atol=atol)
  np.testing.assert_allclose(loss, 0., atol=atol)


def test_align_uniform_gradients_and_invariance():
  z = rand(5, 2, 6, seed=7)
  f = jax.jit(lambda x: baselines.align_uniform(x, alpha=1.5)[0])
  check_grads(f, (z,), order=1, modes=['rev'], eps=1e-3, atol=1e-2,
              rtol=1e-2)
  perm = np.array([4, 2, 0, 1, 3])
  np.testing.assert_allclose(f(z[perm]), f(z), **TOL)
  np.testing.assert_allclose(f(z[:, ::-1]), f(z), **TOL)


# ---------------------------------------------------------- hard_negative ---

@pytest.mark.parametrize('v,tau,beta,tau_plus', [
    (2, 0.5, 1., 0.1), (3, 0.2, 0.5, 0.05), (2, 0.1, 2., 0.3),
    (4, 0.5, 1., 0.)])
def test_hard_negative_matches_reference(v, tau, beta, tau_plus):
  z = rand(6, v, 8, seed=10 + v)
  loss, _ = J(baselines.hard_negative, z, temperature=tau, beta=beta,
              tau_plus=tau_plus)
  np.testing.assert_allclose(loss, ref.hard_negative(z, tau, beta, tau_plus),
                             **TOL)


def test_hard_negative_floor_branch_matches_reference():
  # Large tau_plus with a close positive makes the debiased estimate negative,
  # so the K e^{-1/tau} floor is active for some terms.
  z = rand(6, 2, 8, seed=14)
  z[:, 1] = z[:, 0] + 0.05 * z[:, 1]
  loss, m = J(baselines.hard_negative, z, temperature=0.5, tau_plus=0.6)
  assert m['clamp_frac'] > 0
  np.testing.assert_allclose(loss, ref.hard_negative(z, 0.5, 1., 0.6), **TOL)


def test_hard_negative_floor_applies_while_estimate_still_positive():
  # Negatives orthogonal (e^{l_n} = 1, so sum_n w_n e^{l_n} = K) and positive
  # cosine 0.774 (e^{l_p} = 4.70 at tau = 0.5): with tau_plus = 0.2 the
  # debiased estimate K (1 - 0.2 * 4.70) / 0.8 = 0.075 K is positive but
  # below the floor K e^{-2} = 0.135 K, so the floor must be used.
  basis = np.eye(8, dtype=np.float32)
  c = 0.774
  z = np.stack([basis[:4], c * basis[:4] + np.sqrt(1 - c * c) * basis[4:]],
               axis=1)
  loss, m = J(baselines.hard_negative, z, temperature=0.5, tau_plus=0.2)
  np.testing.assert_allclose(m['clamp_frac'], 1.)
  want = ref.hard_negative(z, 0.5, 1., 0.2)
  np.testing.assert_allclose(want, np.log1p(6 * np.exp(-2) / np.exp(2 * c)),
                             rtol=1e-6)
  np.testing.assert_allclose(loss, want, **TOL)


def test_hard_negative_weight_metrics_match_a_numpy_loop():
  # w_n = K e^{beta l_n} / sum_n' e^{beta l_n'} over each anchor's K
  # negatives: the mean over anchors of max_n w_n and of sum_n w_n cos_n / K.
  z = rand(5, 3, 8, seed=18)
  tau, beta = 0.2, 1.5
  _, m = J(baselines.hard_negative, z, temperature=tau, beta=beta)
  u = z / np.linalg.norm(z, axis=-1, keepdims=True)
  w_max, w_sim = [], []
  for i in range(5):
    for a in range(3):
      cos = np.array([u[i, a] @ u[j, b] for j in range(5) if j != i
                      for b in range(3)], np.float64)
      w = len(cos) * np.exp(beta * cos / tau) / np.exp(beta * cos / tau).sum()
      w_max.append(w.max())
      w_sim.append(np.sum(w * cos) / len(cos))
  np.testing.assert_allclose(m['neg_weight_max'], np.mean(w_max), rtol=1e-5)
  np.testing.assert_allclose(m['weighted_neg_sim'], np.mean(w_sim),
                             rtol=1e-5, atol=1e-6)


def test_hard_negative_beta0_tauplus0_v2_equals_ntxent():
  z = rand(6, 2, 8, seed=15)
  loss, m = J(baselines.hard_negative, z, temperature=0.3, beta=0.,
              tau_plus=0.)
  want, _ = J(instance.ntxent, z, temperature=0.3)
  np.testing.assert_allclose(loss, want, **TOL)
  np.testing.assert_allclose(m['neg_weight_max'], 1., rtol=1e-6)


def test_hard_negative_weights_concentrate_with_beta():
  z = rand(6, 2, 8, seed=16)
  w = [J(baselines.hard_negative, z, beta=b)[1]['neg_weight_max']
       for b in (0., 1., 4.)]
  assert 1. - 1e-6 <= w[0] < w[1] < w[2] <= 10.      # K = 10 negatives


def test_hard_negative_gradients():
  z = rand(5, 2, 6, seed=17)
  f = jax.jit(lambda x: baselines.hard_negative(x)[0])
  check_grads(f, (z,), order=1, modes=['rev'], eps=1e-3, atol=1e-2,
              rtol=1e-2)
  perm = np.array([1, 3, 0, 4, 2])
  np.testing.assert_allclose(f(z[perm]), f(z), **TOL)
  np.testing.assert_allclose(f(z[:, ::-1]), f(z), **TOL)


# -------------------------------------------------------------------- dcl ---

@pytest.mark.parametrize('layout', ['cross_view', 'simclr'])
@pytest.mark.parametrize('v,tau', [(2, 0.1), (3, 0.5)])
def test_dcl_matches_reference(layout, v, tau):
  z = rand(6, v, 8, seed=20 + v)
  loss, _ = J(baselines.dcl, z, temperature=tau, layout=layout)
  np.testing.assert_allclose(loss, ref.dcl(z, tau, layout), **TOL)


def test_dcl_per_anchor_relation_to_infonce():
  # Per anchor, InfoNCE_i = softplus(DCL_i) since log(e^p + sum e^n) - p =
  # log(1 + e^{lse_n - p}). With N = 2 each cross-view anchor has exactly one
  # negative, so both losses can be written out anchor by anchor.
  z = rand(2, 2, 8, seed=24)
  d, _ = J(baselines.dcl, z, temperature=0.2)
  nce, _ = J(instance.infonce, z, z, temperature=0.2)
  zu = ref.unit(z)
  per_dcl = [(zu[i, a] @ zu[j, b] - zu[i, a] @ zu[i, b]) / 0.2
             for a, b in ((0, 1), (1, 0)) for i, j in ((0, 1), (1, 0))]
  np.testing.assert_allclose(d, np.mean(per_dcl), **TOL)
  np.testing.assert_allclose(nce, np.mean(np.logaddexp(0., per_dcl)), **TOL)


def test_dcl_gradients_and_invariance():
  z = rand(5, 2, 6, seed=25)
  (g,) = ref.grads_with_fd_check(
      lambda x: baselines.dcl(x, temperature=0.3, layout='simclr'), z)
  assert np.any(np.asarray(g) != 0)
  base, _ = J(baselines.dcl, z, temperature=0.3)
  perm = np.array([2, 4, 1, 0, 3])
  np.testing.assert_allclose(J(baselines.dcl, z[perm], temperature=0.3)[0],
                             base, **TOL)
  np.testing.assert_allclose(J(baselines.dcl, z[:, ::-1], temperature=0.3)[0],
                             base, **TOL)


def test_baselines_reject_bad_inputs():
  with pytest.raises(ValueError, match='z has 1 views'):
    baselines.dcl(rand(4, 1, 8))
  with pytest.raises(ValueError, match="layout must be 'cross_view'"):
    baselines.dcl(rand(4, 2, 8), layout='2n')
  with pytest.raises(ValueError, match='at least 2 instances'):
    baselines.align_uniform(rand(1, 2, 8))
  with pytest.raises(ValueError, match=r'tau_plus must be in \[0, 1\)'):
    baselines.hard_negative(rand(4, 2, 8), tau_plus=1.)


def test_hard_negative_small_tau_matches_reference():
  # e^{(1+beta) s / tau} overflows float32 at tau = 0.02; the log-space
  # evaluation must still agree with the float64 reference.
  z = rand(6, 2, 8, seed=34)
  loss, _ = J(baselines.hard_negative, z, temperature=0.02)
  np.testing.assert_allclose(loss, ref.hard_negative(z, 0.02, 1., 0.1),
                             rtol=1e-4)
