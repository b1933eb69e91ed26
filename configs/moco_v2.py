"""MoCo v2 (Chen et al. 2020): EMA key encoder, queue of past keys, shuffle-BN.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/moco_v2.py --workdir=workdir/moco_v2

Expected, from the study (`python -m benchmarks.reproduce`; all figures in
benchmarks/REPORT.md): % on the test split, mean +- std over the seeds
finished (of 3), then n seeds and steps x batch size:
  regular data           kNN 81.93 +- 0.10 linear 87.32 +- 0.34 n=3, 390x256
Seed 0 of the first line, on the 50,000 training images the validation
holdout leaves (8 virtual CPU devices):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/moco_v2.py \
    --workdir=workdir/regular__moco_v2__s0 --config.augment.preset=fmnist \
    --config.batch_size=256 --config.checkpoint_every_steps=100 \
    --config.dataset.validation_size=10000 --config.eval.baselines=False \
    --config.eval.split=test --config.num_epochs=2.002564 \
    --config.online.knn_every_steps=0 --config.seed=0
Written by `python -m benchmarks.reproduce --update_configs`.

Paper: tau = 0.2, m = 0.999, Q = 65536, MLP head, SGD lr 0.03 * B / 256.
Here Q = 4096 (a multiple of the batch; Fashion-MNIST has 60k images) and
m = 0.99 (the MoCo CIFAR recipe: a few hundred steps at 0.999 barely move the
key encoder). Only queue negatives, as in MoCo (no in-batch negatives).
Optimizer: the project default (AdamW), not the paper's SGD.

Inherited from configs/base.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used ResNet-50 with a 2-layer head, SGD lr 0.03
(cosine, momentum 0.9, wd 1e-4), batch 256, 200 epochs, and MoCo v2's
augmentation (random resized crop 0.2-1, colour jitter p 0.8, grayscale 0.2,
blur 0.5, flip).
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
