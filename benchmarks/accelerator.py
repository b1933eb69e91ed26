r"""The accelerator check: train steps against PyTorch, the entry point, the
numerics and the input pipeline, on one GPU, in one run.

What it measures (each part is independent: a part that fails records its
error in the report and the next part runs):

  peak     bf16 matrix products: an 8192^3 matmul's TFLOP/s, the measured
           ceiling beside the datasheet's dense bf16 peak.
  r50      the ResNet-50 SimCLR step at 224 px, 2 views, bf16 compute,
           built by `step_lib.build` from configs/papers/simclr.py:imagenet
           (SGD instead of LARS, the same in both, see below), against
           benchmarks/torch_step_peer.py (torchvision's resnet50,
           channels-last, bf16 autocast, torch.compile, the same head,
           NT-Xent and SGD), alternated round by round in one run:
           images/s (views), step time, MFU (the step's FLOPs from XLA's
           cost analysis of it compiled for the CPU, which counts the
           convolutions XLA:GPU hands to cuDNN, over the step time and the
           bf16 peak), peak memory, and where each step's GPU time goes (a
           kernel profile of a few steps of each).
  r18      the same for ResNet-18 with the CIFAR stem at 32 px, batch 512
           (configs/papers/simclr.py:cifar10).
  e2e      `main.py --config=configs/test.py` end to end on the device
           (pretraining, online kNN, evaluation), its time and accuracies.
  tests    the loss and train-step tests that compare with float64
           references, under JAX's default matmul precision (TF32 on NVIDIA
           GPUs) and under 'highest': which pass, which fail.
  input    the host's steady-state input rate (benchmarks/input_rate.py):
           ImageNet-like JPEGs decoded and cropped on 1, a quarter of and
           all of the host's cores, ours in worker processes and on
           threads, with and without a busy thread, against the PyTorch
           DataLoader (benchmarks/torch_dataloader_peer.py); per-image
           decoding costs.
  stream   main.py with configs/papers/simclr.py:imagenet streamed from
           generated ImageNet-like JPEGs for 200 steps of batch 256:
           images/s and input wait against the same run fed from memory and
           against PyTorch end to end (a DataLoader making the recipe in
           its workers, feeding the compiled step).

Both frameworks' steps run in their own long-lived worker processes, each
compiled once, each given part of the GPU's memory, and timed in turn
(ours, peer, ours, peer, ...), so slow drifts of the machine hit both.

Before a run on a GPU host without network (prints what it fetched):

  PYTHONPATH=. .venv/bin/python benchmarks/accelerator.py --prepare

writes `.accel/` (git-ignored): Fashion-MNIST as npz (from the TFDS build,
for `config.dataset.name=npz`, so the device needs no TensorFlow) and the
wheels of the packages a CUDA JAX image may lack (flax, optax, orbax,
chex, ml-collections, grain, array-record and what they need), pinned as in
requirements.txt. On the GPU host (Python 3.12 with jax[cuda], torch and
torchvision), from a copy of the repository with `.accel/`,
`benchmarks/run_on_gpu.sh` installs the wheels, runs this check and
collects its report and logs:

  bash benchmarks/run_on_gpu.sh check OUT

`--dry` runs every part at tiny sizes on the CPU (CI runs it, so the check
keeps working between GPU runs; the peer rows need torch and torchvision in
`--torch_python`, and say so when they are absent). The report is
`--out/accelerator.json` plus a table printed last. Results:
docs/performance.md.
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path
               if os.path.abspath(p or '.') != os.path.join(ROOT, 'benchmarks')]
sys.path.insert(0, ROOT)
# This process only coordinates (and times the matmul and the input
# pipeline): it must not take the memory the workers and main.py need.
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
PEER = os.path.join(ROOT, 'benchmarks', 'torch_step_peer.py')
ACCEL = os.path.join(ROOT, '.accel')
DATA = os.path.join(ACCEL, 'fashion_mnist')
WHEELS = os.path.join(ACCEL, 'wheels')
PARTS = ('peak', 'r50', 'r18', 'e2e', 'tests', 'input', 'stream')

# Dense bf16 peaks from NVIDIA's datasheets (TFLOP/s, without sparsity), by
# the device kind JAX reports.
BF16_PEAK_TFLOPS = {'H100 80GB HBM3': 989.4, 'H100 SXM': 989.4,
                    'H100 PCIe': 756.5, 'H100 NVL': 835.5, 'H200': 989.4,
                    'A100': 312.0, 'L4': 121.0, 'L40S': 362.1}

# Packages the check needs beyond a CUDA JAX + PyTorch image, as pinned in
# requirements.txt (pure Python, or built for the device's Python 3.12).
WHEEL_PINS = ('flax', 'optax', 'orbax-checkpoint', 'chex', 'ml-collections',
              'grain', 'array-record', 'portpicker', 'importlib_resources',
              'simplejpeg')

# The step tests run in the `tests` part: losses and train steps against
# float64 references (tests/numpy_reference*.py).
TEST_FILES = ('tests/test_losses_baselines.py', 'tests/test_losses_cacr.py',
              'tests/test_losses_instance.py', 'tests/test_losses_jcl.py',
              'tests/test_losses_macl.py', 'tests/test_losses_supervised.py',
              'tests/test_losses_registry.py', 'tests/test_train_step.py',
              'tests/test_state.py', 'tests/test_byol.py')


def log(msg: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {msg}', file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# The step configs: ours and the peer's flags, one source for both.


def step_spec(model: str, dry: bool) -> dict:
  """The step compared in part `model`: sizes, head, loss and optimizer.

  The optimizer is SGD with momentum in both frameworks (PyTorch has no
  LARS; its cost is a few elementwise passes over the parameters either
  way). `dry` keeps the model and shrinks the images and the batch.
  """
  if model == 'r50':
    spec = dict(model='resnet50', scale='imagenet', batch=256,
                fallback=(128,), image_size=224, hidden=2048, out=128,
                temperature=0.1, lr=0.3, weight_decay=1e-6, steps=12,
                rounds=3)
  elif model == 'r18':
    spec = dict(model='resnet18', scale='cifar10', batch=512, fallback=(),
                image_size=32, hidden=512, out=128, temperature=0.5,
                lr=0.12, weight_decay=5e-4, steps=40, rounds=3)
  else:
    raise ValueError(model)
  if dry:
    spec.update(batch=4, fallback=(), image_size=32 if model == 'r50' else 16,
                steps=2, rounds=2)
  return spec


def our_config(spec: dict):
  """configs/papers/simclr.py at the spec's scale, as the step benchmarks it."""
  from configs.papers import simclr  # pylint: disable=g-import-not-at-top
  config = simclr.get_config(spec['scale'])
  config.batch_size = spec['batch']
  config.model.dtype = 'bfloat16'
  config.model.head_hidden_dim = spec['hidden']
  config.model.head_out_dim = spec['out']
  config.loss_kwargs.temperature = spec['temperature']
  config.optimizer.name = 'sgd'
  config.optimizer.momentum = 0.9
  config.optimizer.base_learning_rate = spec['lr'] * 256 / spec['batch']
  config.optimizer.weight_decay = spec['weight_decay']
  return config


