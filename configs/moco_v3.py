"""MoCo v3 (Chen et al. 2021) without the predictor: symmetric InfoNCE, no queue.

configs/base.py with MoCo's key encoder (momentum 0.99 rising to 1 on a
cosine), both views as query and key, in-batch negatives, tau 1.0.
configs/papers/moco_v3.py has the predictor and the paper's optimizer.
Paper values and what differs: docs/configs.md, "moco_v3.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/moco_v3.py --workdir=workdir/moco_v3

Expected: not measured (the current study does not run it).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
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
