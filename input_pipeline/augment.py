"""Image augmentations as pure, jittable JAX functions.

Each op maps `(rng, image [H, W, C] float32 in [0, 1], **params) -> image` and is
vmapped over the batch by `augment_batch`, so one jitted call turns a sharded
batch of raw images into K views on the devices that train on them (BYOL does
its colour ops the same way). On this 2-core CPU that runs at several times the
rate of a per-image tf.data map (the measurement: docs/input_pipeline.md).

Grayscale images (C = 1) are supported: saturation, hue and random grayscale are
identities on one channel (there is no colour to change), brightness and
contrast act on the single channel.

A view's recipe is a `ViewConfig`; `PRESETS` holds the papers' recipes, and
`build_views` turns a preset name plus per-view overrides (from the config) into
the V recipes (AutoAugment is one of a view's ops: `ViewConfig.autoaugment`).
Views may differ in output size (multi-crop: global and smaller
local crops); `augment_views` returns one array per view, `augment_batch` the
stacked `[B, V, H, W, C]` when all views share a size.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ViewConfig:
  """The augmentation recipe of one view. Ops run in the order listed.

  Attributes:
    crop_scale: (min, max) area fraction of the random resized crop; None skips
      it. SimCLR uses (0.08, 1).
    crop_ratio: (min, max) aspect ratio of the crop.
    pad_crop: pixels of zero padding for a random translation crop back to the
      input size (TCL's `RandomCrop(28, padding=4)`); 0 disables it.
    flip_p: probability of a horizontal flip.
    autoaugment: '' (off) or the name of an AutoAugment policy
      (`AUTOAUGMENT_POLICIES`: 'cifar10', 'imagenet', or TF Model Garden's
      'v0'), applied after the flip (see `autoaugment`).
    autoaugment_impl: whose conventions AutoAugment follows: 'torchvision'
      (magnitude = the bin's value with a random sign, nearest-neighbour
      warps) or 'pytorch_auto_augment' (the port the TCL code uses:
      magnitudes uniform within the bin, cubic-spline warps rounded to
      8-bit levels) for 'cifar10' and 'imagenet'; 'tf_model_garden' (TF's
      ops, levels and uint8 arithmetic, `tf_autoaugment`) for 'v0', the one
      convention that defines it.
    jitter_strength: colour-jitter strength s, SimCLR's shorthand for the
      amounts (brightness, contrast, saturation, hue) = (0.8 s, 0.8 s, 0.8 s,
      0.2 s); used when `jitter` is None.
    jitter: the four amounts (brightness, contrast, saturation, hue) as
      torchvision's ColorJitter takes them (MoCo v3: (0.4, 0.4, 0.2, 0.1)),
      for recipes that no single strength expresses. When given, it replaces
      `jitter_strength`.
    jitter_p: probability of applying colour jitter.
    grayscale_p: probability of converting to grayscale.
    blur_p: probability of a Gaussian blur (sigma in [0.1, 2], kernel ~10% of
      the image side, as SimCLR).
    solarize_p: probability of solarisation (BYOL).
    erase_p: probability of random erasing of one rectangle (Zhong et al.).
    size: output size of the view. None keeps the input size; an int n gives
      n x n; a (height, width) tuple of ints gives that size; a float f in
      (0, 1] gives round(f * input side) per side, so one preset serves 28x28
      and 224x224 inputs alike (multi-crop's local crops: 96/224 = 3/7).
    op_order: the order of the ops, names of `OPS` starting with 'crop'
      (which sets the view's size); every op the view uses must be named.
      The translation crop runs with 'crop' (before it), erasing last. Set
      for every view by `config.augment.op_order` (`build_views`). The
      flip commutes with the pixel ops; of the others, grayscale and jitter
      are the pair whose order recipes change (InsDis: grayscale first).
  """
  crop_scale: tuple[float, float] | None = (0.08, 1.0)
  crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
  pad_crop: int = 0
  flip_p: float = 0.5
  autoaugment: str = ''
  autoaugment_impl: str = 'torchvision'
  jitter_strength: float = 0.0
  jitter: tuple[float, float, float, float] | None = None
  jitter_p: float = 0.8
  grayscale_p: float = 0.0
  blur_p: float = 0.0
  solarize_p: float = 0.0
  erase_p: float = 0.0
  size: int | float | tuple[int, int] | None = None
  op_order: tuple[str, ...] = ('crop', 'flip', 'autoaugment', 'jitter',
                               'grayscale', 'blur', 'solarize')

  def jitter_amounts(self) -> tuple[float, float, float, float]:
    """(brightness, contrast, saturation, hue): `jitter`, else from s."""
    if self.jitter is not None:
      return tuple(self.jitter)
    s = self.jitter_strength
    return (0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)


# The ops a view's `op_order` orders, and the field that turns each on.
OPS = ('crop', 'flip', 'autoaugment', 'jitter', 'grayscale', 'blur',
       'solarize')
DEFAULT_OP_ORDER = ViewConfig.op_order


def parse_op_order(order) -> tuple[str, ...]:
  """'crop, grayscale, jitter, flip' (or a sequence of names) -> a tuple of
  distinct `OPS` names starting with 'crop'; raises otherwise."""
  names = tuple(n.strip() for n in (order.split(',') if isinstance(order, str)
                                     else order))
  if (not names or names[0] != 'crop' or len(set(names)) != len(names)
      or not set(names) <= set(OPS)):
    raise ValueError(f'op order {order!r}: name distinct ops of '
                     f'{", ".join(OPS)}, starting with crop (e.g. '
                     f'{", ".join(DEFAULT_OP_ORDER)!r}).')
  return names


# V is bounded because every view is a full forward pass per step; 10 covers
# the papers (CACR/CMC K+1 = 5, TCL 3, multi-crop 2 + 8 local).
# One view suffices for memory-bank methods (InsDis: the bank holds the other
# side of each pair); the issue asks for up to 10.
MIN_VIEWS, MAX_VIEWS = 1, 10


def resolve_size(size, input_hw: Sequence[int]) -> tuple[int, int]:
  """The (height, width) of a view of `size` (see `ViewConfig.size`).

  Args:
    size: None, an int, a float in (0, 1], or a (height, width) int pair.
    input_hw: (height, width) of the input image.

  Returns:
    (height, width) as Python ints.
  """
  h, w = int(input_hw[0]), int(input_hw[1])
  if size is None:
    return h, w
  if isinstance(size, bool):
    raise ValueError(f'view size must be an int, float or pair; got {size!r}.')
  if isinstance(size, int):
    out = (size, size)
  elif isinstance(size, float):
    if not 0. < size <= 1.:
      raise ValueError(f'a fractional view size must be in (0, 1]; got {size}.')
    out = (max(1, round(size * h)), max(1, round(size * w)))
  else:
    out = tuple(int(x) for x in size)
    if len(out) != 2:
      raise ValueError(f'view size must be (height, width); got {size!r}.')
  if min(out) < 1:
    raise ValueError(f'view size must be positive; got {size!r}.')
  return out


def random_resized_crop(rng, image, *, scale=(0.08, 1.0),
                        ratio=(3 / 4, 4 / 3), size=None):
  """Crops a random box of area fraction ~U(scale), log-ratio ~U(log ratio).

  The box is resized to `size` (default: the input size) with bilinear
  interpolation. Out of range boxes are clipped to the image (torchvision falls
  back to a centre crop after 10 tries; clipping keeps this branch-free under
  jit).

  Args:
    rng: PRNG key.
    image: [H, W, C] float.
    scale: (min, max) area fraction of the box.
    ratio: (min, max) aspect ratio (width / height) of the box.
    size: output (height, width); None keeps [H, W].

  Returns:
    [size[0], size[1], C], same dtype as `image`.
  """
  h, w, c = image.shape
  oh, ow = (h, w) if size is None else size
  k_area, k_ratio, k_y, k_x = jax.random.split(rng, 4)
  area = jax.random.uniform(k_area, (), minval=scale[0], maxval=scale[1])
  log_r = jax.random.uniform(k_ratio, (), minval=math.log(ratio[0]),
                             maxval=math.log(ratio[1]))
  r = jnp.exp(log_r)
  ch = jnp.clip(jnp.sqrt(area / r) * h, 1.0, h)
  cw = jnp.clip(jnp.sqrt(area * r) * w, 1.0, w)
  y0 = jax.random.uniform(k_y, ()) * (h - ch)
  x0 = jax.random.uniform(k_x, ()) * (w - cw)
  # scale_and_translate maps input coordinate u to u * scale + translation,
  # so the box [y0, y0 + ch] lands on the output's [0, oh].
  sy, sx = oh / ch, ow / cw
  return jax.image.scale_and_translate(
      image, (oh, ow, c), spatial_dims=(0, 1), scale=jnp.stack([sy, sx]),
      translation=jnp.stack([-y0 * sy, -x0 * sx]), method='linear',
      antialias=False)


def pad_and_crop(rng, image, *, pad):
  """Zero-pads by `pad` pixels and takes a random crop of the input size."""
  h, w, _ = image.shape
  padded = jnp.pad(image, ((pad, pad), (pad, pad), (0, 0)))
  dy, dx = jax.random.randint(rng, (2,), 0, 2 * pad + 1)
  return jax.lax.dynamic_slice(padded, (dy, dx, 0), image.shape)


def flip_left_right(rng, image, *, p=0.5):
  return jnp.where(jax.random.bernoulli(rng, p), image[:, ::-1], image)


def to_grayscale(image):
  """ITU-R 601 luma, replicated over the input's channels."""
  if image.shape[-1] == 1:
    return image
  gray = image @ jnp.array([0.299, 0.587, 0.114], image.dtype)
  return jnp.broadcast_to(gray[..., None], image.shape)


_TO_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322],
                    [0.211, -0.523, 0.312]], np.float32)
_FROM_YIQ = np.linalg.inv(_TO_YIQ.astype(np.float64)).astype(np.float32)


def _hue_matrix(delta):
  """[3, 3] colour map rotating chroma by `delta` turns in YIQ space (a
  smooth stand-in for HSV's hue shift): FROM_YIQ R(delta) TO_YIQ."""
  theta = 2 * jnp.pi * delta
  c, s = jnp.cos(theta), jnp.sin(theta)
  rotation = jnp.array([[1., 0., 0.], [0., c, -s], [0., s, c]])
  return jnp.asarray(_FROM_YIQ) @ rotation @ jnp.asarray(_TO_YIQ)


