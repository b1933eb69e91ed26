"""Streaming batches for datasets too big for host memory (ImageNet on pods).

`pipeline.TrainBatches` holds the whole split in host memory; this module reads
it with tf.data instead. Each process reads only its own contiguous range of
the split (`process_range`, the same even split `tfds.split_for_jax_process`
makes, but with known offsets so `index` is a stable global example id), then
shuffles, decodes, resizes and centre-crops to a fixed square size on the host,
batches, and places uint8 batches on the mesh. Augmentation stays on the
devices (`augment.augment_batch` / `augment_views`, jitted in the train loop),
because measured there it is several times faster than a tf.data map on this
machine (see benchmarks/input_pipeline.py).

Determinism and resume. Epoch e of process i is its range shuffled with a
buffer seeded by (seed, e, i); tf.data runs with `deterministic=True`, so the
order is a function of (seed, step, process count). `iterate(start_step)`
skips the records before `start_step` in that epoch (before decoding, so a
resume re-reads but does not decode them) and continues with exactly the
batches an uninterrupted run would have seen. What is not restored:

* the order if the number of processes changes (the ranges change);
* cheap resume: skipping costs reading up to one epoch of records;
* a full permutation: a shuffle buffer smaller than the range only
  approximately shuffles (as in any tf.data pipeline);
* every example every epoch: each process drops the remainder of its range
  beyond `steps_per_epoch * local_batch` (a different remainder each epoch).

Evaluation (`eval_batches`) reads in order, without augmentation: resize the
shorter side to `image_size / crop_fraction`, centre-crop `image_size`, and
zero-pad the last batches with a `mask` so every process runs the same number
of steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import tensorflow as tf

# tf.data's own default; bounded so a process's host memory stays modest when
# the records are encoded JPEGs (ImageNet: ~110 KB each, ~1 GB buffered).
DEFAULT_SHUFFLE_BUFFER = 10_000


def process_range(num_examples: int, process_index: int, process_count: int
                  ) -> tuple[int, int]:
  """[start, end) of the examples process `process_index` reads.

  Contiguous, disjoint ranges that cover [0, num_examples); sizes differ by at
  most one (as `tfds.even_splits`).
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} is not in '
                     f'[0, {process_count}).')
  return (num_examples * process_index // process_count,
          num_examples * (process_index + 1) // process_count)


def decode_and_crop(image, image_size: int, *, crop_fraction: float = 1.,
                    channels: int | None = None):
  """Decodes (if encoded) and centre-crops an image to a fixed square size.

  The shorter side is resized (bilinear, antialiased) to
  round(image_size / crop_fraction), then the central image_size x image_size
  square is cut. With crop_fraction 1 an image already of that size comes back
  unchanged. ImageNet evaluation uses crop_fraction 0.875 (256 -> 224).

  Args:
    image: a scalar tf.string of encoded bytes (JPEG/PNG), or a uint8 tensor
      [H, W, C] or [H, W].
    image_size: output side.
    crop_fraction: fraction of the resized shorter side that is kept.
    channels: decode to this many channels (1 or 3); None keeps the input's
      (for encoded images: what the file holds, which may vary).

  Returns:
    [image_size, image_size, C] uint8.
  """
  if image.dtype == tf.string:
    image = tf.io.decode_image(image, channels=channels or 0,
                               expand_animations=False)
  if image.shape.rank == 2:
    image = image[..., None]
  if channels == 3 and image.shape[-1] == 1:
    image = tf.image.grayscale_to_rgb(image)
  shape = tf.shape(image)
  h, w = shape[0], shape[1]
  target = tf.cast(tf.round(image_size / crop_fraction), tf.int32)
  short = tf.minimum(h, w)
  new_h = tf.cast(tf.round(h * target / short), tf.int32)
  new_w = tf.cast(tf.round(w * target / short), tf.int32)

  def resize():
    out = tf.image.resize(image, (new_h, new_w), method='bilinear',
                          antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)

  # Skip the resize when the size already matches: exact, and cheaper.
  image = tf.cond((new_h == h) & (new_w == w), lambda: image, resize)
  top = (new_h - image_size) // 2
  left = (new_w - image_size) // 2
  return image[top:top + image_size, left:left + image_size]


def _source(source, split: str, data_dir: str | None
            ) -> tuple[tf.data.Dataset, int]:
  """The split in a fixed order, images undecoded, and its example count."""
  if isinstance(source, tf.data.Dataset):
    n = int(source.cardinality())
    if n < 0:
      raise ValueError('an injected tf.data.Dataset must have a known finite '
                       'cardinality (e.g. from_tensor_slices, or use '
                       '.apply(tf.data.experimental.assert_cardinality(n))).')
    return source, n
  import tensorflow_datasets as tfds  # Heavy import, kept local.
  from input_pipeline import datasets  # pylint: disable=g-import-not-at-top
  builder = datasets.get_builder(source, data_dir)
  if split not in builder.info.splits:
    raise ValueError(f'streaming needs a plain split name of {source!r} '
                     f'({", ".join(builder.info.splits)}); got {split!r}.')
  n = builder.info.splits[split].num_examples
  return builder, n


def _read_range(source, split: str, start: int, end: int) -> tf.data.Dataset:
  """Elements {'image', 'label', 'index'} of examples [start, end)."""
  if isinstance(source, tf.data.Dataset):
    ds = source.enumerate().skip(start).take(end - start)
    return ds.map(lambda i, ex: {'image': ex['image'], 'label': ex['label'],
                                 'index': tf.cast(i, tf.int32)})
  import tensorflow_datasets as tfds  # Heavy import, kept local.
  ds = source.as_dataset(
      split=f'{split}[{start}:{end}]', shuffle_files=False,
      # Decode after the shuffle: the buffer then holds compact encoded bytes.
      decoders={'image': tfds.decode.SkipDecoding()})
  return ds.enumerate().map(
      lambda i, ex: {'image': ex['image'], 'label': ex['label'],
                     'index': tf.cast(i + start, tf.int32)})


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = 0   # tf.data's default pool.
  return options


def _to_mesh(batch: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in batch.items()}


class StreamingTrainBatches:
  """Training batches streamed by tf.data, one process's shard per process.

  Iterate with `iterate(start_step)`; each batch is {'image': [B, S, S, C]
  uint8, 'label': [B] int32, 'index': [B] int32} on the mesh (the same dict
  `TrainBatches` returns), B the global batch size.
  """

  def __init__(self, source, *, global_batch_size: int, image_size: int,
               seed: int, sharding: jax.sharding.Sharding,
               split: str = 'train', data_dir: str | None = None,
               channels: int | None = None,
               shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
               process_index: int | None = None,
               process_count: int | None = None):
    """Sets up the stream; nothing is read until `iterate`.

    Args:
      source: a TFDS name, or a finite `tf.data.Dataset` of {'image' (encoded
        bytes or uint8 [H, W(, C)]), 'label'} in a fixed order (tests).
      global_batch_size: examples per step over all processes.
      image_size: side of the square uint8 images the host produces.
      seed: shuffle seed.
      sharding: where batches land, sharded along the first axis.
      split: TFDS split name (ignored for an injected dataset).
      data_dir: TFDS data_dir.
      channels: decode to 1 or 3 channels; None keeps what the data has.
      shuffle_buffer: tf.data shuffle buffer size, in examples.
      process_index: this process; default jax.process_index().
      process_count: default jax.process_count().
    """
    self.process_index = (jax.process_index() if process_index is None
                          else process_index)
    self.process_count = (jax.process_count() if process_count is None
                          else process_count)
    if global_batch_size % self.process_count:
      raise ValueError(f'batch size {global_batch_size} is not divisible by '
                       f'the {self.process_count} processes.')
    self._source, self.num_examples = _source(source, split, data_dir)
    self.local_batch_size = global_batch_size // self.process_count
    self.global_batch_size = global_batch_size
    self.start, self.end = process_range(
        self.num_examples, self.process_index, self.process_count)
    # Every process must run the same number of steps: use the smallest range.
    smallest = self.num_examples // self.process_count
    self.steps_per_epoch = smallest // self.local_batch_size
    if self.steps_per_epoch == 0:
      raise ValueError(f'batch size {global_batch_size} exceeds the '
                       f'{self.num_examples} training examples.')
    self.split, self.image_size, self.channels = split, image_size, channels
    self.seed, self.sharding = seed, sharding
    self.shuffle_buffer = shuffle_buffer

  def _epoch(self, epoch: int, skip_batches: int) -> tf.data.Dataset:
    ds = _read_range(self._source, self.split, self.start, self.end)
    ds = ds.shuffle(self.shuffle_buffer,
                    seed=_mix(self.seed, epoch, self.process_index),
                    reshuffle_each_iteration=False)
    n = self.steps_per_epoch * self.local_batch_size
    # Skipping before the map: resumed-over records are read, not decoded.
    ds = ds.take(n).skip(skip_batches * self.local_batch_size)
    ds = ds.map(lambda ex: dict(ex, image=decode_and_crop(
        ex['image'], self.image_size, channels=self.channels)),
                num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(self.local_batch_size, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())

  def host_batches(self, start_step: int = 0
                   ) -> Iterator[dict[str, np.ndarray]]:
    """This process's numpy batches from `start_step` on (endless)."""
    epoch, i = divmod(start_step, self.steps_per_epoch)
    while True:
      for batch in self._epoch(epoch, i).as_numpy_iterator():
        yield {'image': batch['image'],
               'label': batch['label'].astype(np.int32),
               'index': batch['index']}
      epoch, i = epoch + 1, 0

  def iterate(self, start_step: int = 0) -> Iterator[dict[str, jax.Array]]:
    """Global batches on the mesh from `start_step` on (endless)."""
    for batch in self.host_batches(start_step):
      yield _to_mesh(batch, self.sharding)

  def __iter__(self):
    return self.iterate(0)


def _mix(*ints: int) -> int:
  """A 63-bit tf seed from several ints (numpy's SeedSequence hashing)."""
  return int(np.random.SeedSequence(list(ints)).generate_state(
      2, np.uint32).astype(np.uint64) @ np.array([1 << 31, 1], np.uint64))


def eval_batches(source, *, batch_size: int, image_size: int,
                 sharding: jax.sharding.Sharding, split: str = 'test',
                 data_dir: str | None = None, crop_fraction: float = 1.,
                 channels: int | None = None,
                 process_index: int | None = None,
                 process_count: int | None = None,
                 to_mesh: bool = True) -> Iterator[dict[str, Any]]:
  """The whole split once, in order, without augmentation.

  Each image is resized and centre-cropped by `decode_and_crop`. Every process
  yields the same number of batches (ceil(largest range / local batch)); rows
  past the end of a process's range are zeros with `mask` False.

  Args:
    source: a TFDS name or an injected finite `tf.data.Dataset`.
    batch_size: global examples per batch.
    image_size: side of the output images.
    sharding: where batches land.
    split: TFDS split name.
    data_dir: TFDS data_dir.
    crop_fraction: 1 keeps the full shorter side; 0.875 is ImageNet's 256->224.
    channels: decode to 1 or 3 channels; None keeps the data's.
    process_index: default jax.process_index().
    process_count: default jax.process_count().
    to_mesh: False yields this process's numpy batches (tests, or a caller
      that places them itself).

  Yields:
    {'image': [B, S, S, C] uint8, 'label': [B] int32, 'index': [B] int32,
    'mask': [B] bool}.
  """
  process_index = (jax.process_index() if process_index is None
                   else process_index)
  process_count = (jax.process_count() if process_count is None
                   else process_count)
  if batch_size % process_count:
    raise ValueError(f'batch size {batch_size} is not divisible by the '
                     f'{process_count} processes.')
  local = batch_size // process_count
  src, n = _source(source, split, data_dir)
  start, end = process_range(n, process_index, process_count)
  num_batches = math.ceil(math.ceil(n / process_count) / local)
  ds = _read_range(src, split, start, end).map(
      lambda ex: dict(ex, image=decode_and_crop(
          ex['image'], image_size, crop_fraction=crop_fraction,
          channels=channels), mask=True),
      num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(local).prefetch(tf.data.AUTOTUNE).with_options(_options())
  it = ds.as_numpy_iterator()
  template = None
  for _ in range(num_batches):
    batch = next(it, None)
    if batch is None:   # This process's range ended before the others'.
      batch = {k: v[:0] for k, v in template.items()}
    template = batch
    batch = {k: _pad(np.asarray(v), local) for k, v in batch.items()}
    batch['label'] = batch['label'].astype(np.int32)
    yield _to_mesh(batch, sharding) if to_mesh else batch


def _pad(x: np.ndarray, size: int) -> np.ndarray:
  if len(x) == size:
    return x
  pad = np.zeros((size - len(x),) + x.shape[1:], x.dtype)
  return np.concatenate([x, pad])
