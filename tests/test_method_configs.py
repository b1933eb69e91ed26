"""Every method config: the step computes the configured loss, and the first
steps equal those of the code before the method registry.

For each configs/*.py experiment (narrowed by `pinned_steps.tiny`: a tiny
model, batch 16, queue 32, 16 bank noise rows, SGD; method, loss, its
hyperparameters and views kept), through the real augmentation and the jitted
8-device step (`pinned_steps.run`):

1. Step 0's loss equals the configured loss applied, through
   `losses.apply`, to inputs rebuilt here without the method modules: the
   model called directly on the views the config names (query / key views,
   the EMA target with its momentum written out, shuffle-BN as per-device
   batches of the documented permutation), the state's queue, and bank rows
   at the documented draws (`state.bank_noise_indices`, CMC's `randint`).
   A method feeding the wrong views, encoder, negatives, labels or
   hyperparameters moves the loss by far more than the tolerance (tried:
   MoCo's keys from the query view give 1.89 against 4.12).
2. Losses, grad norms and checksums of every part of the state after 3 steps
   equal tests/pinned_steps.json, made by the code before the method registry
   (see pinned_steps.py). Measured: all 264 values bit-identical on the
   machine that made them (Intel). On another CPU (AMD EPYC) XLA's kernels
   order float32 sums differently, and 3 SGD steps amplify that: worst
   relative deviations there were 3.1e-6 (loss), 5.0e-5 (grad norm), 1.7e-5
   (sum |x| of a state part) and 2.7e-6 (sum x, relative to sum |x|).
   Tolerance `RTOL` = 2e-4, four times the worst seen; a signed sum x is
   compared on the scale of sum |x|, its condition number (it may cancel to
   near 0). A change in what is computed moves these by 1e-3 or more (e.g.
   a wrong view or negative set: the loss alone moves by 1e-1).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax.methods import memory_bank
from contrastive_jax import losses
from numpy_reference import f32_rtol
import pinned_steps

with open(pinned_steps.PATH) as _f:
  import json
  PINNED = json.load(_f)


@functools.lru_cache(maxsize=None)
def _apply(model, output):
  """model.apply in train mode (batch BN) -> `output`, one jit per model."""
  return jax.jit(lambda variables, x: model.apply(
      variables, x, train=True, mutable=['batch_stats'])[0][output])


def _embed(model, variables, views, output='projection'):
  """[B, V, ...] views -> [B, V, D] `output` in train mode (batch BN)."""
  b, v = views.shape[:2]
  out = _apply(model, output)(variables, jnp.asarray(views).reshape(
      (b * v,) + views.shape[2:]))
  return np.asarray(out).reshape(b, v, -1)


def _shuffled_keys(model, variables, views, rng, devices=8):
  """MoCo's shuffle-BN keys: permuted, BN per device's slice, unpermuted."""
  b, v = views.shape[:2]
  flat = views.reshape((b * v,) + views.shape[2:])
  perm = np.asarray(jax.random.permutation(rng, b * v))
  per = b * v // devices
  z = np.concatenate([
      _embed(model, variables, flat[perm][d * per:(d + 1) * per][:, None])[:, 0]
      for d in range(devices)])
  out = np.empty_like(z)
  out[perm] = z
  return out.reshape(b, v, -1)


def _independent_loss(config, setup, s0, batch, step_rng) -> float:
  """The configured loss at step 0, rebuilt without the method modules."""
  views, labels = batch['views'], batch['label']
  views = np.asarray(views)
  variables = {'params': s0.params, 'batch_stats': s0.batch_stats}
  rng = jax.random.fold_in(step_rng, 0)
  kwargs = dict(config.loss_kwargs)
  for name, kind in dict(config.loss_schedules).items():
    assert kind == 'epoch_ramp'      # JCL: lambda (0 + 1) / epochs at step 0.
    kwargs[name] = kwargs[name] / max(1, int(np.ceil(config.num_epochs)))
  if config.method == 'in_batch':
    inputs = losses.LossInputs(
        z=_embed(setup.model, variables, views),
        labels=labels if config.use_labels else None)
  elif hasattr(s0.method_state, 'key_params'):     # An EMA key encoder.
    mc, ms = config.moco, s0.method_state
    m = mc.momentum         # Both schedules start at the base momentum.
    key_vars = {'params': jax.tree.map(
        lambda t, o: m * np.asarray(t) + (1 - m) * np.asarray(o),
        ms.key_params, s0.params), 'batch_stats': ms.key_batch_stats}
    key_views = views[:, list(mc.key_views)]
    key = (_shuffled_keys(setup.model, key_vars, key_views, rng)
           if mc.shuffle_bn else _embed(setup.model, key_vars, key_views))
    inputs = losses.LossInputs(
        # The online output the method names (e.g. a predictor's).
        z=_embed(setup.model, variables, views[:, list(mc.query_views)],
                 setup.method.embedding),
        key=key, queue=ms.queue)
  else:
    mb, bank = config.memory_bank, np.asarray(s0.method_state.bank)
    n = pinned_steps.N_DATA
    if mb.noise == 'per_instance':
      idx = memory_bank.bank_noise_indices(
          rng, batch=len(labels), num_negatives=mb.num_negatives,
          num_examples=n, num_rows=bank.shape[0], num_shards=8)
      inputs = losses.LossInputs(
          z=_embed(setup.model, variables, views),
          key=bank[np.asarray(batch['index'])][:, None],
          queue=bank[np.asarray(idx)])
      kwargs['num_data'] = n
    else:
      idx = jax.random.randint(rng, (mb.num_negatives,), 0, n)
      inputs = losses.LossInputs(z=_embed(setup.model, variables, views),
                                 queue=bank[np.asarray(idx)])
  loss, _ = losses.apply(config.loss, inputs, **kwargs)
  return float(loss)


RTOL = 2e-4


def _close(got, want):
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6)


def _close_sums(got, want):
  """[sum x, sum |x|] within RTOL of sum |x| (see the module docstring)."""
  scale = RTOL * abs(want[1]) + 1e-6
  assert abs(got[0] - want[0]) <= scale and abs(got[1] - want[1]) <= scale, (
      got, want)


@pytest.mark.parametrize('name', pinned_steps.method_configs())
def test_config_step_computes_its_loss_and_pinned_numbers(name):
  first = {}

  def check(config, setup, s0, batch, metrics, step_rng):
    first['step'] = float(metrics['loss'])
    first['independent'] = _independent_loss(config, setup, s0, batch,
                                             step_rng)

  got = pinned_steps.run(name, on_first_step=check)
  # Sums over the B * V * H * W positions of BN and the convolutions.
  b, v = pinned_steps.BATCH, 5
  assert first['step'] == pytest.approx(
      first['independent'], rel=f32_rtol(b * v * 12 * 12),
      abs=f32_rtol(b * v * 12 * 12)), first
  want = PINNED[name]
  _close(got['loss'], want['loss'])
  _close(got['grad_norm'], want['grad_norm'])
  assert got['checksums'].keys() == want['checksums'].keys()
  for part, sums in want['checksums'].items():
    _close_sums(got['checksums'][part], sums)


def test_every_config_is_covered():
  """The pinned set is the method configs: a new configs/*.py gets pinned
  (`python tests/pinned_steps.py`) in the commit that adds it."""
  assert set(PINNED) == set(pinned_steps.method_configs())
