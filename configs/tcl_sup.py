"""Tuned Contrastive Learning, supervised (Animesh 2023).

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/tcl_sup.py --workdir=workdir/tcl_sup

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results"). The thesis reports 95.7% (TCL) vs 95.5% (SupCon) on
Fashion-MNIST with ResNet and 150 epochs, far beyond this CPU setup.

Thesis defaults (notes/tcl.md Sec. 0): tau = 0.1, k1 = 5000, k2 = 1, 2 views;
inputs: RandomCrop(28, padding=4) + flip (preset tcl_fmnist).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.use_labels = True
  config.loss = 'tcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'k1': 5000., 'k2': 1.})
  config.augment.preset = 'tcl_fmnist'
  config.augment.num_views = 2
  return config
