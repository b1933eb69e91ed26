"""MoCo v2 (Chen et al. 2020): EMA key encoder, queue of past keys, shuffle-BN.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/moco_v2.py --workdir=workdir/moco_v2

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper: tau = 0.2, m = 0.999, Q = 65536, MLP head, SGD lr 0.03 * B / 256.
Here Q = 4096 (a multiple of the batch; Fashion-MNIST has 60k images) and
m = 0.99 (the MoCo CIFAR recipe: a few hundred steps at 0.999 barely move the
key encoder). Only queue negatives, as in MoCo (no in-batch negatives).
Optimizer: the project default (AdamW), not the paper's SGD.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'moco'
  config.loss = 'infonce'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.2, 'in_batch_negatives': False})
  config.augment.preset = 'fmnist'
  config.moco.momentum = 0.99
  config.moco.query_views = (0,)
  config.moco.key_views = (1,)
  config.moco.queue_size = 4096
  config.moco.shuffle_bn = True
  return config
