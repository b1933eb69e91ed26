"""End-of-run evaluation: frozen features -> weighted kNN and a linear probe.

Every representation is scored with the same two protocols on the test split:
the InstDisc/MoCo weighted kNN (cosine, k=200, T=0.1 by default) with the
un-augmented training set as the bank, and multinomial logistic regression on
L2-normalised features. Besides the trained encoder, the same numbers are
computed for raw pixels and for the randomly initialised encoder, so every
results.json says how much pretraining bought.

Multi-host. Nothing here needs a process to see all devices: features are
extracted batch by batch (each process reads its part) into global arrays
sharded by rows over every device of every host; the kNN bank stays sharded
(per-shard top-k, merged across shards), the probe's full-batch objective is a
masked mean the partitioner reduces across devices, and only 0-d scalars
(replicated by construction) come back to the hosts.

Memory per device, with n devices, N bank (training) rows, Q queries, F
features, C classes: the bank shard N F / n, its L2-normalised copy for the
probe N F / n, the replicated queries Q F, one kNN similarity block of at most
128 MiB, the probe's logits N C / n, and the L-BFGS history (10 pairs of
F x C). All in float32. ImageNet (N = 1.28M, Q = 50k, F = 2048, C = 1000) on
8 devices: 1.3 + 1.3 + 0.4 + 0.13 + 0.64 + 0.16 GB, about 4 GB per device
(twice the bank shard transiently while the batches are concatenated).
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import progress
from contrastive_jax.evaluators import knn
from contrastive_jax.evaluators import linear_eval
from contrastive_jax.evaluators import linear_probe
from input_pipeline import pipeline


class Features(NamedTuple):
  """Features of a whole split as global arrays sharded by rows over the mesh.

  No process holds them all on a multi-host mesh; rows whose `mask` is False
  are padding (the padded tail of the last eval batch). The rows are the
  split's in the order the devices hold them (`_stack_rows`), not the
  split's own: `index` says which example each row is. The kNN and the probe
  do not depend on the order; `first_rows` restores it.
  """
  x: jax.Array      # [M_pad, F] float32
  label: jax.Array  # [M_pad] int32
  mask: jax.Array   # [M_pad] bool
  index: jax.Array  # [M_pad] int32, the row's position in the split


def make_feature_fn(model, mesh):
  """Jitted (variables, images uint8 [B,H,W,C]) -> features [B, F].

  `variables=None` gives the raw-pixel baseline (flattened, in [0, 1]). Built
  once per run: every later call with the same shapes reuses the compilation
  (the online kNN calls it every `knn_every_steps`).
  """
  rows = NamedSharding(mesh, P('data'))

  @functools.partial(jax.jit, out_shardings=rows)
  def features(variables, images):
    x = images.astype(jnp.float32) / 255.
    if variables is None:
      return x.reshape(x.shape[0], -1)
    return model.apply(variables, x, train=False)['features']

  return features


@functools.partial(jax.jit, static_argnums=(0,))
def _stack_rows(sharding, xs, labels, masks) -> Features:
  """The batches of a split as one Features, without moving a row.

  Batch i [B, ...] is sharded by rows over the mesh; stacking the batches on
  axis 1 ([B, n, ...]) and merging the two axes keeps every row on the device
  (and host) that computed it, where concatenating the batches in the split's
  order would send most rows to another device: on a pod, the whole feature
  matrix across hosts. Row b * n + i holds example i * B + b (`index`).
  """
  b, n = xs[0].shape[0], len(xs)
  merge = lambda parts: jax.lax.with_sharding_constraint(
      jnp.stack(parts, axis=1).reshape((b * n,) + parts[0].shape[1:]),
      sharding)
  index = jnp.arange(n)[None, :] * b + jnp.arange(b)[:, None]
  return Features(merge(xs), merge(labels), merge(masks),
                  jax.lax.with_sharding_constraint(
                      index.reshape(-1).astype(jnp.int32), sharding))


def num_batches(source, batch_size: int) -> int:
  return -(-len(source) // batch_size)


def extract_features(feature_fn, variables, source, mesh, batch_size: int,
                     bar=progress.NO_BAR) -> Features:
  """Frozen, un-augmented features of every example of `source`.

  Each process reads only its part of every eval batch (`eval_batches`); the
  features stay on the devices, sharded by rows. `bar` advances by one per
  batch.
  """
  rows = NamedSharding(mesh, P('data'))
  xs, labels, masks = [], [], []
  for batch in pipeline.eval_batches(source, batch_size=batch_size,
                                     sharding=rows):
    xs.append(feature_fn(variables, batch['image']))
    labels.append(batch['label'])
    masks.append(batch['mask'])
    bar.update(1)
  return _stack_rows(rows, tuple(xs), tuple(labels), tuple(masks))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _first_rows(features: Features, n: int, replicated):
  """(x, label, mask) of the rows of index < n, in index order, replicated."""
  take = jnp.argsort(features.index)[:n]
  return jax.lax.with_sharding_constraint(
      (features.x[take], features.label[take], features.mask[take]),
      replicated)


def first_rows(features: Features, n: int) -> tuple[np.ndarray, np.ndarray]:
  """The split's first `n` real examples (x [n, F], labels [n]) in its own
  order, on every host, as numpy.

  The rows are picked by `index` and replicated by a jitted gather first, so
  this works when no process holds the whole sharded array (multi-host).
  """
  n = min(n, features.x.shape[0])
  replicated = NamedSharding(features.x.sharding.mesh, P())
  x, label, mask = jax.device_get(_first_rows(features, n, replicated))
  return x[mask], label[mask]


def variables_of(state):
  return {'params': state.params, 'batch_stats': state.batch_stats}


# Units of an evaluation bar the probe fills, in step with its iterations.
PROBE_UNITS = 10


def score(name: str, train: Features, test: Features, *, config, mesh,
          num_classes: int, features_seconds: float,
          bar=progress.NO_BAR) -> dict[str, float]:
  """kNN and linear-probe accuracy of one representation, keys prefixed.

  `bar` advances by one after the kNN and by PROBE_UNITS over the probe.
  The log line gives the time of each part (`features_seconds`: the
  caller's extraction of `train` and `test`).
  """
  t0 = time.time()
  ev = config.eval
  out = {}
  bar.set_postfix_str('kNN')
  knn_res = knn.knn_evaluate(
      train.x, train.label, test.x, test.label, num_classes=num_classes,
      ks=tuple(ev.knn_ks), temperature=ev.knn_temperature, mesh=mesh,
      bank_mask=train.mask, query_mask=test.mask)
  out.update({f'{name}/{k}': float(v) for k, v in knn_res.items()})
  t_knn = time.time() - t0
  bar.update(1)
  bar.set_postfix_str('linear probe (L-BFGS)')
  shown = [0]    # Probe units shown so far: PROBE_UNITS over max_iter.

  def on_progress(iterations, max_iter):
    units = PROBE_UNITS * iterations // max_iter
    bar.update(units - shown[0])
    shown[0] = units
    bar.set_postfix_str(f'linear probe (L-BFGS), iteration {iterations}'
                        f'/{max_iter}')

  if ev.linear_max_iter > 0:    # 0: no fast probe (e.g. when the papers'
    lin = linear_probe.logistic_regression(     # linear evaluation runs).
        train.x, train.label, test.x, test.label, num_classes=num_classes,
        l2=ev.linear_l2, max_iter=ev.linear_max_iter, train_mask=train.mask,
        test_mask=test.mask, on_progress=on_progress)
    out.update({f'{name}/linear_{k}': float(v) for k, v in lin.items()})
  bar.update(PROBE_UNITS - shown[0])    # Converged early: the rest at once.
  bar.set_postfix_str('')
  # The headline numbers; results.json has every metric.
  times = [f'features {features_seconds:.1f} s', f'kNN {t_knn:.1f} s',
           f'probe {time.time() - t0 - t_knn:.1f} s']
  logging.info('%s: %s (%s)', name, ', '.join(
      f'{k.split("/")[1]} {100 * v:.2f}%' for k, v in out.items()
      if k.endswith('top1') or 'weighted_top1@' in k), ', '.join(times))
  return out



def evaluate_all(config, feature_fn, states: dict, train_data, test_data,
                 mesh) -> tuple[dict[str, float], dict]:
  """Scores raw pixels (if config.eval.baselines) and each state in `states`.

  `states` maps a name to a train state ('trained' always; the others, e.g.
  'random_init', only with config.eval.baselines).

  Returns:
    (results, embeddings): the accuracies, keys '<representation>/<metric>',
    and 'eval_seconds' (the whole evaluation, logged too);
    and per representation the first `config.eval.embedding_points`
    evaluation examples' (features [n, F], labels [n]) as numpy, for
    `plot_run` (none when 0).
  """
  num_classes = max(train_data.num_classes, test_data.num_classes)
  kw = dict(config=config, mesh=mesh, num_classes=num_classes)
  reps = {'raw_pixels': None} if config.eval.baselines else {}
  reps.update({name: variables_of(state) for name, state in states.items()
               if name == 'trained' or config.eval.baselines})
  results, embeddings = {}, {}
  bs = config.eval.batch_size
  t0 = time.time()
  for name, variables in reps.items():
    # Units: every feature batch of both splits, the kNN, the probe's chunks.
    total = (num_batches(train_data, bs) + num_batches(test_data, bs) + 1 +
             PROBE_UNITS)
    with progress.bar(total, f'evaluating {name}', rate=False) as bar:
      t_features = time.time()
      train, test = jax.block_until_ready(tuple(
          extract_features(feature_fn, variables, d, mesh, bs, bar=bar)
          for d in (train_data, test_data)))
      results.update(score(name, train, test, bar=bar,
                           features_seconds=time.time() - t_features, **kw))
    if points := config.eval.get('embedding_points', 2000):
      embeddings[name] = first_rows(test, points)
  results['eval_seconds'] = round(time.time() - t0, 1)
  logging.info('Evaluation: %d representation(s) in %.1f s.', len(reps),
               results['eval_seconds'])
  return results, embeddings


def papers_linear_eval(config, model, variables, train_data, test_data, mesh,
                       *, preset: str | None = None, epochs: int = 0,
                       prefix: str = 'trained/linear_eval') -> dict[str, Any]:
  """The papers' linear evaluation of one encoder (`linear_eval.py`).

  `preset` defaults to `config.eval.linear_eval`; `epochs` and
  `config.eval.linear_eval_batch_size` override the preset's when > 0.
  Returns the numeric results with keys '<prefix>_top1' (last epoch),
  '<prefix>_top5', '<prefix>_top1_best', ...
  """
  # .get: a config.json written before these options existed has none.
  ev = config.eval
  preset = preset or ev.get('linear_eval', '')
  cfg = linear_eval.get_config(
      preset, epochs=epochs or ev.get('linear_eval_epochs', 0),
      batch_size=ev.get('linear_eval_batch_size', 0))
  out = linear_eval.linear_evaluation(
      model, variables, train_data, test_data, mesh, cfg=cfg,
      num_classes=max(train_data.num_classes, test_data.num_classes),
      seed=config.seed, eval_batch_size=ev.batch_size,
      num_workers=config.dataset.num_workers,
      bar_desc=f'linear evaluation ({preset})')
  names = {'top1_last': 'top1', 'top5_last': 'top5'}
  return {f'{prefix}_{names.get(k, k)}': v for k, v in out.items()
          if isinstance(v, (int, float))}


def online_knn(config, feature_fn, state, train_data, test_data, mesh
               ) -> dict[str, float]:
  """The periodic online kNN monitor on fixed subsets of the data.

  Bank: the first `config.online.knn_bank_size` training examples; queries:
  the first `config.online.knn_num_queries` test examples (un-augmented).
  Cheaper than the final evaluation and labelled `online/` so that the two
  are never confused.
  """
  oc = config.online
  sub = lambda d, n: pipeline.Subset(d, np.arange(min(n, len(d))))
  bank, queries = (sub(train_data, oc.knn_bank_size),
                   sub(test_data, oc.knn_num_queries))
  variables = variables_of(state)
  feats = [extract_features(feature_fn, variables, d, mesh,
                            config.eval.batch_size) for d in (bank, queries)]
  num_classes = max(train_data.num_classes, test_data.num_classes)
  k = min(oc.knn_k, len(bank))
  res = knn.knn_evaluate(feats[0].x, feats[0].label, feats[1].x,
                         feats[1].label, num_classes=num_classes, ks=(k,),
                         temperature=config.eval.knn_temperature, mesh=mesh,
                         bank_mask=feats[0].mask, query_mask=feats[1].mask)
  return {f'online/knn_top1@{k}': float(res[f'knn_weighted_top1@{k}'])}


def _curve(ax, history, key, **kw) -> bool:
  """Plots `key` of the history entries that have it; False if none has."""
  points = [(h['step'], h[key]) for h in history if key in h]
  if points:
    ax.plot(*zip(*points), **kw)
  return bool(points)


def plot_run(history, results, embeddings, path: str) -> None:
  """Writes summary.png: what a run did and what it learnt.

  Panels: (1) the loss and the learning rate; (2) the online monitors (the
  linear probe's training-batch accuracy, the periodic kNN) over steps;
  (3) alignment and uniformity of the batch's embeddings (Wang & Isola 2020,
  lower is better); (4) the final kNN and linear accuracy of the trained
  encoder against the baselines; (5, 6) t-SNE maps of test features of the
  trained encoder and of the first baseline, coloured by class.
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from contrastive_jax.evaluators import diagnostics  # pylint: disable=g-import-not-at-top

  # No pyplot: the global backend (a notebook's) is left alone.
  fig = Figure(figsize=(16, 9), dpi=90)
  FigureCanvasAgg(fig)
  axes = fig.subplots(2, 3)
  ax = axes[0, 0]
  _curve(ax, history, 'loss', color='C0')
  ax.set(xlabel='step', ylabel='training loss', title='Loss and learning rate')
  ax_lr = ax.twinx()
  if _curve(ax_lr, history, 'learning_rate', color='C1', linestyle='--'):
    ax_lr.set_ylabel('learning rate (dashed)', color='C1')

  ax = axes[0, 1]
  knn_keys = sorted({k for h in history for k in h
                     if k.startswith('online/knn')})
  for key, label in ([('online/linear_acc', 'linear probe (training batch)')]
                     + [(k, k.split('/')[1] + ' (test subset)')
                        for k in knn_keys]):
    _curve(ax, history, key, marker='.' if 'knn' in key else None,
           label=label)
  ax.set(xlabel='step', ylabel='accuracy', title='Online monitors')
  if ax.lines:
    ax.legend(fontsize='small')

  ax = axes[0, 2]
  _curve(ax, history, 'alignment', color='C2', label='alignment')
  ax.set(xlabel='step', title='Alignment and uniformity (lower is better)')
  ax.set_ylabel('alignment', color='C2')
  ax_u = ax.twinx()
  if _curve(ax_u, history, 'uniformity', color='C3', label='uniformity'):
    ax_u.set_ylabel('uniformity', color='C3')

  ax = axes[1, 0]
  reps = [r for r in ('raw_pixels', 'random_init', 'trained')
          if f'{r}/linear_top1' in results]
  knn_key = next((k.split('/', 1)[1] for k in sorted(results)
                  if k.startswith('trained/knn_weighted_top1')), None)
  for j, (metric, label) in enumerate([(knn_key, 'kNN'),
                                       ('linear_top1', 'linear')]):
    vals = [100 * results.get(f'{r}/{metric}', float('nan')) for r in reps]
    ys = np.arange(len(reps)) + (j - 0.5) * 0.38
    ax.barh(ys, vals, height=0.38, label=label)
    for y, v in zip(ys, vals):
      ax.text(v, y, f' {v:.1f}', va='center', fontsize=8)
  ax.set_yticks(range(len(reps)), reps)
  ax.set(xlim=(0, 110), xlabel='test accuracy (%)',
         title='Frozen features: trained vs baselines')
  ax.legend(fontsize='small', loc='lower right')

  shown = [r for r in ('trained', 'random_init', 'raw_pixels')
           if r in embeddings][:2]
  for ax, rep in zip(axes[1, 1:], shown):
    x, labels = embeddings[rep]
    diagnostics.scatter_classes(ax, diagnostics.project_2d(x, 'tsne'),
                                labels, legend=rep == 'trained')
    ax.set(xticks=[], yticks=[],
           title=f't-SNE of {len(x)} test features: {rep}')
  for ax in axes[1, 1 + len(shown):]:
    ax.set_axis_off()
  fig.tight_layout()
  fig.savefig(path)


def summary(results: dict, workdir: str) -> str:
  """A one-screen text summary of a finished run."""
  rows = [n for n in ('raw_pixels', 'random_init', 'trained')
          if any(k.startswith(n + '/') for k in results)]
  knn_key = next((k.split('/', 1)[1] for k in sorted(results)
                  if k.startswith('trained/knn_weighted_top1')), None)
  lines = ['', '=' * 64,
           f'{"representation":<16}{knn_key or "knn":>26}{"linear_top1":>14}',
           '-' * 64]
  for n in rows:
    knn_v = results.get(f'{n}/{knn_key}', float('nan'))
    lin_v = results.get(f'{n}/linear_top1', float('nan'))
    lines.append(f'{n:<16}{100 * knn_v:>25.2f}%{100 * lin_v:>13.2f}%')
  if 'trained/linear_eval_top1' in results:
    label = "trained, the papers' linear evaluation"
    lines.append(f'{label:<42}'
                 f'{100 * results["trained/linear_eval_top1"]:>21.2f}%')
  if skipped := results.get('data/skipped_records'):
    lines.append(f'{skipped} undecodable images replaced in training, left '
                 'out of the scores (data/skipped_files)')
  lines += ['-' * 64,
            f'steps {results.get("steps")}, training {results.get("train_seconds")}'
            f' s, {results.get("images_per_sec", float("nan")):.0f} images/s, '
            f'final loss {results.get("final_loss", float("nan")):.4f}',
            f'results: {workdir}/results.json  plot: {workdir}/summary.png',
            f'TensorBoard: tensorboard --logdir {workdir}', '=' * 64]
  return '\n'.join(lines)
