"""Two processes x 4 CPU devices must train exactly like one process x 8.

  .venv/bin/python scripts/multiprocess_check.py      # exit code 0 = match

Runs a few steps of MoCo v2 (queue sharded over the 8 devices, so across both
processes) and InsDis (memory bank sharded likewise) through the real data
path (`pipeline.TrainBatches`: each process loads only its part of every
global batch), the augmentation and the jitted train step:

  1. a reference run in one process with 8 virtual devices;
  2. two processes joined by `jax.distributed.initialize` on localhost, with 4
     virtual devices each;

and compares every leaf of the final states and the metrics (rtol 1e-3, atol
1e-4 * max(1, max|x|)): the same mesh shape and program, so only the order of
cross-device sums may differ (in-process all-reduce vs Gloo across processes),
and float32 rounding differences of ~1e-7 grow to ~1e-4 of a leaf's scale in
optimizer traces after a few steps (seen: 1.5e-4 on a BN-scale momentum trace
of InsDis). A real sharding bug (a batch or queue row in the wrong place, a
missing all-reduce) shows up as an O(1) relative difference. Too slow for the pytest budget (three JAX
processes, each compiling two steps), so `.ci/run` calls it separately.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
KINDS = ('moco_v2', 'insdis')


def _config(kind):
  from configs import test as test_config  # pylint: disable=g-import-not-at-top
  c = test_config.get_config()
  c.model.encoder_kwargs.widths = (4, 8)
  c.model.head_hidden_dim = 16
  c.model.head_out_dim = 8
  c.batch_size = 16
  c.optimizer.name = 'sgd'
  c.optimizer.base_learning_rate = 2.
  if kind == 'moco_v2':
    c.method, c.loss = 'moco', 'infonce'
    c.loss_kwargs = {'temperature': 0.2, 'in_batch_negatives': False}
    c.moco.momentum, c.moco.queue_size = 0.9, 32
  else:
    c.method, c.loss = 'memory_bank', 'insdis'
    c.loss_kwargs = {'temperature': 0.1}
    c.augment.num_views = 1
    c.memory_bank.num_negatives = 24
  return c


def _train(kind, out_path):
  """Trains STEPS steps on this process's mesh; process 0 writes an npz."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, REPO)
  from contrastive_jax import models, train  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment, pipeline  # pylint: disable=g-import-not-at-top

  config = _config(kind)
  train.validate_config(config)
  rng = np.random.default_rng(0)
  data = pipeline.ArrayDataset(
      rng.integers(0, 256, (48, 12, 12, 1)).astype(np.uint8),
      rng.integers(0, 4, 48).astype(np.int32))
  mesh = train.create_mesh()
  sharding = NamedSharding(mesh, P('data'))
  batches = pipeline.TrainBatches(data, global_batch_size=config.batch_size,
                                  seed=0, sharding=sharding)
  model = models.create_model(config)
  tx = train.create_optimizer(config, 10)
  method = train.Method.from_config(
      config, total_steps=10, steps_per_epoch=batches.steps_per_epoch,
      num_examples=data.num_examples)
  init_fn, step_fn, _ = train.create_step_fns(config, model, tx, mesh, method,
                                              data.images.shape[1:])
  views_cfg = augment.get_views(config.augment.preset,
                                config.augment.num_views)
  aug_rng, step_rng = jax.random.split(jax.random.key(1))
  augment_fn = jax.jit(
      lambda step, images: augment.augment_batch(
          jax.random.fold_in(aug_rng, step), images, views_cfg),
      out_shardings=sharding)
  state = init_fn(jax.random.key(0))
  metrics = []
  for step in range(STEPS):
    b = batches(step)
    state, m = step_fn(state, {'views': augment_fn(step, b['image']),
                               'label': b['label'], 'index': b['index']},
                       step_rng)
    metrics.append(m)
  leaves, _ = jax.tree_util.tree_flatten_with_path((state, metrics))
  out = {}
  for path, x in leaves:
    out[jax.tree_util.keystr(path)] = np.asarray(
        multihost_utils.process_allgather(x, tiled=True))
  if jax.process_index() == 0:
    np.savez(out_path, **out)


def _worker(argv):
  kind, out_path, port, pid, nproc = argv
  import jax  # pylint: disable=g-import-not-at-top
  if int(nproc) > 1:
    jax.distributed.initialize(coordinator_address=f'localhost:{port}',
                               num_processes=int(nproc),
                               process_id=int(pid))
  _train(kind, out_path)


def _free_port():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _launch(kind, out_path, nproc, devices_per_proc):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', XLA_FLAGS=(
      f'--xla_force_host_platform_device_count={devices_per_proc}'))
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, __file__, '--worker', kind, out_path, str(port),
       str(i), str(nproc)], env=env, cwd=REPO) for i in range(nproc)]
  codes = [p.wait(timeout=600) for p in procs]
  if any(codes):
    raise SystemExit(f'{kind}: worker exit codes {codes}')


def main():
  import numpy as np  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  ok = True
  with tempfile.TemporaryDirectory() as tmp:
    for kind in KINDS:
      ref, multi = f'{tmp}/{kind}_ref.npz', f'{tmp}/{kind}_multi.npz'
      _launch(kind, ref, nproc=1, devices_per_proc=8)
      _launch(kind, multi, nproc=2, devices_per_proc=4)
      a, b = np.load(ref), np.load(multi)
      assert sorted(a.files) == sorted(b.files)
      worst = 0.
      for k in a.files:
        x, y = a[k], b[k]
        if x.dtype.kind in 'iu' or x.dtype == bool:
          if not np.array_equal(x, y):
            print(f'{kind}: {k} differs (integer)')
            ok = False
          continue
        tol = 1e-4 * max(1., float(np.max(np.abs(x))) if x.size else 1.)
        err = np.abs(x.astype(np.float64) - y) - 1e-3 * np.abs(x)
        excess = float(np.max(err)) if x.size else 0.
        worst = max(worst, excess / tol)
        if excess > tol:
          print(f'{kind}: {k} differs by {excess + tol:.3g} (tol {tol:.3g})')
          ok = False
      print(f'{kind}: {len(a.files)} arrays compared after {STEPS} steps; '
            f'worst error / tolerance = {worst:.3f}')
  print(f'multiprocess check {"PASSED" if ok else "FAILED"} in '
        f'{time.time() - t0:.0f} s')
  return 0 if ok else 1


if __name__ == '__main__':
  if len(sys.argv) > 1 and sys.argv[1] == '--worker':
    _worker(sys.argv[2:])
  else:
    sys.exit(main())
