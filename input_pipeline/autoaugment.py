"""AutoAugment (Cubuk et al. 2019): jittable ops on [H, W, C] images in [0, 1].

Two conventions (`ViewConfig.autoaugment_impl`), each running the policy it
defines: 'pytorch_auto_augment' runs 'cifar10' as TCL's port
(4uiiurz1/pytorch-auto-augment: scipy.ndimage cubic warps), 'tf_model_garden'
runs 'v0' as TF Model Garden's `AutoAugment().distort` (SupCon; uint8 after
every op). Derivations: docs/input_pipeline.md.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

AUTOAUGMENT_OPS = ('ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate',
                   'Brightness', 'Color', 'Contrast', 'Sharpness', 'Posterize',
                   'Solarize', 'AutoContrast', 'Equalize', 'Invert')
_NUM_GEOMETRIC = 5        # The first five ops move pixels; the rest map values.
# TF's ops: the fourteen plus SolarizeAdd and Cutout.
TF_AUTOAUGMENT_OPS = AUTOAUGMENT_OPS + ('SolarizeAdd', 'Cutout')


def _parse_policy(text: str):
  """'op probability bin' twice per sub-policy ('-': no magnitude), two
  sub-policies per line split by '|' -> ((op, p, bin or None), ...) rows."""
  rows = [part.split() for part in text.replace('\n', '|').split('|')]
  return tuple(tuple((w[i], float(w[i + 1]),
                      None if w[i + 2] == '-' else int(w[i + 2]))
                     for i in (0, 3)) for w in rows if w)


# 25 sub-policies of two (op, probability, magnitude bin or TF level) each:
# 'cifar10' is torchvision's `AutoAugmentPolicy.CIFAR10`, the port's table;
# 'v0' TF Model Garden's `policy_v0()` (official/legacy/image_classification/
# augment.py), levels as written there, also for ops taking no argument.
AUTOAUGMENT_POLICIES = {
    'cifar10': _parse_policy("""
Invert 0.1 - Contrast 0.2 6 | Rotate 0.7 2 TranslateX 0.3 9
Sharpness 0.8 1 Sharpness 0.9 3 | ShearY 0.5 8 TranslateY 0.7 9
AutoContrast 0.5 - Equalize 0.9 - | ShearY 0.2 7 Posterize 0.3 7
Color 0.4 3 Brightness 0.6 7 | Sharpness 0.3 9 Brightness 0.7 9
Equalize 0.6 - Equalize 0.5 - | Contrast 0.6 7 Sharpness 0.6 5
Color 0.7 7 TranslateX 0.5 8 | Equalize 0.3 - AutoContrast 0.4 -
TranslateY 0.4 3 Sharpness 0.2 6 | Brightness 0.9 6 Color 0.2 8
Solarize 0.5 2 Invert 0.0 - | Equalize 0.2 - AutoContrast 0.6 -
Equalize 0.2 - Equalize 0.6 - | Color 0.9 9 Equalize 0.6 -
AutoContrast 0.8 - Solarize 0.2 8 | Brightness 0.1 3 Color 0.7 0
Solarize 0.4 5 AutoContrast 0.9 - | TranslateY 0.9 9 TranslateY 0.7 9
AutoContrast 0.9 - Solarize 0.8 3 | Equalize 0.8 - Invert 0.1 -
TranslateY 0.7 9 AutoContrast 0.9 -"""),
    'v0': _parse_policy("""
