"""Global batches from any random-access source, each process reading its part.

One path for training and evaluation, for every dataset (`sources.py`):

* Training order is a pure function of (seed, step): epoch e uses the
  permutation `default_rng([seed, e])` of the split, and step s takes the s-th
  slice of it. Resuming at step s reproduces exactly the batches an
  uninterrupted run would have seen, for any number of processes, with no
  iterator state to checkpoint: the step in the checkpoint is the input
  position.
* Each process reads and decodes only its contiguous part of every global
  batch (`process_slice`), and the parts land on the mesh as one global array
  (`jax.make_array_from_process_local_data`), sharded along its first axis.
* Host memory is bounded: at most `prefetch` local batches are in flight
  (grain reads them ahead on threads while the devices train), independent of
  the dataset's size, except for `ArrayDataset`, a source that holds a small
  split in memory on purpose.

Augmented views are made on the devices by `augment.augment_batch` (jitted in
the train loop), not here: this module only moves uint8 images (with
`config.dataset.train_crop_source='full_image'`, each view's random resized
crop cut by the source from the full decoded image: `sources.RandomCrops`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any

# Imported with this module, as TFDS is in sources.py (which says why): grain
# imports a dependency under etils' lazy-import context too.
import grain
import jax
import numpy as np
from absl import logging


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """A split held in host memory: a source (see `sources.py`) of arrays.

  The position of an example is its stable id (`index` in training batches).
  `classes` names the class ids when the data has names (an image folder's
  class list, a TFDS ClassLabel); without it the ids run to the largest
  label. `skipped` maps the ids of records that could not be decoded (black
  substitutes, see `sources.ImageFolder`) to what was wrong with them.
  """
  images: np.ndarray   # [M, H, W, C] uint8
  labels: np.ndarray   # [M] int32
  classes: tuple[str, ...] | None = None
  skipped: dict[int, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.images.ndim != 4:
      raise ValueError('images must have shape [M, H, W, C]; got '
                       f'{self.images.shape}.')
    if self.labels.shape != (self.images.shape[0],):
      raise ValueError(f'labels must have shape [{self.images.shape[0]}]; got '
                       f'{self.labels.shape}.')

  def __len__(self) -> int:
    return self.images.shape[0]

  @property
  def num_examples(self) -> int:
    return self.images.shape[0]

  @property
  def num_classes(self) -> int:
    if self.classes is not None:
      return len(self.classes)
    return int(self.labels.max()) + 1

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

  def __len__(self) -> int:
    return len(self.indices)

  def with_threads(self, n: int) -> 'Subset':
    """This subset of `source.with_threads(n)` (for decoding workers)."""
    return Subset(self.source.with_threads(n), self.indices)

  @property
  def in_memory(self) -> bool:
    return _in_memory(self.source)

  def note_skipped(self, found: dict[int, str]) -> None:
    self.source.note_skipped({int(self.indices[int(j)]): why
                              for j, why in found.items()})

  def read(self, indices, fit=None) -> dict[str, np.ndarray]:
    ids = self.indices[np.asarray(indices, np.int64)]
    return (self.source.read(ids) if fit is None
            else self.source.read(ids, fit=fit))

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
  """The contiguous part of a global batch that one process loads.

  `jax.make_array_from_process_local_data` assembles the global array from
  these parts in process order, so the global batch order is preserved.
  """
  per_proc = len(global_batch) // process_count
  return global_batch[process_index * per_proc:(process_index + 1) * per_proc]


def _to_mesh(host: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in host.items()}


AUTO = -1   # config.dataset.num_workers: choose from the host (`decoding`).
# At most this many worker processes by default: each holds about one host
# batch in flight, so a host of hundreds of cores would hold hundreds.
MAX_AUTO_WORKERS = 32


def _in_memory(source) -> bool:
  """Whether reading `source` is a gather from host memory (no decoding)."""
  return isinstance(source, ArrayDataset) or getattr(source, 'in_memory',
                                                     False)


def _cores() -> int:
  return (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
          else os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class Decoding:
  """Where a streamed split is decoded: `workers` processes (0: this
  process) with `threads` decoding threads each, and why."""
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

  AUTO (-1, the default): on a host whose devices are accelerators, one
  worker process per core (at most `MAX_AUTO_WORKERS`), each decoding on
  one thread: a process decodes
  at its core's rate whatever the training process's own Python does,
  where threads of the training process share its interpreter lock with
  the loop and the transfers, and stop scaling with the cores when the
  loop is busy (docs/input_pipeline.md has the measurements). On the CPU
  backend the devices compute on the same cores, and the training
  process's threads decode with no copy between processes: threads, one
  per core (at most 16).
  N > 0: N processes, sharing the cores (at least one thread each).
  0: threads of the training process, one per core (at most 16).
  """
  cores = cores or _cores()
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
  return Decoding(min(cores, MAX_AUTO_WORKERS), max(1, cores //
                                                     MAX_AUTO_WORKERS),
                  f'auto: {cores} cores, {backend} devices')


