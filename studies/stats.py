"""The studies' statistics: per-seed cells, paired t-tests, Holm's correction.

A claim compares runs of the same seed (they share their initial weights and
data order), so its test reads the per-seed differences: the paired t-test,
t = mean(d) / (sd(d) / sqrt(n)) on n - 1 degrees of freedom, with Holm's
step-down adjustment over the family of tests.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

ALPHA = 0.05


@dataclasses.dataclass
class Cell:
  """Accuracies of one arm over its seeds: mean and sample sd."""
  values: list[float]

  @property
  def n(self) -> int:
    return len(self.values)

  @property
  def mean(self) -> float:
    return sum(self.values) / self.n if self.n else math.nan

  @property
  def std(self) -> float:
    """Sample standard deviation (ddof = 1); nan below 2 seeds."""
    if self.n < 2:
      return math.nan
    m = self.mean
    return math.sqrt(sum((v - m) ** 2 for v in self.values) / (self.n - 1))


@dataclasses.dataclass(frozen=True)
class Paired:
  """Mean of per-seed differences, its t-based 95% CI and two-sided p.

  The paired t-test: t = mean / (sd / sqrt(n)) with n - 1 degrees of
  freedom (scipy.stats.ttest_1samp on the differences, the same as
  scipy.stats.ttest_rel on the pairs). nan below 2 seeds.
  """
  diffs: tuple[float, ...]

  @property
  def n(self) -> int:
    return len(self.diffs)

  @property
  def mean(self) -> float:
    return sum(self.diffs) / self.n if self.n else math.nan

  def se(self) -> float:
    """Standard error of the mean, sd / sqrt(n); nan below 2 seeds."""
    if self.n < 2:
      return math.nan
    m = self.mean
    return math.sqrt(sum((d - m) ** 2 for d in self.diffs) /
                     (self.n - 1) / self.n)

  @property
  def ci(self) -> tuple[float, float]:
    if self.n < 2:
      return math.nan, math.nan
    from scipy import stats  # pylint: disable=g-import-not-at-top
    half = stats.t.ppf(0.975, self.n - 1) * self.se()
    return self.mean - half, self.mean + half

  @property
  def p(self) -> float:
    if self.n < 2:
      return math.nan
    if self.se() == 0:
      return 1. if self.mean == 0 else 0.
    from scipy import stats  # pylint: disable=g-import-not-at-top
    return float(stats.ttest_1samp(self.diffs, 0.).pvalue)

  def fmt(self) -> str:
    if not self.n:
      return '-'
    if self.n < 2:
      return f'{self.mean:+.2f} (n=1)'
    lo, hi = self.ci
    return f'{self.mean:+.2f} [{lo:+.2f}, {hi:+.2f}]'


def holm(pvalues: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p values (family-wise error), input order.

  Sorted ascending, p_(i) (i = 1..m) becomes max_{j <= i} (m - j + 1) p_(j),
  capped at 1; nan entries are left out of the family and stay nan.
  """
  idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)),
               key=lambda i: pvalues[i])
  m, out, running = len(idx), [math.nan] * len(pvalues), 0.
  for rank, i in enumerate(idx):
    running = max(running, min(1., (m - rank) * pvalues[i]))
    out[i] = running
  return out


def verdict(mean: float, p_adjusted: float) -> str:
  """A directional claim's verdict from its Holm-adjusted p value."""
  if math.isnan(p_adjusted):
    return 'not run yet (fewer than 2 seeds)'
  if p_adjusted < ALPHA:
    return 'supported' if mean > 0 else 'contradicted'
  return 'inconclusive'


def fmt_p(p: float) -> str:
  """A p value for a report's table: 3 decimals, or 1.2e-04 below 0.001."""
  return '-' if math.isnan(p) else (f'{p:.3f}' if p >= 0.001 else f'{p:.1e}')
