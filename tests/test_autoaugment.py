"""AutoAugment (input_pipeline/autoaugment.py) against independent references.

'pytorch_auto_augment' (TCL): value ops against PIL's ImageOps/ImageEnhance,
warps against scipy.ndimage on the port's uint8 images, the CIFAR-10 policy
as the port writes it. 'tf_model_garden' (SupCon, 'v0'): against numpy
written from TF Model Garden's augment.py, PIL where it equals PIL, and the
TF ops that file calls.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageOps
from scipy import ndimage

from input_pipeline import augment
from input_pipeline import autoaugment as aa

# Per-function XLA options: the augmentation graphs compile faster, results
# are the same (as tests/test_pipeline.py).
_FAST_COMPILE = {'xla_backend_optimization_level': 0,
                 'xla_llvm_disable_expensive_passes': True}

# One compilation serves every op and magnitude (both are traced).
_op = jax.jit(aa.autoaugment_op, compiler_options=_FAST_COMPILE)


def _image(seed=0, shape=(32, 40, 3), lo=0, hi=255):
  rng = np.random.default_rng(seed)
  return rng.integers(lo, hi + 1, shape, dtype=np.uint8)


def _ours(image_u8, name, magnitude):
  """Our op on the uint8 image, on the 0-255 scale (float64)."""
  x = jnp.asarray(image_u8, jnp.float32) / 255.
  out = _op(x, aa.AUTOAUGMENT_OPS.index(name), jnp.float32(magnitude))
  return np.asarray(out, np.float64) * 255.


def _pil(image_u8):
  return Image.fromarray(image_u8[..., 0] if image_u8.shape[-1] == 1
                         else image_u8)


def _levels(pil_image, channels):
  out = np.asarray(pil_image, np.float64)
  return out[..., None] if channels == 1 else out


# Tolerances, in 8-bit levels. PIL's ImageEnhance blends in float and
# truncates to uint8, and builds its degenerate image (grayscale, mean or
# smoothed image) in uint8 first; ours keeps floats. Truncation costs < 1
# level, the rounded degenerate image < 0.5 level times |1 - factor| <= 0.9:
# together < 2 (measured: 1.35). Autocontrast and brightness only truncate
# (< 1). Posterize, solarize, equalize and invert are exact on 8-bit input.
_ENHANCE = {'Brightness': ImageEnhance.Brightness, 'Color': ImageEnhance.Color,
            'Contrast': ImageEnhance.Contrast,
            'Sharpness': ImageEnhance.Sharpness}
_ENHANCE_TOLERANCE = {'Brightness': 1., 'Color': 2., 'Contrast': 2.,
                      'Sharpness': 2.}
_EXACT = 1e-3
_ENHANCE_IMAGES = {'rgb': (0, (32, 40, 3), 0, 255), 'gray': (1, (24, 24, 1),
                                                            0, 255),
                   'mid': (2, (32, 40, 3), 40, 180)}


@pytest.mark.parametrize('image', sorted(_ENHANCE_IMAGES))
@pytest.mark.parametrize('name', sorted(_ENHANCE))
@pytest.mark.parametrize('magnitude', [0.9, 0.5, -0.3, -0.9, 0.])
def test_enhance_ops_match_pil(name, magnitude, image):
  image = _image(*_ENHANCE_IMAGES[image])
  ref = _levels(_ENHANCE[name](_pil(image)).enhance(1. + magnitude),
                image.shape[-1])
  diff = np.abs(_ours(image, name, magnitude) - ref)
  assert diff.max() <= _ENHANCE_TOLERANCE[name], (name, magnitude, diff.max())


@pytest.mark.parametrize('bits', [8, 7, 6, 5, 4])
def test_posterize_matches_pil(bits):
  image = _image(3)
  ref = np.asarray(ImageOps.posterize(_pil(image), bits), np.float64)
  np.testing.assert_allclose(_ours(image, 'Posterize', bits), ref,
                             atol=_EXACT)


@pytest.mark.parametrize('threshold', aa.autoaugment_grids(8, 8)[
    aa.AUTOAUGMENT_OPS.index('Solarize')].tolist())
def test_solarize_matches_pil_at_every_bin_edge(threshold):
  image = _image(4)
  ref = np.asarray(ImageOps.solarize(_pil(image), threshold), np.float64)
  np.testing.assert_allclose(_ours(image, 'Solarize', threshold), ref,
                             atol=_EXACT)


@pytest.mark.parametrize('name,pil_op,atol', [
    ('AutoContrast', ImageOps.autocontrast, 1.),
    ('Equalize', ImageOps.equalize, _EXACT),
    ('Invert', ImageOps.invert, _EXACT)])
@pytest.mark.parametrize('shape', [(32, 40, 3), (20, 20, 1)])
@pytest.mark.parametrize('lo,hi', [(0, 255), (30, 200), (90, 91), (77, 77)])
def test_autocontrast_equalize_invert_match_pil(name, pil_op, atol, shape, lo,
                                                hi):
  image = _image(5, shape, lo=lo, hi=hi)
  ref = _levels(pil_op(_pil(image)), shape[-1])
  np.testing.assert_allclose(_ours(image, name, 0.), ref, atol=atol)


def test_equalize_on_a_skewed_histogram():
  # Most pixels dark, few bright: a lookup table far from the identity.
  rng = np.random.default_rng(7)
  image = np.clip(rng.exponential(20., (32, 32, 3)), 0, 255).astype(np.uint8)
  out = _ours(image, 'Equalize', 0.)
  np.testing.assert_allclose(
      out, np.asarray(ImageOps.equalize(_pil(image)), np.float64), atol=_EXACT)
  assert np.abs(out - image).max() > 50        # It did change the image.


# The cubic-spline warp of the 'pytorch_auto_augment' ops against scipy,
# on the 0-255 scale in float64. Ours runs in float32: the prefiltered
# coefficients reach about 3 x 255 and 16 of them are summed (rounding
# ~1e-4 levels), and a sample point carries ~1e-5 px of rounding at 224 px
# times the spline's slope (hundreds of levels per px on noise); measured
# at most 0.001 levels at 32 px and 0.007 at 224 px, so 0.02. An order-1
# (bilinear) warp is off by tens of levels on these noise images
# (asserted).
_CUBIC_ATOL = 0.02
# A point within this distance (px) of the edge of [0, n - 1], but not on
# it, may fall on either side of it in float32 (the spline's edge value
# against the fill 0); such pixels are left out of the comparisons that
# need exact points. A point exactly on an edge (a whole-pixel shift, the
# axis a shear keeps) is exact in float32 too and stays in.
_EDGE_MARGIN = 1e-3


@pytest.mark.parametrize('n', [1, 2, 3, 4, 7, 32, 40, 224])
def test_cubic_spline_prefilter_matches_scipy(n):
  # Our closed form against scipy's recursive filter of the unit vectors;
  # scipy prefilters with the mirror boundary for mode 'constant' too.
  ours = aa.cubic_spline_prefilter(n)
  for mode in ('constant', 'mirror'):
    ref = ndimage.spline_filter1d(np.eye(n), order=3, axis=0, mode=mode)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)
  # The coefficients interpolate: beta3 at the integers is (1, 4, 1) / 6.
  x = np.random.default_rng(n).normal(size=n)
  c = ours @ x
  mirrored = lambda i: c[0 * i if n == 1 else
                         (n - 1) - np.abs((n - 1) - np.abs(i))]
  i = np.arange(n)
  np.testing.assert_allclose(
      (mirrored(i - 1) + 4 * c + mirrored(i + 1)) / 6, x, atol=1e-12)


def _scipy_cubic(image, matrix):
  """scipy.ndimage's default warp (order 3, prefilter, mode 'constant',
  cval 0) of each channel of `image` [H, W, C] (float64) by the [2, 3]
  matrix on (row, column)."""
  m = np.asarray(matrix, np.float64)
  return np.stack([ndimage.affine_transform(
      image[..., c], m[:, :2], m[:, 2], order=3, mode='constant', cval=0.,
      prefilter=True) for c in range(image.shape[-1])], axis=-1)


def _away_from_edges(matrix, shape):
  """[H, W] bool: the sample point of each output pixel (float64) is on
  or farther than `_EDGE_MARGIN` from the edges of the input's
  [0, H - 1] x [0, W - 1]."""
  h, w = shape[:2]
  m = np.asarray(matrix, np.float64)
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
  point = [m[i, 0] * rows + m[i, 1] * cols + m[i, 2] for i in (0, 1)]
  clear = lambda d: (d == 0) | (np.abs(d) > _EDGE_MARGIN)
  return (clear(point[0]) & clear(point[0] - (h - 1)) & clear(point[1])
          & clear(point[1] - (w - 1)))


def _linear_map(rotate_degrees=0., shear=0.):
  """[2, 2] on (row, column): a rotation after a shear of the rows."""
  t = np.deg2rad(rotate_degrees)
  return (np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
          @ np.array([[1., shear], [0., 1.]]))


# Inverse maps on (row, column), as (linear [2, 2], shift [2], about the
# centre (H / 2 + 0.5, W / 2 + 0.5) as the port warps, or the origin):
# shears, fractional and whole translations (points beyond every edge),
# a rotation and a mix.
_CUBIC_MAPS = {
    'shear_rows': (_linear_map(shear=0.27), [-4.4, 0.], False),
    'shear_columns': (_linear_map(shear=0.3).T, [0., -5.], False),
    'translate': (np.eye(2), [-3.7, 6.2], False),
    'translate_whole': (np.eye(2), [9., -11.], False),
    'rotate': (_linear_map(23.), [0., 0.], True),
    'rotate_shear_shift': (_linear_map(-7., -0.13), [2.5, -1.25], True),
}


def _cubic_matrix(name, shape):
  """The [2, 3] float32 matrix of `_CUBIC_MAPS`[name] for an image of
  `shape` (float32, the precision ours takes it in; scipy gets the same
  values in float64)."""
  linear, shift, centred = _CUBIC_MAPS[name]
  centre = (np.array([shape[0] / 2 + 0.5, shape[1] / 2 + 0.5]) if centred
            else np.zeros(2))
  return np.c_[linear, centre - linear @ centre + shift].astype(np.float32)


# With XLA's default options, as training compiles it: the fusions that
# split a sample point's rounding (below) form only with them.
_cubic = jax.jit(aa.affine_cubic_spline)


@pytest.mark.parametrize('shape', [(32, 32, 3), (32, 40, 3), (224, 224, 1)])
@pytest.mark.parametrize('name', sorted(_CUBIC_MAPS))
def test_cubic_warp_matches_scipy(shape, name):
  image = _image(14, shape).astype(np.float64)
  matrix = _cubic_matrix(name, shape)
  ref = _scipy_cubic(image, matrix)
  out = np.asarray(_cubic(jnp.asarray(image, jnp.float32),
                          jnp.asarray(matrix)), np.float64)
  keep = _away_from_edges(matrix, shape)
  assert keep.mean() > 0.99
  np.testing.assert_allclose(out[keep], ref[keep], rtol=0, atol=_CUBIC_ATOL)
  if name != 'translate_whole':   # Off the pixel centres, where orders differ.
    # The tolerance tells the orders apart: scipy's order 1 is far off.
    linear = np.stack([ndimage.affine_transform(
        image[..., c], matrix[:, :2].astype(np.float64),
        matrix[:, 2].astype(np.float64), order=1)
                       for c in range(shape[-1])], axis=-1)
    assert np.abs(linear - ref)[keep].max() > 1000 * _CUBIC_ATOL
    assert np.any(ref < 0) and np.any(ref > 255)   # The spline overshoots.
  outside = keep & ~np.any(ref, axis=-1)
  assert outside.any() and np.all(out[outside] == 0)   # Filled 0.


def test_cubic_warp_weights_taps_by_their_own_distance():
  # This float32 matrix samples output (73, 205) of a 224 x 224 image at
  # column 186 - 1.2e-5, which XLA (default options, CPU) computes as 186
  # in one fusion and below it in another: weights from the fraction
  # s - floor(s) of one with the taps floor(s) - 1 ... of the other were
  # off by 31 levels (measured with the first version of the warp).
  matrix = np.array([[0.9928234219551086, 0.2997923791408539,
                      1.6538728475570679],
                     [-0.11958970874547958, 0.9711172580718994,
                      -4.349001407623291]], np.float32)
  image = _image(15, (224, 224, 3)).astype(np.float64)
  ref = _scipy_cubic(image, matrix)
  out = np.asarray(_cubic(jnp.asarray(image, jnp.float32),
                          jnp.asarray(matrix)), np.float64)
  np.testing.assert_allclose(out[73, 205], ref[73, 205], atol=_CUBIC_ATOL)
  keep = _away_from_edges(matrix, image.shape)
  np.testing.assert_allclose(out[keep], ref[keep], rtol=0, atol=_CUBIC_ATOL)


def _port_op(image_u8, name, m):
  """The port's geometric op at magnitude `m`, as that code sets it up: a
  matrix on (row, column) about (H / 2 + 0.5, W / 2 + 0.5), then
  scipy.ndimage's affine_transform with its defaults (order 3, prefilter,
  mode 'constant', cval 0) on each channel of the uint8 image, which
  writes uint8 (scipy rounds half up and clips).

  Returns:
    (the uint8 result [H, W, C], the same warp of the image in float64
    before that conversion, the [2, 3] matrix on (row, column)).
  """
  h, w = image_u8.shape[:2]
  theta = np.deg2rad(m)
  linear = {
      'ShearX': [[1, m, 0], [0, 1, 0], [0, 0, 1]],
      'ShearY': [[1, 0, 0], [m, 1, 0], [0, 0, 1]],
      'TranslateX': [[1, 0, 0], [0, 1, m], [0, 0, 1]],
      'TranslateY': [[1, 0, m], [0, 1, 0], [0, 0, 1]],
      'Rotate': [[np.cos(theta), -np.sin(theta), 0],
                 [np.sin(theta), np.cos(theta), 0], [0, 0, 1]]}[name]
  oy, ox = h / 2 + 0.5, w / 2 + 0.5
  matrix = (np.array([[1, 0, oy], [0, 1, ox], [0, 0, 1]]) @ np.array(linear)
            @ np.array([[1, 0, -oy], [0, 1, -ox], [0, 0, 1]]))
  channels = lambda x: np.stack([ndimage.affine_transform(
      x[..., c], matrix[:2, :2], matrix[:2, 2])
                                 for c in range(x.shape[-1])], axis=-1)
  return (channels(image_u8), channels(image_u8.astype(np.float64)),
          matrix[:2])


@pytest.mark.parametrize('shape', [(32, 32, 3), (32, 40, 3)])
@pytest.mark.parametrize('name,magnitude', [
    ('ShearX', 0.27), ('ShearX', -0.05), ('ShearY', -0.13), ('ShearY', 0.3),
    ('TranslateX', 7.3), ('TranslateX', -14.), ('TranslateY', -11.6),
    ('Rotate', 23.), ('Rotate', -4.)])
def test_port_geometric_ops_match_the_port(shape, name, magnitude):
  # The port's uint8 output level for level, but where scipy's float64
  # warp is within 0.01 of a half level (float32 may round it the other
  # way: at most 1 level; about 2% of the pixels) or the point within
  # float32 rounding of an edge.
  image = _image(13, shape)
  m = float(np.float32(magnitude))            # The magnitude ours gets.
  port_u8, port_float, matrix = _port_op(image, name, m)
  assert port_u8.dtype == np.uint8
  out = _ours(image, name, m)
  diff = np.abs(out - port_u8)
  tie = np.abs(port_float - np.floor(port_float) - 0.5) < 0.01
  exact = ~tie & _away_from_edges(matrix, shape)[..., None]
  assert exact.mean() > 0.95
  assert np.all(diff[exact] < _EXACT), (name, np.argwhere(diff > _EXACT))
  assert np.all(diff[tie] <= 1 + _EXACT)
  # Rounded to levels and clipped where the spline overshoots [0, 255].
  np.testing.assert_allclose(out, np.round(out), atol=_EXACT)
  if name != 'TranslateX' or m != round(m):    # Between pixel centres.
    assert np.any(port_float < -0.5) or np.any(port_float > 255.5)
  assert np.abs(out - image).max() > 50


def test_port_value_ops_pass_the_float_image_unrounded():
  # Only the warps round to levels; a value op sees the image as it is.
  image = jnp.asarray(np.random.default_rng(16).uniform(size=(32, 32, 3)),
                      jnp.float32)
  x = np.asarray(image, np.float64)
  for name, m, want in (('Brightness', 0.37, np.clip(1.37 * x, 0., 1.)),
                        ('Invert', 0., 1. - x)):
    op = aa.AUTOAUGMENT_OPS.index(name)
    port = np.asarray(_op(image, op, jnp.float32(m)))
    np.testing.assert_allclose(port, want, atol=1e-6)
    assert np.any(np.abs(port * 255. - np.round(port * 255.)) > 0.1)


def test_port_grids_are_the_ports():
  # 4uiiurz1/pytorch-auto-augment: np.linspace(lo, hi, 11) per op.
  grids = aa.autoaugment_grids(32, 64)
  row = lambda name: grids[aa.AUTOAUGMENT_OPS.index(name)]
  edges = lambda lo, hi: np.linspace(lo, hi, 11)
  np.testing.assert_allclose(row('ShearY'), edges(-0.3, 0.3), atol=1e-6)
  np.testing.assert_allclose(row('TranslateX'),
                             edges(-150 / 331, 150 / 331) * 64, rtol=1e-6)
  np.testing.assert_allclose(row('TranslateY'),
                             edges(-150 / 331, 150 / 331) * 32, rtol=1e-6)
  np.testing.assert_allclose(row('Rotate'), edges(-30, 30), atol=1e-5)
  np.testing.assert_allclose(1 + row('Color'), edges(0.1, 1.9), atol=1e-6)
  np.testing.assert_allclose(row('Posterize'), edges(4, 8), atol=1e-6)
  np.testing.assert_allclose(row('Solarize'), edges(0, 256), atol=1e-4)


def test_port_magnitudes_are_uniform_within_their_bins():
  n = 20_000
  sub, ops, mags, apply = _draws('cifar10', n, impl='pytorch_auto_augment')
  grids = aa.autoaugment_grids(32, 32)
  names = aa.AUTOAUGMENT_OPS
  counts = np.bincount(sub, minlength=25)
  assert np.sum((counts - n / 25) ** 2 / (n / 25)) < 51.18
  fractions = []
  for s, sub_policy in enumerate(aa.AUTOAUGMENT_POLICIES['cifar10']):
    rows = sub == s
    for slot, (name, p, b) in enumerate(sub_policy):
      rate = apply[rows, slot].mean()
      assert abs(rate - p) <= 5 * np.sqrt(p * (1 - p) / rows.sum()) + 1e-9
      if b is None:
        continue
      lo, hi = grids[names.index(name), b], grids[names.index(name), b + 1]
      m = mags[rows, slot]
      if name == 'Posterize':        # round(U(lo, hi)) bits.
        assert set(np.unique(m)) <= set(range(int(np.floor(lo)),
                                              int(np.ceil(hi)) + 1))
        continue
      assert np.all((m >= lo - 1e-5) & (m <= hi + 1e-5)), (name, b)
      fractions.append((m - lo) / (hi - lo))
  # Uniform within the bin: mean 1/2, each quarter of the bin ~1/4.
  fractions = np.concatenate(fractions)
  assert abs(fractions.mean() - 0.5) < 0.01
  quarters = np.bincount(np.minimum((fractions * 4).astype(int), 3),
                         minlength=4) / fractions.size
  np.testing.assert_allclose(quarters, 0.25, atol=0.01)


# The CIFAR-10 policy as the TCL code's port writes it ("op probability bin"
# twice per sub-policy, a bin even for the magnitude-free ops).
_CIFAR10 = """
Invert 0.1 7 Contrast 0.2 6 | Rotate 0.7 2 TranslateX 0.3 9
Sharpness 0.8 1 Sharpness 0.9 3 | ShearY 0.5 8 TranslateY 0.7 9
AutoContrast 0.5 8 Equalize 0.9 2 | ShearY 0.2 7 Posterize 0.3 7
Color 0.4 3 Brightness 0.6 7 | Sharpness 0.3 9 Brightness 0.7 9
Equalize 0.6 5 Equalize 0.5 1 | Contrast 0.6 7 Sharpness 0.6 5
Color 0.7 7 TranslateX 0.5 8 | Equalize 0.3 7 AutoContrast 0.4 8
TranslateY 0.4 3 Sharpness 0.2 6 | Brightness 0.9 6 Color 0.2 8
Solarize 0.5 2 Invert 0.0 3 | Equalize 0.2 0 AutoContrast 0.6 0
Equalize 0.2 8 Equalize 0.6 4 | Color 0.9 9 Equalize 0.6 6
AutoContrast 0.8 4 Solarize 0.2 8 | Brightness 0.1 3 Color 0.7 0
Solarize 0.4 5 AutoContrast 0.9 3 | TranslateY 0.9 9 TranslateY 0.7 9
AutoContrast 0.9 2 Solarize 0.8 3 | Equalize 0.8 8 Invert 0.1 3
TranslateY 0.7 9 AutoContrast 0.9 1
"""
_NO_MAGNITUDE = ('AutoContrast', 'Equalize', 'Invert')


def _parse(text):
  subs = []
  for part in text.replace('\n', ' | ').split('|'):
    words = part.split()
    if words:
      assert len(words) == 6, part
      subs.append(tuple(
          (words[i], float(words[i + 1]),
           None if words[i] in _NO_MAGNITUDE else int(words[i + 2]))
          for i in (0, 3)))
  return tuple(subs)


def test_cifar10_is_the_ports_policy():
  published = _parse(_CIFAR10)
  assert len(published) == 25
  assert aa.AUTOAUGMENT_POLICIES['cifar10'] == published


def _draws(policy, n, seed=0, impl='pytorch_auto_augment'):
  keys = jax.random.split(jax.random.key(seed), n)

  one = lambda key: aa.autoaugment_draw(key, 32, 32, policy, impl)
  return jax.tree.map(np.asarray, jax.jit(jax.vmap(one))(keys))


def test_v0_draws_are_uniform_and_keep_probabilities_arguments_and_signs():
  n = 25_000
  sub, ops, mags, apply = _draws('v0', n, impl='tf_model_garden')
  # Uniform choice: chi-square with 24 degrees of freedom; 51.18 is its
  # 0.999 quantile.
  counts = np.bincount(sub, minlength=25)
  assert np.sum((counts - n / 25) ** 2 / (n / 25)) < 51.18, counts
  args = aa.tf_autoaugment_args()
  signed = ('ShearX', 'ShearY', 'TranslateX', 'TranslateY', 'Rotate')
  signs = []
  for s, sub_policy in enumerate(aa.AUTOAUGMENT_POLICIES['v0']):
    rows = sub == s
    for slot, (name, p, level) in enumerate(sub_policy):
      assert np.all(ops[rows, slot] == _TF_NAMES.index(name))
      # Each op applies with its probability: within 5 binomial sigma.
      rate, k = apply[rows, slot].mean(), rows.sum()
      assert abs(rate - p) <= 5 * np.sqrt(p * (1 - p) / k) + 1e-9, (s, slot)
      m = mags[rows, slot]
      np.testing.assert_array_equal(np.abs(m),
                                    args[_TF_NAMES.index(name), level])
      if name in signed and level:   # Only the geometric ops are signed.
        signs.append(m < 0)
      else:
        assert np.all(m >= 0), name
  negative = np.concatenate(signs)
  assert abs(negative.mean() - 0.5) <= 5 * np.sqrt(0.25 / negative.size)


def test_autoaugment_applies_the_drawn_ops_in_order():
  impl = 'pytorch_auto_augment'
  image = jnp.asarray(_image(10), jnp.float32) / 255.
  run = jax.jit(functools.partial(aa.autoaugment, policy='cifar10',
                                  impl=impl),
                compiler_options=_FAST_COMPILE)
  draw = jax.jit(lambda k: aa.autoaugment_draw(k, 32, 40, 'cifar10')[1:])
  changed = 0
  for seed in range(12):
    key = jax.random.key(seed)
    ops, mags, apply = draw(key)
    expected = image
    for slot in range(2):
      if apply[slot]:
        expected = _op(expected, ops[slot], mags[slot])
    out = run(key, image)
    np.testing.assert_allclose(out, expected, atol=1e-6)
    changed += bool(jnp.any(out != image))
  assert changed >= 3


def test_a_batch_under_jit_and_vmap_is_deterministic_per_key():
  images = jnp.asarray(_image(11, (8, 32, 32, 3)), jnp.float32) / 255.
  keys = jax.random.split(jax.random.key(3), 8)
  fn = jax.jit(jax.vmap(functools.partial(aa.autoaugment,
                                          policy='cifar10')),
               compiler_options=_FAST_COMPILE)
  a, b = fn(keys, images), fn(keys, images)
  np.testing.assert_array_equal(a, b)
  one = jax.jit(functools.partial(aa.autoaugment, policy='cifar10'),
                compiler_options=_FAST_COMPILE)
  for i in (0, 5):     # vmapped == one image at a time.
    np.testing.assert_allclose(a[i], one(keys[i], images[i]), atol=1e-6)
  other = fn(jax.random.split(jax.random.key(4), 8), images)
  assert np.any(np.asarray(a) != np.asarray(other))
  assert float(a.min()) >= 0. and float(a.max()) <= 1.


def test_unknown_policy_is_rejected():
  with pytest.raises(ValueError, match='autoaugment'):
    augment.build_views('tcl', 2, ({'autoaugment': 'svhn2'},))
  with pytest.raises(ValueError, match='autoaugment_impl'):
    augment.build_views('tcl', 2, ({'autoaugment_impl': 'pil'},))
  with pytest.raises(ValueError, match='unknown AutoAugment policy'):
    aa.autoaugment(jax.random.key(0), jnp.zeros((8, 8, 3)),
                        policy='cifar100')


def test_tcl_cifar10_config_augments_32px_batches():
  from configs.papers import tcl
  config = tcl.get_config('cifar10')
  views = augment.build_views(config.augment.preset, config.augment.num_views,
                              config.augment.overrides)
  assert len(views) == 2
  for view in views:
    assert view.autoaugment == 'cifar10' and view.pad_crop == 4
    assert view.autoaugment_impl == 'pytorch_auto_augment'
    assert view.crop_scale is None and view.flip_p == 0.5
    assert not any(view.jitter_amounts()) and not view.grayscale_p
  images = jnp.asarray(_image(12, (6, 32, 32, 3)))
  out = jax.jit(lambda k, x: augment.augment_batch(k, x, views),
                compiler_options=_FAST_COMPILE)(jax.random.key(0), images)
  assert out.shape == (6, 2, 32, 32, 3) and out.dtype == jnp.float32
  assert bool(jnp.all(jnp.isfinite(out)))
  assert float(out.min()) >= 0. and float(out.max()) <= 1.
  assert np.any(np.asarray(out[:, 0]) != np.asarray(out[:, 1]))


# --- TensorFlow Model Garden's AutoAugment ('v0', impl 'tf_model_garden') ---
#
# The references: numpy written from the semantics of tensorflow/models
# official/legacy/image_classification/augment.py (formerly official/vision/
# image_classification/augment.py), PIL where that file equals PIL, and the
# TF ops that file calls (tf.image.rgb_to_grayscale, tf.bitwise shifts,
# tf.nn.depthwise_conv2d, the ImageProjectiveTransform kernel that Keras'
# `transform` runs), composed here as that file composes them.

_tf_op = jax.jit(aa.tf_autoaugment_op, compiler_options=_FAST_COMPILE)
_TF_NAMES = aa.TF_AUTOAUGMENT_OPS


@functools.cache
def _tf():
  import os
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import tensorflow as tf
  return tf


def _tf_ours(image_u8, name, arg, key=jax.random.key(0)):
  """Our Model Garden op on the uint8 image, as uint8 levels (int64)."""
  out = _tf_op(jnp.asarray(image_u8, jnp.float32), _TF_NAMES.index(name),
               jnp.float32(arg), key)
  out = np.asarray(out)
  assert np.all(out == np.round(out)), name          # Whole levels.
  return out.astype(np.int64)


def _np_blend(degenerate, image, factor):
  """The file's blend(degenerate, image, factor): float32 arithmetic, one
  rounding per operation, clipped and truncated to uint8."""
  d = np.asarray(degenerate, np.float32)
  x = image.astype(np.float32)
  scaled = np.float32(factor) * (x - d)
  return np.floor(np.clip(d + scaled, 0., 255.)).astype(np.int64)


def _np_gray(image):
  """rgb_to_grayscale of uint8: levels / 255, weighted, x 255.5 truncated."""
  flt = image.astype(np.float32) * np.float32(1. / 255.)
  w = np.float32([0.2989, 0.5870, 0.1140])
  gray = flt[..., 0] * w[0] + flt[..., 1] * w[1] + flt[..., 2] * w[2]
  return np.floor(gray * np.float32(255.5)).astype(np.int64)


def _np_smooth(image):
  """The depthwise 3x3 SMOOTH convolution of the file's sharpness, VALID,
  summed tap by tap in row-major order with one rounding per tap (an FMA,
  as TF's CPU kernel: float64 then float32), clipped, truncated; the
  border keeps its levels."""
  x = image.astype(np.float32)
  h, w = x.shape[:2]
  w1, w5 = np.float32(1.) / np.float32(13.), np.float32(5.) / np.float32(13.)
  acc = np.zeros((h - 2, w - 2, x.shape[2]), np.float32)
  for dy in range(3):
    for dx in range(3):
      wt = w5 if (dy, dx) == (1, 1) else w1
      acc = (acc.astype(np.float64) + np.float64(wt)
             * x[dy:h - 2 + dy, dx:w - 2 + dx]).astype(np.float32)
  out = image.astype(np.int64)
  out[1:-1, 1:-1] = np.floor(np.clip(acc, 0., 255.))
  return out


def _np_autocontrast(image):
  out = image.astype(np.int64)
  for c in range(image.shape[-1]):
    ch = image[..., c].astype(np.float32)
    lo, hi = ch.min(), ch.max()
    if hi > lo:
      scale = np.float32(255.) / (hi - lo)
      offset = -lo * scale
      out[..., c] = np.floor(np.clip(ch * scale + offset, 0., 255.))
  return out


def _np_equalize(image):
  """The file's lookup table: cumsum + step // 2 over step, shifted one bin
  with 0 first; step = (pixels - count of the top occupied level) // 255."""
  out = image.astype(np.int64)
  for c in range(image.shape[-1]):
    hist = np.bincount(image[..., c].ravel(), minlength=256)
    step = (hist.sum() - hist[np.nonzero(hist)[0][-1]]) // 255
    if step:
      lut = np.concatenate([[0], (np.cumsum(hist) + step // 2) // step])[:256]
      out[..., c] = np.clip(lut, 0, 255)[image[..., c]]
  return out


def _np_value_op(image, name, arg):
  """Numpy references of the Model Garden's value ops."""
  x = image.astype(np.int64)
  h, w = image.shape[:2]
  if name == 'Brightness':
    return _np_blend(0., image, arg)
  if name == 'Color':
    return _np_blend(_np_gray(image)[..., None], image, arg)
  if name == 'Contrast':   # The histogram's sum / 256: H W / 256.
    return _np_blend(np.floor(min(h * w / 256., 255.)), image, arg)
  if name == 'Sharpness':
    return _np_blend(_np_smooth(image), image, arg)
  if name == 'Posterize':  # Shift amounts clamped to 7, as TF's CPU kernel.
    shift = min(8 - int(arg), 7)
    return (x >> shift) << shift
  if name == 'Solarize':   # The int threshold converted to uint8.
    return np.where(image < np.uint8(int(arg) % 256), x, 255 - x)
  if name == 'SolarizeAdd':
    return np.where(image < 128, np.clip(x + int(arg), 0, 255), x)
  if name == 'AutoContrast':
    return _np_autocontrast(image)
  if name == 'Equalize':
    return _np_equalize(image)
  if name == 'Invert':
    return 255 - x
  raise ValueError(name)


def _tf_value_op(image, name, arg):
  """The same ops with the TF ops the file calls."""
  tf = _tf()
  x = tf.constant(image)

  def blend(degenerate, factor):
    d = tf.cast(degenerate, tf.float32)
    t = d + factor * (tf.cast(x, tf.float32) - d)
    return tf.cast(tf.clip_by_value(t, 0., 255.), tf.uint8)

  if name == 'Brightness':
    out = blend(tf.zeros_like(x), arg)
  elif name == 'Color':
    out = blend(tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(x)), arg)
  elif name == 'Contrast':
    gray = tf.cast(tf.image.rgb_to_grayscale(x), tf.int32)
    hist = tf.histogram_fixed_width(gray, [0, 255], nbins=256)
    mean = tf.reduce_sum(tf.cast(hist, tf.float32)) / 256.
    const = tf.cast(tf.clip_by_value(tf.ones_like(gray, tf.float32) * mean,
                                     0., 255.), tf.uint8)
    out = blend(tf.image.grayscale_to_rgb(const), arg)
  elif name == 'Sharpness':
    kernel = tf.tile(tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]],
                                 tf.float32, shape=[3, 3, 1, 1]) / 13.,
                     [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(tf.cast(x, tf.float32)[None], kernel,
                                    [1, 1, 1, 1], padding='VALID')[0]
    smooth = tf.cast(tf.clip_by_value(smooth, 0., 255.), tf.uint8)
    inside = tf.pad(tf.ones_like(smooth), [[1, 1], [1, 1], [0, 0]])
    padded = tf.pad(smooth, [[1, 1], [1, 1], [0, 0]])
    out = blend(tf.where(tf.equal(inside, 1), padded, x), arg)
  elif name == 'Posterize':
    shift = 8 - int(arg)
    out = tf.bitwise.left_shift(tf.bitwise.right_shift(x, shift), shift)
  elif name == 'Solarize':
    out = tf.where(x < int(arg), x, 255 - x)
  elif name == 'SolarizeAdd':
    added = tf.cast(tf.clip_by_value(tf.cast(x, tf.int64) + int(arg), 0, 255),
                    tf.uint8)
    out = tf.where(x < 128, added, x)
  elif name == 'AutoContrast':
    chans = []
    for c in range(3):
      ch = x[..., c]
      lo = tf.cast(tf.reduce_min(ch), tf.float32)
      hi = tf.cast(tf.reduce_max(ch), tf.float32)
      scale = 255. / (hi - lo)
      offset = -lo * scale
      scaled = tf.cast(tf.clip_by_value(
          tf.cast(ch, tf.float32) * scale + offset, 0., 255.), tf.uint8)
      chans.append(scaled if bool(hi > lo) else ch)
    out = tf.stack(chans, 2)
  elif name == 'Equalize':
    chans = []
    for c in range(3):
      ch = tf.cast(x[..., c], tf.int32)
      hist = tf.histogram_fixed_width(ch, [0, 255], nbins=256)
      nonzero = tf.reshape(tf.gather(hist, tf.where(hist != 0)), [-1])
      step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
      if int(step) == 0:
        chans.append(ch)
        continue
      lut = (tf.cumsum(hist) + step // 2) // step
      lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], 0), 0, 255)
      chans.append(tf.gather(lut, ch))
    out = tf.stack(chans, 2)
  elif name == 'Invert':
    out = 255 - x
  else:
    raise ValueError(name)
  return out.numpy().astype(np.int64)


