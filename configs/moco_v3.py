"""MoCo v3-style (Chen et al. 2021): symmetric InfoNCE with in-batch negatives, no queue.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/moco_v3.py --workdir=workdir/moco_v3

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper (ResNet): tau = 1.0, m = 0.99 rising to 1 on a cosine schedule,
symmetric loss ctr(q1, k2) + ctr(q2, k1), global (sync) BN. Deviation: no
prediction head on the query branch (models.py has none yet), so this is
MoCo v3 minus the predictor. Optimizer: the project default (AdamW; the
paper used LARS for ResNet).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'moco'
  config.loss = 'infonce'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 1.0, 'in_batch_negatives': True})
  config.moco.momentum = 0.99
  config.moco.momentum_schedule = 'cosine'
  config.moco.query_views = (0, 1)
  config.moco.key_views = (0, 1)
  config.moco.queue_size = 0
  return config
