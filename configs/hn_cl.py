"""HN-CL (Robinson et al. 2021): hard-negative, debiased contrastive loss.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/hn_cl.py --workdir=workdir/hn_cl

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Defaults (CACR paper's baseline, notes/cacr.md Sec. 2.10): tau = 0.5,
beta = 1, tau+ = 0.1.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'hard_negative'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.5, 'beta': 1.0, 'tau_plus': 0.1})
  return config
