"""CACR (Zheng et al. 2021), in-batch, K = 4 positives (5 views).

configs/base.py with CACR's loss, t+ 1, t- 0.9, cross-view negatives.
Paper values and what differs: docs/configs.md, "cacr_k1.py, cacr_k4.py, cacr_moco.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/cacr_k4.py --workdir=workdir/cacr_k4

Not measured by the current study (studies/v2 does not run it); the
superseded first study's figures, at an older recipe, are in
studies/v1/REPORT.md.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'cacr'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'t_pos': 1.0, 't_neg': 0.9, 'negatives': 'cross_view'})
  config.augment.num_views = 5
  return config
