"""Encoders and projection heads (Flax Linen), selected by name from the config.

`ContrastiveModel` returns both the backbone features `h` (what evaluation
reads: kNN and linear probes run on frozen `h`) and the projection `z` (what the
loss reads), as in SimCLR where the head is discarded after pretraining.
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

ModuleDef = Any


def max_pool_2x2(x):
  """2x2 max-pool, stride 2, as reshape + max ([B, H, W, C] -> [B, H/2, W/2, C]).

  Same forward values as `nn.max_pool(x, (2, 2), (2, 2))` (odd borders are
  dropped, as there), but its gradient avoids XLA's select-and-scatter, which
  made pooling the single most expensive op of the small CNN's step on CPU
  (3.5-4.5x slower; benchmarks/train_step.py --profile).
  """
  b, h, w, c = x.shape
  x = x[:, :h // 2 * 2, :w // 2 * 2]
  return jnp.max(x.reshape(b, h // 2, 2, w // 2, 2, c), axis=(2, 4))


def _pool_3x3_s2(x, padding: int):
  return lax.reduce_window(
      x, jnp.array(-jnp.inf, x.dtype), lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
      ((0, 0), (padding, padding), (padding, padding), (0, 0)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def max_pool_3x3_s2(x, padding: int):
  """3x3 max-pool, stride 2, `padding` (0 or 1) on each side, whose gradient
  is built from masks instead of XLA's select-and-scatter.

  [B, H, W, C] -> [B, (H + 2p - 3) // 2 + 1, ..., C], nn.max_pool's values.
  The gradient of each output goes to the first maximum of its window in
  row-major order, as select-and-scatter sends it: for each of the 9 window
  offsets, the mask of the inputs at that offset equal to their window's
  maximum and not yet taken by an earlier offset; the masked gradients are
  placed back with pads and interleaved (no scatter). The ResNets' ImageNet
  stem and the small AlexNet pool this way (fwd + bwd at the ResNet-50
  stem's shape on the CPU: docs/performance.md).
  """
  return _pool_3x3_s2(x, padding)


def _max_pool_fwd(x, padding):
  y = _pool_3x3_s2(x, padding)
  return y, (x, y)


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
      # Input row di + 2 i of the padded map is row i + di // 2 of the
      # plane of parity di % 2 (columns alike).
      part = jnp.pad(jnp.where(first, g, 0), (
          (0, 0), (di // 2, 1 - di // 2), (dj // 2, 1 - dj // 2), (0, 0)))
      key = (di % 2, dj % 2)
      planes[key] = planes[key] + part if key in planes else part
  grad = jnp.stack([jnp.stack([planes[(r, 0)], planes[(r, 1)]], axis=3)
                    for r in (0, 1)], axis=2)
  grad = grad.reshape(b, 2 * ho + 2, 2 * wo + 2, c)
  return (grad[:, padding:padding + h, padding:padding + w],)


max_pool_3x3_s2.defvjp(_max_pool_fwd, _max_pool_bwd)


def _im2col(x, kernel_size, pads):
  """[B, H, W, C] -> the patches [B, H', W', kh kw C] of a stride-1 conv.

  The kh * kw shifted views of the padded input, concatenated on channels in
  the order of an HWIO kernel's rows, so that the conv is patches times the
  kernel reshaped to [kh kw C, Cout].
  """
  kh, kw = kernel_size
  x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
  h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  return jnp.concatenate([x[:, i:i + h, j:j + w] for i in range(kh)
                          for j in range(kw)], axis=-1)


def _xla_conv(x, kernel, pads, precision):
  return lax.conv_general_dilated(x, kernel, (1, 1), pads,
                                  dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
                                  precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_cpu(x, kernel, pads, precision):
  """A stride-1 NHWC/HWIO conv: XLA's forward, im2col matmuls backward.

  XLA:CPU's forward convolution is ~2x faster than im2col + matmul at the
  small CNN's shapes, while the convolutions autodiff makes of its
  transposes (input and kernel gradients) are slower than two matmuls on the
  patches (fwd + bwd of the four stages on one device, 1,024 images: ~3.1 s
  all convolutions, ~1.7 s all matmuls). So the forward is the convolution
  and the backward is
      dkernel = patches^T g,   dx = im2col^T (g kernel^T),
  the same sums as the convolution's gradient in another order (float
  reassociation only). Reverse mode only (a custom_vjp has no jvp).
  """
  return _xla_conv(x, kernel, pads, precision)


def _conv_cpu_fwd(x, kernel, pads, precision):
  return _xla_conv(x, kernel, pads, precision), (x, kernel)


def _conv_cpu_bwd(pads, precision, residuals, g):
  x, kernel = residuals
  kh, kw, cin, cout = kernel.shape
  # im2col is linear in x: its vjp is the transpose (scatter-add of patches).
  patches, im2col_transpose = jax.vjp(
      lambda x: _im2col(x, (kh, kw), pads), x)
  rows = patches.reshape(-1, kh * kw * cin)
  g = g.reshape(-1, cout)
  kernel = kernel.reshape(kh * kw * cin, cout)
  dkernel = jnp.dot(rows.T, g, precision=precision)
  dpatches = jnp.dot(g, kernel.T, precision=precision)
  (dx,) = im2col_transpose(dpatches.reshape(patches.shape))
  return dx, dkernel.reshape(kh, kw, cin, cout)


_conv_cpu.defvjp(_conv_cpu_fwd, _conv_cpu_bwd)


def cpu_conv(lhs, rhs, window_strides, padding, lhs_dilation=None,
             rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
             precision=None):
  """`lax.conv_general_dilated` for `nn.Conv`, with a faster CPU gradient.

  On the CPU backend a 2-D, stride-1, undilated, ungrouped NHWC/HWIO conv
  runs as `_conv_cpu` (XLA's convolution forward, im2col matmuls backward).
  Other backends, and every other conv, take `lax.conv_general_dilated`
  itself, so GPU/TPU programs are unchanged. The parameters are nn.Conv's
  own ([kh, kw, Cin, Cout] kernel).
  """
  ones = (1,) * (lhs.ndim - 2)
  if (jax.default_backend() != 'cpu' or lhs.ndim != 4
      or tuple(window_strides) != ones or feature_group_count != 1
      or tuple(lhs_dilation or ones) != ones
      or tuple(rhs_dilation or ones) != ones
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
  """`bn_splits` of the encoder inside `model` (WithPredictor,
  ContrastiveModel or an encoder), 0 when it has none."""
  for attr in ('base', 'encoder'):
    if hasattr(model, attr):
      return bn_splits_of(getattr(model, attr))
  return int(getattr(model, 'bn_splits', 0) or 0)


class SmallCNN(nn.Module):
  """A CPU-sized CNN: `len(widths)` stages of [3x3 conv, BN, ReLU], 2x2 pool.

  On 28x28 inputs with widths (32, 64, 128, 256) the maps are 28, 14, 7, 3
  pixels. `pool='avg'` returns the global average of the last map
  [B, widths[-1]]; `pool='none'` returns the map itself [B, 3, 3, widths[-1]],
  which `ContrastiveModel` flattens for evaluation and averages for the head.
  """
  widths: Sequence[int] = (32, 64, 128, 256)
  pool: str = 'avg'
  dtype: Any = jnp.float32
  bn_splits: int = 0              # config.model.bn_splits, .fused_bn.
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


def _uniform(bound: float):
  """U(-bound, bound), an initializer."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


# The projection head's (and predictor's) Dense initialisations,
# `config.model.head_init`: name -> (kernel init, bias init of a layer with
# `fan_in` inputs).
#   lecun_normal   Flax's nn.Dense default: kernel truncated normal with
#                  variance 1 / fan_in, bias 0.
#   torch_default  torch.nn.Linear's reset_parameters: kernel
#                  kaiming_uniform_(a=sqrt(5)) = U(+-1 / sqrt(fan_in)), bias
#                  U(+-1 / sqrt(fan_in)) (every PyTorch code of the paper
#                  configs).
#   normal_0.01    SimCLR's model_util.py linear_layer and the SupCon TF
#                  projection_head.py: tf.random_normal_initializer(
#                  stddev=.01), bias 0.
#   glorot_uniform tf.layers.dense's default: U(+-sqrt(6 / (fan_in +
#                  fan_out))), bias 0.
HEAD_INITS: dict[str, Callable[[int], tuple[Callable, Callable]]] = {
    'lecun_normal': lambda fan_in: (nn.initializers.lecun_normal(),
                                    nn.initializers.zeros),
    'torch_default': lambda fan_in: (
        nn.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform'),
        _uniform(fan_in ** -0.5)),
    'normal_0.01': lambda fan_in: (nn.initializers.normal(0.01),
                                   nn.initializers.zeros),
    'glorot_uniform': lambda fan_in: (nn.initializers.glorot_uniform(),
                                      nn.initializers.zeros),
}


def head_dense_inits(name: str, fan_in: int) -> tuple[Callable, Callable]:
  """(kernel_init, bias_init) of a head Dense layer with `fan_in` inputs
  under HEAD_INITS[`name`]; ValueError naming the known ones."""
  if name not in HEAD_INITS:
    raise ValueError(f'config.model.head_init={name!r}; known: '
                     f'{", ".join(HEAD_INITS)} (the projection head\'s and '
                     "predictor's Dense initialisation).")
  return HEAD_INITS[name](fan_in)


class ProjectionHead(nn.Module):
  """SimCLR's MLP head: (num_layers - 1) x [Dense, BN, ReLU], then Dense.

  `batch_norm=False` gives MoCo v2's head: [Dense (with bias), ReLU] hidden
  layers, no BatchNorm.

  `final_bn` adds a BatchNorm on the output, after a bias-free last Dense
  (the BN's mean removes any bias): SimCLR's code (learned scale, no offset:
  `final_bn_center=False`), lightly's SimCLRProjectionHead (both), MoCo v3's
  projector (BatchNorm1d(affine=False): neither). In training the output has
  zero mean and unit variance per feature over the batch, before the scale
  and offset.

  `dense_init` names every Dense layer's kernel and bias initialisation
  (HEAD_INITS; `config.model.head_init`).
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

  def _dense(self, features: int, x, use_bias: bool, name: str):
    kernel_init, bias_init = head_dense_inits(self.dense_init, x.shape[-1])
    return nn.Dense(features, use_bias=use_bias, dtype=self.dtype,
                    kernel_init=kernel_init, bias_init=bias_init,
                    name=name)(x)

  @nn.compact
  def __call__(self, h, *, train: bool):
    x = h
    for i in range(self.num_layers - 1):
      x = self._dense(self.hidden_dim, x, not self.batch_norm, f'dense{i}')
      if self.batch_norm:
        x = nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM,
                         dtype=self.dtype, name=f'bn{i}')(x)
      x = nn.relu(x)
    last = self.num_layers - 1
    x = self._dense(self.out_dim, x, not self.final_bn, f'dense{last}')
    if self.final_bn:
      x = nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM,
                       use_scale=self.final_bn_scale,
                       use_bias=self.final_bn_center, dtype=self.dtype,
                       name=f'bn{last}')(x)
    return x


ENCODERS: dict[str, Callable[..., nn.Module]] = {
    'small_cnn': SmallCNN,
}


class ContrastiveModel(nn.Module):
  """Encoder + projection head.

  Returns a dict with `features` [B, F] (the representation that evaluation
  reads) and `projection` [B, out_dim] (head output, the input of the loss),
  both float32 whatever the compute dtype: the losses' similarities and
  log-sum-exp, the kNN and the probes run in full precision.
  An encoder may return a spatial map [B, h, w, C]: `features` is then the
  flattened map [B, h * w * C]. On 28x28 clothing the spatial layout of the
  last map is what separates shirt from coat, and the flattened map beats the
  pooled one for every encoder state measured (docs/configs.md).

  `head_input` is what the head reads from such a map: 'pooled', its global
  average [B, C] (a SimCLR-style input: the loss never sees where a part
  is), or 'features', the flattened map that evaluation reads, so the loss
  trains the representation itself, as SimCLR's head on its pooled ResNet
  output does. For a vector encoder both are the vector.

  `input_mean` / `input_std` (per channel; None: none) standardise the
  images, x -> (x - mean) / std in float32, before anything else reads them
  (the encoder casts to the compute dtype after), so training, the kNN, the
  probes and every evaluator, which all call this model, see the same
  input: the reference codes' transforms.Normalize (`config.model.input_norm`,
  INPUT_NORMS). The images' channel count must be the statistics'.

  `normalize_head_input` divides each row of that input [B, D] by its L2
  norm before the head (x rsqrt(max(||x||^2, 1e-12)), tf.nn.l2_normalize's
  rule): the SupCon authors' TF code (models.py ContrastiveModel with
  `--normalize_embedding=True`). `features` stays the unnormalised encoder
  output whatever this field.
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
  """A model plus a predictor MLP on its projection (BYOL; MoCo v3).

  Returns the model's outputs and `prediction` [B, out_dim] (float32): the
  predictor, shaped like the projection head (Dense, BN, ReLU, Dense), applied
  to `projection`. Only the query branch reads `prediction`; the key / target
  encoder's output is its `projection` (BYOL Sec. 3.1, MoCo v3 Sec. 3).
  """
  base: nn.Module
  hidden_dim: int
  out_dim: int
  dense_init: str = 'lecun_normal'  # HEAD_INITS, as the projection head's.
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool) -> dict[str, Any]:
    out = self.base(x, train=train)
    predictor = ProjectionHead(hidden_dim=self.hidden_dim,
                               out_dim=self.out_dim, num_layers=2,
                               dense_init=self.dense_init, dtype=self.dtype,
                               name='predictor')
    prediction = predictor(out['projection'], train=train)
    return {**out, 'prediction': prediction.astype(jnp.float32)}


