"""Encoders and projection heads (Flax Linen), selected by name from the config.

`ContrastiveModel` returns the backbone features `h` (what kNN and the linear
probes read) and the projection `z` (what the loss reads), as in SimCLR.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from contrastive_jax.batch_norm import BN_MOMENTUM
from contrastive_jax.batch_norm import batch_norm
from contrastive_jax.losses.common import l2_normalize


def max_pool_2x2(x):
  """2x2/2 max-pool, [B, H, W, C] -> [B, H/2, W/2, C]: nn.max_pool's values as
  reshape + max, whose gradient avoids XLA:CPU's slow select-and-scatter."""
  b, h, w, c = x.shape
  x = x[:, :h // 2 * 2, :w // 2 * 2]
  return jnp.max(x.reshape(b, h // 2, 2, w // 2, 2, c), axis=(2, 4))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def max_pool_3x3_s2(x, padding: int):
  """3x3/2 max-pool with `padding` (0 or 1) per side, nn.max_pool's values.

  The gradient goes to each window's first maximum in row-major order, as
  select-and-scatter's does, built from masks and pads (docs/performance.md).
  """
  return lax.reduce_window(
      x, jnp.array(-jnp.inf, x.dtype), lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
      ((0, 0), (padding, padding), (padding, padding), (0, 0)))


def _max_pool_bwd(padding, saved, g):
  x, y = saved
  b, h, w, c = x.shape
  ho, wo = y.shape[1:3]
  xp = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)),
               constant_values=-jnp.inf)
  taken = jnp.zeros(y.shape, bool)
  planes = {}    # (row parity, column parity) -> [B, Ho + 1, Wo + 1, C].
  for di in range(3):
    for dj in range(3):
      first = (xp[:, di:di + 2 * ho - 1:2, dj:dj + 2 * wo - 1:2] == y) & ~taken
      taken = taken | first
      # Padded row di + 2i is row i + di // 2 of the plane of parity di % 2.
      part = jnp.pad(jnp.where(first, g, 0), (
          (0, 0), (di // 2, 1 - di // 2), (dj // 2, 1 - dj // 2), (0, 0)))
      key = (di % 2, dj % 2)
      planes[key] = planes[key] + part if key in planes else part
  grad = jnp.stack([jnp.stack([planes[(r, 0)], planes[(r, 1)]], axis=3)
                    for r in (0, 1)], axis=2)
  grad = grad.reshape(b, 2 * ho + 2, 2 * wo + 2, c)
  return (grad[:, padding:padding + h, padding:padding + w],)


max_pool_3x3_s2.defvjp(
    lambda x, padding: (y := max_pool_3x3_s2(x, padding), (x, y)),
    _max_pool_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_cpu(x, kernel, pads, precision):
  """A stride-1 NHWC/HWIO conv: XLA's forward; backward dkernel = patches^T g
  and dx = im2col^T (g kernel^T), matmuls faster on XLA:CPU than autodiff's
  transposed convolutions (the same sums reordered). Reverse mode only."""
  return lax.conv_general_dilated(x, kernel, (1, 1), pads,
                                  dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
                                  precision=precision)


def _conv_cpu_bwd(pads, precision, residuals, g):
  x, kernel = residuals
  kh, kw, cin, cout = kernel.shape

  def im2col(x):    # [B, H, W, C] -> patches [B, H', W', kh kw C], HWIO order.
    x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    return jnp.concatenate([x[:, i:i + h, j:j + w] for i in range(kh)
                            for j in range(kw)], axis=-1)

  # im2col is linear in x: its vjp is the transpose (scatter-add of patches).
  patches, im2col_transpose = jax.vjp(im2col, x)
  rows = patches.reshape(-1, kh * kw * cin)
  g = g.reshape(-1, cout)
  kernel = kernel.reshape(kh * kw * cin, cout)
  dkernel = jnp.dot(rows.T, g, precision=precision)
  dpatches = jnp.dot(g, kernel.T, precision=precision)
  (dx,) = im2col_transpose(dpatches.reshape(patches.shape))
  return dx, dkernel.reshape(kh, kw, cin, cout)


_conv_cpu.defvjp(lambda x, kernel, pads, precision: (
    _conv_cpu(x, kernel, pads, precision), (x, kernel)), _conv_cpu_bwd)


def cpu_conv(lhs, rhs, window_strides, padding, lhs_dilation=None,
             rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
             precision=None):
  """`lax.conv_general_dilated` for `nn.Conv`: on CPU a 2-D, stride-1,
  undilated, ungrouped NHWC/HWIO conv runs as `_conv_cpu`, all else as is."""
  ones = (1,) * (lhs.ndim - 2)
  if (jax.default_backend() != 'cpu' or lhs.ndim != 4
      or feature_group_count != 1 or any(tuple(v or ones) != ones for v in (
          window_strides, lhs_dilation, rhs_dilation))
      or dimension_numbers != lax.conv_dimension_numbers(
          lhs.shape, rhs.shape, ('NHWC', 'HWIO', 'NHWC'))):
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
        feature_group_count=feature_group_count, precision=precision)
  pads = (lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], (1, 1), padding)
          if isinstance(padding, str) else padding)
  pads = tuple(tuple(int(p) for p in pad) for pad in pads)
  return _conv_cpu(lhs, rhs, pads, precision)


def bn_splits_of(model) -> int:
  """`bn_splits` of the encoder inside `model`, 0 when it has none."""
  for attr in ('base', 'encoder'):
    if hasattr(model, attr):
      return bn_splits_of(getattr(model, attr))
  return int(getattr(model, 'bn_splits', 0) or 0)


# `config.model.head_init`: name -> fan_in -> (kernel, bias) inits of the
# head's and predictor's Dense layers: Flax's default; torch.nn.Linear's
# U(+-1/sqrt(fan_in)); SimCLR's and SupCon's TF heads; tf.layers.dense's.
HEAD_INITS: dict[str, Callable[[int], tuple[Callable, Callable]]] = {
    'lecun_normal': lambda fan_in: (nn.initializers.lecun_normal(),
                                    nn.initializers.zeros),
    'torch_default': lambda fan_in: (
        nn.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform'),
        lambda key, shape, dtype=jnp.float32: jax.random.uniform(
            key, shape, dtype, -fan_in ** -0.5, fan_in ** -0.5)),
    'normal_0.01': lambda fan_in: (nn.initializers.normal(0.01),
                                   nn.initializers.zeros),
    'glorot_uniform': lambda fan_in: (nn.initializers.glorot_uniform(),
                                      nn.initializers.zeros),
}


def _lookup(table: dict[str, Any], name: str, field: str, why: str = ''):
  """table[name], else a ValueError naming `field` and the known names."""
  if name not in table:
    raise ValueError(f'{field}={name!r}; known: {", ".join(table)}{why}.')
  return table[name]


def head_dense_inits(name: str, fan_in: int) -> tuple[Callable, Callable]:
  return _lookup(HEAD_INITS, name, 'config.model.head_init',
                 " (the projection head's and predictor's Dense "
                 'initialisation)')(fan_in)


# The ResNets' conv inits (`encoder_kwargs.conv_init`): torchvision's
# resnet.py; torch.nn.Conv2d's own; TF1's variance_scaling_initializer()
# (SimCLR's and SupCon's resnets).
CONV_INITS: dict[str, Callable[..., Any]] = {
    'kaiming_normal_fan_out': nn.initializers.variance_scaling(
        2.0, 'fan_out', 'normal'),
    'torch_default': nn.initializers.variance_scaling(1 / 3, 'fan_in',
                                                      'uniform'),
    'lecun_normal': nn.initializers.lecun_normal(),
}


def conv_kernel_init(name: str):
  if name not in CONV_INITS:
    raise ValueError(f'conv_init={name!r} (config.model.encoder_kwargs); '
                     f'known: {", ".join(CONV_INITS)}.')
  return CONV_INITS[name]


class SmallCNN(nn.Module):
  """A CPU-sized CNN: per width [3x3 conv, BN, ReLU], 2x2 pools between.
  `pool='avg'`: the global average [B, widths[-1]]; 'none': the last map
  (28x28 input: [B, 3, 3, widths[-1]])."""
  widths: Sequence[int] = (32, 64, 128, 256)
  pool: str = 'avg'
  dtype: Any = jnp.float32
  bn_splits: int = 0
  fused_bn: bool = True

  @nn.compact
  def __call__(self, x, *, train: bool):
    norm = batch_norm(train=train, dtype=self.dtype, bn_splits=self.bn_splits,
                      fused=self.fused_bn)
    x = x.astype(self.dtype)
    for i, width in enumerate(self.widths):
      x = nn.Conv(width, (3, 3), use_bias=False, dtype=self.dtype,
                  conv_general_dilated=cpu_conv, name=f'conv{i}')(x)
      x = norm(name=f'bn{i}')(x, relu=True)
      if i < len(self.widths) - 1:
        x = max_pool_2x2(x)
    if self.pool == 'avg':
      return jnp.mean(x, axis=(1, 2))
    if self.pool == 'none':
      return x
    raise ValueError(f"SmallCNN pool must be 'avg' or 'none'; got "
                     f'{self.pool!r}.')


class _Block(nn.Module):
  """A ResNet block: per (kernel size, strided) of `convs` a conv and BN, the
  last BN's output plus the shortcut, each followed by a ReLU."""
  filters: int
  strides: int = 1
  dtype: Any = jnp.float32
  zero_init_residual: bool = False
  bn_splits: int = 0
  fused_bn: bool = True
  conv_init: str = 'kaiming_normal_fan_out'

  @nn.compact
  def __call__(self, x, *, train: bool):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype,
                             kernel_init=conv_kernel_init(self.conv_init))
    norm = batch_norm(train=train, dtype=self.dtype, bn_splits=self.bn_splits,
                      fused=self.fused_bn)
    out, last = self.filters * self.expansion, len(self.convs)
    y = x
    for i, (size, strided) in enumerate(self.convs, 1):
      s, p = (self.strides if strided else 1), size // 2
      y = conv(out if i == last else self.filters, (size, size), (s, s),
               padding=((p, p), (p, p)), name=f'conv{i}')(y)
      if i < last:
        y = norm(name=f'bn{i}')(y, relu=True)
    if x.shape[-1] != out or self.strides != 1:
      x = conv(out, (1, 1), (self.strides, self.strides),
               name='downsample_conv')(x)
      x = norm(name='downsample_bn')(x)
    # Zero gamma makes each block start as the identity (Goyal et al. 2017).
    init = (nn.initializers.zeros if self.zero_init_residual
            else nn.initializers.ones)
    return norm(name=f'bn{last}', scale_init=init)(y, residual=x, relu=True)


