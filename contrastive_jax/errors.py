"""User errors: a config or its data that cannot run, found before any work.

`ConfigError` carries every problem the checks found (`Problems` collects
them), each naming the field and the fix; the command-line entry points print
it as it is, without a traceback (`--verbosity=1` shows one).
"""

from __future__ import annotations

import contextlib


class ConfigError(ValueError):
  """A config, or its data, that cannot run: every problem found, at once.

  Raised before anything is written to the workdir. `problems` holds one
  message per problem, each naming the field and the fix; the message is
  that one line, or a numbered list of them.
  """

  def __init__(self, problems):
    self.problems = tuple(problems)
    if len(self.problems) == 1:
      text = self.problems[0]
    else:
      text = f'{len(self.problems)} problems:\n' + '\n'.join(
          f'  {i}. {p}' for i, p in enumerate(self.problems, 1))
    super().__init__(text)


class Problems:
  """Runs independent checks and collects what each finds.

      problems = Problems()
      with problems.check():
        ...                        # a ValueError here is recorded
      problems.raise_any()         # ConfigError listing them all

  A check that fails because an earlier one did (e.g. an unknown method's
  own checks) repeats its message, which is kept once.
  """

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