# (op, argument): the arguments of the v0 policy's levels (tf_autoaugment_args:
# posterize 2 bits at level 6, 0 at level 2; solarize 76, 51, 204, 102 and
# 256 at levels 3, 2, 8, 4, 10; SolarizeAdd 33 and 77 at levels 3 and 7;
# Color 1.72, 0.28 and 0.1 at levels 9, 1 and 0), and the ops v0 leaves out.
_TF_VALUE_CASES = (
    [('Color', f) for f in (1.72, 0.28, 0.1, 1.18)]
    + [('Brightness', f) for f in (1.9, 0.46, 1.0)]
    + [('Contrast', f) for f in (1.54, 0.1)]
    + [('Sharpness', f) for f in (1.9, 0.28)]
    + [('Posterize', b) for b in (0, 1, 2, 4)]
    + [('Solarize', t) for t in (76, 51, 204, 102, 256, 0)]
    + [('SolarizeAdd', a) for a in (33, 77, 110, 0)]
    + [('AutoContrast', 0), ('Equalize', 0), ('Invert', 0)])
# Float32 rounding in a different order: TF's grayscale is a matrix product
# and its depthwise convolution chains fused multiply-adds tap by tap (which
# _np_smooth reproduces exactly; XLA fuses some of ours); the degenerate
# image may land one level off (measured: Color none of these values and 13
# grays in 5.6 million colours, Sharpness up to 16 values of 3840).
# (Largest difference, fraction of values that differ) allowed.
_TF_ROUNDING = {'Color': (1, 0.005), 'Sharpness': (1, 0.01)}


