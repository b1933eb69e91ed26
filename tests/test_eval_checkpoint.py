"""eval_checkpoint on a tiny trained run: same kNN as training, files written."""

import json
import os

import jax
import numpy as np
import pytest

import contrastive_jax

from configs import test as test_config
from contrastive_jax import config_lib
from contrastive_jax import checkpointing
from contrastive_jax import eval_checkpoint
from contrastive_jax import models
from contrastive_jax import train
from input_pipeline import pipeline
import synthetic_data

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _noisy_labels(data, fraction, seed):
  # Relabel a fraction of the test set at random so that accuracies are
  # below 1 and the equality checks below are not trivially 1.0 == 1.0.
  rng = np.random.default_rng(seed)
  labels = data.labels.copy()
  flip = rng.random(len(labels)) < fraction
  labels[flip] = (labels[flip] + rng.integers(1, 4, flip.sum())) % 4
  return pipeline.ArrayDataset(data.images, labels)


DATA = (synthetic_data.stripes_and_brightness(256, 0),
        _noisy_labels(synthetic_data.stripes_and_brightness(64, 1), 0.3, 2))


@pytest.fixture(scope='module')
def evaluated(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('run'))
  train_results = train.train_and_evaluate(test_config.get_config(), workdir,
                                           data=DATA)
  results = eval_checkpoint.evaluate_checkpoint(
      workdir, data=DATA, knn_ks=(3, 10), linear_eval='cacr_small',
      linear_eval_epochs=2)
  return workdir, train_results, results


def test_knn_reproduces_the_training_run(evaluated):
  workdir, train_results, results = evaluated
  with open(os.path.join(workdir, 'results.json')) as f:
    on_disk = json.load(f)
  assert results['checkpoint_step'] == train_results['steps'] == 8
  # Same checkpoint, same extraction: the run's k=5 accuracies exactly,
  # whatever other k were scored in the same pass.
  for vote in ('weighted', 'majority'):
    key = f'trained/knn_{vote}_top1@5'
    assert results[key] == on_disk[key]
    assert results[key] < 1.
  assert {'trained/knn_weighted_top1@3',
          'trained/knn_weighted_top1@10'} <= set(results)
  # The logistic regression is deterministic on the same features too.
  assert results['trained/linear_top1'] == pytest.approx(
      on_disk['trained/linear_top1'], abs=1e-6)


def test_files_and_diagnostics(evaluated):
  workdir, _, results = evaluated
  outdir = os.path.join(workdir, 'eval')
  with open(os.path.join(outdir, 'results.json')) as f:
    assert json.load(f) == json.loads(json.dumps(results))
  for name in ('similarity_histogram_projection.png',
               'similarity_histogram_features.png', 'embedding_pca.png'):
    with open(os.path.join(outdir, name), 'rb') as f:
      assert f.read(8) == PNG_MAGIC
  for space in ('projection', 'features'):
    pre = f'trained/diagnostics/{space}/'
    assert 0. <= results[pre + 'alignment'] <= 4.
    assert -4. <= results[pre + 'uniformity'] <= 0.
    assert 0. <= results[pre + 'cacr_conditional_entropy'] <= np.log(31) + 1e-5
    assert np.exp(-4) - 1e-6 <= results[pre + 'macl_semantic_sensitivity'] <= 1.
  assert results['trained/diagnostics/cacr_conditional_entropy_max'] == (
      pytest.approx(np.log(31)))      # test config: batch 32
  assert 0. <= results['trained/linear_eval_top1'] <= 1.


def test_restore_onto_another_mesh_and_explicit_step(evaluated):
  # Written on 8 devices; read onto a 1-device mesh, older checkpoint.
  workdir, _, _ = evaluated
  config = config_lib.load(workdir)
  assert config.model.encoder_kwargs.widths == (8, 16)     # tuples restored
  model = models.create_model(config)
  mesh = jax.make_mesh((1,), ('data',), devices=jax.devices()[:1])
  variables, step = checkpointing.restore_variables(
      workdir, model, (12, 12, 1), mesh, step=6)
  assert step == 6
  leaf = jax.tree.leaves(variables['params'])[0]
  assert leaf.sharding.mesh.size == 1
  latest, latest_step = checkpointing.restore_variables(
      workdir, model, (12, 12, 1), mesh)
  assert latest_step == 8
  # Different steps hold different weights (the restore is not a re-init).
  assert any(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(variables['params']), jax.tree.leaves(latest['params'])))


def test_load_encoder_embeds_as_the_run_evaluated(evaluated):
  # The public API's features, scored by a brute-force numpy weighted kNN
  # (cosine, k=5, T=0.1), give the run's own kNN accuracy.
  workdir, _, _ = evaluated
  encoder = contrastive_jax.load_encoder(workdir)    # shape from data.json
  assert encoder.step == 8 and encoder.classes is None
  train, test = DATA
  bank = encoder(train.images).astype(np.float64)
  queries = encoder(test.images[:10]).astype(np.float64)
  assert encoder.project(test.images[:3]).shape == (3, 16)
  queries = np.concatenate([queries, encoder(test.images[10:])])
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sims = unit(queries) @ unit(bank).T
  correct = 0
  for q in range(len(queries)):
    top = np.argsort(-sims[q], kind='stable')[:5]
    votes = np.zeros(train.labels.max() + 1)
    for i in top:
      votes[train.labels[i]] += np.exp(sims[q, i] / 0.1)
    correct += int(np.argmax(votes) == test.labels[q])
  with open(os.path.join(workdir, 'results.json')) as f:
    want = json.load(f)['trained/knn_weighted_top1@5']
  assert correct / len(queries) == pytest.approx(want, abs=1.5 / len(queries))


def test_missing_run_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='config.json'):
    eval_checkpoint.evaluate_checkpoint(str(tmp_path), data=DATA)


def test_an_image_folder_is_labelled_with_the_runs_classes(tmp_path):
  # A run started on classes a and b (train.py wrote classes.json); the
  # folder has gained a class since. Its ids cannot be the run's: refused,
  # before any checkpoint is read.
  config = test_config.get_config()
  config.dataset.update(dict(name='image_folder', data_dir=str(tmp_path / 'd'),
                             image_size=8, train_split='train',
                             eval_split='test'))
  synthetic_data.make_colour_folder(
      str(tmp_path / 'd'), {'train': dict(a=2, b=2), 'test': dict(a=1, c=1)})
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text(config.to_json_best_effort())
  (workdir / 'classes.json').write_text(json.dumps({'classes': ['a', 'b']}))
  (workdir / 'checkpoints' / '2').mkdir(parents=True)    # A run's workdir.
  with pytest.raises(ValueError, match=r"class folders \['c'\].*classes.json"):
    eval_checkpoint.evaluate_checkpoint(str(workdir))
