"""DCL (Yeh et al. 2021): decoupled contrastive loss (positive out of the denominator).

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/dcl.py --workdir=workdir/dcl

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Defaults (MACL's baseline, notes/macl.md): tau = 0.1, cross-view layout.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'dcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'layout': 'cross_view'})
  return config
