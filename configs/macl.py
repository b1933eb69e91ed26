"""MACL (Huang et al. 2022): alignment-adaptive temperature, reweighted InfoNCE.

configs/base.py with MACL's loss, tau_0 0.1, variant a, alpha 2.
Paper values and what differs: docs/configs.md, "macl.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/macl.py --workdir=workdir/macl \
    --config.dataset.validation_size=10000 --config.num_epochs=2.002564

Expected (that command, --config.seed=0, 1, 2; test split): kNN 81.90 +- 0.43%,
linear 87.48 +- 0.06%, random-init encoder 81.43 / 85.28; benchmarks/REPORT.md,
row "regular | macl".
With --config.batch_size=64 --config.num_epochs=1.998079
--config.optimizer.base_learning_rate=0.004: 82.34 +- 0.35 / 87.79 +- 0.17 (row
"batch64 | macl").

After --workdir: the study's protocol, 2 epochs on the 50,000 images a
validation holdout leaves; without: 4 epochs on all 60,000 (not measured).
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
