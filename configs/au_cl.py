"""AU-CL (Wang & Isola 2020): alignment + uniformity.

configs/base.py with the loss alignment (alpha 2) + uniformity (t 2).
Paper values and what differs: docs/configs.md, "the baselines".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/au_cl.py --workdir=workdir/au_cl \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 82.19 +- 0.13%,
linear 87.86 +- 0.17%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | au_cl".

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'align_uniform'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'alpha': 2.0, 't': 2.0, 'uniform_weight': 1.0})
  return config
