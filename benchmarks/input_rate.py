r"""The host's steady-state input rate, ours against the PyTorch DataLoader.

What feeds an accelerator from image files: images/s of decoded, cropped
training batches delivered to the device, per core, at steady state.

    PYTHONPATH=. .venv/bin/python benchmarks/input_rate.py        # ~15 min
    PYTHONPATH=. .venv/bin/python benchmarks/input_rate.py --quick --rounds 1
    PYTHONPATH=. .venv/bin/python benchmarks/input_rate.py --dry  # CI, ~1 min

The peer needs an interpreter with torch (`--torch_python`, default
/tmp/torchvenv/bin/python: `python3 -m venv /tmp/torchvenv &&
/tmp/torchvenv/bin/pip install torch==2.13.0 numpy pillow`); without it the
peer's rows say so and ours are still measured.

The protocol:

* Data: `--images` JPEGs (default: 2,048, or what the protocol needs for
  more cores) at ImageNet-like sizes and file
  sizes (`imagenet_like_folder`: shorter side 300-500 px, aspect ratio
  1-1.5 either way, ~110 KB at quality 90, the ImageNet train set's
  averages), generated once under `--cache_dir`. The set holds more images
  than one measurement reads (warm-up + timed batches), and at least 4 x
  (workers x prefetch) batches, so no timed batch was decoded ahead during
  the warm-up and nothing is read twice.
* Each measurement is a fresh process pinned to the first C cores
  (`os.sched_setaffinity`, inherited by its workers), for C from 1 to every
  core (`--cores`): `--warmup` batches and at least 3 per core (worker
  start-up; what C workers with 2 batches buffered each hold ahead), then
  the rate over `--timed` batches (default 50), from the receipt of the
  last warm-up batch to that of the last timed one.
* `--busy` rows run a pure-Python thread spinning in the training process
  meanwhile, as a training loop's own Python work competes with decoding
  threads for the interpreter lock.
* Rows, alternated within each round (`--rounds`), in this order:
  - ours, processes: `pipeline.TrainBatches` over `sources.ImageFolder`
    with `train_crop_source='full_image'` (decode once, cut each of 2
    views' random resized crop, scale 0.08-1, to 224 px: the ImageNet
    paper configs' host work), decoding as `pipeline.decoding` chooses on
    an accelerator host (worker processes, one per core, one thread each),
    batches moved to one device; no augmentation (it runs on the
    accelerator, beside the step);
  - ours, ArrayRecord: the same from the same images stored as a TFDS
    dataset in the ArrayRecord format (`arrayrecord_of`; the pod's format,
    read by `sources.TfdsSource`); building it needs TensorFlow;
  - ours, threads: the same decoding on threads of the training process
    (`num_workers=0`);
  - ours, center_square: the default crop source (one decode with JPEG
    draft scaling, one resize to the 224 square; the devices cut the views);
  - peer, host crops: benchmarks/torch_dataloader_peer.py `--host_crops`,
    a DataLoader with C workers (persistent, prefetch 2) whose Dataset
    decodes with PIL and cuts the same 2 random resized crops as uint8
    tensors: the same host work, PyTorch's way;
  - peer, full recipe: the same DataLoader making SimCLR's whole recipe on
    the host (flip, colour jitter, grayscale, blur in PIL), what a
    DataLoader user without GPU augmentation runs.
* Per-image costs (`--per_image`): host milliseconds to read one image
  (decode + fit) on one thread, with each of the cheaper-decoding steps
  switched off in turn (`per_image_costs`), for the default crop source
  and for `full_image`, on the ImageNet-like set and on large photos
  (shorter side 1,200-2,000 px), where the DCT-domain reduction applies.
* Printed: images/s and images/s per core per row and round, the median
  over rounds, ours / peer (host crops) per round and their median; the
  load average before and after (the machine may be shared: read ratios
  measured in one run). `--out` gets the JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != _HERE]
sys.path.insert(0, _ROOT)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

PEER = os.path.join(_HERE, 'torch_dataloader_peer.py')
TORCH_PYTHON = '/tmp/torchvenv/bin/python'
NUM_CLASSES = 10
_DATASET_VERSION = 2   # Bump when the generator changes: regenerates caches.
ROWS = ('ours_processes', 'ours_arrayrecord', 'ours_threads',
        'ours_center_square', 'peer_host_crops', 'peer_full_recipe')


def log(msg: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {msg}', file=sys.stderr, flush=True)


def imagenet_like_folder(cache_dir: str, num_images: int, seed: int = 0,
                         short_side=(300, 500), quality: int = 90) -> str:
  """`cache_dir/imagenet_like_<n>_<lo>_<hi>/train/class_XX/*.jpg`, once.

  Each image: shorter side ~U(short_side), aspect ratio ~U(1, 1.5) in
  either orientation; content a smooth random colour field (bicubic from a
  few pixels) with per-pixel noise of standard deviation 20, which at
  quality 90 gives JPEGs of ~100-120 KB at these sizes, like ImageNet's
  (~110 KB at ~400 x 350 on average). A `.complete` marker holding the
  parameters makes reruns skip the work.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  lo, hi = short_side
  root = os.path.join(cache_dir, f'imagenet_like_{num_images}_{lo}_{hi}')
  params = {'n': num_images, 'seed': seed, 'short_side': [lo, hi],
            'quality': quality, 'version': _DATASET_VERSION}
  marker = os.path.join(root, '.complete')
  if os.path.exists(marker):
    with open(marker) as f:
      if json.load(f) == params:
        return root
  log(f'writing {num_images} JPEGs to {root} (once) ...')
  t0 = time.time()
  rng = np.random.default_rng(seed)
  for c in range(NUM_CLASSES):
    os.makedirs(os.path.join(root, 'train', f'class_{c:02d}'), exist_ok=True)
  for i in range(num_images):
    short = int(rng.integers(lo, hi + 1))
    long = int(round(short * rng.uniform(1.0, 1.5)))
    h, w = (short, long) if rng.random() < 0.75 else (long, short)
    small = rng.integers(0, 256, (*rng.integers(3, 12, 2), 3), np.uint8)
    img = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC),
                     np.float32)
    img += rng.normal(0, 20, img.shape).astype(np.float32)
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
        os.path.join(root, 'train', f'class_{i % NUM_CLASSES:02d}',
                     f'{i:06d}.jpg'), quality=quality)
  with open(marker, 'w') as f:
    json.dump(params, f)
  log(f'  done in {time.time() - t0:.0f} s')
  return root


