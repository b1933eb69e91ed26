"""Each method config's first train steps, pinned across refactors.

`python tests/pinned_steps.py` (from the repository root) runs 3 steps of
every configs/*.py method config, narrowed to a tiny model and data but with
its method, loss, hyperparameters, views and optimizer kept, on 8 virtual CPU
devices, through the real augmentation and jitted step, and writes the
per-step loss and grad norm and checksums of every part of the final train
state to tests/pinned_steps.json. tests/test_pinned_steps.py reruns it and
compares against the committed file.

The committed values were computed at commit 9ff225c (before the method
registry, issue 12), so a refactor that moves code without changing what it
computes keeps them. A change that is meant to alter a number regenerates
the file and says so in its commit.
"""

import importlib
import json
import os
import sys

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')

import jax  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'tests')]
jax.config.update('jax_default_matmul_precision', 'highest')

CONFIGS = ('default', 'simclr', 'moco_v2', 'moco_v3', 'insdis', 'cmc',
           'supcon', 'tcl_sup', 'tcl_ssl', 'cacr_k1', 'cacr_k4', 'cacr_moco',
           'macl', 'jcl', 'au_cl', 'hn_cl', 'dcl')
STEPS, BATCH, N_DATA = 3, 16, 48
PATH = os.path.join(ROOT, 'tests', 'pinned_steps.json')


def tiny(name: str):
  """configs/<name>.py with a tiny model, batch, queue and bank."""
  config = importlib.import_module(f'configs.{name}').get_config()
  config.model.encoder_kwargs.widths = (4, 8)
  config.model.head_hidden_dim = 16
  config.model.head_out_dim = 8
  config.batch_size = BATCH
  if config.moco.queue_size:
    config.moco.queue_size = 2 * BATCH
  config.memory_bank.num_negatives = 16
  # SGD, not the configs' AdamW: Adam turns the rounding noise of gradients
  # that are zero in exact arithmetic (biases under BatchNorm) into whole
  # +-lr steps, so another CPU's kernel choices would move these checksums by
  # far more than rounding. lr 2.0 * 16 / 256 moves the parameters visibly.
  config.optimizer.name = 'sgd'
  config.optimizer.base_learning_rate = 2.
  return config


def data():
  """[N_DATA, 12, 12, 1] uint8 images and [N_DATA] labels in 4 classes."""
  rng = np.random.default_rng(0)
  images = (rng.random((N_DATA, 12, 12, 1)) * 255).astype(np.uint8)
  return images, (np.arange(N_DATA) % 4).astype(np.int32)


def checksums(tree) -> list[float]:
  """[sum x, sum |x|] over the float leaves of `tree` (float64 sums)."""
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)
            if np.issubdtype(np.asarray(x).dtype, np.floating)]
  return [float(sum(x.sum() for x in leaves)),
          float(sum(np.abs(x).sum() for x in leaves))]


def run(name: str) -> dict:
  """Runs STEPS steps of config `name`; returns the pinned figures."""
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import models  # pylint: disable=g-import-not-at-top
  from contrastive_jax import train  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  config = tiny(name)
  images, labels = data()
  total = 10
  mesh = train.create_mesh()
  sharded = NamedSharding(mesh, P('data'))
  method = train.Method.from_config(config, total_steps=total,
                                    steps_per_epoch=N_DATA // BATCH,
                                    num_examples=N_DATA, num_classes=4)
  model = models.create_model(config)
  tx = train.create_optimizer(config, total)
  init_fn, step_fn, _ = train.create_step_fns(config, model, tx, mesh, method,
                                              images.shape[1:])
  views_cfg = augment.build_views(config.augment.preset,
                                  config.augment.num_views,
                                  config.augment.overrides)
  init_rng, aug_rng, step_rng = jax.random.split(jax.random.key(0), 3)
  augment_fn = jax.jit(
      lambda step, x: augment.augment_batch(jax.random.fold_in(aug_rng, step),
                                            x, views_cfg),
      out_shardings=sharded)
  state = init_fn(init_rng)
  losses, grad_norms = [], []
  for step in range(STEPS):
    idx = np.arange(step * BATCH, (step + 1) * BATCH) % N_DATA
    batch = {'views': augment_fn(step, jax.device_put(images[idx], sharded)),
             'label': jax.device_put(labels[idx], sharded),
             'index': jax.device_put(idx.astype(np.int32), sharded)}
    state, metrics = step_fn(state, batch, step_rng)
    losses.append(float(metrics['loss']))
    grad_norms.append(float(metrics['grad_norm']))
  state = jax.device_get(state)
  parts = {'params': state.params, 'batch_stats': state.batch_stats,
           'opt_state': state.opt_state, 'key_params': state.key_params,
           'key_batch_stats': state.key_batch_stats, 'queue': state.queue,
           'bank': state.bank,
           'probe': (state.probe_params, state.probe_opt_state)}
  return {'loss': losses, 'grad_norm': grad_norms,
          'checksums': {k: checksums(v) for k, v in parts.items()
                        if jax.tree.leaves(v)}}


if __name__ == '__main__':
  pinned = {name: run(name) for name in CONFIGS}
  with open(PATH, 'w') as f:
    json.dump(pinned, f, indent=1, sort_keys=True)
  print(f'wrote {PATH}')
