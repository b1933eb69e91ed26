"""Each method config's first train steps, pinned across refactors.

`python tests/pinned_steps.py` (from the repository root) runs 3 steps of
every configs/*.py method config, narrowed to a tiny model, data and SGD
(`tiny`) with its method, loss, hyperparameters and views kept, on 8 virtual
CPU devices through the real augmentation and jitted step, and writes the
per-step loss and grad norm and checksums of the final train state to
tests/pinned_steps.json, which tests/test_method_configs.py compares against.
A change meant to alter a number regenerates the file and says so. 'base'
pins configs/base.py's defaults; 'default' (configs/default.py) equals
'simclr' to float32 rounding.
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

STEPS, BATCH, N_DATA = 3, 16, 48
PATH = os.path.join(ROOT, 'tests', 'pinned_steps.json')


def method_configs() -> tuple[str, ...]:
  """Every configs/*.py experiment on the small CNN but the test config: the
  configs `tiny()` can narrow. Those on a ResNet (GPU-sized runs of a method
  whose small config is here) are built in tests/test_paper_configs.py."""
  names = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'configs'))
                 if f.endswith('.py') and not f.startswith('_'))
  return tuple(n for n in names if n != 'test' and importlib.import_module(
      f'configs.{n}').get_config().model.encoder == 'small_cnn')


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


def run(name: str, on_first_step=None) -> dict:
  """Runs STEPS steps of config `name`; returns the pinned figures.

  `on_first_step(config, setup, state, batch, metrics, step_rng)`, if given,
  sees step 0: the state before it (on the host) and the metrics it gave.
  """
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import step as step_lib  # pylint: disable=g-import-not-at-top
  from contrastive_jax import train  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  config = tiny(name)
  images, labels = data()
  total = 10
  mesh = runtime.create_mesh()
  sharded = NamedSharding(mesh, P('data'))
  setup = step_lib.build(config, mesh, total_steps=total,
                      steps_per_epoch=N_DATA // BATCH, num_examples=N_DATA,
                      image_shape=images.shape[1:], num_classes=4)
  views_cfg = augment.build_views(config.augment.preset,
                                  config.augment.num_views,
                                  config.augment.overrides)
  init_rng, aug_rng, step_rng = train.seed_keys(0)
  augment_fn = train.make_augment_fn(views_cfg, None, mesh, aug_rng)
  state = setup.init_fn(init_rng)
  losses, grad_norms = [], []
  for step in range(STEPS):
    idx = np.arange(step * BATCH, (step + 1) * BATCH) % N_DATA
    batch = {'views': augment_fn(step, jax.device_put(images[idx], sharded)),
             'label': jax.device_put(labels[idx], sharded),
             'index': jax.device_put(idx.astype(np.int32), sharded)}
    before = jax.device_get(state) if step == 0 and on_first_step else None
    state, metrics = setup.step_fn(state, batch, step_rng)
    if before is not None:
      on_first_step(config, setup, before, jax.device_get(batch),
                    jax.device_get(metrics), step_rng)
    losses.append(float(metrics['loss']))
    grad_norms.append(float(metrics['grad_norm']))
  state = jax.device_get(state)
  ms = state.method_state
  parts = {'params': state.params, 'batch_stats': state.batch_stats,
           'opt_state': state.opt_state,
           'key_params': getattr(ms, 'key_params', None),
           'key_batch_stats': getattr(ms, 'key_batch_stats', None),
           'queue': getattr(ms, 'queue', None),
           'bank': getattr(ms, 'bank', None),
           'probe': (state.classifier_params, state.classifier_opt_state)}
  return {'loss': losses, 'grad_norm': grad_norms,
          'checksums': {k: checksums(v) for k, v in parts.items()
                        if jax.tree.leaves(v)}}


if __name__ == '__main__':
  pinned = {name: run(name) for name in method_configs()}
  with open(sys.argv[1] if len(sys.argv) > 1 else PATH, 'w') as f:
    json.dump(pinned, f, indent=1, sort_keys=True)
  print(f'wrote {f.name}')
