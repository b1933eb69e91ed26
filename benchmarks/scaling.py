r"""How cost grows: train step, losses and kNN evaluation against their sizes.

Run from the repository root (about 9 minutes; --quick: about 2):

    nice -n 5 .venv/bin/python benchmarks/scaling.py
    nice -n 5 .venv/bin/python benchmarks/scaling.py --quick
    nice -n 5 .venv/bin/python benchmarks/scaling.py --only loss,knn

Every group of rows sweeps one size and gets its growth exponent p: the
least-squares slope of log(time) against log(size), printed next to the
exponent the algorithm predicts. Exponents are ratios within one run, so the
machine's load (printed) scales every row of a group alike and mostly cancels.
The `norm` column is cost / size^expected relative to the group's first row:
1.00 all the way down means the expected law holds exactly. The plot
(benchmarks/scaling.png, rewritten by every run; the committed one is the run
below) shows each group on log-log axes with its fit and the expected slope.

Sections (each row runs in a fresh subprocess, as in benchmarks/train_step.py,
so that the device count can be set before jax is imported and peak memory
does not leak between rows):

* step: the default train step (configs/base.py: SmallCNN, NT-Xent,
  AdamW, the online probe) on 8 virtual CPU devices, built and timed by
  `benchmarks/train_step.py`'s `run_step` (median of 3 steps after 2 warm-up
  steps, on fixed random views) against the batch (instances, 2 views) and
  the number of views (at batch 256, configs/base.py's). 3 rounds over all
  points in alternating order, each point keeping the median of its rounds
  (`_step_rounds`: the load comes in bursts as long as a row). Expected:
  exponent 1 in both, because the convolutions, linear in the number of
  images, dominate. The NT-Xent similarity is quadratic in B*V, but at these
  sizes it is small: `sim %` is its share of the step's FLOPs (conv and
  similarity counted by hand, fwd + bwd), 0.16% at B*V = 128 and 1.9% at
  1536, and the loss section times it alone (below).
* loss: fwd+bwd of the loss (jit of value_and_grad; `benchmarks/losses.py`'s
  builders and `_time`, median of 3 runs after a warm-up, 3 rounds; 1 device,
  D = 128) for NT-Xent against N*V (expected 2: the [NV, NV] similarity) and
  for MoCo's InfoNCE (queue negatives only) against the queue length Q at 512
  queries (expected 1: the [512, Q] logits).
* knn: `contrastive_jax.evaluators.knn.knn_evaluate` (1 device, k in (20,
  200), as `benchmarks/knn.py` calls it, on its synthetic 10-class data) with
  1000 queries against the bank size, up to ImageNet's 1,281,167 rows x 128.
  Time: median of 3 runs after the first (compiling) one; expected exponent
  1. Memory: peak RSS over all runs minus the RSS before them (compilation
  and XLA's buffers included), in MiB and as a ratio to the bank's own bytes;
  expected to grow like the bank, because queries are scored in chunks so
  that one [chunk, bank] block of ~128 MiB exists at a time, never the whole
  [queries, bank] matrix (4.8 GiB at 1000 x 1.28M). The peak mark is reset
  after the data are built: `make_data`'s temporaries peak higher than the
  evaluation does (see `_reset_peak_rss`).

Measured on the project's 2-core CPU (AMD EPYC, 32 MiB L3), shared with a
study at nice 19 and another engineer's jobs (load average 7-12), at commit
021358d (SmallCNN convs as im2col + matmul), with

    nice -n 5 .venv/bin/python benchmarks/scaling.py

    load average 6.77 7.57 7.02 (1/5/15 min) on 2 CPUs (shared machine)
      step round 1/3 done, load average 11.4
      step round 2/3 done, load average 11.0
      step round 3/3 done, load average 12.0

    train step vs batch (2 views, 8 devices)  (expected exponent 1)
             batch         ms   norm  views/s conv GF sim %  ms of each round
                64      202.6   1.00      632     7.8  0.16  201/235/203
               128      561.8   1.39      456    15.5  0.32  601/562/528
               256       1132   1.40      452    31.0  0.64  1132/1144/1132
               512       2200   1.36      465    62.1  1.28  2200/2084/2225
      -> measured exponent 1.13, expected 1

    train step vs views (batch 256, 8 devices)  (expected exponent 1)
             views         ms   norm  views/s conv GF sim %  ms of each round
                 2       1132   1.00      452    31.0  0.64  1132/1144/1132
                 4       2168   0.96      472    62.1  1.28  2224/2101/2168
                 6       3233   0.95      475    93.1  1.91  3221/3233/3493
      -> measured exponent 0.95, expected 1
    load average 12.02 10.29 8.42 (1/5/15 min) after step

    NT-Xent fwd+bwd vs N*V (1 device)  (expected exponent 2)
               N*V         ms   norm  logits
               512      8.912   1.00  [512, 512]
             1,024      30.52   0.86  [1024, 1024]
             2,048      150.9   1.06  [2048, 2048]
             4,096      618.8   1.08  [4096, 4096]
      -> measured exponent 2.07, expected 2

    MoCo InfoNCE fwd+bwd vs queue (512 queries, 1 device)  (expected exponent 1)
                 Q         ms   norm  logits
             4,096      35.61   1.00  [512, 4096]
             8,192      84.18   1.18  [512, 8192]
            16,384      164.9   1.16  [512, 16384]
            32,768      325.6   1.14  [512, 32768]
            65,536      660.1   1.16  [512, 65536]
      -> measured exponent 1.04, expected 1
    load average 12.60 10.70 8.65 (1/5/15 min) after loss

    kNN time vs bank rows (1000 queries, 1 device)  (expected exponent 1)
         bank rows          s   norm   first s  (the first run compiles)
            80,000      0.652   1.00       1.8
           160,000      1.164   0.89       2.2
           320,000      2.244   0.86       3.6
           640,000      4.929   0.95       5.9
         1,281,167       11.6   1.11      13.0
      -> measured exponent 1.04, expected 1

    kNN peak extra memory vs bank rows  (expected exponent 1)
         bank rows        MiB   norm  bank MiB extra/bank
            80,000      233.7   1.00        39       5.98
           160,000      296.9   0.64        78       3.80
           320,000      384.5   0.41       156       2.46
           640,000      544.8   0.29       312       1.74
         1,281,167      879.1   0.23       626       1.41
      -> measured exponent 0.47, expected 1
      -> linear fit: extra = 206 MiB + 1.08 x bank bytes
    load average 8.23 9.88 8.57 (1/5/15 min) after knn

    group                                                                  sizes measured expected
    ----------------------------------------------------------------------------------------------
    train step vs batch (2 views, 8 devices)                             64..512     1.13        1
    train step vs views (batch 256, 8 devices)                              2..6     0.95        1
    NT-Xent fwd+bwd vs N*V (1 device)                                 512..4,096     2.07        2
    MoCo InfoNCE fwd+bwd vs queue (512 queries, 1 device)          4,096..65,536     1.04        1
    kNN time vs bank rows (1000 queries, 1 device)             80,000..1,281,167     1.04        1
    kNN peak extra memory vs bank rows                         80,000..1,281,167     0.47        1
    total 513 s

    wrote benchmarks/scaling.png

Reading it:

* Step vs batch: 1.13, not 1. Batches 128-512 are linear among themselves
  (452-465 views/s, norm 1.36-1.40); only batch 64 (16 images per device) is
  cheaper per image (632 views/s). Not the similarity: its share is 1.3% of
  the FLOPs at batch 512, and NT-Xent alone at N*V = 1024 takes 31 ms of that
  step's 2200. The cheap small batches are an effect of 8 virtual devices on
  2 cores: before the im2col convs (commit 4389264, XLA's convolutions) runs
  put the same break between batch 128 and 256, while the step on 1 device
  was linear at ~480 views/s from 16 to 128 images. Plausibly the whole
  batch's activations fitting the shared L3; not investigated further.
* Step vs views: 0.95, i.e. 1 within the noise (norm 0.95-1.00).
* NT-Xent: 2.07. N*V <= 1024 still carries fixed costs (norm 0.86); at 4096
  the [NV, NV] float32 logits (64 MiB) no longer fit the L3 (norm 1.08).
* MoCo InfoNCE: 1.04; linear from Q = 8192 on (norm 1.14-1.18). The [512,
  4096] logits of the first row (8 MiB) still fit the cache.
* kNN time: 1.04.
* kNN memory: extra = 206 MiB + 1.08 x the bank. The slope is one more copy
  of the bank (jit copies the host numpy bank into an XLA buffer: a
  jax.device_put of it does not alias), the intercept the fixed part
  (runtime, compilation, the ~128 MiB similarity block). The log-log
  exponent, 0.47, measures that fixed part against small banks; the ratio to
  the bank falls to 1.41 at 1.28M rows, on its way to 1.08. Bounded: 879 MiB
  extra at 1.28M rows, where the whole [1000, 1.28M] similarity matrix alone
  would take 4.8 GiB. (Read as benchmarks/knn.py does, from ru_maxrss, the
  1.28M row would show make_data's peak instead: 1249 MiB above the
  baseline.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# Neither imports jax at module level: a worker sets XLA_FLAGS first.
from benchmarks import knn as knn_bench  # noqa: E402
from benchmarks import train_step  # noqa: E402

DEVICES = 8          # The default job's virtual CPU devices.
DIM = 128            # Projection / feature width of every section.
SECTIONS = ('step', 'loss', 'knn')
PLOT = os.path.join(ROOT, 'benchmarks', 'scaling.png')

# Sizes per mode. Batches divide by DEVICES (the batch is sharded over them).
# rounds: sweeps over all sizes of the step and loss sections (see
# _step_rounds); steps and repeats: timed runs per size in a round.
FULL = dict(batches=(64, 128, 256, 512), views=(2, 4, 6), view_batch=256,
            steps=3, rounds=3, nv=(512, 1024, 2048, 4096),
            queues=(4096, 8192, 16384, 32768, 65536), queue_rows=512,
            repeats=3, banks=(80_000, 160_000, 320_000, 640_000, 1_281_167),
            queries=1000, knn_repeats=3)
QUICK = dict(batches=(32, 64, 128), views=(2, 4), view_batch=64, steps=3,
             rounds=1, nv=(256, 512, 1024), queues=(2048, 4096, 8192),
             queue_rows=256, repeats=3, banks=(20_000, 80_000, 320_000),
             queries=500, knn_repeats=2)


@dataclasses.dataclass
class Group:
  """One sweep: `values[i]` (seconds or MiB) measured at `sizes[i]`."""
  title: str
  size_name: str
  expected: float
  unit: str = 'ms'               # 'ms' and 's' print seconds scaled; 'MiB' raw.
  sizes: list = dataclasses.field(default_factory=list)
  values: list = dataclasses.field(default_factory=list)

  def scaled(self, value: float) -> float:
    return value * {'ms': 1e3, 's': 1.0, 'MiB': 1.0}[self.unit]


def exponent(sizes, values) -> float:
  """Least-squares slope of log(value) against log(size)."""
  return float(np.polyfit(np.log(sizes), np.log(values), 1)[0])


# ---------------------------------------------------------------- workers ---
# Each runs in its own interpreter (`--worker JSON`) and returns a dict.


def step_worker(batch: int, views: int, steps: int, cache_dir: str) -> dict:
  """train_step.run_step for the default model with `views` views.

  Compiled programs go to jax's persistent cache in `cache_dir` (read before
  jax is imported): later rounds of a point load them, which halves a row's
  ~20 s overhead.
  """
  os.environ['JAX_COMPILATION_CACHE_DIR'] = cache_dir
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  return train_step.run_step('default', DEVICES, batch, steps,
                             num_views=views)


def loss_worker(name: str, sizes: list[int], rows: int, repeats: int,
                rounds: int) -> dict:
  """fwd+bwd seconds of loss `name` at each size, 1 device.

  `sizes` are N*V for in-batch losses (ntxent) and the queue length Q, with
  `rows` queries, for key-encoder losses (infonce). Each round times every
  size (median of `repeats` after a warm-up); a size keeps the median of its
  rounds, so that a burst of load does not land on a few sizes only.
  """
  train_step._worker_setup(1)  # pylint: disable=protected-access
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import losses as loss_bench  # pylint: disable=g-import-not-at-top
  rng = jax.random.key(0)
  jobs = []
  for size in sizes:
    nv, queue = (size, 0) if name == 'ntxent' else (rows, size)
    # The builder's first case is the plain loss (cacr adds a queue case).
    _, fn, x, consts, _ = loss_bench.BUILDERS[name](rng, nv, DIM, queue)[0]
    jobs.append((jax.jit(jax.value_and_grad(fn, has_aux=True)), (x, *consts)))
  time_fn = loss_bench._time  # pylint: disable=protected-access
  seconds = [[] for _ in sizes]
  for _ in range(rounds):
    for i, (step, args) in enumerate(jobs):
      seconds[i].append(time_fn([(step, args)], repeats)[0])
  return {'seconds': [statistics.median(s) for s in seconds]}


def _reset_peak_rss():
  """Sets the kernel's peak-RSS mark (VmHWM) to the current RSS.

  make_data builds the bank from 3-4 bank-sized temporaries, so the process
  peak before the evaluation is higher than during it; ru_maxrss (what
  benchmarks/knn.py reads) would report that earlier peak for large banks.
  """
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')


def _peak_rss_mb() -> float:
  """VmHWM of this process in MiB (since the last `_reset_peak_rss`)."""
  with open('/proc/self/status') as f:
    fields = dict(line.split(':', 1) for line in f)
  return int(fields['VmHWM'].split()[0]) / 1024


def knn_worker(bank: int, queries: int, repeats: int) -> dict:
  """knn_evaluate on a [bank, DIM] bank: seconds and peak extra MiB."""
  train_step._worker_setup(1)  # pylint: disable=protected-access
  from contrastive_jax.evaluators import knn  # pylint: disable=g-import-not-at-top
  data = knn_bench.make_data(bank, DIM, queries)
  rss0 = knn_bench.current_rss_mb()
  _reset_peak_rss()
  run = lambda: knn.knn_evaluate(
      *data, num_classes=knn_bench.NUM_CLASSES, ks=knn_bench.KS,
      temperature=knn_bench.TEMPERATURE)
  t0 = time.perf_counter()
  run()                                             # compiles
  first_s = time.perf_counter() - t0
  times = train_step._timed(run, steps=repeats)  # pylint: disable=protected-access
  return {'seconds': statistics.median(times), 'first_s': first_s,
          'extra_mb': _peak_rss_mb() - rss0}


WORKERS = {'step': step_worker, 'loss': loss_worker, 'knn': knn_worker}


def _in_subprocess(kind: str, **job) -> dict:
  """Runs WORKERS[kind](**job) in a fresh interpreter; its last stdout line."""
  command = [sys.executable, os.path.abspath(__file__), '--worker',
             json.dumps(dict(job, kind=kind))]
  try:
    out = subprocess.check_output(command, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT)
  except subprocess.CalledProcessError as e:
    raise RuntimeError(f'{kind} worker {job} failed:\n{e.stderr[-3000:]}')
  return json.loads(out.strip().splitlines()[-1])


# --------------------------------------------------------------- printing ---


def _print_header(group: Group, extra: str = ''):
  print(f'\n{group.title}  (expected exponent {group.expected:g})')
  print(f'  {group.size_name:>12} {group.unit:>10} {"norm":>6}  {extra}')


def _print_row(group: Group, note: str = '', i: int = -1):
  """Row i of the group; norm = cost / size^expected vs the first row."""
  size, value = group.sizes[i], group.values[i]
  norm = (value / group.values[0]) / (size / group.sizes[0])**group.expected
  print(f'  {size:>12,} {group.scaled(value):>10.4g} {norm:>6.2f}  {note}',
        flush=True)


def _print_fit(group: Group):
  p = exponent(group.sizes, group.values)
  print(f'  -> measured exponent {p:.2f}, expected {group.expected:g}')


# --------------------------------------------------------------- sections ---


def _step_sweeps(cfg: dict) -> tuple[list, list]:
  """(batch, views) points: batches at 2 views, views at cfg's batch."""
  return ([(b, 2) for b in cfg['batches']],
          [(cfg['view_batch'], v) for v in cfg['views']])