Equalize 0.8 1 ShearY 0.8 4 | Color 0.4 9 Equalize 0.6 3
Color 0.4 1 Rotate 0.6 8 | Solarize 0.8 3 Equalize 0.4 7
Solarize 0.4 2 Solarize 0.6 2 | Color 0.2 0 Equalize 0.8 8
Equalize 0.4 8 SolarizeAdd 0.8 3 | ShearX 0.2 9 Rotate 0.6 8
Color 0.6 1 Equalize 1.0 2 | Invert 0.4 9 Rotate 0.6 0
Equalize 1.0 9 ShearY 0.6 3 | Color 0.4 7 Equalize 0.6 0
Posterize 0.4 6 AutoContrast 0.4 7 | Solarize 0.6 8 Color 0.6 9
Solarize 0.2 4 Rotate 0.8 9 | Rotate 1.0 7 TranslateY 0.8 9
ShearX 0.0 0 Solarize 0.8 4 | ShearY 0.8 0 Color 0.6 4
Color 1.0 0 Rotate 0.6 2 | Equalize 0.8 4 Equalize 0.0 8
Equalize 1.0 4 AutoContrast 0.6 2 | ShearY 0.4 7 SolarizeAdd 0.6 7
Posterize 0.8 2 Solarize 0.6 10 | Solarize 0.6 8 Equalize 0.6 1
Color 0.8 6 Rotate 0.4 5"""),
}
# The convention that defines each policy: bins 0-9 mean nothing to TF's
# level_to_arg, nor levels 0-10 and SolarizeAdd to the port.
AUTOAUGMENT_POLICY_IMPLS = {'cifar10': 'pytorch_auto_augment',
                            'v0': 'tf_model_garden'}
AUTOAUGMENT_IMPLS = tuple(AUTOAUGMENT_POLICY_IMPLS.values())


def check_autoaugment_policy(policy: str, impl: str) -> None:
  """Raises ValueError unless `impl` runs `policy`, naming the fix."""
  if impl not in AUTOAUGMENT_IMPLS:
    raise ValueError(f'unknown AutoAugment implementation {impl!r}; known: '
                     f'{", ".join(AUTOAUGMENT_IMPLS)}.')
  if policy not in AUTOAUGMENT_POLICIES:
    raise ValueError(f'unknown AutoAugment policy {policy!r}; known: '
                     f'{", ".join(sorted(AUTOAUGMENT_POLICIES))}.')
  if impl != (want := AUTOAUGMENT_POLICY_IMPLS[policy]):
    others = sorted(p for p, i in AUTOAUGMENT_POLICY_IMPLS.items() if i == impl)
    raise ValueError(
        f'AutoAugment policy {policy!r} runs with autoaugment_impl {want!r}, '
        f'not {impl!r}: set autoaugment_impl={want!r} (or, keeping {impl!r}, '
        f'a policy of {", ".join(others)}).')


# The pytorch-auto-augment port ('pytorch_auto_augment').

def autoaugment_grids(height: int, width: int) -> np.ndarray:
  """[len(AUTOAUGMENT_OPS), 11]: bin b (0-9) of an op is [grid[b], grid[b +
  1]]; enhance factors stored as factor - 1, zeros for argument-free ops."""
  grid = lambda lo, hi: np.linspace(lo, hi, 11)
  t = 150. / 331.
  rows = {'ShearX': grid(-0.3, 0.3), 'ShearY': grid(-0.3, 0.3),
          'TranslateX': grid(-t, t) * width, 'TranslateY': grid(-t, t) * height,
          'Rotate': grid(-30., 30.), 'Posterize': grid(4., 8.),
          'Solarize': grid(0., 256.), 'Brightness': grid(-0.9, 0.9),
          'Color': grid(-0.9, 0.9), 'Contrast': grid(-0.9, 0.9),
          'Sharpness': grid(-0.9, 0.9)}
  return np.stack([rows.get(op, np.zeros(11)) for op in AUTOAUGMENT_OPS]
                  ).astype(np.float32)


@functools.lru_cache(maxsize=None)
def cubic_spline_prefilter(n: int) -> np.ndarray:
  """[n, n] float64 P, c = P @ x: scipy's spline_filter1d(order=3,
  mode='mirror') in closed form (x convolved with sqrt(3) z^|k| over the
  mirror extension, period 2n - 2). Cached, read-only."""
  if n == 1:
    out = np.ones((1, 1))
  else:
    z, p = math.sqrt(3.) - 2., 2 * n - 2    # z: beta3's pole (Unser 1999).
    periodic = lambda d: (z ** np.abs(d)
                          + (z ** (p - d) + z ** (p + d)) / (1. - z ** p))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    reflected = (j > 0) & (j < n - 1)
    out = math.sqrt(3.) * (periodic(i - j)
                           + np.where(reflected, periodic(i + j), 0.))
  out.setflags(write=False)
  return out


def _mirror_index(index, n):
  """`index` mapped into [0, n) by the mirror extension (period 2n - 2)."""
  if n == 1:
    return jnp.zeros_like(index)
  period = 2 * n - 2
  index = jnp.mod(index, period)
  return jnp.where(index >= n, period - index, index)


def _cubic_bspline(d):
  a = jnp.abs(d)
  return jnp.where(a < 1., 2. / 3. - a * a + a * a * a / 2.,
                   jnp.where(a < 2., (2. - a) ** 3 / 6., 0.))


def affine_cubic_spline(image, matrix):
  """scipy.ndimage.affine_transform(order=3, mode='constant') per channel:
  [H, W, C] -> [H, W, C] float32, output (row, col) sampling the input at
  matrix [2, 3] @ (row, col, 1) (may be traced), 0 outside, not clipped."""
  h, w, _ = image.shape
  p_h = jnp.asarray(cubic_spline_prefilter(h), jnp.float32)
  p_w = jnp.asarray(cubic_spline_prefilter(w), jnp.float32)
  coeffs = jnp.einsum('ij,jkc,lk->ilc', p_h, image.astype(jnp.float32), p_w,
                      precision=jax.lax.Precision.HIGHEST)  # TPU/GPU: less.
  rows, cols = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32),
                            jnp.arange(w, dtype=jnp.float32), indexing='ij')
  sy = matrix[0, 0] * rows + matrix[0, 1] * cols + matrix[0, 2]
  sx = matrix[1, 0] * rows + matrix[1, 1] * cols + matrix[1, 2]
  inside = (sy >= 0) & (sy <= h - 1) & (sx >= 0) & (sx <= w - 1)
  # Each tap is weighted by beta3 of its own distance to s, not by s -
  # floor(s): XLA may round s differently in two fusions, and a tap index
  # from one with a fraction from the other would shift the weights a pixel.
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


def _geometric_matrix_port(op, magnitude, height, width):
  """The port's inverse map [2, 3] on (row, column), L (p - o) + o + t about
  o = (H / 2 + 0.5, W / 2 + 0.5); the identity for value ops."""
  m = magnitude
  one, zero = jnp.ones_like(m), jnp.zeros_like(m)
  c, s = jnp.cos(jnp.deg2rad(m)), jnp.sin(jnp.deg2rad(m))
  linear_and_shift = jnp.stack([
      jnp.array([[one, m, zero], [zero, one, zero]]),              # ShearX
      jnp.array([[one, zero, zero], [m, one, zero]]),              # ShearY
      jnp.array([[one, zero, zero], [zero, one, m]]),              # TranslateX
      jnp.array([[one, zero, m], [zero, one, zero]]),              # TranslateY
      jnp.array([[c, -s, zero], [s, c, zero]]),                    # Rotate
      jnp.array([[one, zero, zero], [zero, one, zero]]),           # identity
  ])[jnp.minimum(op, _NUM_GEOMETRIC)]
  linear, shift = linear_and_shift[:, :2], linear_and_shift[:, 2]
  centre = jnp.array([height / 2. + 0.5, width / 2. + 0.5], jnp.float32)
  # Elementwise, not `@`: accelerators may run a matmul below float32.
  offset = centre - jnp.sum(linear * centre, axis=1) + shift
  return jnp.concatenate([linear, offset[:, None]], axis=1)


def _luma(image):
  if image.shape[-1] == 1:
    return image[..., 0]
  return image @ jnp.array([0.299, 0.587, 0.114], image.dtype)


def _blend(image, degenerate, factor):
  """PIL's `ImageEnhance`: degenerate + factor (image - degenerate), clipped."""
  return jnp.clip(degenerate + factor * (image - degenerate), 0., 1.)


