"""What every evaluator shares: its config entry, the data it runs on, and
the representation it scores.

An evaluator is built from one entry of `config.evals` and called on a
`Representation` (an encoder's variables, or raw pixels); it returns named
metrics (Python floats). The same objects run

* after training, on the trained encoder and the baselines
  (`evaluators.run_final`, entries with `every_steps == 0`);
* during training, on the current state (`evaluators.run_online`, entries
  with `every_steps > 0`; keys 'online/...');
* on a saved checkpoint (`eval_checkpoint.evaluate_checkpoint`).

A representation extracts each split's features once, however many
evaluators read them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import ml_collections
import numpy as np

from contrastive_jax import progress
from contrastive_jax.evaluators import features as features_lib
from input_pipeline import pipeline


@dataclasses.dataclass
class Env:
  """The run an evaluator runs in: config, model, mesh and data.

  `train` is the labelled set a classifier or the kNN bank is fit on,
  `test` the split scored (`config.eval.split`); `feature_fn` is
  `features.make_feature_fn(model, mesh)`, built once per run. `outdir`
  receives files (plots); None writes none.
  """
  config: ml_collections.ConfigDict
  model: Any
  mesh: Any
  train: Any
  test: Any
  feature_fn: Any
  outdir: str | None = None

  @property
  def num_classes(self) -> int:
    return max(self.train.num_classes, self.test.num_classes)


class Representation:
  """One encoder (or raw pixels, `variables=None`) under evaluation.

  `features(split, limit)` extracts the frozen features of the first `limit`
  examples of 'train' or 'test' (0: all) once and keeps them for the next
  evaluator. `bar` is the progress bar the extraction advances.
  """

  def __init__(self, name: str, variables, env: Env, bar=progress.NO_BAR):
    self.name, self.variables, self.env, self.bar = name, variables, env, bar
    self._cache = {}

  def _limit(self, split: str, limit: int) -> int:
    """`limit`, or 0 when it takes the whole split."""
    data = {'train': self.env.train, 'test': self.env.test}[split]
    return limit if 0 < limit < len(data) else 0

  def source(self, split: str, limit: int = 0):
    """The 'train' or 'test' source, or its first `limit` examples."""
    data = {'train': self.env.train, 'test': self.env.test}[split]
    if self._limit(split, limit):
      data = pipeline.Subset(data, np.arange(limit))
    return data

  def features(self, split: str, limit: int = 0) -> features_lib.Features:
    key = (split, self._limit(split, limit))
    if key not in self._cache:
      self._cache[key] = features_lib.extract_features(
          self.env.feature_fn, self.variables, self.source(split, limit),
          self.env.mesh, self.env.config.eval.batch_size, bar=self.bar)
    return self._cache[key]


class Evaluator:
  """Base class: built from a `config.evals` entry, called on a representation.

  Subclasses set `type` (the registry name, `config.evals.<name>.type`),
  `DEFAULTS` (their fields and defaults; `config_lib.with_defaults` fills an
  entry from them) and `__call__`. `baselines = False` keeps an evaluator to
  the trained encoder (an expensive one, or one meaningless on raw pixels).
  `units(env)` is its share of a progress bar.
  """
  type: ClassVar[str] = ''
  DEFAULTS: ClassVar[dict[str, Any]] = {}
  baselines: ClassVar[bool] = True

  def __init__(self, name: str, cfg: ml_collections.ConfigDict):
    self.name = name
    self.cfg = cfg
    self.every_steps = int(cfg.every_steps)

  def validate(self, config, *, num_devices: int,
               num_train: int | None = None) -> None:
    """Raises ValueError for settings that cannot run (before training)."""

  def units(self, env: Env) -> int:
    return 1

  def __call__(self, rep: Representation, *, bar=progress.NO_BAR
               ) -> dict[str, float]:
    raise NotImplementedError
