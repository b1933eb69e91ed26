"""Fidelity fixes found on review (issue 13): JCL's default lambda, InsDis noise.

* A JCL config without `loss_kwargs.lam` must train with the loss's own
  default lambda (4.0), not 0 (which made JCL plain MoCo against the key mean).
* InsDis draws its noise rows per instance (lemniscate's NCEAverage), [B, K, D]
  bank rows gathered per instance, not one [K, D] set shared by the batch.
"""

import functools

import jax
import numpy as np

from configs import insdis as insdis_config
from configs import jcl as jcl_config
from configs import test as test_config
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax import losses
from contrastive_jax import train

B, HW, N_DATA, K = 8, 8, 40, 6


def _build(config):
  return step_lib.build(config, runtime.create_mesh(jax.devices()[:1]),
                     total_steps=10, steps_per_epoch=5, num_examples=N_DATA,
                     image_shape=(HW, HW, 1))


def test_jcl_without_lam_uses_the_loss_default():
  config = jcl_config.get_config()
  del config.loss_kwargs['lam']
  # configs/jcl.py ramps lambda per epoch up to its base value: at the end of
  # the run (ceil(4 epochs) = 4 epochs of 5 steps) the base itself.
  ramp = _build(config).loss.schedules['lam']
  assert float(ramp(19)) == 4.0 == losses.default_kwarg('jcl', 'lam')
  # An explicit value still wins, including 0.
  config.loss_kwargs['lam'] = 0.
  assert float(_build(config).loss.schedules['lam'](19)) == 0.
  # Unscheduled, the configured lambda is a fixed keyword of the loss.
  config.loss_schedules = {}
  loss = _build(config).loss
  assert loss.schedules == {} and loss.kwargs['lam'] == 0.


def test_non_jcl_losses_have_no_lambda():
  loss = _build(test_config.get_config()).loss
  assert loss.schedules == {} and 'lam' not in loss.kwargs


def _insdis_prepared():
  """InsDis's inputs as its method prepares them for one step."""
  c = test_config.get_config()
  c.model.encoder_kwargs.widths = (4, 8)
  c.model.head_hidden_dim = 16
  c.model.head_out_dim = 8
  c.batch_size = B
  c.method, c.loss = 'memory_bank', 'insdis'
  c.loss_kwargs = {'temperature': 0.1}
  c.augment.num_views = 1
  c.memory_bank.num_negatives = K
  c.online.classifier = False
  setup = _build(c)
  state = setup.init_fn(jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = {'views': rng.random((B, 1, HW, HW, 1), np.float32),
           'label': np.zeros(B, np.int32),
           'index': rng.permutation(N_DATA)[:B].astype(np.int32)}
  prepared = jax.jit(functools.partial(setup.method.prepare, model=setup.model,
                                       mesh=None))(state, batch,
                                                   jax.random.key(1))
  return c, np.asarray(state.method_state.bank), prepared


def test_insdis_noise_is_drawn_per_instance():
  config, _, prepared = _insdis_prepared()
  assert prepared.inputs.queue.shape == (B, K, config.model.head_out_dim)
  assert prepared.inputs.key.shape == (B, 1, config.model.head_out_dim)


def test_insdis_per_instance_rows_are_bank_rows_and_differ():
  _, bank, prepared = _insdis_prepared()
  noise = np.asarray(prepared.inputs.queue)           # [B, K, D]
  # Every sampled row is a row of the bank (within the data's rows).
  dist = np.abs(noise[:, :, None, :] - bank[None, None, :N_DATA]).max(-1)
  assert np.all(dist.min(-1) == 0.)
  rows = dist.argmin(-1)                              # [B, K] row ids
  # Independent draws: the instances do not all share one set of rows.
  assert len({tuple(r) for r in rows}) > 1


def test_insdis_config_documents_its_choices():
  config = insdis_config.get_config()
  doc = insdis_config.__doc__
  assert 'not verified' in doc.lower()
  assert str(config.memory_bank.num_negatives) in doc
  # The study's K keeps B * K * D floats small on this CPU.
  assert (config.batch_size * config.memory_bank.num_negatives *
          config.model.head_out_dim * 4) <= 256 * 2 ** 20
