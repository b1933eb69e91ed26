"""End-of-run evaluation: frozen features -> weighted kNN and a linear probe.

Every representation is scored with the same two protocols on the test split:
the InstDisc/MoCo weighted kNN (cosine, k=200, T=0.1 by default) with the
un-augmented training set as the bank, and multinomial logistic regression on
L2-normalised features. Besides the trained encoder, the same numbers are
computed for raw pixels and for the randomly initialised encoder, so every
results.json says how much pretraining bought.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.evaluators import knn
from contrastive_jax.evaluators import linear_probe
from input_pipeline import pipeline


def extract_features(model, state, data: pipeline.ArrayDataset, mesh,
                     batch_size: int) -> np.ndarray:
  """Backbone features of every example, un-augmented, in eval mode: [M, F]."""
  sharding = NamedSharding(mesh, P('data'))

  @functools.partial(jax.jit, out_shardings=sharding)
  def features(params, batch_stats, images):
    x = images.astype(jnp.float32) / 255.
    out = model.apply({'params': params, 'batch_stats': batch_stats}, x,
                      train=False)
    return out['features']

  chunks = []
  for images, n_valid in pipeline.eval_batches(data, batch_size=batch_size,
                                               sharding=sharding):
    f = features(state.params, state.batch_stats, images)
    chunks.append(np.asarray(jax.device_get(f))[:n_valid])
  return np.concatenate(chunks)


def score(name: str, train_x, train_y, test_x, test_y, *, config, mesh,
          num_classes: int) -> dict[str, float]:
  """kNN and linear-probe accuracy of one representation, keys prefixed."""
  t0 = time.time()
  ev = config.eval
  out = {}
  knn_res = knn.knn_evaluate(train_x, train_y, test_x, test_y,
                             num_classes=num_classes, ks=tuple(ev.knn_ks),
                             temperature=ev.knn_temperature, mesh=mesh)
  out.update({f'{name}/{k}': float(v) for k, v in knn_res.items()})
  lin = linear_probe.logistic_regression(
      train_x, train_y, test_x, test_y, num_classes=num_classes,
      l2=ev.linear_l2, max_iter=ev.linear_max_iter)
  out.update({f'{name}/linear_{k}': float(v) for k, v in lin.items()})
  logging.info('%s: %s (%.1fs)', name,
               ', '.join(f'{k.split("/")[1]}={v:.4f}' for k, v in out.items()),
               time.time() - t0)
  return out


def evaluate_all(config, model, states: dict, train_data, test_data, mesh
                 ) -> dict[str, float]:
  """Scores raw pixels (if config.eval.baselines) and each state in `states`."""
  num_classes = max(train_data.num_classes, test_data.num_classes)
  kw = dict(config=config, mesh=mesh, num_classes=num_classes)
  results = {}
  if config.eval.baselines:
    flat = lambda d: d.images.reshape(d.num_examples, -1).astype(
        np.float32) / 255.
    results.update(score('raw_pixels', flat(train_data), train_data.labels,
                         flat(test_data), test_data.labels, **kw))
  for name, state in states.items():
    if name != 'trained' and not config.eval.baselines:
      continue
    feats = [extract_features(model, state, d, mesh, config.eval.batch_size)
             for d in (train_data, test_data)]
    results.update(score(name, feats[0], train_data.labels, feats[1],
                         test_data.labels, **kw))
  return results


def online_knn(config, model, state, train_data, test_data, mesh
               ) -> dict[str, float]:
  """The periodic online kNN monitor on fixed subsets of the data.

  Bank: the first `config.online.knn_bank_size` training examples; queries:
  the first `config.online.knn_num_queries` test examples (un-augmented).
  Cheaper than the final evaluation and labelled `online/` so that the two
  are never confused.
  """
  oc = config.online
  sub = lambda d, n: pipeline.ArrayDataset(d.images[:n], d.labels[:n])
  bank, queries = sub(train_data, oc.knn_bank_size), sub(test_data,
                                                        oc.knn_num_queries)
  feats = [extract_features(model, state, d, mesh, config.eval.batch_size)
           for d in (bank, queries)]
  num_classes = max(train_data.num_classes, test_data.num_classes)
  k = min(oc.knn_k, bank.num_examples)
  res = knn.knn_evaluate(feats[0], bank.labels, feats[1], queries.labels,
                         num_classes=num_classes, ks=(k,),
                         temperature=config.eval.knn_temperature, mesh=mesh)
  return {f'online/knn_top1@{k}': float(res[f'knn_weighted_top1@{k}'])}


def plot_run(history, results, path: str) -> None:
  """Writes a PNG: the loss curve and a bar chart of the final accuracies."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
  history = [h for h in history if 'loss' in h]
  if history:
    ax_loss.plot([h['step'] for h in history], [h['loss'] for h in history])
  ax_loss.set(xlabel='step', ylabel='training loss', title='Pretraining loss')
  accs = {k: v for k, v in results.items()
          if isinstance(v, float) and 'top1' in k and 'train_top1' not in k}
  names = sorted(accs)
  ax_acc.barh(range(len(names)), [100 * accs[n] for n in names])
  ax_acc.set_yticks(range(len(names)), names, fontsize=7)
  for i, n in enumerate(names):
    ax_acc.text(100 * accs[n], i, f' {100 * accs[n]:.1f}', va='center',
                fontsize=7)
  ax_acc.set(xlabel='test accuracy (%)', title='Frozen-feature evaluation')
  ax_acc.set_xlim(0, 105)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


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
  lines += ['-' * 64,
            f'steps {results.get("steps")}, training {results.get("train_seconds")}'
            f' s, {results.get("images_per_sec", float("nan")):.0f} images/s, '
            f'final loss {results.get("final_loss", float("nan")):.4f}',
            f'results: {workdir}/results.json  plot: {workdir}/summary.png',
            f'TensorBoard: tensorboard --logdir {workdir}', '=' * 64]
  return '\n'.join(lines)