# Compute dtypes `config.model.dtype` may name. Parameters, BatchNorm
# statistics, optimizer state and the loss stay float32 in every case.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# What the projection head reads from a spatial map (ContrastiveModel).
HEAD_INPUTS = ('pooled', 'features')
# `config.model.input_norm`: name -> (per-channel mean, std) that the model
# applies to its [0, 1] images first, (x - mean) / std (ContrastiveModel), as
# the reference codes' transforms.Normalize after ToTensor; 'none' feeds
# [0, 1] as SimCLR's TF code does.
INPUT_NORMS: dict[str, tuple[tuple[float, ...], tuple[float, ...]] | None] = {
    'none': None,
    # torchvision's ImageNet statistics: facebookresearch/moco and moco-v3
    # main_moco.py, lemniscate main.py, lightly/transforms/utils.py
    # IMAGENET_NORMALIZE (lightly's CIFAR-10 benchmark uses it too).
    'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    # CIFAR-10's, the std as the widespread kuangliu values: HobbitLong/
    # SupContrast main_supcon.py, lemniscate cifar.py, joshr17/HCL image/
    # utils.py, CACR-SSL small_scale_experiments/cifar10/main_ours.py, TCL
    # train.py.
    'cifar10': ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    # CIFAR-100's: SupContrast main_supcon.py, CACR-SSL small_scale_
    # experiments/cifar100/main_ours.py, TCL train.py.
    'cifar100': ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    # solo-learn's (solo/data/pretrain_dataloader.py MEANS_N_STD).
    'cifar10_solo': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    'cifar100_solo': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    # TCL train.py's ImageNet-100 (mean 0.5, std 0.25).
    'half': ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
    # [-1, 1], x / 127.5 - 1: the SupCon authors' TF preprocessing.py
    # _convert_image_dtype (their ImageNet input sets no whitening).
    'symmetric': ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}


