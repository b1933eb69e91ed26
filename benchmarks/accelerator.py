r"""The accelerator check: train steps against PyTorch, the entry point, the
numerics and the input pipeline, on one GPU, in one run.

What it measures (each part is independent: a part that fails records its
error in the report and the next part runs):

  peak     bf16 matrix products: an 8192^3 matmul's TFLOP/s, the measured
           ceiling beside the datasheet's dense bf16 peak.
  r50      the ResNet-50 SimCLR step at 224 px, batch 256, 2 views, bf16
           compute, built by `step_lib.build` from
           configs/papers/simclr.py:imagenet (SGD instead of LARS, the same
           in both, see below), against benchmarks/torch_step_peer.py
           (torchvision's resnet50, channels-last, bf16 autocast, the same
           head, NT-Xent and SGD, fused), as rows:
             ours          our step as configured (config.model.fused_bn's
                           default: the fused BatchNorm + ReLU + residual);
             ours_flax_bn  the same with flax's nn.BatchNorm: each variant
                           a worker with config overrides (OUR_VARIANTS);
             peer_<mode>   the peer under each torch.compile mode
                           (PEER_MODES), screened for the fastest;
             flag_<name>   `ours` with XLA_FLAGS extended (XLA_FLAG_ROWS),
                           kept only if it wins.
           Our variants and the fastest peer mode alternate round by round
           (50 steps x 5 rounds each): step time, views/s, MFU (the step's
           FLOPs from XLA's cost analysis of it compiled for the CPU, which
           counts the convolutions XLA:GPU hands to cuDNN, over the step
           time and the bf16 peak), peak memory, and each over the fastest
           peer. Every row's GPU time per step by the library that ran each
           kernel (cuDNN, cuBLAS, CUTLASS, XLA fusion, XLA Triton, inductor
           Triton, other; `kernel_table`), from a profile of 2 steps: ours
           by the HLO op that launched it (classify_xla_kernels), the
           peer's by the operator around its launch (classify_torch_kernels).
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

The step parts run together. Each row is a long-lived worker process,
compiled once, given its share of the GPU's memory (`mem_gib` in
step_spec) and ended if it has not compiled within its cap (240 s). Rows
start in waves, as many as the GPU's memory holds, in the order of `_rows`
(the longest compilations first); at r50 the CUDA-graph peer modes start
after their sibling without graphs has compiled and reuse its inductor
caches (the autotuning, the Triton kernels: their compile times are
warm-cache times; each run starts with empty caches). Nothing is timed
while anything compiles: after each wave, the GPU quiet, the new peer
modes are screened (2 rounds of 20 steps at r50, of 50 at r18, alternated
with the fastest mode so far), each new flag row alternates with `ours`
for 2 rounds of 50 steps (it wins if at least 1% faster), each new row is
profiled, and only the fastest mode stays. Once all of a part's peer modes
are screened, its variants and the fastest mode alternate (50 steps x 5
rounds) and all of its workers but `ours` (the flag rows' reference) end;
where the rows kept for that alternation leave no room for a mode still to
come, the alternation runs without it. `--deadline_s` starts no row that
would leave too little time for the alternations still due, and ends
those still compiling when that time comes: what it leaves out is
reported as skipped.

The pending GPU rows (peak; r50 and r18 with every peer mode, both
variants and the flag rows) in one command:

  bash benchmarks/run_on_gpu.sh check OUT --preset=bn

(`--preset=bn` is --parts=peak,r50,r18 --deadline_s=500.) Its wall time,
from the H100 run's figures (docs/performance.md: compiles of ours 50 s at
r50 and 42 s at r18, of the peer's default mode 70 s and 44 s; steps 86
and 12.6 ms), with max-autotune's compilation of the r50 step (not
measured yet) taken as 150 s, on an H200 in 3 waves: start-up and peak
~15 s; r50's default and max-autotune-no-cudagraphs modes, both variants,
all r18 rows but two flag rows (~150 s), then screening, profiles and
r18's alternation (~60 s); r50's CUDA-graph modes (~70 s), then
screening, profiles and r50's alternation (~85 s); the flag rows left
(~55 s) and their alternations with `ours` (~75 s): about 8 min, and 8.5
with run_on_gpu.sh's wheels. Where max-autotune compiles for longer, the
deadline leaves out the flag rows or r50's CUDA-graph modes, and the run
stays under 9 min. An 80 GB H100 holds fewer rows a wave: r50's
CUDA-graph modes find no room beside the rows kept for the alternation,
and the deadline leaves out flag rows.

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
`--torch_python`, and say so when they are absent; the peer's modes compile
with dynamo's eager backend there, and those that need CUDA graphs are
reported skipped; the flag rows run only when `--flags` names them). The
report is `--out/accelerator.json` plus a table printed last. Results:
docs/performance.md.
"""

import argparse
import json
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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
STEP_PARTS = ('r50', 'r18')
# Named sets of options: bn, the GPU rows pending (the module docstring).
PRESETS = {'bn': '--parts=peak,r50,r18 --deadline_s=500'}

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
# The step parts' rows: sizes, our variants, the flag rows, the peer modes.

# Our step's variants: config overrides (dotted keys) for one worker each.
# `ours` is the step as configured, the flag rows' reference.
OUR_VARIANTS = {'ours': {}, 'ours_flax_bn': {'model.fused_bn': False}}

