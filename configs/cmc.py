"""CMC (Tian et al. 2019) with K = 4 views, full graph, memory-bank negatives.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/cmc.py --workdir=workdir/cmc

Expected, from the study (`python -m benchmarks.reproduce`; all figures in
benchmarks/REPORT.md): % on the test split, mean +- std over the seeds
finished (of 3), then n seeds and steps x batch size:
  regular data           kNN 82.56 +- 0.24 linear 87.91 +- 0.03 n=3, 390x256
Seed 0 of the first line, on the 50,000 training images the validation
holdout leaves (8 virtual CPU devices):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/cmc.py \
    --workdir=workdir/regular__cmc_k4__s0 --config.augment.preset=fmnist \
    --config.batch_size=256 --config.checkpoint_every_steps=100 \
    --config.dataset.validation_size=10000 --config.eval.baselines=False \
    --config.eval.split=test --config.num_epochs=2.002564 \
    --config.online.knn_every_steps=0 --config.seed=0
Written by `python -m benchmarks.reproduce --update_configs`.

Paper: tau = 0.07, full graph over views (eq. 8), memory-bank negatives
(16384 on ImageNet; 4096 here). Deviations: the 4 views are 4 augmentations
of the same image (the paper used colour channels, L/ab, depth, ...) with one
shared encoder, and the bank holds one row per image (the normalised mean of
its views' embeddings) rather than one bank per view.

Inherited from configs/base.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used one encoder per view (AlexNet/ResNet halves on L
and ab colour channels), SGD lr 0.03 with momentum 0.9, and crop + flip on the
colour-split views.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'memory_bank'
  config.loss = 'cmc'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.07, 'graph': 'full'})
  config.augment.num_views = 4
  config.memory_bank.momentum = 0.5
  config.memory_bank.num_negatives = 4096
  config.memory_bank.noise = 'shared'    # One sample per batch, as CMC's code.
  return config