def jitter(image, brightness, contrast, saturation, hue):
  """Brightness, contrast, saturation and hue, then one clip to [0, 1].

  Each op is an affine map of the pixel's colour vector x (C = 1 or 3):
    brightness  x -> b x
    contrast    x -> c x + (1 - c) m 1,  m = mean over pixels of g.x
    saturation  x -> s x + (1 - s) (g.x) 1        (colour only)
    hue         x -> H(delta) x                   (colour only)
  with g the ITU-R 601 luma weights (1 for one channel). Saturation and hue
  keep every pixel's luma g.x and move only its chroma (scaled, rotated),
  brightness scales x and m alike, and contrast fixes grey: the four maps
  commute, so SimCLR's random order of them gives the same image in every
  order here (SimCLR also clips after each op, and then the order matters;
  this clips once). They compose into one affine map x -> A x + t, built
  on [C, C] matrices and applied to the image in one elementwise pass (a
  `lax.switch` between image-sized ops in random order evaluated every
  branch at each position under vmap: SimCLR's whole recipe ran 3x slower
  at 32 px).

  Args:
    image: [H, W, C] float in [0, 1].
    brightness, contrast, saturation, hue: scalar factors (hue in turns).

  Returns:
    [H, W, C], the jittered image.
  """
  channels = image.shape[-1]
  eye = jnp.eye(channels, dtype=image.dtype)
  if channels == 3:
    g = jnp.asarray(_TO_YIQ[0], image.dtype)
    blend = saturation * eye + (1. - saturation) * jnp.outer(
        jnp.ones(3, image.dtype), g)
    a = brightness * contrast * _hue_matrix(hue).astype(image.dtype) @ blend
  else:
    g = jnp.ones((1,), image.dtype)
    a = brightness * contrast * eye
  # The mean luma contrast pulls towards, after brightness.
  m = brightness * (g @ jnp.mean(image, axis=(0, 1)))
  t = (1. - contrast) * m * jnp.ones((channels,), image.dtype)
  # x A^T + t as C broadcast multiply-adds: elementwise, one fused pass (a
  # per-image [C, C] matmul would be a batched tiny matmul under vmap).
  out = t + sum(image[..., k:k + 1] * a[:, k] for k in range(channels))
  return jnp.clip(out, 0., 1.)


def color_jitter(rng, image, *, amounts, p=0.8):
  """Colour jitter with amounts (b, c, s, h), applied with probability p.

  Brightness, contrast and saturation factors are drawn from
  [1 - b, 1 + b], [1 - c, 1 + c], [1 - s, 1 + s] and hue from [-h, h]
  (turns), as torchvision's `ColorJitter(b, c, s, h)`; SimCLR's
  `color_jitter(strength=s)` is amounts (0.8 s, 0.8 s, 0.8 s, 0.2 s)
  (`ViewConfig.jitter_amounts`). The ops are those of `jitter`.
  """
  # A sixth key is split off and unused (the ops commute, so no order is
  # drawn): the other five stay the keys a seed has always given, so a
  # seed's views do not change.
  k_apply, k_b, k_c, k_s, k_h, _ = jax.random.split(rng, 6)
  r_b, r_c, r_s, r_h = amounts
  u = lambda k, r: jax.random.uniform(k, (), minval=1 - r, maxval=1 + r)
  b, c, s = u(k_b, r_b), u(k_c, r_c), u(k_s, r_s)
  hue = jax.random.uniform(k_h, (), minval=-r_h, maxval=r_h)
  out = jitter(image, b, c, s, hue)
  return jnp.where(jax.random.bernoulli(k_apply, p), out, image)


def gaussian_blur(rng, image, *, p, sigma=(0.1, 2.0)):
  """Separable Gaussian blur, kernel side ~10% of the image (odd, >= 3)."""
  k_apply, k_sigma = jax.random.split(rng)
  side = max(3, int(image.shape[0] * 0.1) // 2 * 2 + 1)
  s = jax.random.uniform(k_sigma, (), minval=sigma[0], maxval=sigma[1])
  x = jnp.arange(side, dtype=jnp.float32) - side // 2
  kernel = jnp.exp(-x**2 / (2 * s**2))
  kernel = kernel / jnp.sum(kernel)
  pad = side // 2
  padded = jnp.pad(image, ((pad, pad), (pad, pad), (0, 0)), mode='reflect')
  # Separable: convolve rows then columns with the same 1-D kernel.
  rows = sum(kernel[i] * padded[i:i + image.shape[0]] for i in range(side))
  out = sum(kernel[i] * rows[:, i:i + image.shape[1]] for i in range(side))
  return jnp.where(jax.random.bernoulli(k_apply, p), out, image)


def solarize(rng, image, *, p, threshold=0.5):
  out = jnp.where(image < threshold, image, 1. - image)
  return jnp.where(jax.random.bernoulli(rng, p), out, image)


def random_erase(rng, image, *, p, scale=(0.02, 0.2)):
  """Zeroes one random rectangle of area fraction ~U(scale), aspect in [0.3, 3.3]."""
  h, w, _ = image.shape
  k_apply, k_area, k_ratio, k_y, k_x = jax.random.split(rng, 5)
  area = jax.random.uniform(k_area, (), minval=scale[0], maxval=scale[1]) * h * w
  r = jnp.exp(jax.random.uniform(k_ratio, (), minval=math.log(0.3),
                                 maxval=math.log(3.3)))
  eh = jnp.clip(jnp.sqrt(area * r), 1, h)
  ew = jnp.clip(jnp.sqrt(area / r), 1, w)
  y0 = jax.random.uniform(k_y, ()) * (h - eh)
  x0 = jax.random.uniform(k_x, ()) * (w - ew)
  yy = jnp.arange(h)[:, None, None]
  xx = jnp.arange(w)[None, :, None]
  inside = (yy >= y0) & (yy < y0 + eh) & (xx >= x0) & (xx < x0 + ew)
  out = jnp.where(inside, 0., image)
  return jnp.where(jax.random.bernoulli(k_apply, p), out, image)


# AutoAugment (Cubuk et al. 2019, "AutoAugment: Learning Augmentation
# Policies from Data"), with the op definitions and magnitude tables of
# torchvision's `transforms.AutoAugment` by default, or those of the port in
# 4uiiurz1/pytorch-auto-augment (`autoaugment_impl`), written for float
# images in [0, 1].
AUTOAUGMENT_OPS = ('ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate',
                   'Brightness', 'Color', 'Contrast', 'Sharpness', 'Posterize',
                   'Solarize', 'AutoContrast', 'Equalize', 'Invert')
_NUM_GEOMETRIC = 5        # The first five ops move pixels; the rest map values.
# Ops whose magnitude takes a random sign (probability 1/2).
_SIGNED_OPS = frozenset(AUTOAUGMENT_OPS[:9])
AUTOAUGMENT_BINS = 10

# The policies: 25 sub-policies of two (op, probability, magnitude bin)
# triples; None for ops without a magnitude. These are torchvision's
# `AutoAugmentPolicy.CIFAR10` / `.IMAGENET`; the CIFAR-10 one is also the
# table of the port the TCL code copies (which gives bins to every op).
AUTOAUGMENT_POLICIES = {
    'cifar10': (
        (('Invert', 0.1, None), ('Contrast', 0.2, 6)),
        (('Rotate', 0.7, 2), ('TranslateX', 0.3, 9)),
        (('Sharpness', 0.8, 1), ('Sharpness', 0.9, 3)),
        (('ShearY', 0.5, 8), ('TranslateY', 0.7, 9)),
        (('AutoContrast', 0.5, None), ('Equalize', 0.9, None)),
        (('ShearY', 0.2, 7), ('Posterize', 0.3, 7)),
        (('Color', 0.4, 3), ('Brightness', 0.6, 7)),
        (('Sharpness', 0.3, 9), ('Brightness', 0.7, 9)),
        (('Equalize', 0.6, None), ('Equalize', 0.5, None)),
        (('Contrast', 0.6, 7), ('Sharpness', 0.6, 5)),
        (('Color', 0.7, 7), ('TranslateX', 0.5, 8)),
        (('Equalize', 0.3, None), ('AutoContrast', 0.4, None)),
        (('TranslateY', 0.4, 3), ('Sharpness', 0.2, 6)),
        (('Brightness', 0.9, 6), ('Color', 0.2, 8)),
        (('Solarize', 0.5, 2), ('Invert', 0.0, None)),
        (('Equalize', 0.2, None), ('AutoContrast', 0.6, None)),
        (('Equalize', 0.2, None), ('Equalize', 0.6, None)),
        (('Color', 0.9, 9), ('Equalize', 0.6, None)),
        (('AutoContrast', 0.8, None), ('Solarize', 0.2, 8)),
        (('Brightness', 0.1, 3), ('Color', 0.7, 0)),
        (('Solarize', 0.4, 5), ('AutoContrast', 0.9, None)),
        (('TranslateY', 0.9, 9), ('TranslateY', 0.7, 9)),
        (('AutoContrast', 0.9, None), ('Solarize', 0.8, 3)),
        (('Equalize', 0.8, None), ('Invert', 0.1, None)),
        (('TranslateY', 0.7, 9), ('AutoContrast', 0.9, None)),
    ),
    'imagenet': (
        (('Posterize', 0.4, 8), ('Rotate', 0.6, 9)),
        (('Solarize', 0.6, 5), ('AutoContrast', 0.6, None)),
        (('Equalize', 0.8, None), ('Equalize', 0.6, None)),
        (('Posterize', 0.6, 7), ('Posterize', 0.6, 6)),
        (('Equalize', 0.4, None), ('Solarize', 0.2, 4)),
        (('Equalize', 0.4, None), ('Rotate', 0.8, 8)),
        (('Solarize', 0.6, 3), ('Equalize', 0.6, None)),
        (('Posterize', 0.8, 5), ('Equalize', 1.0, None)),
        (('Rotate', 0.2, 3), ('Solarize', 0.6, 8)),
        (('Equalize', 0.6, None), ('Posterize', 0.4, 6)),
        (('Rotate', 0.8, 8), ('Color', 0.4, 0)),
        (('Rotate', 0.4, 9), ('Equalize', 0.6, None)),
        (('Equalize', 0.0, None), ('Equalize', 0.8, None)),
        (('Invert', 0.6, None), ('Equalize', 1.0, None)),
        (('Color', 0.6, 4), ('Contrast', 1.0, 8)),
        (('Rotate', 0.8, 8), ('Color', 1.0, 2)),
        (('Color', 0.8, 8), ('Solarize', 0.8, 7)),
        (('Sharpness', 0.4, 7), ('Invert', 0.6, None)),
        (('ShearX', 0.6, 5), ('Equalize', 1.0, None)),
        (('Color', 0.4, 0), ('Equalize', 0.6, None)),
        (('Equalize', 0.4, None), ('Solarize', 0.2, 4)),
        (('Solarize', 0.6, 5), ('AutoContrast', 0.6, None)),
        (('Invert', 0.6, None), ('Equalize', 1.0, None)),
        (('Color', 0.6, 4), ('Contrast', 1.0, 8)),
        (('Equalize', 0.8, None), ('Equalize', 0.6, None)),
    ),
    # TensorFlow Model Garden's AutoAugment().policy_v0() (official/legacy/
    # image_classification/augment.py, formerly official/vision/
    # image_classification/augment.py; EfficientNet's ImageNet policy), the
    # one the SupCon authors' TF code draws from. (op, probability, level)
    # with levels 0-10 as that file writes them, the levels of AutoContrast,
    # Equalize and Invert included (they take no argument). Its ops are
    # `TF_AUTOAUGMENT_OPS`, run by the 'tf_model_garden' convention only.
    'v0': (
        (('Equalize', 0.8, 1), ('ShearY', 0.8, 4)),
        (('Color', 0.4, 9), ('Equalize', 0.6, 3)),
        (('Color', 0.4, 1), ('Rotate', 0.6, 8)),
        (('Solarize', 0.8, 3), ('Equalize', 0.4, 7)),
        (('Solarize', 0.4, 2), ('Solarize', 0.6, 2)),
        (('Color', 0.2, 0), ('Equalize', 0.8, 8)),
        (('Equalize', 0.4, 8), ('SolarizeAdd', 0.8, 3)),
        (('ShearX', 0.2, 9), ('Rotate', 0.6, 8)),
        (('Color', 0.6, 1), ('Equalize', 1.0, 2)),
        (('Invert', 0.4, 9), ('Rotate', 0.6, 0)),
        (('Equalize', 1.0, 9), ('ShearY', 0.6, 3)),
        (('Color', 0.4, 7), ('Equalize', 0.6, 0)),
        (('Posterize', 0.4, 6), ('AutoContrast', 0.4, 7)),
        (('Solarize', 0.6, 8), ('Color', 0.6, 9)),
        (('Solarize', 0.2, 4), ('Rotate', 0.8, 9)),
        (('Rotate', 1.0, 7), ('TranslateY', 0.8, 9)),
        (('ShearX', 0.0, 0), ('Solarize', 0.8, 4)),
        (('ShearY', 0.8, 0), ('Color', 0.6, 4)),
        (('Color', 1.0, 0), ('Rotate', 0.6, 2)),
        (('Equalize', 0.8, 4), ('Equalize', 0.0, 8)),
        (('Equalize', 1.0, 4), ('AutoContrast', 0.6, 2)),
        (('ShearY', 0.4, 7), ('SolarizeAdd', 0.6, 7)),
        (('Posterize', 0.8, 2), ('Solarize', 0.6, 10)),
        (('Solarize', 0.6, 8), ('Equalize', 0.6, 1)),
        (('Color', 0.8, 6), ('Rotate', 0.4, 5)),
    ),
}


def autoaugment_magnitudes(height: int, width: int) -> np.ndarray:
  """[len(AUTOAUGMENT_OPS), AUTOAUGMENT_BINS] magnitude of each op at each bin.

  Unsigned values (the sign is drawn per call for `_SIGNED_OPS`), in the
  units each op takes: shear as the affine coefficient (0 to 0.3),
  translation in whole pixels (0 to 150/331 of the side, truncated to an
  integer), rotation in degrees (0 to 30), enhancement offsets from factor
  1 (0 to 0.9), posterize bits (8 down to 4), solarize threshold on the
  0-255 scale (255 down to 0); 0 for ops without a magnitude.
  """
  lin = lambda hi: np.linspace(0., hi, AUTOAUGMENT_BINS)
  bins = np.arange(AUTOAUGMENT_BINS)
  rows = {
      'ShearX': lin(0.3), 'ShearY': lin(0.3),
      'TranslateX': np.trunc(lin(150. / 331. * width)),
      'TranslateY': np.trunc(lin(150. / 331. * height)),
      'Rotate': lin(30.),
      'Brightness': lin(0.9), 'Color': lin(0.9), 'Contrast': lin(0.9),
      'Sharpness': lin(0.9),
      'Posterize': 8. - np.round(bins / ((AUTOAUGMENT_BINS - 1) / 4)),
      'Solarize': np.linspace(255., 0., AUTOAUGMENT_BINS),
  }
  zeros = np.zeros(AUTOAUGMENT_BINS)
  return np.stack([rows.get(op, zeros) for op in AUTOAUGMENT_OPS]
                  ).astype(np.float32)


def _affine_nearest(image, matrix):
  """Nearest-neighbour affine warp with fill 0, PIL's `Image.transform`.

  `matrix` [2, 3] maps an output pixel centre (x + 0.5, y + 0.5), x the
  column, to the input coordinates it samples; the sample is the input pixel
  containing that point, 0 outside the image.
  """
  h, w, _ = image.shape
  ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32) + 0.5,
                        jnp.arange(w, dtype=jnp.float32) + 0.5, indexing='ij')
  sx = matrix[0, 0] * xs + matrix[0, 1] * ys + matrix[0, 2]
  sy = matrix[1, 0] * xs + matrix[1, 1] * ys + matrix[1, 2]
  ix = jnp.floor(sx).astype(jnp.int32)
  iy = jnp.floor(sy).astype(jnp.int32)
  inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
  out = image[jnp.clip(iy, 0, h - 1), jnp.clip(ix, 0, w - 1)]
  return jnp.where(inside[..., None], out, jnp.zeros((), image.dtype))


