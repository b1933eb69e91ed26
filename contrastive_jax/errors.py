"""User errors: a config or its data that cannot run, found before any work.
The entry points print a `ConfigError` without a traceback.
"""

from __future__ import annotations

import contextlib


class ConfigError(ValueError):
  """Every problem found, each naming the field and the fix: one line, or a
  numbered list."""

  def __init__(self, problems):
    self.problems = tuple(problems)
    if len(self.problems) == 1:
      text = self.problems[0]
    else:
      text = f'{len(self.problems)} problems:\n' + '\n'.join(
          f'  {i}. {p}' for i, p in enumerate(self.problems, 1))
    super().__init__(text)


class Problems:
  """Collects the ValueErrors of `with problems.check():` blocks (each
  message once); `raise_any` raises them as one ConfigError."""

  def __init__(self):
    self.found: list[str] = []

  @contextlib.contextmanager
  def check(self):
    try:
      yield
    except ValueError as e:
      for problem in getattr(e, 'problems', None) or (str(e),):
        if problem not in self.found:
          self.found.append(problem)

  def raise_any(self) -> None:
    if self.found:
      raise ConfigError(self.found)