_TF_IMAGES = {'full': (20, (32, 40, 3), 0, 255), 'mid': (21, (32, 40, 3), 40,
                                                         180),
              'narrow': (22, (32, 40, 3), 90, 92),
              'flat': (0, (32, 40, 3), 77, 77)}


@pytest.mark.parametrize('image', sorted(_TF_IMAGES))
@pytest.mark.parametrize('name,arg', _TF_VALUE_CASES)
def test_tf_value_ops_match_numpy_and_tf(name, arg, image):
  image = _image(*_TF_IMAGES[image])
  out = _tf_ours(image, name, arg)
  largest, fraction = _TF_ROUNDING.get(name, (0, 0.))
  for ref in (_np_value_op(image, name, arg), _tf_value_op(image, name, arg)):
    diff = np.abs(out - ref)
    assert diff.max() <= largest, (name, arg, diff.max())
    assert np.mean(diff > 0) <= fraction, (name, arg, np.mean(diff > 0))


def test_tf_ops_where_tf_departs_from_pil():
  image = _image(23)
  x = image.astype(np.int64)
  # Solarize at level 10: the threshold 256 becomes 0 and inverts all.
  np.testing.assert_array_equal(_tf_ours(image, 'Solarize', 256), 255 - x)
  # Posterize to 0 bits keeps the top bit (the shift clamps to 7).
  np.testing.assert_array_equal(_tf_ours(image, 'Posterize', 0), x & 128)
  # Contrast blends with H W / 256 = 5 at 32 x 40, not the mean level.
  np.testing.assert_array_equal(_tf_ours(image, 'Contrast', 0.1),
                                np.floor(5 + np.float32(0.1) * (x - 5.)))
  # Equalize is PIL's.
  np.testing.assert_array_equal(
      _tf_ours(image, 'Equalize', 0),
      np.asarray(ImageOps.equalize(_pil(image)), np.int64))


