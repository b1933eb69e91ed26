r"""Bytes moved by collectives per step: gathered vs. sharded queue and bank.

Run from the repository root (8 virtual CPU devices are set up here):

    PYTHONPATH=. .venv/bin/python benchmarks/queue_comm.py
    PYTHONPATH=. .venv/bin/python benchmarks/queue_comm.py --steps 3 --no-bank

What is measured. The MoCo v2 step of `configs/moco_v2.py` (small CNN,
batch 256 x 2 views, shuffle-BN, InfoNCE against the queue only) with the
paper's queue, Q = 65536 rows of D = 128, built exactly as train.py builds it
(`step_lib.build`: the state replicated but the queue, sharded by rows
over 'data'), compiled for 8 devices in two layouts:

* gathered (before): the queue write was a `dynamic_update_slice` at the
  traced pointer. On a row-sharded queue XLA's SPMD partitioner all-gathers
  the whole [Q, D] queue for it on every step. This variant is rebuilt here by
  swapping that old `enqueue` into `state_lib` (it exists only in this file
  and in tests/test_queue_sharding.py, not in the library);
* sharded (now): `moco.enqueue` scatters the B new rows, which each device
  applies to the rows it owns. The queue logits are computed where the queue
  rows live: the [B, D] queries are all-gathered, each device forms its
  [B, Q / 8] logits, and the log-sum-exp is combined with all-reduces of
  [B, 1] maxima and sums.

"Bytes moved" is the sum over the compiled HLO's all-gather, all-reduce,
reduce-scatter, all-to-all and collective-permute ops of their result sizes
(per device, one execution each; the step has no loops around collectives).
It is the per-device receive volume of the step's communication, up to each
algorithm's constant. Step times are the median of `--steps` steps after 2
warm-up steps on this CPU (8 virtual devices share 2 cores, so the time an
all-gather costs here is a memory copy, not network time; the bytes column is
what carries over to a pod).

`--bank` (default on) also compiles the InsDis memory-bank step of
`configs/insdis.py` with the paper's m = 4096 noise rows per instance
(60000-row bank, D = 128, batch 256) in two layouts:

* gathered (before): the noise rows were read as `bank[ids]` with [B, K]
  global row ids drawn uniformly over the data. On the row-sharded bank XLA
  all-gathers the whole [rows, D] bank for that gather on every step (29 MiB
  per device here, 625 MiB at ImageNet's 1.28M rows). Rebuilt here by
  swapping that old read (`gathered_bank_noise`) into `state_lib`;
* sharded (now): `memory_bank.sample_bank_noise`, each device draws K / 8 rows per
  instance from its own shard, so the [B, K, D] noise stays sharded along K
  and only the small [B, D] embeddings and [B]-sized partial sums move.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COLLECTIVES = ('all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all',
               'collective-permute')
_BYTES = {'f64': 8, 's64': 8, 'u64': 8, 'c64': 8, 'f32': 4, 's32': 4,
          'u32': 4, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2, 's8': 1,
          'u8': 1, 'pred': 1, 'c128': 16}
# `%name = <result type> <op>(` ; the result type may be a tuple.
_OP = re.compile(r'^\s*(?:ROOT\s+)?%\S+\s*=\s*(.+?)\s+(' +
                 '|'.join(COLLECTIVES) + r')(-start|-done)?\(')
_ARRAY = re.compile(r'\b([a-z]+[0-9]*)\[([0-9,]*)\]')

Collective = collections.namedtuple('Collective',
                                    'kind dtype shape bytes line')


def collectives(hlo_text: str) -> list[Collective]:
  """The collectives of a compiled HLO module and their result sizes.

  An async pair (`*-start` / `*-done`) is counted once, at its `-done`, whose
  result is the collective's output (the `-start` tuple also holds the
  operand). A tuple-shaped all-reduce (XLA combines small ones) counts every
  element.
  """
  out = []
  for line in hlo_text.splitlines():
    m = _OP.match(line)
    if not m or m.group(3) == '-start':
      continue
    for dtype, dims in _ARRAY.findall(m.group(1)):
      if dtype not in _BYTES:
        continue
      shape = tuple(int(d) for d in dims.split(',') if d)
      n = 1
      for d in shape:
        n *= d
      out.append(Collective(m.group(2), dtype, shape, n * _BYTES[dtype],
                            line.strip()))
  return out


def gathers_of(hlo_text: str, shape: tuple[int, ...]) -> list[Collective]:
  """The all-gathers whose result has exactly `shape` (e.g. the whole queue)."""
  return [c for c in collectives(hlo_text)
          if c.kind == 'all-gather' and c.shape == tuple(shape)]


def gathered_enqueue(queue, ptr, keys):
  """The queue write before the change (for the 'gathered' variant only)."""
  import jax  # pylint: disable=g-import-not-at-top
  q, b = queue.shape[0], keys.shape[0]
  keys = jax.lax.stop_gradient(keys).astype(queue.dtype)
  new_queue = jax.lax.dynamic_update_slice(queue, keys, (ptr, 0))
  return new_queue, ((ptr + b) % q).astype(ptr.dtype)


def gathered_bank_noise(bank, key, *, batch, num_negatives, num_examples,
                        mesh=None):
  """InsDis's noise read before the change (the 'gathered' variant only).

  Same signature as `memory_bank.sample_bank_noise`: [batch, K] global row ids
  drawn uniformly from [0, num_examples) and read with one `bank[ids]`,
  which XLA partitions by all-gathering the row-sharded bank.
  """
  import jax  # pylint: disable=g-import-not-at-top
  del mesh
  ids = jax.random.randint(key, (batch, num_negatives), 0, num_examples)
  return bank[ids]


def _moco_config(queue_size: int, dim: int, batch: int):
  from configs import moco_v2  # pylint: disable=g-import-not-at-top
  config = moco_v2.get_config()
  config.moco.queue_size = queue_size
  config.model.head_out_dim = dim
  config.batch_size = batch
  return config


def _bank_config(dim: int, batch: int, negatives: int):
  from configs import insdis  # pylint: disable=g-import-not-at-top
  config = insdis.get_config()
  config.model.head_out_dim = dim
  config.batch_size = batch
  config.memory_bank.num_negatives = negatives
  return config


def _compile_and_time(config, *, num_examples: int, steps: int):
  """(hlo text, median step seconds, compile seconds) of train.py's step."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top

  mesh = runtime.create_mesh()
  steps_per_epoch = num_examples // config.batch_size
  setup = step_lib.build(config, mesh,
                      total_steps=int(config.num_epochs * steps_per_epoch),
                      steps_per_epoch=steps_per_epoch,
                      num_examples=num_examples, image_shape=(28, 28, 1))
  init_fn, step_fn = setup.init_fn, setup.step_fn
  state = init_fn(jax.random.key(0))
  rng = np.random.default_rng(0)
  b, v = config.batch_size, config.augment.num_views
  data = NamedSharding(mesh, P('data'))
  batch = {'views': jax.device_put(
      rng.random((b, v, 28, 28, 1), np.float32), data),
           'label': jax.device_put(np.zeros(b, np.int32), data),
           'index': jax.device_put(rng.permutation(num_examples)[:b].astype(
               np.int32), data)}
  key = jax.random.key(1)
  t0 = time.perf_counter()
  compiled = step_fn.lower(state, batch, key).compile()
  compile_s = time.perf_counter() - t0
  for _ in range(2):
    state, metrics = compiled(state, batch, key)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch, key)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  assert np.isfinite(float(metrics['loss'])), metrics
  return compiled.as_text(), float(np.median(times)), compile_s


