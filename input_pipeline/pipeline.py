"""Deterministic global batches from a TFDS split held in host memory.

The training order is a pure function of (seed, step): epoch e uses the
permutation `default_rng([seed, e])`, and step s takes the s-th slice of it. So
resuming at step s reproduces exactly the batches an uninterrupted run would
have seen, with no iterator state to checkpoint. Each process materialises only
its own contiguous part of every global batch (multi-host), and the batch lands
on the mesh sharded along its first axis.

Augmented views are made on the devices by `augment.augment_batch` (jitted in
the train loop), not here: this module only moves raw uint8 images.

Small datasets (Fashion-MNIST, CIFAR, STL-10: under 3 GB as uint8) fit in host
memory; ImageNet-size data streams through `streaming.StreamingTrainBatches`
(same batch dict, tf.data on the host). Class-imbalanced variants of an
`ArrayDataset` come from `imbalance.imbalanced_subset`.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """A dataset split as arrays. `index` is a stable per-example id."""
  images: np.ndarray   # [M, H, W, C] uint8
  labels: np.ndarray   # [M] int32

  def __post_init__(self):
    if self.images.ndim != 4:
      raise ValueError('images must have shape [M, H, W, C]; got '
                       f'{self.images.shape}.')
    if self.labels.shape != (self.images.shape[0],):
      raise ValueError(f'labels must have shape [{self.images.shape[0]}]; got '
                       f'{self.labels.shape}.')

  @property
  def num_examples(self) -> int:
    return self.images.shape[0]

  @property
  def num_classes(self) -> int:
    return int(self.labels.max()) + 1


def from_tf_dataset(ds, image_key: str = 'image', label_key: str = 'label'
                    ) -> ArrayDataset:
  """Reads a finite `tf.data.Dataset` of {'image', 'label'} into memory."""
  import tensorflow_datasets as tfds  # Heavy import, kept local.
  batch = tfds.as_numpy(ds.batch(1 << 30).get_single_element())
  images = np.asarray(batch[image_key])
  if images.ndim == 3:
    images = images[..., None]
  return ArrayDataset(images.astype(np.uint8),
                      np.asarray(batch[label_key]).astype(np.int32))


def load_split(name: str, split: str, data_dir: str | None = None
               ) -> ArrayDataset:
  """Loads a TFDS split into memory, building the dataset if needed."""
  from input_pipeline import datasets  # pylint: disable=g-import-not-at-top
  builder = datasets.get_builder(name, data_dir)
  ds = builder.as_dataset(split=split, shuffle_files=False)
  return from_tf_dataset(ds)


class TrainBatches:
  """Global training batches as a pure function of the step.

  Batches drop the remainder of each epoch so every batch is full (MoCo's queue
  needs a constant batch size).
  """

  def __init__(self, data: ArrayDataset, *, global_batch_size: int, seed: int,
               sharding: jax.sharding.Sharding):
    if global_batch_size > data.num_examples:
      raise ValueError(
          f'batch size {global_batch_size} exceeds the {data.num_examples} '
          'training examples; lower config.batch_size.')
    nproc = jax.process_count()
    if global_batch_size % nproc:
      raise ValueError(f'batch size {global_batch_size} is not divisible by '
                       f'the {nproc} processes.')
    self.data = data
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.sharding = sharding
    self.steps_per_epoch = data.num_examples // global_batch_size
    self._perm_cache: tuple[int, np.ndarray] | None = None

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm_cache is None or self._perm_cache[0] != epoch:
      perm = np.random.default_rng([self.seed, epoch]).permutation(
          self.data.num_examples)
      self._perm_cache = (epoch, perm)
    return self._perm_cache[1]

  def global_indices(self, step: int) -> np.ndarray:
    """The example ids of the global batch at `step`, [global_batch_size]."""
    epoch, i = divmod(step, self.steps_per_epoch)
    b = self.global_batch_size
    return self._permutation(epoch)[i * b:(i + 1) * b]

  def __call__(self, step: int) -> dict[str, jax.Array]:
    """Returns {'image': [B,H,W,C] uint8, 'label': [B], 'index': [B]}."""
    local = process_slice(self.global_indices(step), jax.process_index(),
                          jax.process_count())
    host = {'image': self.data.images[local],
            'label': self.data.labels[local],
            'index': local.astype(np.int32)}
    return {k: jax.make_array_from_process_local_data(self.sharding, v)
            for k, v in host.items()}


def process_slice(global_batch: np.ndarray, process_index: int,
                  process_count: int) -> np.ndarray:
  """The contiguous part of a global batch that one process loads.

  `jax.make_array_from_process_local_data` assembles the global array from
  these parts in process order, so the global batch order is preserved.
  """
  per_proc = len(global_batch) // process_count
  return global_batch[process_index * per_proc:(process_index + 1) * per_proc]


def eval_batches(data: ArrayDataset, *, batch_size: int,
                 sharding: jax.sharding.Sharding):
  """Yields (images [B,H,W,C] uint8 on the mesh, n_valid) over the whole split.

  The last batch is zero-padded to `batch_size` so one compiled function serves
  every batch; callers drop the padded rows using `n_valid`.
  """
  for start in range(0, data.num_examples, batch_size):
    chunk = data.images[start:start + batch_size]
    n_valid = chunk.shape[0]
    if n_valid < batch_size:
      pad = np.zeros((batch_size - n_valid,) + chunk.shape[1:], chunk.dtype)
      chunk = np.concatenate([chunk, pad])
    local = process_slice(chunk, jax.process_index(), jax.process_count())
    yield jax.make_array_from_process_local_data(sharding, local), n_valid
