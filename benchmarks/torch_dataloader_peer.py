r"""The PyTorch peer of benchmarks/input_pipeline.py: SimCLR views with PIL.

What a solo-learn / SimCLR user without DALI runs on a CPU host: a torch
`Dataset` over the image files whose `__getitem__` opens one JPEG with PIL and
makes two views with the PIL implementations of torchvision's transforms,
batched by a `DataLoader(num_workers=2, pin_memory=False)`. torchvision does
not install against the CPU torch build served here, so the transforms are
written below with PIL, the way torchvision's PIL backend does them
(`torchvision/transforms/functional_pil.py`):

  RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))  10 tries, then
      the centre-crop fallback; crop + resize with PIL BILINEAR
  RandomHorizontalFlip(0.5)                                  Image.transpose
  RandomApply(ColorJitter(b, c, s, h), p=0.8)                random order;
      ImageEnhance.Brightness / Contrast / Color, hue as a shift of the H
      plane in PIL's HSV mode (adjust_hue)
  RandomGrayscale(0.2)                                       convert('L'), 3 ch
  RandomApply(GaussianBlur(sigma ~ U[0.1, 2.0]), p=0.5)      ImageFilter
  ToTensor                                                   float CHW / 255

It imports only torch, numpy and PIL: run it with an interpreter that has
torch (the project's requirements do not), e.g.

    /tmp/torchvenv/bin/python benchmarks/torch_dataloader_peer.py \
        --root=/tmp/contrastive_jax_bench/jpeg_8000/train --batches=20

Prints one JSON line: images/s over the timed batches (after `--warmup`
batches, which absorb the workers' start-up), and the settings.

`--host_crops` makes only each view's random resized crop as uint8 (the
host's share when the rest of the recipe runs on the accelerator, what
ours does on the host); `--cores` and `--busy` are for
benchmarks/input_rate.py's per-core and busy-thread rows.
"""

import argparse
import json
import math
import os
import random
import time

import numpy as np
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageFilter
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')