# XLA flags tried on `ours`, one worker each with XLA_FLAGS extended. Each
# name is in jaxlib's flag registry (tests/test_accelerator_check.py).
XLA_FLAG_ROWS = {
    # cuDNN graph fusions of convolutions with their elementwise neighbours
    # (off by default): BatchNorm's normalize and ReLU beside a convolution.
    'conv_fusion': '--xla_gpu_experimental_enable_conv_fusion=true',
    # No command buffers (CUDA graphs of fusions and library calls, on by
    # default): the launches one by one.
    'no_command_buffer': '--xla_gpu_enable_command_buffer=',
    # The scheduler that overlaps asynchronous work (off by default).
    'latency_hiding': '--xla_gpu_enable_latency_hiding_scheduler=true',
}
FLAG_WIN = 1.01   # A flag row wins at this speed over `ours` or more.

# torch.compile's modes, each with the sibling without CUDA graphs that a
# CUDA-graph mode waits for (to reuse its inductor caches), or None.
PEER_MODES = {'max-autotune-no-cudagraphs': None, 'default': None,
              'max-autotune': 'max-autotune-no-cudagraphs',
              'reduce-overhead': 'default'}

# What runs a kernel: the rows of kernel_table.
KINDS = ('cuDNN', 'cuBLAS', 'CUTLASS', 'XLA fusion', 'XLA Triton',
         'inductor Triton', 'other', 'unattributed')


def step_spec(model: str, dry: bool) -> dict:
  """The step compared in part `model`: sizes, head, loss, optimizer, rows.

  The optimizer is SGD with momentum in both frameworks (PyTorch has no
  LARS; its cost is a few elementwise passes over the parameters either
  way). `mem_gib`: each worker's share of the GPU's memory (the H100 run's
  peaks, 20.0 and 20.8 GiB at r50 and 2.4 at r18, plus 3 and 0.6 GiB of room
  for autotuning and fragmentation, and 1 GiB for the CUDA context, outside
  the allocator's limit);
  `warm_siblings`: the CUDA-graph modes wait for their siblings' caches
  (worth it where max-autotune compiles for minutes); `est_*`: that run's
  step time and compile times, for the deadline. `dry` keeps the model and
  shrinks the images and the batch.
  """
  if model == 'r50':
    spec = dict(model='resnet50', scale='imagenet', batch=256,
                image_size=224, hidden=2048, out=128, temperature=0.1,
                lr=0.3, weight_decay=1e-6, screen_steps=20,
                flags=('conv_fusion', 'no_command_buffer'),
                warm_siblings=True, mem_gib={'ours': 25., 'peer': 25.},
                est_step_s=0.086, est_compile_s={'ours': 50, 'peer': 70})
  elif model == 'r18':
    spec = dict(model='resnet18', scale='cifar10', batch=512, image_size=32,
                hidden=512, out=128, temperature=0.5, lr=0.12,
                weight_decay=5e-4, screen_steps=50, flags=tuple(XLA_FLAG_ROWS),
                warm_siblings=False, mem_gib={'ours': 4., 'peer': 4.},
                est_step_s=0.0126, est_compile_s={'ours': 42, 'peer': 44})
  else:
    raise ValueError(model)
  spec.update(steps=50, rounds=5, screen_rounds=2, flag_rounds=2,
              profile_steps=2, compile_cap_s=240)
  if dry:   # A share is a row: the CPU runs as many at once as it has cores.
    spec.update(batch=4, image_size=32 if model == 'r50' else 16, steps=2,
                rounds=2, screen_steps=2, screen_rounds=1, flag_rounds=1,
                profile_steps=1, flags=(), warm_siblings=False,
                mem_gib={'ours': 1, 'peer': 1}, compile_cap_s=1200)
  return spec


def apply_overrides(config, overrides: dict):
  """Sets each dotted key of `overrides` on `config`; each must exist, so a
  variant never runs as the default under a misspelt or missing field."""
  for key, value in overrides.items():
    *path, leaf = key.split('.')
    node = config
    for name in path:
      node = node[name]
    if leaf not in node:
      raise KeyError(f'the config has no {key}')
    node[leaf] = value
  return config


def our_config(spec: dict, overrides: dict | None = None):
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
  return apply_overrides(config, overrides or {})


def peer_flags(spec: dict) -> list[str]:
  return [f'--model={spec["model"]}', f'--batch={spec["batch"]}',
          f'--image_size={spec["image_size"]}', f'--hidden={spec["hidden"]}',
          f'--out={spec["out"]}', f'--temperature={spec["temperature"]}',
          f'--lr={spec["lr"]}', f'--weight_decay={spec["weight_decay"]}']


# --------------------------------------------------------------------------
# Kernels by what launched them: pure functions of trace events and HLO.

_HLO_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$')
_HLO_COMP = re.compile(r'^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')


def _library(text: str) -> str | None:
  low = text.lower()
  for key, kind in (('cudnn', 'cuDNN'), ('cublas', 'cuBLAS'),
                    ('cutlass', 'CUTLASS'), ('triton', 'XLA Triton')):
    if key in low:
      return kind
  return None


def hlo_index(hlo_text: str) -> tuple[dict, dict, dict]:
  """An optimized HLO module's text as (kinds, calls, members).

  kinds: each instruction by what runs it: a custom-call by its target
  (`__cudnn$convForward` cuDNN, `__cublas$gemm` and `__cublas$lt$matmul`
  cuBLAS, `...cutlass...` CUTLASS, others 'other'), a fusion by its backend
  config's kind (`__triton_gemm` and other `__triton*` XLA Triton,
  `__cudnn$fusion` cuDNN, ...), every other fusion or op 'XLA fusion'.
  calls: each `call` (a command buffer's, say) to its computation; members:
  each computation's instructions, for the kernels such a call runs.
  """
  kinds, calls, members, comp = {}, {}, {}, None
  for line in hlo_text.splitlines():
    m = _HLO_INSTR.match(line)
    if not m:
      h = _HLO_COMP.match(line)
      comp = h.group(1) if h else comp
      continue
    name, rhs = m.groups()
    members.setdefault(comp, []).append(name)
    target = re.search(r'custom_call_target="([^"]+)"', rhs)
    fusion = re.search(r'"kind":\s*"([^"]+)"', rhs)
    if target:
      kinds[name] = _library(target.group(1)) or 'other'
    elif re.search(r'\bfusion\(', rhs) and fusion:
      kinds[name] = _library(fusion.group(1)) or (
          'CUTLASS' if fusion.group(1) == '__custom_fusion' and
          'cutlass' in rhs.lower() else 'XLA fusion')
    else:
      kinds[name] = 'XLA fusion'
      call = re.search(r'\bcall\(.*to_apply=%?([\w.\-]+)', rhs)
      if call:
        calls[name] = call.group(1)
  return kinds, calls, members


