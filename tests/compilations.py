"""Counting the XLA programs a block of code builds."""

import contextlib

import jax

# Fired once per program jit builds: compiled, or loaded from the persistent
# compilation cache (which the tests use; conftest.py).
_EVENT = '/jax/core/compile/backend_compile_duration'


@contextlib.contextmanager
def programs_built():
  """Yields a list that gets one entry (seconds) per program built inside."""
  built = []

  def listener(event, duration, **_):
    if event == _EVENT:
      built.append(duration)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield built
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