def _step_rounds(cfg: dict) -> dict:
  """(batch, views) -> the step worker's results, one per round.

  The load of the shared machine comes in bursts of tens of seconds, as long
  as a row: one sweep would let a burst inflate a few sizes and tilt the
  exponent. Rounds visit every point, in alternating order, and each point
  keeps the median of its rounds.
  """
  by_batch, by_views = _step_sweeps(cfg)
  points = list(dict.fromkeys(by_batch + by_views))    # shared point once
  results = {p: [] for p in points}
  with tempfile.TemporaryDirectory(prefix='scaling_jax_cache_') as cache:
    for r in range(cfg['rounds']):
      for batch, views in points if r % 2 == 0 else points[::-1]:
        results[batch, views].append(_in_subprocess(
            'step', batch=batch, views=views, steps=cfg['steps'],
            cache_dir=cache))
      print(f'  step round {r + 1}/{cfg["rounds"]} done, load average '
            f'{os.getloadavg()[0]:.1f}', flush=True)
  return results


def _step_flops(batch: int, views: int) -> tuple[float, float]:
  """(conv, similarity) FLOPs of one default step, fwd + bwd, counted by hand.

  XLA's cost analysis is no help here: on 8 devices it gives one device's
  share, and two compiles of the same step reported 0.82 and 1.02 GFLOP per
  device. Backward = 2x forward (input and weight gradients).
  """
  config = train_step._config('default', batch)  # pylint: disable=protected-access
  widths = config.model.encoder_kwargs.widths
  hw, cin, conv = 28, 1, 0
  for i, width in enumerate(widths):
    conv += 2 * hw * hw * 9 * cin * width             # 3x3 'SAME' conv
    last = i == len(widths) - 1
    cin, hw = width, hw if last else hw // 2          # 2x2 pools: 28/14/7/3
  sim = 2 * (batch * views)**2 * config.model.head_out_dim   # [BV, BV]
  return 3 * conv * batch * views, 3 * sim