def random_resized_crop(img, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
  """torchvision RandomResizedCrop.get_params + F.resized_crop on PIL."""
  width, height = img.size
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target_area = area * random.uniform(scale[0], scale[1])
    aspect = math.exp(random.uniform(log_ratio[0], log_ratio[1]))
    w = int(round(math.sqrt(target_area * aspect)))
    h = int(round(math.sqrt(target_area / aspect)))
    if 0 < w <= width and 0 < h <= height:
      i = random.randint(0, height - h)
      j = random.randint(0, width - w)
      break
  else:   # Fallback: the central crop, clipped to the ratio range.
    in_ratio = width / height
    if in_ratio < min(ratio):
      w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
      h, w = height, int(round(height * max(ratio)))
    else:
      w, h = width, height
    i, j = (height - h) // 2, (width - w) // 2
  return img.crop((j, i, j + w, i + h)).resize((size, size), Image.BILINEAR)


def adjust_hue(img, hue_factor):
  """torchvision functional_pil.adjust_hue: shift the H plane of HSV."""
  h, s, v = img.convert('HSV').split()
  np_h = np.array(h, dtype=np.uint8)
  np_h += np.uint8(int(round(hue_factor * 255)) % 256)   # Wraps, as there.
  h = Image.fromarray(np_h, 'L')
  return Image.merge('HSV', (h, s, v)).convert('RGB')


def color_jitter(img, brightness, contrast, saturation, hue):
  """torchvision ColorJitter on PIL: the four ops in a random order."""
  b = random.uniform(max(0., 1 - brightness), 1 + brightness)
  c = random.uniform(max(0., 1 - contrast), 1 + contrast)
  s = random.uniform(max(0., 1 - saturation), 1 + saturation)
  hf = random.uniform(-hue, hue)
  ops = [lambda x: ImageEnhance.Brightness(x).enhance(b),
         lambda x: ImageEnhance.Contrast(x).enhance(c),
         lambda x: ImageEnhance.Color(x).enhance(s),
         lambda x: adjust_hue(x, hf)]
  for k in torch.randperm(4).tolist():
    img = ops[k](img)
  return img


def to_tensor(img):
  """torchvision F.to_tensor: uint8 HWC -> float CHW in [0, 1]."""
  x = torch.from_numpy(np.array(img, np.uint8, copy=True))
  return x.permute(2, 0, 1).contiguous().to(torch.float32).div(255)


class SimCLRViews:
  """SimCLR's ImageNet recipe as torchvision composes it (PIL backend)."""

  def __init__(self, size, jitter, jitter_p=0.8, grayscale_p=0.2,
               blur_p=0.5, blur_sigma=(0.1, 2.0), crop_scale=(0.08, 1.0)):
    self.size, self.jitter, self.jitter_p = size, jitter, jitter_p
    self.grayscale_p, self.blur_p, self.blur_sigma = (grayscale_p, blur_p,
                                                      blur_sigma)
    self.crop_scale = crop_scale

  def __call__(self, img):
    img = random_resized_crop(img, self.size, self.crop_scale)
    if random.random() < 0.5:
      img = img.transpose(Image.FLIP_LEFT_RIGHT)
    if random.random() < self.jitter_p:
      img = color_jitter(img, *self.jitter)
    if random.random() < self.grayscale_p:
      img = img.convert('L').convert('RGB')
    if random.random() < self.blur_p:
      sigma = random.uniform(*self.blur_sigma)
      img = img.filter(ImageFilter.GaussianBlur(radius=sigma))
    return to_tensor(img)


def list_images(split_dir):
  """(files, labels) in sorted (class, file) order, as sources.ImageFolder."""
  classes = sorted(d for d in os.listdir(split_dir)
                   if os.path.isdir(os.path.join(split_dir, d)))
  files, labels = [], []
  for label, name in enumerate(classes):
    class_dir = os.path.join(split_dir, name)
    for f in sorted(os.listdir(class_dir)):
      if f.lower().endswith(IMAGE_EXTENSIONS):
        files.append(os.path.join(class_dir, f))
        labels.append(label)
  return files, labels


class HostCrops:
  """The host part of the recipe alone: RandomResizedCrop, uint8 CHW.

  The DataLoader mode of a pipeline that augments on the accelerator
  (the flip, colour and blur ops run on the GPU next to the step), and the
  host work that ours does: decode and cut each view's crop.
  """

  def __init__(self, size, crop_scale=(0.08, 1.0)):
    self.size, self.crop_scale = size, crop_scale

  def __call__(self, img):
    img = random_resized_crop(img, self.size, self.crop_scale)
    return torch.from_numpy(np.asarray(img, np.uint8)).permute(2, 0, 1)


class ImageFiles(Dataset):

  def __init__(self, split_dir, transform, num_views):
    self.files, self.labels = list_images(split_dir)
    self.transform, self.num_views = transform, num_views

  def __len__(self):
    return len(self.files)

  def __getitem__(self, i):
    with Image.open(self.files[i]) as im:
      img = im.convert('RGB')
    views = torch.stack([self.transform(img) for _ in range(self.num_views)])
    return views, self.labels[i]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--root', required=True,
                      help='<split dir>/<class>/<image> files.')
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--batches', type=int, default=20,
                      help='timed batches (after the warm-up ones).')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--workers', type=int, default=2)
  parser.add_argument('--size', type=int, default=224)
  parser.add_argument('--views', type=int, default=2)
  parser.add_argument('--jitter', type=float, nargs=4,
                      default=(0.8, 0.8, 0.8, 0.2),
                      metavar=('B', 'C', 'S', 'H'),
                      help='ColorJitter(brightness, contrast, saturation, '
                      'hue); SimCLR strength s gives 0.8s, 0.8s, 0.8s, 0.2s.')
  parser.add_argument('--crop_scale', type=float, nargs=2, default=(0.08, 1.))
  parser.add_argument('--jitter_p', type=float, default=0.8)
  parser.add_argument('--grayscale_p', type=float, default=0.2)
  parser.add_argument('--blur_p', type=float, default=0.5)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--host_crops', action='store_true',
                      help='Only decode and cut each view\'s random resized '
                      'crop (uint8), the rest of the recipe left to the '
                      'accelerator (HostCrops).')
  parser.add_argument('--cores', type=int, default=0,
                      help='Run on the first N cores (0: all this process '
                      'may use).')
  parser.add_argument('--busy', action='store_true',
                      help='A pure-Python thread spins in the main process '
                      'meanwhile, as a training loop\'s Python work would.')
  args = parser.parse_args()
  if args.cores:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])

  torch.manual_seed(args.seed)
  transform = (HostCrops(args.size, tuple(args.crop_scale)) if args.host_crops
               else SimCLRViews(args.size, tuple(args.jitter), args.jitter_p,
                                args.grayscale_p, args.blur_p,
                                crop_scale=tuple(args.crop_scale)))
  dataset = ImageFiles(args.root, transform, args.views)
  # The DataLoader's strongest CPU-host settings: workers kept across
  # epochs, each two batches ahead; pinned memory where a GPU takes them.
  loader = DataLoader(dataset, batch_size=args.batch, shuffle=True,
                      num_workers=args.workers,
                      pin_memory=torch.cuda.is_available(),
                      drop_last=True, persistent_workers=args.workers > 0,
                      prefetch_factor=2 if args.workers else None)
  if args.busy:
    import threading  # pylint: disable=g-import-not-at-top

    def spin():
      n = 0
      while True:
        n += 1

    threading.Thread(target=spin, daemon=True).start()
  need = args.warmup + args.batches   # Index of the last timed batch.
  if need + 1 > len(loader):
    raise SystemExit(f'{need + 1} batches requested, the loader has '
                     f'{len(loader)}; use a larger --root or fewer batches.')
  t_start = time.perf_counter()
  images, t0, shape = 0, None, None
  for b, (views, _) in enumerate(loader):
    if b == args.warmup:
      t0 = time.perf_counter()
    elif b > args.warmup:
      images += views.shape[0]
    shape = tuple(views.shape)
    if b == need:
      break
  elapsed = time.perf_counter() - t0
  print(json.dumps({
      'images_per_s': images / elapsed, 'images': images,
      'seconds': elapsed, 'warmup_s': t0 - t_start, 'batch_shape': shape,
      'workers': args.workers, 'torch': torch.__version__,
      'cores': len(os.sched_getaffinity(0)), 'busy': args.busy,
      'host_crops': args.host_crops,
      'torch_threads_main': torch.get_num_threads()}))


if __name__ == '__main__':
  main()
