r"""Input-pipeline throughput vs the default train step's consumption.

Run from the repository root (about 2-4 minutes on the shared 2-core CPU):

    PYTHONPATH=. .venv/bin/python benchmarks/input_pipeline.py
    PYTHONPATH=. .venv/bin/python benchmarks/input_pipeline.py \
        --data_dir=/tmp/tfds_test --iters=5

What is timed (views/s = images x V per second, wall clock, after warm-up):

* jax: `TrainBatches(step)` (host uint8 batch placed on the 8-device mesh)
  plus `augment_batch` jitted on the mesh exactly as `train.py` builds
  `augment_fn`. Fashion-MNIST uses the default preset `fmnist`; the synthetic
  32x32x3 set uses `cifar_small` (crop, flip, colour jitter, grayscale).
* tf.data: a per-image `Dataset.map` doing the same crop (random resized crop,
  scale as the preset's) + flip per view, batched, as a host pipeline would.
  It omits the colour ops and erasing, so it flatters tf.data.
* train step: `contrastive_jax.train.train_step` of configs/default.py
  (small CNN, NT-Xent, batch 512, 2 views) on the same mesh, built with
  `train.create_step_fns` as `train_and_evaluate` builds it. Its consumption
  in views/s is compared with each pipeline row (a V-view step costs about V/2
  of the 2-view step, so views/s is the comparable unit).

Caveat printed with the results: on this CPU the pipeline and the train step
share the same 2 cores (and other users' jobs), so the numbers are noisy and
the ratio is a lower bound on what an accelerator (where augmentation runs
on the device next to the step) would see.
"""

import os
import sys

# This file is named like the package it measures; drop its own directory from
# the import path (Python puts it first) and make the repository importable.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import argparse  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from input_pipeline import augment  # noqa: E402
from input_pipeline import pipeline  # noqa: E402

BATCH = 512


def _mesh():
  return jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))


def bench_jax(data, preset, num_views, iters, crop_flip_only=False):
  mesh = _mesh()
  data_sharding, replicated = NamedSharding(mesh, P('data')), NamedSharding(
      mesh, P())
  batches = pipeline.TrainBatches(data, global_batch_size=BATCH, seed=0,
                                  sharding=data_sharding)
  # crop_flip_only: the tf.data row's ops, for a like-for-like comparison.
  views = augment.build_views(preset, num_views, [dict(
      jitter_strength=0., grayscale_p=0., erase_p=0.)] if crop_flip_only
                              else ())
  key = jax.random.key(0)
  augment_fn = jax.jit(
      lambda step, images: augment.augment_batch(
          jax.random.fold_in(key, step), images, views),
      in_shardings=(replicated, data_sharding), out_shardings=data_sharding)
  jax.block_until_ready(augment_fn(0, batches(0)['image']))   # Compile.
  t = time.perf_counter()
  for step in range(1, iters + 1):
    out = augment_fn(step, batches(step)['image'])
  jax.block_until_ready(out)
  return iters * BATCH * num_views / (time.perf_counter() - t)


def bench_tf(images, scale, num_views, num_images):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], 'GPU')
  h, w, _ = images.shape[1:]

  def crop_flip(image, seed):
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros((1, 0, 4)), seed=seed,
        area_range=scale, aspect_ratio_range=(3 / 4, 4 / 3),
        min_object_covered=0., use_image_if_no_bounding_boxes=True)
    crop = tf.slice(image, begin, size)
    crop = tf.image.resize(tf.cast(crop, tf.float32)[None], (h, w))[0] / 255.
    return tf.image.stateless_random_flip_left_right(crop, seed + 1)

  def make_views(i, image):
    return tf.stack([crop_flip(image, tf.stack([i, 2 * v]))
                     for v in range(num_views)])

  ds = tf.data.Dataset.from_tensor_slices(images[:num_images]).enumerate()
  ds = ds.map(make_views, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)
  for _ in ds.take(1):    # Warm-up: trace the map.
    pass
  t = time.perf_counter()
  n = 0
  for batch in ds:
    n += int(batch.shape[0])
  return n * num_views / (time.perf_counter() - t)


