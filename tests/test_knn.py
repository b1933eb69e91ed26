"""kNN evaluator against an independent float64 brute force, ties included."""

import re

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from contrastive_jax.evaluators import knn


def brute_force_knn(bank, bank_labels, queries, *, num_classes, k, temperature,
                    normalize):
  """Reference: per-query loops in float64, ties resolved as documented.

  Returns (weighted_pred [Q], majority_pred [Q], weighted_margin [Q],
  majority_tied [Q]); the margin is the relative gap between the best and the
  best other class score (0 for an exact tie), used to check that the test
  data is well posed.
  """
  bank = np.asarray(bank, np.float64)
  queries = np.asarray(queries, np.float64)
  if normalize:
    bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
  weighted, majority, margins, majority_tied = [], [], [], []
  for q in queries:
    sims = [float(np.dot(q, b)) for b in bank]
    # Sort by similarity descending, then bank index ascending.
    order = sorted(range(len(bank)), key=lambda i: (-sims[i], i))[:k]
    w_score = [0.0] * num_classes
    m_score = [0] * num_classes
    for i in order:
      w_score[bank_labels[i]] += np.exp(sims[i] / temperature)
      m_score[bank_labels[i]] += 1
    best_w = max(w_score)
    best_m = max(m_score)
    pred_w = min(c for c in range(num_classes) if w_score[c] == best_w)
    weighted.append(pred_w)
    majority.append(min(c for c in range(num_classes) if m_score[c] == best_m))
    majority_tied.append(m_score.count(best_m) > 1)
    others = [s for c, s in enumerate(w_score) if c != pred_w]
    margins.append((best_w - max(others)) / best_w)
  return (np.array(weighted), np.array(majority), np.array(margins),
          np.array(majority_tied))


