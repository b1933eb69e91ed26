"""Process start-up shared by the entry points: XLA:CPU's thread pools,
distributed JAX and the mesh.

Several hosts: every process runs the same command. On clusters JAX detects
(Cloud TPU pods, SLURM, Open MPI) set `JAX_DISTRIBUTED=1`; elsewhere set
JAX_COORDINATOR_ADDRESS=host0:port, JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i
on every process. With none of these the job is a single process.
"""

from __future__ import annotations

import logging
import os
import re
import sys

import jax
from absl import logging as absl_logging

# The project's own code: log records from anywhere else are a library's.
_OWN = tuple(os.path.dirname(os.path.abspath(m)) + os.sep for m in (
    __file__, os.path.join(os.path.dirname(__file__), '..', 'input_pipeline',
                           '__init__.py')))


def size_cpu_thread_pools(environ=os.environ) -> int | None:
  """Sets `PJRT_NPROC` to at least 2N for N virtual CPU devices; the thread
  count set, or None if nothing changed.

  XLA:CPU sizes its pools at max(cores, N) threads, with which two collective
  programs in flight can deadlock (docs/performance.md). Entry points call
  this before jax starts its CPU backend (it warns otherwise).
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
  """Whether jax has started a backend (private API; False if gone)."""
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
  """A 1-D mesh, axis 'data', over `devices` (default: all of the job's);
  Auto axis types: the partitioner inserts the losses' collectives."""
  devices = jax.devices() if devices is None else list(devices)
  return jax.make_mesh((len(devices),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devices)


# Library warnings that ask nothing of the user.
HARMLESS_WARNINGS = ('OpenCV is not installed', 'Given directory is read only')


def quiet_library_logs() -> None:
  """Keeps the job's own INFO lines and every library's warnings and errors
  (`--verbosity=1` shows everything)."""
  main = getattr(sys.modules.get('__main__'), '__file__', None)
  own = _OWN + ((os.path.abspath(main),) if main else ())

  def own_or_important(record: logging.LogRecord) -> bool:
    if record.pathname.startswith(own):
      return True
    return (record.levelno >= logging.WARNING and
            not any(m in record.getMessage() for m in HARMLESS_WARNINGS))
  absl_logging.get_absl_handler().addFilter(own_or_important)


def notebook_logging() -> None:
  """From a notebook (no `app.run`), logs as main.py does."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  # Unparsed flags make absl bypass its handler (and the progress bars).
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  absl_logging.use_absl_handler()
  absl_logging.set_verbosity(absl_logging.INFO)
  quiet_library_logs()
