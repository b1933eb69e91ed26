"""Progress bars for a person watching; nothing extra in log files.

`bar` yields a tqdm bar, or a no-op object with the same methods. Bars show
by default ('auto') on process 0 when stderr is a terminal; `--progress` or
`configure` overrides that. While a bar shows, absl's lines print above it.
"""

from __future__ import annotations

import contextlib
import sys
import time

import jax
import tqdm
from absl import logging

_MODES = ('auto', 'on', 'off')
_mode = 'auto'


def configure(mode: str) -> None:
  """Sets when bars are shown: 'auto' (a terminal), 'on' or 'off'."""
  global _mode
  if mode not in _MODES:
    raise ValueError(f'progress mode must be one of {_MODES}; got {mode!r}.')
  _mode = mode


def enabled() -> bool:
  """Whether `bar` shows a bar here (process 0 only: one bar per job)."""
  if _mode == 'off' or jax.process_index() != 0:
    return False
  return _mode == 'on' or sys.stderr.isatty()


class _Bar(tqdm.tqdm):

  def restart_clock(self) -> None:
    """Rate and ETA count only the units after this call."""
    self.initial = self.n
    self.start_t = self.last_print_t = time.time()
    self.refresh()


# A bar that does nothing: the default of functions that take an optional one.
NO_BAR = _Bar(disable=True)


class _AboveBar:
  """A stream for absl's handler: each record is written above the bar."""

  def write(self, s: str) -> None:
    s = s.rstrip('\n')
    if s:
      tqdm.tqdm.write(s, file=sys.stderr)

  def flush(self) -> None:
    sys.stderr.flush()


@contextlib.contextmanager
def bar(total: int, desc: str, *, initial: int = 0, unit: str = 'step',
        rate: bool = True):
  """A progress bar over `total` units; `rate=False`: no rate and ETA."""
  if not enabled():
    yield NO_BAR
    return
  handler = logging.get_absl_handler().python_handler
  stream = handler.stream
  with _Bar(total=total, initial=initial, desc=desc, unit=unit,
            file=sys.stderr, dynamic_ncols=True, leave=True,
            # Redraw at most twice a second: the bar never slows a step.
            mininterval=0.5,
            bar_format=None if rate else
            '{desc}: {percentage:3.0f}%|{bar}| {elapsed}{postfix}'
            ) as b:
    handler.stream = _AboveBar()
    try:
      yield b
    finally:
      handler.stream = stream
