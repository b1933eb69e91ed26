"""Weighted and majority-vote kNN classification on frozen features.

The protocol is InstDisc's (Wu et al. 2018), as used by the MoCo CIFAR demo,
lightly, VISSL and DINO: with s_i = cos(f, f_i) between a query f and the bank
entries f_i, take the top-k set N_k(f) and predict

    weighted:  argmax_c sum_{i in N_k(f)} exp(s_i / T) [y_i = c]
    majority:  argmax_c sum_{i in N_k(f)} [y_i = c]

Several k are scored from one top-max(k) search.

Determinism. Results equal a float64 brute force, ties included, whether or
not the bank is sharded:

* equal similarity: the lower bank index ranks first (`lax.top_k` keeps the
  lower index first; the cross-shard merge keeps shard order, and shard s holds
  lower indices than shard s + 1). -0.0 is mapped to +0.0 first, because
  `top_k` orders the two;
* equal class score: the lower class id wins (`argmax` takes the first);
* class scores are summed over neighbours sequentially in rank order, so two
  classes with the same multiset of neighbour similarities get bit-identical
  scores (a tree reduction could round them differently).

Memory. Queries are scored `query_chunk` at a time, so a device holds one
[query_chunk, bank_shard] similarity block, its bank shard and the (small,
replicated) queries. With a mesh the bank is sharded along examples; each
device takes its local top-k per chunk inside `jax.shard_map`, then the k
candidates of every shard are all-gathered, and each device merges those of
its 1 / devices of the chunk's queries with a second top-k and
votes on: the merge and the vote are split over the devices, not repeated
on each.

`Knn` is the evaluator (`config.evals.<name>.type = 'knn'`): the training
split (or its first `bank_size` examples) is the bank, the evaluation split
(or its first `num_queries`) the queries.

Accuracies are fractions in [0, 1].
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

# Upper bound on one [query_chunk, bank_shard] float32 similarity block when
# the chunk is chosen automatically. 128 MiB keeps a 1M-entry unsharded bank
# at 32 queries per chunk, and a 60k bank at 1024 (the cap).
_SIM_BLOCK_BYTES = 128 * 2**20
_MAX_AUTO_CHUNK = 1024


class KnnPredictions(NamedTuple):
  """Per-query predicted class ids, [len(ks), Q] int32, rows in `ks` order."""
  weighted: jax.Array
  majority: jax.Array


def _bank_axis(mesh: jax.sharding.Mesh) -> str:
  """The mesh axis the bank is sharded over: 'data' if present, else first."""
  names = mesh.axis_names
  return 'data' if 'data' in names else names[0]


def _place(x, mesh, spec):
  """Lays `x` out as `spec` on `mesh` inside jit; a no-op if it already is.

  shard_map does not reshard its inputs implicitly on an Explicit-axes mesh
  (the `jax.make_mesh` default), so those get `jax.reshard`; Auto axes take a
  sharding constraint instead (`reshard` rejects Auto axis names).
  """
  sharding = NamedSharding(mesh, spec)
  axis_type = dict(zip(mesh.axis_names, mesh.axis_types))[_bank_axis(mesh)]
  if axis_type == jax.sharding.AxisType.Explicit:
    return jax.reshard(x, sharding)
  return jax.lax.with_sharding_constraint(x, sharding)


def auto_query_chunk(num_queries: int, bank_shard_size: int) -> int:
  """Query chunk keeping a [chunk, bank_shard] f32 block near 128 MiB.

  The chunk is then evened out over the chunks so that padding the queries to
  a multiple of it wastes less than one row per chunk.
  """
  cap = max(1, min(_MAX_AUTO_CHUNK, _SIM_BLOCK_BYTES // (4 * bank_shard_size)))
  num_chunks = math.ceil(num_queries / cap)
  return max(1, math.ceil(num_queries / num_chunks))


def _vote(sims, labels, temperature, *, ks, num_classes, axis=None):
  """Weighted and majority votes for each k from ranked neighbours.

  Args:
    sims: [B, kmax] similarities of B queries, sorted descending per row.
    labels: [B, kmax] int32 labels of those neighbours.
    temperature: scalar T.
    ks: ascending tuple of k values, max(ks) <= kmax.
    num_classes: number of classes.
    axis: inside shard_map, the mesh axis the queries are split over.

  Returns:
    (weighted, majority): each [len(ks), B] int32 predictions.
  """
  # exp((s - s_max) / T) rescales every class score of a query by the same
  # positive factor exp(-s_max / T): the argmax is unchanged and large
  # unnormalised dot products cannot overflow float32.
  #
  # A reduction, not sims[:, :1]: XLA expands top_k into sort + slice and
  # re-forms its CPU TopK kernel afterwards; slicing the values again breaks
  # that pattern and leaves a full sort of the [chunk, bank_shard] block (30x
  # slower at k = 200 on a 60k bank).
  weights = jnp.exp((sims - jnp.max(sims, axis=1, keepdims=True))
                    / temperature)
  classes = jnp.arange(num_classes, dtype=jnp.int32)

  def add_neighbour(j, carry):
    weighted, counts = carry
    onehot = labels[:, j, None] == classes                  # [B, classes]
    # Sequential in rank order: see the module docstring on ties.
    weighted = weighted + jnp.where(onehot, weights[:, j, None], 0.)
    counts = counts + onehot.astype(jnp.int32)
    return weighted, counts

  b = sims.shape[0]
  carry = (jnp.zeros((b, num_classes), jnp.float32),
           jnp.zeros((b, num_classes), jnp.int32))
  if axis is not None:    # Each device votes for its own queries.
    carry = jax.lax.pcast(carry, axis, to='varying')
  weighted_preds, majority_preds = [], []
  start = 0
  for k in ks:
    carry = jax.lax.fori_loop(start, k, add_neighbour, carry)
    start = k
    # argmax returns the first maximum: equal scores -> lower class id.
    weighted_preds.append(jnp.argmax(carry[0], axis=-1).astype(jnp.int32))
    majority_preds.append(jnp.argmax(carry[1], axis=-1).astype(jnp.int32))
  return jnp.stack(weighted_preds), jnp.stack(majority_preds)


def _predict_local(bank, labels, valid, queries, temperature, *, axis, ks,
                   num_classes, normalize):
  """Predictions for all query chunks against one bank shard (or all of it).

  Args:
    bank: [n_local, D] bank rows held by this device.
    labels: [n_local] int32 labels of those rows.
    valid: [n_local] bool, False for padding rows (never selected).
    queries: [num_chunks, chunk, D] queries (already normalised if asked).
    temperature: scalar T.
    axis: mesh axis name the bank is sharded over, or None if unsharded.
    ks: ascending tuple of k.
    num_classes: number of classes.
    normalize: scale similarities by 1 / ||bank row||.

  Returns:
    (weighted, majority): [num_chunks, len(ks), chunk] int32; with a mesh
    each device's [num_chunks, len(ks), chunk / n_dev], its slice of every
    chunk's queries.
  """
  n_local = bank.shape[0]
  kmax = ks[-1]
  local_k = min(kmax, n_local)
  if normalize:
    # Cosine = (q / |q|) . b * (1 / |b|): scaling the columns of the
    # similarity block avoids materialising a normalised copy of the bank.
    sq = jnp.sum(jnp.square(bank.astype(jnp.float32)), axis=-1)
    inv_norm = jax.lax.rsqrt(jnp.maximum(sq, 1e-12))

  def one_chunk(q):                                          # q: [chunk, D]
    # HIGHEST: on TPU the default f32 matmul uses bf16 passes, which would
    # reorder near-ties relative to the brute-force reference.
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
      # [chunk, n_dev * local_k] in shard order, each shard's block sorted by
      # (similarity desc, index asc), so top_k's lower-position-first rule
      # keeps "equal similarity -> lower global index" across shards. Then
      # this device's slice of the queries: the merge and vote are split.
      # (Not an all-to-all: slicing top_k's values keeps XLA:CPU from
      # re-forming its TopK kernel from the sort + slice top_k expands
      # into, and the local top_k became a full sort, 20x slower.)
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
  if mesh is not None:
    axis = _bank_axis(mesh)
    n_pad = -n % mesh.shape[axis]
    if n_pad:  # Skipped when divisible, so a pre-sharded bank is not copied.
      bank_feats = jnp.pad(bank_feats, ((0, n_pad), (0, 0)))
      labels = jnp.pad(labels, (0, n_pad))
      valid = jnp.pad(valid, (0, n_pad))
  else:
    axis = None
  query = (l2_normalize(query_feats) if normalize
           else jnp.asarray(query_feats, jnp.float32))
  query = jnp.pad(query, ((0, -q % query_chunk), (0, 0)))
  query = query.reshape(-1, query_chunk, d)
  fn = functools.partial(
      _predict_local, axis=axis, ks=ks, num_classes=num_classes,
      normalize=normalize)
  if mesh is not None:
    # Bank and labels split along examples, queries replicated; the
    # predictions come out split along each chunk's queries (the merge).
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
  """Per-query kNN predictions (weighted and majority vote) for several k.

  The computation is one jitted program (recompiled only when shapes or the
  static options change). Tie rules are in the module docstring.

  Args:
    bank_feats: [N, D] bank features (numpy or jax; any float dtype).
    bank_labels: [N] int class ids in [0, num_classes).
    query_feats: [Q, D] query features.
    num_classes: number of classes C.
    ks: neighbour counts; each 1 <= k <= num_valid.
    temperature: T in exp(s / T) for the weighted vote.
    mesh: if given, the bank is sharded along examples over the mesh axis
      'data' (or the mesh's first axis) and padded to a multiple of that axis
      size with rows that are never selected.
    query_chunk: queries scored per step; None picks one so that a
      [chunk, N / num_devices] float32 block stays near 128 MiB. With a
      mesh, rounded up to a multiple of the bank's shards (each merges the
      candidates of its slice of the chunk).
    normalize: L2-normalise bank and queries (cosine similarity). If False the
      similarity is the raw dot product.
    num_valid: only bank rows [0, num_valid) are real; later rows are padding
      (e.g. a bank pre-padded to a multiple of the device count). Default N.
    bank_mask: [N] bool, False for padding rows anywhere in the bank (e.g.
      the padded tail of each process's part of a multi-process bank).
      Overrides num_valid; k is then only checked against N.

  Returns:
    KnnPredictions(weighted, majority), each [len(ks), Q] int32, row i for
    ks[i].
  """
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
    query_chunk = auto_query_chunk(q, math.ceil(n / num_shards))
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
  """Pads a host bank to a multiple of the device count and shards it.

  Each shard is transferred straight to its device (no full copy on device 0).

  Args:
    bank_feats: [N, D] features.
    bank_labels: [N] int labels.
    mesh: mesh whose 'data' (or first) axis the bank is split over.

  Returns:
    (feats [N', D], labels [N'], N): sharded `P(axis, None)` / `P(axis)`
    arrays with N' = N rounded up to a multiple of the axis size; rows >= N are
    zero padding (pass N as `num_valid`).
  """
  axis = _bank_axis(mesh)
  n = np.shape(bank_feats)[0]
  n_pad = -n % mesh.shape[axis]
  if isinstance(bank_feats, jax.Array) or isinstance(bank_labels, jax.Array):
    # Already on device: let the jitted predictor pad and reshard.
    return bank_feats, bank_labels, n
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
  """kNN top-1 accuracy (weighted and majority vote) for every k in `ks`.

  Inputs may be host arrays or global jax Arrays sharded over processes (the
  multi-host case: no process holds all features); accuracies are computed on
  the devices and come back as replicated scalars.

  Args:
    bank_feats: [N, D] features of the (un-augmented) training set.
    bank_labels: [N] int labels.
    query_feats: [Q, D] features of the evaluation set.
    query_labels: [Q] int labels.
    num_classes: number of classes.
    ks: neighbour counts, e.g. (20, 200); all scored from one top-max(k).
    temperature: T of the weighted vote (InstDisc/MoCo CIFAR: 0.1, DINO: 0.07).
    mesh: optional mesh; the bank is sharded over its 'data' (or first) axis.
    query_chunk: queries per step (None: automatic, see `knn_predict`).
    normalize: cosine similarity (True, the InstDisc protocol) or raw dot.
    bank_mask: [N] bool, False for padding rows (default: all real).
    query_mask: [Q] bool, False for padding queries, which are not counted.

  Returns:
    {'knn_weighted_top1@{k}': acc, 'knn_majority_top1@{k}': acc} for each k,
    accuracies as Python floats in [0, 1].
  """
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
  """Per-k counts of correct unmasked predictions, and the unmasked count.

  Integer 0-d scalars: exact (the fraction is taken on the host in float64),
  and replicated by construction, so every process can read them even when
  the labels are sharded over processes.
  """
  labels = jnp.asarray(labels, jnp.int32)[None]
  mask = jnp.asarray(mask, bool)[None]
  correct = lambda p: list(jnp.sum((p == labels) & mask, axis=1))
  return correct(weighted), correct(majority), jnp.sum(mask)


class Knn(base.Evaluator):
  """Weighted and majority kNN top-1 for each k of `ks`, cosine similarity.

  Config fields: `ks`, `temperature` (T of the weighted vote), `bank_size`
  and `num_queries` (the first examples of each split; 0: all of it). With a
  partial bank, a k above its size is lowered to it (an online monitor on a
  small dataset); with the whole training split it is an error.
  Metrics: 'knn_weighted_top1@k', 'knn_majority_top1@k'.
  """
  type = 'knn'
  DEFAULTS = {'ks': (200,), 'temperature': 0.1, 'bank_size': 0,
              'num_queries': 0}

  def _ks(self, bank_rows: int) -> tuple[int, ...]:
    """`ks`, lowered to a partial bank's `bank_rows` (see the class doc)."""
    if self.cfg.bank_size:
      return tuple(sorted({min(int(k), bank_rows) for k in self.cfg.ks}))
    return tuple(int(k) for k in self.cfg.ks)

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
    res = knn_evaluate(
        bank.x, bank.label, queries.x, queries.label,
        num_classes=rep.env.num_classes,
        ks=self._ks(len(rep.source('train', self.cfg.bank_size))),
        temperature=self.cfg.temperature, mesh=rep.env.mesh,
        bank_mask=bank.mask, query_mask=queries.mask)
    bar.update(1)
    return {k: float(v) for k, v in res.items()}
