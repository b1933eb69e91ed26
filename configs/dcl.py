"""DCL (Yeh et al. 2021): decoupled contrastive loss (positive out of the denominator).

configs/base.py with DCL's loss, tau 0.1, cross-view negatives.
Paper values and what differs: docs/configs.md, "the baselines".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/dcl.py --workdir=workdir/dcl \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 82.21 +- 0.57%,
linear 87.67 +- 0.20%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | dcl".

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
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
