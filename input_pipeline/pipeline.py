"""Global batches from any random-access source, each process reading its part.

Training order is a pure function of (seed, step): epoch e is the
permutation `default_rng([seed, e])`, step s its s-th slice, so the step in a
checkpoint is the whole input state. Each process reads its contiguous part
of every global batch (`process_slice`); the parts land on the mesh as one
array sharded along its first axis. Images stay uint8 (views are augmented
on the devices). docs/input_pipeline.md."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any

# Imported with this module, as TFDS is in sources.py (which says why).
import grain
import jax
import numpy as np
from absl import logging


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """A split in host memory: an example's position is its id. `classes`
  names the ids (else they run to the largest label); `skipped`: ids of
  undecodable records -> why."""
  images: np.ndarray   # [M, H, W, C] uint8
  labels: np.ndarray   # [M] int32
  classes: tuple[str, ...] | None = None
  skipped: dict[int, str] = dataclasses.field(default_factory=dict)
  in_memory = True   # Reading is a gather from host memory (no decoding).

  def __post_init__(self):
    if self.images.ndim != 4:
      raise ValueError('images must have shape [M, H, W, C]; got '
                       f'{self.images.shape}.')
    if self.labels.shape != (self.images.shape[0],):
      raise ValueError(f'labels must have shape [{self.images.shape[0]}]; got '
                       f'{self.labels.shape}.')

  def __len__(self) -> int:
    return self.images.shape[0]

  num_examples = property(__len__)

  @property
  def num_classes(self) -> int:
    return (int(self.labels.max()) + 1 if self.classes is None
            else len(self.classes))

  @property
  def image_shape(self) -> tuple[int, int, int]:
    return tuple(self.images.shape[1:])

  def read(self, indices, fit=None) -> dict[str, np.ndarray]:
    if fit is not None:
      raise ValueError(
          'an in-memory split holds one fixed square per image, so it cannot '
          f'be read with {fit!r} (config.dataset.train_crop_source / '
          'eval_crop_fraction); stream the split (config.dataset.in_memory='
          'False).')
    indices = np.asarray(indices, np.int64)
    return {'image': self.images[indices], 'label': self.labels[indices]}

  def take(self, indices) -> 'ArrayDataset':
    """The examples `indices`, renumbered 0..len(indices)-1."""
    indices = np.asarray(indices, np.int64)
    new_id = ({int(old): new for new, old in enumerate(indices)}
              if self.skipped else {})
    return ArrayDataset(
        self.images[indices], self.labels[indices], classes=self.classes,
        skipped={new_id[i]: why for i, why in self.skipped.items()
                 if i in new_id})

  @classmethod
  def from_source(cls, source, chunk: int = 4096) -> 'ArrayDataset':
    """Reads a whole source into memory."""
    parts = [source.read(np.arange(i, min(i + chunk, len(source))))
             for i in range(0, len(source), chunk)]
    return cls(np.concatenate([p['image'] for p in parts]),
               np.concatenate([p['label'] for p in parts]).astype(np.int32),
               classes=source.classes, skipped=dict(source.skipped))


class Subset:
  """The examples `indices` of `source`, renumbered 0..len(indices)-1."""

  def __init__(self, source, indices: Sequence[int]):
    self.source = source
    self.indices = np.asarray(indices, np.int64)
    self.num_classes = source.num_classes
    self.image_shape = source.image_shape
    self.classes = source.classes
    self.in_memory = getattr(source, 'in_memory', False)

  def __len__(self) -> int:
    return len(self.indices)

  def with_threads(self, n: int) -> 'Subset':
    return Subset(self.source.with_threads(n), self.indices)

  def note_skipped(self, found: dict[int, str]) -> None:
    self.source.note_skipped({int(self.indices[int(j)]): why
                              for j, why in found.items()})

  def read(self, indices, fit=None) -> dict[str, np.ndarray]:
    return self.source.read(self.indices[np.asarray(indices, np.int64)],
                            fit=fit)

  @property
  def skipped(self) -> dict[int, str]:
    bad = self.source.skipped
    return {j: bad[i] for j, i in enumerate(self.indices.tolist())
            if i in bad} if bad else {}


@functools.lru_cache(maxsize=2)   # Thread-safe; prefetch threads share it.
def _permutation(seed: int, num_examples: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


def process_slice(global_batch: np.ndarray, process_index: int,
                  process_count: int) -> np.ndarray:
  """The contiguous part of a global batch that one process loads, in the
  order `jax.make_array_from_process_local_data` assembles them."""
  per_proc = len(global_batch) // process_count
  return global_batch[process_index * per_proc:(process_index + 1) * per_proc]


def _to_mesh(host: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in host.items()}


AUTO = -1   # config.dataset.num_workers: choose from the host (`decoding`).
# Each worker holds about one host batch in flight: bound them on huge hosts.
MAX_AUTO_WORKERS = 32


@dataclasses.dataclass(frozen=True)
class Decoding:
  """`workers` decoding processes (0: this process) x `threads`, and why."""
  workers: int
  threads: int
  why: str

  def __str__(self) -> str:
    where = (f'{self.workers} worker processes x {self.threads} decoding '
             f'thread{"s" if self.threads > 1 else ""}' if self.workers else
             f'{self.threads} threads of the training process')
    return f'{where} ({self.why})'


def decoding(num_workers: int, *, cores: int | None = None,
             backend: str | None = None) -> Decoding:
  """Where to decode, from `config.dataset.num_workers` and the host.

  AUTO (-1): with accelerators, one single-threaded worker process per core
  (at most `MAX_AUTO_WORKERS`), free of the training loop's GIL; on the CPU
  backend, threads of the training process (one per core, at most 16).
  N > 0: N processes sharing the cores. 0: threads of this process."""
  cores = cores or (len(os.sched_getaffinity(0)) if hasattr(
      os, 'sched_getaffinity') else os.cpu_count() or 1)
  if num_workers > 0:
    return Decoding(num_workers, max(1, cores // num_workers),
                    'config.dataset.num_workers')
  if num_workers == 0:
    return Decoding(0, min(16, cores), 'config.dataset.num_workers=0')
  if num_workers != AUTO:
    raise ValueError(f'config.dataset.num_workers={num_workers}: use -1 '
                     '(chosen from the host), 0 (threads of the training '
                     'process) or a number of worker processes.')
  backend = backend or jax.default_backend()
  if backend == 'cpu':
    return Decoding(0, min(16, cores), f'auto: {cores} cores, CPU devices')
  return Decoding(min(cores, MAX_AUTO_WORKERS),
                  max(1, cores // MAX_AUTO_WORKERS),
                  f'auto: {cores} cores, {backend} devices')


@dataclasses.dataclass(frozen=True)
class _HostBatch:
  """step -> this process's part of the global batch (numpy); picklable,
  with no mesh, so worker processes never start a JAX backend."""
  source: Any
  seed: int
  num_examples: int
  global_batch_size: int
  process_index: int
  process_count: int
  fit: Any = None   # sources.training_fit, taken at the step; None: plain.

  @property
  def steps_per_epoch(self) -> int:
    return self.num_examples // self.global_batch_size

  def global_indices(self, step: int) -> np.ndarray:
    """The example ids of the global batch at `step`, [global_batch_size]."""
    epoch, i = divmod(step, self.steps_per_epoch)
    b = self.global_batch_size
    return _permutation(self.seed, self.num_examples, epoch)[i * b:(i + 1) * b]

  def __call__(self, step: int) -> dict[str, Any]:
    """The arrays, and under 'skipped' the batch's undecodable records."""
    local = process_slice(self.global_indices(step), self.process_index,
                          self.process_count)
    batch = self.source.read(local, fit=self.fit and self.fit.at(step))
    bad = getattr(self.source, 'skipped', None) or {}
    return {'image': batch['image'], 'label': batch['label'].astype(np.int32),
            'index': local.astype(np.int32),
            'skipped': {int(i): bad[int(i)] for i in local if int(i) in bad}}


