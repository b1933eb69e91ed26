"""CACR (Zheng et al. 2021), in-batch, K = 1 positive (2 views).

configs/base.py with CACR's loss, t+ 1, t- 2, cross-view negatives.
Paper values and what differs: docs/configs.md, "cacr_k1.py, cacr_k4.py, cacr_moco.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/cacr_k1.py --workdir=workdir/cacr_k1 \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 82.11 +- 0.52%,
linear 87.87 +- 0.06%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | cacr_k1".
With --config.dataset.imbalance=linear --config.num_epochs=3.649533: 75.45 +-
0.59 / 84.52 +- 0.12 (row "linear | cacr_k1").
With --config.dataset.imbalance=exponential --config.num_epochs=13.016667:
36.39 +- 0.21 / 51.16 +- 0.21 (row "exponential | cacr_k1").

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'cacr'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'t_pos': 1.0, 't_neg': 2.0, 'negatives': 'cross_view'})
  config.augment.num_views = 2
  return config