@pytest.mark.parametrize('name,arg', [
    ('Brightness', 1.54), ('Sharpness', 0.28), ('Posterize', 2),
    ('Solarize', 102), ('SolarizeAdd', 77), ('AutoContrast', 0),
    ('Equalize', 0), ('Invert', 0)])
def test_tf_ops_on_one_channel(name, arg):
  image = _image(24, (24, 24, 1))
  np.testing.assert_array_equal(_tf_ours(image, name, arg),
                                _np_value_op(image, name, arg), name)


def test_tf_color_on_one_channel_is_the_identity():
  image = _image(24, (24, 24, 1))
  np.testing.assert_array_equal(_tf_ours(image, 'Color', 0.1), image)


def _np_reflect(coord, n):
  """TF's FILL_REFLECT map (image_ops.h MapCoordinate), clamped to [0, n-1]."""
  out = np.array(coord, np.float32)
  for i, c in np.ndenumerate(out):
    if c < 0:
      c = 2 * n * int(-c / (2 * n)) + c
      c = c + 2 * n if c < -n else -c - 1
    elif c > n - 1:
      c = c - 2 * n * int(c / (2 * n))
      c = 2 * n - c - 1 if c >= n else c
    out[i] = min(max(c, 0.), n - 1.)
  return out


def _np_transform(image, t):
  """Keras' `transform` as the file calls it (nearest, fill_mode='reflect'):
  output (x, y) reads input (t0 x + t1 y + t2, t3 x + t4 y + t5), float32
  with one rounding per operation, reflected, rounded half away from 0."""
  h, w = image.shape[:2]
  t = np.float32(t)
  ys, xs = np.meshgrid(np.arange(h, dtype=np.float32),
                       np.arange(w, dtype=np.float32), indexing='ij')
  sx = t[0] * xs + t[1] * ys + t[2]
  sy = t[3] * xs + t[4] * ys + t[5]
  ix = np.floor(_np_reflect(sx, w) + 0.5).astype(int)
  iy = np.floor(_np_reflect(sy, h) + 0.5).astype(int)
  return image[iy, ix].astype(np.int64)