class BasicBlock(_Block):
  """Two 3x3 convs (ResNet-18/34). Output width `filters`."""
  expansion = 1
  convs = ((3, True), (3, False))


class Bottleneck(_Block):
  """1x1 -> 3x3 (strided) -> 1x1 convs (ResNet-50+). Output 4 * `filters`."""
  expansion = 4
  convs = ((1, False), (3, True), (1, False))


# The ResNet stems: (kernel size, stride, standard padding) of the conv;
# 'imagenet' is followed by a 3x3/2 max-pool.
STEMS = {'imagenet': (7, 2, 3), 'cifar': (3, 1, 1)}


class ResNet(nn.Module):
  """ResNet backbone without the classifier: [B, H, W, C] -> [B, F] float32.

  torchvision's (v1.5) layers; F = 8 * width * block_cls.expansion; compute in
  `dtype`, parameters float32. `stem`: 'imagenet' (7x7/2 conv + 3x3/2
  max-pool) or 'cifar' (3x3/1 conv). `conv_init`: a CONV_INITS name;
  `stem_conv_init` ('' = conv_init) and `stem_padding` per side (0 = the
  stem's standard) override the stem conv's.
  """
  stage_sizes: Sequence[int]
  block_cls: Any
  width: int = 64
  stem: str = 'imagenet'
  zero_init_residual: bool = False
  conv_init: str = 'kaiming_normal_fan_out'
  stem_conv_init: str = ''
  stem_padding: int = 0
  dtype: Any = jnp.float32
  bn_splits: int = 0
  fused_bn: bool = True

  @nn.compact
  def __call__(self, x, *, train: bool):
    x = x.astype(self.dtype)
    stem_init = conv_kernel_init(self.stem_conv_init or self.conv_init)
    if self.stem not in STEMS:
      raise ValueError(f'stem must be one of {", ".join(STEMS)}; got '
                       f'{self.stem!r}.')
    if self.stem_padding < 0:
      raise ValueError(f'stem_padding={self.stem_padding} must be >= 0 (0: '
                       "the stem's standard padding).")
    size, stride, standard = STEMS[self.stem]
    pad = self.stem_padding or standard
    x = nn.Conv(self.width, (size, size), (stride, stride),
                padding=((pad, pad), (pad, pad)), use_bias=False,
                dtype=self.dtype, kernel_init=stem_init, name='conv_stem')(x)
    x = batch_norm(train=train, dtype=self.dtype, bn_splits=self.bn_splits,
                   fused=self.fused_bn)(name='bn_stem')(x, relu=True)
    if self.stem == 'imagenet':
      x = max_pool_3x3_s2(x, 1)
    for i, num_blocks in enumerate(self.stage_sizes):
      for j in range(num_blocks):
        x = self.block_cls(
            filters=self.width * 2**i, strides=2 if i > 0 and j == 0 else 1,
            dtype=self.dtype, zero_init_residual=self.zero_init_residual,
            bn_splits=self.bn_splits, fused_bn=self.fused_bn,
            conv_init=self.conv_init, name=f'stage{i + 1}_block{j}')(
                x, train=train)
    return jnp.mean(x, axis=(1, 2)).astype(jnp.float32)