def peer_flags(spec: dict) -> list[str]:
  return [f'--model={spec["model"]}', f'--batch={spec["batch"]}',
          f'--image_size={spec["image_size"]}', f'--hidden={spec["hidden"]}',
          f'--out={spec["out"]}', f'--temperature={spec["temperature"]}',
          f'--lr={spec["lr"]}', f'--weight_decay={spec["weight_decay"]}']


# --------------------------------------------------------------------------
# Workers: one process per framework, compiled once, timed on command.


def _flops(cost) -> float:
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get('flops', float('nan')))


def _peak_bytes() -> int | None:
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def _summarize_trace(trace_dir: str, steps: int) -> dict:
  """GPU kernel time per step from a jax.profiler perfetto trace, by kind."""
  import gzip  # pylint: disable=g-import-not-at-top
  paths = [os.path.join(d, f) for d, _, fs in os.walk(trace_dir) for f in fs
           if f.endswith('.trace.json.gz')]
  if not paths:
    return {'error': f'no perfetto trace under {trace_dir}'}
  with gzip.open(paths[0], 'rt') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  names = {e['pid']: e['args'].get('name', '') for e in events
           if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  gpu = {pid for pid, name in names.items()
         if '/device:GPU' in name or 'GPU' in name and 'host' not in name}
  kernels = {}
  for e in events:
    if e.get('ph') == 'X' and e.get('pid') in gpu and e.get('dur'):
      kernels[e['name']] = kernels.get(e['name'], 0.) + e['dur'] / 1e3
  return _kernel_table(kernels, steps)


def _kernel_table(kernels: dict[str, float], steps: int) -> dict:
  """Kernel ms per step summed by kind, and the 12 largest kernels."""
  kinds = {'conv/matmul': 0., 'other': 0.}
  for name, ms in kernels.items():
    low = name.lower()
    kind = ('conv/matmul' if re.search(
        r'conv|gemm|xmma|cudnn|cutlass|wgmma|sm90|sm80|dgrad|wgrad|implicit',
        low) else 'other')
    kinds[kind] += ms
  top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
  return {'gpu_ms_per_step': sum(kernels.values()) / steps,
          'by_kind_ms_per_step': {k: v / steps for k, v in kinds.items()},
          'top_kernels_ms_per_step': [(n[:90], ms / steps) for n, ms in top]}


def jax_worker(args) -> int:
  """Builds our step for `args.part`, then serves the worker protocol."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top

  def say(obj):
    print(json.dumps(obj), flush=True)

  spec = {**step_spec(args.part, args.dry), 'batch': args.batch}
  try:
    t0 = time.perf_counter()
    config = our_config(spec)
    mesh = runtime.create_mesh()
    shape = (spec['image_size'], spec['image_size'], 3)
    setup = step_lib.build(config, mesh, total_steps=10_000,
                        steps_per_epoch=1_000, num_examples=1_000_000,
                        image_shape=shape)
    state = setup.init_fn(jax.random.key(0))
    data = NamedSharding(mesh, P('data'))
    b = spec['batch']
    batch = {'views': (jax.device_put(np.random.default_rng(0).random(
        (b, 2) + shape, np.float32), data),),
             'label': jax.device_put(np.zeros(b, np.int32), data),
             'index': jax.device_put(np.arange(b, dtype=np.int32), data)}
    rng = jax.random.key(1)
    lowered = setup.step_fn.lower(state, batch, rng)
    compiled = lowered.compile()
    if args.flops_only:
      say({'flops': _flops(compiled.cost_analysis())})
      return 0
    memory = compiled.memory_analysis()
    for _ in range(3):
      state, metrics = compiled(state, batch, rng)
    loss = float(metrics['loss'])
    ready = {'ready': True, 'compile_s': time.perf_counter() - t0,
             'flops_compiled': _flops(compiled.cost_analysis()),
             'temp_bytes': getattr(memory, 'temp_size_in_bytes', None),
             'argument_bytes': getattr(memory, 'argument_size_in_bytes',
                                       None),
             'loss': loss, 'device': jax.devices()[0].device_kind}
  except Exception as e:  # pylint: disable=broad-except
    text = f'{type(e).__name__}: {e}'
    say({'error': ('out of memory' if re.search(
        r'RESOURCE_EXHAUSTED|out of memory', text) else 'failed'),
         'detail': text[-1500:]})
    return 3
  say(ready)
  for line in sys.stdin:
    cmd = json.loads(line)
    if cmd['cmd'] == 'quit':
      break
    n = int(cmd['steps'])
    if cmd['cmd'] == 'time':
      jax.block_until_ready(state)
      t0 = time.perf_counter()
      for _ in range(n):
        state, metrics = compiled(state, batch, rng)
      jax.block_until_ready(metrics)
      say({'seconds': time.perf_counter() - t0, 'steps': n,
           'loss': float(metrics['loss']), 'peak_bytes': _peak_bytes()})
    elif cmd['cmd'] == 'profile':
      trace_dir = cmd['dir']
      jax.block_until_ready(state)
      try:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
          for _ in range(n):
            state, metrics = compiled(state, batch, rng)
          jax.block_until_ready(metrics)
        say(_summarize_trace(trace_dir, n))
      except Exception as e:  # pylint: disable=broad-except
        say({'error': f'{type(e).__name__}: {e}'[-800:]})
  return 0


class Worker:
  """A worker process speaking JSON lines (ready, then one answer a command)."""

  def __init__(self, name: str, cmd: list[str], env: dict, log_path: str):
    self.name = name
    self._log = open(log_path, 'w')  # pylint: disable=consider-using-with
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=self._log, text=True, env=env, cwd=ROOT)
    self.ready = None

  def read(self) -> dict:
    for line in self.proc.stdout:
      line = line.strip()
      if line.startswith('{'):
        return json.loads(line)
    self.proc.wait()
    with open(self._log.name) as f:
      tail = f.read()[-1500:]
    return {'error': f'{self.name} exited ({self.proc.returncode})',
            'detail': tail}

  def ask(self, **cmd) -> dict:
    self.proc.stdin.write(json.dumps(cmd) + '\n')
    self.proc.stdin.flush()
    return self.read()

  def close(self):
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write('{"cmd": "quit"}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        self.proc.kill()
    self._log.close()


def _child_env(**extra) -> dict[str, str]:
  """This process's environment plus `extra`, the repository first on
  PYTHONPATH: what every worker process starts with."""
  env = dict(os.environ, **extra)
  env['PYTHONPATH'] = os.pathsep.join(
      [ROOT] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  return env


def _cpu_flops(part: str, batch: int, args) -> subprocess.Popen:
  """Starts a CPU compilation of our step that prints its FLOPs.

  XLA:GPU's cost analysis leaves out the convolutions it hands to cuDNN (a
  ResNet-50 step reads as 0.4 GFLOP per view instead of ~24), while the same
  program compiled for the CPU counts them: the step's FLOPs, which do not
  depend on the backend.
  """
  env = _child_env(JAX_PLATFORMS='cpu', XLA_FLAGS='')
  return subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, os.path.abspath(__file__), f'--_worker={part}',
       f'--batch={batch}', '--flops_only'] + (['--dry'] if args.dry else []),
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
      cwd=ROOT)


def _gpu() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.default_backend() == 'gpu'


def _start_pair(part: str, batch: int, args, out_dir: str):
  """Starts our worker and the peer's (if torch is there) at `batch`."""
  spec = {**step_spec(part, args.dry), 'batch': batch}
  env = _child_env()
  fraction = []
  if _gpu():
    # Both workers hold the GPU at once: each gets part of its memory.
    env['XLA_PYTHON_CLIENT_MEM_FRACTION'] = '0.45'
    fraction = ['--memory_fraction=0.45']
  ours = Worker('ours', [sys.executable, os.path.abspath(__file__),
                         f'--_worker={part}', f'--batch={batch}']
                + (['--dry'] if args.dry else []), env,
                os.path.join(out_dir, f'{part}_ours.log'))
  peer = None
  if args.torch_python:
    peer = Worker('peer', [args.torch_python, PEER, *peer_flags(spec),
                           f'--compile={0 if args.dry else 1}', *fraction],
                  env, os.path.join(out_dir, f'{part}_peer.log'))
  ours.ready = ours.read()
  if peer is not None:
    peer.ready = peer.read()
  return spec, ours, peer