def _tf_transform(image, t):
  """The file's wrap, transform (the ImageProjectiveTransform kernel with
  NEAREST and REFLECT, as Keras' transform runs it) and unwrap with 128."""
  tf = _tf()
  h, w = image.shape[:2]
  wrapped = tf.concat([image, tf.ones([h, w, 1], tf.uint8)], 2)
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=wrapped[None], transforms=tf.constant([list(t) + [0., 0.]],
                                                   tf.float32),
      output_shape=tf.constant([h, w]), fill_value=0.,
      interpolation='NEAREST', fill_mode='REFLECT')[0]
  empty = tf.equal(out[..., 3:], 0)
  return tf.where(empty, tf.constant(128, tf.uint8), out)[..., :3].numpy(
      ).astype(np.int64)


def _tf_matrix(name, arg, h, w):
  """The transform the file builds for each geometric op (its first six
  entries), in float32 for Rotate as there."""
  if name == 'ShearX':
    return (1., arg, 0., 0., 1., 0.)
  if name == 'ShearY':
    return (1., 0., 0., arg, 1., 0.)
  if name == 'TranslateX':    # translate(image, [-pixels, 0]): x + pixels.
    return (1., 0., arg, 0., 1., 0.)
  if name == 'TranslateY':
    return (1., 0., 0., 0., 1., arg)
  f32 = np.float32
  rad = f32(f32(arg) * f32(np.pi / 180.))
  c, s = np.cos(rad, dtype=f32), np.sin(rad, dtype=f32)
  w1, h1 = f32(w - 1), f32(h - 1)
  x_off = (w1 - (c * w1 - s * h1)) / f32(2.)
  y_off = (h1 - (s * w1 + c * h1)) / f32(2.)
  return (c, -s, x_off, s, c, y_off)


