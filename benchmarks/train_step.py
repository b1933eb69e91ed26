r"""Train-step throughput and MFU of the default model and of ResNet-18.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py          # table
    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py --profile
    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py \
        --xla_flags=--xla_cpu_use_fusion_emitters=false   # an XLA flag's A/B
    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py \
        --threads=8 --peer_devices=8        # XLA:CPU's own pool size's A/B
    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py \
        --override=model.fused_bn=False     # a config field's A/B
    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py --ops

What is measured. Every row runs in a fresh subprocess, because the number of
virtual CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N) must
be set before jax is imported. A row builds the step exactly as
`contrastive_jax/train.py` does (`models.create_model`,
`step_lib.build`: `step_lib.train_step` with the configured method and loss, jitted
with the state's shardings, batch sharded over 'data', the state donated),
compiles it, then times `--steps` steps after 2
warm-up steps on fixed random views (the augmentation is not part of the
step, as in train.py where it is a separate jitted function).

* images/s counts instances (each has 2 views), like train.py's log line.
* Model FLOPs per step come from XLA's cost analysis of the 1-device
  executable (`jitted.lower(...).compile().cost_analysis()['flops']`): the work
  of one step of the model, whatever the device count (an SPMD executable
  reports the per-device share, printed for reference).
* MFU = model FLOPs / step time / peak, with the peak measured here as the
  best of several 2048^3 float32 matmuls on one device (XLA's CPU matmul
  already uses every core, so this is the machine's peak, not a core's).

The machine is shared (2 cores, other jobs running): the load average is
printed before and after, and timings are the median of the timed steps.

`--peer` (the comparison the project is held to): the default step on
`--peer_devices` devices and the PyTorch peer of the same step
(`benchmarks/torch_default_step.py`: the same SmallCNN, head, NT-Xent
and AdamW; its best of NCHW and channels-last), alternated for `--rounds`
rounds in one run, each in a fresh process; prints both img/s per round,
their medians and ours / peer. The peer runs from a separate interpreter
with torch (`--torch_python`; the project does not install torch):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    PYTHONPATH=. .venv/bin/python benchmarks/train_step.py --peer

With `--override=field=value` beside `--peer`, ours with that field set
runs in every round as a third column: the ratio before and after a change
behind a config switch, in one run (model.fused_bn=False: the step before
the fused BatchNorm). `--ops` times the fused BatchNorm and the stem
max-pool alone against the ops they replace (`run_ops`).

`--peer` ends with the peer's step profiled (torch.profiler, channels-last):
the time of its convolutions, oneDNN's forward and backward kernels, the
fastest this machine has, bounds what any step built from them can reach.
2026-11-26 (nothing else of ours running, load average 1-2):

    round     ours img/s  peer img/s  ours/peer
    median           376         507      0.74x
    ours: 61.3 GFLOP/step, MFU 29.0% of the measured matmul peak (155 GFLOP/s)
    peer (channels-last, profiled): step 1093 ms, of which its convolutions
    593 ms; ours/peer with convolutions as fast as these and the rest of the
    step free would be 1.84x; 1.5x needs a step of 728 ms, i.e. such
    convolutions and the rest in 135 ms (the peer's rest: 500 ms)

So the issue's 1.5x asks for convolutions as fast as oneDNN's (ours, through
XLA:CPU, took 1.18 s to its ~0.45-0.6 s in the profiles below) and for BN,
ReLU, pooling, head, loss and AdamW 3.7x faster than PyTorch's, which ours
already match (~440 ms). Not reached; the figure of the day is the ratio.

`--profile` breaks the default 1-device step down: forward only, forward +
loss, forward + backward, the full step; the full step's XLA ops traced
(jax.profiler) and summed by model layer; then each SmallCNN stage's conv,
BN + ReLU and max-pool, forward + backward against a random cotangent, in
isolation at the step's shapes, next to the alternatives they replaced.

Where the step's time goes (`--profile`, 2026-11-25, 1 device, the study
running niced beside it; the traced ops sum to 1.62 s): the convolutions are
1.18 s of it, backward 666 ms (conv1 291, conv2 205, conv3 113, conv0 57)
and forward 513 ms (conv1 181, conv2 153, conv0 117, conv3 62); ReLU +
max-pool 197 ms, BN 195 ms, the loss, the head and AdamW together 44 ms.
In the backward, rebuilding the im2col patches (9 pad+slice copies and a
concatenate per conv) is ~340 ms, the two patch matmuls most of the rest.
XLA:CPU (jax 0.10.2) runs the forward convolutions and the matmuls through
YNNPACK fusions (`ynn_fusion`) at 40-70 GFLOP/s, a quarter to under half of
the matmul peak measured that day (162 GFLOP/s).

Tried for the step on 2026-11-25, each in the 2-device step alternated with
the shipped code, none a gain beyond the run-to-run noise (~10% here):
im2col + matmul in the forward too, patches saved for the backward (1.62 s
vs 1.32 s); patches from `lax.conv_general_dilated_patches` (13.8 s: a
grouped convolution); patches stacked on a new axis (1.43 vs 1.33); the
padding behind an optimization barrier so the slices are plain copies
(medians 1.25 vs 1.26); the kernel gradient as 9 matmuls on shifted slices,
no patches (1.42 vs 1.26); the input gradient as a forward convolution with
the flipped kernel (1.31 vs 1.26); conv0 (1 input channel) as 9 fused
multiply-adds (1.76 vs 1.33); max-pool before ReLU (the same values; 1.39
vs 1.37). Winograd F(2x2, 3x3) (16 batched matmuls, 2.25x fewer
multiplies, the transforms as adds of contiguous slices, autodiff; the same
values to 4e-5), each conv's forward + backward at 1,024 images against the
shipped conv on 2026-11-25 (study running): conv0 1046 vs 271 ms, conv1 716
vs 527, conv2 484 vs 448, conv3 320 vs 214; its forward alone conv1 299 vs
199, conv2 175 vs 172: at these channel counts the transforms' memory
traffic costs more than the multiplies saved. XLA:CPU flags, `--xla_flags`
A/B (2 devices, 3 rounds, the study running niced beside it, load ~9):
`--xla_cpu_use_thunk_runtime=false` median 1.16x but rounds 0.92-1.17x
(and a no-op: jaxlib 0.10.2 keeps the flag only to say it is "no longer
supported", so this row is the noise of the day),
`--xla_cpu_enable_concurrency_optimized_scheduler=true` 0.99x (0.97-1.14),
`--xla_cpu_use_fusion_emitters=false` 0.95x (0.87-1.11): noise. Earlier:
oneDNN (`--xla_cpu_use_onednn`,
`--xla_cpu_experimental_onednn_custom_call`: no custom call is emitted) and
YNNPACK fusion types (`--xla_cpu_experimental_ynn_fusion_type`), no change.
"""

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (label, model, devices, batch instances). 'default' is the step of
# configs/base.py, the one torch_default_step.py mirrors: its head reads the
# map's global average, the 256-d vector configs/default.py's encoder
# returns, so the default job's step does the same work (at batch 256).
ROWS = [
    ('default', 'default', 1, 512),
    ('default', 'default', 8, 512),
    ('default', 'default', 16, 512),
    ('resnet18-cifar', 'resnet18', 1, 64),
]
# label -> (model, batch) of each row (the step of --override and alike).
STEPS = {label: (model, batch) for label, model, _, batch in ROWS}


