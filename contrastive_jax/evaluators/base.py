"""What every evaluator shares: its config entry, the run's data, and the
representation it scores (an encoder's variables or raw pixels), whose
features each split extracts once for every evaluator. The same objects run
after training, during it and on a saved checkpoint.
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
  """The run an evaluator runs in: `train` (what a classifier or kNN bank is
  fit on), `test` (the split scored), `feature_fn`
  (`features.make_feature_fn`), `outdir` for plots (None: none)."""
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
  """One encoder (or raw pixels, `variables=None`) under evaluation;
  `features(split, limit)` extracts the first `limit` examples' (0: all) once,
  advancing `bar`."""

  def __init__(self, name: str, variables, env: Env, bar=progress.NO_BAR):
    self.name, self.variables, self.env, self.bar = name, variables, env, bar
    self._cache = {}

  def source(self, split: str, limit: int = 0):
    """The 'train' or 'test' source, or its first `limit` examples."""
    data = {'train': self.env.train, 'test': self.env.test}[split]
    if 0 < limit < len(data):
      data = pipeline.Subset(data, np.arange(limit))
    return data

  def features(self, split: str, limit: int = 0) -> features_lib.Features:
    data = self.source(split, limit)
    key = (split, len(data))
    if key not in self._cache:
      self._cache[key] = features_lib.extract_features(
          self.env.feature_fn, self.variables, data, self.env.mesh,
          self.env.config.eval.batch_size, bar=self.bar)
    return self._cache[key]


class Evaluator:
  """Built from a `config.evals` entry, called on a representation.

  Subclasses set `type` (`config.evals.<name>.type`), `DEFAULTS` (their
  fields) and `__call__`; `baselines = False` keeps one to the trained
  encoder; `units(env)` is its share of a progress bar.
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
