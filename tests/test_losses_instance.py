"""Tests for instance-discrimination losses: ntxent, infonce, insdis, cmc."""

import jax
from jax.test_util import check_grads
import numpy as np
import pytest

from contrastive_jax.losses import instance
import numpy_reference as ref
import numpy_reference_methods as ref_methods

TOL = dict(rtol=1e-5, atol=1e-5)
J = ref.jit_call


def rand(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# ----------------------------------------------------------------- ntxent ---

@pytest.mark.parametrize('v,tau', [(2, 0.1), (3, 0.5), (4, 0.1)])
def test_ntxent_matches_reference(v, tau):
  z = rand(6, v, 8, seed=v)
  loss, _ = J(instance.ntxent, z, temperature=tau)
  np.testing.assert_allclose(loss, ref.ntxent(z, tau), **TOL)


def test_ntxent_v2_is_simclr_cross_entropy():
  z = rand(6, 2, 8, seed=1)
  loss, _ = J(instance.ntxent, z, temperature=0.2)
  np.testing.assert_allclose(loss, ref.ntxent_v2_crossentropy(z, 0.2), **TOL)


def test_ntxent_gradient_matches_float64_finite_differences():
  z = rand(4, 3, 5, seed=2)
  g = ref.fast_jit(jax.grad(
      lambda x: instance.ntxent(x, temperature=0.3)[0]))(z)
  g_ref = ref_methods.num_grad(lambda x: ref.ntxent(x, 0.3), z)
  np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


def test_ntxent_invariances():
  z = rand(6, 3, 8, seed=3)
  base, _ = J(instance.ntxent, z)
  perm = np.random.RandomState(0).permutation(6)
  np.testing.assert_allclose(J(instance.ntxent, z[perm])[0], base, **TOL)
  np.testing.assert_allclose(J(instance.ntxent, z[:, ::-1])[0], base, **TOL)
  # Scale invariance: inputs are normalised inside.
  np.testing.assert_allclose(J(instance.ntxent, 3.7 * z)[0], base, **TOL)


def test_ntxent_rejects_bad_shapes():
  with pytest.raises(ValueError, match='z has 1 views'):
    J(instance.ntxent, rand(4, 1, 8))
  with pytest.raises(ValueError, match=r'z must have shape \[N, V, D\]'):
    J(instance.ntxent, rand(4, 8))


# ---------------------------------------------------------------- infonce ---

def test_infonce_moco_v2_queue_only():
  q, k = rand(6, 1, 8, seed=4), rand(6, 1, 8, seed=5)
  queue = rand(10, 8, seed=6)
  loss, m = J(instance.infonce, q, k, queue=queue, temperature=0.2,
                             in_batch_negatives=False)
  np.testing.assert_allclose(
      loss, ref.infonce(q, k, queue, 0.2, in_batch=False), **TOL)
  assert 0. <= m['acc'] <= 1.


@pytest.mark.parametrize('vq,vk,with_queue', [
    (1, 1, True), (1, 1, False), (2, 2, False), (2, 2, True), (3, 3, True),
    (3, 1, False)])
def test_infonce_matches_reference(vq, vk, with_queue):
  q, k = rand(6, vq, 8, seed=7), rand(6, vk, 8, seed=8)
  queue = rand(5, 8, seed=9) if with_queue else None
  loss, _ = J(instance.infonce, q, k, queue=queue, temperature=0.2)
  np.testing.assert_allclose(loss, ref.infonce(q, k, queue, 0.2), **TOL)


def test_infonce_empty_queue_equals_in_batch():
  q, k = rand(6, 2, 8, seed=10), rand(6, 2, 8, seed=11)
  none, m_none = J(instance.infonce, q, k)
  empty, m_empty = J(instance.infonce, q, k, queue=np.zeros((0, 8), np.float32))
  np.testing.assert_allclose(empty, none, **TOL)
  for name in m_none:
    np.testing.assert_allclose(m_empty[name], m_none[name], **TOL)


def test_infonce_symmetric_equals_half_two_view_cmc():
  # MoCo v3's symmetric loss with q = k is CMC's L(V1, V2) averaged instead of
  # summed over its two directions; with a shared queue too.
  z, queue = rand(6, 2, 8, seed=12), rand(4, 8, seed=13)
  loss, _ = J(instance.infonce, z, z, queue=queue, temperature=0.1)
  cmc_loss, _ = J(instance.cmc, z, queue=queue, temperature=0.1)
  np.testing.assert_allclose(2 * loss, cmc_loss, **TOL)


def test_infonce_gradients_none_into_key_and_queue():
  q, k, queue = rand(6, 2, 8, seed=14), rand(6, 2, 8, seed=15), rand(5, 8)
  gq, gk, gqueue = ref.grads_with_fd_check(
      lambda a, b, c: instance.infonce(a, b, queue=c), q, k, queue)
  assert np.all(np.asarray(gk) == 0) and np.all(np.asarray(gqueue) == 0)
  assert np.any(np.asarray(gq) != 0)


def test_infonce_check_grads_query():
  k, queue = rand(5, 2, 6, seed=16), rand(4, 6, seed=17)
  f = jax.jit(lambda q: instance.infonce(q, k, queue=queue)[0])
  check_grads(f, (rand(5, 2, 6, seed=18),), order=1, modes=['rev'],
              eps=1e-3, atol=1e-2, rtol=1e-2)


def test_infonce_view_swap_invariance():
  q, k, queue = rand(6, 2, 8, seed=19), rand(6, 2, 8, seed=20), rand(3, 8)
  base, _ = J(instance.infonce, q, k, queue=queue)
  swapped, _ = J(instance.infonce, q[:, ::-1], k[:, ::-1], queue=queue)
  np.testing.assert_allclose(swapped, base, **TOL)
  perm = np.random.RandomState(1).permutation(6)
  np.testing.assert_allclose(
      J(instance.infonce, q[perm], k[perm], queue=queue)[0], base, **TOL)


def test_infonce_rejects_bad_inputs():
  q = rand(4, 1, 8)
  with pytest.raises(ValueError, match='share the embedding dim'):
    J(instance.infonce, q, rand(4, 1, 6))
  with pytest.raises(ValueError, match=r'queue must have shape \[Q, 8\]'):
    J(instance.infonce, q, q, queue=rand(3, 6))
  with pytest.raises(ValueError, match='no negatives'):
    J(instance.infonce, q, q, in_batch_negatives=False)
  with pytest.raises(ValueError, match='key must have 1 view'):
    J(instance.infonce, rand(4, 3, 8), rand(4, 2, 8))
  with pytest.raises(ValueError, match='same N instances'):
    J(instance.infonce, q, rand(5, 1, 8))


# ----------------------------------------------------------------- insdis ---

def test_insdis_shared_noise_matches_reference():
  q, k = rand(5, 1, 8, seed=24), rand(5, 1, 8, seed=25)
  queue = rand(9, 8, seed=26)
  loss, m = J(instance.insdis, q, k, queue=queue, num_data=500, temperature=0.1,
              proximal_weight=3.)
  want, z_est = ref.insdis(q, k, queue, 0.1, 500, 3.)
  np.testing.assert_allclose(loss, want, **TOL)
  np.testing.assert_allclose(m['nce_z'], z_est, rtol=1e-5)
  # Permuting instances (query and bank rows together) or the noise rows
  # leaves the mean (and the batch's Z estimate) unchanged.
  perm = np.random.RandomState(3).permutation(5)
  permuted, _ = J(instance.insdis, q[perm], k[perm], queue=queue[::-1],
                  num_data=500, temperature=0.1, proximal_weight=3.)
  np.testing.assert_allclose(permuted, loss, **TOL)


def test_insdis_proximal_term_pulls_query_to_bank_row():
  # With the NCE part removed from the comparison (same inputs), the loss
  # difference is exactly lambda * mean ||f - v||^2.
  q, k = rand(4, 1, 8, seed=30), rand(4, 1, 8, seed=31)
  queue = rand(5, 8, seed=32)
  l0, _ = J(instance.insdis, q, k, queue=queue, num_data=50, proximal_weight=0.)
  l1, m = J(instance.insdis, q, k, queue=queue, num_data=50, proximal_weight=2.)
  f, v = ref.unit(q)[:, 0], ref.unit(k)[:, 0]
  prox = np.mean(np.sum((f - v) ** 2, -1))
  np.testing.assert_allclose(l1 - l0, 2. * prox, rtol=1e-4)
  np.testing.assert_allclose(m['proximal'], prox, rtol=1e-5)


def test_insdis_per_instance_noise_matches_reference():
  # Each instance has its own noise rows ([N, m, D]), as lemniscate draws them.
  q, k = rand(5, 1, 8, seed=33), rand(5, 1, 8, seed=34)
  noise = rand(5, 6, 8, seed=35)
  loss, m = J(instance.insdis, q, k, queue=noise, num_data=700,
              temperature=0.1, proximal_weight=3.)
  want, z_est = ref.insdis(q, k, noise, 0.1, 700, 3.)
  np.testing.assert_allclose(loss, want, **TOL)
  np.testing.assert_allclose(m['nce_z'], z_est, rtol=1e-5)
  # Per-instance noise is not the shared one: instance 0's rows for all.
  shared, m_shared = J(instance.insdis, q, k, queue=noise[0], num_data=700,
                       temperature=0.1, proximal_weight=3.)
  want_shared, z_shared = ref.insdis(q, k, noise[0], 0.1, 700, 3.)
  np.testing.assert_allclose(shared, want_shared, **TOL)
  np.testing.assert_allclose(m_shared['nce_z'], z_shared, rtol=1e-5)
  assert abs(float(shared) - float(loss)) > 1e-3
  # Identical rows for every instance reduce to the shared form.
  tiled, _ = J(instance.insdis, q, k, queue=np.stack([noise[0]] * 5),
               num_data=700, temperature=0.1, proximal_weight=3.)
  np.testing.assert_allclose(tiled, shared, **TOL)


def test_insdis_gradients_none_into_bank_rows():
  # Per-instance noise; shared [m, D] noise takes the queue path that the
  # infonce and cmc gradient tests check. Z is a constant of the step
  # (stop_gradient): the reference freezes it at the batch's estimate.
  q, k = rand(4, 1, 6, seed=36), rand(4, 1, 6, seed=37)
  noise = rand(4, 3, 6, seed=38)
  gq, gk, gnoise = ref.fast_jit(jax.grad(
      lambda a, b, c: instance.insdis(a, b, queue=c, num_data=100,
                                      temperature=0.5)[0],
      argnums=(0, 1, 2)))(q, k, noise)
  assert np.all(np.asarray(gk) == 0) and np.all(np.asarray(gnoise) == 0)
  _, z_est = ref.insdis(q, k, noise, 0.5, 100, 50.)
  g_ref = ref_methods.num_grad(
      lambda x: ref.insdis(x, k, noise, 0.5, 100, 50., nce_z=z_est)[0], q)
  np.testing.assert_allclose(gq, g_ref, rtol=1e-4, atol=1e-4)


def test_insdis_rejects_bad_inputs():
  q = rand(4, 1, 8)
  with pytest.raises(ValueError, match='needs noise rows'):
    J(instance.insdis, q, q, queue=None, num_data=10)
  with pytest.raises(ValueError, match='at least one noise row'):
    J(instance.insdis, q, q, queue=np.zeros((0, 8), np.float32), num_data=10)
  with pytest.raises(ValueError, match='query has 2 views'):
    J(instance.insdis, rand(4, 2, 8), q, queue=rand(3, 8), num_data=10)
  with pytest.raises(ValueError, match=r'queue must have shape \[Q, 8\]'):
    J(instance.insdis, q, q, queue=rand(3, 7), num_data=10)
  with pytest.raises(ValueError, match=r'shape \[4, m, 8\]'):
    J(instance.insdis, q, q, queue=rand(3, 5, 8), num_data=10)


# -------------------------------------------------------------------- cmc ---

@pytest.mark.parametrize('v,graph,with_queue', [
    (2, 'core', False), (3, 'core', True), (3, 'full', False),
    (4, 'full', True), (4, 'core', False)])
def test_cmc_matches_reference(v, graph, with_queue):
  z = rand(6, v, 8, seed=40 + v)
  queue = rand(5, 8, seed=41) if with_queue else None
  loss, m = J(instance.cmc, z, graph=graph, queue=queue, temperature=0.2)
  np.testing.assert_allclose(loss, ref.cmc(z, 0.2, graph, queue), **TOL)
  want_pairs = v - 1 if graph == 'core' else v * (v - 1) // 2
  assert m['num_pairs'] == want_pairs


def test_cmc_graphs_agree_for_two_views_and_differ_for_three():
  z2, z3 = rand(6, 2, 8, seed=50), rand(6, 3, 8, seed=51)
  np.testing.assert_allclose(J(instance.cmc, z2, graph='core')[0],
                             J(instance.cmc, z2, graph='full')[0], **TOL)
  assert abs(J(instance.cmc, z3, graph='core')[0]
             - J(instance.cmc, z3, graph='full')[0]) > 1e-3


def test_cmc_view_symmetries():
  z = rand(6, 4, 8, seed=52)
  full, _ = J(instance.cmc, z, graph='full')
  core, _ = J(instance.cmc, z, graph='core')
  np.testing.assert_allclose(
      J(instance.cmc, z[:, [2, 0, 3, 1]], graph='full')[0], full, **TOL)
  # 'core' is symmetric in the non-core views only.
  np.testing.assert_allclose(
      J(instance.cmc, z[:, [0, 3, 1, 2]], graph='core')[0], core, **TOL)
  perm = np.random.RandomState(2).permutation(6)
  np.testing.assert_allclose(J(instance.cmc, z[perm], graph='full')[0], full,
                             **TOL)


def test_cmc_gradients_and_no_gradient_into_queue():
  z, queue = rand(5, 3, 6, seed=53), rand(4, 6, seed=54)
  gz, gqueue = ref.grads_with_fd_check(
      lambda a, b: instance.cmc(a, queue=b, graph='full', temperature=0.3),
      z, queue)
  assert np.all(np.asarray(gqueue) == 0) and np.any(np.asarray(gz) != 0)


def test_cmc_rejects_bad_inputs():
  with pytest.raises(ValueError, match="graph must be 'core' or 'full'"):
    J(instance.cmc, rand(4, 3, 8), graph='star')
  with pytest.raises(ValueError, match='z has 1 views'):
    J(instance.cmc, rand(4, 1, 8))
