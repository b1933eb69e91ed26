"""Shared test set-up: 8 virtual CPU devices, no GPU for TensorFlow.

The device count must be fixed before jax initialises its backend, so it is set
here, in the first file pytest imports.
"""
import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402

# Tests compare against float64 numpy references; enabling x64 here would
# change the dtypes under test, so losses are checked in float32 to 1e-5.
jax.config.update('jax_default_matmul_precision', 'highest')


def compilation_cache_env(directory) -> dict[str, str]:
  """Environment giving a subprocess JAX's persistent compilation cache.

  For tests that start main.py (or a kernel) several times in sequence: the
  later runs load the programs the earlier ones compiled. It changes what is
  compiled, never a result. One directory per test, never shared by
  processes that run at the same time (the cache's writes are not atomic
  without the optional filelock package).
  """
  return {'JAX_COMPILATION_CACHE_DIR': str(directory),
          'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
          'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}
