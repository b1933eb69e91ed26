"""Tuned Contrastive Learning, self-supervised (Animesh 2023): three views.

configs/base.py with TCL's loss, k1 1, k2 1.5, tau 0.2.
Paper values and what differs: docs/configs.md, "tcl_sup.py and tcl_ssl.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/tcl_ssl.py --workdir=workdir/tcl_ssl

Not measured by the current study (studies/v2 does not run it); the
superseded first study's figures, at an older recipe, are in
studies/v1/REPORT.md.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'tcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.2, 'k1': 1., 'k2': 1.5})
  config.augment.num_views = 3
  return config
