"""main.py as 2 processes x 4 devices must train like 1 process x 8, and resume.

  .venv/bin/python scripts/multiprocess_check.py      # exit code 0 = pass

Runs the real entry point, `main.py`, as separate processes joined through
`JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID` on
localhost, on streamed data (`config.dataset.in_memory=False`: every process
reads and decodes only its part of each batch), through pretraining, the
online kNN, the final kNN, the linear probe and the papers' linear evaluation
(SGD on augmented images):

1. A generated JPEG image folder (4 classes, 20x20 RGB decoded to 16x16,
   and 3 undecodable files that every run must replace, leave out of the
   scores and count alike), MoCo v2 with its queue sharded over the 8
   devices of both processes:
   a. 1 process x 8 devices (the reference);
   b. 2 processes x 4 devices, uninterrupted: must match (a);
   c. 2 processes x 4 devices, sent SIGTERM mid-run (both must save the same
      step, off the regular checkpoint schedule, and exit 143), resumed,
      killed with SIGKILL mid-run, resumed to the end: must equal (b) exactly.
2. Fashion-MNIST (TFDS ArrayRecord, slices of both splits), InsDis with its
   memory bank sharded likewise: 1 x 8 against 2 x 4.

Tolerance for 1 vs 2 processes. Same mesh shape, same program, same data in
the same global order; the only difference is who sums across devices (XLA's
in-process all-reduce vs Gloo across processes), which may reorder float32
sums. Each reordering changes a sum by a few ulps (~1e-7 relative) and
training amplifies that over the steps (measured here: see the printout). The
bound used, 1e-3 of each array's scale, is ~100x above what rounding gives
after these few steps and ~1000x below what a real sharding bug gives (a row
in the wrong place, a missing all-reduce: O(1) relative differences). The
runs are short (12 and 4 steps) because the reordering noise grows with
every step (measured: InsDis at lr 0.125 reached 1e-2 of the parameters' scale
and 1e-1 of the momentum traces' after 16 steps, with losses still within
1.4e-4 and accuracies within 0.4%): a longer run would need a tolerance too
loose to catch a bug.
Accuracies may differ by near-tie flips: at most 1% of the test set (2 of
256 images; the 30-iteration L-BFGS probe is not converged, so its path
amplifies 1e-6 feature differences: 1 flip was seen).
(1c) vs (1b) runs the same processes on the same data: bit-identical.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.synthetic_data import add_bad_files  # pylint: disable=g-import-not-at-top,wrong-import-position
from tests.synthetic_data import make_jpeg_folder  # pylint: disable=g-import-not-at-top,wrong-import-position
RTOL = 1e-3          # Of each array's max |x|; see the module docstring.
ACC_TOL = 0.01       # Accuracy difference: 2 of the 256 JPEG test images.
ACC_KEYS = ('trained/knn_weighted_top1@5', 'trained/linear_top1',
            'online/knn_weighted_top1@20', 'trained/linear_eval_top1')

COMMON = [
    '--config.model.encoder_kwargs.widths=(8,16)',
    '--config.model.head_hidden_dim=32', '--config.model.head_out_dim=16',
    '--config.batch_size=64', '--config.dataset.in_memory=False',
    '--config.optimizer.name=sgd', '--config.optimizer.base_learning_rate=0.5',
    '--config.log_every_steps=2', '--config.checkpoint_every_steps=4',
    '--config.evals.online_knn.every_steps=6',
    '--config.evals.online_knn.ks=(20,)',
    '--config.evals.online_knn.bank_size=512',
    '--config.evals.online_knn.num_queries=256',
    '--config.eval.baselines=False', '--config.eval.batch_size=128',
    '--config.evals.linear.max_iter=30',
    # The papers' linear evaluation, streamed: 1 epoch of SGD on augmented
    # images through the frozen encoder, each process reading its part.
    '--config.evals.linear_eval.every_steps=0',
    '--config.evals.linear_eval.preset=cifar',
    '--config.evals.linear_eval.epochs=1',
    '--config.evals.linear_eval.batch_size=64',
]
JPEG = COMMON + [
    '--config.dataset.name=image_folder', '--config.dataset.image_size=16',
    '--config.dataset.train_split=train', '--config.dataset.eval_split=test',
    '--config.num_epochs=1', '--config.method=moco', '--config.loss=infonce',
    '--config.moco.queue_size=256', '--config.moco.momentum=0.9',
]
FMNIST = COMMON + [
    '--config.dataset.train_split=train[:256]',
    '--config.dataset.eval_split=test[:512]', '--config.num_epochs=1',
    '--config.method=memory_bank', '--config.loss=insdis',
    '--config.augment.num_views=1', '--config.memory_bank.num_negatives=256',
]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def launch(workdir: str, flags: list[str], *, nproc: int, devices: int,
           interrupt: tuple[int, signal.Signals] | None = None) -> list[int]:
  """Runs main.py as `nproc` processes; returns their exit codes.

  interrupt=(step, sig): once the log of process 0 shows a checkpoint past
  `step` being written, send `sig` (SIGTERM to process 1 only, as a
  preemption notice reaches one host; SIGKILL to every process).
  """
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', XLA_FLAGS=(
      f'--xla_force_host_platform_device_count={devices}'))
  if nproc > 1:
    env.update(JAX_COORDINATOR_ADDRESS=f'localhost:{_free_port()}',
               JAX_NUM_PROCESSES=str(nproc))
  procs, logs = [], []
  for i in range(nproc):
    log = f'{workdir}.p{i}.log'
    logs.append(log)
    procs.append(subprocess.Popen(
        [sys.executable, 'main.py', '--config=configs/test.py',
         f'--workdir={workdir}', *flags],
        env=dict(env, JAX_PROCESS_ID=str(i)), cwd=REPO,
        stdout=open(log, 'ab'), stderr=subprocess.STDOUT))
  if interrupt:
    step, sig = interrupt
    deadline = time.time() + 600
    while time.time() < deadline and all(p.poll() is None for p in procs):
      if _latest_step(workdir) >= step:
        break
      time.sleep(0.2)
    targets = procs[1:] if sig == signal.SIGTERM else procs
    for p in targets:
      p.send_signal(sig)
  codes = [p.wait(timeout=900) for p in procs]
  for log, code in zip(logs, codes):
    if code not in (0, 143, -signal.SIGKILL):
      print(open(log, errors='replace').read()[-3000:])
  return codes


def _latest_step(workdir: str) -> int:
  d = os.path.join(workdir, 'checkpoints')
  steps = [int(x) for x in os.listdir(d) if x.isdigit()] if os.path.isdir(
      d) else []
  return max(steps, default=-1)


def load_state(workdir: str) -> dict[str, np.ndarray]:
  """The newest checkpoint's arrays, as numpy, keyed by their tree path."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, 'checkpoints', str(_latest_step(workdir)),
                      'default')
  ckptr = ocp.PyTreeCheckpointer()
  meta = ckptr.metadata(path).item_metadata.tree
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
  tree = ckptr.restore(path, restore_args=args)
  flat, _ = jax.tree.flatten_with_path(tree)
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def compare(name: str, a_dir: str, b_dir: str, *, exact: bool) -> bool:
  """Checkpoint arrays, logged losses and accuracies of two runs."""
  a, b = load_state(a_dir), load_state(b_dir)
  ok = sorted(a) == sorted(b)
  worst, worst_key = 0., ''
  for k in a:
    x, y = a[k], b[k]
    if exact or x.dtype.kind in 'iub':
      if not np.array_equal(x, y):
        print(f'  {name}: {k} differs')
        ok = False
      continue
    scale = max(float(np.max(np.abs(x))), 1e-30) if x.size else 1.
    rel = float(np.max(np.abs(x.astype(np.float64) - y))) / scale if (
        x.size) else 0.
    if rel > worst:
      worst, worst_key = rel, k
    if rel > RTOL:
      print(f'  {name}: {k} differs by {rel:.3g} of its scale '
            f'(tolerance {RTOL})')
      ok = False
  ra, rb = (json.load(open(os.path.join(d, 'results.json')))
            for d in (a_dir, b_dir))
  for k in ('data/skipped_records', 'data/skipped_files'):
    if ra[k] != rb[k]:
      print(f'  {name}: {k} {ra[k]} vs {rb[k]}')
      ok = False
  for k in ACC_KEYS:
    diff = abs(ra[k] - rb[k])
    if (exact and diff) or diff > ACC_TOL:
      print(f'  {name}: {k} {ra[k]:.4f} vs {rb[k]:.4f}')
      ok = False
  ha, hb = (json.load(open(os.path.join(d, 'history.json')))
            for d in (a_dir, b_dir))
  la = np.array([h['loss'] for h in ha if 'loss' in h])
  lb = np.array([h['loss'] for h in hb if 'loss' in h])
  loss_rel = float(np.max(np.abs(la - lb) / np.abs(la))) if len(
      la) == len(lb) else float('inf')
  if loss_rel > (0 if exact else RTOL):
    print(f'  {name}: logged losses differ by {loss_rel:.3g} (relative)')
    ok = False
  print(f'  {name}: {len(a)} arrays, {len(la)} logged losses, '
        f'{len(ACC_KEYS)} accuracies; '
        + ('bit-identical' if exact and ok else
           f'worst array difference {worst:.2e} of scale ({worst_key}), '
           f'losses {loss_rel:.2e}')
        + f' -> {"ok" if ok else "FAILED"}')
  print(f'    accuracies: ' + ', '.join(
      f'{k} {ra[k]:.4f}/{rb[k]:.4f}' for k in ACC_KEYS))
  return ok


