"""Multi-crop views (different sizes) through the real augmentation and step.

The 'multicrop' preset makes 2 global crops at the input size and local crops
at 3/7 of it; `augment.augment_groups` stacks them as two groups and the step
runs the encoder once per group (SwAV's multi-crop forward), so the loss sees
z [B, V, D] over all views. Reference: the model called directly on each
group, concatenated in view order, through the configured loss.
"""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import losses
from contrastive_jax import train
from input_pipeline import augment
from numpy_reference import f32_rtol
from tiny_step import tiny_config

B, HW, V = 8, 14, 4      # 2 global 14x14 crops + 2 local 6x6 crops.


def _run(config):
  mesh = runtime.create_mesh()
  setup = step_lib.build(config, mesh, total_steps=10, steps_per_epoch=5,
                      num_examples=64, image_shape=(HW, HW, 1))
  views_cfg = augment.build_views(config.augment.preset, V, ())
  images = (np.random.default_rng(0).random((B, HW, HW, 1)) * 255).astype(
      np.uint8)
  sharded = NamedSharding(mesh, P('data'))
  groups = jax.jit(lambda x: augment.augment_groups(jax.random.key(3), x,
                                                    views_cfg),
                   out_shardings=sharded)(jax.device_put(images, sharded))
  state = setup.init_fn(jax.random.key(0))
  s0 = jax.device_get(state)
  batch = {'views': groups,
           'label': jax.device_put(np.zeros(B, np.int32), sharded),
           'index': jax.device_put(np.arange(B, dtype=np.int32), sharded)}
  _, metrics = setup.step_fn(state, batch, jax.random.key(1))
  return setup, s0, jax.device_get(groups), jax.device_get(metrics)


def _embed(model, variables, group):
  b, v = group.shape[:2]
  out, _ = model.apply(variables, group.reshape((b * v,) + group.shape[2:]),
                       train=True, mutable=['batch_stats'])
  return np.asarray(out['projection']).reshape(b, v, -1)


def test_groups_are_the_runs_of_equal_size():
  views_cfg = augment.build_views('multicrop', V, ())
  groups = jax.eval_shape(
      lambda x: augment.augment_groups(jax.random.key(0), x, views_cfg),
      jax.ShapeDtypeStruct((B, HW, HW, 1), np.uint8))
  assert [g.shape for g in groups] == [(B, 2, HW, HW, 1), (B, 2, 6, 6, 1)]
  with pytest.raises(ValueError, match='augment_groups'):
    augment.augment_batch(jax.random.key(0), np.zeros((2, HW, HW, 1)),
                          views_cfg)


def test_in_batch_loss_over_all_crops():
  config = tiny_config(batch=B, out_dim=8)
  config.augment.preset, config.augment.num_views = 'multicrop', V
  config.loss, config.loss_kwargs = 'ntxent', {'temperature': 0.2}
  setup, s0, groups, metrics = _run(config)
  variables = {'params': s0.params, 'batch_stats': s0.batch_stats}
  z = np.concatenate([_embed(setup.model, variables, g) for g in groups],
                     axis=1)
  assert z.shape == (B, V, 8)
  want, _ = losses.apply('ntxent', losses.LossInputs(z), temperature=0.2)
  assert float(metrics['loss']) == pytest.approx(
      float(want), rel=f32_rtol(B * V * HW * HW))


def test_moco_queries_on_every_crop_keys_on_the_global_ones():
  config = tiny_config(batch=B, out_dim=8)
  config.augment.preset, config.augment.num_views = 'multicrop', V
  config.method, config.loss = 'moco', 'infonce'
  config.loss_kwargs = {'temperature': 0.2}
  # Query views: one global and the 2 locals; keys: the other global, paired
  # with every query (Vk = 1).
  config.moco.query_views, config.moco.key_views = (0, 2, 3), (1,)
  config.moco.queue_size, config.moco.momentum = 2 * B, 0.5
  setup, s0, groups, metrics = _run(config)
  ms = s0.method_state
  variables = {'params': s0.params, 'batch_stats': s0.batch_stats}
  key_vars = {'params': jax.tree.map(lambda t, o: 0.5 * t + 0.5 * o,
                                     ms.key_params, s0.params),
              'batch_stats': ms.key_batch_stats}
  query = np.concatenate([_embed(setup.model, variables, groups[0][:, :1]),
                          _embed(setup.model, variables, groups[1])], axis=1)
  key = _embed(setup.model, key_vars, groups[0][:, 1:])
  want, _ = losses.apply('infonce', losses.LossInputs(
      query, key=key, queue=ms.queue), temperature=0.2)
  assert float(metrics['loss']) == pytest.approx(
      float(want), rel=f32_rtol(B * V * HW * HW))