def _to_levels(image):
  return jnp.round(jnp.clip(image, 0., 1.) * 255.).astype(jnp.int32)


def _aa_sharpness(image, m):
  """Blend with PIL's SMOOTH filter; the one-pixel border keeps its values."""
  h, w, _ = image.shape
  smooth = sum(image[1 + dy:h - 1 + dy, 1 + dx:w - 1 + dx]
               for dy in (-1, 0, 1) for dx in (-1, 0, 1))
  smooth = (smooth + 4. * image[1:-1, 1:-1]) / 13.
  degenerate = image.at[1:-1, 1:-1].set(smooth)
  return _blend(image, degenerate, 1. + m)


def _posterize(levels, shift):
  step = jnp.exp2(shift)
  return jnp.floor(levels / step) * step


def _aa_solarize(image, threshold):
  levels = _to_levels(image)
  return jnp.where(levels >= threshold, 255 - levels, levels) / 255.


def _aa_autocontrast(image, _):
  lo, hi = jnp.min(image, axis=(0, 1)), jnp.max(image, axis=(0, 1))
  span = jnp.where(hi > lo, hi - lo, 1.)
  lo = jnp.where(hi > lo, lo, 0.)
  return jnp.clip((image - lo) / span, 0., 1.)


@functools.partial(jax.vmap, in_axes=-1, out_axes=-1)
def _equalize(levels):
  """PIL's `ImageOps.equalize` of each channel of [H, W, C] int levels."""
  hist = jnp.bincount(levels.ravel(), length=256)
  step = (levels.size - hist[jnp.max(levels)]) // 255
  safe = jnp.maximum(step, 1)
  lut = jnp.clip((jnp.cumsum(hist) - hist + step // 2) // safe, 0, 255)
  return jnp.where(step > 0, lut[levels], levels)


# Index = op - _NUM_GEOMETRIC + 1; index 0 passes the (warped) image through.
_AA_VALUE_OPS = (
    lambda image, _: image,
    lambda image, m: _blend(image, jnp.zeros_like(image), 1. + m),
    lambda image, m: image if image.shape[-1] == 1 else _blend(
        image, _luma(image)[..., None], 1. + m),                  # Color
    lambda image, m: _blend(image, jnp.mean(_luma(image)), 1. + m),
    _aa_sharpness,
    lambda image, bits: _posterize(_to_levels(image), 8. - bits) / 255.,
    _aa_solarize, _aa_autocontrast,
    lambda image, _: _equalize(_to_levels(image)).astype(image.dtype) / 255.,
    lambda image, _: 1. - image)


def autoaugment_op(image, op, magnitude):
  """The port's op `op` at signed `magnitude` (both may be traced) on [H, W,
  C] in [0, 1]: a warp rounded half up to 8-bit levels and clipped (as
  scipy writes uint8), then a `lax.switch` over the value ops."""
  h, w, _ = image.shape
  op = jnp.asarray(op, jnp.int32)
  cubic = affine_cubic_spline(image,
                              _geometric_matrix_port(op, magnitude, h, w))
  levels = jnp.clip(jnp.floor(cubic * 255. + 0.5), 0., 255.) / 255.
  warped = jnp.where(op < _NUM_GEOMETRIC, levels, image)
  index = jnp.maximum(op - _NUM_GEOMETRIC + 1, 0)
  return jax.lax.switch(index, _AA_VALUE_OPS, warped, magnitude)


def autoaugment_draw(rng, height, width, policy='cifar10',
                     impl='pytorch_auto_augment'):
  """(sub-policy, its two ops, their signed magnitudes, whether each applies):
  the port's magnitudes uniform in their bin of `autoaugment_grids`; TF's
  `tf_autoaugment_args`, geometric ones negated with probability 1/2."""
  check_autoaugment_policy(policy, impl)
  table = AUTOAUGMENT_POLICIES[policy]          # [S] rows of (op, p, bin) x 2.
  # TF's ops extend the port's: one index serves both.
  ops = jnp.asarray([[TF_AUTOAUGMENT_OPS.index(o) for o, _, _ in row]
                     for row in table], jnp.int32)
  probs = jnp.asarray([[p for _, p, _ in row] for row in table], jnp.float32)
  bins = jnp.asarray([[b or 0 for _, _, b in row] for row in table], jnp.int32)
  k_sub, k_apply, k_sign = jax.random.split(rng, 3)
  sub = jax.random.randint(k_sub, (), 0, ops.shape[0])
  apply = jax.random.uniform(k_apply, (2,)) < probs[sub]
  op, b = ops[sub], bins[sub]
  if impl == 'tf_model_garden':
    m = jnp.asarray(tf_autoaugment_args())[op, b]
    negate = jax.random.bernoulli(k_sign, 0.5, (2,)) & (op < _NUM_GEOMETRIC)
    return sub, op, jnp.where(negate, -m, m), apply
  grid = jnp.asarray(autoaugment_grids(height, width))
  u = jax.random.uniform(k_sign, (2,))
  m = grid[op, b] + u * (grid[op, b + 1] - grid[op, b])
  posterize = op == AUTOAUGMENT_OPS.index('Posterize')
  return sub, op, jnp.where(posterize, jnp.round(m), m), apply


# Cutout's keys: folded from the draw's key, apart from its three splits.
_TF_CUTOUT_STREAM = 0x43757430


def autoaugment(rng, image, *, policy='cifar10', impl='pytorch_auto_augment'):
  """One AutoAugment draw on one image [H, W, C] in [0, 1], C = 1 or 3. The
  port rounds posterize, solarize and equalize to 8-bit levels, keeps its
  other value ops float (within 2 levels of PIL's); TF's run on levels."""
  _, ops, m, apply = autoaugment_draw(rng, *image.shape[:2], policy, impl)
  tf = impl == 'tf_model_garden'
  image = _tf_levels(image) if tf else image
  for slot in range(2):
    key = jax.random.fold_in(rng, _TF_CUTOUT_STREAM + slot)
    out = (tf_autoaugment_op(image, ops[slot], m[slot], key) if tf
           else autoaugment_op(image, ops[slot], m[slot]))
    image = jnp.where(apply[slot], out, image)
  return image / 255. if tf else image


# TF Model Garden ('tf_model_garden'): uint8 after every op.

def tf_autoaugment_args() -> np.ndarray:
  """[len(TF_AUTOAUGMENT_OPS), 11]: TF's `level_to_arg` of each op at
  level 0-10 (f = level / 10), before the geometric ops' random sign, with
  AutoAugment's defaults translate_const = 250, cutout_const = 100."""
  f = np.arange(11, dtype=np.float64) / 10.
  enhance = f * 1.8 + 0.1
  none = np.zeros_like(f)
  rows = {'ShearX': f * 0.3, 'ShearY': f * 0.3, 'Rotate': f * 30.,
          'TranslateX': f * 250., 'TranslateY': f * 250.,
          'Brightness': enhance, 'Color': enhance, 'Contrast': enhance,
          'Sharpness': enhance, 'AutoContrast': none, 'Equalize': none,
          'Invert': none, 'Posterize': np.trunc(f * 4.),
          'Solarize': np.trunc(f * 256.), 'SolarizeAdd': np.trunc(f * 110.),
          'Cutout': np.trunc(f * 100.)}
  return np.stack([rows[op] for op in TF_AUTOAUGMENT_OPS]).astype(np.float32)


def _tf_levels(image):
  """uint8 levels (as float32) of an image in [0, 1], truncated as `tf.cast`;
  1e-3 of slack keeps uint8-born images on their levels."""
  return jnp.floor(jnp.clip(image, 0., 1.) * 255. + 1e-3)


def _f32(x):
  """x rounded to float32 where it stands: keeps XLA from fusing a product
  into the next sum (one FMA rounding), which TF's kernels do not do."""
  return jnp.where(jnp.isnan(x), 0., x)


def _tf_reflect(coord, size: int):
  """TF's FILL_REFLECT of a coordinate (`MapCoordinate`, image_ops.h),
  clamped to [0, size - 1]."""
  period = 2. * size
  low = coord + period * jnp.trunc(-coord / period)          # In (-2n, 0].
  low = jnp.where(low < -size, low + period, -low - 1.)
  high = coord - period * jnp.trunc(coord / period)          # In [0, 2n).
  high = jnp.where(high >= size, period - high - 1., high)
  out = jnp.where(coord < 0., low, jnp.where(coord > size - 1., high, coord))
  return jnp.clip(out, 0., size - 1.)


def _tf_warp(levels, matrix):
  """Keras' `transform`, nearest, fill_mode='reflect': output (x, y) samples
  matrix @ (x, y, 1), reflected and rounded half away from zero. Reflection
  leaves no empty pixel, so TF's fill of 128 never shows."""
  h, w, _ = levels.shape
  ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32),
                        jnp.arange(w, dtype=jnp.float32), indexing='ij')
  sx = _f32(matrix[0, 0] * xs) + _f32(matrix[0, 1] * ys) + matrix[0, 2]
  sy = _f32(matrix[1, 0] * xs) + _f32(matrix[1, 1] * ys) + matrix[1, 2]
  ix = jnp.floor(_tf_reflect(sx, w) + 0.5).astype(jnp.int32)
  iy = jnp.floor(_tf_reflect(sy, h) + 0.5).astype(jnp.int32)
  return levels[iy, ix]


