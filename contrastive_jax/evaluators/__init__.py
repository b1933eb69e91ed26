"""Evaluators of frozen representations, built from `config.evals`, e.g.
`config.evals.knn = dict(type='knn', every_steps=0, ks=(200,))`: `type` is
a key of `TYPES`; `every_steps` 0 runs it once after training (keys
'<representation>/<metric>'), N > 0 every N steps and at the last (keys
'online/<metric>'), -1 never (docs/evaluation.md).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
from absl import logging

from contrastive_jax import errors
from contrastive_jax import progress
from contrastive_jax.evaluators import base
from contrastive_jax.evaluators import diagnostics
from contrastive_jax.evaluators import features as features_lib
from contrastive_jax.evaluators import knn
from contrastive_jax.evaluators import linear_eval
from contrastive_jax.evaluators import logreg

Env = base.Env
Evaluator = base.Evaluator
Representation = base.Representation

TYPES: dict[str, type[base.Evaluator]] = {
    cls.type: cls for cls in (knn.Knn, logreg.LogReg, linear_eval.LinearEval,
                              diagnostics.Diagnostics)}


def entry_defaults(name: str, entry) -> dict[str, Any]:
  """The defaults of `config.evals.<name>`: the common fields and its type's."""
  kind = entry.get('type', '') if entry is not None else ''
  if kind not in TYPES:
    raise ValueError(f'config.evals.{name}.type={kind!r}; known: '
                     f'{", ".join(sorted(TYPES))}.')
  return {'type': '', 'every_steps': 0, **TYPES[kind].DEFAULTS}


def build(config) -> dict[str, base.Evaluator]:
  """The evaluators of `config.evals` that are on (every_steps >= 0)."""
  out = {}
  for name, cfg in config.evals.items():
    if cfg.every_steps >= 0:
      out[name] = TYPES[cfg.type](name, cfg)
  return out


def validate(config, *, num_devices: int, num_train: int | None = None
             ) -> None:
  """Each evaluator's checks, and no two writing the same keys; raises
  `errors.ConfigError` with every problem found."""
  problems = errors.Problems()
  evaluators = build(config)
  for ev in evaluators.values():
    with problems.check():
      ev.validate(config, num_devices=num_devices, num_train=num_train)
  for online in (False, True):
    kinds = [ev.type for ev in evaluators.values()
             if (ev.every_steps > 0) == online]
    if len(kinds) != len(set(kinds)):
      problems.found.append(
          f'config.evals has two {"online" if online else "final"} '
          'evaluators of the same type, whose metrics would overwrite each '
          'other; turn one off (every_steps=-1).')
  problems.raise_any()


def run_final(evaluators: dict[str, base.Evaluator], variables: dict[str, Any],
              env: base.Env, *, baselines: bool = True
              ) -> tuple[dict[str, Any], dict]:
  """Runs the final evaluators on `variables['trained']` and, with
  `baselines`, raw pixels and the others. Returns (results '<rep>/<metric>'
  -> value, per rep the first `config.eval.embedding_points` test examples'
  (features, labels))."""
  final = [ev for ev in evaluators.values() if ev.every_steps == 0]
  reps = {'raw_pixels': None} if baselines else {}
  reps.update({k: v for k, v in variables.items()
               if k == 'trained' or baselines})
  bs = env.config.eval.batch_size
  results, embeddings, t0 = {}, {}, time.time()
  for name, rep_vars in reps.items():
    todo = [ev for ev in final if ev.baselines or name == 'trained']
    total = (features_lib.num_batches(env.train, bs) +
             features_lib.num_batches(env.test, bs) +
             sum(ev.units(env) for ev in todo))
    times = {}
    with progress.bar(total, f'evaluating {name}', rate=False) as bar:
      rep = base.Representation(name, rep_vars, env, bar=bar)
      t = time.time()
      jax.block_until_ready((rep.features('train'), rep.features('test')))
      times['features'] = time.time() - t
      out = {}
      for ev in [ev for ev in todo if ev.units(env)]:
        t = time.time()
        out.update(ev(rep, bar=bar))
        times[ev.name] = time.time() - t
      bar.set_postfix_str('')
    for ev in [ev for ev in todo if not ev.units(env)]:   # Own progress bar.
      t = time.time()
      out.update(ev(rep))
      times[ev.name] = time.time() - t
    headline = [f'{k} {100 * v:.2f}%' for k, v in out.items()
                if k.endswith('top1') or 'weighted_top1@' in k]
    logging.info('%s: %s (%s)', name, ', '.join(headline), ', '.join(
        f'{k} {v:.1f} s' for k, v in times.items()))
    results.update({f'{name}/{k}': v for k, v in out.items()})
    if points := env.config.eval.embedding_points:
      embeddings[name] = features_lib.first_rows(rep.features('test'), points)
  results['eval_seconds'] = round(time.time() - t0, 1)
  logging.info('Evaluation: %d representation(s) in %.1f s.', len(reps),
               results['eval_seconds'])
  return results, embeddings


def due(evaluators: dict[str, base.Evaluator], step: int, total_steps: int
        ) -> list[base.Evaluator]:
  """The online evaluators to run after `step` steps (and at the last)."""
  return [ev for ev in evaluators.values() if ev.every_steps > 0 and (
      step % ev.every_steps == 0 or step == total_steps)]


def run_online(evaluators: list[base.Evaluator], variables, env: base.Env
               ) -> dict[str, float]:
  """Runs online evaluators on the current encoder: keys 'online/<metric>'."""
  rep = base.Representation('online', variables, env)
  return {f'online/{k}': v for ev in evaluators for k, v in ev(rep).items()}


def config_entry(**fields) -> ml_collections.ConfigDict:
  """A `config.evals` entry: `type` and its fields, the rest defaulted."""
  return ml_collections.ConfigDict(
      {**entry_defaults('', fields), **fields})