@dataclasses.dataclass(frozen=True)
class _HostBatch:
  """step -> this process's part of the global batch (numpy), picklable.

  Everything a decoding worker process needs and nothing more: no mesh, no
  devices, so worker processes never start a JAX backend.
  """
  source: Any
  seed: int
  num_examples: int
  global_batch_size: int
  process_index: int
  process_count: int
  # How the source makes each decoded image an array (sources.training_fit),
  # set to the step; None: the source's plain read.
  fit: Any = None

  @property
  def steps_per_epoch(self) -> int:
    return self.num_examples // self.global_batch_size

  def global_indices(self, step: int) -> np.ndarray:
    epoch, i = divmod(step, self.steps_per_epoch)
    b = self.global_batch_size
    return _permutation(self.seed, self.num_examples, epoch)[i * b:(i + 1) * b]

  def __call__(self, step: int) -> dict[str, Any]:
    """The arrays, and under 'skipped' the batch's undecodable records (a
    worker process reports them this way; see `sources.ImageFolder`)."""
    local = process_slice(self.global_indices(step), self.process_index,
                          self.process_count)
    batch = (self.source.read(local) if self.fit is None
             else self.source.read(local, fit=self.fit.at(step)))
    bad = getattr(self.source, 'skipped', None) or {}
    return {'image': batch['image'], 'label': batch['label'].astype(np.int32),
            'index': local.astype(np.int32),
            'skipped': {int(i): bad[int(i)] for i in local if int(i) in bad}}


class TrainBatches:
  """Global training batches as a pure function of the step.

  Batches drop the remainder of each epoch so every batch is full (MoCo's queue
  needs a constant batch size).

  `num_workers` (`decoding`: -1 chooses from the host) > 0 decodes in
  that many worker processes (grain's multiprocessing prefetch), each
  reading whole host batches on its share of the cores' threads; 0 reads
  in this process on the source's thread pool. Records a worker finds
  undecodable reach this process's `source.skipped` with the batch. An
  in-memory `ArrayDataset` always reads in this process (a gather, nothing
  to decode).

  `fit` (`sources.training_fit`) is how a decoding source makes each image
  an array, taken at each step: `sources.RandomCrops` gives 'image' as
  [B, V, H, W, C], one host-cut crop per view. None: the source's plain
  read, [B, H, W, C].
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
    self.num_examples = num_examples
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.sharding = sharding
    self.prefetch = prefetch
    self.decoding = None if _in_memory(source) else decoding(num_workers)
    self.num_workers = self.decoding.workers if self.decoding else 0
    if self.decoding:
      logging.info('Input: decoding %s.', self.decoding)
    # What the workers decode with: a copy of the source with their share
    # of the cores as threads (the training process's own keeps its pool).
    reader = source
    if self.num_workers and hasattr(source, 'with_threads'):
      reader = source.with_threads(self.decoding.threads)
    # step -> this process's part of batch `step` (numpy).
    self.host_batch = _HostBatch(reader, seed, num_examples,
                                 global_batch_size, jax.process_index(), nproc,
                                 fit)
    self.steps_per_epoch = self.host_batch.steps_per_epoch

  def global_indices(self, step: int) -> np.ndarray:
    """The example ids of the global batch at `step`, [global_batch_size]."""
    return self.host_batch.global_indices(step)

  def __call__(self, step: int) -> dict[str, jax.Array]:
    """Returns {'image': [B,H,W,C] uint8 ([B,V,H,W,C] with host crops),
    'label': [B], 'index': [B]}."""
    return self._on_mesh(self.host_batch(step))

  def _on_mesh(self, host: dict[str, Any]) -> dict[str, jax.Array]:
    skipped = host.pop('skipped')
    if skipped and (self.num_workers or
                    self.host_batch.source is not self.source):
      self.source.note_skipped(skipped)   # Found by a worker's reader.
    return _to_mesh(host, self.sharding)

  def iterate(self, start_step: int, stop_step: int
              ) -> Iterator[dict[str, jax.Array]]:
    """Batches start_step..stop_step-1, read `prefetch` steps ahead; close
    the generator to stop early.

    grain reads the host batches in order, on threads or in `num_workers`
    processes; each is a pure function of its step, so where the iteration
    starts is the whole input state.
    """
    if stop_step <= start_step:
      return
    ds = grain.MapDataset.range(start_step, stop_step).map(self.host_batch)
    if self.num_workers:
      from absl import flags  # pylint: disable=g-import-not-at-top
      if not flags.FLAGS.is_parsed():
        # grain's workers read its absl flags; outside an absl app (a
        # notebook, a test) their defaults are the values to use.
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
      # Stopped early (a preemption, Ctrl-C, an error) or done: the workers
      # stop and the batches in flight release their shared memory.
      iterator.close()


def _ignore_sigint(worker_index: int, worker_count: int) -> None:
  """A decoding worker's start: Ctrl-C, which a terminal sends to the whole
  process group, is the training process's to handle (it saves the step
  reached, then stops the workers), not a worker's to die of."""
  del worker_index, worker_count
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def eval_batches(source, *, batch_size: int, sharding: jax.sharding.Sharding
                 ) -> Iterator[dict[str, jax.Array]]:
  """The whole split once, in order: {'image', 'label', 'mask'} on the mesh.

  Every process yields the same number of global batches; the last one is
  zero-padded to `batch_size` with `mask` False, so one compiled function
  serves every batch. Each process reads only its contiguous part of each.
  Records the source could not decode (`source.skipped`, known once read)
  are masked too: no score counts their black substitutes.
  """
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
    host = {
        'image': np.concatenate([batch['image'], np.zeros(
            (pad,) + tuple(source.image_shape), np.uint8)]),
        'label': np.concatenate([batch['label'].astype(np.int32),
                                 np.zeros((pad,), np.int32)]),
        'mask': valid,
    }
    yield _to_mesh(host, sharding)


