"""The evaluator layer on small inputs: what `config.evals` builds, what each
evaluator computes against an independent numpy computation, features
extracted once per representation, and the checks that run before training."""

import ml_collections
import numpy as np
import pytest

from configs import test as test_config
from contrastive_jax import config_lib
from contrastive_jax import evaluators
from contrastive_jax import runtime
from contrastive_jax.evaluators import features
from contrastive_jax.evaluators import logreg
from input_pipeline import pipeline


def _data(n, seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 3, n).astype(np.int32)
  images = rng.integers(0, 60, (n, 4, 4, 1)).astype(np.uint8)
  images[:, :, :, 0] += (labels * 60)[:, None, None].astype(np.uint8)
  return pipeline.ArrayDataset(images, labels)


def _env(config, train, test, calls=None):
  mesh = runtime.create_mesh()
  feature_fn = features.make_feature_fn(None, mesh)   # Raw pixels.

  def counted(variables, images):
    if calls is not None:
      calls.append(images.shape[0])
    return feature_fn(variables, images)

  return evaluators.Env(config, None, mesh, train, test, counted)


def _config(**evals):
  config = test_config.get_config()
  config.eval.batch_size = 16
  config.evals = {name: evaluators.config_entry(**fields)
                  for name, fields in evals.items()}
  return config_lib.with_defaults(config)


def _numpy_knn(bank, bank_y, queries, k, t):
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sims = unit(queries) @ unit(bank).T
  preds = []
  for row in sims:
    top = np.argsort(-row, kind='stable')[:k]
    votes = np.zeros(bank_y.max() + 1)
    np.add.at(votes, bank_y[top], np.exp(row[top] / t))
    preds.append(np.argmax(votes))
  return np.array(preds)


def test_knn_on_subsets_matches_numpy_and_lowers_k_to_the_bank():
  train, test = _data(96, 0), _data(48, 1)
  config = _config(knn=dict(type='knn', ks=(5, 100), bank_size=40,
                            num_queries=20, temperature=0.1))
  knn_eval = evaluators.build(config)['knn']
  rep = evaluators.Representation('raw', None, _env(config, train, test))
  out = knn_eval(rep)
  assert set(out) == {'knn_weighted_top1@5', 'knn_majority_top1@5',
                      'knn_weighted_top1@40', 'knn_majority_top1@40'}
  bank = train.images[:40].reshape(40, -1).astype(np.float64) / 255.
  queries = test.images[:20].reshape(20, -1).astype(np.float64) / 255.
  for k in (5, 40):
    want = np.mean(_numpy_knn(bank, train.labels[:40], queries, k, 0.1) ==
                   test.labels[:20])
    assert out[f'knn_weighted_top1@{k}'] == pytest.approx(want, abs=1e-6)


def test_logreg_evaluator_is_the_function_on_the_representations_features():
  train, test = _data(64, 2), _data(32, 3)
  config = _config(linear=dict(type='logreg', l2=1e-3, max_iter=20))
  rep = evaluators.Representation('raw', None, _env(config, train, test))
  out = evaluators.build(config)['linear'](rep)
  x = lambda d: d.images.reshape(len(d), -1).astype(np.float32) / 255.
  want = logreg.logistic_regression(x(train), train.labels, x(test),
                                    test.labels, num_classes=3, l2=1e-3,
                                    max_iter=20)
  assert out['linear_top1'] == pytest.approx(float(want['top1']), abs=1e-6)


def test_features_are_extracted_once_per_representation():
  train, test = _data(64, 4), _data(32, 5)
  config = _config(knn=dict(type='knn', ks=(3,)),
                   linear=dict(type='logreg', max_iter=5))
  calls = []
  env = _env(config, train, test, calls)
  results, _ = evaluators.run_final(evaluators.build(config), {}, env,
                                    baselines=True)
  # raw pixels only (no encoder given): 64 + 32 rows, in batches of 16.
  assert sum(calls) == 96 and len(calls) == 6
  assert {'raw_pixels/knn_weighted_top1@3',
          'raw_pixels/linear_top1'} <= set(results)


def test_online_evaluators_run_on_their_schedule():
  config = _config(knn=dict(type='knn', ks=(3,)),
                   online=dict(type='knn', every_steps=4, ks=(3,),
                               bank_size=16, num_queries=8),
                   off=dict(type='logreg', every_steps=-1))
  built = evaluators.build(config)
  assert set(built) == {'knn', 'online'}          # -1 is off
  assert [s for s in range(1, 11) if evaluators.due(built, s, 10)] == [
      4, 8, 10]


def test_checks_before_training_name_the_fix():
  config = _config(knn=dict(type='knn', ks=(500,)))
  with pytest.raises(ValueError, match=r'config.evals.knn.ks=\(500,\).*100'):
    evaluators.validate(config, num_devices=1, num_train=100)
  config = _config(a=dict(type='knn'), b=dict(type='knn', ks=(3,)))
  with pytest.raises(ValueError, match='two final evaluators'):
    evaluators.validate(config, num_devices=1)
  config = _config(lin=dict(type='linear_eval', preset='nope'))
  with pytest.raises(ValueError, match="unknown linear-evaluation preset 'nope'"):
    evaluators.validate(config, num_devices=1)
  with pytest.raises(ValueError, match="type='svm'; known: diagnostics, knn"):
    evaluators.config_entry(type='svm')     # Unknown types: named.


def test_an_entry_is_completed_from_its_types_defaults():
  entry = evaluators.config_entry(type='knn', ks=(7,))
  assert isinstance(entry, ml_collections.ConfigDict)
  assert (entry.every_steps, entry.ks, entry.temperature, entry.bank_size,
          entry.num_queries) == (0, (7,), 0.1, 0, 0)