ResNet18 = functools.partial(ResNet, stage_sizes=(2, 2, 2, 2),
                             block_cls=BasicBlock)
ResNet50 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3),
                             block_cls=Bottleneck)


class SmallAlexNet(nn.Module):
  """CACR's small-scale AlexNet (Wang & Isola 2020's): [B, H, W, C] -> fc7.

  Five bias-free 3x3 convs with BN + ReLU, 3x3/2 VALID max-pools after conv1,
  conv2 and conv5, then fc6 and fc7 (bias-free Dense, BN, ReLU); weights
  N(0, 0.02). The paper's fc8 is the projection head with head_layers = 1.
  """
  widths: Sequence[int] = (96, 192, 384, 384, 192)
  fc_dim: int = 4096
  dtype: Any = jnp.float32
  bn_splits: int = 0
  fused_bn: bool = True

  @nn.compact
  def __call__(self, x, *, train: bool):
    if len(self.widths) != 5:
      raise ValueError(f'widths must name 5 convs; got {self.widths}.')
    init = nn.initializers.normal(0.02)
    norm = batch_norm(train=train, dtype=self.dtype, bn_splits=self.bn_splits,
                      fused=self.fused_bn)
    x = x.astype(self.dtype)
    for i, width in enumerate(self.widths):
      x = nn.Conv(width, (3, 3), padding=((1, 1), (1, 1)), use_bias=False,
                  dtype=self.dtype, kernel_init=init, name=f'conv{i + 1}')(x)
      x = norm(name=f'bn{i + 1}')(x, relu=True)
      if i in (0, 1, 4):
        x = max_pool_3x3_s2(x, 0)
    x = x.reshape(x.shape[0], -1)
    for name in ('fc6', 'fc7'):
      x = nn.Dense(self.fc_dim, use_bias=False, dtype=self.dtype,
                   kernel_init=init, name=name)(x)
      x = norm(name=f'bn_{name}')(x, relu=True)
    return x.astype(jnp.float32)