def compute_dtype(config):
  """The jnp dtype of `config.model.dtype`; ValueError naming the known ones."""
  name = config.model.dtype
  if name not in DTYPES:
    raise ValueError(f'config.model.dtype={name!r}; known: '
                     f'{", ".join(DTYPES)} (bfloat16: mixed precision, '
                     'float32 parameters).')
  return DTYPES[name]


def input_norm(config):
  """(mean, std) of `config.model.input_norm`, or None for 'none';
  ValueError naming the known ones."""
  name = config.model.input_norm
  if name not in INPUT_NORMS:
    raise ValueError(f'config.model.input_norm={name!r}; known: '
                     f'{", ".join(INPUT_NORMS)} (the per-channel mean / std '
                     'the model subtracts / divides by first; models.py '
                     'INPUT_NORMS).')
  return INPUT_NORMS[name]


def validate(config) -> None:
  """`config.model.encoder` names an encoder and `encoder_kwargs` are its
  fields: checked before anything is built."""
  name = config.model.encoder
  if name not in ENCODERS:
    raise ValueError(f'unknown encoder {name!r} (config.model.encoder); known: '
                     f'{", ".join(sorted(ENCODERS))}.')
  module = ENCODERS[name]
  module = getattr(module, 'func', module)    # ResNet18/50: partials.
  if not dataclasses.is_dataclass(module):    # A factory: its own checks.
    return
  # create_model passes the compute dtype and the BatchNorm fields
  # (config.model.dtype, .bn_splits, .fused_bn) itself.
  fields = {f.name for f in dataclasses.fields(module)} - {
      'parent', 'name', 'dtype', 'bn_splits', 'fused_bn'}
  unknown = sorted(set(config.model.encoder_kwargs) - fields)
  if unknown:
    raise ValueError(f'config.model.encoder_kwargs: {name} has no field '
                     f'{", ".join(unknown)}; its fields: '
                     f'{", ".join(sorted(fields))}.')