def _worker_setup(devices: int, xla_flags: str = ''):
  os.environ['XLA_FLAGS'] = (
      f'--xla_force_host_platform_device_count={devices} {xla_flags}').strip()
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  sys.path.insert(0, ROOT)


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):     # older jax: one dict per program
    cost = cost[0]
  return float(cost.get('flops', float('nan')))


def _timed(fn, *args, steps: int) -> list[float]:
  import jax  # pylint: disable=g-import-not-at-top
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return times


def _config(model: str, batch: int, num_views: int = 2,
            overrides: dict | None = None):
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.batch_size = batch
  config.augment.num_views = num_views
  if model == 'resnet18':
    config.model.encoder = 'resnet18'
    config.model.encoder_kwargs = {'stem': 'cifar'}
  config.update_from_flattened_dict(overrides or {})
  return config


def _image_shape(model: str):
  return (32, 32, 3) if model == 'resnet18' else (28, 28, 1)


def _build(config, mesh, model: str):
  """step_lib.build(config) exactly as train.py calls it."""
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top
  from contrastive_jax import optim  # pylint: disable=g-import-not-at-top
  # Fashion-MNIST: 60k / 512 = 117 steps per epoch, 4 epochs. The schedule
  # only sets lr values, not the cost of a step.
  steps_per_epoch = 60_000 // config.batch_size
  return step_lib.build(config, mesh,
                     total_steps=int(config.num_epochs * steps_per_epoch),
                     steps_per_epoch=steps_per_epoch, num_examples=60_000,
                     image_shape=_image_shape(model))


