"""AU-CL (Wang & Isola 2020): alignment + uniformity.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/au_cl.py --workdir=workdir/au_cl

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Defaults (notes/cacr.md Sec. 2.10): alpha = 2, t = 2, weight 1; no temperature.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'align_uniform'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'alpha': 2.0, 't': 2.0, 'uniform_weight': 1.0})
  return config