def _union_over_processes(ids: np.ndarray) -> np.ndarray:
  """The sorted union of every process's `ids` (int32), on every process."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  counts = multihost_utils.process_allgather(np.asarray([len(ids)], np.int32))
  width = int(np.max(counts))
  if not width:
    return np.zeros((0,), np.int32)
  # A power of two: a handful of shapes (each compiles once) as counts grow.
  padded = np.full((1 << (width - 1).bit_length(),), -1, np.int32)
  padded[:len(ids)] = ids
  every = np.asarray(multihost_utils.process_allgather(padded))
  return np.unique(every[every >= 0])


def sync_skipped(source) -> dict[int, str]:
  """The undecodable records of `source` found by any process so far.

  A streamed split's records are found by the process that reads them; the
  others decode the ids they lack themselves (a bad file fails again, and is
  recorded with its name), so every process returns the same ids. A
  collective with several processes: call it on all at the same point.
  """
  if jax.process_count() == 1:
    return dict(source.skipped)
  ids = _union_over_processes(np.fromiter(source.skipped, np.int32))
  missing = [int(i) for i in ids if int(i) not in source.skipped]
  if missing:
    source.read(missing)
  return {int(i): source.skipped.get(
      int(i), f'record {i} (undecodable on another process only)')
          for i in ids}


def scan(source, chunk: int = 1024) -> dict[int, str]:
  """Decodes every record of `source` once (each process a share) and
  returns `sync_skipped`: every undecodable record, before any training."""
  share = np.array_split(np.arange(len(source)),
                         jax.process_count())[jax.process_index()]
  for start in range(0, len(share), chunk):
    source.read(share[start:start + chunk])
  return sync_skipped(source)


def check_same_on_every_process(what: str, digest: bytes) -> None:
  """Raises on every process when the processes' `digest`s of `what` differ.

  Each process lists and labels the files itself: one that sees another
  version of the data (a lagging network file system, another data_dir)
  would train with other ids for the same examples.
  """
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  mine = np.frombuffer(digest[:16], np.int32)
  every = np.asarray(multihost_utils.process_allgather(mine))
  differ = [p for p in range(len(every))
            if not np.array_equal(every[p], every[0])]
  if differ:
    raise ValueError(
        f'{what} differs between processes ({differ} against 0): every '
        'process must read the same files with the same class list; check '
        'that config.dataset.data_dir is the same complete copy on every '
        'host.')
