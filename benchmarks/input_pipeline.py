r"""The streamed input pipeline on this CPU: host memory, images/s vs PyTorch.

Run from the repository root (6-9 minutes on the shared 2-core CPU; the
first run also writes the JPEG sets, ~1 minute, cached under --cache_dir;
table 2 alone, `--no-rss --no-queue --no-fmnist --no-colour32`, about 2
minutes):

    PYTHONPATH=. .venv/bin/python benchmarks/input_pipeline.py
    PYTHONPATH=. .venv/bin/python benchmarks/input_pipeline.py --quick

The PyTorch peer needs an interpreter with torch, which the project does not
install (the peer's row is skipped, and says so, without it):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 numpy pillow

One run prints five tables:

1. Host RSS of the streamed path for two dataset sizes (default 1,000 and
   8,000 JPEGs of ~256x256, generated once): a fresh subprocess per size
   lists the folder (`sources.ImageFolder`), builds `pipeline.TrainBatches`
   on the 8-device mesh and streams `--rss_steps` global batches through
   `iterate()` (decode + fit to 224 px on the thread pool, grain prefetch,
   `make_array_from_process_local_data`); by default one epoch of the larger
   set, so both read the same number of images. The peak (VmHWM, reset
   through /proc/self/clear_refs after set-up; else getrusage's lifetime
   maxrss) must not grow with the dataset; the in-memory `ArrayDataset` of
   the same split would hold N x 224 x 224 x 3 bytes (printed for scale).
2. Input images/s at 224 px with SimCLR's augmentations, 2 views
   (`augment.PRESETS['simclr']`: random resized crop (0.08, 1), flip, colour
   jitter strength 1 at p 0.8, grayscale 0.2, blur 0.5), on the larger set:
   * ours: `TrainBatches(ImageFolder(...)).iterate()` (host decode, with the
     JPEG draft reduction, + fit to the 224 centre square; grain prefetch)
     then `augment.augment_batch` jitted on the 8-virtual-device mesh,
     random resized crop included: the config (configs/base.py's, completed
     by `config_lib.with_defaults`), the fit, the views and `augment_fn` are
     made exactly as contrastive_jax/train.py makes them;
   * ours, full_image (`--no-full_image` skips it): the same with
     `config.dataset.train_crop_source='full_image'`: `TrainBatches(...,
     fit=sources.training_fit(config.dataset, views, seed))` cuts each
     view's random resized crop on the host from the image decoded at full
     resolution (`sources.RandomCrops`, batches [B, V, 224, 224, 3]) and
     `augment_batch(..., host_cropped=True)` skips only the crop;
   * peer: `benchmarks/torch_dataloader_peer.py` under --torch_python, a
     torch `DataLoader(num_workers=2, pin_memory=False)` whose Dataset opens
     each JPEG with PIL and makes the same two views with PIL
     implementations of torchvision's transforms (RandomResizedCrop of the
     full image; the same recipe's numbers, passed from the preset).
   Alternated ours, ours full_image, peer per round (--rounds), each timed
   over --batches batches after --warmup (compilation and worker start-up
   excluded); images/s per round, ours / peer, full_image / ours and
   full_image / peer per round, and the medians. A breakdown times, for each
   of ours, the augmentation alone on a batch already on the mesh, and the
   host alone: the same `iterate()` (decode + fit or crops, grain, transfer
   to the mesh) with no augmentation, which is the host cost of the crop
   source. The generated JPEGs are ~256 px (--image_side), where the draft
   reduction does not apply; `--image_side=500` makes ImageNet-like sizes,
   where `center_square` decodes at half resolution and `full_image` does
   not.
3. Bytes moved by collectives per MoCo v2 step, queue gathered (before) and
   sharded (now), from `benchmarks/queue_comm.py`'s own functions (its
   script prints the full table with step times and the largest ops).
4. Small images, cheaply: Fashion-MNIST (TFDS ArrayRecord) in memory and
   streamed through the same `TrainBatches` + jitted `fmnist` preset, a
   tf.data per-image crop+flip map (omits the colour ops and erasing, so it
   flatters tf.data), and what the default train step consumes.

5. 32x32x3 views/s of the augmentation alone (`--colour32`), per preset,
   on a batch already on the 8-device mesh: the CIFAR configs' input cost.
   `simclr` is the full recipe (crop, flip, colour jitter, grayscale,
   blur). Measured 2026-11-25 (`... input_pipeline.py --no-rss
   --no-throughput --no-queue --no-fmnist`, other jobs running):
   simclr 36,114, simclr_small 59,376, cifar_small 35,478 views/s. Before
   colour jitter was composed as one colour map (`augment.jitter`), simclr
   ran at 9,188 (same batch and mesh, measured minutes apart).

Caveat (printed too): the 2 cores are shared by everything measured here —
host decoding, grain's threads, the 8 virtual devices' augmentation, and the
peer's worker processes — and by other users' jobs (load average printed).
"""

