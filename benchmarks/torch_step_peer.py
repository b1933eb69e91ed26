r"""The PyTorch peer of the accelerator train step (benchmarks/accelerator.py).

The SimCLR step as a PyTorch user runs it on a GPU: torchvision's ResNet
(ResNet-50 with its ImageNet stem, or ResNet-18 with the CIFAR stem: a 3x3
stride-1 first conv and no max-pool), channels-last, bf16 autocast,
`torch.compile` of the forward and the loss (its backward compiled with it)
in `--mode` (one of torch.compile's modes, or `eager`: not compiled), the
optimizer's step fused (`SGD(fused=True)`, one kernel launch for all the
parameters, where the device supports it), `torch.backends.cudnn.benchmark`.
The modes that capture CUDA graphs (reduce-overhead, max-autotune) need a
CUDA device: without one the peer says so (`{"skipped": why}`) and exits.
The same step as ours (`contrastive_jax/train.py` on the same config):

  model   encoder -> global average pool -> head: Linear(F, hidden, no bias),
          BatchNorm1d, ReLU, Linear(hidden, out); BatchNorm over all 2B views
  loss    NT-Xent over the 2B views (2B - 2 negatives per anchor), tau
  optim   SGD, momentum 0.9, weight decay on the >1-d parameters only
  input   2B views [2B, 3, H, W] float32 already on the device (the
          augmentation is not part of the step, as in ours)

It imports only torch, torchvision and numpy, so it runs under any
interpreter that has them (the project does not install torch). It speaks
the accelerator check's worker protocol: it builds and compiles, prints one
JSON line {"ready": ...}, then reads commands from stdin, one JSON object a
line, and answers each with one JSON line on stdout:

  {"cmd": "time", "steps": n}   -> {"seconds": s, "steps": n, "loss": l}
  {"cmd": "profile", "steps": n, "dir": d}
                                -> {"trace": path, "steps": n}: a
                                   torch.profiler chrome trace of n steps
                                   (CPU operators, launches and kernels)
  {"cmd": "quit"}               -> exits

Alone, for a quick look:

  python3 benchmarks/torch_step_peer.py --model=resnet50 --batch=256 \
      --image_size=224 --standalone=20

`--data_root=DIR --loader_workers=N` makes the standalone run read its views
from image files (a DataLoader with SimCLR's recipe in its workers): PyTorch
end to end. `--dry` (the accelerator check's CPU run) compiles with
dynamo's eager backend: the code paths, not inductor's compilation.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
import torchvision


# torch.compile's modes that capture CUDA graphs.
CUDA_GRAPH_MODES = ('reduce-overhead', 'max-autotune')


def _say(obj) -> None:
  print(json.dumps(obj), flush=True)


def build_model(name: str, hidden: int, out: int) -> nn.Module:
  """torchvision's ResNet without its classifier, plus the projection head."""
  if name == 'resnet50':
    net = torchvision.models.resnet50()
  elif name == 'resnet18':
    net = torchvision.models.resnet18()
    net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
  else:
    raise ValueError(f'unknown model {name!r}; known: resnet50, resnet18.')
  features = net.fc.in_features
  net.fc = nn.Identity()
  head = nn.Sequential(nn.Linear(features, hidden, bias=False),
                       nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
                       nn.Linear(hidden, out))
  return nn.Sequential(net, head)