def run_peak() -> dict:
  """Best-of-N GFLOP/s of a 2048^3 float32 matmul on one device."""
  _worker_setup(1)
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  n = 2048
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  mm = jax.jit(lambda x, y: x @ y)
  jax.block_until_ready(mm(a, b))
  best = min(_timed(mm, a, b, steps=8))
  return {'peak_gflops': 2 * n**3 / best / 1e9}


def run_step(model: str, devices: int, batch: int, steps: int,
             num_views: int = 2, xla_flags: str = '', threads: int = 0,
             overrides: dict | None = None) -> dict:
  """Times the configured train step; see the module docstring.

  overrides: config fields to set, {'model.fused_bn': False}.

  threads: XLA:CPU's pool size instead of the one contrastive_jax's import
  sets (runtime.size_cpu_thread_pools), e.g. the number of devices, XLA's
  own default on a machine of fewer cores; 0 keeps the shipped size.
  """
  _worker_setup(devices, xla_flags)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top
  from contrastive_jax import optim  # pylint: disable=g-import-not-at-top
  if threads:   # After the import sized the pools, before the backend starts.
    os.environ['PJRT_NPROC'] = str(threads)

  assert jax.device_count() == devices, jax.devices()
  config = _config(model, batch, num_views, overrides)
  mesh = runtime.create_mesh()
  setup = _build(config, mesh, model)
  init_fn, step_fn = setup.init_fn, setup.step_fn
  shape = _image_shape(model)
  state = init_fn(jax.random.key(0))
  data_sharding = NamedSharding(mesh, P('data'))
  views = {
      'views': jax.device_put(np.random.default_rng(0).random(
          (batch, config.augment.num_views) + shape, np.float32),
                               data_sharding),
      'label': jax.device_put(np.zeros(batch, np.int32), data_sharding),
      'index': jax.device_put(np.arange(batch, dtype=np.int32),
                              data_sharding)}
  rng = jax.random.key(1)
  t0 = time.perf_counter()
  compiled = step_fn.lower(state, views, rng).compile()
  compile_s = time.perf_counter() - t0
  flops_per_device = _flops(compiled)
  for _ in range(2):
    state, metrics = compiled(state, views, rng)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, views, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  assert np.isfinite(float(metrics['loss']))
  return {'step_s': float(np.median(times)), 'min_step_s': min(times),
          'compile_s': compile_s, 'flops_per_device': flops_per_device}


