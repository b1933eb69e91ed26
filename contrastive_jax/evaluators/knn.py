"""Weighted and majority-vote kNN classification on frozen features.

InstDisc's protocol (Wu et al. 2018; MoCo's CIFAR demo, lightly, DINO): with
s_i = cos(f, f_i) over the k most similar bank entries N_k(f) of a query f,

    weighted:  argmax_c sum_{i in N_k(f)} exp(s_i / T) [y_i = c]
    majority:  argmax_c sum_{i in N_k(f)} [y_i = c]

Results equal a float64 brute force, ties included; with a mesh the bank is
sharded by rows and the merge and vote split over the devices
(docs/evaluation.md).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np

from contrastive_jax import progress
from contrastive_jax.evaluators import base
from contrastive_jax.losses.common import l2_normalize


class KnnPredictions(NamedTuple):
  """Per-query predicted class ids, [len(ks), Q] int32, rows in `ks` order."""
  weighted: jax.Array
  majority: jax.Array


def _bank_axis(mesh: jax.sharding.Mesh) -> str:
  """The mesh axis the bank is sharded over: 'data' if present, else first."""
  names = mesh.axis_names
  return 'data' if 'data' in names else names[0]


def _place(x, mesh, spec):
  """Lays `x` out as `spec` on `mesh` inside jit: `jax.reshard` on Explicit
  axes (shard_map does not reshard them), a sharding constraint on Auto."""
  sharding = NamedSharding(mesh, spec)
  axis_type = dict(zip(mesh.axis_names, mesh.axis_types))[_bank_axis(mesh)]
  if axis_type == jax.sharding.AxisType.Explicit:
    return jax.reshard(x, sharding)
  return jax.lax.with_sharding_constraint(x, sharding)


def _vote(sims, labels, temperature, *, ks, num_classes, axis=None):
  """(weighted, majority) [len(ks), B] int32 from sims [B, kmax] (sorted
  descending) and labels [B, kmax] of the ranked neighbours, `ks` ascending;
  `axis`: the mesh axis the queries are split over in shard_map."""
  # exp((s - s_max) / T): the same argmax, no float32 overflow. A max, not
  # sims[:, :1], which would keep XLA:CPU from re-forming its TopK kernel.
  weights = jnp.exp((sims - jnp.max(sims, axis=1, keepdims=True))
                    / temperature)
  classes = jnp.arange(num_classes, dtype=jnp.int32)

  def add_neighbour(j, carry):
    weighted, counts = carry
    onehot = labels[:, j, None] == classes                  # [B, classes]
    # Sequential in rank order (ties: the module docstring).
    weighted = weighted + jnp.where(onehot, weights[:, j, None], 0.)
    counts = counts + onehot.astype(jnp.int32)
    return weighted, counts

  b = sims.shape[0]
  carry = (jnp.zeros((b, num_classes), jnp.float32),
           jnp.zeros((b, num_classes), jnp.int32))
  if axis is not None:    # Each device votes for its own queries.
    carry = jax.lax.pcast(carry, axis, to='varying')
  preds = []
  for start, k in zip((0,) + ks[:-1], ks):
    carry = jax.lax.fori_loop(start, k, add_neighbour, carry)
    # argmax returns the first maximum: equal scores -> lower class id.
    preds.append([jnp.argmax(c, axis=-1).astype(jnp.int32) for c in carry])
  weighted, majority = zip(*preds)
  return jnp.stack(weighted), jnp.stack(majority)


def _predict_local(bank, labels, valid, queries, temperature, *, axis, ks,
                   num_classes, normalize):
  """(weighted, majority) [num_chunks, len(ks), chunk] int32 of queries
  [num_chunks, chunk, D] against this device's bank [n_local, D]; with a
  mesh `axis`, each device's [..., chunk / n_dev]."""
  kmax = ks[-1]
  local_k = min(kmax, bank.shape[0])
  if normalize:
    # Scales the similarity block's columns: no normalised bank copy.
    sq = jnp.sum(jnp.square(bank.astype(jnp.float32)), axis=-1)
    inv_norm = jax.lax.rsqrt(jnp.maximum(sq, 1e-12))

  def one_chunk(q):                                          # q: [chunk, D]
    # HIGHEST: TPU's default bf16 passes would reorder near-ties.
    sims = jnp.einsum('qd,nd->qn', q.astype(bank.dtype), bank,
                      precision=jax.lax.Precision.HIGHEST,
                      preferred_element_type=jnp.float32)
    if normalize:
      sims = sims * inv_norm
    sims = jnp.where(valid, sims, -jnp.inf)                 # padding never wins
    sims = jnp.where(sims == 0., 0., sims)                   # -0.0 -> +0.0
    vals, idx = jax.lax.top_k(sims, local_k)
    labs = labels[idx]
    if axis is not None:
      # [chunk, n_dev * local_k] in shard order keeps "equal similarity ->
      # lower global index"; then this device's slice of the queries. (An
      # all-to-all made XLA:CPU's local top_k a full sort, 20x slower.)
      vals = jax.lax.all_gather(vals, axis, axis=1, tiled=True)
      labs = jax.lax.all_gather(labs, axis, axis=1, tiled=True)
      rows = vals.shape[0] // jax.lax.axis_size(axis)
      start = jax.lax.axis_index(axis) * rows
      vals = jax.lax.dynamic_slice_in_dim(vals, start, rows)
      labs = jax.lax.dynamic_slice_in_dim(labs, start, rows)
      vals, pos = jax.lax.top_k(vals, kmax)
      labs = jnp.take_along_axis(labs, pos, axis=1)
    return _vote(vals, labs, temperature, ks=ks, num_classes=num_classes,
                 axis=axis)

  return jax.lax.map(one_chunk, queries)