def exact_tie_data(seed, n_bank, n_query, dim=12, num_classes=4):
  """Features whose cosine similarities are exact in float32.

  Every row has 4 non-zeros of +-s with s in {1, 2, 4}, so normalised entries
  are +-0.5 and all similarities are multiples of 1/4: exact in float32 and
  float64, with many exactly equal values. Duplicate bank rows carrying
  different labels make equal similarities with different classes and hence
  equal class votes.
  """
  rng = np.random.default_rng(seed)

  def rows(n):
    x = np.zeros((n, dim), np.float32)
    for r in range(n):
      cols = rng.choice(dim, size=4, replace=False)
      x[r, cols] = rng.choice([-1.0, 1.0], size=4)
    return x * rng.choice([1.0, 2.0, 4.0], size=(n, 1)).astype(np.float32)

  bank = rows(n_bank)
  labels = rng.integers(0, num_classes, n_bank)
  # Duplicates spread over the bank (and so over shards), each paired with a
  # different label from its source row.
  src = rng.choice(n_bank // 2, size=n_bank // 6, replace=False)
  dst = rng.choice(np.arange(n_bank // 2, n_bank), size=src.size,
                   replace=False)
  bank[dst] = bank[src]
  labels[dst] = (labels[src] + 1 + rng.integers(0, num_classes - 1,
                                                src.size)) % num_classes
  queries = rows(n_query)
  queries[:5] = bank[src[:5]] * 2.0   # queries equal to duplicated rows
  return bank, labels, queries


@pytest.fixture(scope='module')
def mesh8():
  # Explicit axes (the make_mesh default) on purpose: it is the stricter mode
  # (shard_map will not reshard implicitly), so it exercises knn's placement.
  return jax.make_mesh((8,), ('data',), axis_types=(AxisType.Explicit,))


BANK = 203          # not a multiple of 8: the sharded bank needs padding
KS = (1, 2, 3, 10, 50, BANK)  # k = N: every real row, never a padding row


@pytest.mark.parametrize('sharded', [False, True])
@pytest.mark.parametrize('normalize', [True, False])
def test_matches_brute_force_with_exact_ties(sharded, normalize, mesh8):
  bank, labels, queries = exact_tie_data(0, BANK, 45)
  if not normalize:
    # Raw dot products: unit rows with entries +-0.5 keep them exact.
    bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
  temperature = 0.5
  preds = knn.knn_predict(
      bank, labels, queries, num_classes=4, ks=KS, temperature=temperature,
      mesh=mesh8 if sharded else None, query_chunk=8, normalize=normalize)
  n_weighted_ties = n_majority_ties = 0
  for i, k in enumerate(KS):
    want_w, want_m, margin, m_tied = brute_force_knn(
        bank, labels, queries, num_classes=4, k=k, temperature=temperature,
        normalize=normalize)
    # Well posed: every weighted vote is an exact tie or clearly decided.
    assert np.all((margin == 0) | (margin > 1e-4))
    n_weighted_ties += int(np.sum(margin == 0))
    np.testing.assert_array_equal(np.asarray(preds.weighted[i]), want_w,
                                  err_msg=f'weighted k={k}')
    np.testing.assert_array_equal(np.asarray(preds.majority[i]), want_m,
                                  err_msg=f'majority k={k}')
    n_majority_ties += int(np.sum(m_tied))
  # The data really exercises the tie rules.
  assert n_weighted_ties >= 5
  assert n_majority_ties >= 20


@pytest.mark.parametrize('mesh_kind', ['none', 'explicit', 'auto'])
@pytest.mark.parametrize('query_chunk', [None, 7])
def test_random_features_match_brute_force(mesh_kind, query_chunk, mesh8):
  rng = np.random.default_rng(1)
  centers = rng.normal(size=(5, 32))
  bank_labels = rng.integers(0, 5, 301)
  bank = centers[bank_labels] + 1.5 * rng.normal(size=(301, 32))
  query_labels = rng.integers(0, 5, 60)
  queries = centers[query_labels] + 1.5 * rng.normal(size=(60, 32))
  bank, queries = bank.astype(np.float32), queries.astype(np.float32)
  mesh = {'none': None, 'explicit': mesh8,
          'auto': jax.make_mesh((8,), ('x',), axis_types=(AxisType.Auto,))
          }[mesh_kind]
  ks = (20, 1, 5)
  preds = knn.knn_predict(bank, bank_labels, queries, num_classes=5, ks=ks,
                          temperature=0.07, mesh=mesh, query_chunk=query_chunk)
  bank64 = bank / np.linalg.norm(bank, axis=1, keepdims=True)
  q64 = queries / np.linalg.norm(queries, axis=1, keepdims=True)
  sims = np.sort(q64.astype(np.float64) @ bank64.T, axis=1)[:, ::-1]
  for i, k in enumerate(ks):
    want_w, want_m, margin, _ = brute_force_knn(
        bank, bank_labels, queries, num_classes=5, k=k, temperature=0.07,
        normalize=True)
    # float32 vs float64 may legitimately differ on near-ties; compare the
    # queries whose k-th/(k+1)-th similarity gap and vote margin are clear.
    clear = (sims[:, k - 1] - sims[:, k] > 1e-5) & (margin > 1e-4)
    assert clear.mean() > 0.8
    np.testing.assert_array_equal(np.asarray(preds.weighted[i])[clear],
                                  want_w[clear])
    np.testing.assert_array_equal(np.asarray(preds.majority[i])[clear],
                                  want_m[clear])


def test_knn_evaluate_keys_and_accuracies(mesh8):
  bank, labels, queries = exact_tie_data(2, 77, 30, num_classes=3)
  rng = np.random.default_rng(3)
  query_labels = rng.integers(0, 3, 30)
  ks = (10, 1)
  # A bank already sharded on device, with a size divisible by 8 after a
  # caller-side pad, must give the same numbers as the host bank.
  sharded_feats, sharded_labels, n = knn.shard_bank(bank, labels, mesh8)
  assert n == 77 and sharded_feats.shape == (80, 12)
  assert sharded_feats.sharding.spec == P('data', None)
  for mesh in (None, mesh8):
    got = knn.knn_evaluate(bank, labels, queries, query_labels, num_classes=3,
                           ks=ks, temperature=0.1, mesh=mesh)
    assert list(got) == ['knn_weighted_top1@10', 'knn_majority_top1@10',
                         'knn_weighted_top1@1', 'knn_majority_top1@1']
    for k in ks:
      want_w, want_m, _, _ = brute_force_knn(
          bank, labels, queries, num_classes=3, k=k, temperature=0.1,
          normalize=True)
      assert got[f'knn_weighted_top1@{k}'] == np.mean(want_w == query_labels)
      assert got[f'knn_majority_top1@{k}'] == np.mean(want_m == query_labels)
  padded = knn.knn_predict(sharded_feats, sharded_labels, queries,
                           num_classes=3, ks=ks, mesh=mesh8, num_valid=n)
  host = knn.knn_predict(bank, labels, queries, num_classes=3, ks=ks)
  np.testing.assert_array_equal(padded.weighted, host.weighted)
  np.testing.assert_array_equal(padded.majority, host.majority)


def test_presharded_jax_bank_is_accepted(mesh8):
  bank, labels, queries = exact_tie_data(4, 96, 10)
  feats = jax.device_put(bank, NamedSharding(mesh8, P('data', None)))
  got = knn.knn_predict(feats, labels, queries, num_classes=4, ks=(3,),
                        mesh=mesh8)
  want_w, want_m, _, _ = brute_force_knn(
      bank, labels, queries, num_classes=4, k=3, temperature=0.1,
      normalize=True)
  np.testing.assert_array_equal(got.weighted[0], want_w)
  np.testing.assert_array_equal(got.majority[0], want_m)


def test_unnormalised_large_dot_products_do_not_overflow():
  # exp(s / T) with s ~ 1e4 overflows float32; the vote must still be right.
  bank = np.array([[100., 0.], [99., 0.], [0., 100.]], np.float32)
  labels = np.array([1, 0, 0])
  got = knn.knn_predict(bank, labels, np.array([[100., 1.]], np.float32),
                        num_classes=2, ks=(1, 3), temperature=0.1,
                        normalize=False)
  # k=3: class 1 has weight e^(10000/T), class 0 e^(9900/T) + e^(100/T).
  assert got.weighted[:, 0].tolist() == [1, 1]
  assert got.majority[:, 0].tolist() == [1, 0]


def test_invalid_k_raises():
  bank = np.ones((5, 3), np.float32)
  with pytest.raises(ValueError, match='k must be in'):
    knn.knn_predict(bank, np.zeros(5, int), bank, num_classes=2, ks=(6,))
  with pytest.raises(ValueError, match='k must be in'):
    knn.knn_predict(bank, np.zeros(5, int), bank, num_classes=2, ks=(0,))


def test_negative_zero_ties_with_positive_zero():
  # top_k orders -0.0 below +0.0; for the vote they are the same similarity,
  # so the lower bank index must win.
  bank = np.array([[-0.0], [0.0]], np.float32)
  labels = np.array([1, 0])
  got = knn.knn_predict(bank, labels, np.array([[1.0]], np.float32),
                        num_classes=2, ks=(1,), normalize=False)
  assert got.weighted.tolist() == [[1]]
  assert got.majority.tolist() == [[1]]


@pytest.mark.parametrize('sharded', [False, True])
def test_top_k_is_not_lowered_to_a_full_sort(sharded, mesh8):
  # A full sort of each [chunk, bank_shard] block instead of XLA's TopK
  # kernel once made k=200 on a 60k bank 30x slower; keep it out.
  bank = np.zeros((4096, 16), np.float32)
  compiled = knn._knn_predict.lower(
      bank, np.zeros(4096, np.int32), np.ones(4096, bool),
      np.zeros((256, 16), np.float32), 0.1,
      num_classes=10, ks=(20, 200), mesh=mesh8 if sharded else None,
      query_chunk=64, normalize=True).compile().as_text()
  assert 'TopK' in compiled
  assert ' sort(' not in compiled


def test_each_device_merges_and_votes_for_its_slice_of_the_queries(mesh8):
  # Sharded bank, 64 queries a chunk on 8 devices: each device's local top-k
  # covers the whole chunk ([64, 200] of its [64, 512] block), the merge of
  # the 8 shards' candidates only its 8 queries ([8, 1600] -> [8, 200]),
  # where every device used to merge all 64 ([64, 1600]).
  compiled = knn._knn_predict.lower(
      np.zeros((4096, 16), np.float32), np.zeros(4096, np.int32),
      np.ones(4096, bool), np.zeros((256, 16), np.float32), 0.1,
      num_classes=10, ks=(20, 200), mesh=mesh8, query_chunk=64,
      normalize=True).compile().as_text()
  topk = re.findall(r'\(f32\[(\d+),(\d+)\]\S*, s32\[\S+\) custom-call\(.*?'
                    r'custom_call_target="TopK"', compiled)
  assert sorted(topk) == [('64', '200'), ('8', '200')], topk


def test_masked_bank_and_queries_equal_brute_force_on_the_real_rows(mesh8):
  # A multi-process feature array has padding rows wherever a process's part
  # of the last eval batch ran past the split: scattered, not only at the end.
  # Masked rows must never be neighbours, masked queries never counted.
  bank, labels, queries = exact_tie_data(5, 96, 40, num_classes=4)
  rng = np.random.default_rng(7)
  bank_mask = rng.random(96) > 0.3
  query_mask = rng.random(40) > 0.25
  query_labels = rng.integers(0, 4, 40)
  # Padding rows that would win every vote if they were not masked.
  bank = bank.copy()
  bank[~bank_mask] = queries.mean(axis=0) * 100.
  got = knn.knn_evaluate(
      jax.device_put(bank, NamedSharding(mesh8, P('data', None))),
      jax.device_put(labels.astype(np.int32), NamedSharding(mesh8, P('data'))),
      queries, query_labels, num_classes=4, ks=(1, 7), mesh=mesh8,
      bank_mask=bank_mask, query_mask=query_mask)
  for k in (1, 7):
    want_w, want_m, _, _ = brute_force_knn(
        bank[bank_mask], labels[bank_mask], queries[query_mask],
        num_classes=4, k=k, temperature=0.1, normalize=True)
    real = query_labels[query_mask]
    assert got[f'knn_weighted_top1@{k}'] == np.mean(want_w == real)
    assert got[f'knn_majority_top1@{k}'] == np.mean(want_m == real)
