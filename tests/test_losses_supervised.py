"""Tests for supervised losses: supcon (L_out, L_in) and tcl."""

import math

import jax
from jax.test_util import check_grads
import numpy as np
import pytest

from contrastive_jax.losses import instance
from contrastive_jax.losses import supervised
import numpy_reference as ref

TOL = dict(rtol=1e-5, atol=1e-5)
J = ref.jit_call
LABELS6 = np.array([0, 1, 0, 2, 1, 0], np.int32)   # class 2 is a singleton


def rand(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# ----------------------------------------------------------------- supcon ---

@pytest.mark.parametrize('variant', ['out', 'in'])
@pytest.mark.parametrize('v', [1, 2, 3])
def test_supcon_matches_reference(variant, v):
  z = rand(6, v, 8, seed=v)
  loss, m = J(supervised.supcon, z, LABELS6, temperature=0.1,
              variant=variant)
  np.testing.assert_allclose(loss, ref.supcon(z, LABELS6, 0.1, variant),
                             **TOL)
  assert np.isfinite(m['acc'])


def test_supcon_in_is_at_most_out():
  # Jensen: L_in <= L_out, strictly when an anchor has unequal positives.
  z = rand(6, 2, 8, seed=4)
  l_out, _ = J(supervised.supcon, z, LABELS6, variant='out')
  l_in, _ = J(supervised.supcon, z, LABELS6, variant='in')
  assert l_in < l_out


@pytest.mark.parametrize('variant', ['out', 'in'])
def test_supcon_instance_labels_v2_equals_ntxent(variant):
  # With one positive per anchor L_in and L_out coincide, and both are NT-Xent.
  z = rand(6, 2, 8, seed=5)
  labels = np.arange(6, dtype=np.int32)
  loss, _ = J(supervised.supcon, z, labels, temperature=0.2, variant=variant)
  want, _ = J(instance.ntxent, z, temperature=0.2)
  np.testing.assert_allclose(loss, want, **TOL)


def test_supcon_singleton_anchor_without_positive_is_excluded():
  # V = 1: the singleton class-2 anchor has no positive and must not turn the
  # loss into NaN; it is excluded from the mean (as in the reference).
  z = rand(6, 1, 8, seed=6)
  loss, _ = J(supervised.supcon, z, LABELS6)
  assert np.isfinite(loss)
  np.testing.assert_allclose(loss, ref.supcon(z, LABELS6, 0.1), **TOL)
  g = ref.fast_jit(jax.grad(lambda x: supervised.supcon(x, LABELS6)[0]))(z)
  assert np.all(np.isfinite(g))


def test_supcon_gradient_matches_float64_finite_differences():
  z = rand(4, 2, 5, seed=7)
  labels = np.array([0, 1, 0, 1], np.int32)
  g = ref.fast_jit(jax.grad(
      lambda x: supervised.supcon(x, labels, temperature=0.3)[0]))(z)
  x0 = np.asarray(z, np.float64)
  g_ref = np.zeros_like(x0)
  eps = 1e-6
  for idx in np.ndindex(x0.shape):
    xp, xm = x0.copy(), x0.copy()
    xp[idx] += eps
    xm[idx] -= eps
    g_ref[idx] = (ref.supcon(xp, labels, 0.3) - ref.supcon(xm, labels, 0.3)
                  ) / (2 * eps)
  np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


def test_supcon_invariances():
  z = rand(6, 2, 8, seed=8)
  base, _ = J(supervised.supcon, z, LABELS6)
  perm = np.random.RandomState(0).permutation(6)
  np.testing.assert_allclose(J(supervised.supcon, z[perm], LABELS6[perm])[0],
                             base, **TOL)
  np.testing.assert_allclose(J(supervised.supcon, z[:, ::-1], LABELS6)[0],
                             base, **TOL)
  relabelled = np.array([7, 3, 9])[LABELS6].astype(np.int32)
  np.testing.assert_allclose(J(supervised.supcon, z, relabelled)[0], base,
                             **TOL)


def test_supcon_rejects_bad_inputs():
  z = rand(4, 2, 8)
  with pytest.raises(ValueError, match='this loss is supervised'):
    supervised.supcon(z, None)
  with pytest.raises(ValueError, match=r'labels must have shape \[4\]'):
    supervised.supcon(z, np.zeros(3, np.int32))
  with pytest.raises(ValueError, match='int class ids'):
    supervised.supcon(z, np.zeros(4, np.float32))
  with pytest.raises(ValueError, match="variant must be 'out' or 'in'"):
    supervised.supcon(z, np.zeros(4, np.int32), variant='both')


# -------------------------------------------------------------------- tcl ---

@pytest.mark.parametrize('v,k1,k2,tau', [(2, 5000., 1., 0.1), (3, 1., 1.5, 0.2),
                                         (1, 50., 3.25, 0.5)])
def test_tcl_matches_reference(v, k1, k2, tau):
  z = rand(6, v, 8, seed=10 + v)
  loss, _ = J(supervised.tcl, z, LABELS6, k1=k1, k2=k2, temperature=tau)
  np.testing.assert_allclose(loss, ref.tcl(z, LABELS6, tau, k1, k2), **TOL)


def test_tcl_self_supervised_defaults_and_reference():
  z = rand(6, 3, 8, seed=13)
  loss, _ = J(supervised.tcl, z)
  # The thesis's self-supervised setting: k1 = 1, k2 = 1.5, tau = 0.2 (V = 3,
  # image ids as labels).
  np.testing.assert_allclose(loss, ref.tcl(z, np.arange(6), 0.2, 1., 1.5),
                             **TOL)
  sup, _ = J(supervised.tcl, z, LABELS6)
  np.testing.assert_allclose(sup, ref.tcl(z, LABELS6, 0.1, 5000., 1.), **TOL)


@pytest.mark.parametrize('v', [1, 2, 3])
def test_tcl_k1_0_k2_1_is_supcon_out(v):
  z = rand(6, v, 8, seed=20 + v)
  loss, _ = J(supervised.tcl, z, LABELS6, k1=0., k2=1., temperature=0.1)
  want, _ = J(supervised.supcon, z, LABELS6, temperature=0.1)
  np.testing.assert_allclose(loss, want, **TOL)


def test_tcl_reduces_to_ntxent():
  z = rand(6, 2, 8, seed=24)
  loss, _ = J(supervised.tcl, z, k1=0., k2=1., temperature=0.1)
  np.testing.assert_allclose(loss, ref.ntxent_v2_crossentropy(z, 0.1), **TOL)


def test_tcl_k1_k2_zero_is_not_supcon():
  # With k1 = k2 = 0 the negatives vanish: L_i = lse_P(s/tau) -
  # mean_P(s/tau). k2 must be > 0 in the API, so use a tiny k2.
  z = rand(6, 2, 8, seed=25)
  loss, _ = J(supervised.tcl, z, LABELS6, k1=0., k2=1e-30, temperature=0.1)
  zu = ref.unit(z).reshape(12, 8)
  y = np.repeat(LABELS6, 2)
  want = []
  for i in range(12):
    s = [zu[i] @ zu[p] / 0.1 for p in range(12) if p != i and y[p] == y[i]]
    want.append(math.log(sum(math.exp(x) for x in s)) - np.mean(s))
  np.testing.assert_allclose(loss, np.mean(want), **TOL)
  sup, _ = J(supervised.supcon, z, LABELS6)
  assert abs(loss - sup) > 1e-2


def test_tcl_monotone_in_k1_k2_and_above_supcon_and_bounds():
  z = rand(6, 2, 8, seed=26)
  vals = {}
  for k1, k2 in [(1., 1.), (10., 1.), (10., 1.5), (0., 1.)]:
    vals[k1, k2] = J(supervised.tcl, z, LABELS6, k1=k1, k2=k2)[0]
  assert vals[0., 1.] < vals[1., 1.] < vals[10., 1.] < vals[10., 1.5]
  # The thesis's lower bound L_i > log|P(i)|, averaged.
  n_pos = np.array([np.sum(np.repeat(LABELS6, 2) == c) - 1
                    for c in np.repeat(LABELS6, 2)])
  assert vals[1., 1.] > np.mean(np.log(n_pos))


def test_tcl_k1_term_has_no_temperature():
  # With a dominant k1 term (k1 = 1e4) the loss is driven by k1 sum_P e^{-s};
  # an implementation using e^{-s/tau} there would miss the reference by a
  # wide margin at both temperatures.
  z = rand(6, 2, 8, seed=27)
  for tau in (0.05, 0.5):
    loss, _ = J(supervised.tcl, z, LABELS6, k1=1e4, k2=1., temperature=tau)
    np.testing.assert_allclose(loss, ref.tcl(z, LABELS6, tau, 1e4, 1.),
                               **TOL)


def test_tcl_gradient_and_invariances():
  z = rand(5, 2, 6, seed=28)
  labels = np.array([0, 1, 0, 1, 2], np.int32)
  f = jax.jit(lambda x: supervised.tcl(x, labels, k1=10., k2=1.2)[0])
  check_grads(f, (z,), order=1, modes=['rev'], eps=1e-3, atol=1e-2,
              rtol=1e-2)
  base = f(z)
  perm = np.array([3, 0, 4, 2, 1])
  g = ref.fast_jit(
      lambda x: supervised.tcl(x, labels[perm], k1=10., k2=1.2)[0])
  np.testing.assert_allclose(g(z[perm]), base, **TOL)
  np.testing.assert_allclose(f(z[:, ::-1]), base, **TOL)
  q, _ = np.linalg.qr(np.random.RandomState(0).randn(6, 6))
  np.testing.assert_allclose(f((z @ q.T).astype(np.float32)), base, **TOL)


def test_tcl_gradient_diagnostics():
  # Fig. 5.5/5.7 quantities: increasing k1 raises the positives' gradient
  # coefficient and lowers the negatives' (the thesis's gradient analysis).
  z = rand(6, 2, 8, seed=29)
  _, lo = J(supervised.tcl, z, LABELS6, k1=10., k2=1.)
  _, hi = J(supervised.tcl, z, LABELS6, k1=5000., k2=1.)
  assert hi['pos_grad_coef'] > lo['pos_grad_coef']
  assert hi['neg_grad_coef'] < lo['neg_grad_coef']


@pytest.mark.parametrize('k1,k2,tau', [(5000., 1., 0.1), (10., 1.5, 0.2),
                                       (0., 1., 0.1)])
def test_tcl_gradient_diagnostics_match_reference(k1, k2, tau):
  # The reference evaluates the Lemma 2 coefficients directly per pair
  # (float64 loop). LABELS6 has a singleton anchor (no positives: left out
  # of the positives' mean).
  z = rand(6, 2, 8, seed=30)
  _, m = J(supervised.tcl, z, LABELS6, k1=k1, k2=k2, temperature=tau)
  want_pos, want_neg = ref.tcl_grad_coefs(z, LABELS6, tau, k1, k2)
  np.testing.assert_allclose(m['pos_grad_coef'], want_pos, rtol=1e-5)
  np.testing.assert_allclose(m['neg_grad_coef'], want_neg, rtol=1e-5)


# Unsorted, non-contiguous and negative ids; 4 is a singleton.
ODD_LABELS = np.array([7, -2, 7, 4, -2, 7, 11, 11], np.int32)


@pytest.mark.parametrize('loss,v,labels', [
    ('supcon', 1, ODD_LABELS), ('supcon', 3, ODD_LABELS),
    ('tcl', 2, ODD_LABELS), ('tcl', 3, None)])
def test_batch_metrics_match_a_loop(loss, v, labels):
  # pos_sim, neg_sim and num_pos use |P(i)|, |N(i)| counted from the sorted
  # labels, not from the masks; the loop counts pairs one by one.
  z = rand(8, v, 6, seed=31 + v)
  kwargs = {} if labels is None else {'labels': labels}
  _, m = J(getattr(supervised, loss), z, **kwargs)
  want = ref.label_batch_metrics(z, labels)
  for key in ('pos_sim', 'neg_sim', 'acc', 'num_pos'):
    np.testing.assert_allclose(m[key], want[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)


def test_tcl_rejects_bad_inputs():
  with pytest.raises(ValueError, match='z has 1 views'):
    supervised.tcl(rand(4, 1, 8))        # self-supervised needs V >= 2
  with pytest.raises(ValueError, match='k1 must be >= 0'):
    supervised.tcl(rand(4, 2, 8), k1=-1.)
  with pytest.raises(ValueError, match='k2 must be > 0'):
    supervised.tcl(rand(4, 2, 8), k2=0.)
