"""Frozen features of a split: each row is its example, where it was computed."""

import jax
import numpy as np

from contrastive_jax.evaluators import features
from contrastive_jax import config_lib
from contrastive_jax import evaluators
from contrastive_jax import runtime
from input_pipeline import pipeline

import compilations

NUM, BATCH = 37, 16        # three eval batches, the last with 11 padding rows


def _split():
  rng = np.random.default_rng(0)
  return pipeline.ArrayDataset(
      rng.integers(0, 256, (NUM, 4, 4, 1), dtype=np.uint8),
      rng.integers(0, 5, NUM).astype(np.int32))


def test_every_row_is_the_example_its_index_names():
  data, mesh = _split(), runtime.create_mesh()
  # variables=None: the raw-pixel representation, x = image / 255 flattened.
  feats = features.extract_features(features.make_feature_fn(None, mesh), None,
                                    data, mesh, BATCH)
  x, label, mask, index = jax.device_get(tuple(feats))
  assert sorted(index.tolist()) == list(range(3 * BATCH))
  assert np.array_equal(mask, index < NUM)
  real = index[mask]
  # x = image / 255 (XLA may multiply by 1/255: within an ulp, so compare
  # the pixel values it came from).
  np.testing.assert_array_equal(
      np.rint(x[mask] * 255), data.images[real].reshape(len(real), -1))
  np.testing.assert_array_equal(label[mask], data.labels[real])


def test_rows_stay_on_the_device_that_computed_them():
  # Device d computed rows [d B / n, (d + 1) B / n) of every eval batch; the
  # split's features keep exactly those rows there (no row crosses devices,
  # or hosts on a pod).
  data, mesh = _split(), runtime.create_mesh()
  feats = features.extract_features(features.make_feature_fn(None, mesh), None,
                                    data, mesh, BATCH)
  per_device = BATCH // mesh.size
  devices = list(mesh.devices.flat)
  assert feats.x.sharding == feats.index.sharding == feats.label.sharding
  for shard in feats.index.addressable_shards:
    d = devices.index(shard.device)
    rows_in_batch = np.asarray(shard.data) % BATCH
    assert set(rows_in_batch.tolist()) == set(
        range(d * per_device, (d + 1) * per_device))


def test_first_rows_are_the_splits_first_examples_in_order():
  data, mesh = _split(), runtime.create_mesh()
  feats = features.extract_features(features.make_feature_fn(None, mesh), None,
                                    data, mesh, BATCH)
  for n, want in [(5, 5), (10 ** 6, NUM)]:
    x, label = features.first_rows(feats, n)
    np.testing.assert_array_equal(np.rint(x * 255),
                                  data.images[:want].reshape(want, -1))
    np.testing.assert_array_equal(label, data.labels[:want])


def test_a_second_evaluation_of_the_same_shapes_builds_no_program():
  """The end-of-run evaluation compiles its programs (features, kNN, probe,
  the embedding rows) once per feature shape: scoring other data of the same
  shapes (the random-init encoder after the trained one; every online kNN)
  builds no XLA program, not even one from the persistent cache."""
  from configs import test as test_config
  mesh = runtime.create_mesh()
  config = test_config.get_config()
  config.eval.batch_size = BATCH
  config.evals.linear.max_iter = 5
  config.eval.embedding_points = 8
  config = config_lib.with_defaults(config)
  evals = evaluators.build(config)
  rng = np.random.default_rng(1)

  def splits():
    make = lambda n: pipeline.ArrayDataset(
        rng.integers(0, 256, (n, 4, 4, 1), dtype=np.uint8),
        rng.integers(0, 5, n).astype(np.int32))
    return make(NUM), make(NUM - 5)

  feature_fn = features.make_feature_fn(None, mesh)

  def run():
    env = evaluators.Env(config, None, mesh, *splits(), feature_fn)
    return evaluators.run_final(evals, {}, env, baselines=True)

  with compilations.programs_built() as built:
    first, _ = run()
    programs_first = len(built)
    second, emb = run()
  assert programs_first > 0               # the listener sees compilations
  assert len(built) == programs_first     # and the second call made none
  assert first['raw_pixels/linear_top1'] != second['raw_pixels/linear_top1'] \
      or first['raw_pixels/knn_weighted_top1@5'] != second[
          'raw_pixels/knn_weighted_top1@5']   # other data, really scored
  assert emb['raw_pixels'][0].shape == (8, 16)


def test_features_read_the_normalised_images():
  """The evaluators' feature function feeds the model its uint8 images as
  [0, 1] floats and the model normalises them first
  (`config.model.input_norm`): the features equal the model without the
  normalisation on numpy (image / 255 - mean) / std, same parameters."""
  import jax.numpy as jnp
  import ml_collections
  from configs import base as base_config
  from contrastive_jax import models

  def model_of(input_norm):
    config = base_config.get_config()
    config.model.encoder = 'resnet18'
    config.model.encoder_kwargs = ml_collections.ConfigDict({'width': 4})
    config.model.input_norm = input_norm
    return models.create_model(config)

  mesh = runtime.create_mesh()
  images = np.random.default_rng(0).integers(0, 256, (8, 8, 8, 3),
                                             dtype=np.uint8)
  normed, plain = model_of('cifar100'), model_of('none')
  variables = normed.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)),
                          train=False)
  got = features.make_feature_fn(normed, mesh)(variables, images)
  x = ((images.astype(np.float32) / 255.
        - np.array([0.5071, 0.4867, 0.4408], np.float32))
       / np.array([0.2675, 0.2565, 0.2761], np.float32))
  want = plain.apply(variables, x, train=False)['features']
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                             atol=1e-5)
