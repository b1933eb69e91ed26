"""Encoders: shapes, parameter counts against hand counts, BN modes, bf16;
the projection head's final BatchNorm against numpy."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import base as base_config
from contrastive_jax import models
from contrastive_jax import step as step_lib

# Tiny widths so every forward pass compiles in seconds on CPU.
TINY = {
    'small_cnn': dict(widths=(4, 8)),
    'resnet18': dict(width=4),
    'resnet50': dict(width=4),
    'alexnet_small': dict(widths=(4, 8, 8, 8, 4), fc_dim=16),
}
# Feature width of each tiny encoder: last SmallCNN width; ResNets 8 * width
# * expansion (1 for BasicBlock, 4 for Bottleneck); AlexNet fc7.
TINY_FEATURES = {'small_cnn': 8, 'resnet18': 32, 'resnet50': 128,
                 'alexnet_small': 16}



def _model_config(**model):
  """configs/base.py's config with `model` fields replaced (encoder_kwargs
  wholesale): create_model reads a complete config."""
  config = base_config.get_config()
  config.model.encoder_kwargs = ml_collections.ConfigDict(
      model.pop('encoder_kwargs'))
  config.model.update(model)
  return config

def _init(module, shape, seed=0):
  return module.init(jax.random.key(seed), jnp.zeros(shape), train=False)


def _count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


# (encoder, stem): only the ResNets have a stem option.
SHAPE_CASES = [('small_cnn', None), ('alexnet_small', None),
               ('resnet18', 'imagenet'), ('resnet18', 'cifar'),
               ('resnet50', 'imagenet'), ('resnet50', 'cifar')]


@pytest.mark.parametrize('name,stem', SHAPE_CASES)
@pytest.mark.parametrize('shape', [(3, 28, 28, 1), (3, 32, 32, 3)])
def test_feature_shapes(name, stem, shape):
  kwargs = dict(TINY[name])
  if stem is not None:
    kwargs['stem'] = stem
  enc = models.ENCODERS[name](**kwargs)
  x = jax.random.uniform(jax.random.key(1), shape)
  variables = _init(enc, shape)
  h = enc.apply(variables, x, train=False)
  assert h.shape == (shape[0], TINY_FEATURES[name])
  assert h.dtype == jnp.float32
  assert np.all(np.isfinite(h))


@pytest.mark.parametrize('stem,last_map', [('imagenet', 1), ('cifar', 4)])
def test_resnet_stems_set_the_resolution(stem, last_map):
  # 32 px: the ImageNet stem divides by 4 (conv/2, pool/2) and stages 2-4 by
  # 8 more -> 1x1; the CIFAR stem keeps 32, stages give 32/8 = 4.
  enc = models.ResNet18(width=4, stem=stem)
  variables = _init(enc, (2, 32, 32, 3))
  _, inter = enc.apply(variables, jnp.zeros((2, 32, 32, 3)), train=False,
                       capture_intermediates=True)
  last = inter['intermediates']['stage4_block1']['__call__'][0]
  assert last.shape == (2, last_map, last_map, 32)
  k = 7 if stem == 'imagenet' else 3
  assert variables['params']['conv_stem']['kernel'].shape == (k, k, 3, 4)


def _resnet_param_count(stage_sizes, bottleneck, *, width=64, in_ch=3,
                        stem_k=7):
  """Counts conv kernels and BN (scale, bias) of a torchvision ResNet."""
  n = stem_k * stem_k * in_ch * width + 2 * width       # stem conv + BN
  c_in = width
  for i, blocks in enumerate(stage_sizes):
    f = width * 2**i
    for j in range(blocks):
      if bottleneck:
        out = 4 * f
        n += c_in * f + 9 * f * f + f * out + 2 * (f + f + out)
      else:
        out = f
        n += 9 * c_in * f + 9 * f * f + 2 * (f + f)
      if c_in != out or (i > 0 and j == 0):            # projection shortcut
        n += c_in * out + 2 * out
      c_in = out
  return n


def test_resnet_hand_count_matches_torchvision():
  # torchvision resnet18/50 have 11,689,512 / 25,557,032 parameters including
  # the 1000-way fc (F * 1000 weights + 1000 biases).
  assert _resnet_param_count((2, 2, 2, 2), False) == 11_689_512 - 513_000
  assert _resnet_param_count((3, 4, 6, 3), True) == 25_557_032 - 2_049_000


@pytest.mark.parametrize('name,stage_sizes,bottleneck,expected', [
    ('resnet18', (2, 2, 2, 2), False, 11_176_512),
    ('resnet50', (3, 4, 6, 3), True, 23_508_032),
])
@pytest.mark.parametrize('stem', ['imagenet', 'cifar'])
def test_full_size_parameter_counts(name, stage_sizes, bottleneck, expected,
                                    stem):
  enc = models.ENCODERS[name](stem=stem)
  # eval_shape: shapes only, no compile or allocation of 25M parameters.
  variables = jax.eval_shape(functools.partial(_init, enc, (1, 224, 224, 3)))
  stem_k = 7 if stem == 'imagenet' else 3
  count = _count(variables['params'])
  assert count == _resnet_param_count(stage_sizes, bottleneck, stem_k=stem_k)
  if stem == 'imagenet':
    assert count == expected
  else:
    # Only the stem kernel changes: (7*7 - 3*3) * 3 * 64 fewer weights.
    assert count == expected - 40 * 3 * 64
  # Running statistics: mean and var for every BN channel (= BN params).
  assert _count(variables['batch_stats']) == sum(
      _count(v) for k, v in _flatten(variables['params']).items()
      if k[-1] in ('scale', 'bias'))


def _flatten(tree, prefix=()):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flatten(v, prefix + (k,)))
    else:
      out[prefix + (k,)] = v
  return out


def test_alexnet_small_full_size_parameter_count():
  # conv1..5 (3x3, no bias) + BN, fc6 (192*3*3 -> 4096) and fc7 (4096 ->
  # 4096) without bias + BN1d: the CACR / Wang & Isola encoder at 32 px.
  chans = [3, 96, 192, 384, 384, 192]
  expected = sum(9 * a * b + 2 * b for a, b in zip(chans[:-1], chans[1:]))
  expected += 192 * 3 * 3 * 4096 + 2 * 4096 + 4096 * 4096 + 2 * 4096
  variables = jax.eval_shape(functools.partial(
      _init, models.SmallAlexNet(), (1, 32, 32, 3)))
  assert _count(variables['params']) == expected
  assert variables['params']['fc6']['kernel'].shape == (192 * 9, 4096)


def test_batchnorm_train_uses_batch_statistics_and_updates_running_ones():
  enc = models.ResNet18(width=4, stem='cifar')
  shape = (6, 8, 8, 3)
  x = jax.random.normal(jax.random.key(2), shape) * 3. + 1.
  variables = _init(enc, shape)
  # Stem conv output computed independently with lax.conv.
  kernel = variables['params']['conv_stem']['kernel']
  conv = jax.lax.conv_general_dilated(
      x, kernel, (1, 1), ((1, 1), (1, 1)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  _, updated = enc.apply(variables, x, train=True, mutable=['batch_stats'])
  stats = updated['batch_stats']['bn_stem']
  # momentum 0.9 from the initial (mean 0, var 1).
  np.testing.assert_allclose(stats['mean'], 0.1 * conv.mean((0, 1, 2)),
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(stats['var'],
                             0.9 + 0.1 * conv.var((0, 1, 2)), rtol=1e-4)

  # Eval mode: per-example outputs do not depend on the rest of the batch;
  # train mode (batch statistics) they do.
  def per_example(train, batch):
    out = enc.apply(variables, batch, train=train,
                    mutable=['batch_stats'] if train else False)
    return (out[0] if train else out)[0]

  other = x.at[1:].set(x[1:] * 5.)
  np.testing.assert_allclose(per_example(False, x), per_example(False, other),
                             rtol=1e-5, atol=1e-6)
  assert not np.allclose(per_example(True, x), per_example(True, other),
                         atol=1e-3)
  # Eval mode with fresh statistics (mean 0, var 1) differs from train mode.
  assert not np.allclose(per_example(False, x), per_example(True, x),
                         atol=1e-3)


@pytest.mark.parametrize('name', ['resnet18', 'resnet50', 'alexnet_small'])
def test_bfloat16_compute_keeps_float32_params_and_features(name):
  shape = (4, 16, 16, 3)
  x = jax.random.uniform(jax.random.key(3), shape)
  fp32 = models.ENCODERS[name](**TINY[name])
  bf16 = models.ENCODERS[name](**TINY[name], dtype=jnp.bfloat16)
  variables = _init(fp32, shape)
  assert jax.tree.structure(variables) == jax.tree.structure(
      _init(bf16, shape))
  assert all(p.dtype == jnp.float32
             for p in jax.tree.leaves(_init(bf16, shape)))
  ref = fp32.apply(variables, x, train=False)
  got = bf16.apply(variables, x, train=False)
  assert got.dtype == jnp.float32
  # bf16 has an 8-bit mantissa (rel. error ~4e-3 per op); a few layers stay
  # within a few percent of the norm but are not bit-identical.
  err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
  assert 0 < err < 0.05


@pytest.mark.parametrize('name', sorted(TINY))
def test_create_model_by_name(name):
  config = _model_config(**{
      'encoder': name, 'encoder_kwargs': TINY[name], 'head_hidden_dim': 8,
      'head_out_dim': 5, 'head_layers': 3})
  model = models.create_model(config)
  variables = _init(model, (2, 28, 28, 1))
  out = model.apply(variables, jnp.ones((2, 28, 28, 1)), train=False)
  assert out['features'].shape == (2, TINY_FEATURES[name])
  assert out['projection'].shape == (2, 5)
  assert set(variables['params']['head']) == {'dense0', 'bn0', 'dense1',
                                              'bn1', 'dense2'}


@pytest.mark.parametrize('shape,kernel,padding', [
    ((3, 9, 9, 1), (3, 3, 1, 5), 'SAME'),
    ((2, 7, 6, 4), (3, 3, 4, 6), 'SAME'),
    ((2, 7, 6, 4), (3, 3, 4, 6), 'VALID'),
    ((2, 8, 8, 3), (5, 3, 3, 2), ((2, 1), (0, 3))),
])
def test_cpu_conv_is_the_convolution_and_its_gradient(shape, kernel, padding):
  # The CPU path (XLA's convolution forward, im2col matmuls backward) against
  # XLA's convolution (jax.lax) and its autodiff, values and both gradients:
  # the same sums, reassociated.
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  k = jnp.asarray(rng.standard_normal(kernel), jnp.float32)
  dn = jax.lax.conv_dimension_numbers(shape, kernel, ('NHWC', 'HWIO', 'NHWC'))

  def loss(conv, x, k):
    y = conv(x, k, (1, 1), padding, dimension_numbers=dn)
    return jnp.sum(jnp.sin(y)), y

  grad = lambda conv: jax.grad(functools.partial(loss, conv), argnums=(0, 1),
                               has_aux=True)
  # On CPU (the tests' backend) the gradient has one convolution, the
  # forward's, and the two transposes are matmuls; autodiff of the plain
  # convolution has three convolutions and no matmul.
  for conv, convs, dots in ((models.cpu_conv, 1, 2),
                            (jax.lax.conv_general_dilated, 3, 0)):
    jaxpr = str(jax.make_jaxpr(grad(conv))(x, k))
    assert (jaxpr.count('conv_general_dilated['), jaxpr.count('dot_general[')
            ) == (convs, dots), jaxpr
  (gx, gk), y = jax.jit(grad(models.cpu_conv))(x, k)
  (wx, wk), want = jax.jit(grad(jax.lax.conv_general_dilated))(x, k)
  for got, ref in ((y, want), (gx, wx), (gk, wk)):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_cpu_conv_leaves_other_convs_to_xla():
  # Strided: plain XLA (no custom gradient), and still the convolution.
  x = jnp.ones((1, 8, 8, 2))
  k = jnp.ones((3, 3, 2, 4))
  dn = jax.lax.conv_dimension_numbers(x.shape, k.shape,
                                      ('NHWC', 'HWIO', 'NHWC'))
  conv = functools.partial(models.cpu_conv, window_strides=(2, 2),
                           padding='SAME', dimension_numbers=dn)
  assert 'conv_general_dilated' in str(jax.make_jaxpr(conv)(x, k))
  got = conv(x, k)
  assert got.shape == (1, 4, 4, 4)
  np.testing.assert_allclose(got, jax.lax.conv_general_dilated(
      x, k, (2, 2), 'SAME', dimension_numbers=dn))


@pytest.mark.parametrize('head_input', ['pooled', 'features'])
def test_head_input_chooses_what_the_head_reads(head_input):
  # A one-layer head is x @ W + b, so the projection can be recomputed in
  # numpy from the map: its spatial mean ('pooled') or the flattened map that
  # `features` holds ('features').
  config = _model_config(**{
      'encoder': 'small_cnn', 'head_input': head_input,
      'encoder_kwargs': {'widths': (4, 8), 'pool': 'none'},
      'head_hidden_dim': 8, 'head_out_dim': 5, 'head_layers': 1})
  model = models.create_model(config)
  x = jax.random.uniform(jax.random.key(4), (3, 28, 28, 1))
  variables = _init(model, x.shape)
  out = model.apply(variables, x, train=False)
  features = np.asarray(out['features'])
  assert features.shape == (3, 14 * 14 * 8)   # one pool between stages
  head_in = (features.reshape(3, 14 * 14, 8).mean(axis=1)
             if head_input == 'pooled' else features)
  dense = variables['params']['head']['dense0']
  expected = head_in @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])
  np.testing.assert_allclose(out['projection'], expected, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('head_input', ['pooled', 'features'])
def test_normalize_head_input_feeds_the_head_the_unit_rows(head_input):
  # The SupCon TF code's --normalize_embedding: the head reads each row of
  # its input divided by its L2 norm. Recomputed in numpy (float64) from
  # the map through the one-layer head; `features` is the raw map either
  # way, equal to the unnormalised model's with the same variables.
  kw = {'encoder': 'small_cnn', 'head_input': head_input,
        'encoder_kwargs': {'widths': (4, 8), 'pool': 'none'},
        'head_hidden_dim': 8, 'head_out_dim': 5, 'head_layers': 1}
  model = models.create_model(_model_config(**kw,
                                            normalize_head_input=True))
  plain = models.create_model(_model_config(**kw))
  assert model.normalize_head_input and not plain.normalize_head_input
  # Pixels up to 10 (eval-mode BN at its initial statistics passes the
  # scale on), so that no row of the head's input has norm near 1.
  x = 10. * jax.random.uniform(jax.random.key(5), (3, 28, 28, 1))
  variables = _init(model, x.shape)
  out = model.apply(variables, x, train=False)
  ref = plain.apply(variables, x, train=False)
  features = np.asarray(out['features'], np.float64)
  np.testing.assert_array_equal(out['features'], ref['features'])
  head_in = (features.reshape(3, 14 * 14, 8).mean(axis=1)
             if head_input == 'pooled' else features)
  unit = head_in / np.linalg.norm(head_in, axis=1, keepdims=True)
  dense = variables['params']['head']['dense0']
  expected = unit @ np.asarray(dense['kernel']) + np.asarray(dense['bias'])
  np.testing.assert_allclose(out['projection'], expected, rtol=1e-5,
                             atol=1e-6)
  # The norms are far from 1, so the unnormalised head gives other values.
  assert np.linalg.norm(head_in, axis=1).min() > 2.
  assert not np.allclose(ref['projection'], expected, atol=1e-3)


def test_unknown_head_input_is_an_error_naming_the_choices():
  config = _model_config(**{
      'encoder': 'small_cnn', 'head_input': 'flat',
      'encoder_kwargs': {'widths': (4, 8), 'pool': 'none'},
      'head_hidden_dim': 8, 'head_out_dim': 5, 'head_layers': 1})
  with pytest.raises(ValueError, match="head_input='flat'.*pooled, features"):
    models.create_model(config)


def _np_bn(x, eps=1e-5):
  """BatchNorm in training mode, numpy: per-feature batch mean and biased
  variance."""
  return (x - x.mean(0)) / np.sqrt(x.var(0) + eps)


@pytest.mark.parametrize('scale,center', [(True, True), (True, False),
                                          (False, False)])
def test_head_final_bn_normalises_the_output_per_feature(scale, center):
  # lightly's SimCLRProjectionHead (scale and offset), SimCLR's code (scale
  # only), MoCo v3's projector (BatchNorm1d(affine=False)): the last Dense
  # has no bias, the output is BN(h W1) per feature over the batch, then
  # x gamma + beta where learned. Reference: the head written in numpy.
  head = models.ProjectionHead(hidden_dim=8, out_dim=5, num_layers=2,
                               final_bn=True, final_bn_scale=scale,
                               final_bn_center=center)
  x = np.asarray(jax.random.normal(jax.random.key(4), (16, 12))) * 2. + 1.
  variables = head.init(jax.random.key(0), jnp.zeros((2, 12)), train=False)
  params = jax.tree.map(np.asarray, variables['params'])
  assert 'bias' not in params['dense1']
  assert set(params.get('bn1', {})) == ({'scale'} if scale else set()) | (
      {'bias'} if center else set())
  assert set(variables['batch_stats']['bn1']) == {'mean', 'var'}
  # Learned values away from their init (1, 0), so both must be applied.
  gamma, beta = np.full(5, 1.), np.zeros(5)
  if scale:
    gamma = params['bn1']['scale'] = np.linspace(0.5, 2., 5, dtype=np.float32)
  if center:
    beta = params['bn1']['bias'] = np.linspace(-1., 1., 5, dtype=np.float32)
  out, updated = head.apply(
      {'params': params, 'batch_stats': variables['batch_stats']}, x,
      train=True, mutable=['batch_stats'])
  x64 = x.astype(np.float64)
  hidden = np.maximum(
      _np_bn(x64 @ params['dense0']['kernel']) * params['bn0']['scale']
      + params['bn0']['bias'], 0.)
  z = hidden @ params['dense1']['kernel']
  want = _np_bn(z) * gamma + beta
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
  # Before the scale and offset: zero mean and (almost, eps) unit variance.
  normalised = (np.asarray(out) - beta) / gamma
  np.testing.assert_allclose(normalised.mean(0), 0., atol=1e-5)
  np.testing.assert_allclose(normalised.var(0), z.var(0) / (z.var(0) + 1e-5),
                             rtol=1e-4)
  np.testing.assert_allclose(updated['batch_stats']['bn1']['mean'],
                             0.1 * z.mean(0), rtol=1e-4, atol=1e-6)


def test_head_without_final_bn_is_the_default_and_the_predictor_never_has_it():
  # configs/base.py: the head's last Dense keeps its bias, no BN after it.
  config = base_config.get_config()
  assert not config.model.head_final_bn
  variables = jax.eval_shape(lambda: _init(models.create_model(config),
                                           (2, 28, 28, 1)))
  head = variables['params']['head']
  assert set(head) == {'dense0', 'bn0', 'dense1'}
  assert set(head['dense1']) == {'kernel', 'bias'}
  assert set(variables['batch_stats']['head']) == {'bn0'}
  # With head_final_bn, the projector gets it and MoCo v3's predictor not.
  config.method, config.loss = 'moco', 'infonce'
  config.moco.predictor_hidden_dim = 8
  config.model.head_final_bn = True
  variables = jax.eval_shape(lambda: _init(step_lib.create_model(config),
                                           (2, 28, 28, 1)))
  assert 'bn1' in variables['params']['base']['head']
  assert 'bias' not in variables['params']['base']['head']['dense1']
  assert set(variables['params']['predictor']) == {'dense0', 'bn0', 'dense1'}
  assert set(variables['batch_stats']['predictor']) == {'bn0'}


# --- Initialisation: zero-init residual, conv and head inits --------------
# (configs/papers/recipes.yaml rows encoder.zero_init_residual,
# encoder.conv_init, head.init). The references are the distributions'
# own moments and bounds, written from torch's and TF's definitions.


def _branch_outputs(block, variables, x):
  """The block's output and its residual branch's (the last BN's, before
  the add and ReLU it is fused with) output, in training mode: the last
  conv's output normalised by its batch statistics in numpy."""
  conv, bn = (('conv2', 'bn2') if isinstance(block, models.BasicBlock)
              else ('conv3', 'bn3'))
  (out, state) = block.apply(
      variables, x, train=True, mutable=['batch_stats', 'intermediates'],
      capture_intermediates=lambda mdl, _: mdl.name == conv)
  (c,) = state['intermediates'][conv]['__call__']
  c = np.asarray(c, np.float64)
  p = variables['params'][bn]
  branch = ((c - c.mean((0, 1, 2))) / np.sqrt(c.var((0, 1, 2)) + 1e-5)
            * np.asarray(p['scale']) + np.asarray(p['bias']))
  return np.asarray(out), branch


