"""Shared test set-up: 8 virtual CPU devices, no GPU for TensorFlow.

The device count must be fixed before jax initialises its backend, so it is set
here, in the first file pytest imports.
"""
import os

_DEVICES = '--xla_force_host_platform_device_count=8'
# An XLA_FLAGS of the caller's keeps its flags and gains the device count; one
# that sets another count is refused below, before any test runs.
if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' +
                             _DEVICES).strip()
# JAX's persistent compilation cache: one directory per pytest run, made by
# the first process that imports this file (pytest itself; its xdist workers
# inherit the variable, and so do the main.py runs and notebook kernels the
# tests start): the many runs of the same small configs load the programs
# compiled once. It changes what is compiled, never a result. Its writes are
# not atomic (JAX locks them only with the optional filelock package and a
# size limit): a process reading an entry another is still writing gets an
# error, which JAX turns into a warning and a compilation
# (jax_raise_persistent_cache_errors is off). The process that made the
# directory removes it when it exits (tens of MB a run, which piled up in
# /tmp before).
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  import atexit  # noqa: E402
  import shutil  # noqa: E402
  import tempfile  # noqa: E402
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
      prefix='contrastive_jax_compile_cache_')
  atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'],
                  ignore_errors=True)
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
# pytest's unraisable-exception hook imports tracemalloc on its first report;
# a report made while a library's lazy-import context has replaced
# builtins.__import__ (etils, under TFDS) cannot import it, and the hook's own
# error hides the exception it reports. Imported here, the report reads it
# from sys.modules.
import tracemalloc  # noqa: E402,F401

import jax  # noqa: E402

from contrastive_jax import runtime  # noqa: E402

# XLA:CPU's thread pools sized for the 8 virtual devices before the backend
# starts (runtime.size_cpu_thread_pools: with XLA's own size, collectives
# over many virtual devices on few cores can deadlock).
runtime.size_cpu_thread_pools()

# The 1-vs-8-device tests skip only on an accelerator host (one GPU); on the
# CPU, fewer than 8 devices means an XLA_FLAGS that overrides the count.
if jax.default_backend() == 'cpu' and jax.device_count() != 8:
  import pytest  # noqa: E402
  pytest.exit(f"the tests need 8 CPU devices; XLA_FLAGS={os.environ['XLA_FLAGS']!r} "
              f'gives {jax.device_count()}: unset it or set {_DEVICES}.',
              returncode=4)

# Tests compare against float64 numpy references; enabling x64 here would
# change the dtypes under test, so losses are checked in float32 to 1e-5.
# Every matmul runs in full float32 (on a CPU it always does); the
# accelerator check (benchmarks/accelerator.py) also runs the reference tests
# under a GPU's default precision (TF32) by setting this variable to
# 'default'.
_precision = os.environ.get('CONTRASTIVE_JAX_TEST_MATMUL_PRECISION', 'highest')
if _precision != 'default':
  jax.config.update('jax_default_matmul_precision', _precision)

