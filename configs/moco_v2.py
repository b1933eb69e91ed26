"""MoCo v2 (Chen et al. 2020): EMA key encoder, a queue of 4,096 keys, shuffle-BN.

configs/base.py with MoCo v2's method, tau 0.2, momentum 0.99.
Paper values and what differs: docs/configs.md, "moco_v2.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/moco_v2.py --workdir=workdir/moco_v2 \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 81.93 +- 0.10%,
linear 87.32 +- 0.34%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | moco_v2".

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'moco'
  config.loss = 'infonce'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.2, 'in_batch_negatives': False})
  config.augment.preset = 'fmnist'
  config.moco.momentum = 0.99
  config.moco.query_views = (0,)
  config.moco.key_views = (1,)
  config.moco.queue_size = 4096
  config.moco.shuffle_bn = True
  return config