class TrainBatches:
  """Global training batches as a pure function of the step.

  Each epoch's remainder is dropped, so every batch is full (MoCo's queue
  needs it). Worker processes (`decoding`) send their undecodable records
  with the batch to `source.skipped`; an in-memory source reads in this one.
  """

  def __init__(self, source, *, global_batch_size: int, seed: int,
               sharding: jax.sharding.Sharding, prefetch: int = 2,
               num_workers: int = AUTO, fit=None):
    num_examples = len(source)
    if global_batch_size > num_examples:
      raise ValueError(
          f'batch size {global_batch_size} exceeds the {num_examples} '
          'training examples; lower config.batch_size.')
    nproc = jax.process_count()
    if global_batch_size % nproc:
      raise ValueError(f'batch size {global_batch_size} is not divisible by '
                       f'the {nproc} processes.')
    self.source = source
    self.global_batch_size = global_batch_size
    self.sharding = sharding
    self.prefetch = prefetch
    self.decoding = (None if getattr(source, 'in_memory', False) else
                     decoding(num_workers))
    self.num_workers = self.decoding.workers if self.decoding else 0
    if self.decoding:
      logging.info('Input: decoding %s.', self.decoding)
    reader = source   # Workers decode with a copy on their share of cores.
    if self.num_workers and hasattr(source, 'with_threads'):
      reader = source.with_threads(self.decoding.threads)
    self.host_batch = _HostBatch(reader, seed, num_examples,
                                 global_batch_size, jax.process_index(), nproc,
                                 fit)
    self.steps_per_epoch = self.host_batch.steps_per_epoch

  def __call__(self, step: int) -> dict[str, jax.Array]:
    """{'image': [B, H, W, C] uint8 ([B, V, H, W, C] with `RandomCrops`),
    'label', 'index': [B]}."""
    return self._on_mesh(self.host_batch(step))

  def _on_mesh(self, host: dict[str, Any]) -> dict[str, jax.Array]:
    skipped = host.pop('skipped')
    if skipped and self.num_workers:   # Found in a worker process.
      self.source.note_skipped(skipped)
    return _to_mesh(host, self.sharding)

  def iterate(self, start_step: int, stop_step: int
              ) -> Iterator[dict[str, jax.Array]]:
    """Batches start_step..stop_step-1, read `prefetch` steps ahead (on
    threads or in worker processes); close the generator to stop early."""
    if stop_step <= start_step:
      return
    ds = grain.MapDataset.range(start_step, stop_step).map(self.host_batch)
    if self.num_workers:
      from absl import flags  # pylint: disable=g-import-not-at-top
      if not flags.FLAGS.is_parsed():
        # grain's workers read its absl flags: outside an absl app, defaults.
        flags.FLAGS.mark_as_parsed()
      it = ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(
          num_workers=self.num_workers,
          per_worker_buffer_size=max(1, self.prefetch)),
                                             worker_init_fn=_ignore_sigint)
    else:
      it = ds.to_iter_dataset(grain.ReadOptions(
          num_threads=self.prefetch, prefetch_buffer_size=self.prefetch))
    iterator = iter(it)
    try:
      for host in iterator:
        yield self._on_mesh(host)
    finally:
      iterator.close()   # Workers stop; in-flight shared memory is freed.