def compare_steps(part: str, args, out_dir: str, peak_tflops: float) -> dict:
  """Our step and the peer's, compiled once each, timed in alternation."""
  spec = step_spec(part, args.dry)
  for batch in (spec['batch'],) + tuple(spec['fallback']):
    flops_proc = _cpu_flops(part, batch, args) if _gpu() else None
    log(f'{part}: starting both workers at batch {batch} (compiling) ...')
    spec, ours, peer = _start_pair(part, batch, args, out_dir)
    oom = [w.name for w in (ours, peer) if w is not None
           and w.ready.get('error') == 'out of memory']
    if not oom:
      break
    log(f'{part}: out of memory at batch {batch} ({", ".join(oom)})')
    if flops_proc is not None:
      flops_proc.kill()
    for w in (ours, peer):
      if w is not None:
        w.close()
  result = {'spec': spec, 'ours_ready': ours.ready,
            'peer_ready': peer.ready if peer else 'no torch interpreter'}
  try:
    if 'error' in ours.ready:
      raise RuntimeError(f'our worker: {ours.ready}')
    workers = [ours] + ([peer] if peer and 'error' not in peer.ready else [])
    rounds = {w.name: [] for w in workers}
    for r in range(spec['rounds']):
      for w in workers:
        out = w.ask(cmd='time', steps=spec['steps'])
        if 'error' in out:
          raise RuntimeError(f'{w.name}: {out}')
        rounds[w.name].append(out)
        log(f'{part} round {r} {w.name}: '
            f'{out["seconds"] / out["steps"] * 1e3:.1f} ms/step')
    images = 2 * spec['batch']   # Two views per instance.
    flops = ours.ready['flops_compiled']
    if flops_proc is not None:
      out, _ = flops_proc.communicate(timeout=600)
      flops = json.loads(out.strip().splitlines()[-1])['flops']
    for name, outs in rounds.items():
      step_s = statistics.median(o['seconds'] / o['steps'] for o in outs)
      result[name] = {
          'step_ms_rounds': [1e3 * o['seconds'] / o['steps'] for o in outs],
          'step_ms': 1e3 * step_s, 'images_per_s': images / step_s,
          'tflops': flops / step_s / 1e12,
          'mfu': flops / step_s / 1e12 / peak_tflops if peak_tflops else None,
          'peak_gib': (outs[-1].get('peak_bytes') or 0) / 2**30}
    result['flops_per_step'] = flops
    result['flops_per_image_fwd_bwd'] = flops / images
    if 'peer' in result:
      result['ours_over_peer'] = (result['ours']['images_per_s'] /
                                  result['peer']['images_per_s'])
    if _gpu() and not args.dry:   # Where each step's GPU time goes.
      result['ours_profile'] = ours.ask(
          cmd='profile', steps=3, dir=os.path.join(out_dir, f'{part}_trace'))
      if 'peer' in result:
        prof = peer.ask(cmd='profile', steps=3)
        result['peer_profile'] = (_kernel_table(prof['kernels_ms'], 3)
                                  if 'kernels_ms' in prof else prof)
  finally:
    for w in (ours, peer):
      if w is not None:
        w.close()
  return result