def _tf_geometric_matrix(op, arg, height, width):
  """TF's inverse maps [2, 3] on (column, row) (identity for value ops);
  Rotate about the centre as `_convert_angles_to_transform`, in float32."""
  m = jnp.asarray(arg, jnp.float32)
  one, zero = jnp.ones_like(m), jnp.zeros_like(m)
  theta = m * jnp.float32(math.pi / 180.)
  c, s = jnp.cos(theta), jnp.sin(theta)
  w1, h1 = jnp.float32(width - 1), jnp.float32(height - 1)
  x_off = (w1 - (_f32(c * w1) - _f32(s * h1))) / 2.
  y_off = (h1 - (_f32(s * w1) + _f32(c * h1))) / 2.
  return jnp.stack([
      jnp.array([[one, m, zero], [zero, one, zero]]),              # ShearX
      jnp.array([[one, zero, zero], [m, one, zero]]),              # ShearY
      jnp.array([[one, zero, m], [zero, one, zero]]),              # TranslateX
      jnp.array([[one, zero, zero], [zero, one, m]]),              # TranslateY
      jnp.array([[c, -s, x_off], [s, c, y_off]]),                  # Rotate
      jnp.array([[one, zero, zero], [zero, one, zero]]),           # identity
  ])[jnp.minimum(op, _NUM_GEOMETRIC)]