def create_model(config) -> ContrastiveModel:
  """Builds the model named by `config.model` (a ConfigDict).

  `config.model.dtype` is the compute dtype of every conv and dense layer
  (mixed precision with 'bfloat16'); parameters are float32 (flax's
  `param_dtype` default) and the outputs are cast back to float32.
  """
  validate(config)
  name = config.model.encoder
  head_input = config.model.head_input
  if head_input not in HEAD_INPUTS:
    raise ValueError(f'config.model.head_input={head_input!r}; known: '
                     f'{", ".join(HEAD_INPUTS)} (what the projection head '
                     "reads from a spatial map: its global average, or the "
                     'flattened map that evaluation reads).')
  dtype = compute_dtype(config)
  head_dense_inits(config.model.head_init, 1)   # An unknown name fails here.
  norm = input_norm(config)
  # The BatchNorm fields only where they differ from the encoders' defaults
  # (statistics over the whole batch, fused), so that an encoder added
  # without them still builds.
  bn = {'bn_splits': config.model.bn_splits,
        'fused_bn': config.model.fused_bn}
  bn = {k: v for k, v in bn.items() if v != {'bn_splits': 0,
                                             'fused_bn': True}[k]}
  encoder = ENCODERS[name](**config.model.encoder_kwargs, dtype=dtype, **bn)
  head = ProjectionHead(hidden_dim=config.model.head_hidden_dim,
                        out_dim=config.model.head_out_dim,
                        num_layers=config.model.head_layers,
                        batch_norm=config.model.head_batch_norm,
                        final_bn=config.model.head_final_bn,
                        final_bn_scale=config.model.head_final_bn_scale,
                        final_bn_center=config.model.head_final_bn_center,
                        dense_init=config.model.head_init, dtype=dtype)
  return ContrastiveModel(
      encoder=encoder, head=head, head_input=head_input,
      normalize_head_input=config.model.normalize_head_input,
      input_mean=None if norm is None else norm[0],
      input_std=None if norm is None else norm[1])