@pytest.mark.parametrize('name,arg', [
    ('ShearX', 0.27), ('ShearX', -0.12), ('ShearY', 0.12), ('ShearY', -0.3),
    ('TranslateX', 225.), ('TranslateX', -25.), ('TranslateY', -225.),
    ('TranslateY', 97.5), ('Rotate', 24.), ('Rotate', -27.), ('Rotate', 6.)])
def test_tf_geometric_ops_match_tf_transform(name, arg):
  image = _image(25)
  h, w = image.shape[:2]
  out = _tf_ours(image, name, arg)
  t = _tf_matrix(name, arg, h, w)
  np.testing.assert_array_equal(out, _np_transform(image, t))
  # TF's kernel gives the same: reflection fills the borders, so the wrap
  # channel never reads 0 and no pixel takes the fill of 128.
  np.testing.assert_array_equal(out, _tf_transform(image, t))
  assert np.abs(out - image).max() > 50
  if name == 'TranslateY' and arg == -225.:
    # 225 px of a 32 px image: seven periods of the reflection.
    np.testing.assert_array_equal(out[0], image[_np_reflect(-225., h)
                                                .astype(int)])


@pytest.mark.parametrize('name', ['ShearX', 'ShearY', 'TranslateY', 'Rotate'])
def test_tf_level_zero_geometric_ops_are_identities(name):
  image = _image(26)
  np.testing.assert_array_equal(_tf_ours(image, name, 0.), image)