def _ignore_sigint(worker_index: int, worker_count: int) -> None:
  """Ctrl-C is the training process's to handle (it saves, then stops the
  workers), not a worker's to die of."""
  del worker_index, worker_count
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def eval_batches(source, *, batch_size: int, sharding: jax.sharding.Sharding
                 ) -> Iterator[dict[str, jax.Array]]:
  """The whole split once, in order: {'image', 'label', 'mask'} on the mesh.

  The last batch is zero-padded with `mask` False (one compiled shape);
  undecodable records (`source.skipped`) are masked too."""
  n = len(source)
  nproc, pid = jax.process_count(), jax.process_index()
  if batch_size % nproc:
    raise ValueError(f'eval batch size {batch_size} is not divisible by the '
                     f'{nproc} processes.')
  for start in range(0, n, batch_size):
    ids = process_slice(np.arange(start, start + batch_size), pid, nproc)
    valid = ids < n   # Past the end: padding, read as zeros.
    batch = source.read(ids[valid])
    pad = len(ids) - int(valid.sum())
    if source.skipped:
      valid = valid & ~np.isin(ids, list(source.skipped))
    yield _to_mesh({
        'image': np.concatenate([batch['image'], np.zeros(
            (pad,) + tuple(source.image_shape), np.uint8)]),
        'label': np.concatenate([batch['label'].astype(np.int32),
                                 np.zeros((pad,), np.int32)]),
        'mask': valid}, sharding)