def step_section(cfg: dict) -> list[Group]:
  """Train step vs batch (2 views) and vs views (fixed batch), 8 devices."""
  by_batch = Group(f'train step vs batch (2 views, {DEVICES} devices)',
                   'batch', 1.0)
  by_views = Group(f'train step vs views (batch {cfg["view_batch"]}, '
                   f'{DEVICES} devices)', 'views', 1.0)
  results = _step_rounds(cfg)
  for group, points in zip((by_batch, by_views), _step_sweeps(cfg)):
    _print_header(group, f'{"views/s":>7} {"conv GF":>7} {"sim %":>5}  '
                  'ms of each round')
    for batch, views in points:
      rounds = [r['step_s'] for r in results[batch, views]]
      group.sizes.append(batch if group is by_batch else views)
      group.values.append(statistics.median(rounds))
      conv, sim = _step_flops(batch, views)
      _print_row(group, f'{batch * views / group.values[-1]:>7.0f} '
                 f'{conv / 1e9:>7.1f} {100 * sim / (conv + sim):>5.2f}  '
                 + '/'.join(f'{1e3 * t:.0f}' for t in rounds))
    _print_fit(group)
  return [by_batch, by_views]


def loss_section(cfg: dict) -> list[Group]:
  """NT-Xent fwd+bwd vs N*V; MoCo's InfoNCE fwd+bwd vs queue length."""
  ntxent = Group('NT-Xent fwd+bwd vs N*V (1 device)', 'N*V', 2.0)
  moco = Group(f'MoCo InfoNCE fwd+bwd vs queue ({cfg["queue_rows"]} queries, '
               '1 device)', 'Q', 1.0)
  for group, name, sizes, shape in (
      (ntxent, 'ntxent', cfg['nv'], lambda s: f'[{s}, {s}]'),
      (moco, 'infonce', cfg['queues'],
       lambda s: f'[{cfg["queue_rows"]}, {s}]')):
    _print_header(group, 'logits')
    seconds = _in_subprocess('loss', name=name, sizes=list(sizes),
                             rows=cfg['queue_rows'], repeats=cfg['repeats'],
                             rounds=cfg['rounds'])['seconds']
    for size, t in zip(sizes, seconds):
      group.sizes.append(size)
      group.values.append(t)
      _print_row(group, shape(size))
    _print_fit(group)
  return [ntxent, moco]