def run_profile(steps: int) -> dict:
  """Breaks the default 1-device step into phases and per-stage ops."""
  _worker_setup(1)
  import functools  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from contrastive_jax import losses  # pylint: disable=g-import-not-at-top
  from contrastive_jax import models  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top
  from contrastive_jax import optim  # pylint: disable=g-import-not-at-top

  config = _config('default', 512)
  mesh = runtime.create_mesh()
  setup = _build(config, mesh, 'default')
  net, init_fn, step_fn = setup.model, setup.init_fn, setup.step_fn
  loss_fn = functools.partial(losses.apply, config.loss,
                              **setup.loss.kwargs)
  b, v = config.batch_size, config.augment.num_views
  views = jnp.asarray(np.random.default_rng(0).random(
      (b, v, 28, 28, 1), np.float32))
  flat = views.reshape((b * v, 28, 28, 1))
  state = init_fn(jax.random.key(0))
  batch = {'views': views, 'label': jnp.zeros(b, jnp.int32),
           'index': jnp.arange(b, dtype=jnp.int32)}

  def fwd(params, x):
    out, _ = net.apply({'params': params, 'batch_stats': state.batch_stats},
                       x, train=True, mutable=['batch_stats'])
    return out['projection']

  def fwd_loss(params, x):
    return loss_fn(losses.LossInputs(fwd(params, x).reshape(b, v, -1)))[0]

  phases = {
      'forward (train mode)': (jax.jit(fwd), (state.params, flat)),
      'forward + loss': (jax.jit(fwd_loss), (state.params, flat)),
      'forward + backward': (jax.jit(jax.grad(fwd_loss)),
                             (state.params, flat)),
      # Not donated here (the state is reused); train.py donates it.
      'full step (+ adamw)': (jax.jit(lambda s, bt, r: step_fn(s, bt, r)),
                              (state, batch, jax.random.key(1))),
  }
  out = {'phases': {}, 'layers': {}}
  for name, (fn, args) in phases.items():
    jax.block_until_ready(fn(*args))
    out['phases'][name] = float(np.median(_timed(fn, *args, steps=steps)))

  out['by_op'] = _step_time_by_op(step_fn, (state, batch, jax.random.key(1)))

  # Each SmallCNN stage in isolation, forward + backward at the shapes of
  # the default step (1024 images), against a random cotangent: with sum()'s
  # constant one XLA simplifies the gradient's convolutions away. The first
  # row of each op is what models.SmallCNN runs; indented rows are the
  # alternatives it replaced.
  widths = config.model.encoder_kwargs.widths
  hw, cin = 28, 1
  rng = np.random.default_rng(1)

  def vjp_time(f, *args):
    """Median time of grad of <f(*args), ct> w.r.t. every arg, ct random."""
    ct = jnp.asarray(rng.standard_normal(jax.eval_shape(f, *args).shape,
                                         np.float32))
    grad = jax.jit(jax.grad(lambda ct, *a: jnp.vdot(f(*a), ct),
                            argnums=tuple(range(1, len(args) + 1))))
    jax.block_until_ready(grad(ct, *args))
    return float(np.median(_timed(grad, ct, *args, steps=steps)))

  for i, w in enumerate(widths):
    x = jnp.asarray(rng.random((b * v, hw, hw, cin), np.float32))
    conv = nn.Conv(w, (3, 3), use_bias=False,
                   conv_general_dilated=models.cpu_conv)
    xla_conv = nn.Conv(w, (3, 3), use_bias=False)
    cp = conv.init(jax.random.key(0), x)
    y = conv.apply(cp, x)
    bn = nn.BatchNorm(use_running_average=False, momentum=0.9)
    bp = bn.init(jax.random.key(0), y)
    ops = {
        f'stage{i} conv 3x3 {cin}->{w} @{hw}px': (conv.apply, cp, x),
        f'  (stage{i} alternative: XLA conv, autodiff)':
            (xla_conv.apply, cp, x),
        f'stage{i} BN+ReLU {w}ch @{hw}px': (
            lambda p, y, bn=bn: nn.relu(
                bn.apply(p, y, mutable=['batch_stats'])[0]), bp, y)}
    if i < len(widths) - 1:
      ops[f'stage{i} max-pool 2x2 {w}ch @{hw}px'] = (models.max_pool_2x2, y)
      ops[f'  (stage{i} alternative: nn.max_pool)'] = (
          lambda y: nn.max_pool(y, (2, 2), strides=(2, 2)), y)
      ops[f'  (stage{i} alternative: nn.avg_pool)'] = (
          lambda y: nn.avg_pool(y, (2, 2), strides=(2, 2)), y)
    for name, (f, *args) in ops.items():
      out['layers'][name] = vjp_time(f, *args)
    hw, cin = (hw // 2 if i < len(widths) - 1 else hw), w
  return out


def run_ops(steps: int, rounds: int) -> dict:
  """The encoders' BatchNorm and stem max-pool, forward + backward in
  isolation on one device, against what they replace, alternated.

  BN rows: training-mode BatchNorm + ReLU (+ the residual add where a ResNet
  block ends) at the small CNN's four stages (the default step's 1,024
  views) and at ResNet-50 stage shapes (batch 32), fused
  (`batch_norm.BatchNorm`, the textbook backward) vs nn.BatchNorm + add +
  nn.relu by autodiff. Pool rows: the ResNets' ImageNet-stem 3x3/2 max-pool
  (`models.max_pool_3x3_s2`, a mask-built gradient) vs nn.max_pool
  (select-and-scatter), at ResNet-50's stem output for batch 32. Each row is
  the best of `steps` calls per round, the median over `rounds` rounds.
  """
  _worker_setup(1)
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from contrastive_jax import batch_norm  # pylint: disable=g-import-not-at-top
  from contrastive_jax import models  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)

  def grad_fn(f, shape, with_residual):
    """Jitted grad of <f(x, r), ct> w.r.t. x (and r), ct random."""
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    r = (jnp.asarray(rng.standard_normal(shape), jnp.float32)
         if with_residual else None)
    ct = jnp.asarray(rng.standard_normal(jax.eval_shape(f, x, r).shape),
                     jnp.float32)
    g = jax.jit(jax.grad(lambda x, r: jnp.vdot(f(x, r), ct),
                         argnums=(0, 1) if with_residual else 0))
    return lambda: g(x, r)

  def bn(fused):
    def f(x, r):
      module = batch_norm.BatchNorm(fused=fused)
      variables = module.init(jax.random.key(0), x)
      return module.apply(variables, x, residual=r, relu=True,
                          mutable=['batch_stats'])[0]
    return f

  def flax_bn(x, r):
    y = nn.BatchNorm(use_running_average=False, momentum=0.9).apply(
        {'params': {'scale': jnp.ones(x.shape[-1]),
                    'bias': jnp.zeros(x.shape[-1])},
         'batch_stats': {'mean': jnp.zeros(x.shape[-1]),
                         'var': jnp.ones(x.shape[-1])}},
        x, mutable=['batch_stats'])[0]
    return nn.relu(y if r is None else r + y)

  cases = []
  for shape in ((1024, 28, 28, 32), (1024, 14, 14, 64), (1024, 7, 7, 128),
                (1024, 3, 3, 256)):
    cases.append((f'BN+ReLU {shape}', shape, False, bn(True), flax_bn))
  for shape in ((32, 56, 56, 256), (32, 14, 14, 1024)):
    cases.append((f'BN+add+ReLU {shape}', shape, True, bn(True), flax_bn))
  cases.append(('max-pool 3x3/2 (32, 112, 112, 64)', (32, 112, 112, 64),
                False, lambda x, r: models.max_pool_3x3_s2(x, 1),
                lambda x, r: nn.max_pool(x, (3, 3), strides=(2, 2),
                                         padding=((1, 1), (1, 1)))))
  out = {}
  for name, shape, res, ours, theirs in cases:
    fns = [grad_fn(ours, shape, res), grad_fn(theirs, shape, res)]
    for fn in fns:
      jax.block_until_ready(fn())
    times = [[], []]
    for _ in range(rounds):
      for i, fn in enumerate(fns):
        times[i].append(min(_timed(fn, steps=steps)))
    out[name] = [float(np.median(t)) for t in times]
  return out


