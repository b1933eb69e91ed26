"""SupCon (Khosla et al. 2020), L_out, with labels.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/supcon.py --workdir=workdir/supcon

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results"). Supervised, so higher than the self-supervised runs.

Paper (CIFAR): tau = 0.1, L_out. Optimizer: the project default (AdamW; the
paper used SGD/LARS, lr 0.5).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.use_labels = True
  config.loss = 'supcon'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'variant': 'out'})
  return config
