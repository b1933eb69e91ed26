"""InsDis (Wu et al. 2018): memory bank, NCE against 1024 sampled bank rows.

configs/base.py with one view and a sharded memory bank; the proximal
weight (50) is not verified against the paper.
Paper values and what differs: docs/configs.md, "insdis.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/insdis.py --workdir=workdir/insdis \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 79.76 +- 0.40%,
linear 85.98 +- 0.17%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | insdis".

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'memory_bank'
  config.loss = 'insdis'
  # proximal_weight: 50.0 NOT VERIFIED (see the docstring).
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.07, 'proximal_weight': 50.0})
  config.augment.num_views = 1
  config.memory_bank.momentum = 0.5
  config.memory_bank.num_negatives = 1024
  return config
