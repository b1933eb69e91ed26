"""Alignment/uniformity against closed forms; plots write real PNGs."""

import numpy as np
import pytest

from contrastive_jax import step as step_lib
from contrastive_jax.evaluators import diagnostics
from numpy_reference import f32_rtol

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def circle(n, dim=2, scale=1.0):
  theta = 2 * np.pi * np.arange(n) / n
  z = np.zeros((n, dim), np.float32)
  z[:, 0], z[:, 1] = np.cos(theta), np.sin(theta)
  return scale * z


def test_alignment_closed_forms():
  rng = np.random.default_rng(0)
  z = rng.normal(size=(50, 16)).astype(np.float32)
  assert float(diagnostics.alignment(z, 3.0 * z)) == pytest.approx(0, abs=1e-6)
  for alpha in (1.0, 2.0, 3.0):
    # Antipodal unit vectors are 2 apart: 2^alpha = 4^(alpha / 2).
    got = float(diagnostics.alignment(z, -z, alpha))
    assert got == pytest.approx(4 ** (alpha / 2), rel=1e-5)
  # Generic pairs: |a - b|^2 = 2 - 2 cos(a, b) for unit vectors.
  w = rng.normal(size=(50, 16))
  cos = np.sum(z * w, 1) / np.linalg.norm(z, axis=1) / np.linalg.norm(w, axis=1)
  assert float(diagnostics.alignment(z, w)) == pytest.approx(
      np.mean(2 - 2 * cos), rel=1e-5)


def test_uniformity_identical_and_antipodal():
  z = np.tile(np.array([[0.6, 0.8, 0.0]], np.float32), (40, 1))
  # 0 = lse - log(780 pairs): two float32 values of size log(780) = 6.7
  # cancel (1 ulp there is 4.8e-7, what the old fixed atol 1e-6 allowed
  # twice), plus t ||z - z||^2 = t (2 - 2 z.z) with z.z = 1 to a few ulps.
  assert float(diagnostics.uniformity(z)) == pytest.approx(
      0, abs=f32_rtol() * (np.log(40 * 39 / 2) + 2 * 2.))
  pair = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
  for t in (1.0, 2.0):
    # One pair at squared distance 4: log exp(-4t).
    assert float(diagnostics.uniformity(pair, t)) == pytest.approx(-4 * t,
                                                                   rel=1e-6)


@pytest.mark.parametrize('n', [33, 64, 2500])   # 2500 spans 3 row blocks
@pytest.mark.parametrize('t', [1.0, 2.0])
def test_uniformity_points_on_a_circle(n, t):
  # |z_i - z_j|^2 = 2 - 2 cos(2 pi m / n), m = j - i. The mean over the n
  # offsets m = 0..n-1 of exp(-2t (1 - cos(2 pi m / n))) is e^{-2t} I0(2t)
  # (trapezoid rule on a periodic analytic integrand: exact up to terms
  # I_n(2t) ~ (t^n / n!), negligible for n >= 33). Dropping m = 0 (value 1)
  # leaves the mean over distinct pairs.
  bessel = (n * np.exp(-2 * t) * np.i0(2 * t) - 1) / (n - 1)
  finite_sum = np.mean([np.exp(-2 * t * (1 - np.cos(2 * np.pi * m / n)))
                        for m in range(1, n)])
  assert bessel == pytest.approx(finite_sum, rel=1e-12)
  got = float(diagnostics.uniformity(circle(n, dim=5, scale=2.5), t))
  assert got == pytest.approx(np.log(bessel), abs=2e-5)


def test_uniformity_gradient_is_finite_when_a_block_has_no_pair():
  # N = 1025: the second row block holds only the last row, which has no
  # partner j > i. The value is numpy's and the gradient, which AU-CL
  # takes through this function, is finite.
  import jax  # pylint: disable=g-import-not-at-top
  z = np.random.default_rng(0).normal(size=(1025, 4)).astype(np.float32)
  value, grad = jax.value_and_grad(diagnostics.uniformity)(z)
  assert np.all(np.isfinite(np.asarray(grad)))
  u = z / np.linalg.norm(z, axis=1, keepdims=True)
  sq = np.sum((u[:, None].astype(np.float64) - u[None]) ** 2, -1)
  iu = np.triu_indices(1025, 1)
  assert float(value) == pytest.approx(
      np.log(np.mean(np.exp(-2. * sq[iu]))), abs=2e-5)