def knn_section(cfg: dict) -> list[Group]:
  """knn_evaluate time and peak extra memory vs bank rows."""
  q = cfg['queries']
  timed = Group(f'kNN time vs bank rows ({q} queries, 1 device)',
                'bank rows', 1.0, unit='s')
  memory = Group('kNN peak extra memory vs bank rows', 'bank rows', 1.0,
                 unit='MiB')
  _print_header(timed, f'{"first s":>8}  (the first run compiles)')
  for bank in cfg['banks']:
    r = _in_subprocess('knn', bank=bank, queries=q,
                       repeats=cfg['knn_repeats'])
    timed.sizes.append(bank)
    timed.values.append(r['seconds'])
    memory.sizes.append(bank)
    memory.values.append(r['extra_mb'])
    _print_row(timed, f'{r["first_s"]:>8.1f}')
  _print_fit(timed)
  bank_mb = np.array(memory.sizes) * DIM * 4 / 2**20
  _print_header(memory, f'{"bank MiB":>8} {"extra/bank":>10}')
  for i, mb in enumerate(bank_mb):
    _print_row(memory, f'{mb:>8.0f} {memory.values[i] / mb:>10.2f}', i)
  _print_fit(memory)
  # A fixed part (runtime, compilation, the similarity block) plus a part
  # growing with the bank: the slope is what each added bank byte costs.
  slope, fixed = np.polyfit(bank_mb, memory.values, 1)
  print(f'  -> linear fit: extra = {fixed:.0f} MiB + {slope:.2f} x bank bytes')
  return [timed, memory]


