"""MoCo v3-style (Chen et al. 2021): symmetric InfoNCE with in-batch negatives, no queue.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/moco_v3.py --workdir=workdir/moco_v3

Expected: not measured yet. The study (python -m benchmarks.reproduce; results
in benchmarks/REPORT.md) trains this config for 2 epochs with 3 seeds; its mean
+- std replaces this line when it has finished.

Paper (ResNet): tau = 1.0, m = 0.99 rising to 1 on a cosine schedule,
symmetric loss ctr(q1, k2) + ctr(q2, k1), global (sync) BN. Deviation: no
prediction head on the query branch (models.py has none yet), so this is
MoCo v3 minus the predictor. Optimizer: the project default (AdamW; the
paper used LARS for ResNet).

Inherited from configs/base.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used ResNet-50 (or ViT) with a prediction head, LARS
(ResNet) or AdamW (ViT), batch 4096, and BYOL's asymmetric augmentation.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'moco'
  config.loss = 'infonce'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 1.0, 'in_batch_negatives': True})
  config.moco.momentum = 0.99
  config.moco.momentum_schedule = 'cosine'
  config.moco.query_views = (0, 1)
  config.moco.key_views = (0, 1)
  config.moco.queue_size = 0
  return config
