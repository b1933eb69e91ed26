"""BYOL (Grill et al. 2020): online predictor regressed on an EMA target, no negatives.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/byol.py --workdir=workdir/byol

Expected: not measured yet (added as the README's worked example of a new
method, contrastive_jax/methods/byol.py).

Paper: the projector's output (256-d) goes through a predictor MLP (4096
hidden, BN, ReLU) on the online side only; the target is an EMA of the online
network with tau rising from 0.996 to 1 on a cosine schedule; the loss is
2 - 2 cos(q(view a), target(view b)), symmetrised over the two views; LARS,
batch 4096, 1000 epochs, the asymmetric 'byol' augmentation (blur 1.0 / 0.1,
solarize 0 / 0.2). Here: tau 0.99 (a few epochs, not 1000; BYOL Table 5 shows
smaller tau suits shorter schedules), predictor 512 hidden -> 128, the 'fmnist'
augmentation, and everything else as configs/base.py (the small CNN, AdamW,
batch 256, 4 epochs, Fashion-MNIST).
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