def bench_train_step(iters):
  """Seconds per default train step, built as train.train_and_evaluate does."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from contrastive_jax import models  # pylint: disable=g-import-not-at-top
  from contrastive_jax import train  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  mesh = _mesh()
  data_sharding = NamedSharding(mesh, P('data'))
  model = models.create_model(config)
  tx = train.create_optimizer(config, total_steps=1000)
  method = train.Method.from_config(config, total_steps=1000,
                                    steps_per_epoch=117, num_examples=60_000)
  init_fn, step_fn, _ = train.create_step_fns(config, model, tx, mesh, method,
                                              (28, 28, 1))
  state = init_fn(jax.random.key(0))
  b, v = config.batch_size, config.augment.num_views
  rng = np.random.default_rng(0)
  batch = {'views': rng.random((b, v, 28, 28, 1), np.float32),
           'label': rng.integers(0, 10, b).astype(np.int32),
           'index': np.arange(b, dtype=np.int32)}
  batch = jax.device_put(batch, data_sharding)
  step_rng = jax.random.key(1)
  state, metrics = step_fn(state, batch, step_rng)          # Compile.
  jax.block_until_ready(metrics)
  t = time.perf_counter()
  for _ in range(iters):
    state, metrics = step_fn(state, batch, step_rng)
  jax.block_until_ready(metrics)
  dt = (time.perf_counter() - t) / iters
  return b * v / dt, dt


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data_dir', default='/tmp/tfds_test')
  parser.add_argument('--iters', type=int, default=5,
                      help='timed batches per JAX row and train steps.')
  parser.add_argument('--tf_images', type=int, default=2048,
                      help='images per tf.data row.')
  args = parser.parse_args()
  t0 = time.time()
  load0 = os.getloadavg()[0]

  fmnist = pipeline.load_split('fashion_mnist', 'train', args.data_dir)
  rng = np.random.default_rng(0)
  synth = pipeline.ArrayDataset(
      rng.integers(0, 256, (8 * BATCH, 32, 32, 3), dtype=np.uint8),
      rng.integers(0, 10, 8 * BATCH).astype(np.int32))
  cases = [('fmnist 28x28x1', fmnist, 'fmnist'),
           ('synthetic 32x32x3', synth, 'cifar_small')]

  consume, step_s = bench_train_step(max(2, args.iters // 2))
  rows = []
  for name, data, preset in cases:
    scale = augment.PRESETS[preset][0].crop_scale
    for v in (2, 5):
      rows.append((name, v, f'jax {preset} preset',
                   bench_jax(data, preset, v, args.iters)))
      rows.append((name, v, 'jax crop+flip',
                   bench_jax(data, preset, v, args.iters, True)))
      rows.append((name, v, 'tf.data map crop+flip',
                   bench_tf(data.images, scale, v, args.tf_images)))

  print(f'\nInput pipeline vs train step ({jax.device_count()} CPU devices, '
        f'batch {BATCH}). Load average {load0:.1f} at start, '
        f'{os.getloadavg()[0]:.1f} at end, on {os.cpu_count()} cores shared '
        'with other jobs: numbers are noisy; on CPU the pipeline and the step '
        'also compete for the same cores.\n')
  print(f'default train step (configs/default.py, 2 views): {step_s:.2f} s/step'
        f' = {consume:,.0f} views/s consumed\n')
  print(f'{"dataset":<20}{"V":>3}  {"pipeline (jax: mesh, jit)":<26}'
        f'{"views/s":>10}'
        f'{"x consumption":>15}')
  for name, v, impl, rate in rows:
    print(f'{name:<20}{v:>3}  {impl:<26}{rate:>10,.0f}{rate / consume:>14.1f}x')
  ok = all(r / consume >= 1.5 for _, _, impl, r in rows if 'jax' in impl)
  print(f'\ngoal (jax pipeline >= 1.5x consumption): '
        f'{"met" if ok else "NOT met"}; total {math.ceil(time.time() - t0)} s')


if __name__ == '__main__':
  main()
