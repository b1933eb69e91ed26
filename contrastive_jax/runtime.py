"""Process start-up shared by the entry points: XLA:CPU's thread pools,
distributed JAX and the mesh.

Launching on several hosts. Every process runs the same command. On clusters
JAX detects by itself (Cloud TPU pods, SLURM, Open MPI), set
`JAX_DISTRIBUTED=1` (or `JAX_COORDINATOR_ADDRESS`) and nothing else. Anywhere
else, including N processes on one machine, set on every process:

  JAX_COORDINATOR_ADDRESS=host0:1234   # process 0's host, a free port
  JAX_NUM_PROCESSES=N
  JAX_PROCESS_ID=i                     # 0 .. N-1, distinct per process

With none of these, the job is a single process over its local devices.
"""

from __future__ import annotations

import logging
import os
import re
import sys

import jax
from absl import logging as absl_logging

# The library's own code; records from anywhere else (site-packages, even
# under a venv inside the repository) are a library's.
_OWN = tuple(os.path.dirname(os.path.abspath(m)) + os.sep for m in (
    __file__, os.path.join(os.path.dirname(__file__), '..', 'input_pipeline',
                           '__init__.py')))


def size_cpu_thread_pools(environ=os.environ) -> int | None:
  """Gives XLA:CPU's thread pools room for two collective programs at once.

  With N virtual CPU devices (`--xla_force_host_platform_device_count=N`, or
  `jax_num_cpu_devices`) on a machine of fewer cores, XLA:CPU's client sizes
  its execution and intra-op pools at max(cores, N) threads. Each device's
  part of a program with collectives holds a thread while it waits in a
  rendezvous, and the client orders collective programs by their launch: with
  N threads two launches in flight can take every thread between them, and
  the program deadlocks (XLA aborts after 40 s, "Termination timeout for
  `all gather ...`"). 2N threads give every device a thread in both launches
  (docs/performance.md has the measurements). A workaround for CPUs with
  virtual devices: the entry points (contrastive_jax/cli.py, tests/conftest.py,
  benchmarks/__init__.py) call it; the library never does on import.

  Raises `PJRT_NPROC` (what XLA's DefaultThreadPoolSize reads in place of
  the core count) to at least 2N: to max(2N, cores) if unset, and an
  inherited value below 2N (a parent process with fewer devices) too. It
  must run before jax starts its CPU backend; it warns if a backend started
  first (then the pools keep XLA's size).

  Returns:
    The thread count set, or None if nothing was changed.
  """
  found = re.findall(r'--xla_force_host_platform_device_count=(\d+)',
                     environ.get('XLA_FLAGS', ''))
  devices = max(int(found[-1]) if found else 1,
                int(jax.config.jax_num_cpu_devices))
  current = environ.get('PJRT_NPROC', '')
  if devices <= 1 or (current.isdigit() and int(current) >= 2 * devices):
    return None
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
           else os.cpu_count() or 1)
  threads = max(2 * devices, cores)
  environ['PJRT_NPROC'] = str(threads)
  if environ is os.environ and _backend_started():
    absl_logging.warning(
        'jax started its CPU backend before size_cpu_thread_pools ran, so '
        'its thread pools have XLA\'s own size, with which collectives over '
        '%d virtual devices can deadlock (contrastive_jax/runtime.py). Call '
        'it before using jax, or set PJRT_NPROC=%d.',
        devices, threads)
  return threads


def _backend_started() -> bool:
  """Whether jax has started a backend (a private jax API; False if gone)."""
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):
    return False


def initialize_distributed() -> None:
  """Joins the processes of a multi-host job (no-op for a single process)."""
  address = os.environ.get('JAX_COORDINATOR_ADDRESS')
  if not address and os.environ.get('JAX_DISTRIBUTED', '0') in ('0', ''):
    return
  kwargs = {}
  if address:
    kwargs['coordinator_address'] = address
  for key, env in (('num_processes', 'JAX_NUM_PROCESSES'),
                   ('process_id', 'JAX_PROCESS_ID')):
    if os.environ.get(env):
      try:
        kwargs[key] = int(os.environ[env])
      except ValueError as e:
        raise ValueError(f'{env}={os.environ[env]!r} must be an integer.'
                         ) from e
  if ('num_processes' in kwargs) != ('process_id' in kwargs):
    raise ValueError('set both JAX_NUM_PROCESSES and JAX_PROCESS_ID (or '
                     'neither, on a cluster JAX detects by itself).')
  if 'process_id' in kwargs and not (
      0 <= kwargs['process_id'] < kwargs['num_processes']):
    raise ValueError(f'JAX_PROCESS_ID={kwargs["process_id"]} must be in '
                     f'[0, JAX_NUM_PROCESSES={kwargs["num_processes"]}).')
  jax.distributed.initialize(**kwargs)


def create_mesh(devices=None) -> jax.sharding.Mesh:
  """A 1-D data-parallel mesh, axis 'data', over every device of every process.

  Auto axis types, on purpose: the losses are sharding-agnostic functions of
  the *global* batch (every embedding is compared with every other), and Auto
  lets the partitioner insert the collectives this needs, instead of each
  loss carrying explicit `out_sharding` annotations.

  Args:
    devices: the devices to span; default all. Tests pass
      `jax.devices()[:1]` for a 1-device mesh in-process.
  """
  devices = jax.devices() if devices is None else list(devices)
  return jax.make_mesh((len(devices),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devices)


# Library warnings that ask nothing of the user: TFDS decodes a 28x28 PNG
# with PIL instead of OpenCV (no measurable difference for these datasets);
# orbax notes that a read-only checkpoint manager's directory is read-only.
HARMLESS_WARNINGS = ('OpenCV is not installed', 'Given directory is read only')


def quiet_library_logs() -> None:
  """Keeps the job's own INFO lines and every library's warnings and errors.

  Orbax alone logs ~45 INFO lines per checkpoint save, and TFDS and XLA add
  more; a person needs the job's lines (the script run, contrastive_jax/,
  input_pipeline/). `--verbosity=1` shows everything again.
  """
  main = getattr(sys.modules.get('__main__'), '__file__', None)
  own = _OWN + ((os.path.abspath(main),) if main else ())

  def own_or_important(record: logging.LogRecord) -> bool:
    if record.pathname.startswith(own):
      return True
    return (record.levelno >= logging.WARNING and
            not any(m in record.getMessage() for m in HARMLESS_WARNINGS))
  absl_logging.get_absl_handler().addFilter(own_or_important)


def notebook_logging() -> None:
  """From a notebook (no `app.run`), logs as main.py does: the job's INFO
  lines through absl's handler, other libraries' noise left out."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  # Unparsed flags make absl bypass its handler's stream (straight to
  # stderr, "Logging before flag parsing"), i.e. through progress bars.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  absl_logging.use_absl_handler()
  absl_logging.set_verbosity(absl_logging.INFO)
  quiet_library_logs()