import os
import sys

# This file is named like the package it measures; drop its own directory from
# the import path (Python puts it first) and make the repository importable.
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != _HERE]
sys.path.insert(0, _ROOT)
if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS',
                                                                ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

PEER = os.path.join(_HERE, 'torch_dataloader_peer.py')
TORCH_PYTHON = '/tmp/torchvenv/bin/python'
TORCH_SETUP = ('python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip '
               'install torch==2.13.0 numpy pillow')
NUM_CLASSES = 10
_DATASET_VERSION = 1   # Bump when the generator changes: regenerates caches.


def log(msg: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {msg}', file=sys.stderr, flush=True)


def _mib(n_bytes: float) -> str:
  return f'{n_bytes / 2**20:,.0f} MiB'


# --------------------------------------------------------------------------
# JPEG folders.


def make_image_folder(cache_dir: str, num_images: int, side: int,
                      seed: int = 0) -> pathlib.Path:
  """`cache_dir/jpeg_<n>_<side>/train/class_XX/*.jpg`, written once.

  Content: a random low-resolution colour field upsampled (bicubic) to about
  side x side (each side drawn in [side - 16, side + 32], so `fit_square`
  both resizes and crops), plus per-pixel noise so the JPEGs carry texture
  (~25-35 KB each at quality 90; ImageNet's average is ~110 KB at ~400x350).
  A `.complete` marker holding the parameters makes reruns skip the work.
  """
  root = pathlib.Path(cache_dir) / f'jpeg_{num_images}_{side}'
  params = {'n': num_images, 'side': side, 'seed': seed,
            'version': _DATASET_VERSION, 'classes': NUM_CLASSES}
  marker = root / '.complete'
  if marker.exists() and json.loads(marker.read_text()) == params:
    return root
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if root.exists():
    shutil.rmtree(root)
  log(f'writing {num_images} JPEGs to {root} (once) ...')
  t0 = time.time()
  rng = np.random.default_rng(seed)
  noise = rng.normal(0, 10, (2 * side + 64, 2 * side + 64, 3)).astype(
      np.float32)
  for c in range(NUM_CLASSES):
    (root / 'train' / f'class_{c:02d}').mkdir(parents=True)
  for i in range(num_images):
    h, w = (int(x) for x in side + rng.integers(-16, 33, 2))
    small = rng.integers(0, 256, (*rng.integers(3, 12, 2), 3), np.uint8)
    img = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC),
                     np.float32)
    y, x = rng.integers(0, noise.shape[0] - h), rng.integers(
        0, noise.shape[1] - w)
    img = np.clip(img + noise[y:y + h, x:x + w], 0, 255).astype(np.uint8)
    Image.fromarray(img).save(
        root / 'train' / f'class_{i % NUM_CLASSES:02d}' / f'{i:06d}.jpg',
        quality=90)
  marker.write_text(json.dumps(params))
  log(f'  done in {time.time() - t0:.0f} s')
  return root


def _disk_bytes(root: pathlib.Path) -> int:
  return sum(f.stat().st_size for f in (root / 'train').rglob('*.jpg'))


# --------------------------------------------------------------------------
# 1. Host RSS, in a fresh process per dataset.


def _status_kib() -> dict[str, int]:
  out = {}
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(('VmRSS:', 'VmHWM:')):
        key, value = line.split(':')
        out[key] = int(value.split()[0])
  return out


def _reset_peak() -> bool:
  """Resets VmHWM to the current RSS (Linux >= 4.0); False if not allowed."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def rss_child(root: str, batch: int, image_size: int, steps: int) -> None:
  """Streams `steps` batches; prints one JSON line of memory figures."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top

  source = sources.ImageFolder(root, 'train', image_size=image_size)
  sharding = NamedSharding(runtime.create_mesh(), P('data'))
  batches = pipeline.TrainBatches(source, global_batch_size=batch, seed=0,
                                  sharding=sharding)
  setup = _status_kib()
  reset = _reset_peak()
  t0 = time.perf_counter()
  images = 0
  for b in batches.iterate(0, steps):
    jax.block_until_ready(b['image'])
    images += b['image'].shape[0]
    del b
  seconds = time.perf_counter() - t0
  end = _status_kib()
  peak = end['VmHWM'] if reset else resource.getrusage(
      resource.RUSAGE_SELF).ru_maxrss
  print(json.dumps({
      'files': len(source), 'images_read': images, 'seconds': seconds,
      'setup_kib': setup['VmRSS'], 'peak_kib': peak, 'end_kib': end['VmRSS'],
      'peak_reset': reset, 'devices': jax.device_count()}))


