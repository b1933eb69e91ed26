r"""kNN evaluator benchmark: time and peak memory vs a numpy brute force.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/knn.py            # all cases
    PYTHONPATH=. .venv/bin/python benchmarks/knn.py --cases fmnist

Cases (synthetic 10-class Gaussian mixtures, float32, k in (20, 200),
T = 0.1, cosine):

* fmnist: 60k x 128 bank, 10k queries (Fashion-MNIST sized).
* 1m:     1M x 128 bank, 1k queries.
* flat:   60k x 2304 bank, 10k queries: configs/base.py's representation
          (the flattened 3x3x256 map, which the method configs score and
          the default job did before it took the pooled 256-d output); not
          run unless asked (--cases flat).

Implementations: `jax` (knn_evaluate, one CPU device), `jax-shard2` and
`jax-shard8` (bank sharded over 2 or 8 virtual CPU devices: the same 2 cores,
so they show the overhead of the sharded path, not a speed-up; 8 is the
default job's device count; shard8 not run unless asked) and `numpy`
(vectorised brute force:
float32 matmul per 1024-query chunk, argpartition, stable sort, np.add.at
votes).

How it is measured. Every (case, implementation) runs in a fresh subprocess,
so peaks do not leak between runs. Inside it: build the data, record the
current RSS (/proc/self/statm), run once ("first": includes jit compilation),
run again ("steady"), then report peak RSS (getrusage ru_maxrss) minus the RSS
before the first run: the extra memory the evaluation needed, compilation and
XLA buffers included (tracemalloc cannot see XLA's allocator). Wall-clock with
time.perf_counter; the machine is shared, so the load average is printed too.

The flattened map's kNN (`--cases flat --impls jax jax-shard2 jax-shard8`,
2026-11-25, the study running niced beside it, load average 7-13): steady
22.4 s on 1 device, 24.8 s on 2, 26.0 s on 8 (peak +0.9, +1.2, +2.3 GB).
The 2 x 10k x 60k x 2304 = 2.76 TFLOP of similarities at 22.4 s are 123
GFLOP/s, about the float32 matmul rate measured that day (162 GFLOP/s with
nothing beside it): the kNN of each 2304-d representation is bound by its
matmul, and the three kNNs of such an evaluation (the pixels' is 0.9
TFLOP) need ~40 s at that rate, most of a one-minute budget.
Lower precision is no way round it on this CPU (AVX2 + FMA, no AVX-512 or
VNNI): 2048^3 products through jax.lax.dot on one device, 2026-11-25, the
study beside it, ran at float32 130, bfloat16 90, float16 114 and int8
(int32 accumulation) 140 GFLOP/s, so a low-precision pre-selection of
candidates re-scored in float32 would not halve the kNN.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

CASES = {
    'fmnist': dict(n=60_000, d=128, q=10_000),
    '1m': dict(n=1_000_000, d=128, q=1_000),
    'flat': dict(n=60_000, d=2304, q=10_000),
}
IMPLS = ('jax', 'jax-shard2', 'jax-shard8', 'numpy')
DEFAULT_CASES, DEFAULT_IMPLS = ('fmnist', '1m'), ('jax', 'jax-shard2', 'numpy')


def _devices(impl: str) -> int:
  """Virtual CPU devices of an implementation: 'jax-shard8' -> 8."""
  return int(impl.split('shard')[1]) if 'shard' in impl else 1
KS = (20, 200)
TEMPERATURE = 0.1
NUM_CLASSES = 10


def make_data(n, d, q, seed=0):
  import numpy as np
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(NUM_CLASSES, d)).astype(np.float32)

  def draw(m):
    y = rng.integers(0, NUM_CLASSES, m).astype(np.int32)
    x = centers[y] + 5.0 * rng.standard_normal((m, d), dtype=np.float32)
    return x, y

  bank, bank_y = draw(n)
  query, query_y = draw(q)
  return bank, bank_y, query, query_y


def numpy_knn(bank, bank_y, query, query_y, ks=KS):
  """Vectorised float32 brute force with the same tie rules as the evaluator.

  Queries go 2^25 similarities at a time (1024 queries for a 60k bank, 32 for
  1M): argpartition's int64 indices make a bigger block cost gigabytes.
  """
  import numpy as np
  chunk = max(1, min(1024, 2**25 // len(bank)))
  bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
  query = query / np.linalg.norm(query, axis=1, keepdims=True)
  kmax = max(ks)
  correct = {(kind, k): 0 for kind in ('weighted', 'majority') for k in ks}
  for s in range(0, len(query), chunk):
    q, qy = query[s:s + chunk], query_y[s:s + chunk]
    sims = q @ bank.T                                       # [c, N]
    part = np.argpartition(-sims, kmax - 1, axis=1)[:, :kmax]
    top = np.take_along_axis(sims, part, 1)
    order = np.lexsort((part, -top), axis=1)       # sim desc, index asc
    idx = np.take_along_axis(part, order, 1)
    top = np.take_along_axis(top, order, 1)
    labels = bank_y[idx]
    rows = np.arange(len(q))[:, None]
    for k in ks:
      w = np.zeros((len(q), NUM_CLASSES))
      np.add.at(w, (rows, labels[:, :k]), np.exp(top[:, :k] / TEMPERATURE))
      m = np.zeros((len(q), NUM_CLASSES))
      np.add.at(m, (rows, labels[:, :k]), 1)
      correct['weighted', k] += int(np.sum(np.argmax(w, 1) == qy))
      correct['majority', k] += int(np.sum(np.argmax(m, 1) == qy))
  return {f'knn_{kind}_top1@{k}': c / len(query)
          for (kind, k), c in correct.items()}


def current_rss_mb():
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def child(case, impl):
  """Runs one measurement and prints one JSON line."""
  data = make_data(**CASES[case])
  if impl == 'numpy':
    fn = lambda: numpy_knn(*data)
  else:
    import jax
    from contrastive_jax.evaluators import knn
    mesh = None
    if _devices(impl) > 1:
      # Explicit axes: the bank's layout is part of the array type, and
      # knn_evaluate places it with NamedSharding(mesh, P('data', None)).
      mesh = jax.make_mesh((_devices(impl),), ('data',),
                           axis_types=(jax.sharding.AxisType.Explicit,))
    fn = lambda: knn.knn_evaluate(*data, num_classes=NUM_CLASSES, ks=KS,
                                  temperature=TEMPERATURE, mesh=mesh)
  rss0 = current_rss_mb()
  t0 = time.perf_counter()
  fn()
  t1 = time.perf_counter()
  metrics = fn()
  t2 = time.perf_counter()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(json.dumps(dict(case=case, impl=impl, first_s=t1 - t0,
                        steady_s=t2 - t1, peak_delta_mb=peak - rss0,
                        metrics=metrics)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--cases', nargs='+', default=list(DEFAULT_CASES),
                      choices=list(CASES))
  parser.add_argument('--impls', nargs='+', default=list(DEFAULT_IMPLS),
                      choices=list(IMPLS))
  parser.add_argument('--child', nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(*args.child)
    return
  print(f'load average at start: {os.getloadavg()}')
  header = (f'{"case":7} {"impl":10} {"bank":>11} {"queries":>7} '
            f'{"first s":>8} {"steady s":>8} {"peak MB":>8} '
            f'{"w@20":>6} {"w@200":>6} {"m@200":>6}')
  rows = []
  for case in args.cases:
    for impl in args.impls:
      env = dict(os.environ)
      env['XLA_FLAGS'] = (
          f'--xla_force_host_platform_device_count={_devices(impl)}'
          if _devices(impl) > 1 else '')
      out = subprocess.run(
          [sys.executable, __file__, '--child', case, impl], env=env,
          capture_output=True, text=True, check=True)
      r = json.loads(out.stdout.strip().splitlines()[-1])
      c = CASES[case]
      m = r['metrics']
      rows.append(
          f'{case:7} {impl:10} {c["n"]:>8}x{c["d"]:<3}{c["q"]:>7} '
          f'{r["first_s"]:8.2f} {r["steady_s"]:8.2f} '
          f'{r["peak_delta_mb"]:8.0f} {m["knn_weighted_top1@20"]:6.4f} '
          f'{m["knn_weighted_top1@200"]:6.4f} '
          f'{m["knn_majority_top1@200"]:6.4f}')
      print(rows[-1] if len(rows) > 1 else header + '\n' + rows[-1],
            flush=True)
  print(f'load average at end: {os.getloadavg()}')


if __name__ == '__main__':
  main()
