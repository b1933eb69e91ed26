"""CACR (Zheng et al. 2021), in-batch, K = 1 positive (2 views).

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/cacr_k1.py --workdir=workdir/cacr_k1

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper defaults (notes/cacr.md Sec. 0): t+ = 1.0, t- = 2.0 (K = 1, CIFAR-10),
Euclidean cost, the released code's cross-view negatives, no stop-gradient.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'cacr'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'t_pos': 1.0, 't_neg': 2.0, 'negatives': 'cross_view'})
  config.augment.num_views = 2
  return config