def measure_rss(root: pathlib.Path, batch: int, image_size: int,
                steps: int) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), f'--_rss_child={root}',
         f'--batch={batch}', f'--image_size={image_size}',
         f'--rss_steps={steps}']
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        env={**os.environ, 'PYTHONPATH': _ROOT})
  if proc.returncode:
    raise RuntimeError(f'RSS child failed ({proc.returncode}):\n'
                       f'{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# 2. Images/s: ours (in this process) and the torch peer (a subprocess).


CROP_SOURCES = ('center_square', 'full_image')


def bench_config(root, *, image_size, preset, num_views, crop_source, seed=0,
                 num_workers=0):
  """configs/base.py's config for the benchmark's image folder, with
  `config.dataset.train_crop_source=crop_source` (completed and checked as a
  run's config is: `config_lib.with_defaults`, `sources.check_crop_options`).
  """
  from configs import base  # pylint: disable=g-import-not-at-top
  from contrastive_jax import config_lib  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.seed = seed
  config.dataset.name = 'image_folder'
  config.dataset.data_dir = str(root)
  config.dataset.in_memory = False
  config.dataset.image_size = image_size
  config.dataset.num_workers = num_workers
  config.dataset.train_crop_source = crop_source
  config.augment.preset = preset
  config.augment.num_views = num_views
  config = config_lib.with_defaults(config)
  sources.check_crop_options(config.dataset)
  return config


class Ours:
  """TrainBatches(ImageFolder).iterate() + train.py's jitted augment_fn.

  crop_source: `config.dataset.train_crop_source`. 'center_square': the host
    decodes (with the JPEG draft reduction) and fits each image to the
    image_size square, the devices cut every view's random resized crop;
    'full_image': the host decodes at full resolution and cuts and resizes
    each view's crop (`sources.RandomCrops`, batches [B, V, S, S, C]), the
    devices skip only the crop (`host_cropped=True`). The source, the fit,
    the views and augment_fn are made from the config as
    contrastive_jax/train.py's train_and_evaluate makes them.
  """

  def __init__(self, root, *, batch, image_size, preset, num_views, seed=0,
               num_workers=0, crop_source='center_square'):
    import jax  # pylint: disable=g-import-not-at-top
    from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
    from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
    from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
    from contrastive_jax import train  # pylint: disable=g-import-not-at-top
    from input_pipeline import augment  # pylint: disable=g-import-not-at-top
    from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
    from input_pipeline import sources  # pylint: disable=g-import-not-at-top
    self.jax = jax
    self.crop_source = crop_source
    config = bench_config(root, image_size=image_size, preset=preset,
                          num_views=num_views, crop_source=crop_source,
                          seed=seed, num_workers=num_workers)
    self.config = config
    dc = config.dataset
    mesh = runtime.create_mesh()
    rows = NamedSharding(mesh, P('data'))
    self.source = sources.ImageFolder(dc.data_dir, 'train',
                                      image_size=dc.image_size,
                                      fit=sources.source_fit(dc))
    # From here as contrastive_jax/train.py's train_and_evaluate, with its
    # own functions for the keys and the jitted augmentation.
    views = augment.build_views(config.augment.preset,
                                config.augment.num_views,
                                config.augment.overrides,
                                config.augment.op_order)
    self.fit = sources.training_fit(dc, views, config.seed)
    self.batches = pipeline.TrainBatches(
        self.source, global_batch_size=batch, seed=config.seed, sharding=rows,
        num_workers=dc.num_workers, fit=self.fit)
    _, aug_rng, _ = train.seed_keys(config.seed)
    self.augment_fn = train.make_augment_fn(views, self.fit, mesh, aug_rng)
    self.batch, self.num_views = batch, num_views
    t0 = time.perf_counter()
    self._resident = self.batches(0)['image']
    self.batch_shape = tuple(self._resident.shape)
    jax.block_until_ready(self.augment_fn(0, self._resident))
    self.compile_s = time.perf_counter() - t0

  def throughput(self, start: int, warmup: int, timed: int,
                 augment: bool = True) -> float:
    """Images/s over `timed` batches after `warmup` (counted from receipt of
    augmented batch `warmup`, as the peer counts from its batch `warmup`).

    augment=False: the batches alone (host decode + fit + transfer to the
    mesh), the host's cost of the crop source."""
    jax = self.jax
    prev, t0, images = None, None, 0
    stop = start + warmup + timed + 1
    for k, b in enumerate(self.batches.iterate(start, stop)):
      out = self.augment_fn(start + k, b['image']) if augment else b['image']
      if prev is not None:   # One step in flight, as a training loop keeps.
        jax.block_until_ready(prev)
      prev = out
      if k == warmup:
        jax.block_until_ready(out)
        t0 = time.perf_counter()
      elif k > warmup:
        images += b['image'].shape[0]
    jax.block_until_ready(prev)
    return images / (time.perf_counter() - t0)

  def augment_only(self, iters: int) -> float:
    """Images/s of augment_fn alone on a batch already on the mesh."""
    jax = self.jax
    t0 = time.perf_counter()
    for i in range(iters):
      out = self.augment_fn(i + 1, self._resident)
    jax.block_until_ready(out)
    return iters * self.batch / (time.perf_counter() - t0)


def peer_args(preset: str, num_views: int) -> list[str]:
  """The peer's flags for the same recipe as `augment.PRESETS[preset]`."""
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  cfg = augment.PRESETS[preset][0]
  if any(c != cfg for c in augment.get_views(preset, num_views)):
    raise ValueError(f'preset {preset!r} has different views; the peer makes '
                     'identical ones.')
  # augment.color_jitter with amounts (b, c, s, h) draws factors from
  # U[1 - b, 1 + b] etc. and hue from U[-h, h]: torchvision's
  # ColorJitter(b, c, s, h).
  return ['--crop_scale', *map(str, cfg.crop_scale),
          '--jitter', *map(str, cfg.jitter_amounts()),
          f'--jitter_p={cfg.jitter_p}', f'--grayscale_p={cfg.grayscale_p}',
          f'--blur_p={cfg.blur_p}', f'--views={num_views}']


def run_peer(torch_python, root, *, batch, image_size, warmup, timed,
             workers, seed, recipe) -> dict:
  cmd = [torch_python, PEER, f'--root={root / "train"}', f'--batch={batch}',
         f'--size={image_size}', f'--warmup={warmup}', f'--batches={timed}',
         f'--workers={workers}', f'--seed={seed}', *recipe]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f'torch peer failed ({proc.returncode}): '
                       f'{" ".join(cmd)}\n{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# 3. MoCo queue collectives (benchmarks/queue_comm.py's functions).