ENCODERS: dict[str, Callable[..., nn.Module]] = {
    'small_cnn': SmallCNN,
    'resnet18': ResNet18,
    'resnet50': ResNet50,
    'alexnet_small': SmallAlexNet,
}


class ProjectionHead(nn.Module):
  """SimCLR's MLP head: (num_layers - 1) x [Dense, BN, ReLU], then Dense.

  `batch_norm=False`: MoCo v2's [Dense with bias, ReLU] hidden layers.
  `final_bn`: a BN after a bias-free last Dense (SimCLR: no center; MoCo v3:
  neither scale nor center). `dense_init`: a HEAD_INITS name.
  """
  hidden_dim: int = 512
  out_dim: int = 128
  num_layers: int = 2
  batch_norm: bool = True
  final_bn: bool = False
  final_bn_scale: bool = True
  final_bn_center: bool = True
  dense_init: str = 'lecun_normal'
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    last = self.num_layers - 1
    for i in range(self.num_layers):
      bn = self.batch_norm if i < last else self.final_bn
      kernel_init, bias_init = head_dense_inits(self.dense_init, x.shape[-1])
      x = nn.Dense(self.hidden_dim if i < last else self.out_dim,
                   use_bias=not bn, dtype=self.dtype, kernel_init=kernel_init,
                   bias_init=bias_init, name=f'dense{i}')(x)
      if bn:
        x = nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM,
                         use_scale=i < last or self.final_bn_scale,
                         use_bias=i < last or self.final_bn_center,
                         dtype=self.dtype, name=f'bn{i}')(x)
      if i < last:
        x = nn.relu(x)
    return x