def _hlo_op(args: dict) -> str | None:
  if args.get('hlo_op'):
    return str(args['hlo_op'])
  for value in args.values():   # An annotation: 'Thunk:#hlo_op=...#'.
    m = re.search(r'hlo_op=([^,#\s]+)', str(value))
    if m:
      return m.group(1)
  return None


def _norm(name: str) -> str:
  return re.sub(r'[.\-]', '_', name.lower())


def classify_xla_kernels(kernels: list[dict],
                         hlo_text: str) -> list[tuple[str, str, float]]:
  """(name, kind, ms) of each kernel {name, ms, args} of a jax.profiler
  trace, by the HLO op its args name (`hlo_op`, or an annotation holding
  `hlo_op=`) in the module's text (hlo_index); a command buffer's kernel by
  the member named like it; 'unattributed' where neither is there."""
  kinds, calls, members = hlo_index(hlo_text)
  out = []
  for k in kernels:
    op = _hlo_op(k.get('args') or {})
    kind = kinds.get(op)
    if op in calls:
      kind = next((kinds[m] for m in members.get(calls[op], ())
                   if _norm(m) == _norm(k['name'])), None)
    out.append((k['name'], kind or 'unattributed', k['ms']))
  return out


_CUBLAS_OPS = {'aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm',
               'aten::addbmm', 'aten::_addmm_activation', 'aten::addmv',
               'aten::mv', 'aten::dot', 'aten::_scaled_mm', 'aten::_int_mm',
               'aten::matmul', 'aten::linear'}
# On CUDA these convolution operators run cuDNN (cudnn enabled).
_CUDNN_OPS = {'aten::convolution', 'aten::_convolution', 'aten::conv2d',
              'aten::convolution_backward'}
_COMPILED = ('compiledfxgraph', 'compiledfunction', 'torch-compiled region',
             'inductor')


def _torch_kind(stack: list[str], launch: str) -> str | None:
  """What launched a kernel, from the CPU operators around its launch
  (outermost first) and the launching call's name."""
  for name in reversed(stack):
    low = name.lower()
    if 'cudnn' in low or low in _CUDNN_OPS:
      return 'cuDNN'
    if low in _CUBLAS_OPS:
      return 'cuBLAS'
    if low.startswith('triton'):   # Inductor's record of a kernel launch.
      return 'inductor Triton'
    if 'cutlass' in low or low.startswith('cuda_fused'):
      return 'CUTLASS'
    if low.startswith('aten::'):   # ATen's own kernels.
      return 'other'
  if launch.startswith('cuLaunch') and any(
      c in name.lower() for name in stack for c in _COMPILED):
    return 'inductor Triton'
  return None


def classify_torch_kernels(
    events: list[dict], known: dict[str, str] | None = None
) -> tuple[list[tuple[str, str, float]], dict[str, str]]:
  """(rows, learned) from a torch.profiler chrome trace's events.

  Each GPU kernel's launch (the runtime or driver call with its
  `correlation`) sits inside CPU operators on its thread; the innermost that
  says (`_torch_kind`) names the kind: aten::cudnn_* and the convolution
  operators cuDNN, aten::mm/addmm/bmm cuBLAS, an inductor kernel's launch
  record inductor Triton, other aten::* operators 'other'. Copies and memsets
  are 'other'. Kernels replayed from a CUDA graph (no launch of their own)
  and any others left take the kind the launch of a kernel of that name had
  here, or in `known` (name -> kind, from other traces), else
  'unattributed'. rows: (name, kind, ms); learned: name -> kind of the
  kernels attributed by their launch here.
  """
  launches, cpu = {}, {}
  for e in events:
    cat = str(e.get('cat', '')).lower()
    args = e.get('args') or {}
    if e.get('ph') != 'X':
      continue
    if cat in ('cuda_runtime', 'cuda_driver') and 'correlation' in args:
      launches[args['correlation']] = e
    elif cat in ('cpu_op', 'user_annotation', 'python_function'):
      cpu.setdefault((e.get('pid'), e.get('tid')), []).append(e)
  stacks = {}   # correlation -> names of the CPU events around the launch
  by_thread = {}
  for corr, e in launches.items():
    by_thread.setdefault((e.get('pid'), e.get('tid')), []).append((corr, e))
  for thread, items in by_thread.items():
    ops = sorted(cpu.get(thread, ()), key=lambda o: (o['ts'], -o['dur']))
    items.sort(key=lambda ce: ce[1]['ts'])
    open_ops, i = [], 0
    for corr, launch in items:
      t = launch['ts']
      while i < len(ops) and ops[i]['ts'] <= t:
        open_ops.append(ops[i])
        i += 1
      open_ops = [o for o in open_ops if o['ts'] + o['dur'] >= t]
      stacks[corr] = [o['name'] for o in open_ops]
  rows, learned = [], {}
  for e in events:
    cat = str(e.get('cat', '')).lower()
    if e.get('ph') != 'X' or cat not in ('kernel', 'gpu_memcpy', 'gpu_memset'):
      continue
    name, ms = e.get('name', ''), float(e.get('dur', 0)) / 1e3
    corr = (e.get('args') or {}).get('correlation')
    launch = launches.get(corr)
    kind = None
    if cat != 'kernel':
      kind = 'other'
    elif launch is not None and 'graphlaunch' not in launch['name'].lower():
      kind = _torch_kind(stacks.get(corr, []), launch['name'])
      if kind:
        learned[name] = kind
    rows.append((name, kind, ms))
  known = {**(known or {}), **learned}
  return [(n, k or known.get(n, 'unattributed'), ms)
          for n, k, ms in rows], learned


