"""Evaluates a saved checkpoint with the run's own evaluators.

  contrastive-jax-eval --workdir=workdir/default [--linear_eval=cifar]

Restores `params` and `batch_stats` of the newest readable checkpoint (of
any device count), runs the run's final evaluators, the diagnostics and
optionally a linear evaluation, and writes `<outdir>/results.json` (default
`<workdir>/eval`; keys 'trained/<metric>') and the diagnostics' PNGs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
from absl import logging

from contrastive_jax import checkpointing
from contrastive_jax import config_lib
from contrastive_jax import data as data_lib
from contrastive_jax import evaluators
from contrastive_jax import reporting
from contrastive_jax import runtime
from contrastive_jax import step as step_lib
from contrastive_jax import storage
from contrastive_jax import workdir as workdir_lib
from contrastive_jax.evaluators import features


def results_path(workdir: str, outdir: str | None = None) -> str:
  """The results.json that `evaluate_checkpoint(workdir, outdir)` writes."""
  return os.path.join(outdir or os.path.join(workdir, 'eval'), 'results.json')


def evaluate_checkpoint(workdir: str, outdir: str | None = None, *,
                        data=None, step: int | None = None,
                        knn_ks: Sequence[int] = (10, 20, 200),
                        linear_eval: str | None = None,
                        linear_eval_epochs: int = 0, diagnostics: bool = True,
                        cacr_t_neg: float = 2.,
                        seed: int = 0) -> dict[str, Any]:
  """Evaluates a run's checkpoint; writes and returns its results.

  `data`: (train, test) sources instead of the config's dataset; `knn_ks`:
  neighbour counts added to the final kNN's (those above the training size
  dropped); `linear_eval`: a `linear_eval.PRESETS` name (its epochs
  `linear_eval_epochs` if > 0); `cacr_t_neg`, `seed`: the diagnostics'.
  """
  t0 = time.time()
  storage.check(workdir, what='--workdir', write=False)
  config = config_lib.load(workdir)
  outdir = outdir or os.path.join(workdir, 'eval')
  storage.check(outdir, what='--outdir', write=True)
  if config.dataset.data_dir:
    storage.check(config.dataset.data_dir, what='config.dataset.data_dir',
                  write=False)
  train_data, test_data = data or data_lib.load(
      config, workdir_lib.load_classes(workdir))

  evals = {}
  for name, entry in config.evals.items():
    if entry.every_steps != 0 or entry.type == 'linear_eval':
      continue
    if entry.type == 'knn' and not entry.bank_size:
      entry.ks = tuple(sorted({int(k) for k in tuple(knn_ks) + entry.ks
                               if int(k) <= len(train_data)}))
    evals[name] = entry
  if linear_eval:
    evals['linear_eval'] = evaluators.config_entry(
        type='linear_eval', preset=linear_eval, epochs=linear_eval_epochs)
  if diagnostics:
    evals['diagnostics'] = evaluators.config_entry(
        type='diagnostics', t_neg=cacr_t_neg, seed=seed)
  config.evals = evals
  evaluators.validate(config, num_devices=jax.device_count(),
                      num_train=len(train_data))

  mesh = runtime.create_mesh()
  model = step_lib.create_model(config)
  variables, restored_step = checkpointing.restore_variables(
      workdir, model, train_data.image_shape, mesh, step)
  env = evaluators.Env(config, model, mesh, train_data, test_data,
                       features.make_feature_fn(model, mesh), outdir=outdir)
  results, _ = evaluators.run_final(evaluators.build(config),
                                    {'trained': variables}, env,
                                    baselines=False)
  results.update({'workdir': storage.location(workdir),
                  'checkpoint_step': restored_step,
                  'encoder': config.model.encoder, 'loss': config.loss})
  results.update(data_lib.count_skipped(
      config, {'training data': train_data, 'evaluation data': test_data}))
  results['eval_seconds'] = round(time.time() - t0, 1)
  if jax.process_index() == 0:
    path = results_path(workdir, outdir)
    reporting.write_json(path, results)
    logging.info('Results: %s%s', path,
                 f' (the diagnostics\' plots: {outdir}/*.png)'
                 if diagnostics else '')
  return results
