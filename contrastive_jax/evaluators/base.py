"""What every evaluator shares: its config, the run and what it scores."""

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
  """The run an evaluator runs in; `outdir` for plots (None: none)."""
  config: ml_collections.ConfigDict
  model: Any
  mesh: Any
  train: Any                        # What a classifier or kNN bank fits.
  test: Any                         # The split scored.
  feature_fn: Any
  outdir: str | None = None

  @property
  def num_classes(self) -> int:
    return max(self.train.num_classes, self.test.num_classes)


class Representation:
  """One encoder (or raw pixels, `variables=None`) under evaluation, whose
  `features(split, limit)` of the first `limit` examples (0: all) it
  extracts once, advancing `bar`."""

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
  """Built from a `config.evals` entry, called on a representation; a
  subclass sets `type`, `DEFAULTS` (its fields) and `__call__`; `baselines =
  False` keeps it to the trained encoder; `units(env)`: its share of a
  progress bar (0: its own bar)."""
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
