"""Tests for contrastive_jax.losses.macl (losses/model_aware.py) against the MACL paper (Huang et al. 2022)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from contrastive_jax.losses import macl as macl_eager
import numpy_reference_methods as ref

macl = jax.jit(macl_eager, static_argnames=('variant', 'layout'))


def _rand(seed, *shape, scale=1.0):
  rng = np.random.default_rng(seed)
  return (scale * rng.normal(size=shape)).astype(np.float32)


def _close(a, b, tol=1e-5):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=tol, atol=tol)


def _grad(z, **kw):
  return np.asarray(jax.jit(jax.grad(lambda x: macl(x, **kw)[0]))(
      jnp.asarray(z)))


@pytest.mark.parametrize('views, kw', [
    (2, dict()),
    (3, dict()),
    (2, dict(variant='b')),
    (2, dict(layout='simclr')),
    (3, dict(layout='simclr', variant='b', beta=1.0, temperature=0.2)),
    (3, dict(alpha=3.0)),
])
def test_matches_numpy(views, kw):
  z = _rand(0, 6, views, 5)
  loss, metrics = macl(z, **kw)
  want = ref.macl(z, **kw)
  tau, m = ref.macl_tau(z, **{k: kw[k] for k in kw
                               if k in ('temperature', 'variant', 'alpha',
                                        'beta')})
  _close(loss, want)
  _close(metrics['tau'], tau)
  _close(metrics['pos_sim'], m)
  assert loss.dtype == jnp.float32 and loss.shape == ()
  assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())


def test_temperature_formula_bounds_and_monotonicity():
  # Eq. 8/9 at the extremes: identical views give m = 1, antipodal m = -1.
  e = np.eye(4, dtype=np.float32)
  same = np.stack([e, e], axis=1)            # [4, 2, 4], m = 1
  flip = np.stack([e, -e], axis=1)           # m = -1
  _close(macl(same)[1]['tau'], 0.2)
  _close(macl(flip)[1]['tau'], 0.05)
  _close(macl(same, variant='b')[1]['tau'], 0.15)
  _close(macl(flip, variant='b')[1]['tau'], 0.05)
  # alpha = 1 / beta = 0 switch the adaptation off.
  z = _rand(1, 6, 2, 5)
  _close(macl(z, alpha=1.0)[1]['tau'], 0.1)
  _close(macl(z, variant='b', beta=0.0)[1]['tau'], 0.1)
  # Better-aligned batches get a strictly larger temperature.
  taus = []
  for noise in (2.0, 1.0, 0.5, 0.1):
    base = _rand(2, 6, 1, 5)
    zz = base + noise * _rand(3, 6, 2, 5)
    taus.append([float(macl(zz, variant=v)[1]['tau']) for v in 'ab'])
  assert np.all(np.diff(np.array(taus), axis=0) > 0)


def test_fixed_temperature_eq14_by_hand():
  # alpha = 1: InfoNCE over the cross-view keys divided by W = 1 - P_pos.
  z = _rand(4, 5, 2, 6)
  u = ref.normalize(z)
  # Negatives of anchor (i, a): the other instances' view 1 - a.
  vals = []
  for a in range(2):
    for i in range(5):
      pos = np.exp(u[i, a] @ u[i, 1 - a] / 0.1)
      neg = sum(np.exp(u[i, a] @ u[j, 1 - a] / 0.1) for j in range(5) if j != i)
      p = pos / (pos + neg)
      vals.append(-np.log(p) / (1. - p))
  _close(macl(z, alpha=1.0)[0], np.mean(vals))


@pytest.mark.parametrize('layout', ['cross_view', 'simclr'])
def test_alpha_one_has_dcl_gradients(layout):
  # With tau fixed, grad(Eq. 14) == grad(DCL) (the logits' gradients are
  # -1/tau on the positive and P/tau on each negative in both); values differ.
  z = _rand(5, 5, 2, 4)
  z64 = z.astype(np.float64)
  g_dcl = ref.num_grad(lambda x: ref.dcl(x, temperature=0.1, layout=layout),
                       z64)
  g = _grad(z, alpha=1.0, layout=layout)
  np.testing.assert_allclose(g, g_dcl, atol=1e-4)
  loss, metrics = macl(z, alpha=1.0, layout=layout)
  _close(metrics['dcl'], ref.dcl(z, temperature=0.1, layout=layout))
  assert abs(float(loss) - float(metrics['dcl'])) > 1e-2


def test_stop_gradient_on_temperature_and_weights():
  # The paper treats tau' and W as constants of the step: autodiff ==
  # gradient with tau' and W frozen at the
  # current batch; forgetting either sg changes the gradient measurably.
  z = _rand(6, 4, 2, 4)
  z0 = z.astype(np.float64)
  frozen = ref.num_grad(lambda x: ref.macl(x, freeze=z0), z0)
  live = ref.num_grad(lambda x: ref.macl(x), z0)
  assert np.abs(frozen - live).max() > 1e-2
  np.testing.assert_allclose(_grad(z), frozen, atol=1e-4)


def test_loss_lower_bound_and_w_identity():
  # Per anchor Eq. 14 = -ln(1 - W)/W >= 1; log W = lse(neg) - lse(all).
  z = _rand(7, 8, 2, 6, scale=3.0)
  loss, metrics = macl(z)
  assert float(loss) >= 1.0
  u = ref.normalize(z)
  tau, _ = ref.macl_tau(z)
  logw = []
  for a in range(2):
    for i in range(8):
      s = np.array([u[i, a] @ u[j, 1 - a] for j in range(8)]) / tau
      p = np.exp(s[i]) / np.exp(s).sum()
      logw.append(np.log(1 - p))
  _close(metrics['log_w'], np.mean(logw))


def test_check_grads():
  z = jnp.asarray(_rand(8, 4, 2, 5))
  # At a fixed temperature the loss's gradient is that of its `dcl` metric
  # (the value it differentiates), so finite differences of that apply.
  for layout in ('cross_view', 'simclr'):
    fn = jax.jit(lambda x, layout=layout: macl(x, alpha=1.0, layout=layout))
    np.testing.assert_array_equal(
        jax.grad(lambda x: fn(x)[0])(z), jax.grad(lambda x: fn(x)[1]['dcl'])(z))
    check_grads(lambda x: fn(x)[1]['dcl'], (z,), order=1, modes=['rev'],
                atol=5e-3, rtol=5e-3, eps=1e-3)


def test_easy_anchor_float32_robustness():
  # W ~ e^{-2/tau} underflows 1 - P_pos in float32. Two
  # instances, antipodal, views nearly identical; tau = 0.05 (alpha = 1).
  e = np.array([1., 0., 0., 0.], np.float32)
  d = np.array([0., 1., 0., 0.], np.float32)
  z = np.stack([np.stack([e, e + 0.01 * d]), np.stack([-e, -e - 0.01 * d])])
  loss, metrics = macl(z, temperature=0.05, alpha=1.0)
  assert np.isfinite(float(loss))
  assert float(loss) == pytest.approx(1.0, abs=1e-5)
  # log W ~ s_neg/tau - s_pos/tau ~ -2/tau = -40 (float32's 1 - P gives -inf).
  u = ref.normalize(z)
  x = [(u[i, a] @ u[1 - i, 1 - a] - u[i, a] @ u[i, 1 - a]) / 0.05
       for i in range(2) for a in range(2)]
  _close(metrics['log_w'], np.mean(x), 1e-3)
  # The gradient keeps DCL's size instead of vanishing with W.
  g = _grad(z, temperature=0.05, alpha=1.0)
  g_dcl = ref.num_grad(lambda x: ref.dcl(x, temperature=0.05),
                       z.astype(np.float64))
  assert np.abs(g_dcl).max() > 0.1
  np.testing.assert_allclose(g, g_dcl, atol=2e-3 * np.abs(g_dcl).max())


def test_value_errors():
  with pytest.raises(ValueError, match=r'z must have shape \[N, V, D\]'):
    macl_eager(jnp.zeros((4, 8)))
  with pytest.raises(ValueError, match='at least 2 views'):
    macl_eager(jnp.zeros((4, 1, 8)))
  with pytest.raises(ValueError, match='N >= 2'):
    macl_eager(jnp.zeros((1, 2, 8)))
  with pytest.raises(ValueError, match='variant'):
    macl_eager(jnp.ones((4, 2, 8)), variant='c')
  with pytest.raises(ValueError, match='layout'):
    macl_eager(jnp.ones((4, 2, 8)), layout='full')


@pytest.mark.parametrize('layout', ['cross_view', 'simclr'])
def test_alpha_one_matches_baselines_dcl_gradients(layout):
  # Same check against the library's DCL baseline (same layout names).
  from contrastive_jax.losses import dcl
  z = jnp.asarray(_rand(10, 6, 3, 5))
  (value, _), g_dcl = jax.jit(jax.value_and_grad(
      lambda x: dcl(x, temperature=0.1, layout=layout), has_aux=True))(z)
  np.testing.assert_allclose(_grad(z, alpha=1.0, layout=layout),
                             np.asarray(g_dcl), atol=1e-5)
  _close(macl(z, alpha=1.0, layout=layout)[1]['dcl'], float(value))
