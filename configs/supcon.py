"""SupCon (Khosla et al. 2020), L_out, with labels.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/supcon.py --workdir=workdir/supcon

Expected, from the study (`python -m benchmarks.reproduce`; all figures in
benchmarks/REPORT.md): % on the test split, mean +- std over the seeds
finished (of 3), then n seeds and steps x batch size:
  regular data           kNN 84.58 +- 0.20 linear 88.60 +- 0.12 n=3, 390x256
Seed 0 of the first line, on the 50,000 training images the validation
holdout leaves (8 virtual CPU devices):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/supcon.py \
    --workdir=workdir/regular__supcon__s0 --config.augment.preset=fmnist \
    --config.batch_size=256 --config.checkpoint_every_steps=100 \
    --config.dataset.validation_size=10000 --config.eval.baselines=False \
    --config.eval.split=test --config.num_epochs=2.002564 \
    --config.online.knn_every_steps=0 --config.seed=0
Written by `python -m benchmarks.reproduce --update_configs`.

Supervised, so higher than the self-supervised runs.

Paper (CIFAR): tau = 0.1, L_out. Optimizer: the project default (AdamW; the
paper used SGD/LARS, lr 0.5).

Inherited from configs/base.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used ResNet-50, SGD/LARS lr 0.5 (cosine), batch 1024,
up to 1000 epochs, and AutoAugment.
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