# ---------------------------------------------------------------------------
# ResNets (He et al. 2016) and the CACR / Wang & Isola small AlexNet.
#
# Layers mirror torchvision (convs without bias, BN after every conv, the
# stride on the 3x3 conv of a Bottleneck, "v1.5"), so parameter counts equal
# torchvision's minus the classifier. Compute runs in `dtype` (e.g. bf16);
# parameters stay float32 (`param_dtype`), so optimizer updates are exact.
# ---------------------------------------------------------------------------

# The ResNets' conv kernel initialisations (`encoder_kwargs.conv_init`), the
# kernel HWIO: fan_in = kh kw Cin, fan_out = kh kw Cout.
#   kaiming_normal_fan_out  torchvision's resnet.py (and its copies:
#                           SupContrast, TCL, lemniscate's ImageNet ResNet):
#                           kaiming_normal_(mode='fan_out',
#                           nonlinearity='relu'), N(0, 2 / fan_out).
#   torch_default           torch.nn.Conv2d's reset_parameters, for ResNets
#                           without an init loop (lightly's ResNetGenerator,
#                           lemniscate's CIFAR ResNet): kaiming_uniform_(
#                           a=sqrt(5)) = U(+-1 / sqrt(fan_in)).
#   lecun_normal            TF1's tf.variance_scaling_initializer() defaults
#                           (SimCLR's resnet.py, SupCon's blocks.py): scale 1,
#                           fan_in, truncated normal = Flax's lecun_normal.
CONV_INITS: dict[str, Callable[..., Any]] = {
    'kaiming_normal_fan_out': nn.initializers.variance_scaling(
        2.0, 'fan_out', 'normal'),
    'torch_default': nn.initializers.variance_scaling(1 / 3, 'fan_in',
                                                      'uniform'),
    'lecun_normal': nn.initializers.lecun_normal(),
}


