r"""Will it fit? Per-device memory of the paper-scale ImageNet steps.

Run from the repository root (compiles, never runs, the steps):

    .venv/bin/python -m benchmarks.memory
    .venv/bin/python -m benchmarks.memory --methods=simclr \
        --per_device=512,128 --dtypes=bfloat16

For each configs/papers/<method>.py:imagenet (ResNet-50, 224 px, the paper's
views, head, queue and optimizer) and each per-device batch, the train step is
lowered for a mesh of 8 (virtual CPU) devices at global batch = per-device
batch x 8, compiled by XLA, and its memory analysis printed per device:
arguments (train state + batch; the state is donated, so its buffers are
reused for the output), temporaries (activations kept for the backward pass,
gradients, optimizer scratch), and their sum, the peak to expect. The
per-device figures do not depend on how many devices share the global
batch (the state is replicated, the queue is sharded: its share shrinks
with more devices), so one row answers for every mesh with that per-device
batch: SimCLR's batch 4096 is 512 per device on 8 devices, 128 on 32.

What the numbers are. XLA:CPU's buffer assignment for the same program. The
GPU and TPU compilers fuse convolutions with BatchNorm and elementwise ops
and keep fewer temporaries, so expect an accelerator to need less than
printed (how much less was not measured: no accelerator here); compile on
the target with `jax.jit(...).lower(...).compile().memory_analysis()` (what
this script calls) before a long launch. A consistency check against what is
known to fit: SimCLR trained batch 4096 on 128 TPU v3 cores, 32 images per
core in 16 GB; here per-device batch 32 needs 9.4 GiB. bf16 rows: XLA:CPU
has no native bf16 convolution, and its converts keep float32 copies next to
the bf16 ones, so here bf16 needs *more* than float32 (measured: 145 vs 128
GiB at 512 per device); on GPUs and TPUs bf16 activations take half the
bytes. Read the float32 rows as the CPU's estimate, and halve the
activations for bf16 on an accelerator as a rule of thumb.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time

GIB = 1024 ** 3
DEVICES = 8
# Accelerator memory per device, for the "fits" column.
TARGETS = {'80 GB (A100/H100)': 80e9, '32 GB (V100, TPU v4)': 32e9,
           '16 GB (TPU v3, V100-16)': 16e9}


def step_memory(method: str, per_device: int, dtype: str) -> dict[str, float]:
  """Compiles the method's ImageNet step; returns its memory in bytes."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top
  from contrastive_jax import config_lib  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top

  config = importlib.import_module(f'configs.papers.{method}').get_config(
      'imagenet')
  config.batch_size = per_device * DEVICES
  config.model.dtype = dtype
  q = config.moco.queue_size
  if q and q % config.batch_size:      # The queue holds whole batches.
    config.moco.queue_size = q // config.batch_size * config.batch_size
  mesh = runtime.create_mesh()
  config_lib.validate(config, mesh.size)
  steps_per_epoch = 1_281_167 // config.batch_size
  setup = step_lib.build(config, mesh, total_steps=int(steps_per_epoch *
                                                    config.num_epochs),
                      steps_per_epoch=steps_per_epoch,
                      num_examples=1_281_167, image_shape=(224, 224, 3),
                      num_classes=1000)
  state = jax.eval_shape(setup.init_fn, jax.random.key(0))
  state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=sh), state, setup.shardings)
  rows = NamedSharding(mesh, P('data'))
  views = augment.build_views(config.augment.preset, config.augment.num_views,
                              config.augment.overrides)
  b, v = config.batch_size, len(views)
  batch = {'views': jax.ShapeDtypeStruct((b, v, 224, 224, 3), jnp.float32,
                                          sharding=rows),
           'label': jax.ShapeDtypeStruct((b,), jnp.int32, sharding=rows),
           'index': jax.ShapeDtypeStruct((b,), jnp.int32, sharding=rows)}
  t0 = time.time()
  compiled = setup.step_fn.lower(state, batch, jax.random.key(0)).compile()
  mem = compiled.memory_analysis()
  return {'arguments': mem.argument_size_in_bytes,
          'outputs': mem.output_size_in_bytes,
          'aliased': mem.alias_size_in_bytes,
          'temporaries': mem.temp_size_in_bytes,
          'code': mem.generated_code_size_in_bytes,
          'compile_seconds': time.time() - t0}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--methods', default='simclr,moco_v2')
  parser.add_argument('--per_device', default='512,256,128,32')
  parser.add_argument('--dtypes', default='bfloat16,float32')
  args = parser.parse_args()
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             f' --xla_force_host_platform_device_count='
                             f'{DEVICES}')
  print(f'Per-device memory of the ImageNet ResNet-50 train step (XLA:CPU '
        f'memory analysis, {DEVICES}-device mesh; GiB = 2^30 bytes).')
  header = (f'{"method":<9}{"dtype":<10}{"batch/dev":>9}{"global@8":>9}'
            f'{"args":>8}{"temps":>8}{"peak":>8}  fits on (peak < memory)')
  print(header)
  print('-' * len(header))
  for method in args.methods.split(','):
    for dtype in args.dtypes.split(','):
      for per_device in (int(x) for x in args.per_device.split(',')):
        m = step_memory(method, per_device, dtype)
        # The donated state is reused for the output: arguments + temps is
        # the live peak (outputs alias the arguments).
        peak = m['arguments'] + m['temporaries'] + m['outputs'] - m['aliased']
        fits = [name for name, cap in TARGETS.items() if peak < cap]
        print(f'{method:<9}{dtype:<10}{per_device:>9}'
              f'{per_device * DEVICES:>9}{m["arguments"] / GIB:>8.2f}'
              f'{m["temporaries"] / GIB:>8.2f}{peak / GIB:>8.2f}  '
              f'{", ".join(fits) or "none of " + ", ".join(TARGETS)}'
              f'   (compiled in {m["compile_seconds"]:.0f} s)', flush=True)
  print('XLA:CPU estimates; bf16 rows overstate (no native bf16 convolution on '
        'CPU; see the module docstring).')


if __name__ == '__main__':
  main()