def kernel_table(rows: list[tuple[str, str, float]], steps: int) -> dict:
  """GPU ms per step by kind (KINDS), the unattributed kernels by name and
  the 12 largest kernels."""
  by_kind, by_name = dict.fromkeys(KINDS, 0.), {}
  for name, kind, ms in rows:
    by_kind[kind] += ms
    by_name[(name, kind)] = by_name.get((name, kind), 0.) + ms
  top = sorted(by_name.items(), key=lambda kv: -kv[1])
  return {'gpu_ms_per_step': sum(by_kind.values()) / steps,
          'kernels_per_step': len(rows) / steps,
          'by_kind_ms_per_step': {k: v / steps for k, v in by_kind.items()
                                  if v},
          'unattributed_ms_per_step': [(n[:120], ms / steps)
                                       for (n, k), ms in top
                                       if k == 'unattributed'][:20],
          'top_kernels_ms_per_step': [(n[:90], k, ms / steps)
                                      for (n, k), ms in top[:12]]}


def _trace_kernels(trace_dir: str) -> list[dict]:
  """The GPU kernels of a jax.profiler trace (its xplane), as {name, ms,
  args}; on a host without a GPU, XLA:CPU's thunks (those naming an op)."""
  import jax  # pylint: disable=g-import-not-at-top
  paths = [os.path.join(d, f) for d, _, fs in os.walk(trace_dir) for f in fs
           if f.endswith('.xplane.pb')]
  if not paths:
    raise FileNotFoundError(f'no xplane under {trace_dir}')
  data = jax.profiler.ProfileData.from_file(max(paths, key=os.path.getmtime))
  gpus = [p for p in data.planes if p.name.startswith('/device:GPU')]
  out = []
  for plane in gpus or [p for p in data.planes if p.name == '/host:CPU']:
    lines = list(plane.lines)
    streams = [ln for ln in lines if ln.name.startswith('Stream')]
    for line in streams or lines:
      for e in line.events:
        args = dict(e.stats)
        if gpus or 'hlo_op' in args:
          out.append({'name': e.name, 'ms': e.duration_ns / 1e6,
                      'args': args})
  return out


# --------------------------------------------------------------------------
# Workers: one process per row, compiled once, timed on command.


def _flops(cost) -> float:
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get('flops', float('nan')))


def _peak_bytes() -> int | None:
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


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
    config = our_config(spec, json.loads(args.overrides))
    mesh = runtime.create_mesh()
    shape = (spec['image_size'], spec['image_size'], 3)
    setup = step_lib.build(config, mesh, total_steps=10_000,
                           steps_per_epoch=1_000, num_examples=1_000_000,
                           image_shape=shape)
    state = setup.init_fn(jax.random.key(0))
    data = NamedSharding(mesh, P('data'))
    b = spec['batch']
    batch = {'views': jax.device_put(np.random.default_rng(0).random(
        (b, 2) + shape, np.float32), data),
             'label': jax.device_put(np.zeros(b, np.int32), data),
             'index': jax.device_put(np.arange(b, dtype=np.int32), data)}
    rng = jax.random.key(1)
    compiled = setup.step_fn.lower(state, batch, rng).compile()
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
             'loss': loss, 'device': jax.devices()[0].device_kind,
             'xla_flags': os.environ.get('XLA_FLAGS', '')}
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
      jax.block_until_ready(state)
      try:
        with jax.profiler.trace(cmd['dir']):
          for _ in range(n):
            state, metrics = compiled(state, batch, rng)
          jax.block_until_ready(metrics)
        say(kernel_table(classify_xla_kernels(_trace_kernels(cmd['dir']),
                                              compiled.as_text()), n))
      except Exception as e:  # pylint: disable=broad-except
        say({'error': f'{type(e).__name__}: {e}'[-800:]})
  return 0


