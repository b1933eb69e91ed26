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
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax.evaluators import knn
from contrastive_jax.evaluators import linear_probe
from input_pipeline import pipeline


class Features(NamedTuple):
  """Features of a whole split as global arrays sharded by rows over the mesh.

  No process holds them all on a multi-host mesh; rows whose `mask` is False
  are padding (the padded tail of the last eval batch).
  """
  x: jax.Array      # [M_pad, F] float32
  label: jax.Array  # [M_pad] int32
  mask: jax.Array   # [M_pad] bool


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
def _concat(sharding, *parts):
  return jax.lax.with_sharding_constraint(jnp.concatenate(parts), sharding)


def extract_features(feature_fn, variables, source, mesh,
                     batch_size: int) -> Features:
  """Frozen, un-augmented features of every example of `source`.

  Each process reads only its part of every eval batch (`eval_batches`); the
  features stay on the devices, sharded by rows.
  """
  rows = NamedSharding(mesh, P('data'))
  xs, labels, masks = [], [], []
  for batch in pipeline.eval_batches(source, batch_size=batch_size,
                                     sharding=rows):
    xs.append(feature_fn(variables, batch['image']))
    labels.append(batch['label'])
    masks.append(batch['mask'])
  return Features(_concat(rows, *xs), _concat(rows, *labels),
                  _concat(rows, *masks))


def _variables(state):
  return {'params': state.params, 'batch_stats': state.batch_stats}


def score(name: str, train: Features, test: Features, *, config, mesh,
          num_classes: int) -> dict[str, float]:
  """kNN and linear-probe accuracy of one representation, keys prefixed."""
  t0 = time.time()
  ev = config.eval
  out = {}
  knn_res = knn.knn_evaluate(
      train.x, train.label, test.x, test.label, num_classes=num_classes,
      ks=tuple(ev.knn_ks), temperature=ev.knn_temperature, mesh=mesh,
      bank_mask=train.mask, query_mask=test.mask)
  out.update({f'{name}/{k}': float(v) for k, v in knn_res.items()})
  lin = linear_probe.logistic_regression(
      train.x, train.label, test.x, test.label, num_classes=num_classes,
      l2=ev.linear_l2, max_iter=ev.linear_max_iter, train_mask=train.mask,
      test_mask=test.mask)
  out.update({f'{name}/linear_{k}': float(v) for k, v in lin.items()})
  logging.info('%s: %s (%.1fs)', name,
               ', '.join(f'{k.split("/")[1]}={v:.4f}' for k, v in out.items()),
               time.time() - t0)
  return out


def evaluate_all(config, feature_fn, states: dict, train_data, test_data,
                 mesh) -> dict[str, float]:
  """Scores raw pixels (if config.eval.baselines) and each state in `states`.

  `states` maps a name to a train state ('trained' always; the others, e.g.
  'random_init', only with config.eval.baselines).
  """
  num_classes = max(train_data.num_classes, test_data.num_classes)
  kw = dict(config=config, mesh=mesh, num_classes=num_classes)
  reps = {'raw_pixels': None} if config.eval.baselines else {}
  reps.update({name: _variables(state) for name, state in states.items()
               if name == 'trained' or config.eval.baselines})
  results = {}
  for name, variables in reps.items():
    train, test = (extract_features(feature_fn, variables, d, mesh,
                                    config.eval.batch_size)
                   for d in (train_data, test_data))
    results.update(score(name, train, test, **kw))
  return results


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
  variables = _variables(state)
  feats = [extract_features(feature_fn, variables, d, mesh,
                            config.eval.batch_size) for d in (bank, queries)]
  num_classes = max(train_data.num_classes, test_data.num_classes)
  k = min(oc.knn_k, len(bank))
  res = knn.knn_evaluate(feats[0].x, feats[0].label, feats[1].x,
                         feats[1].label, num_classes=num_classes, ks=(k,),
                         temperature=config.eval.knn_temperature, mesh=mesh,
                         bank_mask=feats[0].mask, query_mask=feats[1].mask)
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