def queue_rows(queue: int, dim: int, batch: int, steps: int) -> list[dict]:
  from benchmarks import queue_comm  # pylint: disable=g-import-not-at-top
  from contrastive_jax.methods import memory_bank, moco  # pylint: disable=g-import-not-at-top
  config = queue_comm._moco_config(queue, dim, batch)  # pylint: disable=protected-access
  rows = []
  sharded_enqueue = moco.enqueue
  # As queue_comm.main: the 'before' layout swaps the old enqueue back in.
  for label, enqueue in (('gathered queue (before)',
                          queue_comm.gathered_enqueue),
                         ('sharded queue (now)', sharded_enqueue)):
    moco.enqueue = enqueue
    try:
      hlo, step_s, compile_s = queue_comm._compile_and_time(  # pylint: disable=protected-access
          config, num_examples=60_000, steps=steps)
    finally:
      moco.enqueue = sharded_enqueue
    cols = queue_comm.collectives(hlo)
    rows.append({
        'label': label,
        'total': sum(c.bytes for c in cols),
        'all_gather': sum(c.bytes for c in cols if c.kind == 'all-gather'),
        'queue_gathers': len(queue_comm.gathers_of(hlo, (queue, dim))),
        'step_s': step_s, 'compile_s': compile_s})
  return rows


# --------------------------------------------------------------------------
# 4. Small images: Fashion-MNIST rows and the default train step.


