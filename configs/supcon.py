"""SupCon (Khosla et al. 2020): the supervised contrastive loss L_out.

configs/base.py with labels and tau 0.1; supervised, so above the
self-supervised configs.
Paper values and what differs: docs/configs.md, "supcon.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/supcon.py --workdir=workdir/supcon

Not measured by the current study (studies/v2 does not run it); the
superseded first study's figures, at an older recipe, are in
studies/v1/REPORT.md.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.use_labels = True
  config.loss = 'supcon'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'variant': 'out'})
  return config