# ------------------------------------------------------------ summary/plot ---


def print_summary(groups: list[Group]):
  header = f'{"group":<58} {"sizes":>17} {"measured":>8} {"expected":>8}'
  print('\n' + header + '\n' + '-' * len(header))
  for g in groups:
    sizes = f'{g.sizes[0]:,}..{g.sizes[-1]:,}'
    print(f'{g.title:<58} {sizes:>17} '
          f'{exponent(g.sizes, g.values):>8.2f} {g.expected:>8g}')


def _short(value: float, _=None) -> str:
  """A tick label: 64, 512, 4.1k, 66k, 1.3M, 0.5."""
  for scale, suffix in ((1e6, 'M'), (1e3, 'k')):
    if value >= scale:
      v = value / scale
      return f'{v:.2g}{suffix}' if v < 10 else f'{v:.0f}{suffix}'
  return f'{value:g}' if value >= 1 else f'{value:.2g}'


def plot(groups: list[Group], path: str):
  """One log-log panel per group: points, their fit and the expected slope."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  cols = min(3, len(groups))
  rows = -(-len(groups) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows),
                           squeeze=False)
  for ax, g in zip(axes.flat, groups):
    x = np.array(g.sizes, float)
    y = np.array([g.scaled(v) for v in g.values])
    p, c = np.polyfit(np.log(x), np.log(y), 1)
    # The expected slope through the points' geometric mean.
    c_exp = np.mean(np.log(y)) - g.expected * np.mean(np.log(x))
    ax.loglog(x, y, 'o', label='measured')
    ax.loglog(x, np.exp(c) * x**p, '-', label=f'fit: exponent {p:.2f}')
    ax.loglog(x, np.exp(c_exp) * x**g.expected, '--',
              label=f'expected: exponent {g.expected:g}')
    ax.set_title(g.title, fontsize=9)
    ax.set_xlabel(g.size_name)
    ax.set_ylabel(g.unit)
    # Ticks at the measured sizes only, in short plain numbers (64, 4k, 1.3M):
    # log axes' default minor labels (3x10^2, 4x10^2) collide.
    ax.xaxis.set_major_locator(ticker.FixedLocator(x))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(_short))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1., 2., 3., 5.)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(_short))
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.tick_params(axis='x', labelsize=8)
    ax.legend(fontsize=8)
  for ax in list(axes.flat)[len(groups):]:
    ax.axis('off')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print(f'\nwrote {os.path.relpath(path, ROOT)}')


def _load() -> str:
  return ' '.join(f'{x:.2f}' for x in os.getloadavg()) + ' (1/5/15 min)'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--only', default=','.join(SECTIONS),
                      help=f'comma-separated sections of {SECTIONS}')
  parser.add_argument('--quick', action='store_true',
                      help='small sizes, about 2 minutes')
  parser.add_argument('--plot', default=PLOT, help="'' for no plot")
  parser.add_argument('--worker', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    job = json.loads(args.worker)
    print(json.dumps(WORKERS[job.pop('kind')](**job)))
    return

  only = args.only.split(',')
  unknown = set(only) - set(SECTIONS)
  if unknown:
    parser.error(f'unknown sections {sorted(unknown)}; choose from {SECTIONS}')
  cfg = QUICK if args.quick else FULL
  sections = {'step': step_section, 'loss': loss_section, 'knn': knn_section}
  start = time.perf_counter()
  print(f'load average {_load()} on {os.cpu_count()} CPUs (shared machine)',
        flush=True)
  groups = []
  for name in SECTIONS:
    if name in only:
      groups += sections[name](cfg)
      print(f'load average {_load()} after {name}', flush=True)
  print_summary(groups)
  print(f'total {time.perf_counter() - start:.0f} s')
  if args.plot:
    plot(groups, args.plot)


if __name__ == '__main__':
  main()