def ntxent(z: torch.Tensor, temperature: float) -> torch.Tensor:
  """NT-Xent of [2B, D] embeddings, view i's positive at i + B (mod 2B)."""
  z = F.normalize(z.float(), dim=1)
  n = z.shape[0]
  logits = z @ z.T / temperature
  logits = logits.masked_fill(
      torch.eye(n, dtype=torch.bool, device=z.device), float('-inf'))
  target = (torch.arange(n, device=z.device) + n // 2) % n
  return F.cross_entropy(logits, target)


class Step:
  """One compiled SimCLR step on fixed random views."""

  def __init__(self, args):
    torch.manual_seed(0)
    self.device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if self.device.type == 'cuda':
      torch.backends.cudnn.benchmark = True
      if args.memory_fraction:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    model = build_model(args.model, args.hidden, args.out)
    self.model = model.to(self.device, memory_format=torch.channels_last)
    decay = [p for p in self.model.parameters() if p.ndim > 1]
    rest = [p for p in self.model.parameters() if p.ndim <= 1]
    groups = [{'params': decay, 'weight_decay': args.weight_decay},
              {'params': rest, 'weight_decay': 0.}]
    try:
      self.opt = torch.optim.SGD(groups, lr=args.lr, momentum=0.9,
                                 fused=True)
      self.optimizer = 'SGD, fused'
    except (RuntimeError, TypeError, ValueError) as e:
      # Not on this device or torch: the default (foreach) instead.
      self.opt = torch.optim.SGD(groups, lr=args.lr, momentum=0.9)
      self.optimizer = f'SGD, foreach (fused: {e})'[:300]
    self.temperature = args.temperature
    rng = np.random.default_rng(0)
    views = rng.random((2 * args.batch, 3, args.image_size, args.image_size),
                       np.float32)
    self.views = torch.from_numpy(views).to(
        self.device).contiguous(memory_format=torch.channels_last)
    self.dtype = torch.bfloat16 if args.dtype == 'bfloat16' else torch.float32
    self.graphs = args.mode in CUDA_GRAPH_MODES and not args.dry
    if args.mode == 'eager':
      self.forward, self.compiled = self._forward, 'eager'
    elif args.dry:
      self.forward = torch.compile(self._forward, backend='eager')
      self.compiled = f'{args.mode} as dynamo with the eager backend (dry)'
    else:
      self.forward = torch.compile(self._forward, mode=args.mode)
      self.compiled = f'inductor, mode {args.mode}'

  def _forward(self, views):
    with torch.autocast(self.device.type, dtype=self.dtype,
                        enabled=self.dtype != torch.float32):
      z = self.model(views)
    return ntxent(z, self.temperature)

  def feed(self, args) -> None:
    """Steps read their views from image files instead: a DataLoader with
    `args.loader_workers` workers making SimCLR's recipe in PIL
    (benchmarks/torch_dataloader_peer.py), pinned memory, non-blocking
    copies; the end-to-end PyTorch run of accelerator.py's stream part."""
    import os  # pylint: disable=g-import-not-at-top
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_dataloader_peer as peer  # pylint: disable=g-import-not-at-top
    transform = peer.SimCLRViews(args.image_size, (0.8, 0.8, 0.8, 0.2))
    loader = torch.utils.data.DataLoader(
        peer.ImageFiles(args.data_root, transform, 2),
        batch_size=args.batch, shuffle=True, drop_last=True,
        num_workers=args.loader_workers, persistent_workers=True,
        prefetch_factor=2, pin_memory=self.device.type == 'cuda')

    def batches():
      while True:
        yield from loader

    self._batches = batches()

  def next_views(self):
    if not hasattr(self, '_batches'):
      return self.views
    views, _ = next(self._batches)             # [B, 2, 3, H, W]
    return views.transpose(0, 1).reshape(-1, *views.shape[2:]).to(
        self.device, non_blocking=True).contiguous(
            memory_format=torch.channels_last)

  def step(self):
    if self.graphs:   # A new iteration: the graphs' last outputs are dead.
      torch.compiler.cudagraph_mark_step_begin()
    self.opt.zero_grad(set_to_none=True)
    loss = self.forward(self.next_views())
    loss.backward()
    self.opt.step()
    return loss

  def profile(self, steps: int, out_dir: str) -> dict:
    """A torch.profiler chrome trace of `steps` steps: the CPU operators,
    the kernel launches and the kernels, each kernel with the correlation
    of its launch (what accelerator.classify_torch_kernels reads)."""
    from torch.profiler import ProfilerActivity  # pylint: disable=g-import-not-at-top
    from torch.profiler import profile  # pylint: disable=g-import-not-at-top
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if self.device.type == 'cuda' else [])
    self.sync()
    with profile(activities=activities) as prof:
      for _ in range(steps):
        self.step()
      self.sync()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, 'trace.json.gz')
    prof.export_chrome_trace(path)
    return {'trace': path, 'steps': steps}

  def sync(self):
    if self.device.type == 'cuda':
      torch.cuda.synchronize()

  def time(self, steps: int) -> dict:
    self.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
      loss = self.step()
    self.sync()
    seconds = time.perf_counter() - t0
    return {'seconds': seconds, 'steps': steps, 'loss': float(loss.detach())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='resnet50')
  parser.add_argument('--batch', type=int, default=256,
                      help='Instances per step (2 views each).')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--hidden', type=int, default=2048)
  parser.add_argument('--out', type=int, default=128)
  parser.add_argument('--temperature', type=float, default=0.1)
  parser.add_argument('--lr', type=float, default=0.3)
  parser.add_argument('--weight_decay', type=float, default=1e-6)
  parser.add_argument('--dtype', default='bfloat16',
                      choices=['bfloat16', 'float32'])
  parser.add_argument('--mode', default='default',
                      help="torch.compile's mode (default, reduce-overhead, "
                      "max-autotune, max-autotune-no-cudagraphs) or eager.")
  parser.add_argument('--dry', action='store_true',
                      help="Compile with dynamo's eager backend (CPU runs).")
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--memory_fraction', type=float, default=0.)
  parser.add_argument('--standalone', type=int, default=0,
                      help='Time this many steps and exit (no protocol).')
  parser.add_argument('--data_root', default='',
                      help='With --standalone: read the views from '
                      '<data_root>/<class>/<image> through a DataLoader.')
  parser.add_argument('--loader_workers', type=int, default=16)
  args = parser.parse_args()
  if args.mode in CUDA_GRAPH_MODES and not torch.cuda.is_available():
    _say({'skipped': f'mode {args.mode} captures CUDA graphs: no CUDA '
                     'device here'})
    return 0
  try:
    t0 = time.perf_counter()
    step = Step(args)
    if args.data_root:
      step.feed(args)
    for _ in range(args.warmup):   # Compilation and cuDNN's autotuning.
      step.step()
    step.sync()
    ready = {'ready': True, 'compile_s': time.perf_counter() - t0,
             'mode': args.mode, 'compiled': step.compiled,
             'cuda_graphs': step.graphs, 'optimizer': step.optimizer,
             'torch': torch.__version__,
             'torchvision': torchvision.__version__,
             'device': (torch.cuda.get_device_name()
                        if step.device.type == 'cuda' else 'cpu')}
  except torch.cuda.OutOfMemoryError as e:
    _say({'error': 'out of memory', 'detail': str(e)[:500]})
    return 3
  if args.standalone:
    out = step.time(args.standalone)
    print(json.dumps({**ready, **out,
                      'images_per_s': args.batch * 2 * args.standalone
                      / out['seconds']}))
    return 0
  _say(ready)
  for line in sys.stdin:
    cmd = json.loads(line)
    if cmd['cmd'] == 'quit':
      break
    if cmd['cmd'] == 'time':
      out = step.time(int(cmd['steps']))
      if step.device.type == 'cuda':
        out['peak_bytes'] = torch.cuda.max_memory_allocated()
      _say(out)
    if cmd['cmd'] == 'profile':
      _say(step.profile(int(cmd['steps']), cmd['dir']))
  return 0


if __name__ == '__main__':
  sys.exit(main())