def test_tf_cutout_is_a_clipped_square_of_128_at_a_uniform_centre():
  image = _image(27, hi=100)              # No 128 in the image.
  h, w = image.shape[:2]
  centres = []
  for seed in range(60):
    pad = (4, 10, 40)[seed % 3]
    out = _tf_ours(image, 'Cutout', pad, jax.random.key(seed))
    filled = np.all(out == 128, axis=-1)
    np.testing.assert_array_equal(out[~filled], image[~filled])
    rows, cols = np.nonzero(filled.any(1))[0], np.nonzero(filled.any(0))[0]
    # The numpy cutout (the file's pads) at one centre gives this output.
    matches = []
    for cy in range(h):
      for cx in range(w):
        mask = np.zeros((h, w), bool)
        mask[max(0, cy - pad):h - max(0, h - cy - pad),
             max(0, cx - pad):w - max(0, w - cx - pad)] = True
        if np.array_equal(mask, filled):
          matches.append((cy, cx))
    assert matches, (seed, rows, cols)
    if pad < 16:      # The square fits: its centre is unique.
      assert len(matches) == 1
      centres.append(matches[0])
  centres = np.array(centres)
  # 40 centres over a 32 x 40 image: spread over it, mean near its centre.
  assert abs(centres[:, 0].mean() - (h - 1) / 2) < 4.5
  assert abs(centres[:, 1].mean() - (w - 1) / 2) < 5.5
  assert len(set(map(tuple, centres))) >= 35
  np.testing.assert_array_equal(_tf_ours(image, 'Cutout', 0), image)