def _step_time_by_op(step_fn, args, steps: int = 3) -> dict[str, float]:
  """Seconds per step of each part of the compiled step, from a trace.

  Runs `steps` steps under `jax.profiler.trace` (Perfetto JSON), sums each
  XLA op's time and files it under the model layer of its `op_name`
  metadata ('fwd encoder/conv1', 'bwd encoder/bn1', ...; 'bwd' is the
  transpose, i.e. the gradient; ops outside a named layer, ReLU and
  max-pool, under 'fwd encoder' / 'bwd encoder'). Ops run in parallel on the
  two cores count in full, so the parts can add up to more than the step.
  """
  import gzip  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  compiled = step_fn.lower(*args).compile()
  part_of = {}
  for m in re.finditer(r'%([\w.-]+) = .*?op_name="([^"]*)"',
                       compiled.as_text()):
    name, op_name = m.groups()
    kind = 'bwd' if 'transpose(' in op_name else 'fwd'
    layer = re.search(r'ContrastiveModel\)+/((?:encoder|head)(?:/[a-z]+\d+)?)',
                      op_name)
    part_of[name] = (f'{kind} {layer.group(1)}' if layer else
                     'loss, optimizer, other')
  state, batch, rng = args
  state, _ = compiled(state, batch, rng)            # args are donated
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(steps):
        state, metrics = compiled(state, batch, rng)
      jax.block_until_ready(metrics)
    (trace,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs
                if f.endswith('.trace.json.gz')]
    with gzip.open(trace) as f:
      events = json.load(f)['traceEvents']
  seconds = {}
  for e in events:
    part = part_of.get(e.get('name'))
    if e.get('ph') == 'X' and part:
      seconds[part] = seconds.get(part, 0.) + e['dur'] * 1e-6 / steps
  return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