ARRAYRECORD_NAME = 'imagenet_like'


def arrayrecord_of(root: str) -> str:
  """`root`'s train split as a TFDS dataset in the ArrayRecord format, the
  pod's format (`ARRAYRECORD_NAME` under the returned data_dir), built once.

  The JPEG files' bytes are stored as they are (TFDS's Image feature with
  JPEG encoding re-encodes nothing for a JPEG path), in the folder's order,
  so record i decodes to the folder's example i. The builder class is never registered: a reader
  (main.py, `sources.TfdsSource`) finds the dataset from its files, as it
  would one prepared on another machine. Building needs TensorFlow.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = f'{root}_arrayrecord'
  split_dir = os.path.join(root, 'train')
  classes = sorted(os.listdir(split_dir))

  class Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """The image folder's train split."""
    name = ARRAYRECORD_NAME
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({
              'image': tfds.features.Image(encoding_format='jpeg'),
              'label': tfds.features.ClassLabel(names=classes)}),
          disable_shuffling=True)   # Record i is the folder's example i.

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples()}

    def _generate_examples(self):
      for label, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(split_dir, c))):
          yield f'{c}/{f}', {'image': os.path.join(split_dir, c, f),
                             'label': label}

  builder = Builder(data_dir=data_dir, file_format='array_record')
  if not builder.is_prepared():
    log(f'writing {root} as ArrayRecord to {data_dir} (once) ...')
    builder.download_and_prepare()
  return data_dir