class ContrastiveModel(nn.Module):
  """Encoder + projection head: {'features': [B, F], 'projection': [B, D]}.

  Both outputs are float32. A spatial encoder output [B, h, w, C] gives the
  flattened map as `features`; the head reads its global average
  (`head_input='pooled'`) or the flattened map ('features'). `input_mean` /
  `input_std` standardise the images per channel first (INPUT_NORMS);
  `normalize_head_input` L2-normalises the head's input (SupCon's TF code).
  """
  encoder: nn.Module
  head: nn.Module
  head_input: str = 'pooled'
  normalize_head_input: bool = False
  input_mean: tuple[float, ...] | None = None
  input_std: tuple[float, ...] | None = None

  def __call__(self, x, *, train: bool):
    if self.input_mean is not None:
      if x.shape[-1] != len(self.input_mean):
        raise ValueError(
            f'config.model.input_norm has {len(self.input_mean)} channels '
            f'(mean {self.input_mean}); the images have {x.shape[-1]} '
            f'(shape {x.shape}): pick statistics of the dataset\'s channels, '
            "or 'none'.")
      x = ((x.astype(jnp.float32) - jnp.asarray(self.input_mean, jnp.float32))
           / jnp.asarray(self.input_std, jnp.float32))
    h = self.encoder(x, train=train)
    if h.ndim == 4:
      features = h.reshape(h.shape[0], -1)
      head_in = (jnp.mean(h, axis=(1, 2)) if self.head_input == 'pooled'
                 else features)
    else:
      features = head_in = h
    if self.normalize_head_input:
      head_in = l2_normalize(head_in)
    return {'features': features.astype(jnp.float32),
            'projection': self.head(head_in, train=train).astype(jnp.float32)}