class Worker:
  """A worker process speaking JSON lines (ready, then one answer a command),
  in its own process group (inductor's compile workers end with it)."""

  def __init__(self, name: str, cmd: list[str], env: dict, log_path: str):
    self.name = name
    self._log = open(log_path, 'w')  # pylint: disable=consider-using-with
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=self._log, text=True, env=env, cwd=ROOT,
        start_new_session=True)
    self._lines = queue.Queue()
    threading.Thread(target=self._pump, daemon=True).start()

  def _pump(self):
    for line in self.proc.stdout:
      if line.strip().startswith('{'):
        self._lines.put(line)
    self._lines.put(None)

  def read(self, timeout: float | None = None) -> dict:
    try:
      line = self._lines.get(timeout=timeout)
    except queue.Empty:
      self.kill()
      return {'error': f'no answer within {timeout:.0f} s', 'late': True}
    if line is not None:
      return json.loads(line)
    self.proc.wait()
    with open(self._log.name) as f:
      tail = f.read()[-1500:]
    return {'error': f'{self.name} exited ({self.proc.returncode})',
            'detail': tail}

  def ask(self, timeout: float | None = None, **cmd) -> dict:
    try:
      self.proc.stdin.write(json.dumps(cmd) + '\n')
      self.proc.stdin.flush()
    except OSError:
      pass   # It exited: read() says how.
    return self.read(timeout)

  def kill(self):
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.proc.wait()

  def close(self):
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write('{"cmd": "quit"}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        pass
    self.kill()
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
  depend on the backend (nor on the variant: the same arithmetic).
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


def _gpu_gib() -> float:
  """The GPU's memory: this process's allocator limit over its fraction (an
  H100's 80 GiB where the device does not say)."""
  import jax  # pylint: disable=g-import-not-at-top
  limit = (jax.devices()[0].memory_stats() or {}).get('bytes_limit', 0)
  fraction = float(os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', 0.75))
  return limit / fraction / 2**30 or 80.


# --------------------------------------------------------------------------
# The step parts: rows in waves, timed while nothing compiles.


class Row:
  """One measured configuration of a step part: its worker and report."""

  def __init__(self, part: str, name: str, kind: str, spec: dict,
               after: str | None = None, **info):
    self.part, self.name, self.kind, self.spec = part, name, kind, spec
    self.after, self.info = after, info
    self.share = spec['mem_gib']['peer' if kind == 'peer' else 'ours']
    self.worker, self.state, self.phase_ms = None, 'pending', []
    self.started, self.last, self.trace = 0., {}, None
    self.out = {'kind': kind, **info}   # Its entry in the report.

  def start(self, args, out_dir: str, total_gib: float | None,
            inductor_cache: str):
    # The allocator's limit: the share less the CUDA context's 1 GiB.
    fraction = min(0.9, (self.share - 1) / total_gib) if total_gib else 0.
    log_path = os.path.join(out_dir, f'{self.part}_{self.name}.log')
    if self.kind == 'peer':
      cmd = [args.torch_python, PEER, *peer_flags(self.spec),
             f'--mode={self.info["mode"]}']
      cmd += [f'--memory_fraction={fraction:.3f}'] if fraction else []
      env = _child_env(TORCHINDUCTOR_CACHE_DIR=inductor_cache)
    else:
      cmd = [sys.executable, os.path.abspath(__file__),
             f'--_worker={self.part}', f'--batch={self.spec["batch"]}',
             '--overrides=' + json.dumps(self.info.get('overrides', {}))]
      extra = ({'XLA_PYTHON_CLIENT_MEM_FRACTION': f'{fraction:.3f}'}
               if fraction else {})
      if self.info.get('xla_flags'):
        extra['XLA_FLAGS'] = ' '.join(
            [os.environ.get('XLA_FLAGS', ''), self.info['xla_flags']]).strip()
      env = _child_env(**extra)
    self.worker = Worker(f'{self.part} {self.name}',
                         cmd + (['--dry'] if args.dry else []), env, log_path)
    self.state, self.started = 'compiling', time.monotonic()

  def await_ready(self, deadline: float):
    """Waits for its worker to compile, until its cap or `deadline`."""
    cap = self.started + self.spec['compile_cap_s']
    ready = self.worker.read(
        timeout=max(1., min(cap, deadline) - time.monotonic()))
    self.out['ready'] = ready
    if 'ready' in ready:
      self.state = 'live'
      log(f'{self.part} {self.name}: ready in {ready["compile_s"]:.0f} s')
    elif 'skipped' in ready:
      self.end('skipped', ready['skipped'])
    elif ready.get('late') and deadline < cap:
      self.end('skipped', 'the time budget (--deadline_s) ran out while it '
               'compiled')
    elif ready.get('late'):
      self.end('error', f'not compiled within its '
               f'{self.spec["compile_cap_s"]} s cap')
    else:
      self.end('error', ready.get('error'))

  def time(self, steps: int) -> float | None:
    out = self.worker.ask(cmd='time', steps=steps,
                          timeout=120 + 2 * steps * self.spec['est_step_s'])
    if 'error' in out:
      self.end('error', f'timing: {out["error"]} {out.get("detail", "")}')
      return None
    self.last = out
    return 1e3 * out['seconds'] / out['steps']

  def end(self, key: str | None = None, why: str | None = None):
    if key:
      self.out[key] = why
      log(f'{self.part} {self.name}: {key}: {str(why)[:300]}')
    if self.worker is not None:
      self.worker.close()
    self.state = 'ended'


def _rows(parts: list[str], specs: dict, args) -> list[Row]:
  """Every part's rows in the order they start: r50's longest compilations
  first, then the r18 rows, then what waits (CUDA-graph modes) and the flag
  rows."""
  first, later = [], []
  for part in parts:
    spec = specs[part]
    peers = [Row(part, f'peer_{m}', 'peer', spec, mode=m,
                 after=f'peer_{after}' if after and spec['warm_siblings']
                 else None)
             for m, after in PEER_MODES.items() if m in args.peer_modes]
    if not args.torch_python:
      peers = []
    ours = [Row(part, name, 'ours', spec, overrides=o)
            for name, o in OUR_VARIANTS.items()
            if name == 'ours' or name in args.variants]
    flags = [Row(part, f'flag_{f}', 'flag', spec, overrides={},
                 xla_flags=XLA_FLAG_ROWS[f])
             for f in (args.flags if args.flags is not None
                       else spec['flags'])]
    first += [r for r in peers if not r.after] + ours
    later += [r for r in peers if r.after] + flags
  return first + later


def _alternate(rows: list[Row], rounds: int, steps: int, key: str):
  """Times `rows` round by round (one round: each row in turn), appending
  each row's ms per step to its report's `key` and this phase's list."""
  for row in rows:
    row.phase_ms = []
  for r in range(rounds):
    for row in rows:
      if row.state != 'live':
        continue
      ms = row.time(steps)
      if ms is not None:
        row.out.setdefault(key, []).append(ms)
        row.phase_ms.append(ms)
        log(f'{row.part} {key} round {r} {row.name}: {ms:.2f} ms/step')


def _quiet_phase(part: str, rows: list[Row], spec: dict, state: dict,
                 out_dir: str) -> None:
  """With every worker compiled: screens the part's new peer modes, times
  its new flag rows against `ours`, profiles its new rows, ends the flag
  rows and the slower peer modes, and once no mode is left to screen,
  alternates its variants and the fastest mode and ends what is left but
  `ours` (while flag rows are still to come)."""
  mine = [r for r in rows if r.part == part]
  live = [r for r in mine if r.state == 'live']
  new = [r for r in live if 'profile' not in r.out]
  base = next((r for r in live if r.name == 'ours'), None)
  peers = [r for r in live if r.kind == 'peer']
  if any(r in new for r in peers):
    _alternate(peers, spec['screen_rounds'], spec['screen_steps'],
               'screen_ms')
  flags = [r for r in new if r.kind == 'flag']
  if flags and base is not None:
    _alternate([base] + flags, spec['flag_rounds'], spec['steps'], 'flag_ms')
    for row in flags:
      if row.phase_ms and base.phase_ms:
        row.out['ours_ms'] = list(base.phase_ms)
        row.out['over_ours'] = (statistics.median(base.phase_ms) /
                                statistics.median(row.phase_ms))
        row.out['wins'] = row.out['over_ours'] >= FLAG_WIN
        row.out['peak_gib'] = (row.last.get('peak_bytes') or 0) / 2**30
  elif flags:
    for row in flags:
      row.end('skipped', 'no `ours` to compare with')
  for row in new:
    if row.state != 'live':
      continue
    out = row.worker.ask(cmd='profile', steps=spec['profile_steps'],
                         dir=os.path.join(out_dir, f'{part}_{row.name}_trace'),
                         timeout=300)
    row.out['profile'], row.trace = out, out.get('trace')   # The peer's.
  peers = [r for r in peers if r.state == 'live' and r.phase_ms]
  for row in flags + sorted(peers, key=lambda r: statistics.median(
      r.phase_ms))[1:]:
    row.end()
  if not state['final'] and not any(
      r.kind != 'flag' and r.state in ('pending', 'compiling') for r in mine):
    final = [r for r in mine if r.state == 'live' and r.kind != 'flag']
    if any(r.kind == 'ours' for r in final):
      _alternate(final, spec['rounds'], spec['steps'], 'step_ms_rounds')
    state['final'] = True
    for row in final:
      row.out['peak_gib'] = (row.last.get('peak_bytes') or 0) / 2**30
      if row.name != 'ours':
        row.end()
  if state['final'] and not any(r.state in ('pending', 'compiling')
                                for r in mine):
    for row in mine:
      if row.state == 'live':
        row.end()


def _reserve_s(rows: list[Row], states: dict) -> float:
  """The time the alternations still due take, by the spec's step times."""
  total = 0.
  for part, state in states.items():
    mine = [r for r in rows if r.part == part and r.state != 'ended']
    spec = mine[0].spec if mine else None
    if spec and not state['final']:
      total += (spec['rounds'] * spec['steps'] * spec['est_step_s'] *
                sum(r.kind != 'flag' for r in mine))
  return total + 40.   # And the screening and the profiles.


def _pack(pending: list[Row], rows: list[Row], free: float) -> list[Row]:
  """The next wave: pending rows in order while they fit in `free` GiB,
  those waiting on a row not yet compiled left for later."""
  by_name = {(r.part, r.name): r for r in rows}
  wave = []
  for row in pending:
    after = by_name.get((row.part, row.after))
    if after is not None and after.state in ('pending', 'compiling'):
      continue
    if row.share <= free:
      wave.append(row)
      free -= row.share
  return wave


def compare_steps(parts: list[str], args, out_dir: str,
                  peak_tflops: float | None, save) -> dict:
  """The step parts' rows, in waves; each part's report."""
  gpu = _gpu()
  specs = {p: step_spec(p, args.dry) for p in parts}
  rows = _rows(parts, specs, args)
  reports = {p: {'spec': specs[p], 'rows': {r.name: r.out for r in rows
                                            if r.part == p}} for p in parts}
  for p in parts:
    if not args.torch_python:
      reports[p]['peer'] = 'no torch interpreter'
  flops_procs = ({p: _cpu_flops(p, specs[p]['batch'], args) for p in parts}
                 if gpu else {})
  total = _gpu_gib() if gpu else None
  budget = total * 0.95 - 2 if total else max(4., os.cpu_count() or 1)
  deadline = args.t0 + args.deadline_s if args.deadline_s else float('inf')
  states = {p: {'final': False} for p in parts}
  # The peer's inductor caches: empty at first, shared by its modes.
  inductor_cache = tempfile.mkdtemp(prefix='accelerator_inductor_')
  try:
    while any(r.state == 'pending' for r in rows):
      pending = [r for r in rows if r.state == 'pending']
      live = [r for r in rows if r.state == 'live']
      wave = _pack(pending, rows, budget - sum(r.share for r in live))
      if not wave and not live:
        wave = pending[:1]   # Too large for the budget: alone, as it is.
      if not wave:   # The rows kept for a final hold the memory: unblock.
        held = {}
        for r in live:
          if not states[r.part]['final']:
            held[r.part] = held.get(r.part, 0) + r.share
        part = max(held, key=held.get) if held else None
        for row in pending:
          if row.part == part and row.kind != 'flag' or part is None:
            row.end('skipped', f'no room beside the rows kept for the '
                    f'alternation ({budget - sum(r.share for r in live):.0f}'
                    f' GiB free), which ran without it')
        if part is not None:
          _quiet_phase(part, rows, specs[part], states[part], out_dir)
        continue
      reserve = _reserve_s(rows, states)
      for row in wave:
        need = row.spec['est_compile_s'][
            'peer' if row.kind == 'peer' else 'ours']
        if time.monotonic() + need + reserve > deadline:
          row.end('skipped', 'the time budget (--deadline_s)')
        else:
          row.start(args, out_dir, total, inductor_cache)
      started = [r for r in wave if r.state == 'compiling']
      if started:
        log(f'wave: {", ".join(f"{r.part} {r.name}" for r in started)}')
      for row in started:
        row.await_ready(deadline - reserve)
      for part in parts:
        _quiet_phase(part, rows, specs[part], states[part], out_dir)
      save(reports)
  finally:
    for row in rows:
      if row.state == 'pending':
        row.out['skipped'] = 'not started'
      elif row.state != 'ended':
        row.end()
    shutil.rmtree(inductor_cache, ignore_errors=True)
  for part in parts:
    mine = [r for r in rows if r.part == part]
    try:
      reports[part].update(_summary(part, mine, specs[part], peak_tflops,
                                    flops_procs.get(part), states[part]))
    except Exception as e:  # pylint: disable=broad-except
      reports[part]['error'] = f'{type(e).__name__}: {e}'
    finally:
      if part in flops_procs:
        flops_procs[part].kill()
  return reports


def _summary(part: str, rows: list[Row], spec: dict,
             peak_tflops: float | None, flops_proc, state: dict) -> dict:
  """A part's figures: each screened mode's median, each profiled row's
  kernel table (the peer's from its trace), and each finally timed row's
  step time, views/s, MFU and speed over the fastest peer mode."""
  import gzip  # pylint: disable=g-import-not-at-top
  for row in rows:
    if row.out.get('screen_ms'):
      row.out['screen_step_ms'] = statistics.median(row.out['screen_ms'])
  traces, known = {}, {}
  for row in rows:   # The peer's traces: each kernel by its launch.
    if row.trace and os.path.exists(row.trace):
      with gzip.open(row.trace, 'rt') as f:
        trace = json.load(f)
      events = trace['traceEvents'] if isinstance(trace, dict) else trace
      traces[row.name] = classify_torch_kernels(events)
      known.update(traces[row.name][1])
  for row in rows:   # A CUDA graph's kernels as the other modes launched them.
    if row.name in traces:
      row.out['profile'] = kernel_table(
          [(n, known.get(n, k) if k == 'unattributed' else k, ms)
           for n, k, ms in traces[row.name][0]], spec['profile_steps'])
  base = next(r for r in rows if r.name == 'ours')
  if 'ready' not in base.out.get('ready', {}):
    raise RuntimeError(f'our worker: {base.out.get("ready")}')
  if not state['final']:
    raise RuntimeError('the variants were not timed against the peer')
  flops = base.out['ready']['flops_compiled']
  if flops_proc is not None:
    out, _ = flops_proc.communicate(timeout=900)
    flops = json.loads(out.strip().splitlines()[-1])['flops']
  views = 2 * spec['batch']

  def figures(ms: float, prefix: str = '') -> dict:
    tflops = flops / ms * 1e3 / 1e12
    return {f'{prefix}step_ms': ms, f'{prefix}images_per_s': views / ms * 1e3,
            f'{prefix}tflops': tflops,
            f'{prefix}mfu': tflops / peak_tflops if peak_tflops else None}

  timed = [r for r in rows if r.out.get('step_ms_rounds')]
  peers = [r for r in timed if r.kind == 'peer']
  for row in rows:   # The final alternation's, else the flag rows' and the
    # screening's figures.
    if row.out.get('step_ms_rounds'):
      row.out.update(figures(statistics.median(row.out['step_ms_rounds'])))
    elif row.out.get('flag_ms'):
      row.out.update(figures(statistics.median(row.out['flag_ms']), 'flag_'))
    elif row.out.get('screen_ms'):
      row.out.update(figures(row.out['screen_step_ms'], 'screen_'))
  for row in timed:
    if peers and row.kind == 'ours':
      row.out['over_fastest_peer'] = (peers[0].out['step_ms'] /
                                      row.out['step_ms'])
  out = {'flops_per_step': flops, 'flops_per_image_fwd_bwd': flops / views,
         'fastest_peer': peers[0].name if peers else None}
  if peers and 'over_fastest_peer' in base.out:
    out['ours_over_peer'] = base.out['over_fastest_peer']
  return out


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


def _step_lines(part: str, r: dict) -> list[str]:
  """A step part's lines: the timed rows, the peer modes, the flag rows,
  the kernel time by kind of each profiled row."""
  lines, rows = [], r.get('rows', {})
  for name, x in rows.items():
    if 'step_ms_rounds' in x and 'step_ms' in x:
      mfu = f', MFU {100 * x["mfu"]:.1f}%' if x.get('mfu') else ''
      over = (f', {x["over_fastest_peer"]:.2f}x the fastest peer'
              if 'over_fastest_peer' in x else '')
      lines.append(f'{part:<7} {name:<14} batch {r["spec"]["batch"]}: '
                   f'{x["step_ms"]:.1f} ms/step, {x["images_per_s"]:,.0f} '
                   f'views/s{mfu}, peak {x["peak_gib"]:.1f} GiB{over}')
  for name, x in rows.items():
    why = x.get('error') or x.get('skipped')
    if x['kind'] == 'peer':
      compile_s = (x.get('ready') or {}).get('compile_s')
      mfu = (f' (MFU {100 * x["screen_mfu"]:.1f}%)' if x.get('screen_mfu')
             else '')
      what = (f'screened {x["screen_step_ms"]:.1f} ms/step{mfu}'
              if 'screen_step_ms' in x else f'not timed: {why}')
      lines.append(f'{part:<7} {name:<14} {what[:150]}' + (
          f', compiled in {compile_s:.0f} s' if compile_s else ''))
    elif x['kind'] == 'flag':
      mfu = f', MFU {100 * x["flag_mfu"]:.1f}%' if x.get('flag_mfu') else ''
      lines.append(f'{part:<7} {name:<14} ' + (
          f'{statistics.median(x["flag_ms"]):.2f} ms/step against ours '
          f'{statistics.median(x["ours_ms"]):.2f}: {x["over_ours"]:.3f}x, '
          + ('wins' if x['wins'] else 'not kept') + mfu
          if 'over_ours' in x else f'not timed: {str(why)[:150]}'))
  for name, x in rows.items():
    kinds = (x.get('profile') or {}).get('by_kind_ms_per_step')
    if kinds is not None:
      lines.append(f'{part:<7} {name:<14} kernel ms/step: ' + (', '.join(
          f'{k} {v:.2f}' for k, v in sorted(kinds.items(),
                                            key=lambda kv: -kv[1]))
                                                               or 'none'))
  return lines


def _table(report: dict) -> str:
  lines = ['', 'part    result']
  peak = report.get('peak', {})
  if 'measured_tflops' in peak:
    lines.append(f'peak    {peak["device_kind"]}: bf16 matmul '
                 f'{peak["measured_tflops"]:.0f} TFLOP/s measured, '
                 f'{peak["datasheet_bf16_tflops"]} datasheet')
  for part in ('r50', 'r18'):
    lines += _step_lines(part, report.get(part, {}))
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
  parser.add_argument('--preset', default='', choices=['', *PRESETS],
                      help='Named options (PRESETS): bn, the pending GPU '
                      'rows: ' + PRESETS['bn'])
  parser.add_argument('--peer_modes', default=','.join(PEER_MODES),
                      help='torch.compile modes of the peer rows.')
  parser.add_argument('--variants', default=','.join(OUR_VARIANTS),
                      help=f'Our variants (`ours` always): '
                      f'{", ".join(OUR_VARIANTS)}.')
  parser.add_argument('--flags', default=None,
                      help=f'Flag rows, of {", ".join(XLA_FLAG_ROWS)}, or '
                      '"none" (default: each part\'s, none with --dry).')
  parser.add_argument('--deadline_s', type=float, default=0.,
                      help='Start no wave of step rows that would end the '
                      'step parts later than this many seconds after the '
                      'start (0: no limit).')
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
  parser.add_argument('--overrides', default='{}', help=argparse.SUPPRESS)
  started = time.monotonic()
  args = parser.parse_args()
  if args.preset:   # Its options first: those given override them.
    args = parser.parse_args(PRESETS[args.preset].split() + sys.argv[1:])
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
  args.peer_modes = [m for m in args.peer_modes.split(',') if m]
  args.variants = [v for v in args.variants.split(',') if v]
  if args.flags is not None:
    args.flags = [f for f in args.flags.split(',') if f not in ('', 'none')]
  for given, known in ((args.peer_modes, PEER_MODES),
                       (args.variants, OUR_VARIANTS),
                       (args.flags or (), XLA_FLAG_ROWS)):
    if set(given) - set(known):
      parser.error(f'unknown {sorted(set(given) - set(known))}; known: '
                   f'{", ".join(known)}')
  args.t0 = started
  # A time-out's SIGTERM unwinds: the workers end, the report stays.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
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
            'torch_python': args.torch_python or None,
            'options': {k: getattr(args, k) for k in (
                'preset', 'parts', 'peer_modes', 'variants', 'flags',
                'deadline_s')}}
  import jax  # pylint: disable=g-import-not-at-top
  report['backend'] = jax.default_backend()
  report['devices'] = [d.device_kind for d in jax.devices()]
  path = os.path.join(args.out, 'accelerator.json')

  def save(update: dict | None = None):
    report.update(update or {})
    with open(path, 'w') as f:
      json.dump(report, f, indent=1, default=str)

  peak_tflops = None
  steps = [p for p in parts if p in STEP_PARTS]   # These run together.
  for part in parts:
    if part in steps[1:]:
      continue
    log(f'part {part} ...')
    t0 = time.perf_counter()
    try:
      if part == 'peak':
        report[part] = matmul_peak(args)
        peak_tflops = report[part]['datasheet_bf16_tflops']
      elif part in STEP_PARTS:
        report.update(compare_steps(steps, args, args.out, peak_tflops,
                                    save))
      elif part == 'e2e':
        report[part] = end_to_end(args, args.out)
      elif part == 'tests':
        report[part] = run_tests(args, args.out)
      elif part == 'input':
        report[part] = input_rate(args, args.out)
      elif part == 'stream':
        report[part] = stream(args, args.out)
    except Exception as e:  # pylint: disable=broad-except
      for done in (steps if part in STEP_PARTS else [part]):
        report[done] = {'error': f'{type(e).__name__}: {e}',
                        'traceback': traceback.format_exc()[-3000:]}
    for done in (steps if part in STEP_PARTS else [part]):
      report.setdefault(done, {})['part_s'] = time.perf_counter() - t0
    log(f'part {part}: {report[part]["part_s"]:.0f} s')
    save()
  print(_table(report), flush=True)
  print(f'report: {path}', flush=True)
  return 1 if any(isinstance(r, dict) and 'error' in r
                  for r in report.values()) else 0


if __name__ == '__main__':
  sys.exit(main())