def folder_stats(root: str) -> dict:
  """Mean file size and mean shorter/longer side of the folder's JPEGs."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  sizes, shorts, longs = [], [], []
  for dirpath, _, files in os.walk(os.path.join(root, 'train')):
    for f in files:
      path = os.path.join(dirpath, f)
      sizes.append(os.path.getsize(path))
      with Image.open(path) as im:
        shorts.append(min(im.size))
        longs.append(max(im.size))
  return {'images': len(sizes), 'mean_kb': statistics.mean(sizes) / 1e3,
          'mean_short_side': statistics.mean(shorts),
          'mean_long_side': statistics.mean(longs)}


# --------------------------------------------------------------------------
# One measurement of ours, in a fresh process (`--_child`).


def _spin_forever():
  n = 0
  while True:
    n += 1


def ours_child(args) -> dict:
  """Images/s of `TrainBatches.iterate` on the first `args.cores` cores."""
  os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])
  # One device, as one accelerator: every batch lands whole on it.
  os.environ['XLA_FLAGS'] = ' '.join(
      f for f in os.environ.get('XLA_FLAGS', '').split()
      if 'xla_force_host_platform_device_count' not in f)
  import threading  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from benchmarks import input_pipeline as ip  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top

  row = args._child  # pylint: disable=protected-access
  crop_source = 'center_square' if row == 'ours_center_square' else 'full_image'
  if row == 'ours_threads':
    workers = 0
  elif args.ours_workers:
    workers = args.ours_workers
  else:   # As `pipeline.decoding` chooses on an accelerator host.
    workers = pipeline.decoding(pipeline.AUTO, backend='gpu').workers
  config = ip.bench_config(args.root, image_size=args.image_size,
                           preset='simclr', num_views=2,
                           crop_source=crop_source, num_workers=workers)
  dc = config.dataset
  if row == 'ours_arrayrecord':   # The same images, as a TFDS dataset.
    dc.name, dc.data_dir = ARRAYRECORD_NAME, args.arrayrecord
  source = sources.open_split(dc, 'train')
  if workers == 0:   # One decoding thread per core it is given.
    source.num_threads = args.cores
  views = augment.build_views(config.augment.preset, config.augment.num_views,
                              config.augment.overrides,
                              config.augment.op_order)
  batches = pipeline.TrainBatches(
      source, global_batch_size=args.batch, seed=args.seed,
      sharding=NamedSharding(runtime.create_mesh(), P('data')),
      num_workers=workers, fit=sources.training_fit(dc, views, args.seed))
  if args.busy:
    threading.Thread(target=_spin_forever, daemon=True).start()
  t0, shape = None, None
  stop = args.warmup + args.timed
  for k, b in enumerate(batches.iterate(0, stop)):
    jax.block_until_ready(b['image'])
    shape = tuple(b['image'].shape)
    if k == args.warmup - 1:
      t0 = time.perf_counter()
  seconds = time.perf_counter() - t0
  return {'images_per_s': args.timed * args.batch / seconds,
          'seconds': seconds, 'batch_shape': shape,
          'decoding': str(batches.decoding),
          'cores': len(os.sched_getaffinity(0)), 'busy': args.busy}


# --------------------------------------------------------------------------
# What the cheaper decoding buys: host milliseconds per image, one thread.

DECODERS = {
    # name: (JPEGs through libjpeg-turbo's API, DCT-domain reduction)
    'PIL, full size': (False, False),
    'PIL, reduced': (False, True),
    'libjpeg-turbo API, full size': (True, False),
    'libjpeg-turbo API, reduced (ours)': (True, True),
}


def per_image_costs(root: str, count: int, rounds: int,
                    size: int = 224) -> dict:
  """ms per image of `ImageFolder`'s read of one image (decode + fit), on
  one thread, per decoder variant and fit, alternated over `rounds`.

  The variants switch off, one at a time, what `sources.load_image` does
  to decode cheaply: libjpeg-turbo's own API (else PIL decodes every JPEG)
  and the DCT-domain reduction (else every JPEG is decoded at full size).
  Fits: `CenterSquare()` (the default crop source) and `RandomCrops` of 2
  views, scale 0.08-1 (`full_image`, drawn at step 0).
  """
  from unittest import mock  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top
  source = sources.ImageFolder(root, 'train', image_size=size)
  fits = {'center_square': sources.CenterSquare(),
          'full_image': sources.RandomCrops(
              (((0.08, 1.0), (3 / 4, 4 / 3)),) * 2, seed=0)}
  ids = range(min(count, len(source)))
  for i in ids:   # The files in the page cache, as in a steady state.
    source.files[i].read_bytes()

  def no_api(data):
    raise ValueError('PIL decodes')

  out = {f'{d} | {f}': [] for d in DECODERS for f in fits}
  for _ in range(rounds):
    for name, (api, reduce) in DECODERS.items():
      patches = ([] if api else [mock.patch.object(
          sources.simplejpeg, 'decode_jpeg_header', no_api)]) + (
              [] if reduce else [mock.patch.object(
                  sources, 'jpeg_reduction', lambda ratio: 1)])
      for p in patches:
        p.start()
      try:
        for fit_name, fit in fits.items():
          t0 = time.perf_counter()
          for i in ids:
            source._read_one(i, fit)  # pylint: disable=protected-access
          out[f'{name} | {fit_name}'].append(
              1e3 * (time.perf_counter() - t0) / len(ids))
      finally:
        for p in patches:
          p.stop()
  if source.skipped:
    raise RuntimeError(f'undecodable files: {source.skipped}')
  return out


def per_image_table(title: str, costs: dict) -> str:
  lines = ['', title, f'{"decoder | fit":<52}{"ms/image":>9}  '
           f'{"images/s/core":>13}   rounds (ms)']
  for key, ms in costs.items():
    med = statistics.median(ms)
    lines.append(f'{key:<52}{med:9.2f}  {1e3 / med:13.0f}   ' +
                 ' '.join(f'{x:.2f}' for x in ms))
  return '\n'.join(lines)


# --------------------------------------------------------------------------
# The driver.


def warmup_batches(args, cores: int) -> int:
  """Warm-up batches: `--warmup`, and at least what `cores` workers with
  2 batches buffered each hold ahead, so the timed window starts with
  empty buffers (nothing decoded before the clock starts)."""
  return max(args.warmup, 3 * cores)


def measure(row: str, args, cores: int, busy: bool, seed: int) -> dict:
  """One row's measurement in a fresh process: its JSON, or {'error'}."""
  common = [f'--batch={args.batch}', f'--warmup={warmup_batches(args, cores)}',
            f'--seed={seed}']
  if row.startswith('ours'):
    if row == 'ours_arrayrecord' and not args.arrayrecord:
      return {'error': 'no ArrayRecord set (building it needs TensorFlow)'}
    cmd = [sys.executable, os.path.abspath(__file__), f'--_child={row}',
           f'--arrayrecord={args.arrayrecord}',
           f'--root={args.root}', f'--cores={cores}', f'--timed={args.timed}',
           f'--image_size={args.image_size}',
           f'--ours_workers={args.ours_workers}', *common]
  else:
    if not os.path.exists(args.torch_python):
      return {'error': f'no torch interpreter at {args.torch_python}'}
    from benchmarks import input_pipeline as ip  # pylint: disable=g-import-not-at-top
    cmd = [args.torch_python, PEER,
           f'--root={os.path.join(args.root, "train")}',
           f'--batches={args.timed}', f'--workers={cores}', f'--cores={cores}',
           f'--size={args.image_size}', *common, *ip.peer_args('simclr', 2)]
    if row == 'peer_host_crops':
      cmd.append('--host_crops')
  if busy:
    cmd.append('--busy=yes' if row.startswith('ours') else '--busy')
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        env={**os.environ, 'PYTHONPATH': _ROOT},
                        timeout=args.child_timeout)
  if proc.returncode:
    return {'error': f'{row} failed ({proc.returncode}): '
                     f'{proc.stderr.strip()[-1500:]}'}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(x) -> str:
  return f'{x:9.1f}' if isinstance(x, (int, float)) else f'{"-":>9}'


