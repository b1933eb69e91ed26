"""Progress bars for a person watching; nothing extra in log files.

    with progress.bar(total=936, desc='pretraining', initial=1) as bar:
      for ...:
        bar.update(1)
        bar.set_postfix_str('loss 3.21  620 img/s')

`bar` yields a tqdm bar (one line that updates, with rate and ETA) when bars
are on, else a no-op object with the same methods, so callers never branch.
Bars are on, by default ('auto'), on process 0 when stderr is a terminal: a
job's log file or a pod's per-host logs get the periodic log lines instead.
`main.py --progress=on|off` or `configure()` overrides that (a notebook, whose
stderr is no terminal, turns them on).

While a bar is shown, absl's log lines are printed above it (`tqdm.write`)
instead of breaking it in two.
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


class _NoBar:
  """tqdm's methods that callers use, doing nothing."""

  def update(self, n: int = 1) -> None:
    del n

  def set_postfix_str(self, s: str = '', refresh: bool = True) -> None:
    del s, refresh

  def restart_clock(self) -> None:
    pass


NO_BAR = _NoBar()   # The default of functions that take an optional bar.


class _Bar(tqdm.tqdm):

  def restart_clock(self) -> None:
    """Rate and ETA from now on count only the units after this call (e.g.
    after a compiling first step, whose time would distort both)."""
    self.initial = self.n
    self.start_t = self.last_print_t = time.time()
    self.refresh()


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
  """A progress bar over `total` units (see the module docstring).

  `rate=False` leaves out the units per second and the time remaining: for
  units of unequal cost, which would make both wrong.
  """
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