@functools.partial(
    jax.jit,
    static_argnames=('num_classes', 'ks', 'mesh', 'query_chunk', 'normalize'))
def _knn_predict(bank_feats, bank_labels, bank_valid, query_feats, temperature,
                 *, num_classes, ks, mesh, query_chunk, normalize):
  n, d = bank_feats.shape
  q = query_feats.shape[0]
  labels = jnp.asarray(bank_labels, jnp.int32)
  valid = jnp.asarray(bank_valid, bool)
  axis = None if mesh is None else _bank_axis(mesh)
  query = (l2_normalize(query_feats) if normalize
           else jnp.asarray(query_feats, jnp.float32))
  query = jnp.pad(query, ((0, -q % query_chunk), (0, 0)))
  query = query.reshape(-1, query_chunk, d)
  fn = functools.partial(
      _predict_local, axis=axis, ks=ks, num_classes=num_classes,
      normalize=normalize)
  if mesh is not None:
    n_pad = -n % mesh.shape[axis]
    if n_pad:  # Skipped when divisible, so a pre-sharded bank is not copied.
      bank_feats = jnp.pad(bank_feats, ((0, n_pad), (0, 0)))
      labels = jnp.pad(labels, (0, n_pad))
      valid = jnp.pad(valid, (0, n_pad))
    # Bank split along examples, queries replicated, predictions split.
    bank_feats = _place(bank_feats, mesh, P(axis, None))
    labels = _place(labels, mesh, P(axis))
    valid = _place(valid, mesh, P(axis))
    query = _place(query, mesh, P())
    fn = jax.shard_map(fn, mesh=mesh,
                       in_specs=(P(axis, None), P(axis), P(axis), P(), P()),
                       out_specs=(P(None, None, axis), P(None, None, axis)))
  weighted, majority = fn(bank_feats, labels, valid, query,
                          jnp.asarray(temperature, jnp.float32))
  if mesh is not None:   # Replicated (Q int32 per k): every process reads.
    weighted, majority = (_place(p, mesh, P()) for p in (weighted, majority))
  # [num_chunks, len(ks), chunk] -> [len(ks), Q]
  unchunk = lambda p: jnp.moveaxis(p, 1, 0).reshape(len(ks), -1)[:, :q]
  return unchunk(weighted), unchunk(majority)


