"""MACL (Huang et al. 2022): alignment-adaptive temperature, reweighted InfoNCE.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/macl.py --workdir=workdir/macl

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper defaults (notes/macl.md Sec. 2.5): tau_0 = 0.1, variant a
(tau' = tau_0 alpha^m) with alpha = 2, cross-view layout, Eq. 14 reweighting.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'macl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'variant': 'a', 'alpha': 2.0})
  return config