def _tf_blend(degenerate, levels, factor):
  """TF's blend: degenerate + factor (image - degenerate), clipped, floored."""
  return jnp.floor(jnp.clip(degenerate + _f32(factor * (levels - degenerate)),
                            0., 255.))


def _tf_color(levels, factor, _):
  """Blend with `tf.image.rgb_to_grayscale`: levels / 255 weighted, x 255.5."""
  if levels.shape[-1] == 1:
    return levels
  weights = jnp.asarray([0.2989, 0.5870, 0.1140], jnp.float32)
  gray = jnp.floor((levels * jnp.float32(1. / 255.)) @ weights
                   * jnp.float32(255.5))
  return _tf_blend(gray[..., None], levels, factor)


def _tf_sharpness(levels, factor, _):
  """Blend with the SMOOTH-filtered image (float32 taps summed row by row, as
  TF's depthwise conv), truncated; the border keeps its levels."""
  h, w = levels.shape[:2]
  w1, w5 = jnp.float32(1.) / 13., jnp.float32(5.) / 13.
  smooth = sum((w5 if (dy, dx) == (1, 1) else w1)
               * levels[dy:h - 2 + dy, dx:w - 2 + dx]
               for dy in (0, 1, 2) for dx in (0, 1, 2))
  degenerate = levels.at[1:-1, 1:-1].set(jnp.floor(jnp.clip(smooth, 0., 255.)))
  return _tf_blend(degenerate, levels, factor)