# --------------------------------------------------------------------------
# The other parts.


def matmul_peak(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  n = 1024 if args.dry else 8192
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda x, y: x @ y)
  jax.block_until_ready(mm(a, b))
  times = []
  for _ in range(10):
    t0 = time.perf_counter()
    jax.block_until_ready(mm(a, b))
    times.append(time.perf_counter() - t0)
  kind = jax.devices()[0].device_kind
  sheet = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in kind), None)
  return {'device_kind': kind, 'n': n,
          'measured_tflops': 2 * n**3 / statistics.median(times) / 1e12,
          'datasheet_bf16_tflops': sheet}


def end_to_end(args, out_dir: str) -> dict:
  """main.py --config=configs/test.py on the npz Fashion-MNIST, timed."""
  workdir = os.path.join(out_dir, 'e2e_workdir')
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, os.path.join(ROOT, 'main.py'),
         '--config=' + os.path.join(ROOT, 'configs', 'test.py'),
         f'--workdir={workdir}', '--config.dataset.name=npz',
         f'--config.dataset.data_dir={args.data_dir}', '--progress=off']
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        cwd=ROOT)
  seconds = time.perf_counter() - t0
  with open(os.path.join(out_dir, 'e2e.log'), 'w') as f:
    f.write(proc.stdout + proc.stderr)
  if proc.returncode:
    raise RuntimeError(f'main.py exited {proc.returncode}: '
                       f'{proc.stderr[-1500:]}')
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  return {'command': ' '.join(cmd[1:]), 'wall_s': seconds,
          **{k: v for k, v in results.items()
             if isinstance(v, (int, float)) and v is not None}}