def _mib(n: int) -> str:
  return f'{n / 2**20:9.3f}'


def _row(label: str, hlo: str, step_s: float, compile_s: float,
         big: tuple[int, ...], hlo_dir: str | None) -> dict:
  if hlo_dir:
    os.makedirs(hlo_dir, exist_ok=True)
    name = re.sub(r'[^a-z0-9]+', '_', label.lower()).strip('_')
    with open(os.path.join(hlo_dir, name + '.hlo'), 'w') as f:
      f.write(hlo)
  cols = collectives(hlo)
  by_kind = collections.Counter()
  for c in cols:
    by_kind[c.kind] += c.bytes
  total = sum(by_kind.values())
  print(f'{label:<28} {_mib(total)} {_mib(by_kind["all-gather"])} '
        f'{_mib(by_kind["all-reduce"])} '
        f'{_mib(by_kind["reduce-scatter"] + by_kind["all-to-all"] + by_kind["collective-permute"])}'
        f' {len(gathers_of(hlo, big)):>6} {step_s:8.3f} {compile_s:8.1f}')
  return {'label': label, 'total': total, 'cols': cols}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--queue', type=int, default=65536)
  parser.add_argument('--dim', type=int, default=128)
  parser.add_argument('--batch', type=int, default=256)
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--bank', action=argparse.BooleanOptionalAction,
                      default=True)
  parser.add_argument('--top', type=int, default=4,
                      help='list the N largest collectives of each variant')
  parser.add_argument('--hlo_dir', default=None,
                      help='write each variant\'s compiled HLO text here')
  args = parser.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  from contrastive_jax.methods import memory_bank, moco  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == 8, jax.devices()
  try:
    load = os.getloadavg()
  except OSError:
    load = None
  print(f'jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform}'
        f' devices, load average {load}')
  print(f'MoCo v2 step: batch {args.batch} x 2 views, queue Q={args.queue}, '
        f'D={args.dim} ([Q, D] f32 = {args.queue * args.dim * 4 / 2**20:.1f}'
        ' MiB); MiB per device per step\n')
  print(f'{"variant":<28} {"total":>9} {"all-gath":>9} {"all-red":>9} '
        f'{"other":>9} {"Q-gath":>6} {"step s":>8} {"compile":>8}')
  q_shape = (args.queue, args.dim)
  config = _moco_config(args.queue, args.dim, args.batch)
  rows = []
  sharded_enqueue = moco.enqueue
  for label, enqueue in (('moco_v2 gathered (before)', gathered_enqueue),
                         ('moco_v2 sharded (now)', sharded_enqueue)):
    moco.enqueue = enqueue
    try:
      hlo, step_s, compile_s = _compile_and_time(config, num_examples=60_000,
                                                 steps=args.steps)
    finally:
      moco.enqueue = sharded_enqueue
    rows.append(_row(label, hlo, step_s, compile_s, q_shape,
                     args.hlo_dir))
  if args.bank:
    bank_cfg = _bank_config(args.dim, args.batch, 4096)
    sharded_noise = memory_bank.sample_bank_noise
    for label, noise in (('insdis gathered (before)', gathered_bank_noise),
                         ('insdis sharded (now)', sharded_noise)):
      memory_bank.sample_bank_noise = noise
      try:
        hlo, step_s, compile_s = _compile_and_time(
            bank_cfg, num_examples=60_000, steps=args.steps)
      finally:
        memory_bank.sample_bank_noise = sharded_noise
      rows.append(_row(label, hlo, step_s, compile_s, (60_000, args.dim),
                       args.hlo_dir))
  before, after = rows[0]['total'], rows[1]['total']
  print(f'\nqueue layout: {before / 2**20:.2f} -> {after / 2**20:.2f} MiB per '
        f'device per step ({before / max(after, 1):.1f}x less)')
  if args.bank:
    before, after = rows[2]['total'], rows[3]['total']
    print(f'bank noise (InsDis, 60000 x {args.dim} bank, batch {args.batch}, '
          f'K=4096): {before / 2**20:.2f} -> {after / 2**20:.2f} MiB per '
          f'device per step ({before / max(after, 1):.1f}x less)')
  print('("Q-gath": all-gathers whose result is the whole [Q, D] queue, or '
        'for the bank row the whole [rows, D] bank)')
  for row in rows:
    print(f'\nlargest collectives, {row["label"]}:')
    for c in sorted(row['cols'], key=lambda c: -c.bytes)[:args.top]:
      shape = 'x'.join(map(str, c.shape)) or 'scalar'
      print(f'  {c.kind:<14} {c.dtype}[{shape}]  {c.bytes / 2**20:.3f} MiB')
  try:
    print(f'\nload average after: {os.getloadavg()}')
  except OSError:
    pass


if __name__ == '__main__':
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8')
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.path.insert(0, ROOT)
  main()