def _geometric_matrix(op, magnitude, height, width):
  """The inverse affine map [2, 3] of geometric op `op` (identity otherwise).

  As torchvision with PIL images: shears about the top-left corner (input
  x + m y for ShearX), translations by whole pixels, rotation by `magnitude`
  degrees counter-clockwise about the image centre (PIL's `Image.rotate`).
  """
  m = magnitude
  one, zero = jnp.ones_like(m), jnp.zeros_like(m)
  theta = -jnp.deg2rad(m)
  c, s = jnp.cos(theta), jnp.sin(theta)
  cx, cy = width / 2., height / 2.
  candidates = jnp.stack([
      jnp.array([[one, m, zero], [zero, one, zero]]),              # ShearX
      jnp.array([[one, zero, zero], [m, one, zero]]),              # ShearY
      jnp.array([[one, zero, -m], [zero, one, zero]]),             # TranslateX
      jnp.array([[one, zero, zero], [zero, one, -m]]),             # TranslateY
      jnp.array([[c, s, cx - c * cx - s * cy],                     # Rotate
                 [-s, c, cy + s * cx - c * cy]]),
      jnp.array([[one, zero, zero], [zero, one, zero]]),           # identity
  ])
  return candidates[jnp.minimum(op, _NUM_GEOMETRIC)]


# Whose conventions AutoAugment follows (`ViewConfig.autoaugment_impl`):
# torchvision's, the pytorch-auto-augment port's (`autoaugment_grids`) or
# TF Model Garden's (`tf_autoaugment`).
AUTOAUGMENT_IMPLS = ('torchvision', 'pytorch_auto_augment',
                     'tf_model_garden')


def autoaugment_grids(height: int, width: int) -> np.ndarray:
  """[len(AUTOAUGMENT_OPS), AUTOAUGMENT_BINS + 1] bin edges of the
  'pytorch_auto_augment' conventions, those of the port in
  4uiiurz1/pytorch-auto-augment that the TCL code copies: bin b of an op is
  the interval [grid[b], grid[b + 1]] of an 11-point grid over a signed
  range, and the magnitude is drawn uniformly in it (no separate sign);
  grids in the units of `autoaugment_magnitudes`, enhance factors as
  offsets from 1, zeros for ops without a magnitude:
  shear -0.3 to 0.3, translation -150/331 to 150/331 of the side (in
  pixels, fractional), rotation -30 to 30 degrees, enhance factors 0.1 to
  1.9 (stored as factor - 1), posterize 4 to 8 bits (rounded after the
  draw), solarize threshold 0 to 256."""
  grid = lambda lo, hi: np.linspace(lo, hi, AUTOAUGMENT_BINS + 1)
  t = 150. / 331.
  rows = {
      'ShearX': grid(-0.3, 0.3), 'ShearY': grid(-0.3, 0.3),
      'TranslateX': grid(-t, t) * width, 'TranslateY': grid(-t, t) * height,
      'Rotate': grid(-30., 30.),
      'Brightness': grid(-0.9, 0.9), 'Color': grid(-0.9, 0.9),
      'Contrast': grid(-0.9, 0.9), 'Sharpness': grid(-0.9, 0.9),
      'Posterize': grid(4., 8.), 'Solarize': grid(0., 256.),
  }
  zeros = np.zeros(AUTOAUGMENT_BINS + 1)
  return np.stack([rows.get(op, zeros) for op in AUTOAUGMENT_OPS]
                  ).astype(np.float32)


# The cubic B-spline (Unser 1999, "Splines: a perfect fit for signal and
# image processing"): the interpolant sum_k c[k] beta3(t - k) passes through
# the samples when the coefficients c are the samples filtered by the
# inverse of beta3's samples (1, 4, 1) / 6, whose impulse response is
# sqrt(3) z^|k| with the pole z = sqrt(3) - 2. scipy.ndimage runs that
# filter recursively with boundary values for a mirror extension of the
# samples (period 2n - 2), which is what `cubic_spline_prefilter` sums in
# closed form.
_CUBIC_POLE = math.sqrt(3.) - 2.


@functools.lru_cache(maxsize=None)
def cubic_spline_prefilter(n: int) -> np.ndarray:
  """[n, n] float64 matrix P with c = P @ x the cubic B-spline coefficients
  of the n samples x, mirror-extended (x[-k] = x[k], x[n-1+k] = x[n-1-k]).

  The coefficients are the samples convolved with sqrt(3) z^|k| (z the
  pole), so P[i, j] sums sqrt(3) z^|i - k| over the points k of the
  extension that carry sample j: k = j + m p and k = -j + m p, m an
  integer, p = 2n - 2 (one family when j is 0 or n - 1, where the two
  coincide). With |d| <= p, the sum over m of z^|d + m p| is
  z^|d| + (z^(p - d) + z^(p + d)) / (1 - z^p). This is
  scipy.ndimage.spline_filter1d(order=3) with mode 'mirror', the filter
  scipy also uses for mode 'constant' (tests/test_autoaugment.py); it is
  linear in x and independent of it, so a warp applies it as two matrix
  products. Cached per n and read-only.
  """
  if n < 1:
    raise ValueError(f'cubic_spline_prefilter: n={n}, needs n >= 1.')
  if n == 1:
    out = np.ones((1, 1))
  else:
    z, p = _CUBIC_POLE, 2 * n - 2
    periodic = lambda d: (z ** np.abs(d)
                          + (z ** (p - d) + z ** (p + d)) / (1. - z ** p))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    reflected = (j > 0) & (j < n - 1)
    out = math.sqrt(3.) * (periodic(i - j)
                           + np.where(reflected, periodic(i + j), 0.))
  out.setflags(write=False)
  return out