def test_tf_level_to_arg_by_hand():
  # level_to_arg with AutoAugment's defaults: f = level / 10; rotate f 30,
  # shear f 0.3, translate f 250, enhance f 1.8 + 0.1, int(f 4) bits,
  # int(f 256) threshold, int(f 110) addition, int(f 100) cutout.
  args = aa.tf_autoaugment_args()
  assert args.shape == (16, 11)
  at = lambda name, level: float(args[_TF_NAMES.index(name), level])
  assert at('Rotate', 8) == 24. and at('Rotate', 5) == 15.
  assert at('Rotate', 0) == 0.
  assert at('ShearX', 9) == pytest.approx(0.27)
  assert at('ShearY', 4) == pytest.approx(0.12)
  assert at('TranslateY', 9) == 225. and at('TranslateX', 4) == 100.
  assert at('Color', 9) == pytest.approx(1.72)
  assert at('Color', 0) == pytest.approx(0.1)
  assert at('Color', 5) == 1.
  assert at('Sharpness', 10) == pytest.approx(1.9)
  assert [at('Posterize', lv) for lv in (0, 2, 3, 6, 10)] == [0, 0, 1, 2, 4]
  assert [at('Solarize', lv) for lv in (2, 3, 4, 8, 10)] == [
      51, 76, 102, 204, 256]
  assert [at('SolarizeAdd', lv) for lv in (3, 7, 10)] == [33, 77, 110]
  assert [at('Cutout', lv) for lv in (3, 4, 10)] == [30, 40, 100]
  for name in ('AutoContrast', 'Equalize', 'Invert'):
    assert not args[_TF_NAMES.index(name)].any()


# tensorflow/models official/legacy/image_classification/augment.py
# AutoAugment.policy_v0 (the same list in the older official/vision/
# image_classification/augment.py): "op probability level" twice per
# sub-policy.
_V0 = """
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
Color 0.8 6 Rotate 0.4 5
"""


def test_v0_is_the_model_gardens_policy():
  published = []
  for part in _V0.replace('\n', ' | ').split('|'):
    words = part.split()
    if words:
      assert len(words) == 6, part
      published.append(tuple((words[i], float(words[i + 1]),
                              int(words[i + 2])) for i in (0, 3)))
  assert len(published) == 25
  assert aa.AUTOAUGMENT_POLICIES['v0'] == tuple(published)
  assert {o for sub in published for o, _, _ in sub} <= set(_TF_NAMES)


def test_tf_levels_truncate_float_crops():
  # As the SupCon code's tf.cast of its resized float crop to uint8.
  rng = np.random.default_rng(28)
  u8 = rng.integers(0, 256, (32, 40, 3))
  fraction = rng.choice([0., 0.25, 0.5, 0.99], (32, 40, 3))
  image = jnp.asarray((u8 + fraction) / 255., jnp.float32)
  np.testing.assert_array_equal(np.asarray(aa._tf_levels(image)), u8)


def test_policy_and_convention_must_match():
  with pytest.raises(ValueError, match="autoaugment_impl='tf_model_garden'"):
    augment.build_views('tcl', 2, ({'autoaugment': 'v0',
                                    'autoaugment_impl':
                                    'pytorch_auto_augment'},))
  with pytest.raises(ValueError,
                     match="autoaugment_impl='pytorch_auto_augment'"):
    augment.build_views('tcl', 2, ({'autoaugment': 'cifar10',
                                    'autoaugment_impl': 'tf_model_garden'},))
  with pytest.raises(ValueError, match='autoaugment_impl'):
    augment.build_views('tcl', 2, ({'autoaugment_impl': 'torchvision'},))
  with pytest.raises(ValueError, match="autoaugment_impl='tf_model_garden'"):
    aa.autoaugment(jax.random.key(0), jnp.zeros((8, 8, 3)),
                        policy='v0', impl='pytorch_auto_augment')
  with pytest.raises(ValueError, match='unknown AutoAugment implementation'):
    aa.autoaugment(jax.random.key(0), jnp.zeros((8, 8, 3)), impl='pil')
  views = augment.build_views('tcl', 2, ({'autoaugment': 'v0',
                                          'autoaugment_impl':
                                          'tf_model_garden'},))
  assert views[0].autoaugment == 'v0'


@pytest.mark.parametrize('policy', sorted(aa.AUTOAUGMENT_POLICIES))
def test_the_default_impl_is_the_one_defining_the_policy(policy):
  images = jnp.asarray(_image(31, (2, 16, 16, 3)))
  view = augment.build_views('tcl_fmnist', 1, ({'autoaugment': policy},))[0]
  assert view.autoaugment_impl == ''
  explicit = dataclasses.replace(
      view, autoaugment_impl=aa.AUTOAUGMENT_POLICY_IMPLS[policy])
  run = lambda v: np.asarray(augment.augment_batch(jax.random.key(1), images,
                                                   (v,)))
  np.testing.assert_array_equal(run(view), run(explicit))


def test_supcon_imagenet_config_augments_with_v0():
  from configs.papers import supcon
  config = supcon.get_config('imagenet')
  views = augment.build_views(config.augment.preset, config.augment.num_views,
                              config.augment.overrides,
                              config.augment.op_order)
  for view in views:
    assert view.autoaugment == 'v0'
    assert view.autoaugment_impl == 'tf_model_garden'
  images = jnp.asarray(_image(30, (4, 48, 48, 3)))
  out = jax.jit(lambda k, x: augment.augment_batch(k, x, views),
                compiler_options=_FAST_COMPILE)(jax.random.key(0), images)
  assert out.shape == (4, 2, 48, 48, 3)
  out = np.asarray(out) * 255.
  np.testing.assert_allclose(out, np.round(out), atol=1e-3)
  assert out.min() >= 0. and out.max() <= 255.
  assert np.any(out[:, 0] != out[:, 1])