def _subprocess(args: list[str]) -> dict:
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), '--worker'] + args,
      capture_output=True, text=True, cwd=ROOT, check=False)
  if proc.returncode:
    raise RuntimeError(f'worker {args} failed:\n{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


PEER_SCRIPT = os.path.join(ROOT, 'benchmarks', 'torch_default_step.py')
TORCH_PYTHON = '/tmp/torchvenv/bin/python'


def run_peer(torch_python: str, batch: int, steps: int) -> float:
  """The PyTorch peer's best img/s (NCHW or channels-last), fresh process."""
  proc = subprocess.run([torch_python, PEER_SCRIPT, str(batch), str(steps)],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f'the PyTorch peer failed:\n{proc.stderr[-3000:]}')
  best = [l for l in proc.stdout.splitlines() if l.startswith('torch best')]
  return float(best[-1].split(',')[-1].split()[0])


# The peer's step in its faster layout (channels-last), traced by
# torch.profiler: the self time of its convolution ops (oneDNN's forward and
# backward kernels) against the whole step. Run by the torch interpreter.
_PEER_PROFILE = r"""
import json, statistics, sys, time
sys.argv = ['peer', sys.argv[1], '1']
sys.path.insert(0, %r)
import torch, torch_default_step as peer
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
model = peer.SmallCNN().to(memory_format=torch.channels_last)
x = torch.rand(2 * peer.B, 1, 28, 28).to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(model.parameters(), 1e-3, weight_decay=1e-4)
def step():
  _, z = model(x)
  loss = peer.ntxent(z, peer.B)
  opt.zero_grad(set_to_none=True)
  loss.backward()
  opt.step()
for _ in range(2):
  step()
times = []
for _ in range(5):
  t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
with profile(activities=[ProfilerActivity.CPU]) as prof:
  for _ in range(3):
    step()
ops = {e.key: e.self_cpu_time_total / 3e6 for e in prof.key_averages()}
conv = sum(v for k, v in ops.items() if 'convolution' in k)
print(json.dumps({'step_s': statistics.median(times), 'conv_s': conv,
                  'traced_s': sum(ops.values())}))
"""


def run_peer_profile(torch_python: str, batch: int) -> dict:
  """The peer's step time and its convolutions' share (`_PEER_PROFILE`)."""
  code = _PEER_PROFILE % os.path.dirname(PEER_SCRIPT)
  proc = subprocess.run([torch_python, '-c', code, str(batch)],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f'the peer profile failed:\n{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _overrides(args) -> dict:
  """--override key=value flags as {key: literal value}."""
  return dict((k, ast.literal_eval(v))
              for k, v in (o.split('=', 1) for o in args.override))


def compare_with_peer(args) -> None:
  """Ours and the PyTorch peer alternated; prints img/s and the ratio.

  With `--override`, ours with those config fields set runs in each round
  too (e.g. model.fused_bn=False: the step before the fused BatchNorm).
  """
  missing = [p for p in (PEER_SCRIPT, args.torch_python)
             if not os.path.exists(p)]
  if missing:
    sys.exit(f'--peer needs {" and ".join(missing)}; create the interpreter '
             f'with: python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip'
             f' install torch==2.13.0 numpy')
  batch = 512
  variant = _overrides(args)
  print(f'\nDefault step, batch {batch} x 2 views of 28x28x1: ours on '
        f'{args.peer_devices} CPU devices vs the PyTorch peer (best layout), '
        f'alternated, {args.steps} timed steps each'
        + (f'; "variant": ours with {variant}' if variant else ''))
  print(f'{"round":<8}{"ours img/s":>12}'
        + (f'{"variant":>10}' if variant else '')
        + f'{"peer img/s":>12}{"ours/peer":>11}'
        + (f'{"variant/peer":>14}' if variant else ''))
  ours, other, peer = [], [], []

  def ours_img_s(overrides):
    res = _subprocess(['--job', json.dumps(
        {'kind': 'step', 'model': 'default', 'devices': args.peer_devices,
         'batch': batch, 'steps': args.steps, 'overrides': overrides})])
    return batch / res['step_s']

  def row(label, o, v, p):
    return (f'{label:<8}{o:>12.0f}' + (f'{v:>10.0f}' if variant else '')
            + f'{p:>12.0f}{o / p:>10.2f}x'
            + (f'{v / p:>13.2f}x' if variant else ''))

  for r in range(args.rounds):
    ours.append(ours_img_s({}))
    other.append(ours_img_s(variant) if variant else float('nan'))
    peer.append(run_peer(args.torch_python, batch, args.steps))
    print(row(str(r + 1), ours[-1], other[-1], peer[-1]), flush=True)
  o, p = statistics.median(ours), statistics.median(peer)
  print(row('median', o, statistics.median(other) if variant else 0., p))
  peak = _subprocess(['--job', json.dumps({'kind': 'peak'})])['peak_gflops']
  # The model's FLOPs from the 1-device executable (as the table's MFU).
  flops = _subprocess(['--job', json.dumps(
      {'kind': 'step', 'model': 'default', 'devices': 1, 'batch': batch,
       'steps': 1})])['flops_per_device']
  mfu = flops * o / batch / (peak * 1e9)
  print(f'ours: {flops / 1e9:.1f} GFLOP/step, MFU {100 * mfu:.1f}% '
        f'of the measured matmul peak ({peak:.0f} GFLOP/s, 2048^3 float32)')
  # What the 1.5x target asks of the convolutions: the peer's own (oneDNN)
  # set a floor on any step built from kernels this fast.
  prof = run_peer_profile(args.torch_python, batch)
  step, conv = prof['step_s'], prof['conv_s']
  print(f'peer (channels-last, profiled): step {1e3 * step:.0f} ms, of which '
        f'its convolutions (forward + backward, oneDNN) {1e3 * conv:.0f} ms; '
        f'ours/peer with convolutions as fast as these and the rest of the '
        f'step free would be {step / conv:.2f}x; 1.5x needs a step of '
        f'{1e3 * step / 1.5:.0f} ms, i.e. such convolutions and the rest '
        f'(BN, ReLU, pooling, head, loss, AdamW) in '
        f'{1e3 * (step / 1.5 - conv):.0f} ms (the peer\'s rest: '
        f'{1e3 * (step - conv):.0f} ms)')


def compare_variant(args) -> None:
  """A step as shipped and with `--xla_flags`, `--threads` or `--override`,
  alternated (`--variant_model`: the default step or ResNet-18)."""
  label = args.variant_model
  model, batch = STEPS[label]
  variant = {}
  if args.xla_flags:
    variant['xla_flags'] = args.xla_flags
  if args.threads:
    variant['threads'] = args.threads
  if args.override:
    variant['overrides'] = _overrides(args)
  what = ', '.join(f'{k}={v!r}' for k, v in variant.items())
  print(f'\n{label} step, batch {batch} x 2 views, {args.peer_devices} CPU '
        f'devices: as shipped vs {what}, alternated, {args.steps} timed '
        'steps each')
  print(f'{"round":<8}{"shipped img/s":>15}{"variant img/s":>15}{"ratio":>8}')
  base, new = [], []
  for r in range(args.rounds):
    for extra, got in (({}, base), (variant, new)):
      res = _subprocess(['--job', json.dumps(
          {'kind': 'step', 'model': model,
           'devices': args.peer_devices, 'batch': batch, 'steps': args.steps,
           **extra})])
      got.append(batch / res['step_s'])
    print(f'{r + 1:<8}{base[-1]:>15.0f}{new[-1]:>15.0f}'
          f'{new[-1] / base[-1]:>7.2f}x', flush=True)
  b, n = statistics.median(base), statistics.median(new)
  print(f'{"median":<8}{b:>15.0f}{n:>15.0f}{n / b:>7.2f}x')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=5,
                      help='timed steps per row (after 2 warm-up steps)')
  parser.add_argument('--profile', action='store_true',
                      help='only the breakdown of the default step')
  parser.add_argument('--models', default='default,resnet18-cifar',
                      help='comma-separated row labels to run')
  parser.add_argument('--ops', action='store_true',
                      help='only the BatchNorm and max-pool ops against what '
                      'they replace, forward + backward (run_ops)')
  parser.add_argument('--peer', action='store_true',
                      help='only ours vs the PyTorch peer, alternated')
  parser.add_argument('--peer_devices', type=int, default=2,
                      help='CPU devices of our side of --peer')
  parser.add_argument('--rounds', type=int, default=3,
                      help='alternations of ours and the peer (--peer)')
  parser.add_argument('--torch_python', default=TORCH_PYTHON,
                      help='an interpreter with torch 2.13 (--peer)')
  parser.add_argument('--xla_flags', default='',
                      help='only the default step as shipped vs with these '
                      'XLA flags added, alternated --rounds times on '
                      '--peer_devices devices')
  parser.add_argument('--threads', type=int, default=0,
                      help='only the default step as shipped vs with XLA:CPU '
                      'pools of this many threads (e.g. 8, XLA\'s own size '
                      'for 8 devices on a smaller machine), alternated '
                      '--rounds times on --peer_devices devices')
  parser.add_argument('--override', action='append', default=[],
                      help='only the step as shipped vs with this config '
                      'field set (repeatable), e.g. model.fused_bn=False, '
                      'alternated --rounds times on --peer_devices devices; '
                      'with --peer, a third column')
  parser.add_argument('--variant_model', default='default',
                      choices=('default', 'resnet18-cifar'),
                      help='the step of --xla_flags, --threads, --override')
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--job', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()

  if args.worker:
    job = json.loads(args.job)
    kind = job.pop('kind')
    fn = {'peak': run_peak, 'step': run_step, 'profile': run_profile,
          'ops': run_ops}[kind]
    print(json.dumps(fn(**job)))
    return

  print(f'load average before: {os.getloadavg()} on {os.cpu_count()} CPUs '
        '(shared machine: other jobs compete for the cores)')
  if args.ops:
    res = _subprocess(['--job', json.dumps(
        {'kind': 'ops', 'steps': args.steps, 'rounds': args.rounds})])
    print(f'\nForward + backward, 1 device, median over {args.rounds} rounds '
          f'of the best of {args.steps}:')
    print(f'{"op":<40}{"ours ms":>9}{"replaced ms":>13}{"speed-up":>10}')
    for name, (ours, theirs) in res.items():
      print(f'{name:<40}{1e3 * ours:>9.1f}{1e3 * theirs:>13.1f}'
            f'{theirs / ours:>9.2f}x')
    print(f'\nload average after: {os.getloadavg()}')
    return
  if args.peer:
    compare_with_peer(args)
    print(f'\nload average after: {os.getloadavg()}')
    return
  if args.xla_flags or args.threads or args.override:
    compare_variant(args)
    print(f'\nload average after: {os.getloadavg()}')
    return
  if args.profile:
    res = _subprocess(['--job', json.dumps(
        {'kind': 'profile', 'steps': args.steps})])
    full = res['phases']['full step (+ adamw)']
    print(f'\nDefault step, 1 device, 512 x 2 views of 28x28x1 '
          f'(median of {args.steps}):')
    for name, t in res['phases'].items():
      print(f'  {name:<28}{t * 1e3:9.1f} ms  {100 * t / full:5.1f}%')
    print('\nThe full step by model layer (XLA ops traced, summed by their '
          'op_name):')
    for name, t in res['by_op'].items():
      print(f'  {name:<40}{t * 1e3:9.1f} ms  {100 * t / full:5.1f}%')
    print('\nSmallCNN ops in isolation, forward + backward, 1024 images:')
    for name, t in res['layers'].items():
      print(f'  {name:<40}{t * 1e3:9.1f} ms  {100 * t / full:5.1f}%')
    print(f'\nload average after: {os.getloadavg()}')
    return

  peak = _subprocess(['--job', json.dumps({'kind': 'peak'})])['peak_gflops']
  print(f'matmul peak (2048^3 fp32, best of 8): {peak:.1f} GFLOP/s\n')
  model_flops = {}
  header = (f'{"model":<16}{"devices":>8}{"batch":>7}{"step ms":>10}'
            f'{"img/s":>9}{"GFLOP/step":>12}{"GFLOP/dev":>11}{"MFU":>8}'
            f'{"compile s":>11}')
  print(header)
  print('-' * len(header))
  for label, model, devices, batch in ROWS:
    if label not in args.models.split(','):
      continue
    r = _subprocess(['--job', json.dumps(
        {'kind': 'step', 'model': model, 'devices': devices, 'batch': batch,
         'steps': args.steps})])
    if devices == 1:
      model_flops[label] = r['flops_per_device']
    # Without a 1-device row, per-device FLOPs x devices (counts any work
    # the partitioner replicates, so an upper bound of the model FLOPs).
    flops = model_flops.get(label, r['flops_per_device'] * devices)
    mfu = flops / r['step_s'] / (peak * 1e9)
    print(f'{label:<16}{devices:>8}{batch:>7}{r["step_s"] * 1e3:>10.1f}'
          f'{batch / r["step_s"]:>9.0f}{flops / 1e9:>12.1f}'
          f'{r["flops_per_device"] / 1e9:>11.2f}{100 * mfu:>7.1f}%'
          f'{r["compile_s"]:>11.1f}', flush=True)
  print(f'\nbatch = instances (x2 views); step ms = median of {args.steps}; '
        'GFLOP/step from the 1-device executable.')
  print(f'load average after: {os.getloadavg()}')


if __name__ == '__main__':
  main()
