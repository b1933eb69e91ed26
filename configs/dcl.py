"""DCL (Yeh et al. 2021): decoupled contrastive loss (positive out of the denominator).

configs/base.py with DCL's loss, tau 0.1, cross-view negatives.
Paper values and what differs: docs/configs.md, "the baselines".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/dcl.py --workdir=workdir/dcl

Measured: study v2, arm dcl (tau 0.1), is this config with the
study's shared recipe (pooled output, peak lr 0.06, crop scale 0.3-1)
for 6 epochs of the 50,000 images a validation holdout leaves, 4 seeds:
test kNN 82.39 / linear 85.95, random-init encoder 79.82 / 79.11
(studies/v2/REPORT.md, which lists every run's command). This
command (4 epochs of all 60,000 images) is not measured.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'dcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'layout': 'cross_view'})
  return config