def run_tests(args, out_dir: str) -> dict:
  """The reference tests under the default and the 'highest' precision."""
  out = {}
  for precision in args.test_precisions.split(','):
    env = dict(os.environ, CONTRASTIVE_JAX_TEST_MATMUL_PRECISION=precision,
               XLA_PYTHON_CLIENT_PREALLOCATE='false')
    files = TEST_FILES[:2] if args.dry else TEST_FILES
    junit = os.path.join(out_dir, f'tests_{precision}.xml')
    cmd = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
           f'--junitxml={junit}', '-n', str(args.test_workers), *files]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          cwd=ROOT, env=env)
    with open(os.path.join(out_dir, f'tests_{precision}.log'), 'w') as f:
      f.write(proc.stdout + proc.stderr)
    out[precision] = {'wall_s': time.perf_counter() - t0,
                      'summary': (proc.stdout.strip().splitlines() or
                                  [''])[-1],
                      'failed': _failures(junit)}
  return out


def _failures(junit: str) -> list[tuple[str, str]]:
  """(test id, first line of the failure) for each failed test."""
  import xml.etree.ElementTree as ET  # pylint: disable=g-import-not-at-top
  if not os.path.exists(junit):
    return [('(no junit report)', '')]
  failed = []
  for case in ET.parse(junit).getroot().iter('testcase'):
    for bad in list(case.findall('failure')) + list(case.findall('error')):
      failed.append((f'{case.get("classname")}::{case.get("name")}',
                     (bad.get('message') or '')[:300]))
  return failed