class WithPredictor(nn.Module):
  """A model plus a predictor MLP on its projection (BYOL; MoCo v3): adds
  `prediction` [B, out_dim] float32, [Dense, BN, ReLU, Dense] of it."""
  base: nn.Module
  hidden_dim: int
  out_dim: int
  dense_init: str = 'lecun_normal'
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool) -> dict[str, Any]:
    out = self.base(x, train=train)
    prediction = ProjectionHead(
        hidden_dim=self.hidden_dim, out_dim=self.out_dim, num_layers=2,
        dense_init=self.dense_init, dtype=self.dtype,
        name='predictor')(out['projection'], train=train)
    return {**out, 'prediction': prediction.astype(jnp.float32)}


# `config.model.dtype`: the compute dtype; parameters stay float32.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
HEAD_INPUTS = dict.fromkeys(('pooled', 'features'))
# `config.model.input_norm`: name -> per-channel (mean, std) applied to the
# [0, 1] images, or None. Sources: docs/recipe_audit.md.
INPUT_NORMS: dict[str, tuple[tuple[float, ...], tuple[float, ...]] | None] = {
    'none': None,
    'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    'cifar10': ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    'cifar100': ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    'cifar10_solo': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    'cifar100_solo': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    'half': ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
    'symmetric': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),   # [-1, 1].
}


def compute_dtype(config):
  return _lookup(DTYPES, config.model.dtype, 'config.model.dtype',
                 ' (bfloat16: mixed precision, float32 parameters)')


def validate(config) -> None:
  """Checks `config.model.encoder` and its `encoder_kwargs` before building."""
  name = config.model.encoder
  if name not in ENCODERS:
    raise ValueError(f'unknown encoder {name!r} (config.model.encoder); known: '
                     f'{", ".join(sorted(ENCODERS))}.')
  module = ENCODERS[name]
  module = getattr(module, 'func', module)    # ResNet18/50: partials.
  if not dataclasses.is_dataclass(module):
    return
  # create_model passes dtype, bn_splits and fused_bn itself.
  fields = {f.name for f in dataclasses.fields(module)} - {
      'parent', 'name', 'dtype', 'bn_splits', 'fused_bn'}
  unknown = sorted(set(config.model.encoder_kwargs) - fields)
  if unknown:
    raise ValueError(f'config.model.encoder_kwargs: {name} has no field '
                     f'{", ".join(unknown)}; its fields: '
                     f'{", ".join(sorted(fields))}.')


def create_model(config) -> ContrastiveModel:
  """The ContrastiveModel `config.model` describes."""
  validate(config)
  m = config.model
  _lookup(HEAD_INPUTS, m.head_input, 'config.model.head_input',
          ' (what the projection head reads from a spatial map: its global '
          'average, or the flattened map that evaluation reads)')
  dtype = compute_dtype(config)
  head_dense_inits(m.head_init, 1)   # An unknown name fails here.
  norm = _lookup(INPUT_NORMS, m.input_norm, 'config.model.input_norm',
                 ' (the per-channel mean / std the model subtracts / divides '
                 'by first; models.py INPUT_NORMS)')
  encoder = ENCODERS[m.encoder](**m.encoder_kwargs, dtype=dtype,
                                bn_splits=m.bn_splits, fused_bn=m.fused_bn)
  head = ProjectionHead(hidden_dim=m.head_hidden_dim, out_dim=m.head_out_dim,
                        num_layers=m.head_layers, batch_norm=m.head_batch_norm,
                        final_bn=m.head_final_bn,
                        final_bn_scale=m.head_final_bn_scale,
                        final_bn_center=m.head_final_bn_center,
                        dense_init=m.head_init, dtype=dtype)
  return ContrastiveModel(
      encoder=encoder, head=head, head_input=m.head_input,
      normalize_head_input=m.normalize_head_input,
      input_mean=None if norm is None else norm[0],
      input_std=None if norm is None else norm[1])