def conv_kernel_init(name: str):
  """CONV_INITS[`name`]; ValueError naming the known ones."""
  if name not in CONV_INITS:
    raise ValueError(f'conv_init={name!r} (config.model.encoder_kwargs); '
                     f'known: {", ".join(CONV_INITS)}.')
  return CONV_INITS[name]


def _conv_and_norm(block, train: bool):
  """The bias-free conv and the BatchNorm a ResNet block uses."""
  conv = functools.partial(nn.Conv, use_bias=False, dtype=block.dtype,
                           kernel_init=conv_kernel_init(block.conv_init))
  return conv, batch_norm(train=train, dtype=block.dtype,
                          bn_splits=block.bn_splits, fused=block.fused_bn)


class BasicBlock(nn.Module):
  """Two 3x3 convs (ResNet-18/34). Output width `filters`."""
  filters: int
  strides: int = 1
  dtype: Any = jnp.float32
  zero_init_residual: bool = False
  bn_splits: int = 0
  fused_bn: bool = True
  conv_init: str = 'kaiming_normal_fan_out'

  expansion = 1

  @nn.compact
  def __call__(self, x, *, train: bool):
    conv, norm = _conv_and_norm(self, train)
    y = conv(self.filters, (3, 3), (self.strides, self.strides),
             padding=((1, 1), (1, 1)), name='conv1')(x)
    y = norm(name='bn1')(y, relu=True)
    y = conv(self.filters, (3, 3), padding=((1, 1), (1, 1)), name='conv2')(y)
    if x.shape[-1] != self.filters or self.strides != 1:
      x = conv(self.filters, (1, 1), (self.strides, self.strides),
               name='downsample_conv')(x)
      x = norm(name='downsample_bn')(x)
    # Zero gamma makes each block start as the identity (Goyal et al. 2017).
    return norm(name='bn2', scale_init=(nn.initializers.zeros
                                        if self.zero_init_residual
                                        else nn.initializers.ones))(
                                            y, residual=x, relu=True)


class Bottleneck(nn.Module):
  """1x1 -> 3x3 (strided) -> 1x1 convs (ResNet-50+). Output 4 * `filters`."""
  filters: int
  strides: int = 1
  dtype: Any = jnp.float32
  zero_init_residual: bool = False
  bn_splits: int = 0
  fused_bn: bool = True
  conv_init: str = 'kaiming_normal_fan_out'

  expansion = 4

  @nn.compact
  def __call__(self, x, *, train: bool):
    conv, norm = _conv_and_norm(self, train)
    out = self.filters * self.expansion
    y = norm(name='bn1')(conv(self.filters, (1, 1), name='conv1')(x),
                         relu=True)
    y = conv(self.filters, (3, 3), (self.strides, self.strides),
             padding=((1, 1), (1, 1)), name='conv2')(y)
    y = norm(name='bn2')(y, relu=True)
    y = conv(out, (1, 1), name='conv3')(y)
    if x.shape[-1] != out or self.strides != 1:
      x = conv(out, (1, 1), (self.strides, self.strides),
               name='downsample_conv')(x)
      x = norm(name='downsample_bn')(x)
    return norm(name='bn3', scale_init=(nn.initializers.zeros
                                        if self.zero_init_residual
                                        else nn.initializers.ones))(
                                            y, residual=x, relu=True)


# The ResNet stems: (kernel size, stride, standard padding) of the conv;
# 'imagenet' is followed by a 3x3/2 max-pool.
STEMS = {'imagenet': (7, 2, 3), 'cifar': (3, 1, 1)}


