"""contrastive_jax/runtime.py: the CPU thread pools sized for collectives."""

import os
import subprocess
import sys
import textwrap

import numpy as np

from contrastive_jax import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cores():
  return len(os.sched_getaffinity(0))


def test_pool_sized_twice_the_virtual_devices():
  env = {'XLA_FLAGS': '--xla_cpu_enable_fast_math=false '
                      '--xla_force_host_platform_device_count=8'}
  assert runtime.size_cpu_thread_pools(env) == max(16, _cores())
  assert env['PJRT_NPROC'] == str(max(16, _cores()))


def test_pool_raised_not_lowered():
  # A value of a parent with fewer devices is raised; a large one kept.
  env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=16',
         'PJRT_NPROC': '16'}
  assert runtime.size_cpu_thread_pools(env) == max(32, _cores())
  env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
         'PJRT_NPROC': '64'}
  assert runtime.size_cpu_thread_pools(env) is None
  assert env['PJRT_NPROC'] == '64'
  for flags in ('', '--xla_force_host_platform_device_count=1'):
    env = {'XLA_FLAGS': flags}
    assert runtime.size_cpu_thread_pools(env) is None
    assert 'PJRT_NPROC' not in env


def test_warns_when_the_backend_started_first():
  env = {k: v for k, v in os.environ.items() if k != 'PJRT_NPROC'}
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
  proc = subprocess.run(
      [sys.executable, '-c', 'import jax; jax.devices(); '
       'from contrastive_jax import runtime; runtime.size_cpu_thread_pools()'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'Call it before using jax' in proc.stderr
  proc = subprocess.run(
      [sys.executable, '-c', 'from contrastive_jax import runtime; '
       'runtime.size_cpu_thread_pools(); import jax; jax.devices()'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert 'Call it before using jax' not in proc.stderr


# A collective program dispatched again and again with no data dependency
# between the calls: each device's part waits in the psum's rendezvous on a
# thread of its own. With XLA:CPU's default pools (max(cores, devices)
# threads) this deadlocked in every run on the 2-core machine, 8 devices;
# XLA then aborts after the terminate timeout.
_PROGRAM = textwrap.dedent('''
    from contrastive_jax import runtime
    runtime.size_cpu_thread_pools()  # before the backend starts
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((8,), ('d',),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    f = jax.jit(jax.shard_map(
        lambda x, w: jax.lax.psum(jnp.tanh(x @ w), 'd'), mesh=mesh,
        in_specs=(P('d'), P()), out_specs=P()))
    x = jax.device_put(jnp.ones((8 * 128, 128)), NamedSharding(mesh, P('d')))
    w = jax.device_put(jnp.full((128, 128), 0.01), NamedSharding(mesh, P()))
    for _ in range(500):
      out = f(x, w)
    print('sum', float(out.sum()))
''')


def test_collectives_dispatched_back_to_back_do_not_deadlock():
  # No PJRT_NPROC inherited from this process: the child's import sizes it.
  env = {k: v for k, v in os.environ.items() if k != 'PJRT_NPROC'}
  env['XLA_FLAGS'] = ('--xla_force_host_platform_device_count=8 '
                      '--xla_cpu_collective_call_terminate_timeout_seconds=60')
  proc = subprocess.run([sys.executable, '-c', _PROGRAM], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Every row of x @ w is 128 * 0.01; psum adds the 8 devices' [128, 128].
  expected = 8 * 128 * 128 * float(np.tanh(np.float32(1.28)))
  got = float(proc.stdout.split()[-1])
  assert abs(got - expected) <= 1e-4 * expected