@pytest.mark.parametrize('block_cls,filters', [(models.BasicBlock, 8),
                                               (models.Bottleneck, 2)])
def test_zero_init_residual_makes_each_block_the_identity_at_init(block_cls,
                                                                  filters):
  # An identity-shortcut block (Cin = expansion x filters, stride 1) on a
  # post-ReLU input: with the last BN's scale 0 its residual branch outputs
  # 0 and the block returns relu(x + 0) = x (SimCLR's init_zero, torchvision
  # zero_init_residual=True).
  x = jnp.abs(jax.random.normal(jax.random.key(5), (4, 6, 6, 8)))
  block = block_cls(filters=filters, zero_init_residual=True)
  variables = block.init(jax.random.key(0), x, train=False)
  last = 'bn2' if block_cls is models.BasicBlock else 'bn3'
  np.testing.assert_array_equal(variables['params'][last]['scale'], 0.)
  for name, p in variables['params'].items():
    if name.startswith('bn') and name != last:
      np.testing.assert_array_equal(p['scale'], 1.)
  out, branch = _branch_outputs(block, variables, x)
  np.testing.assert_array_equal(branch, 0.)
  np.testing.assert_array_equal(out, x)
  # Without it (torchvision's default) the branch is a unit-variance BN
  # output and the block is not the identity.
  plain = block_cls(filters=filters)
  out, branch = _branch_outputs(plain,
                                plain.init(jax.random.key(0), x, train=False),
                                x)
  assert np.abs(branch).mean() > 0.5
  assert not np.allclose(out, x, atol=1e-2)


