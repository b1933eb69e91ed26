"""InsDis (Wu et al. 2018): memory bank, NCE against sampled bank rows, one view.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/insdis.py --workdir=workdir/insdis

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper: tau = 0.07, m = 4096 noise samples, bank momentum 0.5, 128-d.
The normalising constant Z is the per-batch Monte-Carlo estimate (the
released code fixes Z after the first batch; see losses.insdis). Optimizer:
the project default (AdamW), not the paper's SGD lr 0.03.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'memory_bank'
  config.loss = 'insdis'
  config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.07})
  config.augment.num_views = 1
  config.memory_bank.momentum = 0.5
  config.memory_bank.num_negatives = 4096
  return config