def _mirror_index(index, n):
  """`index` (int, any shape) mapped into [0, n) by the mirror extension
  x[-k] = x[k], x[n-1+k] = x[n-1-k] (scipy.ndimage's out-of-range spline
  coefficients for mode 'constant')."""
  if n == 1:
    return jnp.zeros_like(index)
  period = 2 * n - 2
  index = jnp.mod(index, period)
  return jnp.where(index >= n, period - index, index)


def _cubic_bspline(d):
  """The cubic B-spline beta3 at the distances d (any shape): 2/3 - d^2 +
  |d|^3 / 2 within 1 of its centre, (2 - |d|)^3 / 6 within 2, else 0."""
  a = jnp.abs(d)
  return jnp.where(a < 1., 2. / 3. - a * a + a * a * a / 2.,
                   jnp.where(a < 2., (2. - a) ** 3 / 6., 0.))


def affine_cubic_spline(image, matrix):
  """Cubic-spline affine warp with fill 0, scipy.ndimage's default warp.

  Per channel, `scipy.ndimage.affine_transform(image[..., c], matrix[:, :2],
  matrix[:, 2], order=3, mode='constant', cval=0., prefilter=True)`: output
  pixel (row, column) samples the input at matrix[:, :2] @ (row, column) +
  matrix[:, 2] (pixel centres at integers). The image is prefiltered into
  cubic B-spline coefficients (`cubic_spline_prefilter` along each axis,
  mirror boundary), the spline is evaluated from the 4 x 4 coefficients
  around the point (those beyond the border mirrored back in), and a point
  outside [0, H - 1] x [0, W - 1] is 0 (mode 'constant' interpolates no
  further than the outer pixel centres). The spline passes through the
  pixels and overshoots between them: the output is not clipped.

  `matrix` may be traced (one compilation serves every magnitude); the
  prefilter is a constant of the static size. Matrix products run at
  full float32 precision (TPU and GPU default to less).

  Args:
    image: [H, W, C] float.
    matrix: [2, 3] float, the inverse map on (row, column) coordinates.

  Returns:
    [H, W, C] float32.
  """
  h, w, _ = image.shape
  highest = jax.lax.Precision.HIGHEST
  p_h = jnp.asarray(cubic_spline_prefilter(h), jnp.float32)
  p_w = jnp.asarray(cubic_spline_prefilter(w), jnp.float32)
  coeffs = jnp.einsum('ij,jkc,lk->ilc', p_h, image.astype(jnp.float32), p_w,
                      precision=highest)
  rows, cols = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32),
                            jnp.arange(w, dtype=jnp.float32), indexing='ij')
  sy = matrix[0, 0] * rows + matrix[0, 1] * cols + matrix[0, 2]
  sx = matrix[1, 0] * rows + matrix[1, 1] * cols + matrix[1, 2]
  inside = (sy >= 0) & (sy <= h - 1) & (sx >= 0) & (sx <= w - 1)
  # The taps floor(s) - 1 ... floor(s) + 2, each weighted by beta3 of its
  # own distance to s rather than by the fraction s - floor(s): XLA may
  # compute s in two fusions that round differently, and a tap index from
  # one with a fraction from the other would put the weights on the wrong
  # pixels by one (s = 186 - 1e-5 against 186); this way such a split
  # moves only a tap whose weight is ~0.
  taps = jnp.arange(-1, 3)[:, None, None]
  ky = jnp.floor(sy).astype(jnp.int32) + taps              # [4, H, W]
  kx = jnp.floor(sx).astype(jnp.int32) + taps
  wy = _cubic_bspline(sy - ky.astype(jnp.float32))
  wx = _cubic_bspline(sx - kx.astype(jnp.float32))
  iy, ix = _mirror_index(ky, h), _mirror_index(kx, w)
  neighbours = coeffs[iy[:, None], ix[None, :]]            # [4, 4, H, W, C]
  weights = wy[:, None] * wx[None, :]                      # [4, 4, H, W]
  out = jnp.sum(weights[..., None] * neighbours, axis=(0, 1))
  return jnp.where(inside[..., None], out, 0.)


def _round_to_levels(image):
  """The float image [H, W, C] on the 0-255 scale rounded half up to a
  level and clipped, divided by 255: scipy.ndimage's conversion of a warp
  to the uint8 output of a uint8 input."""
  return jnp.clip(jnp.floor(image * 255. + 0.5), 0., 255.) / 255.


def _geometric_matrix_port(op, magnitude, height, width):
  """The inverse map [2, 3] on (row, column) of a 'pytorch_auto_augment'
  geometric op (identity for other ops), for `affine_cubic_spline`.

  That port warps the [row, column] array with scipy.ndimage by
  O [L | t] O^-1, O the shift to the point o = (H / 2 + 0.5, W / 2 + 0.5):
  an input point L (p - o) + o + t. Its ShearX has L = [[1, m], [0, 1]]
  (input row = row + m (column - o_col): it moves rows), ShearY
  [[1, 0], [m, 1]], TranslateX t = (0, m) and TranslateY t = (m, 0) pixels,
  Rotate L = [[cos, -sin], [sin, cos]] of m degrees.
  """
  m = magnitude
  one, zero = jnp.ones_like(m), jnp.zeros_like(m)
  theta = jnp.deg2rad(m)
  c, s = jnp.cos(theta), jnp.sin(theta)
  eye = jnp.array([[one, zero], [zero, one]])
  linear = jnp.stack([
      jnp.array([[one, m], [zero, one]]),                          # ShearX
      jnp.array([[one, zero], [m, one]]),                          # ShearY
      eye, eye,                                                    # Translate
      jnp.array([[c, -s], [s, c]]),                                # Rotate
      eye,                                                         # identity
  ])[jnp.minimum(op, _NUM_GEOMETRIC)]
  shift = jnp.stack([
      jnp.array([zero, zero]), jnp.array([zero, zero]),
      jnp.array([zero, m]), jnp.array([m, zero]),                  # Translate
      jnp.array([zero, zero]), jnp.array([zero, zero]),
  ])[jnp.minimum(op, _NUM_GEOMETRIC)]
  centre = jnp.array([height / 2. + 0.5, width / 2. + 0.5], jnp.float32)
  # Elementwise rather than `@`: a matrix product may run below float32
  # precision on accelerators.
  offset = centre - jnp.sum(linear * centre, axis=1) + shift
  return jnp.concatenate([linear, offset[:, None]], axis=1)


def _luma(image):
  if image.shape[-1] == 1:
    return image[..., 0]
  return image @ jnp.array([0.299, 0.587, 0.114], image.dtype)


def _blend(image, degenerate, factor):
  """factor * image + (1 - factor) * degenerate, clipped to [0, 1] (PIL's
  `ImageEnhance`: factor 1 is the image, 0 the degenerate one)."""
  return jnp.clip(degenerate + factor * (image - degenerate), 0., 1.)


def _to_levels(image):
  """The 256-level integer image (0-255, int32) of a float image in [0, 1]."""
  return jnp.round(jnp.clip(image, 0., 1.) * 255.).astype(jnp.int32)


def _aa_brightness(image, m):
  return _blend(image, jnp.zeros_like(image), 1. + m)


def _aa_color(image, m):
  if image.shape[-1] == 1:
    return image
  return _blend(image, _luma(image)[..., None], 1. + m)


def _aa_contrast(image, m):
  return _blend(image, jnp.mean(_luma(image)), 1. + m)


def _aa_sharpness(image, m):
  """Blend with the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13
  (PIL's SMOOTH filter); the one-pixel border keeps its values."""
  h, w, _ = image.shape
  smooth = sum(image[1 + dy:h - 1 + dy, 1 + dx:w - 1 + dx]
               for dy in (-1, 0, 1) for dx in (-1, 0, 1))
  smooth = (smooth + 4. * image[1:-1, 1:-1]) / 13.
  degenerate = image.at[1:-1, 1:-1].set(smooth)
  return _blend(image, degenerate, 1. + m)


def _aa_posterize(image, bits):
  """Keeps the top `bits` bits of each 8-bit level (PIL's posterize)."""
  step = jnp.exp2(8. - bits)
  return jnp.floor(_to_levels(image) / step) * step / 255.


def _aa_solarize(image, threshold):
  """Inverts the levels >= threshold (on the 0-255 scale)."""
  levels = _to_levels(image)
  return jnp.where(levels >= threshold, 255 - levels, levels) / 255.


def _aa_autocontrast(image, _):
  """Stretches each channel's [min, max] to [0, 1]; constant channels stay."""
  lo = jnp.min(image, axis=(0, 1))
  hi = jnp.max(image, axis=(0, 1))
  span = jnp.where(hi > lo, hi - lo, 1.)
  lo = jnp.where(hi > lo, lo, 0.)
  return jnp.clip((image - lo) / span, 0., 1.)


