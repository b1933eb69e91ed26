"""contrastive_jax.progress: when bars show, and that they hand the log
stream back (the whole-run behaviour: tests/test_main.py)."""

import pytest
from absl import logging

from contrastive_jax import progress


@pytest.fixture(autouse=True)
def _restore_mode():
  yield
  progress.configure('auto')


def test_modes():
  with pytest.raises(ValueError, match="'auto', 'on', 'off'"):
    progress.configure('yes')
  progress.configure('off')
  assert not progress.enabled()
  progress.configure('on')
  assert progress.enabled()
  progress.configure('auto')     # pytest's stderr is no terminal.
  assert not progress.enabled()


def test_bar_routes_logs_above_it_and_restores_the_stream():
  handler = logging.get_absl_handler().python_handler
  before = handler.stream
  progress.configure('on')
  with progress.bar(3, 'x') as bar:
    assert handler.stream is not before
    bar.update(3)
    assert bar.n == 3
  assert handler.stream is before
  progress.configure('off')
  with progress.bar(3, 'x') as bar:
    assert bar is progress.NO_BAR and handler.stream is before
