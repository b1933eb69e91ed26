"""Image augmentations as pure, jittable JAX functions.

Each op maps `(rng, image [H, W, C] float32 in [0, 1], **params) -> image`;
`augment_batch` vmaps each view's `ViewConfig` over the batch, so one jitted
call makes V views [B, V, h, w, C] on the devices that train on them. On one
channel, saturation, hue and grayscale are identities. docs/input_pipeline.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from input_pipeline import autoaugment as aa
from input_pipeline.autoaugment import autoaugment


OPS = ('crop', 'flip', 'autoaugment', 'jitter', 'grayscale', 'blur',
       'solarize')
DEFAULT_OP_ORDER = OPS


@dataclasses.dataclass(frozen=True)
class ViewConfig:
  """One view's recipe at its input's size; ops run in `op_order`, erase last.

  `jitter` (ColorJitter's amounts) replaces the strength s's (0.8 s, 0.8 s,
  0.8 s, 0.2 s); `autoaugment_impl` '' runs the policy's own convention.
  """
  crop_scale: tuple[float, float] | None = (0.08, 1.0)   # None: no crop.
  crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
  pad_crop: int = 0        # Translation crop padding (TCL); runs with crop.
  flip_p: float = 0.5
  autoaugment: str = ''    # '' or a policy: 'cifar10' (TCL), 'v0' (SupCon).
  autoaugment_impl: str = ''   # 'pytorch_auto_augment', 'tf_model_garden'.
  jitter_strength: float = 0.0
  jitter: tuple[float, float, float, float] | None = None
  jitter_p: float = 0.8
  grayscale_p: float = 0.0
  blur_p: float = 0.0      # Sigma in [0.1, 2], kernel ~10% of the side.
  solarize_p: float = 0.0
  erase_p: float = 0.0     # One rectangle (Zhong et al.).
  op_order: tuple[str, ...] = OPS

  def jitter_amounts(self) -> tuple[float, float, float, float]:
    """(brightness, contrast, saturation, hue): `jitter`, else from s."""
    if self.jitter is not None:
      return tuple(self.jitter)
    s = self.jitter_strength
    return (0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)


def parse_op_order(order) -> tuple[str, ...]:
  """'crop, grayscale, jitter, flip' (or a sequence) -> distinct `OPS` names
  starting with 'crop'; raises otherwise."""
  names = tuple(n.strip() for n in (order.split(',') if isinstance(order, str)
                                     else order))
  if (not names or names[0] != 'crop' or len(set(names)) != len(names)
      or not set(names) <= set(OPS)):
    raise ValueError(f'op order {order!r}: name distinct ops of '
                     f'{", ".join(OPS)}, starting with crop (e.g. '
                     f'{", ".join(DEFAULT_OP_ORDER)!r}).')
  return names


# Each view is a forward pass per step: 1 (memory banks) to 10 (papers <= 5).
MIN_VIEWS, MAX_VIEWS = 1, 10


def random_resized_crop(rng, image, *, scale=(0.08, 1.0),
                        ratio=(3 / 4, 4 / 3), size=None):
  """A box of area fraction ~U(scale), log aspect ~U(log ratio), clipped to
  the image (branch-free, where torchvision retries), resized bilinearly to
  `size` ((h, w); None keeps [H, W])."""
  h, w, c = image.shape
  oh, ow = (h, w) if size is None else size
  k_area, k_ratio, k_y, k_x = jax.random.split(rng, 4)
  area = jax.random.uniform(k_area, (), minval=scale[0], maxval=scale[1])
  r = jnp.exp(jax.random.uniform(k_ratio, (), minval=math.log(ratio[0]),
                                 maxval=math.log(ratio[1])))
  ch = jnp.clip(jnp.sqrt(area / r) * h, 1.0, h)
  cw = jnp.clip(jnp.sqrt(area * r) * w, 1.0, w)
  y0 = jax.random.uniform(k_y, ()) * (h - ch)
  x0 = jax.random.uniform(k_x, ()) * (w - cw)
  # u -> u * scale + translation maps [y0, y0 + ch] onto [0, oh].
  sy, sx = oh / ch, ow / cw
  return jax.image.scale_and_translate(
      image, (oh, ow, c), spatial_dims=(0, 1), scale=jnp.stack([sy, sx]),
      translation=jnp.stack([-y0 * sy, -x0 * sx]), method='linear',
      antialias=False)


def pad_and_crop(rng, image, *, pad):
  """Zero-pads by `pad` pixels and takes a random crop of the input size."""
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


def jitter(image, brightness, contrast, saturation, hue):
  """Brightness, contrast, saturation and hue (turns) of [H, W, C] in [0, 1]
  as one affine map x -> A x + t, clipped once: the four maps commute, so
  SimCLR's random order (clipping after each) gives the same image."""
  channels = image.shape[-1]
  eye = jnp.eye(channels, dtype=image.dtype)
  if channels == 3:
    theta = 2 * jnp.pi * hue    # HSV's hue shift as a chroma rotation in YIQ.
    c, s = jnp.cos(theta), jnp.sin(theta)
    rotation = jnp.array([[1., 0., 0.], [0., c, -s], [0., s, c]])
    hue_map = jnp.asarray(_FROM_YIQ) @ rotation @ jnp.asarray(_TO_YIQ)
    g = jnp.asarray(_TO_YIQ[0], image.dtype)
    blend = saturation * eye + (1. - saturation) * jnp.outer(
        jnp.ones(3, image.dtype), g)
    a = brightness * contrast * hue_map.astype(image.dtype) @ blend
  else:
    g = jnp.ones((1,), image.dtype)
    a = brightness * contrast * eye
  m = brightness * (g @ jnp.mean(image, axis=(0, 1)))
  t = (1. - contrast) * m * jnp.ones((channels,), image.dtype)
  # x A^T + t as C multiply-adds: one fused pass, no tiny batched matmul.
  out = t + sum(image[..., k:k + 1] * a[:, k] for k in range(channels))
  return jnp.clip(out, 0., 1.)


def color_jitter(rng, image, *, amounts, p=0.8):
  """`jitter` with factors drawn as torchvision's `ColorJitter(b, c, s, h)`
  from `amounts` = (b, c, s, h), applied with probability p."""
  # The sixth key is unused (no order is drawn); the five keep their seeds.
  k_apply, k_b, k_c, k_s, k_h, _ = jax.random.split(rng, 6)
  u = lambda k, r: jax.random.uniform(k, (), minval=1 - r, maxval=1 + r)
  b, c, s = (u(k, r) for k, r in zip((k_b, k_c, k_s), amounts))
  hue = jax.random.uniform(k_h, (), minval=-amounts[3], maxval=amounts[3])
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
  """Zeroes a rectangle of area fraction ~U(scale), aspect in [0.3, 3.3]."""
  h, w, _ = image.shape
  k_apply, k_area, k_ratio, k_y, k_x = jax.random.split(rng, 5)
  area = jax.random.uniform(k_area, (), minval=scale[0],
                            maxval=scale[1]) * h * w
  r = jnp.exp(jax.random.uniform(k_ratio, (), minval=math.log(0.3),
                                 maxval=math.log(3.3)))
  eh = jnp.clip(jnp.sqrt(area * r), 1, h)
  ew = jnp.clip(jnp.sqrt(area / r), 1, w)
  y0 = jax.random.uniform(k_y, ()) * (h - eh)
  x0 = jax.random.uniform(k_x, ()) * (w - ew)
  yy, xx = jnp.arange(h)[:, None, None], jnp.arange(w)[None, :, None]
  inside = (yy >= y0) & (yy < y0 + eh) & (xx >= x0) & (xx < x0 + ew)
  out = jnp.where(inside, 0., image)
  return jnp.where(jax.random.bernoulli(k_apply, p), out, image)


# fold_in(rng, this) keys AutoAugment, far from `split`'s counters.
_AUTOAUGMENT_STREAM = 0x41754175


def augment_image(rng, image, cfg: ViewConfig, *, cropped: bool = False):
  """One view of one image [H, W, C] in [0, 1]; `cropped`: the image is the
  view's host-cut crop (`sources.RandomCrops`), only resized. Each op keeps
  its own key whatever the order."""
  keys = jax.random.split(rng, 8)
  for op in cfg.op_order:
    if op == 'crop':
      if cfg.pad_crop:
        image = pad_and_crop(keys[0], image, pad=cfg.pad_crop)
      if cfg.crop_scale is not None and not cropped:
        image = random_resized_crop(keys[1], image, scale=cfg.crop_scale,
                                    ratio=cfg.crop_ratio)
    elif op == 'flip' and cfg.flip_p:
      image = flip_left_right(keys[2], image, p=cfg.flip_p)
    elif op == 'autoaugment' and cfg.autoaugment:
      impl = (cfg.autoaugment_impl
              or aa.AUTOAUGMENT_POLICY_IMPLS[cfg.autoaugment])
      image = autoaugment(jax.random.fold_in(rng, _AUTOAUGMENT_STREAM), image,
                          policy=cfg.autoaugment, impl=impl)
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


def augment_batch(rng, images, views: Sequence[ViewConfig], *,
                  host_cropped: bool = False) -> jax.Array:
  """len(views) views of images [B, H, W, C] (uint8 or float in [0, 1]) as
  [B, V, h, w, C] float32; with `host_cropped`, images [B, V, H, W, C] hold
  each view's crop, cut on the host. View v draws from fold_in(rng, v), so
  it does not depend on the views after it."""
  if images.dtype == jnp.uint8:
    images = images.astype(jnp.float32) / 255.
  if host_cropped and (images.ndim != 5 or images.shape[1] != len(views)):
    raise ValueError(f'host-cropped images must be [B, V={len(views)}, H, W, '
                     f'C]; got {images.shape}.')
  out = {}
  for cfg in dict.fromkeys(views):      # Identical views compile once.
    members = [v for v, c in enumerate(views) if c == cfg]
    keys = jnp.stack([jax.random.split(jax.random.fold_in(rng, v),
                                       images.shape[0]) for v in members])
    # Host-cropped: each view its own crops, [V_cfg, B, H, W, C].
    inputs, in_axes = ((jnp.stack([images[:, v] for v in members]), 0)
                       if host_cropped else (images, None))
    fn = functools.partial(augment_image, cfg=cfg, cropped=host_cropped)
    out.update(zip(members, jax.vmap(jax.vmap(fn), in_axes=(0, in_axes))(
        keys, inputs)))                           # [V_cfg, B, h, w, C]
  return jnp.stack([out[v] for v in range(len(views))], axis=1)


# The papers' recipes, cycled to the configured V; flip p = 0.5 in all.
_SIMCLR = ViewConfig(jitter_strength=1.0, grayscale_p=0.2, blur_p=0.5)
PRESETS: dict[str, tuple[ViewConfig, ...]] = {
    # SimCLR (Chen et al. 2020, appendix A); blur is used for ImageNet-size
    # images only, so `simclr_small` drops it for 32x32 and smaller.
    'simclr': (_SIMCLR, _SIMCLR),
    'simclr_small': (dataclasses.replace(_SIMCLR, blur_p=0.),) * 2,
    # InsDis / MoCo v1: crop 0.2-1, ColorJitter(0.4, 0.4, 0.4) always
    # (strength 0.5; their hue 0.4 is 0.1 here), grayscale 0.2, flip.
    'moco_v1': (ViewConfig(crop_scale=(0.2, 1.), jitter_strength=0.5,
                           jitter_p=1.0, grayscale_p=0.2),) * 2,
    # MoCo v2: SimCLR's ops with jitter strength 0.5 and blur p=0.5.
    'moco_v2': (dataclasses.replace(_SIMCLR, crop_scale=(0.2, 1.),
                                    jitter_strength=0.5),) * 2,
    # BYOL's asymmetric pair: blur 1.0 / 0.1, solarize 0 / 0.2.
    'byol': (dataclasses.replace(_SIMCLR, blur_p=1.0, solarize_p=0.),
             dataclasses.replace(_SIMCLR, blur_p=0.1, solarize_p=0.2)),
    # CACR / MACL on CIFAR: crop (0.2, 1), flip, jitter 0.4 p=0.8, gray 0.2.
    'cifar_small': (ViewConfig(crop_scale=(0.2, 1.), jitter_strength=0.5,
                               grayscale_p=0.2),) * 2,
    # TCL on Fashion-MNIST: RandomCrop(28, padding=4) + horizontal flip.
    'tcl_fmnist': (ViewConfig(crop_scale=None, pad_crop=4),) * 2,
    # TCL on CIFAR and ImageNet (its train transform): RandomCrop(padding=4),
    # flip, AutoAugment's CIFAR-10 policy in the port's conventions.
    'tcl': (ViewConfig(crop_scale=None, pad_crop=4, autoaugment='cifar10',
                       autoaugment_impl='pytorch_auto_augment',
                       jitter_p=0.),) * 2,
    # This project's Fashion-MNIST recipe (configs/default.py).
    'fmnist': (ViewConfig(crop_scale=(0.3, 1.), jitter_strength=0.5,
                          erase_p=0.25),) * 2,
}


def get_views(preset: str, num_views: int) -> tuple[ViewConfig, ...]:
  """Returns `num_views` recipes from a preset, cycling its list."""
  if preset not in PRESETS:
    raise ValueError(f'unknown augmentation preset {preset!r}; known: '
                     f'{", ".join(sorted(PRESETS))}.')
  base = PRESETS[preset]
  return tuple(base[i % len(base)] for i in range(num_views))


def build_views(preset: str, num_views: int, overrides=(), op_order=None
                ) -> tuple[ViewConfig, ...]:
  """V recipes: `preset` cycled to `num_views`, then `overrides` (mappings
  of `ViewConfig` fields: none, one for all, or one per view) and every
  view's `op_order` (`parse_op_order`; None: `DEFAULT_OP_ORDER`); raises
  ValueError for anything out of range or unknown."""
  if not MIN_VIEWS <= num_views <= MAX_VIEWS:
    raise ValueError(f'num_views={num_views} is out of range: the pipeline '
                     f'makes {MIN_VIEWS} to {MAX_VIEWS} views per image '
                     '(config.augment.num_views).')
  views = list(get_views(preset, num_views))
  overrides = list(overrides or ())
  if len(overrides) == 1:
    overrides = overrides * num_views
  if overrides and len(overrides) != num_views:
    raise ValueError(f'got {len(overrides)} view overrides for {num_views} '
                     'views; give one (applied to every view) or one per '
                     'view (config.augment.overrides).')
  fields = {f.name for f in dataclasses.fields(ViewConfig)} - {'op_order'}
  for v, override in enumerate(map(dict, overrides)):
    if 'op_order' in override:
      raise ValueError(f'view {v}: op_order is one for every view; set '
                       'config.augment.op_order, not an override.')
    if unknown := sorted(set(override) - fields):
      raise ValueError(f'unknown ViewConfig field(s) {unknown} in the '
                       f'override of view {v}; known: {sorted(fields)}.')
    views[v] = dataclasses.replace(views[v], **{
        k: tuple(x) if isinstance(x, list) else x
        for k, x in override.items()})
  if op_order is not None:
    order = parse_op_order(op_order)
    views = [dataclasses.replace(cfg, op_order=order) for cfg in views]
  for v, cfg in enumerate(views):
    _validate(cfg, v)
  return tuple(views)


def _validate(cfg: ViewConfig, v: int) -> None:
  for name in ('flip_p', 'jitter_p', 'grayscale_p', 'blur_p', 'solarize_p',
               'erase_p'):
    if not 0. <= (p := getattr(cfg, name)) <= 1.:
      raise ValueError(f'view {v}: {name}={p} is not a probability.')
  lo, hi = (1., 1.) if cfg.crop_scale is None else cfg.crop_scale
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
  if cfg.autoaugment and cfg.autoaugment not in aa.AUTOAUGMENT_POLICIES:
    known = ', '.join(sorted(aa.AUTOAUGMENT_POLICIES))
    raise ValueError(f'view {v}: autoaugment={cfg.autoaugment!r} is not a '
                     f"policy; known: {known} (or '' for none).")
  if cfg.autoaugment_impl not in ('',) + aa.AUTOAUGMENT_IMPLS:
    raise ValueError(f'view {v}: autoaugment_impl={cfg.autoaugment_impl!r}; '
                     f'known: {", ".join(aa.AUTOAUGMENT_IMPLS)}.')
  if cfg.autoaugment and cfg.autoaugment_impl:
    try:
      aa.check_autoaugment_policy(cfg.autoaugment, cfg.autoaugment_impl)
    except ValueError as e:
      raise ValueError(f'view {v}: {e}') from None
  used = {'flip': cfg.flip_p, 'autoaugment': cfg.autoaugment,
          'jitter': any(cfg.jitter_amounts()), 'grayscale': cfg.grayscale_p,
          'blur': cfg.blur_p, 'solarize': cfg.solarize_p}
  if missing := [op for op, on in used.items()
                 if on and op not in cfg.op_order]:
    raise ValueError(f'view {v}: its op order {", ".join(cfg.op_order)!r} '
                     f'leaves out {", ".join(missing)}, which the view uses '
                     '(config.augment.op_order).')