def _equalize_channel(levels):
  """PIL's `ImageOps.equalize` of one [H, W] channel of 0-255 int levels."""
  hist = jnp.bincount(levels.ravel(), length=256)
  # The pixels below the top occupied level, spread over 255 steps.
  step = (levels.size - hist[jnp.max(levels)]) // 255
  safe = jnp.maximum(step, 1)
  lut = (jnp.cumsum(hist) - hist + step // 2) // safe
  lut = jnp.clip(lut, 0, 255)
  return jnp.where(step > 0, lut[levels], levels)


def _aa_equalize(image, _):
  levels = _to_levels(image)
  out = jax.vmap(_equalize_channel, in_axes=-1, out_axes=-1)(levels)
  return out.astype(image.dtype) / 255.


def _aa_invert(image, _):
  return 1. - image


# Index = op - _NUM_GEOMETRIC + 1; index 0 passes the (warped) image through.
_AA_VALUE_OPS = (lambda image, _: image, _aa_brightness, _aa_color,
                 _aa_contrast, _aa_sharpness, _aa_posterize, _aa_solarize,
                 _aa_autocontrast, _aa_equalize, _aa_invert)


def autoaugment_op(image, op, magnitude, impl='torchvision', key=None):
  """Applies AutoAugment op number `op` (of `AUTOAUGMENT_OPS`) at a signed
  `magnitude` in the units of `autoaugment_magnitudes`.

  With impl='tf_model_garden', `op` numbers `TF_AUTOAUGMENT_OPS` (which
  extends `AUTOAUGMENT_OPS`), `magnitude` is the op's argument
  (`tf_autoaugment_args`, signed) and `key` draws Cutout's centre: see
  `tf_autoaugment_op`.

  `op` and `magnitude` may be traced: a geometric op is a warp by its matrix
  (the identity for other ops), then a `lax.switch` picks the value op
  (pass-through for geometric ops). Under vmap a switch on a batched index
  computes every branch: each call costs one warp plus every value op (nine;
  eleven in the TF conventions), equalize's 256-bin histogram per channel
  among them.

  Args:
    image: [H, W, C] float in [0, 1].
    op: index into `AUTOAUGMENT_OPS`.
    magnitude: the op's signed magnitude.
    impl: 'torchvision' (nearest-neighbour warps as PIL's, shears about the
      top-left corner) or 'pytorch_auto_augment' (scipy.ndimage's cubic-
      spline warps about the centre with that port's axes, see
      `_geometric_matrix_port` and `affine_cubic_spline`, then rounded half
      up to 8-bit levels and clipped to [0, 1], as scipy writes the warp of
      the port's uint8 image; other ops pass the image through unrounded).
      The value ops are the same.

  Returns:
    [H, W, C] float in [0, 1].
  """
  if impl == 'tf_model_garden':
    if key is None:
      raise ValueError("impl='tf_model_garden' needs a key (Cutout's centre).")
    return tf_autoaugment_op(_tf_levels(image), op, magnitude, key) / 255.
  h, w, _ = image.shape
  op = jnp.asarray(op, jnp.int32)
  if impl == 'torchvision':
    warped = _affine_nearest(image, _geometric_matrix(op, magnitude, h, w))
  elif impl == 'pytorch_auto_augment':
    cubic = affine_cubic_spline(image,
                                _geometric_matrix_port(op, magnitude, h, w))
    warped = jnp.where(op < _NUM_GEOMETRIC, _round_to_levels(cubic), image)
  else:
    raise ValueError(f'unknown AutoAugment implementation {impl!r}; known: '
                     f'{", ".join(AUTOAUGMENT_IMPLS)}.')
  index = jnp.maximum(op - _NUM_GEOMETRIC + 1, 0)
  return jax.lax.switch(index, _AA_VALUE_OPS, warped, magnitude)


def _policy_arrays(policy: str, names: tuple[str, ...] = AUTOAUGMENT_OPS):
  """(ops [S, 2] as indices into `names`, probs [S, 2], bins or levels
  [S, 2]; a missing bin is 0) of the policy's S sub-policies."""
  if policy not in AUTOAUGMENT_POLICIES:
    raise ValueError(f'unknown AutoAugment policy {policy!r}; known: '
                     f'{", ".join(sorted(AUTOAUGMENT_POLICIES))}.')
  table = AUTOAUGMENT_POLICIES[policy]
  ops = np.array([[names.index(o) for o, _, _ in sub]
                  for sub in table], np.int32)
  probs = np.array([[p for _, p, _ in sub] for sub in table], np.float32)
  bins = np.array([[b or 0 for _, _, b in sub] for sub in table], np.int32)
  return ops, probs, bins


def autoaugment_draw(rng, policy='cifar10', impl='torchvision'):
  """The random choices of one AutoAugment call.

  Returns:
    (sub, ops, magnitudes, apply): the sub-policy index (uniform over the
    policy's sub-policies), its two op numbers (of `AUTOAUGMENT_OPS`), a
    function of the image (height, width) giving their two signed
    magnitudes, and whether each op applies (with the op's probability).
    The magnitude of an op at bin b: for 'torchvision',
    `autoaugment_magnitudes`[op, b], negated with probability 1/2 for the
    signed ops; for 'pytorch_auto_augment', uniform between
    `autoaugment_grids`[op, b] and [op, b + 1] (posterize bits rounded);
    for 'tf_model_garden', ops of `TF_AUTOAUGMENT_OPS` and the argument
    `tf_autoaugment_args`[op, level], negated with probability 1/2 for the
    geometric ops (the height and width are not used).

  Raises:
    ValueError: an unknown policy or implementation, or a policy the
      implementation does not define (`check_autoaugment_policy`).
  """
  if impl not in AUTOAUGMENT_IMPLS:
    raise ValueError(f'unknown AutoAugment implementation {impl!r}; known: '
                     f'{", ".join(AUTOAUGMENT_IMPLS)}.')
  check_autoaugment_policy(policy, impl)
  tf = impl == 'tf_model_garden'
  names, signed_names = ((TF_AUTOAUGMENT_OPS, _TF_SIGNED_OPS) if tf else
                         (AUTOAUGMENT_OPS, _SIGNED_OPS))
  ops, probs, bins = (jnp.asarray(a) for a in _policy_arrays(policy, names))
  signed = jnp.asarray([op in signed_names for op in names])
  k_sub, k_apply, k_sign = jax.random.split(rng, 3)
  sub = jax.random.randint(k_sub, (), 0, ops.shape[0])
  apply = jax.random.uniform(k_apply, (2,)) < probs[sub]
  op, b = ops[sub], bins[sub]
  if impl in ('torchvision', 'tf_model_garden'):
    negate = jax.random.bernoulli(k_sign, 0.5, (2,)) & signed[op]
    # The TF arguments do not scale with the image.
    table = ((lambda height, width: tf_autoaugment_args()) if tf else
             autoaugment_magnitudes)

    def magnitudes(height, width):
      m = jnp.asarray(table(height, width))[op, b]
      return jnp.where(negate, -m, m)
  else:
    u = jax.random.uniform(k_sign, (2,))

    def magnitudes(height, width):
      grid = jnp.asarray(autoaugment_grids(height, width))
      m = grid[op, b] + u * (grid[op, b + 1] - grid[op, b])
      posterize = op == AUTOAUGMENT_OPS.index('Posterize')
      return jnp.where(posterize, jnp.round(m), m)

  return sub, op, magnitudes, apply


def autoaugment(rng, image, *, policy='cifar10', impl='torchvision'):
  """One AutoAugment draw on one image [H, W, C] float in [0, 1].

  As torchvision's `AutoAugment(policy)` with its defaults (nearest
  interpolation, fill 0): a sub-policy is drawn uniformly from the policy's
  25; each of its two ops applies with its probability, at its magnitude bin
  (`autoaugment_magnitudes`), the magnitude of a signed op negated with
  probability 1/2 (`autoaugment_draw`).

  The image stays float: posterize, solarize and equalize are defined on
  8-bit levels, so they round their input to the 256 levels first (exact on
  images from uint8, as this pipeline's are, and after the geometric ops,
  which move whole pixels or, for 'pytorch_auto_augment', round to the
  levels as that port's uint8 image does); the other ops act on the float
  values (PIL's uint8 ops, which torchvision and the port call, truncate
  after each op: within two levels of these, `tests/test_autoaugment.py`).

  Cost: under vmap each of the two ops computes one warp and every value op
  (nine; eleven in the TF conventions; `autoaugment_op`), about ten times
  the work of one op.

  Args:
    rng: PRNG key.
    image: [H, W, C] float in [0, 1], C = 1 or 3 (Color is the identity on one
      channel).
    policy: a key of `AUTOAUGMENT_POLICIES`.
    impl: 'torchvision' (the default, above) or 'pytorch_auto_augment', the
      conventions of the port in 4uiiurz1/pytorch-auto-augment that the TCL
      code uses: magnitudes drawn uniformly within their bin of a signed
      range (`autoaugment_grids`) and scipy.ndimage's cubic-spline warps
      about the centre (`_geometric_matrix_port`, `affine_cubic_spline`),
      each rounded to 8-bit levels and clipped as the port's uint8 image
      is. Policies, probabilities and value ops are the same. Or
      'tf_model_garden', which runs TF's 'v0' policy (`tf_autoaugment`).

  Returns:
    [H, W, C] float in [0, 1].
  """
  if impl == 'tf_model_garden':
    return tf_autoaugment(rng, image, policy=policy)
  h, w, _ = image.shape
  _, ops, magnitudes, apply = autoaugment_draw(rng, policy, impl)
  m = magnitudes(h, w)
  for slot in range(2):
    image = jnp.where(apply[slot],
                      autoaugment_op(image, ops[slot], m[slot], impl), image)
  return image


# The conventions of TensorFlow Model Garden's AutoAugment
# (official/legacy/image_classification/augment.py, which the SupCon
# authors' TF code calls as `AutoAugment().distort`), impl
# 'tf_model_garden'. Its policies name levels 0-10 (`_MAX_LEVEL` = 10), each
# mapped to the op's argument by its `level_to_arg` with AutoAugment's
# defaults translate_const = 250 and cutout_const = 100 (RandAugment's are
# 100 and 40); the image is uint8 throughout and every op truncates its
# float arithmetic back to uint8. Its ops are torchvision's fourteen plus
# SolarizeAdd and Cutout, numbered on from `AUTOAUGMENT_OPS`.
TF_AUTOAUGMENT_OPS = AUTOAUGMENT_OPS + ('SolarizeAdd', 'Cutout')
TF_AUTOAUGMENT_LEVELS = 11
# Only these take a random sign (`_randomly_negate_tensor`); its enhance
# factors are 0.1 to 1.9 without a sign.
_TF_SIGNED_OPS = frozenset(AUTOAUGMENT_OPS[:_NUM_GEOMETRIC])
_TF_TRANSLATE_CONST = 250.
_TF_CUTOUT_CONST = 100.
# Cutout's fill (`replace` = [128] * 3). The geometric ops pass the same
# fill to `unwrap`, but it never shows: see `_tf_warp`.
_TF_REPLACE = 128.
# Which conventions define each policy: the bins 0-9 of torchvision's
# policies mean nothing to the Model Garden's level_to_arg, nor the levels
# 0-10 and the SolarizeAdd of 'v0' to the PyTorch conventions.
AUTOAUGMENT_POLICY_IMPLS = {
    'cifar10': ('torchvision', 'pytorch_auto_augment'),
    'imagenet': ('torchvision', 'pytorch_auto_augment'),
    'v0': ('tf_model_garden',),
}


def check_autoaugment_policy(policy: str, impl: str) -> None:
  """Raises ValueError unless `impl` (of `AUTOAUGMENT_IMPLS`) runs `policy`
  (of `AUTOAUGMENT_POLICIES`), naming the setting that fixes it."""
  if policy not in AUTOAUGMENT_POLICIES:
    raise ValueError(f'unknown AutoAugment policy {policy!r}; known: '
                     f'{", ".join(sorted(AUTOAUGMENT_POLICIES))}.')
  impls = AUTOAUGMENT_POLICY_IMPLS[policy]
  if impl not in impls:
    others = sorted(p for p, i in AUTOAUGMENT_POLICY_IMPLS.items()
                    if impl in i)
    raise ValueError(
        f'AutoAugment policy {policy!r} runs with autoaugment_impl '
        f'{" or ".join(map(repr, impls))}, not {impl!r}: set '
        f'autoaugment_impl={impls[0]!r} (or, keeping {impl!r}, a policy of '
        f'{", ".join(others)}).')


def tf_autoaugment_args() -> np.ndarray:
  """[len(TF_AUTOAUGMENT_OPS), TF_AUTOAUGMENT_LEVELS] argument of each op at
  each level 0-10, as the Model Garden's `level_to_arg` computes it in
  Python floats (f = level / 10), before the random sign of the geometric
  ops: shear f * 0.3, translation f * 250 pixels (whatever the image size),
  rotation f * 30 degrees, enhance factors f * 1.8 + 0.1, and int() of
  f * 4 posterize bits, f * 256 solarize threshold, f * 110 SolarizeAdd
  addition, f * 100 Cutout half-side; 0 for AutoContrast, Equalize, Invert.
  """
  f = np.arange(TF_AUTOAUGMENT_LEVELS, dtype=np.float64) / 10.
  enhance = f * 1.8 + 0.1
  none = np.zeros_like(f)
  rows = {
      'ShearX': f * 0.3, 'ShearY': f * 0.3,
      'TranslateX': f * _TF_TRANSLATE_CONST,
      'TranslateY': f * _TF_TRANSLATE_CONST,
      'Rotate': f * 30.,
      'Brightness': enhance, 'Color': enhance, 'Contrast': enhance,
      'Sharpness': enhance,
      'Posterize': np.trunc(f * 4.), 'Solarize': np.trunc(f * 256.),
      'AutoContrast': none, 'Equalize': none, 'Invert': none,
      'SolarizeAdd': np.trunc(f * 110.),
      'Cutout': np.trunc(f * _TF_CUTOUT_CONST),
  }
  return np.stack([rows[op] for op in TF_AUTOAUGMENT_OPS]).astype(np.float32)


def _tf_levels(image):
  """The uint8 image of a float one in [0, 1], as 0-255 float32 integers.

  Truncated, as `tf.cast` turns the SupCon code's resized float crop into
  uint8; the 1e-3 level of slack keeps an image that came from uint8 on its
  own levels despite float rounding of x * 255.
  """
  return jnp.floor(jnp.clip(image, 0., 1.) * 255. + 1e-3)


def _f32(x):
  """x, rounded to float32 where it stands. TF's kernels round each product
  before adding it; XLA would fuse a product into the following sum (an FMA,
  one rounding), which moves a sample point or a truncated level across a
  boundary now and then. The select keeps the product apart."""
  return jnp.where(jnp.isnan(x), 0., x)


def _tf_reflect(coord, size: int):
  """TF's FILL_REFLECT of a continuous input coordinate (d c b a | a b c d |
  d c b a: mirrored about -0.5 and size - 0.5, period 2 size), clamped to
  [0, size - 1], with the kernel's branches (`MapCoordinate` in TF's
  image_ops.h)."""
  if size <= 1:
    return jnp.zeros_like(coord)
  period = 2. * size
  low = coord + period * jnp.trunc(-coord / period)          # In (-2n, 0].
  low = jnp.where(low < -size, low + period, -low - 1.)
  high = coord - period * jnp.trunc(coord / period)          # In [0, 2n).
  high = jnp.where(high >= size, period - high - 1., high)
  out = jnp.where(coord < 0., low, jnp.where(coord > size - 1., high, coord))
  return jnp.clip(out, 0., size - 1.)


def _tf_warp(levels, matrix):
  """The Model Garden's `transform`: Keras' `image_preprocessing.transform`
  with interpolation='nearest' and its default fill_mode='reflect'.

  `levels` [H, W, C] -> [H, W, C]. `matrix` [2, 3] maps output pixel (x, y)
  (column, row; pixel centres at integers) to the input point it samples,
  which is reflected into the image (`_tf_reflect`) and rounded half away
  from zero. Reflection leaves no
  empty pixel, so the all-ones channel that `wrap` adds never reads 0 and
  `unwrap`'s fill of 128 never applies (tensorflow/models issue #10493).
  """
  h, w, _ = levels.shape
  ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32),
                        jnp.arange(w, dtype=jnp.float32), indexing='ij')
  sx = _f32(matrix[0, 0] * xs) + _f32(matrix[0, 1] * ys) + matrix[0, 2]
  sy = _f32(matrix[1, 0] * xs) + _f32(matrix[1, 1] * ys) + matrix[1, 2]
  ix = jnp.floor(_tf_reflect(sx, w) + 0.5).astype(jnp.int32)
  iy = jnp.floor(_tf_reflect(sy, h) + 0.5).astype(jnp.int32)
  return levels[iy, ix]