def table(report: dict) -> str:
  """The rows' medians, per core, and ours / peer, per cores x busy."""
  lines = ['', f'{"cores":>5} {"busy":>4}  {"row":<20}{"img/s":>9}'
           f'{"per core":>9}   rounds']
  for key, cell in report['cells'].items():
    cores, busy = cell['cores'], cell['busy']
    for row in ROWS:
      rates = [r['images_per_s'] for r in cell.get(row, [])
               if 'images_per_s' in r]
      if not rates and row not in cell:
        continue
      med = statistics.median(rates) if rates else None
      lines.append(f'{cores:>5} {"yes" if busy else "no":>4}  {row:<20}'
                   f'{_fmt(med)}{_fmt(med / cores if med else None)}   '
                   + ' '.join(f'{x:.0f}' for x in rates))
    if cell.get('ours_over_peer'):
      lines.append(f'{cores:>5} {"yes" if busy else "no":>4}  '
                   f'{"ours/peer (crops)":<20}{"":>18}   ' + ' '.join(
                       f'{x:.2f}x' for x in cell['ours_over_peer']) +
                   f'  median {statistics.median(cell["ours_over_peer"]):.2f}x')
    del key
  return '\n'.join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n', maxsplit=1)[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--cache_dir', default='/tmp/contrastive_jax_bench')
  parser.add_argument('--images', type=int, default=0,
                      help='JPEGs generated (0: the least the protocol needs, '
                      'at least 2,048).')
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--warmup', type=int, default=8)
  parser.add_argument('--timed', type=int, default=50)
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--cores', default='',
                      help='Comma-separated core counts (default: 1 to all).')
  parser.add_argument('--rows', default=','.join(ROWS))
  parser.add_argument('--busy', default='no,yes',  # A child: 'yes' or 'no'.
                      help="'no', 'yes' or both: rows with a busy thread.")
  parser.add_argument('--quick', action='store_true',
                      help='Only the crop rows (processes, threads, peer '
                      'host crops) without a busy thread.')
  parser.add_argument('--dry', action='store_true',
                      help='Tiny sizes: checks the benchmark runs (CI).')
  parser.add_argument('--ours_workers', type=int, default=0,
                      help='Worker processes of the ours rows that decode in '
                      'processes (0: as pipeline.decoding chooses on an '
                      'accelerator host, one per core).')
  parser.add_argument('--per_image', type=int, default=150,
                      help='Images of the per-image decoding table (on the '
                      'ImageNet-like set and on --large_images photos of '
                      '1,200-2,000 px); 0 skips it.')
  parser.add_argument('--large_images', type=int, default=150)
  parser.add_argument('--torch_python', default=TORCH_PYTHON)
  parser.add_argument('--out', default='')
  parser.add_argument('--child_timeout', type=float, default=900)
  parser.add_argument('--_child', default='', help=argparse.SUPPRESS)
  parser.add_argument('--root', default='', help=argparse.SUPPRESS)
  parser.add_argument('--arrayrecord', default='', help=argparse.SUPPRESS)
  parser.add_argument('--seed', type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args._child:  # pylint: disable=protected-access
    args.cores, args.busy = int(args.cores), args.busy == 'yes'
    print(json.dumps(ours_child(args)))
    return 0
  if args.dry:
    args.batch, args.warmup, args.timed = 8, 2, 4
    args.image_size, args.rounds = 32, 1
    args.per_image, args.large_images = min(args.per_image, 8), 8
    args.cache_dir = os.path.join(args.cache_dir, 'dry')
  if args.quick:
    args.rows, args.busy = 'ours_processes,ours_threads,peer_host_crops', 'no'
  all_cores = len(os.sched_getaffinity(0))
  cores = ([int(c) for c in args.cores.split(',')] if args.cores
           else list(range(1, all_cores + 1)))
  rows = [r for r in args.rows.split(',') if r]
  unknown = set(rows) - set(ROWS)
  if unknown:
    parser.error(f'unknown rows {sorted(unknown)}; known: {ROWS}')
  reads = (warmup_batches(args, max(cores)) + args.timed) * args.batch
  # Workers x prefetch batches in flight at most (2 each), 4x over.
  least = max(reads, 4 * max(cores) * 2 * args.batch)
  args.images = args.images or max(least, 160 if args.dry else 2048)
  if args.images < least:
    parser.error(f'--images={args.images} is below the {least} the protocol '
                 'needs (no image read twice, 4 x workers x prefetch '
                 'batches).')
  args.root = imagenet_like_folder(args.cache_dir, args.images,
                                   short_side=(24, 40) if args.dry
                                   else (300, 500))
  if 'ours_arrayrecord' in rows:
    try:
      args.arrayrecord = arrayrecord_of(args.root)
    except ImportError as e:   # A host without TensorFlow.
      log(f'no ArrayRecord row: {e}')
  report = {'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
            'host_cores': all_cores, 'load_before': os.getloadavg(),
            'data': folder_stats(args.root),
            'settings': {k: v for k, v in vars(args).items()
                         if not k.startswith('_')}, 'cells': {}}
  log(f'data: {report["data"]}')
  busy_modes = [b == 'yes' for b in args.busy.split(',') if b]
  for r in range(args.rounds):
    for c in cores:
      for busy in busy_modes:
        cell = report['cells'].setdefault(
            f'{c}{"_busy" if busy else ""}', {'cores': c, 'busy': busy})
        for row in rows:
          if busy and row in ('ours_center_square', 'ours_arrayrecord',
                              'peer_full_recipe'):
            continue   # The busy rows compare where the decoding runs.
          res = measure(row, args, c, busy, seed=r)
          cell.setdefault(row, []).append(res)
          log(f'round {r + 1}, {c} cores, busy={busy}, {row}: ' + (
              f'{res["images_per_s"]:.0f} img/s' if 'images_per_s' in res
              else res['error'][-300:]))
        ours = cell.get('ours_processes', [])[-1:]
        peer = cell.get('peer_host_crops', [])[-1:]
        if ours and peer and 'images_per_s' in ours[0] and (
            'images_per_s' in peer[0]):
          cell.setdefault('ours_over_peer', []).append(
              ours[0]['images_per_s'] / peer[0]['images_per_s'])
  if args.per_image:
    large = imagenet_like_folder(
        args.cache_dir, args.large_images,
        short_side=(48, 80) if args.dry else (1200, 2000))
    report['large_data'] = folder_stats(large)
    for key, root in (('per_image', args.root), ('per_image_large', large)):
      log(f'{key}: decoding costs on one thread ...')
      report[key] = per_image_costs(root, args.per_image, args.rounds,
                                    args.image_size)
  report['load_after'] = os.getloadavg()
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(report, f, indent=1)
  print(table(report))
  for key, data in (('per_image', 'data'), ('per_image_large', 'large_data')):
    if key in report:
      d = report[data]
      print(per_image_table(
          f'Host ms per image, one thread, {d["images"]} JPEGs of '
          f'{d["mean_short_side"]:.0f} x {d["mean_long_side"]:.0f} px, '
          f'{d["mean_kb"]:.0f} KB on average', report[key]))
  print(f'data: {report["data"]["images"]} JPEGs, mean '
        f'{report["data"]["mean_kb"]:.0f} KB, sides '
        f'{report["data"]["mean_short_side"]:.0f} x '
        f'{report["data"]["mean_long_side"]:.0f} px on average; batch '
        f'{args.batch}, {args.warmup} (at least 3 per core) warm-up + '
        f'{args.timed} timed batches; '
        f'load average {report["load_before"][0]:.1f} before, '
        f'{report["load_after"][0]:.1f} after')
  errors = [r['error'] for cell in report['cells'].values()
            for row in ROWS for r in cell.get(row, []) if 'error' in r]
  ours_errors = [e for e in errors if e.startswith('ours')]
  if errors:
    print(f'{len(errors)} measurements failed; the first: {errors[0][-500:]}')
  return 1 if ours_errors else 0


if __name__ == '__main__':
  sys.exit(main())