def input_rate(args, out_dir: str) -> dict:
  """The host's steady-state input rate: benchmarks/input_rate.py on this
  host's cores (ours in worker processes and on threads, with and without
  a busy thread; the PyTorch DataLoader peer), its JSON report."""
  cores = len(os.sched_getaffinity(0))
  out = os.path.join(out_dir, 'input_rate.json')
  counts = sorted({1, max(1, cores // 4), cores})
  cmd = [sys.executable, os.path.join(ROOT, 'benchmarks', 'input_rate.py'),
         f'--cache_dir={args.cache_dir}', f'--out={out}',
         f'--torch_python={args.torch_python or "none"}']
  if args.dry:
    cmd += ['--dry', '--cores=1']
  else:   # 64-image batches: 4 x (16 workers x 2) batches need 8,192.
    cmd += [f'--cores={",".join(map(str, counts))}', '--images=8192',
            '--batch=64', '--rounds=2', '--per_image=100',
            '--large_images=100']
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  with open(os.path.join(out_dir, 'input_rate.log'), 'w') as f:
    f.write(proc.stdout + proc.stderr)
  if proc.returncode or not os.path.exists(out):
    raise RuntimeError(f'input_rate.py exited {proc.returncode}: '
                       f'{proc.stderr[-1500:]}')
  with open(out) as f:
    report = json.load(f)
  report['table'] = proc.stdout
  return report


def _main_py(flags: list[str], workdir: str, log_path: str) -> dict:
  """Runs main.py with `flags`; results.json and the logged intervals."""
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, os.path.join(ROOT, 'main.py'), f'--workdir={workdir}',
         '--progress=off', *flags]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        cwd=ROOT)
  wall = time.perf_counter() - t0
  with open(log_path, 'w') as f:
    f.write(' '.join(cmd) + '\n' + proc.stdout + proc.stderr)
  if proc.returncode:
    raise RuntimeError(f'main.py exited {proc.returncode}: '
                       f'{proc.stderr[-1500:]}')
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  with open(os.path.join(workdir, 'history.json')) as f:
    history = [h for h in json.load(f) if 'images_per_sec' in h]
  # Medians over the log intervals: the batches read ahead during the
  # compilation, used in the first intervals, do not count.
  waits = [h['input_wait'] for h in history if 'input_wait' in h]
  return {'command': ' '.join(cmd[1:]), 'wall_s': wall,
          'images_per_s': results.get('images_per_sec'),
          'input_wait': statistics.median(waits) if waits else None,
          'input_wait_whole_run': results.get('input_wait'),
          'train_s': results.get('train_seconds'),
          'intervals': [{k: h[k] for k in ('step', 'images_per_sec',
                                           'input_wait') if k in h}
                        for h in history]}


def _npz_of(root: str, image_size: int) -> str:
  """`root`'s training images as `<root>_npz/train.npz`, centre squares."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top
  out = f'{root}_npz_{image_size}'
  path = os.path.join(out, 'train.npz')
  if not os.path.exists(path):
    os.makedirs(out, exist_ok=True)
    data = sources.ImageFolder(root, 'train', image_size=image_size).read_all()
    np.savez(path + '.tmp.npz', image=data.images, label=data.labels)
    os.replace(path + '.tmp.npz', path)
  return out


def stream(args, out_dir: str) -> dict:
  """main.py with the ResNet-50 SimCLR paper recipe, streamed from JPEGs.

  `configs/papers/simclr.py:imagenet` (each view's crop cut by the host
  from the full image, the rest of the recipe on the device, bf16) over a
  generated ImageNet-like folder (`input_rate.imagenet_like_folder`), and
  over the same images as a TFDS ArrayRecord dataset (where TensorFlow is
  there to build it, `input_rate.arrayrecord_of`), decoding as
  `pipeline.decoding` chooses, for `steps` steps at batch 256, evaluation
  off; against (1) the same run fed from memory (the folder's
  centre squares as an npz split, the devices cutting the crops: the step's
  own rate) and (2) PyTorch end to end (benchmarks/torch_step_peer.py with
  a DataLoader making SimCLR's recipe in as many workers as cores). Reads
  images/s and the input wait from results.json and history.json: the
  median over the log intervals, so the batches read ahead during
  compilation do not count; the peer warms up for 3 steps per worker.
  """
  from benchmarks import input_rate as ir  # pylint: disable=g-import-not-at-top
  cores = len(os.sched_getaffinity(0))
  if args.dry:
    images, steps, batch, size, log_every = 96, 6, 8, 32, 2
    root = ir.imagenet_like_folder(os.path.join(args.cache_dir, 'dry'),
                                   images, short_side=(40, 64))
  else:
    images, steps, batch, size, log_every = 8192, 200, 256, 224, 20
    root = ir.imagenet_like_folder(args.cache_dir, images)
  common = [
      '--config=' + os.path.join(ROOT, 'configs', 'papers', 'simclr.py') +
      ':imagenet',
      f'--config.batch_size={batch}', f'--config.dataset.image_size={size}',
      f'--config.num_epochs={steps * batch / images}',
      f'--config.log_every_steps={log_every}',
      f'--config.checkpoint_every_steps={10 * steps}',
      '--config.dataset.train_split=train',
      '--config.dataset.eval_split=train', '--config.eval.baselines=False',
      '--config.eval.embedding_points=0',
      *[f'--config.evals.{e}.every_steps=-1'
        for e in ('knn', 'linear', 'online_knn', 'linear_eval')]]
  if args.dry:   # The same code paths, a CPU-sized model.
    common.append('--config.model.encoder=resnet18')
  result = {'images': images, 'steps': steps, 'batch': batch,
            'image_size': size, 'cores': cores}
  result['streamed'] = _main_py(
      common + ['--config.dataset.name=image_folder',
                f'--config.dataset.data_dir={root}'],
      os.path.join(out_dir, 'stream_workdir'),
      os.path.join(out_dir, 'stream.log'))
  try:   # The pod's format: the same images as a TFDS ArrayRecord set.
    data_dir = ir.arrayrecord_of(root)
  except ImportError as e:   # Building it needs TensorFlow.
    result['arrayrecord_error'] = f'{type(e).__name__}: {e}'
  else:
    result['arrayrecord'] = _main_py(
        common + [f'--config.dataset.name={ir.ARRAYRECORD_NAME}',
                  f'--config.dataset.data_dir={data_dir}'],
        os.path.join(out_dir, 'arrayrecord_workdir'),
        os.path.join(out_dir, 'arrayrecord.log'))
  result['memory'] = _main_py(
      common + ['--config.dataset.name=npz',
                f'--config.dataset.data_dir={_npz_of(root, size)}',
                '--config.dataset.in_memory=True',
                '--config.dataset.train_crop_source=center_square',
                '--config.dataset.eval_crop_fraction=1.0'],
      os.path.join(out_dir, 'memory_workdir'),
      os.path.join(out_dir, 'memory.log'))
  result['streamed_over_memory'] = (result['streamed']['images_per_s'] /
                                    result['memory']['images_per_s'])
  if args.torch_python:
    cmd = [args.torch_python, PEER, '--model=resnet50', f'--batch={batch}',
           f'--image_size={size}', f'--standalone={steps}',
           f'--data_root={os.path.join(root, "train")}',
           # Warm-up past what the workers read ahead (2 batches each).
           f'--loader_workers={cores}', f'--warmup={3 * cores}']
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
      result['peer_error'] = proc.stderr[-1500:]
    else:
      peer = json.loads(proc.stdout.strip().splitlines()[-1])
      result['peer'] = peer
      # The peer counts views; ours counts instances (2 views each).
      result['peer_images_per_s'] = peer['images_per_s'] / 2
      result['streamed_over_peer'] = (result['streamed']['images_per_s'] /
                                      result['peer_images_per_s'])
  else:
    result['peer_error'] = 'no torch interpreter'
  return result


# --------------------------------------------------------------------------
# Preparation (here, with the project's venv) and the report.


def prepare() -> None:
  """Writes .accel/: Fashion-MNIST as npz, and the wheels for the device."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top
  os.makedirs(DATA, exist_ok=True)
  dc = ml_collections.ConfigDict({'name': 'fashion_mnist', 'data_dir': None,
                                  'image_size': None, 'in_memory': True})
  for split in ('train', 'test'):
    path = os.path.join(DATA, f'{split}.npz')
    if not os.path.exists(path):
      data = sources.open_split(dc, split)
      np.savez_compressed(path, image=data.images, label=data.labels)
    log(f'{path}: {os.path.getsize(path) / 2**20:.1f} MiB')
  pins = {}
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    for line in f:
      m = re.match(r'^([A-Za-z0-9_.-]+)==(\S+)', line.strip())
      if m:
        pins[m.group(1).lower().replace('_', '-')] = m.group(2)
  wanted = [f'{p}=={pins[p.lower().replace("_", "-")]}' for p in WHEEL_PINS]
  platforms = [f'--platform=manylinux_2_{n}_x86_64' for n in (17, 24, 27, 28)]
  subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps',
                  '--only-binary=:all:', '--python-version=3.12',
                  '--implementation=cp', *platforms,
                  '--platform=manylinux2014_x86_64', '-d', WHEELS, *wanted],
                 check=True)
  log(f'{WHEELS}: {", ".join(sorted(os.listdir(WHEELS)))}')