def knn_predict(bank_feats, bank_labels, query_feats, *, num_classes: int,
                ks: Sequence[int] = (200,), temperature: float = 0.1,
                mesh: jax.sharding.Mesh | None = None,
                query_chunk: int | None = None, normalize: bool = True,
                num_valid: int | None = None,
                bank_mask=None) -> KnnPredictions:
  """Per-query kNN predictions, each [len(ks), Q] int32, row i for ks[i], of
  query_feats [Q, D] on bank_feats [N, D] (real rows: [0, num_valid), or
  `bank_mask` [N]); `query_chunk` None keeps a [chunk, N / devices] float32
  block near 128 MiB; `normalize` False: the raw dot product."""
  n, d = np.shape(bank_feats)
  q, dq = np.shape(query_feats)
  if d != dq:
    raise ValueError(f'bank dim {d} != query dim {dq}.')
  if np.shape(bank_labels) != (n,):
    raise ValueError(f'bank_labels must have shape [{n}]; got '
                     f'{np.shape(bank_labels)}.')
  num_valid = n if num_valid is None else int(num_valid)
  ks_list = [int(k) for k in ks]
  if not ks_list or min(ks_list) < 1 or max(ks_list) > num_valid:
    raise ValueError(f'every k must be in [1, {num_valid}] (the bank size); '
                     f'got ks={tuple(ks)}.')
  if num_classes < 1:
    raise ValueError(f'num_classes must be >= 1; got {num_classes}.')
  sorted_ks = tuple(sorted(set(ks_list)))
  num_shards = 1 if mesh is None else mesh.shape[_bank_axis(mesh)]
  if query_chunk is None:
    # <= 1024 queries and a [chunk, bank shard] block <= 2^25 floats (128
    # MiB), evened out so that padding wastes less than a row per chunk.
    cap = max(1, min(1024, 2**25 // math.ceil(n / num_shards)))
    query_chunk = max(1, math.ceil(q / math.ceil(q / cap)))
  if query_chunk < 1:
    raise ValueError(f'query_chunk must be >= 1; got {query_chunk}.')
  query_chunk = -(-query_chunk // num_shards) * num_shards
  if bank_mask is None:
    bank_mask = np.arange(n) < num_valid
  weighted, majority = _knn_predict(
      bank_feats, bank_labels, bank_mask, query_feats, temperature,
      num_classes=int(num_classes), ks=sorted_ks, mesh=mesh,
      query_chunk=int(query_chunk), normalize=bool(normalize))
  rows = np.array([sorted_ks.index(k) for k in ks_list])
  return KnnPredictions(weighted[rows], majority[rows])


def shard_bank(bank_feats, bank_labels, mesh: jax.sharding.Mesh):
  """(feats [N', D], labels [N'], N): a host bank zero-padded to a multiple
  N' of the mesh's bank axis, each shard sent straight to its device (pass N
  as `num_valid`); device arrays come back as they are."""
  n = np.shape(bank_feats)[0]
  if isinstance(bank_feats, jax.Array) or isinstance(bank_labels, jax.Array):
    return bank_feats, bank_labels, n
  axis = _bank_axis(mesh)
  n_pad = -n % mesh.shape[axis]
  feats = np.asarray(bank_feats)
  labels = np.asarray(bank_labels, np.int32)
  if n_pad:
    feats = np.pad(feats, ((0, n_pad), (0, 0)))
    labels = np.pad(labels, (0, n_pad))
  feats = jax.device_put(feats, NamedSharding(mesh, P(axis, None)))
  labels = jax.device_put(labels, NamedSharding(mesh, P(axis)))
  return feats, labels, n


def knn_evaluate(bank_feats, bank_labels, query_feats, query_labels, *,
                 num_classes: int, ks: Sequence[int] = (200,),
                 temperature: float = 0.1,
                 mesh: jax.sharding.Mesh | None = None,
                 query_chunk: int | None = None,
                 normalize: bool = True, bank_mask=None,
                 query_mask=None) -> dict[str, float]:
  """{'knn_weighted_top1@{k}', 'knn_majority_top1@{k}'} -> accuracy for each
  k of `ks`, of host arrays or global jax Arrays; `bank_mask` / `query_mask`
  False on padding rows; the rest as `knn_predict`."""
  q = np.shape(query_feats)[0]
  if np.shape(query_labels) != (q,):
    raise ValueError(f'query_labels must have shape [{q}]; got '
                     f'{np.shape(query_labels)}.')
  if not isinstance(bank_labels, jax.Array):
    host_labels = np.asarray(bank_labels)
    if host_labels.size and (host_labels.min() < 0 or
                             host_labels.max() >= num_classes):
      raise ValueError(f'bank_labels must lie in [0, {num_classes}).')
  num_valid = None
  if mesh is not None and bank_mask is None:
    bank_feats, bank_labels, num_valid = shard_bank(bank_feats, bank_labels,
                                                    mesh)
  preds = knn_predict(
      bank_feats, bank_labels, query_feats, num_classes=num_classes, ks=ks,
      temperature=temperature, mesh=mesh, query_chunk=query_chunk,
      normalize=normalize, num_valid=num_valid, bank_mask=bank_mask)
  if query_mask is None:
    query_mask = np.ones((q,), bool)
  weighted, majority, count = _correct_counts(
      preds.weighted, preds.majority, query_labels, query_mask)
  count = int(count)
  metrics = {}
  for i, k in enumerate(ks):
    metrics[f'knn_weighted_top1@{k}'] = int(weighted[i]) / count
    metrics[f'knn_majority_top1@{k}'] = int(majority[i]) / count
  return metrics


@jax.jit
def _correct_counts(weighted, majority, labels, mask):
  """Per-k counts of correct unmasked predictions and the unmasked count:
  exact, replicated integer scalars every process can read."""
  labels = jnp.asarray(labels, jnp.int32)[None]
  mask = jnp.asarray(mask, bool)[None]
  correct = lambda p: list(jnp.sum((p == labels) & mask, axis=1))
  return correct(weighted), correct(majority), jnp.sum(mask)


class Knn(base.Evaluator):
  """Weighted and majority kNN top-1 for each k of `ks` on the first
  `bank_size` / `num_queries` examples of each split (0: all); a k above a
  partial bank's size is lowered to it."""
  type = 'knn'
  DEFAULTS = {'ks': (200,), 'temperature': 0.1, 'bank_size': 0,
              'num_queries': 0}

  def validate(self, config, *, num_devices: int,
               num_train: int | None = None) -> None:
    if not self.cfg.ks or min(self.cfg.ks) < 1:
      raise ValueError(f'config.evals.{self.name}.ks={tuple(self.cfg.ks)} '
                       'needs neighbour counts >= 1.')
    if num_train is not None and not self.cfg.bank_size and (
        max(self.cfg.ks) > num_train):
      raise ValueError(
          f'config.evals.{self.name}.ks={tuple(self.cfg.ks)} asks for more '
          f'neighbours than the {num_train} training examples (the kNN '
          f'bank); use values <= {num_train}.')

  def __call__(self, rep: base.Representation, *, bar=progress.NO_BAR
               ) -> dict[str, float]:
    bank = rep.features('train', self.cfg.bank_size)
    queries = rep.features('test', self.cfg.num_queries)
    bar.set_postfix_str('kNN')
    ks = tuple(int(k) for k in self.cfg.ks)
    if self.cfg.bank_size:
      rows = len(rep.source('train', self.cfg.bank_size))
      ks = tuple(sorted({min(k, rows) for k in ks}))
    res = knn_evaluate(
        bank.x, bank.label, queries.x, queries.label,
        num_classes=rep.env.num_classes, ks=ks,
        temperature=self.cfg.temperature, mesh=rep.env.mesh,
        bank_mask=bank.mask, query_mask=queries.mask)
    bar.update(1)
    return {k: float(v) for k, v in res.items()}
