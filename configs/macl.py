"""MACL (Huang et al. 2022): alignment-adaptive temperature, reweighted InfoNCE.

configs/base.py with MACL's loss, tau_0 0.1, variant a, alpha 2.
Paper values and what differs: docs/configs.md, "macl.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/macl.py --workdir=workdir/macl

Measured: study v2, arm macl (tau 0.1), is this config with the
study's shared recipe (pooled output, peak lr 0.06, crop scale 0.3-1)
for 6 epochs of the 50,000 images a validation holdout leaves, 4 seeds:
test kNN 82.51 / linear 86.20, random-init encoder 79.82 / 79.11
(studies/v2/REPORT.md, which lists every run's command). This
command (4 epochs of all 60,000 images) is not measured.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'macl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'variant': 'a', 'alpha': 2.0})
  return config
