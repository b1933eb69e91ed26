r"""Evaluates the latest checkpoint of any run: kNN, probes and diagnostics.

  python -m contrastive_jax.eval_checkpoint --workdir=workdir/default \
      [--outdir=workdir/default/eval] [--probe_preset=cacr_small]

Reads `<workdir>/config.json` and `<workdir>/classes.json` (written by
train.py: an image folder's class ids are the run's) and the newest readable
checkpoint in `<workdir>/checkpoints`, then on the frozen encoder (eval-mode
BatchNorm, un-augmented images):

* weighted and majority kNN for several k (`--knn_ks` plus the run's own
  `config.eval.knn_ks`, so the run's number is reproduced);
* the logistic-regression probe of train.py (`config.eval.linear_*`);
* optionally the papers' linear evaluation with a named preset
  (`--probe_preset`, see evaluators/linear_eval.PRESETS): a classifier
  trained by SGD/Adam on augmented images through the frozen encoder;
* diagnostics on the projection (the space the loss saw) and the backbone
  features: Wang & Isola's alignment and uniformity on two augmented views
  of every test image (the run's augmentation preset), CACR's conditional
  entropy of the negative weights (test mini-batches of the training batch
  size, as the paper averages over validation mini-batches), MACL's semantic
  sensitivity on un-augmented test images, a histogram of positive/negative
  cosine similarities and a PCA plot of the test features (PNG files).

Everything goes to `<outdir>/results.json` (default `<workdir>/eval`), keys
labelled 'offline' implicitly: this is always the frozen final encoder.

Restoring. Only `params` and `batch_stats` are read, with an orbax partial
restore into a target built from the model (`jax.eval_shape` of `init`, placed
replicated on the current mesh). So the checkpoint may hold any other state
fields (optimizer, EMA key encoder, queue, memory bank) and may have been
written on any number of devices.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import app
from absl import flags
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import evaluate
from contrastive_jax import runtime
from contrastive_jax import train
from contrastive_jax.evaluators import diagnostics
from contrastive_jax.evaluators import knn
from contrastive_jax.evaluators import linear_eval
from contrastive_jax.evaluators import linear_probe
from input_pipeline import augment
from input_pipeline import pipeline


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config from `<workdir>/config.json` (lists back to tuples)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} not found: is {workdir!r} the --workdir '
                            'of a training run?')
  with open(path) as f:
    raw = json.load(f)

  def to_tuples(x):
    # JSON has no tuples; modules and evaluators take them (e.g. widths).
    if isinstance(x, dict):
      return {k: to_tuples(v) for k, v in x.items()}
    if isinstance(x, list):
      return tuple(to_tuples(v) for v in x)
    return x

  # Keys added to configs/base.py after a run was saved take base's value.
  raw.setdefault('dataset', {}).setdefault('num_workers', 0)
  return ml_collections.ConfigDict(to_tuples(raw))


def restore_variables(workdir: str, model, image_shape: Sequence[int], mesh,
                      step: int | None = None) -> tuple[dict[str, Any], int]:
  """Restores params and batch_stats of the newest readable checkpoint.

  Args:
    workdir: the run directory (checkpoints in `<workdir>/checkpoints`).
    model: the run's ContrastiveModel (defines the expected shapes).
    image_shape: (H, W, C) of the training images.
    mesh: the mesh to place the (replicated) variables on.
    step: a specific step; None takes the newest one that reads.

  Returns:
    (variables, step): variables {'params', 'batch_stats'}, as model.apply
    takes them.

  Raises:
    FileNotFoundError: no (readable) checkpoint.
  """
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'no checkpoints in {directory}.')
  replicated = NamedSharding(mesh, P())
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0),
                         jnp.zeros((2,) + tuple(image_shape)), train=False))
  target = {'params': shapes['params'],
            'batch_stats': shapes.get('batch_stats', {})}
  target = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      target)
  restore_args = ocp.checkpoint_utils.construct_restore_args(target)
  options = ocp.CheckpointManagerOptions(read_only=True)
  with ocp.CheckpointManager(directory, options=options) as manager:
    steps = [step] if step is not None else sorted(manager.all_steps(),
                                                   reverse=True)
    errors = []
    for s in steps:
      try:
        # partial_restore: every other field of the saved TrainState (opt
        # state, key encoder, queue, bank, ...) is left on disk.
        out = manager.restore(s, args=ocp.args.PyTreeRestore(
            item=target, restore_args=restore_args, partial_restore=True))
        return {'params': out['params'],
                'batch_stats': out['batch_stats']}, s
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('Checkpoint at step %d is unreadable (%s: %s); trying '
                        'the previous one.', s, type(e).__name__, e)
        errors.append(f'step {s}: {type(e).__name__}: {e}')
  raise FileNotFoundError(f'no readable checkpoint in {directory}'
                          + (': ' + '; '.join(errors) if errors else '.'))


def _to_host(*arrays, mask) -> list[np.ndarray]:
  """Global arrays (sharded over processes) -> full host copies, real rows.

  For the diagnostics and the SGD probe, which run on the host; every process
  gets the whole array (`process_allgather`), so keep this to test-set-sized
  features.
  """
  mask = np.asarray(multihost_utils.process_allgather(mask, tiled=True))
  return [np.asarray(multihost_utils.process_allgather(a, tiled=True))[mask]
          for a in arrays]


def _embed_fn(model, mesh):
  """Jitted eval-mode forward: float images -> (features, projection)."""
  sharding = NamedSharding(mesh, P('data'))

  @jax.jit
  def embed(params, batch_stats, x):
    out = model.apply({'params': params, 'batch_stats': batch_stats}, x,
                      train=False)
    return (jax.lax.with_sharding_constraint(out['features'], sharding),
            jax.lax.with_sharding_constraint(out['projection'], sharding))

  return embed


def _embed_views(model, variables, data, mesh, *, batch_size: int, views_cfg,
                 seed: int):
  """Embeddings of un-augmented images and of two augmented views.

  Returns:
    {'clean', 'view0', 'view1'} -> (features [M, F], projection [M, D]).
  """
  sharding = NamedSharding(mesh, P('data'))
  embed = _embed_fn(model, mesh)
  augment_fn = jax.jit(
      lambda rng, images: augment.augment_batch(rng, images, views_cfg),
      out_shardings=sharding)
  rng = jax.random.key(seed)
  parts = {k: ([], []) for k in ('clean', 'view0', 'view1')}
  for i, batch in enumerate(pipeline.eval_batches(
      data, batch_size=batch_size, sharding=sharding)):
    images = batch['image']
    views = augment_fn(jax.random.fold_in(rng, i), images)   # [B, 2, ...]
    inputs = {'clean': images.astype(jnp.float32) / 255.,
              'view0': views[:, 0], 'view1': views[:, 1]}
    for name, x in inputs.items():
      f, z = _to_host(*embed(variables['params'], variables['batch_stats'], x),
                      mask=batch['mask'])
      parts[name][0].append(f)
      parts[name][1].append(z)
  return {k: (np.concatenate(f), np.concatenate(z))
          for k, (f, z) in parts.items()}


def _batched_entropy(z_a, *, batch_size: int, t_neg: float) -> float:
  """CACR's H(X^-|X) averaged over full mini-batches (paper, Figs. 3-5)."""
  n = (len(z_a) // batch_size) * batch_size
  if n == 0:                  # fewer test images than one batch: one batch
    return float(diagnostics.conditional_entropy(z_a, t_neg=t_neg))
  vals = [float(diagnostics.conditional_entropy(z_a[s:s + batch_size],
                                                t_neg=t_neg))
          for s in range(0, n, batch_size)]
  return float(np.mean(vals))


def evaluate_checkpoint(workdir: str, outdir: str | None = None, *,
                        data=None,
                        step: int | None = None,
                        knn_ks: Sequence[int] = (10, 20, 200),
                        probe_preset: str | None = None,
                        probe_epochs: int | None = None,
                        cacr_t_neg: float = 2.,
                        entropy_batch_size: int | None = None,
                        seed: int = 0) -> dict[str, Any]:
  """Evaluates a run's checkpoint and writes results.json and PNGs.

  Args:
    workdir: the training run's directory (config.json, checkpoints/).
    outdir: where to write; default `<workdir>/eval`.
    data: (train, test) sources instead of the config's dataset (tests).
    step: checkpoint step; None takes the newest readable one.
    knn_ks: neighbour counts, merged with the run's `config.eval.knn_ks`;
      values above the training-set size are dropped.
    probe_preset: name in `linear_eval.PRESETS`: also run that linear
      evaluation (results 'probe_<preset>_top1', ...).
    probe_epochs: override of the preset's epochs (quick looks, tests).
    cacr_t_neg: t^- of the conditional-entropy diagnostic (CACR K=1 CIFAR-10
      value; the paper does not say which t^- its baseline curves used).
    entropy_batch_size: mini-batch of that diagnostic; default the run's
      `config.batch_size`.
    seed: seed of the augmented views of the diagnostics.

  Returns:
    The results dict written to `<outdir>/results.json`.
  """
  t0 = time.time()
  config = load_config(workdir)
  outdir = outdir or os.path.join(workdir, 'eval')
  os.makedirs(outdir, exist_ok=True)
  # The run's stored class list: an image folder is labelled as in training.
  train_data, test_data = data if data is not None else train.load_data(
      config, train.load_classes(workdir))
  num_classes = max(train_data.num_classes, test_data.num_classes)

  mesh = runtime.create_mesh()
  model = train.create_model(config)
  variables, restored_step = restore_variables(
      workdir, model, train_data.image_shape, mesh, step)
  logging.info('Restored step %d of %s.', restored_step, workdir)
  results: dict[str, Any] = {'workdir': os.path.abspath(workdir),
                             'checkpoint_step': restored_step,
                             'encoder': config.model.encoder,
                             'loss': config.loss}

  # Frozen features exactly as train.py's end-of-run evaluation reads them.
  ev = config.eval
  feature_fn = evaluate.make_feature_fn(model, mesh)
  train_f, test_f = (evaluate.extract_features(feature_fn, variables, d, mesh,
                                               ev.batch_size)
                     for d in (train_data, test_data))
  ks = sorted({int(k) for k in tuple(knn_ks) + tuple(ev.knn_ks)
               if int(k) <= len(train_data)})
  results.update(knn.knn_evaluate(
      train_f.x, train_f.label, test_f.x, test_f.label,
      num_classes=num_classes, ks=tuple(ks), temperature=ev.knn_temperature,
      mesh=mesh, bank_mask=train_f.mask, query_mask=test_f.mask))
  lin = linear_probe.logistic_regression(
      train_f.x, train_f.label, test_f.x, test_f.label,
      num_classes=num_classes, l2=ev.linear_l2, max_iter=ev.linear_max_iter,
      train_mask=train_f.mask, test_mask=test_f.mask)
  results.update({f'linear_{k}': float(v) for k, v in lin.items()})
  if probe_preset:
    # The papers' protocol: SGD/Adam on augmented images through the frozen
    # encoder, streamed (evaluators/linear_eval.py).
    results.update(evaluate.papers_linear_eval(
        config, model, variables, train_data, test_data, mesh,
        preset=probe_preset, epochs=probe_epochs or 0,
        prefix=f'probe_{probe_preset}'))

  # Diagnostics on two augmented views of every test image: the run's first
  # two views, its per-view overrides included (multi-crop presets start
  # with two same-size global crops).
  views_cfg = augment.build_views(
      config.augment.preset, max(2, config.augment.num_views),
      config.augment.overrides)[:2]
  emb = _embed_views(model, variables, test_data, mesh,
                     batch_size=ev.batch_size, views_cfg=views_cfg, seed=seed)
  labels, = _to_host(test_f.label, mask=test_f.mask)
  entropy_batch = int(entropy_batch_size or config.batch_size)
  for space, idx in (('projection', 1), ('features', 0)):
    z0, z1, clean = emb['view0'][idx], emb['view1'][idx], emb['clean'][idx]
    pre = f'diagnostics/{space}/'
    results[pre + 'alignment'] = float(diagnostics.alignment(z0, z1))
    # Wang & Isola average the uniformity of the two views.
    results[pre + 'uniformity'] = float(
        (diagnostics.uniformity(z0) + diagnostics.uniformity(z1)) / 2)
    results[pre + 'cacr_conditional_entropy'] = _batched_entropy(
        z0, batch_size=entropy_batch, t_neg=cacr_t_neg)
    results[pre + 'macl_semantic_sensitivity'] = float(
        diagnostics.semantic_sensitivity(clean, labels))
    hist = diagnostics.similarity_histograms(
        z0, z1, labels=labels,
        path=os.path.join(outdir, f'similarity_histogram_{space}.png'),
        title=f'{space}: step {restored_step}, {config.loss}')
    results[pre + 'positive_cos_mean'] = float(np.mean(hist['positive']))
    results[pre + 'negative_cos_mean'] = float(
        np.mean(hist['negative'])) if hist['negative'].size else float('nan')
  m = min(entropy_batch, len(labels))
  results['diagnostics/cacr_conditional_entropy_max'] = float(np.log(m - 1))
  results['diagnostics/cacr_t_neg'] = cacr_t_neg
  results['diagnostics/cacr_entropy_batch_size'] = m
  diagnostics.embedding_plot(
      emb['clean'][0], labels, os.path.join(outdir, 'embedding_pca.png'),
      title=f'PCA of test features, step {restored_step}')
  results.update(train.count_skipped(
      config, {'training data': train_data, 'evaluation data': test_data}))
  results['eval_seconds'] = round(time.time() - t0, 1)
  if jax.process_index() == 0:
    path = os.path.join(outdir, 'results.json')
    with open(path + '.tmp', 'w') as f:
      json.dump(results, f, indent=2, sort_keys=True)
    os.replace(path + '.tmp', path)
  return results


FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory of the training run.')
flags.DEFINE_string('outdir', None, 'Output directory (default workdir/eval).')
flags.DEFINE_integer('step', None, 'Checkpoint step (default: newest).')
flags.DEFINE_list('knn_ks', ['10', '20', '200'], 'kNN neighbour counts.')
flags.DEFINE_string('probe_preset', None,
                    "Also run the papers' linear evaluation with this preset "
                    f'({", ".join(sorted(linear_eval.PRESETS))}).')
flags.DEFINE_integer('probe_epochs', None, "Override the preset's epochs.")
flags.DEFINE_float('cacr_t_neg', 2., "t^- of CACR's conditional entropy.")
flags.DEFINE_integer('seed', 0, 'Seed of the diagnostic views.')


def main(argv):
  del argv
  runtime.initialize_distributed()   # Same environment as main.py's.
  results = evaluate_checkpoint(
      FLAGS.workdir, FLAGS.outdir, step=FLAGS.step,
      knn_ks=tuple(int(k) for k in FLAGS.knn_ks),
      probe_preset=FLAGS.probe_preset, probe_epochs=FLAGS.probe_epochs,
      cacr_t_neg=FLAGS.cacr_t_neg, seed=FLAGS.seed)
  width = max(len(k) for k in results)
  for k in sorted(results):
    print(f'{k:<{width}}  {results[k]}')


if __name__ == '__main__':
  flags.mark_flag_as_required('workdir')
  app.run(main)