def test_zero_init_residual_downsampling_block_is_its_shortcut():
  # A strided block with a projection shortcut: at init its output is
  # relu(BN(conv1x1_stride2(x))), the shortcut alone, computed here with
  # lax.conv and BN's eval-mode formula at the initial statistics (mean 0,
  # var 1, scale 1, offset 0).
  x = jax.random.normal(jax.random.key(6), (3, 8, 8, 4))
  block = models.BasicBlock(filters=8, strides=2, zero_init_residual=True)
  variables = block.init(jax.random.key(1), x, train=False)
  kernel = variables['params']['downsample_conv']['kernel']
  shortcut = jax.lax.conv_general_dilated(
      x, kernel, (2, 2), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  want = np.maximum(np.asarray(shortcut) / np.sqrt(1. + 1e-5), 0.)
  got = block.apply(variables, x, train=False)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_zero_init_residual_reaches_every_block_through_the_config():
  config = _model_config(**{
      'encoder': 'resnet18', 'head_hidden_dim': 8, 'head_out_dim': 4,
      'encoder_kwargs': {'width': 4, 'stem': 'cifar',
                         'zero_init_residual': True}})
  params = _init(models.create_model(config), (2, 8, 8, 3))['params']
  encoder = params['encoder']
  blocks = [k for k in encoder if k.startswith('stage')]
  assert len(blocks) == 8
  for name in blocks:
    np.testing.assert_array_equal(encoder[name]['bn2']['scale'], 0.)
    np.testing.assert_array_equal(encoder[name]['bn1']['scale'], 1.)
  np.testing.assert_array_equal(encoder['bn_stem']['scale'], 1.)


def _conv_kernels(conv_init, width=16):
  enc = models.ResNet18(width=width, stem='imagenet', conv_init=conv_init)
  params = _init(enc, (1, 32, 32, 3))['params']
  return [np.asarray(leaf, np.float64) for path, leaf in
          jax.tree.flatten_with_path(params)[0]
          if path[-1].key == 'kernel']


@pytest.mark.parametrize('conv_init', ['kaiming_normal_fan_out',
                                       'torch_default', 'lecun_normal'])
def test_conv_init_draws_have_the_reference_variance_and_bounds(conv_init):
  # Every conv of a width-16 ResNet-18 (7x7 stem, 3x3 and 1x1 convs; HWIO),
  # each kernel's draws scaled by the reference standard deviation:
  #   kaiming_normal_fan_out  torch kaiming_normal_(mode='fan_out'):
  #                           N(0, 2 / (kh kw Cout)), untruncated;
  #   torch_default           nn.Conv2d: U(+-b), b = 1 / sqrt(kh kw Cin),
  #                           variance b^2 / 3;
  #   lecun_normal            TF1 variance_scaling_initializer(): normal
  #                           truncated at 2 sigma', sigma' = sqrt(1 /
  #                           (kh kw Cin)) / 0.87962566, variance 1 / fan_in.
  kernels = _conv_kernels(conv_init)
  assert len(kernels) == 1 + 16 + 3       # stem, 2 per block, 3 shortcuts
  scaled, worst = [], 0.
  for w in kernels:
    kh, kw, cin, cout = w.shape
    if conv_init == 'kaiming_normal_fan_out':
      std = np.sqrt(2. / (kh * kw * cout))
    elif conv_init == 'torch_default':
      bound = 1. / np.sqrt(kh * kw * cin)
      assert np.abs(w).max() <= bound
      std = bound / np.sqrt(3.)
    else:
      std = np.sqrt(1. / (kh * kw * cin))
      assert np.abs(w).max() <= 2. * std / 0.87962566103423978
    z = (w / std).ravel()
    worst = max(worst, np.abs(z).max())
    scaled.append(z)
  z = np.concatenate(scaled)
  assert z.size > 500_000
  assert abs(z.mean()) < 0.01
  np.testing.assert_allclose(np.mean(z**2), 1., rtol=0.01)
  # The shape of the distribution: untruncated normals reach past 4 sigma
  # in half a million draws; the truncated one stops at 2 / 0.8796 = 2.27
  # sigma; the uniform at sqrt(3).
  want_max = {'kaiming_normal_fan_out': (4., np.inf),
              'torch_default': (0.99 * np.sqrt(3.), np.sqrt(3.)),
              'lecun_normal': (2.2, 2. / 0.87962566103423978)}[conv_init]
  assert want_max[0] < worst <= want_max[1] + 1e-6


def test_a_fresh_cifar_stem_has_its_own_init_and_padding():
  # HCL's / solo-learn's CIFAR conv1: a fresh nn.Conv2d(3, 64, 3, 1, pad,
  # bias=False) at torch's default init, every other conv kaiming fan_out.
  enc = models.ResNet18(width=16, stem='cifar',
                        conv_init='kaiming_normal_fan_out',
                        stem_conv_init='torch_default', stem_padding=2)
  x = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3))
  variables = _init(enc, x.shape)
  stem = np.asarray(variables['params']['conv_stem']['kernel'], np.float64)
  bound = 1. / np.sqrt(3 * 3 * 3)                  # U(+-1 / sqrt(fan_in))
  assert stem.shape == (3, 3, 3, 16) and np.abs(stem).max() <= bound
  assert np.abs(stem).max() > 0.9 * bound
  block = np.asarray(variables['params']['stage1_block0']['conv1']['kernel'])
  assert np.abs(block).max() > 1.5 * np.sqrt(2. / (3 * 3 * 16))  # normal
  # The stem's output is the conv with padding 2: 34 x 34 maps, equal to
  # lax's convolution of the same kernel.
  _, state = enc.apply(variables, x, train=False,
                       capture_intermediates=True, mutable=['intermediates'])
  out = state['intermediates']['conv_stem']['__call__'][0]
  want = jax.lax.conv_general_dilated(
      x, jnp.asarray(stem, jnp.float32), (1, 1), ((2, 2), (2, 2)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  assert out.shape == (2, 34, 34, 16)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  # The default keeps the stem's standard padding and the shared init.
  plain = models.ResNet18(width=16, stem='cifar')
  _, state = plain.apply(_init(plain, x.shape), x, train=False,
                         capture_intermediates=True, mutable=['intermediates'])
  assert state['intermediates']['conv_stem']['__call__'][0].shape == (
      2, 32, 32, 16)
  with pytest.raises(ValueError, match='stem_padding=-1'):
    _init(models.ResNet18(width=4, stem='cifar', stem_padding=-1),
          (1, 8, 8, 3))


def test_unknown_conv_init_is_an_error_naming_the_choices():
  enc = models.ResNet18(width=4, stem='cifar', conv_init='xavier')
  with pytest.raises(ValueError, match="conv_init='xavier'.*"
                     'kaiming_normal_fan_out, torch_default, lecun_normal'):
    _init(enc, (1, 8, 8, 3))


def _head_params(init, fan_in=512, hidden=256, out=128):
  head = models.ProjectionHead(hidden_dim=hidden, out_dim=out, num_layers=2,
                               batch_norm=False, dense_init=init)
  params = head.init(jax.random.key(7), jnp.zeros((2, fan_in)),
                     train=False)['params']
  return {layer: {k: np.asarray(v, np.float64) for k, v in p.items()}
          for layer, p in params.items()}


@pytest.mark.parametrize('init', ['lecun_normal', 'torch_default',
                                  'normal_0.01', 'glorot_uniform'])
def test_head_init_draws_have_the_reference_variance_and_bounds(init):
  # A 512-256-128 head without BatchNorm (both Dense layers with a bias).
  #   lecun_normal    Flax's default: truncated normal, variance 1 / fan_in,
  #                   bias 0;
  #   torch_default   nn.Linear: kernel and bias U(+-1 / sqrt(fan_in));
  #   normal_0.01     tf.random_normal_initializer(stddev=.01), bias 0;
  #   glorot_uniform  U(+-sqrt(6 / (fan_in + fan_out))), bias 0.
  params = _head_params(init)
  for layer, (fan_in, fan_out) in (('dense0', (512, 256)),
                                   ('dense1', (256, 128))):
    w, b = params[layer]['kernel'], params[layer]['bias']
    assert w.shape == (fan_in, fan_out)
    if init == 'torch_default':
      bound = 1. / np.sqrt(fan_in)
      var, lim = bound**2 / 3., bound
    elif init == 'glorot_uniform':
      bound = np.sqrt(6. / (fan_in + fan_out))
      var, lim = bound**2 / 3., bound
    elif init == 'lecun_normal':
      var = 1. / fan_in
      lim = 2. * np.sqrt(var) / 0.87962566103423978
    else:
      var, lim = 0.01**2, np.inf
    np.testing.assert_allclose(np.mean(w**2), var, rtol=0.03)
    assert abs(w.mean()) < 0.02 * np.sqrt(var)
    assert np.abs(w).max() <= lim
    if init in ('torch_default', 'glorot_uniform'):
      assert np.abs(w).max() > 0.99 * lim     # Uniform up to its bound.
    if init == 'normal_0.01':
      # Untruncated: some of 32k-131k draws lie past 3 sigma.
      assert np.abs(w).max() > 0.035
    if init == 'torch_default':
      # The bias too: U(+-1 / sqrt(fan_in)) of its own layer.
      assert np.abs(b).max() <= 1. / np.sqrt(fan_in)
      assert np.abs(b).max() > 0.9 / np.sqrt(fan_in)
      np.testing.assert_allclose(np.mean(b**2), 1. / (3. * fan_in),
                                 rtol=0.3)
    else:
      np.testing.assert_array_equal(b, 0.)


def test_head_init_reaches_the_head_and_the_predictor_through_the_config():
  config = _model_config(**{
      'encoder': 'small_cnn', 'encoder_kwargs': {'widths': (4, 8),
                                                 'pool': 'none'},
      'head_hidden_dim': 16, 'head_out_dim': 6, 'head_init': 'torch_default'})
  config.method, config.loss = 'moco', 'infonce'
  config.moco.predictor_hidden_dim = 12
  params = _init(step_lib.create_model(config), (2, 28, 28, 1))['params']
  head, predictor = params['base']['head'], params['predictor']
  # The head's last Dense (fan_in 16) and the predictor's (fan_in 12) carry
  # nn.Linear's U(+-1 / sqrt(fan_in)) bias; Flax's default would be 0.
  for dense, fan_in in ((head['dense1'], 16), (predictor['dense1'], 12)):
    b = np.asarray(dense['bias'])
    assert 0 < np.abs(b).max() <= 1. / np.sqrt(fan_in)
    assert np.abs(np.asarray(dense['kernel'])).max() <= 1. / np.sqrt(fan_in)
  # configs/base.py keeps Flax's default.
  assert base_config.get_config().model.head_init == 'lecun_normal'


def test_unknown_head_init_is_an_error_naming_the_choices():
  config = _model_config(**{
      'encoder': 'small_cnn', 'head_init': 'he',
      'encoder_kwargs': {'widths': (4, 8), 'pool': 'none'}})
  with pytest.raises(ValueError, match="head_init='he'.*lecun_normal, "
                     'torch_default, normal_0.01, glorot_uniform'):
    models.create_model(config)


# The reference codes' transforms.Normalize statistics, typed here from the
# sources (configs/papers/recipes.yaml rows `model.input_norm`), not read
# from models.INPUT_NORMS.
REFERENCE_NORMS = {
    'imagenet': ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    'cifar10': ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
    'cifar100': ([0.5071, 0.4867, 0.4408], [0.2675, 0.2565, 0.2761]),
    'cifar10_solo': ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
    'cifar100_solo': ([0.5071, 0.4865, 0.4409], [0.2673, 0.2564, 0.2762]),
    'half': ([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
    'symmetric': ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),
}


def _norm_config(input_norm, dtype='float32'):
  return _model_config(**{
      'encoder': 'resnet18', 'encoder_kwargs': TINY['resnet18'],
      'head_hidden_dim': 8, 'head_out_dim': 5, 'input_norm': input_norm,
      'dtype': dtype})


def _np_normalised(x, name):
  mean, std = (np.asarray(v, np.float32) for v in REFERENCE_NORMS[name])
  return (np.asarray(x, np.float32) - mean) / std


def test_input_norms_are_the_reference_statistics():
  assert set(models.INPUT_NORMS) == set(REFERENCE_NORMS) | {'none'}
  assert models.INPUT_NORMS['none'] is None
  for name, (mean, std) in REFERENCE_NORMS.items():
    assert models.INPUT_NORMS[name] == (tuple(mean), tuple(std)), name


@pytest.mark.parametrize('name', sorted(REFERENCE_NORMS))
@pytest.mark.parametrize('train', [False, True])
def test_input_norm_is_the_model_on_numpy_normalised_images(name, train):
  x = np.random.default_rng(0).uniform(size=(4, 8, 8, 3)).astype(np.float32)
  normed = models.create_model(_norm_config(name))
  plain = models.create_model(_norm_config('none'))
  variables = _init(normed, x.shape)   # No parameters of its own: the same
  assert (jax.tree.structure(variables)                      # tree.
          == jax.tree.structure(_init(plain, x.shape)))
  run = lambda m, v: m.apply(variables, v, train=train,
                             mutable=['batch_stats'] if train else False)
  got, want = run(normed, x), run(plain, _np_normalised(x, name))
  # Outputs and (in training) the updated BatchNorm statistics. Training
  # BN over a batch of 4 amplifies the inputs' last-ulp differences (XLA may
  # divide by multiplying with 1 / std) through the layers: a relative
  # error bound on each array there.
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    if train:
      assert np.linalg.norm(g - w) <= 1e-4 * np.linalg.norm(w)
    else:
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
  # And it changes the output: the normalisation is not a no-op.
  assert not np.allclose(got[0]['features'] if train else got['features'],
                         (run(plain, x)[0] if train else run(plain, x))[
                             'features'], atol=1e-3)


def test_input_norm_runs_in_float32_before_the_bfloat16_cast():
  # The bf16 model on [0, 1] images equals the bf16 model without the
  # normalisation fed the float32 numpy-normalised images, bit for bit: the
  # subtraction and division are float32, the encoder's cast comes after.
  x = np.random.default_rng(1).uniform(size=(2, 8, 8, 3)).astype(np.float32)
  normed = models.create_model(_norm_config('imagenet', 'bfloat16'))
  plain = models.create_model(_norm_config('none', 'bfloat16'))
  variables = _init(normed, x.shape)
  got = normed.apply(variables, x, train=False)
  want = plain.apply(variables, _np_normalised(x, 'imagenet'), train=False)
  np.testing.assert_allclose(got['features'], want['features'],
                             rtol=1e-6, atol=1e-6)
  assert got['features'].dtype == jnp.float32


def test_input_norm_reaches_the_predictor_wrapped_model():
  # step.create_model wraps the model (MoCo v3's predictor): the wrapped
  # model normalises too.
  config = _norm_config('cifar10')
  config.method = 'moco'
  config.moco.predictor_hidden_dim = 8
  x = np.random.default_rng(2).uniform(size=(2, 8, 8, 3)).astype(np.float32)
  model = step_lib.create_model(config)
  variables = _init(model, x.shape)
  config.model.input_norm = 'none'
  plain = step_lib.create_model(config)
  got = model.apply(variables, x, train=False)
  want = plain.apply(variables, _np_normalised(x, 'cifar10'), train=False)
  np.testing.assert_allclose(got['prediction'], want['prediction'],
                             rtol=1e-5, atol=1e-5)


def test_unknown_input_norm_is_an_error_naming_the_choices():
  with pytest.raises(ValueError,
                     match="input_norm='cifar'; known: none, imagenet, "
                           'cifar10, cifar100'):
    models.create_model(_norm_config('cifar'))


def test_input_norm_channels_must_be_the_images():
  model = models.create_model(_norm_config('imagenet'))
  with pytest.raises(ValueError, match='input_norm has 3 channels.*have 1'):
    _init(model, (2, 8, 8, 1))
  # 'none' reads any channel count.
  _init(models.create_model(_norm_config('none')), (2, 8, 8, 1))


# --- The 3x3 / stride-2 max-pool with a mask-built gradient ---------------


@pytest.mark.parametrize('padding,shape', [(1, (2, 8, 8, 3)),
                                           (1, (2, 7, 9, 3)),
                                           (0, (2, 15, 15, 2)),
                                           (0, (2, 8, 11, 2))])
def test_max_pool_3x3_s2_equals_nn_max_pool_and_its_gradient(padding, shape):
  # Reference: nn.max_pool, differentiated by autodiff (XLA's
  # select-and-scatter). Integers from 0 to 3 make ties in most windows:
  # both send a window's gradient to its first maximum in row-major order.
  rng = np.random.default_rng(padding)
  x = jnp.asarray(rng.integers(0, 4, shape), jnp.float32)
  pads = ((padding, padding), (padding, padding))
  ref = lambda x: nn.max_pool(x, (3, 3), strides=(2, 2), padding=pads)
  ours = lambda x: models.max_pool_3x3_s2(x, padding)
  np.testing.assert_array_equal(ours(x), ref(x))
  ct = jnp.asarray(rng.normal(size=ref(x).shape), jnp.float32)
  got, want = (jax.grad(lambda x, f=f: jnp.vdot(f(x), ct))(x)
               for f in (ours, ref))
  # Each input's gradient sums the windows it is the first maximum of, in
  # another order where several windows pick it.
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # Every window's gradient lands once: the sums agree.
  np.testing.assert_allclose(got.sum(), ct.sum(), rtol=1e-5)