def test_similarity_histograms(tmp_path):
  n = 6
  z = np.eye(n, 8, dtype=np.float32) * 2.0      # orthogonal: negatives are 0
  labels = np.array([0, 0, 1, 1, 2, 2])
  path = tmp_path / 'sims.png'
  out = diagnostics.similarity_histograms(z, z, labels=labels, bins=10,
                                          path=str(path))
  np.testing.assert_allclose(out['positive'], np.ones(n), atol=1e-6)
  assert out['negative'].shape == (n * (n - 1) - n,)  # minus same-class pairs
  np.testing.assert_allclose(out['negative'], 0, atol=1e-6)
  # Densities integrate to 1 over [-1, 1].
  width = np.diff(out['bin_edges'])
  assert np.sum(out['positive_hist'] * width) == pytest.approx(1.0)
  assert np.sum(out['negative_hist'] * width) == pytest.approx(1.0)
  assert path.read_bytes()[:8] == PNG_MAGIC

  # Sampled negatives never include a positive (i == j) pair.
  sampled = diagnostics.similarity_histograms(z, z, max_negatives=7)
  assert sampled['negative'].shape == (7,)
  np.testing.assert_allclose(sampled['negative'], 0, atol=1e-6)


def test_embedding_plot_pca_preserves_planar_geometry(tmp_path):
  rng = np.random.default_rng(0)
  plane = rng.normal(size=(300, 2)) * np.array([5.0, 1.0])
  rotation, _ = np.linalg.qr(rng.normal(size=(12, 12)))
  feats = plane @ rotation[:2] + rng.normal(size=12)   # rotated + shifted
  labels = (plane[:, 0] > 0).astype(int) + 2 * (plane[:, 1] > 0)
  path = tmp_path / 'pca.png'
  coords = diagnostics.embedding_plot(feats, labels, str(path))
  assert coords.shape == (300, 2)
  # Data on a 2-D plane: PCA is a rigid motion of it.
  def pdist(x):
    return np.linalg.norm(x[:, None] - x[None], axis=-1)
  np.testing.assert_allclose(pdist(coords), pdist(plane), atol=1e-8)
  # The first component carries the larger spread.
  assert coords[:, 0].var() > coords[:, 1].var()
  assert path.read_bytes()[:8] == PNG_MAGIC
  with pytest.raises(ValueError, match="'pca' or 'tsne'"):
    diagnostics.embedding_plot(feats, labels, str(path), method='umap')


def test_tsne_keeps_separated_clusters_separated():
  """Four tight clusters far apart in 64-d (on the sphere): in the t-SNE
  map each point's nearest neighbours are of its own cluster."""
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(4, 64)) * 10
  labels = np.repeat(np.arange(4), 50)
  feats = centres[labels] + rng.normal(size=(200, 64))
  coords = diagnostics.project_2d(feats, 'tsne', seed=0)
  assert coords.shape == (200, 2)
  d = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
  np.fill_diagonal(d, np.inf)
  nearest = np.argsort(d, axis=1)[:, :5]
  assert np.mean(labels[nearest] == labels[:, None]) > 0.99


# --- CACR conditional entropy H(X^-|X) -------------------------------------


def _binary_entropy(delta_cost, t):
  # Two negatives whose costs differ by delta: weights 1 / (1 + e^{t delta})
  # and e^{t delta} / (1 + e^{t delta}).
  p = 1.0 / (1.0 + np.exp(t * delta_cost))
  return -(p * np.log(p) + (1 - p) * np.log(1 - p))


@pytest.mark.parametrize('m', [2, 5, 64])
def test_conditional_entropy_uniform_weights_is_log_m_minus_1(m):
  rng = np.random.default_rng(0)
  z = rng.normal(size=(m, 8)).astype(np.float32)
  # Identical embeddings: every negative at cost 0, uniform weights.
  same = np.tile(z[:1], (m, 1))
  assert float(diagnostics.conditional_entropy(same, t_neg=3.)) == (
      pytest.approx(np.log(m - 1), abs=1e-5))
  # t_neg = 0 ignores the costs: uniform again, whatever the embeddings.
  assert float(diagnostics.conditional_entropy(z, t_neg=0.)) == (
      pytest.approx(np.log(m - 1), abs=1e-5))


def test_conditional_entropy_two_negatives_closed_form():
  e1, e2 = np.eye(3, dtype=np.float32)[:2]
  z_a = np.stack([e1, e1, e1])
  z_b = np.stack([e1, -e1, e2])
  # Query 0 sees {-e1: cost 4, e2: 2}; query 1 {e1: 0, e2: 2}; query 2
  # {e1: 0, -e1: 4}. Cost gaps 2, 2 and 4.
  for t in (0.5, 1.0, 2.0):
    want = np.mean([_binary_entropy(2, t), _binary_entropy(2, t),
                    _binary_entropy(4, t)])
    got = float(diagnostics.conditional_entropy(z_a, z_b, t_neg=t))
    assert got == pytest.approx(want, rel=1e-5)