def _versions() -> dict:
  out = {'python': platform.python_version(), 'cpu_count': os.cpu_count()}
  for name in ('jax', 'jaxlib', 'flax', 'optax', 'orbax.checkpoint', 'torch',
               'torchvision', 'numpy'):
    try:
      module = __import__(name, fromlist=['__version__'])
      out[name] = getattr(module, '__version__', '?')
    except ImportError:
      out[name] = None
  return out


def _table(report: dict) -> str:
  lines = ['', 'part    result']
  peak = report.get('peak', {})
  if 'measured_tflops' in peak:
    lines.append(f'peak    {peak["device_kind"]}: bf16 matmul '
                 f'{peak["measured_tflops"]:.0f} TFLOP/s measured, '
                 f'{peak["datasheet_bf16_tflops"]} datasheet')
  for part in ('r50', 'r18'):
    r = report.get(part, {})
    for who in ('ours', 'peer'):
      if who in r:
        x = r[who]
        mfu = f'  MFU {100 * x["mfu"]:.1f}%' if x.get('mfu') else ''
        lines.append(f'{part:<7} {who:<5} batch {r["spec"]["batch"]}: '
                     f'{x["step_ms"]:.1f} ms/step, {x["images_per_s"]:,.0f} '
                     f'views/s{mfu}, peak {x["peak_gib"]:.1f} GiB')
    if 'ours_over_peer' in r:
      lines.append(f'{part:<7} ours / peer {r["ours_over_peer"]:.2f}x')
  e2e = report.get('e2e', {})
  if 'wall_s' in e2e:
    accs = ', '.join(f'{k} {100 * v:.2f}' for k, v in e2e.items()
                     if k.endswith('/linear_top1') or '/knn_weighted' in k)
    lines.append(f'e2e     main.py configs/test.py: {e2e["wall_s"]:.0f} s; '
                 f'{accs}')
  for precision, t in report.get('tests', {}).items():
    if isinstance(t, dict):
      lines.append(f'tests   {precision}: {t["summary"]} '
                   f'({len(t["failed"])} failed)')
  inp = report.get('input', {})
  if 'table' in inp:
    lines.append('input   benchmarks/input_rate.py:' +
                 inp['table'].rstrip().replace('\n', '\n        '))
  st = report.get('stream', {})
  if 'streamed' in st:
    peer = (f', PyTorch end to end {st["peer_images_per_s"]:,.0f} '
            f'(ours {st["streamed_over_peer"]:.2f}x)'
            if 'peer_images_per_s' in st else '')
    arrayrecord = (f', ArrayRecord {st["arrayrecord"]["images_per_s"]:,.0f} '
                   f'(input wait {100 * st["arrayrecord"]["input_wait"]:.0f}%)'
                   if 'arrayrecord' in st else '')
    lines.append(
        f'stream  main.py ResNet-50 SimCLR, {st["steps"]} steps of '
        f'{st["batch"]}: streamed {st["streamed"]["images_per_s"]:,.0f} '
        f'images/s (input wait {100 * st["streamed"]["input_wait"]:.0f}%), '
        f'from memory {st["memory"]["images_per_s"]:,.0f} (streamed '
        f'{st["streamed_over_memory"]:.2f}x){arrayrecord}{peer}')
  for part, r in report.items():
    if isinstance(r, dict) and 'error' in r:
      lines.append(f'{part:<7} FAILED: {r["error"][:200]}')
  return '\n'.join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n', maxsplit=1)[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default='/tmp/contrastive_jax_accelerator')
  parser.add_argument('--parts', default=','.join(PARTS),
                      help=f'Comma-separated, of: {", ".join(PARTS)}.')
  parser.add_argument('--dry', action='store_true',
                      help='Tiny sizes (CPU, CI).')
  parser.add_argument('--prepare', action='store_true',
                      help='Write .accel/ (data and wheels) and exit.')
  parser.add_argument('--torch_python', default=None,
                      help='Interpreter with torch and torchvision for the '
                      'peers (default: this one if it has them).')
  parser.add_argument('--data_dir', default=DATA)
  parser.add_argument('--cache_dir', default='/tmp/contrastive_jax_bench')
  parser.add_argument('--test_workers', type=int, default=4)
  parser.add_argument('--test_precisions', default='default,highest',
                      help="jax_default_matmul_precision values to run the "
                      "tests under ('default': the backend's own).")
  parser.add_argument('--commit', default='')
  parser.add_argument('--_worker', default='', help=argparse.SUPPRESS)
  parser.add_argument('--batch', type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument('--flops_only', action='store_true',
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args._worker:  # pylint: disable=protected-access
    args.part = args._worker  # pylint: disable=protected-access
    return jax_worker(args)
  if args.prepare:
    prepare()
    return 0
  parts = [p for p in args.parts.split(',') if p]
  unknown = set(parts) - set(PARTS)
  if unknown:
    parser.error(f'unknown parts {sorted(unknown)}; known: {PARTS}')
  if args.torch_python is None:
    try:
      import torch, torchvision  # noqa: F401,E401  pylint: disable=g-import-not-at-top,multiple-imports,unused-import
      args.torch_python = sys.executable
    except ImportError:
      args.torch_python = ''
  # Sizes XLA:CPU's thread pools before jax starts (contrastive_jax/runtime).
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.size_cpu_thread_pools()
  os.makedirs(args.out, exist_ok=True)
  report = {'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
            'commit': args.commit, 'dry': args.dry, 'versions': _versions(),
            'torch_python': args.torch_python or None}
  import jax  # pylint: disable=g-import-not-at-top
  report['backend'] = jax.default_backend()
  report['devices'] = [d.device_kind for d in jax.devices()]
  path = os.path.join(args.out, 'accelerator.json')
  peak_tflops = None
  for part in parts:
    log(f'part {part} ...')
    t0 = time.perf_counter()
    try:
      if part == 'peak':
        report[part] = matmul_peak(args)
        peak_tflops = report[part]['datasheet_bf16_tflops']
      elif part in ('r50', 'r18'):
        report[part] = compare_steps(part, args, args.out, peak_tflops)
      elif part == 'e2e':
        report[part] = end_to_end(args, args.out)
      elif part == 'tests':
        report[part] = run_tests(args, args.out)
      elif part == 'input':
        report[part] = input_rate(args, args.out)
      elif part == 'stream':
        report[part] = stream(args, args.out)
    except Exception as e:  # pylint: disable=broad-except
      report[part] = {'error': f'{type(e).__name__}: {e}',
                      'traceback': traceback.format_exc()[-3000:]}
    report.setdefault(part, {})['part_s'] = time.perf_counter() - t0
    log(f'part {part}: {report[part]["part_s"]:.0f} s')
    with open(path, 'w') as f:
      json.dump(report, f, indent=1, default=str)
  print(_table(report), flush=True)
  print(f'report: {path}', flush=True)
  return 1 if any(isinstance(r, dict) and 'error' in r
                  for r in report.values()) else 0


if __name__ == '__main__':
  sys.exit(main())
