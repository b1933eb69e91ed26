"""SimCLR's NT-Xent (Chen et al. 2020) at tau 0.2 on the shared protocol.

configs/base.py at the CACR paper's SimCLR temperature.
Not default.py or papers/simclr.py: docs/configs.md, "Four SimCLRs".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/simclr.py --workdir=workdir/simclr

Measured: study v2, arm ntxent (tau 0.2), is this config with the
study's shared recipe (pooled output, peak lr 0.06, crop scale 0.3-1)
for 6 epochs of the 50,000 images a validation holdout leaves, 4 seeds:
test kNN 82.41 / linear 86.14, random-init encoder 79.82 / 79.11
(studies/v2/REPORT.md, which lists every run's command). This
command (4 epochs of all 60,000 images) is not measured.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'ntxent'
  config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.2})
  return config
