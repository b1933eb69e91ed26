"""SimCLR's NT-Xent (Chen et al. 2020) at tau 0.2 on the shared protocol.

The study's SimCLR: configs/base.py at the CACR paper's SimCLR temperature.
Not default.py or papers/simclr.py: docs/configs.md, "Four SimCLRs".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/simclr.py --workdir=workdir/simclr \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 81.60 +- 0.53%,
linear 87.59 +- 0.08%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | simclr".
With --config.dataset.imbalance=linear --config.num_epochs=3.649533: 74.74 +-
0.61 / 84.28 +- 0.25 (row "linear | simclr").
With --config.dataset.imbalance=exponential --config.num_epochs=13.016667:
36.18 +- 0.09 / 50.48 +- 0.17 (row "exponential | simclr").

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'ntxent'
  config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.2})
  return config
