"""SupCon (Khosla et al. 2020): the supervised contrastive loss L_out.

configs/base.py with labels and tau 0.1; supervised, so above the
self-supervised configs.
Paper values and what differs: docs/configs.md, "supcon.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/supcon.py --workdir=workdir/supcon \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 84.58 +- 0.20%,
linear 88.60 +- 0.12%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | supcon".

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
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
