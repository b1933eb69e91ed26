"""Forward+backward time of every registered loss against its matmul floor.

For each loss of `contrastive_jax.losses.names()` this builds inputs with a
per-name builder (a loss without one is skipped with a printed reason), jits
`value_and_grad` with respect to the trainable embeddings, and reports the
median wall time after a warm-up next to the floor: fwd+bwd of the bare
similarity matmul `sum(a @ b.T)` of the same shape ([N*V, N*V] for in-batch
losses, [rows, Q] against the queue for key-encoder losses). Goal: each loss
within 3x of its floor.

    python benchmarks/losses.py                  # N*V in {512, 4096}, Q=65536
    python benchmarks/losses.py --quick          # small sizes, ~1 minute
    python benchmarks/losses.py --sizes 1024 --queue 16384 --only cacr,macl

Measured on the project's 2-core CPU (the background study paused), `python
benchmarks/losses.py --sizes 4096 --repeats 5`, D = 128, Q = 65536,
2026-11-25, each loss alternating run by run with its floor:

    loss              N*V    floor shape   loss ms  floor ms  ratio
    align_uniform    4096      4096x4096    300.85    169.88   1.77
    byol             4096      4096x4096      2.16    161.22   0.01
    cacr             4096      4096x4096    118.29    155.00   0.76
    cacr+queue       4096     4096x67584   7478.28   2877.61   2.60
    cmc              4096      4096x4096    132.96    147.32   0.90
    dcl              4096      4096x4096    124.34    153.53   0.81
    hard_negative    4096      4096x4096    324.31    164.93   1.97
    infonce          4096     4096x65536   4715.18   2430.33   1.94
    insdis           4096     4096x65536   4116.78   2193.19   1.88
    jcl              4096     4096x65536   3532.19   2212.35   1.60
    macl             4096      4096x4096     56.37    160.82   0.35
    ntxent           4096      4096x4096    288.97    185.62   1.56
    supcon           4096      4096x4096    282.69    173.38   1.63
    tcl              4096      4096x4096    385.47    201.51   1.91

Every loss is within 3x. The ratios move by up to ~0.3 between runs (the
cacr+queue row measured 1.71 in an earlier run that day); the loss and its floor
alternating (`_time`) keeps a load burst from landing on one of the two only.
Earlier tables timed each floor once, before its losses, and overstated the
ratios (tcl 3.02-3.16x then). tcl's time fell from 467-473 ms to 375-432 ms
(same run, 2 rounds each, the code before and after alternating) when the
|P(i)|, |N(i)| counts came from the sorted labels instead of summing [M, M]
masks and its gradient diagnostics reused the loss's exponentials: on
XLA:CPU every masked reduction over [M, M] is a pass of its own. A ratio
below 1 means the loss multiplies smaller blocks than [N*V, N*V]
(per-view-pair [N, N] similarities); byol has no similarity matmul at all.
hard_negative was 4.5x before its positives' terms moved from [M, M] to
[N, V, V] arrays and its two log-sum-exps shared one pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

# Run as a plain script from anywhere: the package lives one level up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from contrastive_jax import losses  # noqa: E402

# A builder maps (rng, total embeddings N*V, D, Q) to a list of cases:
# (label, fn(trainable, *consts), trainable, consts, floor (rows, cols, b is a)).
# Keys, queues and labels are passed as arguments, never closed over: closed-
# over arrays become XLA constants, which it then tries to constant-fold.
Case = tuple[str, Callable, jax.Array, tuple, tuple[int, int, bool]]
In = losses.LossInputs   # pylint: disable=invalid-name


def _z(rng, nv, d, v=2):
  return jax.random.normal(rng, (nv // v, v, d), jnp.float32)


def _key_inputs(rng, nv, d, q, vk=1):
  k1, k2, k3 = jax.random.split(rng, 3)
  query = jax.random.normal(k1, (nv, 1, d), jnp.float32)
  key = jax.random.normal(k2, (nv, vk, d), jnp.float32)
  queue = jax.random.normal(k3, (q, d), jnp.float32)
  return query, key, queue


def _in_batch(name, **kw):
  def build(rng, nv, d, q):
    del q
    return [(name, lambda z: losses.apply(name, In(z), **kw), _z(rng, nv, d),
             (), (nv, nv, True))]
  return build


def _labelled(name, **kw):
  def build(rng, nv, d, q):
    del q
    labels = jax.random.randint(rng, (nv // 2,), 0, 10)
    return [(name, lambda z, lab: losses.apply(name, In(z, labels=lab), **kw),
             _z(rng, nv, d), (labels,), (nv, nv, True))]
  return build


def _infonce(rng, nv, d, q):
  query, key, queue = _key_inputs(rng, nv, d, q)
  return [('infonce', lambda x, k, qu: losses.apply(
      'infonce', In(x, key=k, queue=qu), in_batch_negatives=False),
           query, (key, queue), (nv, q, False))]


def _insdis(rng, nv, d, q):
  query, key, queue = _key_inputs(rng, nv, d, q)
  return [('insdis', lambda x, k, qu: losses.apply(
      'insdis', In(x, key=k, queue=qu), num_data=1_281_167),
           query, (key, queue), (nv, q, False))]


def _cacr(rng, nv, d, q):
  z = _z(rng, nv, d)
  key = jax.random.normal(jax.random.fold_in(rng, 1), z.shape)
  queue = jax.random.normal(jax.random.fold_in(rng, 2), (q, d))
  return [
      ('cacr', lambda x: losses.apply('cacr', In(x)), z, (), (nv, nv, True)),
      ('cacr+queue', lambda x, k, qu: losses.apply(
          'cacr', In(x, key=k, queue=qu)), z, (key, queue),
       (nv, q + nv // 2, False)),
  ]


def _byol(rng, nv, d, q):
  # No similarity matmul (a per-pair regression, O(N V D)): its row is
  # measured against the in-batch floor of the same N*V.
  del q
  z = _z(rng, nv, d)
  key = jax.random.normal(jax.random.fold_in(rng, 1), z.shape)
  return [('byol', lambda x, k: losses.apply('byol', In(x, key=k)), z,
           (key,), (nv, nv, True))]


def _jcl(rng, nv, d, q):
  query, key, queue = _key_inputs(rng, nv, d, q, vk=4)
  return [('jcl', lambda x, k, qu: losses.apply(
      'jcl', In(x, key=k, queue=qu), lam=2.0), query,
           (key, queue), (nv, q, False))]


BUILDERS: dict[str, Callable] = {
    'ntxent': _in_batch('ntxent'),
    'cmc': _in_batch('cmc'),
    'align_uniform': _in_batch('align_uniform'),
    'hard_negative': _in_batch('hard_negative'),
    'dcl': _in_batch('dcl'),
    'macl': _in_batch('macl'),
    'supcon': _labelled('supcon'),
    'tcl': _labelled('tcl'),
    'infonce': _infonce,
    'insdis': _insdis,
    'cacr': _cacr,
    'jcl': _jcl,
    'byol': _byol,
}


def _time(jobs, repeats: int) -> list[float]:
  """Median seconds of each jitted fn(*args) of `jobs`, after a warm-up.

  jobs: [(fn, args), ...]. The jobs alternate run by run, so that a load
  change on a shared machine moves all medians alike and a ratio between
  them (loss to floor) holds.
  """
  for fn, args in jobs:
    jax.block_until_ready(fn(*args))
  times = [[] for _ in jobs]
  for _ in range(repeats):
    for (fn, args), out in zip(jobs, times):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      out.append(time.perf_counter() - start)
  return [statistics.median(t) for t in times]


def _floor_fn(rows: int, cols: int, same: bool, d: int, rng):
  """fwd+bwd of sum(a @ b.T); b is a itself for in-batch losses."""
  a = jax.random.normal(rng, (rows, d), jnp.float32)
  if same:
    return jax.jit(jax.value_and_grad(lambda x: jnp.sum(x @ x.T))), (a,)
  b = jax.random.normal(jax.random.fold_in(rng, 1), (cols, d), jnp.float32)
  return jax.jit(jax.value_and_grad(lambda x, y: jnp.sum(x @ y.T))), (a, b)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--sizes', default='512,4096',
                      help='comma-separated N*V values (total embeddings)')
  parser.add_argument('--dim', type=int, default=128)
  parser.add_argument('--queue', type=int, default=65536,
                      help='queue length Q for losses that take one')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--only', default='',
                      help='comma-separated loss names (default: all)')
  parser.add_argument('--quick', action='store_true',
                      help='sizes 256,1024, Q=8192, 2 repeats')
  args = parser.parse_args(argv)
  if args.quick:
    args.sizes, args.queue, args.repeats = '256,1024', 8192, 2
  sizes = [int(s) for s in args.sizes.split(',')]
  names = list(losses.names())
  if args.only:
    names = [n for n in names if n in args.only.split(',')]

  print(f'backend={jax.default_backend()} devices={jax.device_count()} '
        f'D={args.dim} Q={args.queue} repeats={args.repeats}')
  header = f'{"loss":<14} {"N*V":>6} {"floor shape":>14} ' \
           f'{"loss ms":>9} {"floor ms":>9} {"ratio":>6}'
  print(header)
  print('-' * len(header))
  rng = jax.random.key(0)
  for name in names:
    if name not in BUILDERS:
      print(f'{name:<14} skipped: no input builder in benchmarks/losses.py')
      continue
    for nv in sizes:
      try:
        cases = BUILDERS[name](rng, nv, args.dim, args.queue)
      except Exception as e:  # a loss in flux must not stop the table
        print(f'{name:<14} {nv:>6} skipped: building inputs failed: {e}')
        continue
      for label, fn, x, consts, (rows, cols, same) in cases:
        # Gradient with respect to the trainable embeddings only.
        step = jax.jit(jax.value_and_grad(fn, has_aux=True))
        try:
          t, tf = _time([(step, (x, *consts)),
                         _floor_fn(rows, cols, same, args.dim, rng)],
                        args.repeats)
        except Exception as e:
          print(f'{label:<14} {nv:>6} skipped: {type(e).__name__}: {e}')
          continue
        print(f'{label:<14} {nv:>6} {f"{rows}x{cols}":>14} '
              f'{1e3 * t:>9.2f} {1e3 * tf:>9.2f} {t / tf:>6.2f}', flush=True)


if __name__ == '__main__':
  main()