def _tf_geometric_matrix(op, arg, height, width):
  """The inverse maps [2, 3] of the Model Garden's geometric ops (identity
  for the others), on (x, y) = (column, row): ShearX samples x + arg y,
  ShearY y + arg x, TranslateX x + arg, TranslateY y + arg, and Rotate
  turns by arg degrees about ((W - 1) / 2, (H - 1) / 2) with the matrix of
  its `_convert_angles_to_transform`, in float32 as there."""
  m = jnp.asarray(arg, jnp.float32)
  one, zero = jnp.ones_like(m), jnp.zeros_like(m)
  theta = m * jnp.float32(math.pi / 180.)
  c, s = jnp.cos(theta), jnp.sin(theta)
  w1, h1 = jnp.float32(width - 1), jnp.float32(height - 1)
  x_off = (w1 - (_f32(c * w1) - _f32(s * h1))) / 2.
  y_off = (h1 - (_f32(s * w1) + _f32(c * h1))) / 2.
  candidates = jnp.stack([
      jnp.array([[one, m, zero], [zero, one, zero]]),              # ShearX
      jnp.array([[one, zero, zero], [m, one, zero]]),              # ShearY
      jnp.array([[one, zero, m], [zero, one, zero]]),              # TranslateX
      jnp.array([[one, zero, zero], [zero, one, m]]),              # TranslateY
      jnp.array([[c, -s, x_off], [s, c, y_off]]),                  # Rotate
      jnp.array([[one, zero, zero], [zero, one, zero]]),           # identity
  ])
  return candidates[jnp.minimum(op, _NUM_GEOMETRIC)]


def _tf_blend(degenerate, levels, factor):
  """The Model Garden's blend(degenerate, image, factor): degenerate +
  factor (image - degenerate) in float32, clipped to [0, 255], truncated."""
  return jnp.floor(jnp.clip(degenerate + _f32(factor * (levels - degenerate)),
                            0., 255.))


def _tf_grayscale(levels):
  """`tf.image.rgb_to_grayscale` of a uint8 image [H, W, 3] -> [H, W]: the
  levels / 255 weighted (0.2989, 0.5870, 0.1140), then x 255.5 truncated
  (`convert_image_dtype` back to uint8)."""
  weights = jnp.asarray([0.2989, 0.5870, 0.1140], jnp.float32)
  gray = (levels * jnp.float32(1. / 255.)) @ weights
  return jnp.floor(gray * jnp.float32(255.5))


def _tf_brightness(levels, factor, _):
  return _tf_blend(jnp.zeros_like(levels), levels, factor)


def _tf_color(levels, factor, _):
  """Blend with the grayscale image; the identity on one channel."""
  if levels.shape[-1] == 1:
    return levels
  return _tf_blend(_tf_grayscale(levels)[..., None], levels, factor)


def _tf_contrast(levels, factor, _):
  """Blend with a constant that the Model Garden means to be the mean gray
  level, but computes as the sum of the 256-bin histogram of the grayscale
  image over 256: the pixel count H W / 256 (196 at 224 x 224), clipped to
  255 and truncated, whatever the image."""
  h, w = levels.shape[:2]
  return _tf_blend(jnp.float32(math.floor(min(h * w / 256., 255.))), levels,
                   factor)


def _tf_sharpness(levels, factor, _):
  """Blend with the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13
  (float32 weights summed row by row, as TF's depthwise convolution; one
  level lower where it rounds below a whole level), truncated; the border
  keeps its levels."""
  h, w = levels.shape[:2]
  w1, w5 = jnp.float32(1.) / 13., jnp.float32(5.) / 13.
  smooth = jnp.zeros((h - 2, w - 2, levels.shape[-1]), jnp.float32)
  for dy in (0, 1, 2):
    for dx in (0, 1, 2):
      weight = w5 if (dy, dx) == (1, 1) else w1
      smooth = smooth + weight * levels[dy:h - 2 + dy, dx:w - 2 + dx]
  degenerate = levels.at[1:-1, 1:-1].set(jnp.floor(jnp.clip(smooth, 0., 255.)))
  return _tf_blend(degenerate, levels, factor)


def _tf_posterize(levels, bits, _):
  """(x >> s) << s with s = 8 - bits, which TF's CPU kernels clamp to 7: 0
  bits (levels 0-2) keep the top bit, as 1 bit does."""
  step = jnp.exp2(jnp.clip(8. - bits, 0., 7.))
  return jnp.floor(levels / step) * step


def _tf_solarize(levels, threshold, _):
  """Inverts the levels >= threshold, the threshold converted to uint8 as
  TF converts the Python int: 256 (level 10) becomes 0 and inverts every
  level."""
  return jnp.where(levels < jnp.mod(threshold, 256.), levels, 255. - levels)


def _tf_autocontrast(levels, _, __):
  """Per channel: x * (255 / (hi - lo)) - lo * (255 / (hi - lo)) in float32,
  clipped, truncated (the top level can land on 254); constant channels
  stay."""
  lo = jnp.min(levels, axis=(0, 1))
  hi = jnp.max(levels, axis=(0, 1))
  scale = jnp.float32(255.) / jnp.where(hi > lo, hi - lo, 1.)
  offset = -lo * scale
  out = jnp.floor(jnp.clip(_f32(levels * scale) + offset, 0., 255.))
  return jnp.where(hi > lo, out, levels)


def _tf_equalize(levels, _, __):
  """The Model Garden's equalize builds PIL's lookup table."""
  out = jax.vmap(_equalize_channel, in_axes=-1, out_axes=-1)(
      levels.astype(jnp.int32))
  return out.astype(jnp.float32)


def _tf_invert(levels, _, __):
  return 255. - levels


def _tf_solarize_add(levels, addition, _):
  """Adds `addition` to the levels below 128, clipped to [0, 255]."""
  return jnp.where(levels < 128., jnp.clip(levels + addition, 0., 255.),
                   levels)