def fmnist_rows(data_dir, iters: int, tf_images: int) -> tuple[list, float]:
  import jax  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  from input_pipeline import pipeline  # pylint: disable=g-import-not-at-top
  from input_pipeline import sources  # pylint: disable=g-import-not-at-top
  batch, v = 512, 2
  streamed = sources.TfdsSource('fashion_mnist', 'train', data_dir=data_dir,
                                image_size=None)
  in_memory = pipeline.ArrayDataset.from_source(
      pipeline.Subset(streamed, np.arange((iters + 2) * batch)))
  augment_fn, data_sharding = _mesh_augment_fn('fmnist', v)
  rows = []
  for name, source in (('in memory (ArrayDataset)', in_memory),
                       ('streamed (TfdsSource, PNG decode)', streamed)):
    batches = pipeline.TrainBatches(source, global_batch_size=batch, seed=0,
                                    sharding=data_sharding)
    jax.block_until_ready(augment_fn(0, batches(0)['image']))   # Compile.
    t0, out = None, None
    for k, b in enumerate(batches.iterate(0, iters + 1)):
      out = augment_fn(k, b['image'])
      if k == 0:
        jax.block_until_ready(out)
        t0 = time.perf_counter()
    jax.block_until_ready(out)
    rows.append((f'jax fmnist preset, {name}',
                 iters * batch * v / (time.perf_counter() - t0)))
  if tf_images:
    scale = augment.PRESETS['fmnist'][0].crop_scale
    rows.append(('tf.data map, crop+flip only', _bench_tf(
        in_memory.images[:tf_images], scale, v, batch)))
  return rows, _train_step_views_per_s(max(2, iters // 2))


def _mesh_augment_fn(preset: str, num_views: int):
  """(augment_fn(step, images), data sharding): a preset's views jitted on
  the 8-device mesh as contrastive_jax/train.py builds its augment_fn."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  mesh = runtime.create_mesh()
  data_sharding = NamedSharding(mesh, P('data'))
  views_cfg = augment.build_views(preset, num_views, ())
  key = jax.random.key(0)
  augment_fn = jax.jit(
      lambda step, images: augment.augment_batch(
          jax.random.fold_in(key, step), images, views_cfg),
      in_shardings=(NamedSharding(mesh, P()), data_sharding),
      out_shardings=data_sharding)
  return augment_fn, data_sharding


# 5. Colour 32 px views (CIFAR), augmentation alone.
SMALL_COLOUR_PRESETS = ('simclr', 'simclr_small', 'cifar_small')


def small_colour_rows(iters: int, batch: int = 1024) -> list:
  """(preset, views/s) of each preset's 2 views of [batch, 32, 32, 3] uint8
  images already on the mesh (median of `iters` timed calls)."""
  import jax  # pylint: disable=g-import-not-at-top
  images = np.random.default_rng(0).integers(0, 256, (batch, 32, 32, 3),
                                             dtype=np.uint8)
  rows = []
  for preset in SMALL_COLOUR_PRESETS:
    augment_fn, data_sharding = _mesh_augment_fn(preset, 2)
    on_mesh = jax.device_put(images, data_sharding)
    jax.block_until_ready(augment_fn(0, on_mesh))                # Compile.
    times = []
    for k in range(iters):
      t = time.perf_counter()
      jax.block_until_ready(augment_fn(k + 1, on_mesh))
      times.append(time.perf_counter() - t)
    rows.append((preset, 2 * batch / statistics.median(times)))
  return rows


def _bench_tf(images, scale, num_views, batch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], 'GPU')
  h, w, _ = images.shape[1:]

  def crop_flip(image, seed):
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros((1, 0, 4)), seed=seed,
        area_range=scale, aspect_ratio_range=(3 / 4, 4 / 3),
        min_object_covered=0., use_image_if_no_bounding_boxes=True)
    crop = tf.slice(image, begin, size)
    crop = tf.image.resize(tf.cast(crop, tf.float32)[None], (h, w))[0] / 255.
    return tf.image.stateless_random_flip_left_right(crop, seed + 1)

  def make_views(i, image):
    return tf.stack([crop_flip(image, tf.stack([i, 2 * v]))
                     for v in range(num_views)])

  ds = tf.data.Dataset.from_tensor_slices(images).enumerate()
  ds = ds.map(make_views, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch).prefetch(tf.data.AUTOTUNE)
  for _ in ds.take(1):    # Warm-up: trace the map.
    pass
  t = time.perf_counter()
  n = 0
  for b in ds:
    n += int(b.shape[0])
  return n * num_views / (time.perf_counter() - t)


def _train_step_views_per_s(iters: int) -> float:
  """Views/s the default train step consumes, built as train.py builds it."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  mesh = runtime.create_mesh()
  setup = step_lib.build(config, mesh, total_steps=1000, steps_per_epoch=117,
                      num_examples=60_000, image_shape=(28, 28, 1))
  init_fn, step_fn = setup.init_fn, setup.step_fn
  state = init_fn(jax.random.key(0))
  b, v = config.batch_size, config.augment.num_views
  rng = np.random.default_rng(0)
  batch = jax.device_put(
      {'views': rng.random((b, v, 28, 28, 1), np.float32),
       'label': rng.integers(0, 10, b).astype(np.int32),
       'index': np.arange(b, dtype=np.int32)}, NamedSharding(mesh, P('data')))
  step_rng = jax.random.key(1)
  state, metrics = step_fn(state, batch, step_rng)          # Compile.
  jax.block_until_ready(metrics)
  t = time.perf_counter()
  for _ in range(iters):
    state, metrics = step_fn(state, batch, step_rng)
  jax.block_until_ready(metrics)
  return iters * b * v / (time.perf_counter() - t)


# --------------------------------------------------------------------------


def throughput_table(args, root, *, batch, rounds, timed, preset, num_views,
                     quick) -> list[str]:
  """Table 2: per round, ours (center_square), ours (full_image) and the
  peer, alternated; then each of ours' augmentation alone and host alone."""
  crop_sources = CROP_SOURCES if args.full_image else CROP_SOURCES[:1]
  variants = {}
  for cs in crop_sources:
    log(f'throughput: compiling {preset} augment_fn ({cs}) for batch '
        f'{batch} ...')
    variants[cs] = Ours(root, batch=batch, image_size=args.image_size,
                        preset=preset, num_views=num_views, crop_source=cs)
  ours = variants['center_square']
  have_torch = os.path.exists(args.torch_python)
  recipe = peer_args(preset, num_views)
  span = args.warmup + timed + 2
  rows = []   # Per round: {'e2e': {cs: img/s}, 'aug': ..., 'host': ..., 'peer'}
  for r in range(rounds):
    row = {'e2e': {}, 'aug': {}, 'host': {}, 'peer': None}
    for cs, o in variants.items():
      log(f'round {r + 1}: ours ({cs}) ...')
      row['e2e'][cs] = o.throughput(1 + 2 * r * span, args.warmup, timed)
      row['aug'][cs] = o.augment_only(2 if quick else 3)
      row['host'][cs] = o.throughput(1 + (2 * r + 1) * span, args.warmup,
                                     timed, augment=False)
    if have_torch:
      log(f'round {r + 1}: peer ...')
      row['peer'] = run_peer(args.torch_python, root, batch=batch,
                             image_size=args.image_size, warmup=args.warmup,
                             timed=timed, workers=args.workers, seed=r,
                             recipe=recipe)
    rows.append(row)

  full = 'full_image' in variants
  out = [
      f'\n2. Input images/s, {args.image_size} px, {preset} preset x '
      f'{num_views} views, batch {batch}, {root.name} ({len(ours.source):,}'
      f' JPEGs); each round: {args.warmup} warm-up + {timed} timed '
      'batches; alternated ' + ', '.join(
          [f'ours ({cs})' for cs in variants] + ['peer']),
      '   ours (center_square, the default): ImageFolder decode (JPEG draft) '
      f'+ fit to the {args.image_size} square (PIL, thread pool) + grain '
      'prefetch -> augment.augment_batch jitted on the '
      f'{ours.jax.device_count()}-device CPU mesh, random resized crop '
      'included, as contrastive_jax/train.py builds augment_fn (compiled '
      f'once, {ours.compile_s:.0f} s, not timed); batches '
      f'{list(ours.batch_shape)}']
  if full:
    f_ours = variants['full_image']
    out.append(
        "   full_image: config.dataset.train_crop_source='full_image': the "
        'host decodes at full resolution and cuts and resizes each view\'s '
        'crop (sources.RandomCrops via sources.training_fit), the devices '
        'skip only the crop (host_cropped=True); batches '
        f'{list(f_ours.batch_shape)} (compiled in {f_ours.compile_s:.0f} s)')
  out.append(f'   peer: torch DataLoader(num_workers={args.workers}, '
             'pin_memory=False), PIL transforms as torchvision\'s (its '
             'RandomResizedCrop from the full image), same recipe '
             f'({" ".join(recipe[:-1])})')
  head = f'   {"round":<8}{"ours":>9}'
  if full:
    head += f'{"full_image":>12}'
  head += f'{"peer":>9}{"ours/peer":>11}'
  if full:
    head += f'{"full/ours":>11}{"full/peer":>11}'
  out.append(head + '   (img/s)')

  def line(label, e2e, peer, ratios):
    text = f'   {label:<8}{e2e["center_square"]:>9.1f}'
    if full:
      text += f'{e2e["full_image"]:>12.1f}'
    text += f'{peer:>9.1f}' if peer is not None else f'{"skipped":>9}'
    for ratio in ratios:
      text += f'{ratio:>10.2f}x' if ratio is not None else f'{"-":>11}'
    return text

  def ratios(e2e, peer):
    c = e2e['center_square']
    res = [c / peer if peer else None]
    if full:
      f = e2e['full_image']
      res += [f / c, f / peer if peer else None]
    return res

  per_round = []
  for r, row in enumerate(rows):
    peer = row['peer']['images_per_s'] if row['peer'] else None
    per_round.append(ratios(row['e2e'], peer))
    out.append(line(str(r + 1), row['e2e'], peer, per_round[-1]))
  med = {cs: statistics.median(row['e2e'][cs] for row in rows)
         for cs in variants}
  med_peer = (statistics.median(row['peer']['images_per_s'] for row in rows)
              if have_torch else None)
  med_ratios = [None if any(x[i] is None for x in per_round) else
                statistics.median(x[i] for x in per_round)
                for i in range(len(per_round[0]))]
  out.append(line('median', med, med_peer, med_ratios))
  out.append('   ratios: per round, of figures measured minutes apart; the '
             'median row\'s ratios are the medians of the rounds\' ratios.')
  if have_torch:
    out.append(f'   peer: torch {rows[0]["peer"]["torch"]}, PIL in '
               f'{args.workers} worker processes')
  else:
    out.append(f'   PEER SKIPPED: {args.torch_python} does not exist. '
               f'Create it with: {TORCH_SETUP}')
  out.append('   timing windows start and end at a batch\'s arrival, so a '
             f'round is exact to about +-1 batch of {timed}.')

  # Breakdown.
  head = f'   {"round":<8}'
  for what in ('augment alone', 'host alone'):
    for cs in variants:
      head += f'{what + (", full" if cs == "full_image" else ""):>20}'
  out.append('   breakdown (img/s): "augment alone": augment_fn on a batch '
             'already on the mesh, after the round\'s timing; "host alone": '
             'the same TrainBatches.iterate (decode + fit / crops + grain + '
             'transfer to the mesh) with no augmentation, '
             f'{args.warmup} + {timed} batches of other steps')
  out.append(head)
  for label, vals in [(str(r + 1), row) for r, row in enumerate(rows)] + [
      ('median', {k: {cs: statistics.median(row[k][cs] for row in rows)
                      for cs in variants} for k in ('aug', 'host')})]:
    text = f'   {label:<8}'
    for k in ('aug', 'host'):
      for cs in variants:
        text += f'{vals[k][cs]:>20.1f}'
    out.append(text)
  if full:
    h = {cs: statistics.median(row['host'][cs] for row in rows)
         for cs in variants}
    out.append(f'   host alone, full_image / center_square: '
               f'{h["full_image"] / h["center_square"]:.2f}x (medians)')
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='small sets (200 / 1,600 images), batch 32, one '
                      'round of 3 batches, queue 8192: the whole run in a '
                      'few minutes, figures only indicative.')
  parser.add_argument('--sizes', type=int, nargs=2, default=None,
                      help='the two dataset sizes (default 1000 8000).')
  parser.add_argument('--image_side', type=int, default=256,
                      help='approximate side of the generated JPEGs.')
  parser.add_argument('--cache_dir', default='/tmp/contrastive_jax_bench')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch', type=int, default=None,
                      help='global batch (default 64; 32 with --quick).')
  parser.add_argument('--rss_steps', type=int, default=None,
                      help='batches streamed per RSS process (default: one '
                      'epoch of the larger set, + 1).')
  parser.add_argument('--rounds', type=int, default=None,
                      help='ours/peer alternations (default 2; 1 quick).')
  parser.add_argument('--batches', type=int, default=None,
                      help='timed batches per round (default 16; 3 quick).')
  parser.add_argument('--warmup', type=int, default=2,
                      help='batches before timing starts, per round.')
  parser.add_argument('--torch_python', default=TORCH_PYTHON)
  parser.add_argument('--workers', type=int, default=2,
                      help='DataLoader workers of the peer.')
  parser.add_argument('--queue_size', type=int, default=None,
                      help='MoCo queue rows (default 65536; 8192 quick).')
  parser.add_argument('--queue_steps', type=int, default=1)
  parser.add_argument('--data_dir', default=None,
                      help='TFDS data_dir for the Fashion-MNIST rows.')
  parser.add_argument('--fmnist_iters', type=int, default=None)
  parser.add_argument('--tf_images', type=int, default=None)
  for part in ('rss', 'throughput', 'queue', 'fmnist', 'colour32'):
    parser.add_argument(f'--{part}', action=argparse.BooleanOptionalAction,
                        default=True, help=f'run the {part} table.')
  parser.add_argument('--full_image', action=argparse.BooleanOptionalAction,
                      default=True,
                      help="table 2's ours with config.dataset."
                      "train_crop_source='full_image' beside the default "
                      "'center_square' (--no-full_image: the default only).")
  parser.add_argument('--_rss_child', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()

  if args._rss_child:   # pylint: disable=protected-access
    rss_child(args._rss_child, args.batch, args.image_size, args.rss_steps)  # pylint: disable=protected-access
    return

  quick = args.quick
  sizes = args.sizes or ((200, 1600) if quick else (1000, 8000))
  batch = args.batch or (32 if quick else 64)
  rss_steps = args.rss_steps or max(sizes) // batch + 1
  rounds = args.rounds or (1 if quick else 2)
  timed = args.batches or (3 if quick else 16)
  queue = args.queue_size or (8192 if quick else 65536)
  fmnist_iters = args.fmnist_iters or (2 if quick else 5)
  tf_images = args.tf_images if args.tf_images is not None else (
      0 if quick else 2048)
  preset, num_views = 'simclr', 2

  t_start = time.time()
  load0 = os.getloadavg()
  roots = [make_image_folder(args.cache_dir, n, args.image_side)
           for n in sizes]
  out = []   # The report, printed at the end.

  # 1. RSS.
  if args.rss:
    res = []
    for root in roots:
      log(f'RSS: streaming {rss_steps} batches of {batch} from {root} '
          '(fresh process) ...')
      res.append(measure_rss(root, batch, args.image_size, rss_steps))
    out.append(f'\n1. Host RSS of the streamed path: sources.ImageFolder -> '
               f'TrainBatches.iterate(0, {rss_steps}), {args.image_size} px, '
               f'batch {batch}, {res[0]["devices"]} CPU devices; a fresh '
               'process per dataset; peak = VmHWM '
               + ('reset after set-up' if all(r['peak_reset'] for r in res)
                  else 'over the process lifetime (reset not allowed)'))
    out.append(f'   {"dataset":<16}{"files":>7}{"on disk":>10}'
               f'{"in-memory":>11}{"read":>7}{"RSS set-up":>12}'
               f'{"peak":>10}{"growth":>9}{"img/s":>7}')
    for root, r in zip(roots, res):
      in_mem = r['files'] * args.image_size**2 * 3
      out.append(
          f'   {root.name:<16}{r["files"]:>7,}{_mib(_disk_bytes(root)):>10}'
          f'{_mib(in_mem):>11}{r["images_read"]:>7,}'
          f'{_mib(r["setup_kib"] * 1024):>12}{_mib(r["peak_kib"] * 1024):>10}'
          f'{_mib((r["peak_kib"] - r["setup_kib"]) * 1024):>9}'
          f'{r["images_read"] / r["seconds"]:>7.0f}')
    small, large = res
    g_small = small['peak_kib'] - small['setup_kib']
    g_large = large['peak_kib'] - large['setup_kib']
    extra_data = (large['files'] - small['files']) * args.image_size**2 * 3
    extra_peak = (large['peak_kib'] - small['peak_kib']) * 1024
    grows = extra_peak > 0.1 * extra_data
    out.append(
        f'   {roots[1].name} / {roots[0].name}: files '
        f'{large["files"] / small["files"]:.1f}x; peak RSS '
        f'{large["peak_kib"] / small["peak_kib"]:.2f}x '
        f'({extra_peak / 2**20:+,.0f} MiB; in memory the split would add '
        f'{_mib(extra_data)}); growth while streaming '
        f'{g_large / max(g_small, 1):.2f}x. RSS '
        f'{"GROWS" if grows else "does not grow"} with the dataset size.')
    out.append('   "in-memory": what an ArrayDataset of the split would hold '
               '(N x 224 x 224 x 3 B); "img/s": streaming alone, no '
               'augmentation.')

  # 2. Throughput.
  if args.throughput:
    out.extend(throughput_table(args, roots[-1], batch=batch, rounds=rounds,
                                timed=timed, preset=preset,
                                num_views=num_views, quick=quick))

  # 3. Queue.
  if args.queue:
    log(f'queue: compiling the MoCo v2 step twice (Q={queue}) ...')
    rows = queue_rows(queue, 128, 256, args.queue_steps)
    out.append(f'\n3. MoCo v2 queue (configs/moco_v2.py, batch 256 x 2 views, '
               f'Q={queue}, D=128: [Q, D] f32 = '
               f'{queue * 128 * 4 / 2**20:.1f} MiB), bytes moved by '
               'collectives per step per device, via benchmarks/queue_comm.py')
    out.append(f'   {"variant":<26}{"total MiB":>11}{"all-gather":>12}'
               f'{"queue gathers":>15}{"step s":>8}')
    for row in rows:
      out.append(f'   {row["label"]:<26}{row["total"] / 2**20:>11.3f}'
                 f'{row["all_gather"] / 2**20:>12.3f}'
                 f'{row["queue_gathers"]:>15}{row["step_s"]:>8.2f}')
    out.append(f'   {rows[0]["total"] / max(rows[1]["total"], 1):.1f}x fewer '
               'bytes; full table (step times, largest ops, memory bank): '
               'PYTHONPATH=. .venv/bin/python benchmarks/queue_comm.py')

  # 4. Small images.
  if args.fmnist:
    log('Fashion-MNIST rows ...')
    try:
      rows, consume = fmnist_rows(args.data_dir, fmnist_iters, tf_images)
    except Exception as e:  # pylint: disable=broad-except
      out.append(f'\n4. Fashion-MNIST rows skipped: {type(e).__name__}: '
                 f'{str(e)[:300]}')
    else:
      out.append('\n4. Small images: Fashion-MNIST 28x28x1, batch 512, 2 '
                 'views (views/s; x = over what the default train step '
                 'consumes)')
      out.append(f'   {"default train step (configs/base.py)":<52}'
                 f'{consume:>10,.0f}  consumed')
      for name, rate in rows:
        out.append(f'   {name:<52}{rate:>10,.0f}{rate / consume:>8.1f}x')

  # 5. Colour 32 px views.
  if args.colour32:
    log('32 px colour views ...')
    out.append('\n5. 32x32x3 views/s, augmentation alone (2 views of a '
               'batch of 1,024 on the mesh, median of '
               f'{fmnist_iters * 2} calls); simclr is the full recipe: crop, '
               'flip, colour jitter, grayscale, blur')
    for name, rate in small_colour_rows(fmnist_iters * 2):
      out.append(f'   {name:<52}{rate:>10,.0f}')

  load1 = os.getloadavg()
  print('\n'.join(out))
  print(f'\nCaveat: the {os.cpu_count()} CPU cores are shared by everything '
        'measured here (host decoding, grain\'s threads, the '
        'augmentation on 8 virtual devices, the peer\'s worker processes) and '
        f'by other users\' jobs: load average {load0[0]:.1f} at start, '
        f'{load1[0]:.1f} at end. Figures are noisy; compare rows of one run.'
        f'\nTotal {math.ceil(time.time() - t_start)} s.')


if __name__ == '__main__':
  main()