def _tf_autocontrast(levels, _, __):
  """Per channel x * 255 / (hi - lo) - lo * 255 / (hi - lo), truncated."""
  lo, hi = jnp.min(levels, axis=(0, 1)), jnp.max(levels, axis=(0, 1))
  scale = jnp.float32(255.) / jnp.where(hi > lo, hi - lo, 1.)
  offset = -lo * scale
  out = jnp.floor(jnp.clip(_f32(levels * scale) + offset, 0., 255.))
  return jnp.where(hi > lo, out, levels)


def _tf_cutout(levels, pad_size, key):
  """Fills [cy - pad, cy + pad) x [cx - pad, cx + pad) with 128, the centre
  uniform over the pixels."""
  h, w = levels.shape[:2]
  cy, cx = (jax.random.randint(k, (), 0, n)
            for k, n in zip(jax.random.split(key), (h, w)))
  pad = jnp.asarray(pad_size, jnp.float32).astype(jnp.int32)
  rows, cols = jnp.arange(h)[:, None, None], jnp.arange(w)[None, :, None]
  inside = ((rows >= cy - pad) & (rows < cy + pad)
            & (cols >= cx - pad) & (cols < cx + pad))
  return jnp.where(inside, 128., levels)


_TF_VALUE_OPS = (
    lambda levels, _, __: levels,
    lambda levels, f, _: _tf_blend(jnp.zeros_like(levels), levels, f),
    _tf_color,
    # Contrast: blends with TF's 'mean', its histogram sum / 256, i.e.
    # H W / 256 clipped to 255 and truncated, whatever the image.
    lambda levels, f, _: _tf_blend(jnp.float32(math.floor(min(
        levels.shape[0] * levels.shape[1] / 256., 255.))), levels, f),
    _tf_sharpness,
    # (x >> s) << s, s = 8 - bits clamped to 7 as TF's CPU kernels do.
    lambda levels, bits, _: _posterize(levels, jnp.clip(8. - bits, 0., 7.)),
    # Inverts levels >= threshold mod 256 (TF's uint8 cast: 256 inverts all).
    lambda levels, t, _: jnp.where(levels < jnp.mod(t, 256.), levels,
                                   255. - levels),
    _tf_autocontrast,
    lambda levels, _, __: _equalize(levels.astype(jnp.int32)).astype(
        jnp.float32),
    lambda levels, _, __: 255. - levels,
    lambda levels, add, _: jnp.where(                       # SolarizeAdd
        levels < 128., jnp.clip(levels + add, 0., 255.), levels),
    _tf_cutout)


def tf_autoaugment_op(levels, op, arg, key):
  """TF's op `op` with argument `arg` (both may be traced) on levels [H, W,
  C] (float32 holding uint8, `_tf_levels`); `key`: Cutout's centre."""
  h, w, _ = levels.shape
  op = jnp.asarray(op, jnp.int32)
  warped = _tf_warp(levels, _tf_geometric_matrix(op, arg, h, w))
  index = jnp.maximum(op - _NUM_GEOMETRIC + 1, 0)
  return jax.lax.switch(index, _TF_VALUE_OPS, warped,
                        jnp.asarray(arg, jnp.float32), key)

