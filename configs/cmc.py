"""CMC (Tian et al. 2019) with K = 4 views, full graph, memory-bank negatives.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/cmc.py --workdir=workdir/cmc

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper: tau = 0.07, full graph over views (eq. 8), memory-bank negatives
(16384 on ImageNet; 4096 here). Deviations: the 4 views are 4 augmentations
of the same image (the paper used colour channels, L/ab, depth, ...) with one
shared encoder, and the bank holds one row per image (the normalised mean of
its views' embeddings) rather than one bank per view.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'memory_bank'
  config.loss = 'cmc'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.07, 'graph': 'full'})
  config.augment.num_views = 4
  config.memory_bank.momentum = 0.5
  config.memory_bank.num_negatives = 4096
  return config
