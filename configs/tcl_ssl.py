"""Tuned Contrastive Learning, self-supervised (Animesh 2023): positive triplets.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/tcl_ssl.py --workdir=workdir/tcl_ssl

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Thesis defaults (notes/tcl.md Sec. 0): k1 = 1, k2 = 1.5, three views; tau is
not stated (0.2, solo-learn's SimCLR value, per the note).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'tcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.2, 'k1': 1., 'k2': 1.5})
  config.augment.num_views = 3
  return config