def _tf_cutout(levels, pad_size, key):
  """Fills rows [cy - pad, cy + pad) and columns [cx - pad, cx + pad),
  clipped to the image, with 128; the centre (cy, cx) uniform over the
  pixels, drawn with `key`."""
  h, w = levels.shape[:2]
  k_y, k_x = jax.random.split(key)
  cy = jax.random.randint(k_y, (), 0, h)
  cx = jax.random.randint(k_x, (), 0, w)
  pad = jnp.asarray(pad_size, jnp.float32).astype(jnp.int32)
  rows = jnp.arange(h)[:, None, None]
  cols = jnp.arange(w)[None, :, None]
  inside = ((rows >= cy - pad) & (rows < cy + pad)
            & (cols >= cx - pad) & (cols < cx + pad))
  return jnp.where(inside, _TF_REPLACE, levels)


# Index = op - _NUM_GEOMETRIC + 1; index 0 passes the (warped) image through.
_TF_VALUE_OPS = (lambda levels, _, __: levels, _tf_brightness, _tf_color,
                 _tf_contrast, _tf_sharpness, _tf_posterize, _tf_solarize,
                 _tf_autocontrast, _tf_equalize, _tf_invert, _tf_solarize_add,
                 _tf_cutout)


def tf_autoaugment_op(levels, op, arg, key):
  """Applies the Model Garden's op number `op` (of `TF_AUTOAUGMENT_OPS`) with
  argument `arg` (`tf_autoaugment_args`, signed for the geometric ops).

  As `autoaugment_op`: one warp (`_tf_warp`, the identity for the value
  ops), then a `lax.switch` over the value ops, every branch computed under
  vmap.

  Args:
    levels: [H, W, C] float32 holding uint8 levels 0-255 (`_tf_levels`).
    op: index into `TF_AUTOAUGMENT_OPS`; may be traced.
    arg: the op's argument; may be traced.
    key: PRNG key of Cutout's centre.

  Returns:
    [H, W, C] float32 uint8 levels.
  """
  h, w, _ = levels.shape
  op = jnp.asarray(op, jnp.int32)
  warped = _tf_warp(levels, _tf_geometric_matrix(op, arg, h, w))
  index = jnp.maximum(op - _NUM_GEOMETRIC + 1, 0)
  return jax.lax.switch(index, _TF_VALUE_OPS, warped,
                        jnp.asarray(arg, jnp.float32), key)


# Cutout's centres: keys folded from the AutoAugment key, apart from the
# three that `autoaugment_draw` splits off.
_TF_CUTOUT_STREAM = 0x43757430


def tf_autoaugment(rng, image, *, policy='v0'):
  """One draw of the Model Garden's `AutoAugment(policy).distort` on one
  image [H, W, C] float in [0, 1] (impl='tf_model_garden').

  The image becomes uint8 levels (truncated, `_tf_levels`), a sub-policy is
  drawn uniformly, each of its two ops applies with its probability, with
  the argument of its level (`tf_autoaugment_args`), negated with
  probability 1/2 for the geometric ops; every op truncates to uint8 as
  there. The geometric ops sample the nearest pixel and reflect at the
  borders (`_tf_warp`); Cutout fills 128. Integer ops match TF exactly; the
  float ones to float32 rounding (tests/test_autoaugment.py compares them
  with the TF ops that file calls).

  Cost: under vmap each op computes one warp and all eleven value ops.

  Args:
    rng: PRNG key.
    image: [H, W, C] float in [0, 1], C = 1 or 3 (Color is the identity on
      one channel).
    policy: a policy the convention defines ('v0').

  Returns:
    [H, W, C] float32 in [0, 1], on the 256 levels.
  """
  h, w, _ = image.shape
  _, ops, magnitudes, apply = autoaugment_draw(rng, policy, 'tf_model_garden')
  args = magnitudes(h, w)
  levels = _tf_levels(image)
  for slot in range(2):
    key = jax.random.fold_in(rng, _TF_CUTOUT_STREAM + slot)
    levels = jnp.where(apply[slot],
                       tf_autoaugment_op(levels, ops[slot], args[slot], key),
                       levels)
  return levels / 255.


# The key of a view's AutoAugment draw: folded from the view's key with a
# constant far from the small counters that `split` and the other ops use,
# so adding the op left every other draw of augment_image unchanged.
_AUTOAUGMENT_STREAM = 0x41754175


def augment_image(rng, image, cfg: ViewConfig, *, cropped: bool = False):
  """Applies one view's recipe to one image [H, W, C] in [0, 1].

  The ops run in `cfg.op_order`. `cropped`: the image is already this view's
  random resized crop (cut on the host from the full image,
  `sources.RandomCrops`), so the random resized crop is skipped (a view
  `size` other than the image's is still resized to). Each op keeps its own
  key whatever the order or `cropped`.
  """
  keys = jax.random.split(rng, 8)
  out_hw = resolve_size(cfg.size, image.shape[:2])
  for op in cfg.op_order:
    if op == 'crop':
      if cfg.pad_crop:
        image = pad_and_crop(keys[0], image, pad=cfg.pad_crop)
      if cfg.crop_scale is not None and not cropped:
        image = random_resized_crop(keys[1], image, scale=cfg.crop_scale,
                                    ratio=cfg.crop_ratio, size=out_hw)
      elif out_hw != image.shape[:2]:
        image = jax.image.resize(image, out_hw + image.shape[2:], 'linear')
    elif op == 'flip' and cfg.flip_p:
      image = flip_left_right(keys[2], image, p=cfg.flip_p)
    elif op == 'autoaugment' and cfg.autoaugment:
      image = autoaugment(jax.random.fold_in(rng, _AUTOAUGMENT_STREAM), image,
                          policy=cfg.autoaugment, impl=cfg.autoaugment_impl)
    elif op == 'jitter' and any(cfg.jitter_amounts()):
      image = color_jitter(keys[3], image, amounts=cfg.jitter_amounts(),
                           p=cfg.jitter_p)
    elif op == 'grayscale' and cfg.grayscale_p and image.shape[-1] == 3:
      image = jnp.where(jax.random.bernoulli(keys[4], cfg.grayscale_p),
                        to_grayscale(image), image)
    elif op == 'blur' and cfg.blur_p:
      image = gaussian_blur(keys[5], image, p=cfg.blur_p)
    elif op == 'solarize' and cfg.solarize_p:
      image = solarize(keys[6], image, p=cfg.solarize_p)
  if cfg.erase_p:
    image = random_erase(keys[7], image, p=cfg.erase_p)
  return image


def augment_views(rng, images, views: Sequence[ViewConfig], *,
                  host_cropped: bool = False) -> tuple[jax.Array, ...]:
  """Makes len(views) augmented views of every image, one array per view.

  Use this when views differ in size (multi-crop); `augment_batch` stacks the
  same arrays when they agree. View v uses `fold_in(rng, v)`, so a view's
  pixels do not depend on which other views are requested after it.

  Args:
    rng: PRNG key; fold in the step upstream (the train loop does).
    images: [B, H, W, C] uint8, or float in [0, 1]; with `host_cropped`,
      [B, V, H, W, C]: view v's random resized crop, cut on the host
      (`sources.RandomCrops`), which view v augments without its own crop.
    views: one recipe per view.
    host_cropped: see `images`.

  Returns:
    A tuple of V arrays, view v of shape [B, h_v, w_v, C] float32 in [0, 1],
    with (h_v, w_v) = `resolve_size(views[v].size, (H, W))`.
  """
  if images.dtype == jnp.uint8:
    images = images.astype(jnp.float32) / 255.
  if host_cropped and (images.ndim != 5 or images.shape[1] != len(views)):
    raise ValueError(f'host-cropped images must be [B, V={len(views)}, H, W, '
                     f'C]; got {images.shape}.')
  batch = images.shape[0]
  out = [None] * len(views)
  # Views with the same recipe share one computation, vmapped over the views:
  # a smaller graph (SimCLR's V identical views compile once, not V times).
  groups: dict[ViewConfig, list[int]] = {}
  for v, cfg in enumerate(views):
    groups.setdefault(cfg, []).append(v)
  per_image = lambda k, x, c: augment_image(k, x, c, cropped=host_cropped)
  for cfg, members in groups.items():
    keys = jnp.stack([jax.random.split(jax.random.fold_in(rng, v), batch)
                      for v in members])                      # [V_cfg, B]
    if host_cropped:     # Each view its own crops: [V_cfg, B, H, W, C].
      inputs, in_axes = jnp.stack([images[:, v] for v in members]), (0, 0)
    else:
      inputs, in_axes = images, (0, None)
    fn = jax.vmap(jax.vmap(functools.partial(per_image, c=cfg)),
                  in_axes=in_axes)
    group_out = fn(keys, inputs)                  # [V_cfg, B, h, w, C]
    for i, v in enumerate(members):
      out[v] = group_out[i]
  return tuple(out)


def augment_groups(rng, images, views: Sequence[ViewConfig], *,
                   host_cropped: bool = False) -> tuple[jax.Array, ...]:
  """Makes len(views) augmented views of every image, stacked by size.

  What the train step takes: one [B, V_g, h_g, w_g, C] array per run of
  consecutive views that share a size, so a multi-crop recipe (2 global +
  6 local crops) gives two groups and every other recipe one.

  Args:
    rng: PRNG key; fold in the step upstream so that a resumed run draws the
      same views.
    images: [B, H, W, C] uint8 or float in [0, 1] ([B, V, H, W, C] with
      `host_cropped`, see `augment_views`).
    views: one recipe per view.
    host_cropped: the views' random resized crops come cut by the host.

  Returns:
    A tuple of [B, V_g, h_g, w_g, C] float32 arrays in [0, 1], whose V_g sum
    to len(views), in view order.
  """
  return group_by_size(augment_views(rng, images, views,
                                     host_cropped=host_cropped))