class ResNet(nn.Module):
  """ResNet backbone without the classifier: [B, H, W, C] -> [B, F].

  F = 8 * width * block.expansion (512 for ResNet-18, 2048 for ResNet-50 at
  width 64). Stage i has width * 2^i filters; stages 2-4 halve the map.

  Attributes:
    stage_sizes: blocks per stage, e.g. (2, 2, 2, 2) for ResNet-18.
    block_cls: BasicBlock or Bottleneck.
    width: filters of the stem and the first stage (64 in the papers; small
      values are for tests and CPU runs).
    stem: 'imagenet' (7x7/2 conv + 3x3/2 max-pool: 224 -> 56) or 'cifar'
      (3x3/1 conv, no pool: keeps 32x32, as in SimCLR/MACL/HCL on CIFAR).
    zero_init_residual: zero the last BN scale of every block, so that each
      residual branch outputs 0 at init and each block starts as the
      identity on its shortcut (Goyal et al. 2017): SimCLR's and SupCon's TF
      resnets (`init_zero=True`), MoCo v3 (torchvision
      `zero_init_residual=True`). False (torchvision's default): MoCo v2,
      SupContrast, lightly, solo-learn.
    conv_init: every conv kernel's initialisation, a CONV_INITS name
      (torchvision's 'kaiming_normal_fan_out' by default).
    stem_conv_init: the stem conv's initialisation where it differs from
      `conv_init` ('' = conv_init): HCL's and solo-learn's CIFAR ResNets
      replace torchvision's conv1 by a fresh nn.Conv2d, which keeps torch's
      default ('torch_default') while every other conv is kaiming.
    stem_padding: the stem conv's zero padding per side; 0 = the standard
      (3 for 'imagenet', 1 for 'cifar'). solo-learn's CIFAR conv1 pads 2,
      so its first maps are 34 x 34 rather than 32 x 32.
    dtype: compute dtype; parameters and BN statistics stay float32.
    bn_splits: > 0: every BatchNorm normalises that many groups of its batch
      separately in training (config.model.bn_splits).
    fused_bn: every BatchNorm with the ReLU and residual add after it, with
      the textbook backward (batch_norm.py; config.model.fused_bn).
  """
  stage_sizes: Sequence[int]
  block_cls: ModuleDef
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
            filters=self.width * 2**i,
            strides=2 if i > 0 and j == 0 else 1, dtype=self.dtype,
            zero_init_residual=self.zero_init_residual,
            bn_splits=self.bn_splits, fused_bn=self.fused_bn,
            conv_init=self.conv_init,
            name=f'stage{i + 1}_block{j}')(x, train=train)
    # Features in float32 whatever the compute dtype: kNN, probes and the
    # loss's normalisation want full precision.
    return jnp.mean(x, axis=(1, 2)).astype(jnp.float32)


ResNet18 = functools.partial(ResNet, stage_sizes=(2, 2, 2, 2),
                             block_cls=BasicBlock)
ResNet50 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3),
                             block_cls=Bottleneck)


class SmallAlexNet(nn.Module):
  """The AlexNet of CACR's small-scale experiments (= Wang & Isola 2020's).

  Five 3x3 convs (pad 1, no bias) with BN + ReLU, 3x3/2 VALID max-pools after
  conv1, conv2 and conv5 (32 -> 15 -> 7 -> 3; 28 -> 13 -> 6 -> 2), then fc6
  and fc7 (Dense without bias, BN, ReLU). Returns fc7, [B, fc_dim]: the
  paper's linear-probe feature. The paper's fc8 (Dense 4096 -> 128 with bias,
  the embedding the loss reads) is this project's projection head with
  `config.model.head_layers = 1`.

  Assumptions (the paper defers to Wang & Isola's code for the encoder):
  every conv is bias-free, as
  conv1 is in that code; weights are N(0, 0.02) as there; the flatten size
  follows the input (192*3*3 at 32 px, 192*2*2 at 28 px).

  Attributes:
    widths: channels of conv1..conv5 (96, 192, 384, 384, 192).
    fc_dim: width of fc6 and fc7 (4096).
    dtype: compute dtype; parameters stay float32.
  """
  widths: Sequence[int] = (96, 192, 384, 384, 192)
  fc_dim: int = 4096
  dtype: Any = jnp.float32
  bn_splits: int = 0              # config.model.bn_splits, .fused_bn.
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


ENCODERS.update({
    'resnet18': ResNet18,
    'resnet50': ResNet50,
    'alexnet_small': SmallAlexNet,
})
