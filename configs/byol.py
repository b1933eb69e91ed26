"""BYOL (Grill et al. 2020): online predictor regressed on an EMA target, no negatives.

configs/base.py with BYOL's method (contrastive_jax/methods/byol.py, the
README's worked example of adding a method): views paired (0, 1) -> (1, 0),
target momentum 0.99 rising to 1 on a cosine, a predictor of 512 hidden units.
Paper values and what differs: docs/configs.md, "byol.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/byol.py --workdir=workdir/byol

Expected: not measured (the current study does not run it; tests/test_byol.py checks
that a short run's loss falls).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'byol'
  config.loss = 'byol'
  config.loss_kwargs = ml_collections.ConfigDict()
  config.moco.momentum = 0.99
  config.moco.momentum_schedule = 'cosine'
  config.moco.query_views = (0, 1)
  config.moco.key_views = (1, 0)      # Query view v regresses on view 1 - v.
  config.moco.queue_size = 0
  config.moco.predictor_hidden_dim = 512
  return config