def group_by_size(views: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
  """Views [B, h_v, w_v, C] -> one [B, V_g, h_g, w_g, C] array per run of
  consecutive views of the same shape, in view order."""
  groups, start = [], 0
  for v in range(1, len(views) + 1):
    if v == len(views) or views[v].shape != views[start].shape:
      groups.append(jnp.stack(views[start:v], axis=1))
      start = v
  return tuple(groups)


def augment_batch(rng, images, views: Sequence[ViewConfig]):
  """`augment_groups`' single group [B, V, h, w, C] when all views share a size.

  Raises:
    ValueError: the views differ in size (use `augment_groups`).
  """
  sizes = {resolve_size(cfg.size, images.shape[1:3]) for cfg in views}
  if len(sizes) > 1:
    raise ValueError(f'views differ in size {sorted(sizes)}; they cannot be '
                     'stacked. Use augment_groups for multi-crop.')
  return augment_groups(rng, images, views)[0]


# The papers' recipes, each a list of per-view configs (two views unless a
# paper says otherwise; `pipeline` repeats or truncates to the configured V).
_SIMCLR = ViewConfig(crop_scale=(0.08, 1.), flip_p=0.5, jitter_strength=1.0,
                     jitter_p=0.8, grayscale_p=0.2, blur_p=0.5)
_MC_GLOBAL = ViewConfig(crop_scale=(0.4, 1.), flip_p=0.5, jitter_strength=0.5,
                        jitter_p=0.8, grayscale_p=0.2)
_MC_LOCAL = dataclasses.replace(_MC_GLOBAL, crop_scale=(0.1, 0.4), size=3 / 7)
PRESETS: dict[str, tuple[ViewConfig, ...]] = {
    # SimCLR (Chen et al. 2020, appendix A); blur is used for ImageNet-size
    # images only, so `simclr_small` drops it for 32x32 and smaller.
    'simclr': (_SIMCLR, _SIMCLR),
    'simclr_small': (dataclasses.replace(_SIMCLR, blur_p=0.),) * 2,
    # InsDis / MoCo v1: crop 0.2-1, ColorJitter(0.4, 0.4, 0.4) always
    # (strength 0.5; their hue 0.4 is 0.1 here), grayscale 0.2, flip.
    'moco_v1': (ViewConfig(crop_scale=(0.2, 1.), flip_p=0.5,
                           jitter_strength=0.5, jitter_p=1.0,
                           grayscale_p=0.2),) * 2,
    # MoCo v2: SimCLR's ops with jitter strength 0.5 and blur p=0.5.
    'moco_v2': (dataclasses.replace(_SIMCLR, crop_scale=(0.2, 1.),
                                    jitter_strength=0.5),) * 2,
    # BYOL's asymmetric pair: blur 1.0 / 0.1, solarize 0 / 0.2.
    'byol': (dataclasses.replace(_SIMCLR, blur_p=1.0, solarize_p=0.),
             dataclasses.replace(_SIMCLR, blur_p=0.1, solarize_p=0.2)),
    # CACR / MACL on CIFAR: crop (0.2, 1), flip, jitter 0.4 p=0.8, gray 0.2.
    'cifar_small': (ViewConfig(crop_scale=(0.2, 1.), flip_p=0.5,
                               jitter_strength=0.5, jitter_p=0.8,
                               grayscale_p=0.2),) * 2,
    # TCL on Fashion-MNIST: RandomCrop(28, padding=4) + horizontal flip.
    'tcl_fmnist': (ViewConfig(crop_scale=None, pad_crop=4, flip_p=0.5),) * 2,
    # TCL on CIFAR and ImageNet (the official code's train transform):
    # RandomCrop(padding=4), horizontal flip, then AutoAugment with the
    # CIFAR-10 policy at every scale, in the conventions of the port that
    # code copies; no colour jitter, grayscale or blur.
    'tcl': (ViewConfig(crop_scale=None, pad_crop=4, flip_p=0.5,
                       autoaugment='cifar10',
                       autoaugment_impl='pytorch_auto_augment',
                       jitter_p=0.),) * 2,
    # This project's Fashion-MNIST recipe (see configs/default.py for how it
    # was chosen): moderate crops, flips, brightness/contrast, erasing.
    'fmnist': (ViewConfig(crop_scale=(0.3, 1.), flip_p=0.5,
                          jitter_strength=0.5, jitter_p=0.8, erase_p=0.25),) * 2,
    # Multi-crop (SwAV, Caron et al. 2020; DINO, Caron et al. 2021): 2 global
    # crops then up to 8 local crops, so `num_views` = 2 + number of locals.
    # DINO at 224 px: global scale (0.4, 1), local (0.05, 0.4) at 96 px. On
    # 28-32 px images a 5% crop is ~6x6 pixels, so locals start at 0.1 here;
    # the local side keeps DINO's 96/224 = 3/7 (12 px at 28, 14 px at 32).
    # Ops follow DINO minus blur (dropped for small images as simclr_small);
    # the second global crop keeps BYOL/DINO's solarize p = 0.2.
    'multicrop': (_MC_GLOBAL, dataclasses.replace(_MC_GLOBAL, solarize_p=0.2))
                 + (_MC_LOCAL,) * 8,
    # The same at ImageNet size, with DINO's blur: 1.0 / 0.1 on the global
    # crops, 0.5 on the locals, and DINO's local scale (0.05, 0.4).
    'multicrop_large': (
        dataclasses.replace(_MC_GLOBAL, blur_p=1.0),
        dataclasses.replace(_MC_GLOBAL, blur_p=0.1, solarize_p=0.2))
                       + (dataclasses.replace(_MC_LOCAL, crop_scale=(0.05, .4),
                                              blur_p=0.5),) * 8,
}


def get_views(preset: str, num_views: int) -> tuple[ViewConfig, ...]:
  """Returns `num_views` recipes from a preset, cycling its list."""
  if preset not in PRESETS:
    raise ValueError(f'unknown augmentation preset {preset!r}; known: '
                     f'{", ".join(sorted(PRESETS))}.')
  base = PRESETS[preset]
  return tuple(base[i % len(base)] for i in range(num_views))


_PROBABILITY_FIELDS = ('flip_p', 'jitter_p', 'grayscale_p', 'blur_p',
                       'solarize_p', 'erase_p')


def build_views(preset: str, num_views: int, overrides=(), op_order=None
                ) -> tuple[ViewConfig, ...]:
  """The view recipes of a config: a preset plus optional per-view overrides.

  For example `build_views('simclr', 2, ({'blur_p': 1.0},
  {'blur_p': 0.1, 'solarize_p': 0.2}))` is BYOL's asymmetric pair.

  Args:
    preset: a key of `PRESETS`; its views are cycled to `num_views`.
    num_views: V, in [MIN_VIEWS, MAX_VIEWS].
    overrides: a sequence of mappings (dicts or ConfigDicts) of `ViewConfig`
      fields. Empty: the preset as is. One mapping: applied to every view.
      V mappings: mapping v applied to view v. Lists become tuples, so
      `crop_scale=[0.2, 1.0]` from a config works.
    op_order: the ops' order of every view (`config.augment.op_order`, a
      string like 'crop, grayscale, jitter, flip' or a sequence of `OPS`
      names); None keeps `DEFAULT_OP_ORDER`.

  Returns:
    V `ViewConfig`s.

  Raises:
    ValueError: V out of range, an unknown preset or field, a wrong number of
      overrides, or an out-of-range value.
  """
  if not MIN_VIEWS <= num_views <= MAX_VIEWS:
    raise ValueError(f'num_views={num_views} is out of range: the pipeline '
                     f'makes {MIN_VIEWS} to {MAX_VIEWS} views per image '
                     '(config.augment.num_views).')
  views = list(get_views(preset, num_views))
  overrides = list(overrides or ())
  if overrides:
    if len(overrides) == 1:
      overrides = overrides * num_views
    if len(overrides) != num_views:
      raise ValueError(f'got {len(overrides)} view overrides for {num_views} '
                       'views; give one (applied to every view) or one per '
                       'view (config.augment.overrides).')
    fields = {f.name for f in dataclasses.fields(ViewConfig)} - {'op_order'}
    for v, override in enumerate(overrides):
      override = dict(override)
      if 'op_order' in override:
        raise ValueError(f'view {v}: op_order is one for every view; set '
                         'config.augment.op_order, not an override.')
      unknown = sorted(set(override) - fields)
      if unknown:
        raise ValueError(f'unknown ViewConfig field(s) {unknown} in the '
                         f'override of view {v}; known: {sorted(fields)}.')
      override = {k: tuple(x) if isinstance(x, list) else x
                  for k, x in override.items()}
      views[v] = dataclasses.replace(views[v], **override)
  if op_order is not None:
    order = parse_op_order(op_order)
    views = [dataclasses.replace(cfg, op_order=order) for cfg in views]
  for v, cfg in enumerate(views):
    _validate(cfg, v)
  return tuple(views)


def _validate(cfg: ViewConfig, v: int) -> None:
  for name in _PROBABILITY_FIELDS:
    p = getattr(cfg, name)
    if not 0. <= p <= 1.:
      raise ValueError(f'view {v}: {name}={p} is not a probability.')
  if cfg.crop_scale is not None:
    lo, hi = cfg.crop_scale
    if not 0. < lo <= hi <= 1.:
      raise ValueError(f'view {v}: crop_scale={cfg.crop_scale} must satisfy '
                       '0 < min <= max <= 1.')
  lo, hi = cfg.crop_ratio
  if not 0. < lo <= hi:
    raise ValueError(f'view {v}: crop_ratio={cfg.crop_ratio} must satisfy '
                     '0 < min <= max.')
  if cfg.pad_crop < 0 or cfg.jitter_strength < 0:
    raise ValueError(f'view {v}: pad_crop and jitter_strength must be >= 0.')
  if cfg.jitter is not None and (len(cfg.jitter) != 4 or min(cfg.jitter) < 0
                                 or cfg.jitter[3] > 0.5):
    raise ValueError(f'view {v}: jitter={cfg.jitter} must be four amounts '
                     '(brightness, contrast, saturation, hue) >= 0, hue '
                     '<= 0.5.')
  if cfg.autoaugment and cfg.autoaugment not in AUTOAUGMENT_POLICIES:
    raise ValueError(f'view {v}: autoaugment={cfg.autoaugment!r} is not a '
                     'policy; known: '
                     f'{", ".join(sorted(AUTOAUGMENT_POLICIES))} (or \'\' for '
                     'none).')
  if cfg.autoaugment_impl not in AUTOAUGMENT_IMPLS:
    raise ValueError(f'view {v}: autoaugment_impl={cfg.autoaugment_impl!r}; '
                     f'known: {", ".join(AUTOAUGMENT_IMPLS)}.')
  if cfg.autoaugment:
    try:
      check_autoaugment_policy(cfg.autoaugment, cfg.autoaugment_impl)
    except ValueError as e:
      raise ValueError(f'view {v}: {e}') from None
  if cfg.size is not None:
    resolve_size(cfg.size, (1, 1))   # Type and range checks only.
  order = parse_op_order(cfg.op_order)
  used = {'flip': cfg.flip_p, 'autoaugment': cfg.autoaugment,
          'jitter': any(cfg.jitter_amounts()),
          'grayscale': cfg.grayscale_p, 'blur': cfg.blur_p,
          'solarize': cfg.solarize_p}
  missing = [op for op, on in used.items() if on and op not in order]
  if missing:
    raise ValueError(f'view {v}: its op order {", ".join(order)!r} leaves out '
                     f'{", ".join(missing)}, which the view uses '
                     '(config.augment.op_order).')