def main() -> int:
  t0 = time.time()
  ok = True
  with tempfile.TemporaryDirectory() as tmp:
    # One persistent compilation cache for the check's runs: the four 2 x 4
    # JPEG launches compile the same programs. A cached executable is the
    # compiled program itself, so results (bit-identical resume included) do
    # not depend on it; an entry two processes write at once is, at worst,
    # unreadable, and JAX then warns and compiles.
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, 'compile_cache'),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
    folder = os.path.join(tmp, 'jpeg')
    make_jpeg_folder(folder)
    bad = add_bad_files(os.path.join(folder, 'train', 'class_1'))
    jpeg = JPEG + [f'--config.dataset.data_dir={folder}']
    w = {k: os.path.join(tmp, k) for k in
         ('jpeg_1x8', 'jpeg_2x4', 'jpeg_2x4_interrupted', 'fm_1x8', 'fm_2x4')}

    def run(key, flags, nproc, devices, want=0, interrupt=None):
      t = time.time()
      codes = launch(w[key], flags, nproc=nproc, devices=devices,
                     interrupt=interrupt)
      print(f'{key}: exit codes {codes} in {time.time() - t:.0f} s')
      good = all(c == want for c in codes)
      if not good:
        print(f'  {key}: expected exit code {want} from every process')
      return good

    ok &= run('jpeg_1x8', jpeg, 1, 8)
    ok &= run('jpeg_2x4', jpeg, 2, 4)
    ok = ok and compare('JPEG MoCo v2, 1x8 vs 2x4', w['jpeg_1x8'],
                        w['jpeg_2x4'], exact=False)
    with open(os.path.join(w['jpeg_1x8'], 'results.json')) as f:
      skipped = json.load(f)['data/skipped_files']
    if [s.split(' (')[0] for s in skipped] != sorted(bad):
      print(f'  the bad files counted are {skipped}, not {sorted(bad)}')
      ok = False

    # Preemption: SIGTERM to one process once step 4 is saved; every process
    # must save the step they agree on and exit 143.
    key = 'jpeg_2x4_interrupted'
    ok &= run(key, jpeg, 2, 4, want=143, interrupt=(4, signal.SIGTERM))
    saved = _latest_step(w[key])
    print(f'  SIGTERM: checkpoint saved at step {saved}')
    if saved < 5:
      print('  SIGTERM: no checkpoint past the step-4 one was saved')
      ok = False
    # SIGKILL mid-run (after the step-8 checkpoint), then resume to the end.
    launch(w[key], jpeg, nproc=2, devices=4,
           interrupt=(max(saved + 1, 8), signal.SIGKILL))
    print(f'  SIGKILL: latest complete checkpoint {_latest_step(w[key])}')
    ok &= run(key, jpeg, 2, 4)
    ok = ok and compare('JPEG MoCo v2, interrupted vs uninterrupted 2x4',
                        w['jpeg_2x4'], w[key], exact=True)

    ok &= run('fm_1x8', FMNIST, 1, 8)
    ok &= run('fm_2x4', FMNIST, 2, 4)
    ok = ok and compare('Fashion-MNIST InsDis, 1x8 vs 2x4', w['fm_1x8'],
                        w['fm_2x4'], exact=False)
  print(f'multiprocess check {"PASSED" if ok else "FAILED"} in '
        f'{time.time() - t0:.0f} s')
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main())
