"""CACR (Zheng et al. 2021), in-batch, K = 4 positives (5 views).

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/cacr_k4.py --workdir=workdir/cacr_k4

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper defaults (notes/cacr.md Sec. 0): t+ = 1.0, t- = 0.9 (K = 4, CIFAR-10;
the paper used batch M = 128 for K = 4), cross-view negatives.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'cacr'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'t_pos': 1.0, 't_neg': 0.9, 'negatives': 'cross_view'})
  config.augment.num_views = 5
  return config