def _entropy_of_costs(costs, t):
  w = np.exp(-t * (np.asarray(costs) - np.min(costs)))
  w /= w.sum()
  w = w[w > 0]
  return -np.sum(w * np.log(w))


def test_conditional_entropy_hard_negatives_limit():
  e1 = np.eye(3, dtype=np.float32)[1]
  z_a = np.stack([e1, -e1, e1, -e1])
  z_b = np.stack([e1, -e1, -e1, e1])
  # Costs of the negatives j != i, by hand (0 for equal, 4 for antipodal):
  # query 0 (e1) vs [-e1, -e1, e1]; query 1 (-e1) vs [e1, -e1, e1];
  # query 2 (e1) vs [e1, -e1, e1]; query 3 (-e1) vs [e1, -e1, -e1].
  costs = [[4, 4, 0], [4, 0, 4], [0, 4, 0], [4, 0, 0]]
  for t in (0.3, 20.):
    want = np.mean([_entropy_of_costs(c, t) for c in costs])
    got = float(diagnostics.conditional_entropy(z_a, z_b, t_neg=t))
    assert got == pytest.approx(want, rel=1e-5)
  # Large t: all weight on the cost-0 negatives: entropy 0 for queries 0-1
  # (one such negative), log 2 for queries 2-3 (two of them).
  got = float(diagnostics.conditional_entropy(z_a, z_b, t_neg=20.))
  assert got == pytest.approx(np.log(2) / 2, abs=1e-6)


# --- MACL semantic sensitivity ----------------------------------------------


def test_semantic_sensitivity_closed_forms():
  labels = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
  m = len(labels)
  same_offdiag = (np.sum((labels[:, None] == labels[None]).astype(int))
                  - m) / (m * (m - 1))
  # Collapse: cos = 1 everywhere; same-class pairs score 1, others e^-4.
  f = np.tile(np.array([[0.3, -0.4, 1.2]], np.float32), (m, 1))
  got = float(diagnostics.semantic_sensitivity(f, labels))
  assert got == pytest.approx(same_offdiag + (1 - same_offdiag) * np.exp(-4),
                              rel=1e-5)
  # Orthogonal features: cos = 0, every pair scores e^-1.
  got = float(diagnostics.semantic_sensitivity(
      np.eye(m, dtype=np.float32) * 2., labels))
  assert got == pytest.approx(np.exp(-1), rel=1e-5)


def test_semantic_sensitivity_perfect_antipodal_two_classes_is_one():
  labels = np.array([0, 1] * 1100)          # 2200 points: 3 row blocks
  f = np.where(labels[:, None] == 0, 1., -1.) * np.array([[0.6, 0.8]])
  got = float(diagnostics.semantic_sensitivity(f.astype(np.float32), labels))
  assert got == pytest.approx(1.0, abs=1e-6)


def test_semantic_sensitivity_matches_brute_force_with_second_encoder():
  rng = np.random.default_rng(3)
  f = rng.normal(size=(40, 6))
  g = rng.normal(size=(40, 6))
  labels = rng.integers(0, 3, 40)
  fn = f / np.linalg.norm(f, axis=1, keepdims=True)
  gn = g / np.linalg.norm(g, axis=1, keepdims=True)
  h = np.where(labels[:, None] == labels[None], 1., -1.)
  e = np.exp(-(h - fn @ gn.T) ** 2)
  want = e[~np.eye(40, dtype=bool)].mean()
  got = float(diagnostics.semantic_sensitivity(
      f.astype(np.float32), labels, g.astype(np.float32)))
  assert got == pytest.approx(want, rel=1e-5)


def test_train_step_monitors_pick_the_positive_partner():
  """step_lib.alignment_uniformity: view 1 is view 0's partner; with one view
  the key; with neither, no alignment. Closed forms on unit vectors."""
  from contrastive_jax import train
  z0 = np.array([[1., 0.], [-1., 0.]], np.float32)      # Antipodal pair.
  two_views = np.stack([z0, 3 * z0], axis=1)            # Same directions.
  m = step_lib.alignment_uniformity(two_views, key=-two_views)
  np.testing.assert_allclose(m['alignment'], 0., atol=1e-6)
  # One pair at squared distance 4: log exp(-2 * 4) = -8.
  np.testing.assert_allclose(m['uniformity'], -8., rtol=1e-6)
  one_view = z0[:, None]
  m = step_lib.alignment_uniformity(one_view, key=-one_view)   # Opposite keys.
  np.testing.assert_allclose(m['alignment'], 4., rtol=1e-6)
  assert 'alignment' not in step_lib.alignment_uniformity(one_view, key=None)
