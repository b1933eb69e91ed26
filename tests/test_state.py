"""The pure state updates: EMA, momentum schedule, queue, memory bank.

References are independent numpy computations (closed forms, a numpy ring
buffer), never values taken from the implementation.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.methods import moco
from contrastive_jax.methods import memory_bank
from contrastive_jax import schedules
from numpy_reference import f32_rtol


def _tree(seed):
  rng = np.random.default_rng(seed)
  return {'conv': {'kernel': rng.normal(size=(3, 3, 1, 4)).astype(np.float32)},
          'bn': {'scale': rng.normal(size=(4,)).astype(np.float32)}}


@pytest.mark.parametrize('m', [0., 0.25, 0.9, 1.])
def test_ema_update_is_the_convex_combination(m):
  target, online = _tree(0), _tree(1)
  out = moco.ema_update(target, online, m)
  for path in (('conv', 'kernel'), ('bn', 'scale')):
    t, o = target[path[0]][path[1]], online[path[0]][path[1]]
    got = np.asarray(out[path[0]][path[1]])
    if m == 1.:
      np.testing.assert_array_equal(got, t)     # Unchanged, exactly.
    elif m == 0.:
      np.testing.assert_array_equal(got, o)     # A copy, exactly.
    else:
      # Both sides round m t and (1 - m) o (1 - m is formed in float32 in
      # the update, in float64 here). Where the two nearly cancel, only an
      # atol at their size bounds that (with rtol 1e-6 alone, one element
      # here used 83% of its allowance).
      np.testing.assert_allclose(
          got, m * t + (1 - m) * o, rtol=f32_rtol(),
          atol=f32_rtol() * np.max(np.abs(m * t) + np.abs((1 - m) * o)))


def test_ema_update_passes_no_gradient_to_the_online_params():
  target, online = _tree(0), _tree(1)
  grad = jax.grad(lambda o: sum(
      jnp.sum(x) for x in jax.tree.leaves(
          moco.ema_update(target, o, 0.5))))(online)
  for g in jax.tree.leaves(grad):
    np.testing.assert_array_equal(g, 0.)


def test_momentum_schedules():
  f = lambda s, kind: float(schedules.build(
      kind, 0.99, total_steps=100, steps_per_epoch=10, num_epochs=10)(s))
  # float32 cos, products and 1 - x at magnitude 1: f32_rtol() (the old
  # fixed 1e-7 was under 1 ulp of 1.0, 1.2e-7). Schedules that differ at all
  # differ by >= 1e-3 here.
  tol = f32_rtol()
  assert f(37, 'constant') == pytest.approx(0.99)
  assert f(0, 'cosine') == pytest.approx(0.99, abs=tol)
  assert f(100, 'cosine') == pytest.approx(1., abs=tol)
  assert f(50, 'cosine') == pytest.approx(0.995, abs=tol)
  assert f(25, 'cosine') == pytest.approx(
      1 - 0.01 * (math.cos(math.pi / 4) + 1) / 2, abs=tol)
  with pytest.raises(ValueError, match="unknown schedule 'linear'"):
    schedules.build('linear', 0.9, total_steps=1, steps_per_epoch=1,
                    num_epochs=1)


def test_epoch_ramp():
  # JCL: value * (epoch + 1) / ceil(num_epochs), capped at value; 2.5 epochs
  # of 4 steps count as 3, so lambda reaches 6 in the third epoch.
  ramp = schedules.build('epoch_ramp', 6., total_steps=10, steps_per_epoch=4,
                         num_epochs=2.5)
  got = [float(ramp(jnp.int32(s))) for s in range(12)]
  np.testing.assert_allclose(got, [2.] * 4 + [4.] * 4 + [6.] * 4, rtol=1e-7)


def test_queue_wraps_like_a_numpy_ring_buffer():
  q_size, b, d = 12, 4, 3
  queue = moco.init_queue(jax.random.key(0), q_size, d)
  # Normalised and measured with float32 sums of d = 3 squares and a rsqrt.
  np.testing.assert_allclose(np.linalg.norm(queue, axis=1), 1.,
                             rtol=f32_rtol(d))
  ref, ref_ptr = np.asarray(queue).copy(), 0
  ptr = jnp.zeros((), jnp.int32)
  enqueue = jax.jit(moco.enqueue)
  rng = np.random.default_rng(0)
  for step in range(7):                 # 7 * 4 = 28 rows: wraps twice.
    keys = rng.normal(size=(b, d)).astype(np.float32)
    queue, ptr = enqueue(queue, ptr, keys)
    for row in keys:                    # Oldest out first, one row at a time.
      ref[ref_ptr] = row
      ref_ptr = (ref_ptr + 1) % q_size
    assert int(ptr) == ref_ptr == (step + 1) * b % q_size
    np.testing.assert_array_equal(np.asarray(queue), ref)
  assert enqueue._cache_size() == 1     # ptr is traced: one compilation.


def test_bank_update_moves_only_the_batch_rows():
  bank = memory_bank.init_bank(jax.random.key(1), 10, 4)
  old = np.asarray(bank)
  index = np.array([7, 2, 5], np.int32)
  feats = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
  new = np.asarray(memory_bank.update_bank(bank, index, feats, 0.5))
  for i, row in zip(index, feats):
    want = 0.5 * old[i] + 0.5 * row / np.linalg.norm(row)
    np.testing.assert_allclose(new[i], want / np.linalg.norm(want), rtol=1e-5,
                               atol=1e-6)
  others = np.setdiff1d(np.arange(10), index)
  np.testing.assert_array_equal(new[others], old[others])
