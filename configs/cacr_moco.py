"""CACR on MoCo v2 (Zheng et al. 2021, Algorithm 3): EMA keys and a queue.

configs/base.py with MoCo v2's method (as configs/moco_v2.py) and CACR's
loss, t+ 1, t- 2.
Paper values and what differs: docs/configs.md, "cacr_k1.py, cacr_k4.py, cacr_moco.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/cacr_moco.py --workdir=workdir/cacr_moco

Measured: study v2, arm cacr_moco (t- 4.0), is this config with the
study's shared recipe (pooled output, peak lr 0.06, crop scale 0.3-1)
for 6 epochs of the 50,000 images a validation holdout leaves, 4 seeds:
test kNN 82.41 / linear 86.17, random-init encoder 79.82 / 79.11
(studies/v2/REPORT.md, which lists every run's command). This
command (4 epochs of all 60,000 images) is not measured.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'moco'
  config.loss = 'cacr'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'t_pos': 1.0, 't_neg': 2.0, 'intra_batch': True})
  config.augment.num_views = 2
  config.moco.momentum = 0.99
  config.moco.query_views = (0, 1)
  config.moco.key_views = (0, 1)
  config.moco.queue_size = 4096
  return config
