"""Shuffle-BN over the groups of the batch (config.model.bn_splits) and
MoCo's enqueue_keys='all'. The grouped BatchNorm itself: test_batch_norm.py.

References are float64 numpy (the queue's rows) or ordinary BatchNorm run on
each group alone.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import base as base_config
from contrastive_jax import config_lib
from contrastive_jax import losses
from contrastive_jax import models
from contrastive_jax import runtime
from contrastive_jax.methods import base
from contrastive_jax.methods import moco

S = 4                          # Groups.


def _config(bn_splits=0, **moco_fields):
  config = base_config.get_config()
  config.model.encoder_kwargs = ml_collections.ConfigDict(
      {'widths': (4, 8), 'pool': 'avg'})
  config.model.head_hidden_dim, config.model.head_out_dim = 8, 4
  # MoCo's head, without BN: only the encoder's BN is split, so the
  # projection of a group is then a function of that group alone.
  config.model.head_batch_norm = False
  config.model.bn_splits = bn_splits
  config.method = 'moco'
  config.loss = 'infonce'
  config.moco.update(moco_fields)
  return config


def _variables(model, x):
  variables = model.init(jax.random.key(0), x, train=False)
  # Non-trivial running statistics, so their update is visible.
  return jax.tree.map(lambda a: a + 0.1 * jax.random.normal(
      jax.random.key(1), a.shape), variables)


def _images(n=16, seed=2):
  return jax.random.normal(jax.random.key(seed), (n, 12, 12, 1))


def test_an_encoder_with_splits_equals_ordinary_bn_on_each_group_alone():
  split_model = models.create_model(_config(bn_splits=S))
  plain_model = models.create_model(_config())
  x = _images()
  variables = _variables(plain_model, x)
  # The same parameter and statistics tree: the layers keep their names.
  assert (jax.tree.structure(_variables(split_model, x))
          == jax.tree.structure(variables))
  out, new = split_model.apply(variables, x, train=True,
                               mutable=['batch_stats'])
  per_group = [plain_model.apply(variables, g, train=True,
                                 mutable=['batch_stats'])
               for g in jnp.split(x, S)]
  np.testing.assert_allclose(
      out['features'], jnp.concatenate([o['features'] for o, _ in per_group]),
      rtol=1e-4, atol=1e-5)
  whole, _ = plain_model.apply(variables, x, train=True,
                               mutable=['batch_stats'])
  assert np.abs(np.asarray(whole['features'] - out['features'])).max() > 1e-2
  # Running statistics of the encoder: the EMA is linear, so the split
  # update is the mean of the S separate groups' updates.
  enc = lambda tree: tree['encoder']
  want = jax.tree.map(lambda *a: np.mean(a, axis=0),
                      *[enc(s['batch_stats']) for _, s in per_group])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-6),
               enc(new['batch_stats']), want)
  # Eval mode ignores the split.
  np.testing.assert_allclose(
      split_model.apply(variables, x, train=False)['features'],
      plain_model.apply(variables, x, train=False)['features'], rtol=1e-5,
      atol=1e-6)


def test_forward_runs_each_view_alone_when_the_encoder_is_split():
  # Two views of 16 images: each view's 16 are cut into the 4 groups, so a
  # group never holds both views of an image.
  split_model = models.create_model(_config(bn_splits=S))
  plain_model = models.create_model(_config())
  v0, v1 = _images(seed=3), _images(seed=4)
  variables = _variables(plain_model, v0)
  z, _, _ = base.forward(split_model, variables, jnp.stack([v0, v1], 1))

  def plain_groups(x):
    return jnp.concatenate([plain_model.apply(
        variables, g, train=True, mutable=['batch_stats'])[0]['features']
                            for g in jnp.split(x, S)])
  feats, _, _ = base.forward(split_model, variables,
                             jnp.stack([v0, v1], 1), embedding='features')
  np.testing.assert_allclose(feats[:, 0], plain_groups(v0), rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(feats[:, 1], plain_groups(v1), rtol=1e-4,
                             atol=1e-5)
  assert z.shape == (16, 2, 4)


@pytest.mark.parametrize('devices', [1, 8])
def test_shuffle_bn_over_groups_permutes_each_key_view_and_restores_order(
    devices):
  # Shuffle-BN with split BN acts on one device too: each key view is
  # permuted, normalised in groups of the permuted batch, and unpermuted.
  if len(jax.devices()) < devices:
    pytest.skip('needs 8 devices')
  config = _config(bn_splits=S, shuffle_bn=True)
  split_model = models.create_model(config)
  plain_model = models.create_model(_config())
  views = jnp.stack([_images(seed=5), _images(seed=6)], 1)
  variables = _variables(plain_model, views[:, 0])
  rng = jax.random.key(7)
  mesh = runtime.create_mesh(jax.devices()[:devices])
  z, stats = jax.jit(lambda v, x: moco.key_forward(
      split_model, v, x, rng, shuffle_bn=True, mesh=mesh,
      bn_splits=S))(variables, views)
  assert z.shape == (16, 2, 4)
  # Reference: ordinary BN on each group of the permuted view, run group by
  # group, the outputs put back in the input's order.
  for i in range(2):
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(rng, i), 16))
    assert sorted(perm) == list(range(16))
    # The groups of the permuted batch mix the contiguous blocks.
    assert any(len(set(g // 4)) > 1 for g in perm.reshape(S, -1))
    x = np.asarray(views[:, i])[perm]
    out = np.concatenate([np.asarray(plain_model.apply(
        variables, g, train=True, mutable=['batch_stats'])[0]['projection'])
                          for g in np.split(x, S)])
    want = np.empty_like(out)
    want[perm] = out                    # Unshuffle: row perm[j] <- out[j].
    np.testing.assert_allclose(z[:, i], want, rtol=1e-4, atol=1e-5)
  # Without the shuffle the groups are the contiguous blocks: other keys.
  unshuffled, _ = moco.key_forward(split_model, variables, views, rng,
                                   shuffle_bn=False, mesh=mesh, bn_splits=S)
  assert np.abs(np.asarray(unshuffled - z)).max() > 1e-3
  assert jax.tree.structure(stats) == jax.tree.structure(
      variables['batch_stats'])


def test_enqueue_all_writes_every_key_view_in_order():
  b, d, q = 4, 3, 16
  method = moco.Method(loss='infonce', ctx=base.Context(1, 1, 8, 1, 1.),
                       query_views=(0, 1), key_views=(0, 1), queue_size=q,
                       enqueue_keys='all')
  rng = np.random.default_rng(0)
  key_z = rng.normal(size=(b, 2, d)).astype(np.float32)
  queue = rng.normal(size=(q, d)).astype(np.float32)
  ptr = 4
  state = moco.State(key_params={}, key_batch_stats={},
                     queue=jnp.asarray(queue), queue_ptr=jnp.asarray(ptr,
                                                                     jnp.int32))
  prepared = base.Prepared(views=(), inputs=losses.LossInputs(z=None),
                           method_state=state, aux=jnp.asarray(key_z))
  new = method.update(prepared, None, None)
  unit = key_z / np.linalg.norm(key_z, axis=-1, keepdims=True)
  want = queue.copy()
  want[ptr:ptr + b] = unit[:, 0]              # Key view 0, then key view 1.
  want[ptr + b:ptr + 2 * b] = unit[:, 1]
  np.testing.assert_allclose(new.queue, want, rtol=1e-6, atol=1e-6)
  assert int(new.queue_ptr) == ptr + 2 * b
  # 'first' writes view 0 only.
  first = moco.Method(loss='infonce', ctx=method.ctx, query_views=(0, 1),
                      key_views=(0, 1), queue_size=q).update(prepared, None,
                                                             None)
  assert int(first.queue_ptr) == ptr + b
  np.testing.assert_allclose(first.queue[ptr:ptr + b], unit[:, 0], rtol=1e-6,
                             atol=1e-6)
  # 'last' (the CACR-MoCo code's `_dequeue_and_enqueue(k_list[-1])`) writes
  # the last key view only, the rest of the queue untouched.
  last = moco.Method(loss='infonce', ctx=method.ctx, query_views=(0, 1),
                     key_views=(0, 1), queue_size=q,
                     enqueue_keys='last').update(prepared, None, None)
  want = queue.copy()
  want[ptr:ptr + b] = unit[:, 1]
  np.testing.assert_allclose(last.queue, want, rtol=1e-6, atol=1e-6)
  assert int(last.queue_ptr) == ptr + b


def test_validation_names_the_fix():
  config = _config(bn_splits=3, queue_size=0)
  config.batch_size = 16
  with pytest.raises(ValueError, match='bn_splits=3'):
    config_lib.validate(config, num_devices=1)
  config = _config(bn_splits=8)
  config.batch_size = 8              # Groups of one image.
  with pytest.raises(ValueError, match='at least 2 images'):
    config_lib.validate(config, num_devices=1)
  config.batch_size = 16
  config_lib.validate(config, num_devices=1)
  # 'all' writes B x key views rows a step.
  config = _config(query_views=(0, 1), key_views=(0, 1), queue_size=48,
                   enqueue_keys='all')
  config.batch_size = 16
  with pytest.raises(ValueError, match='32 keys a step enqueues'):
    config_lib.validate(config, num_devices=1)
  config.moco.queue_size = 64
  config_lib.validate(config, num_devices=1)
  config.moco.enqueue_keys = 'every'
  with pytest.raises(ValueError, match='all \\(every key view'):
    config_lib.validate(config, num_devices=1)
