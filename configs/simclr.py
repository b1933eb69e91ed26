"""SimCLR (Chen et al. 2020): NT-Xent over 2 views, in-batch negatives.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/simclr.py --workdir=workdir/simclr

Expected, from the study (`python -m benchmarks.reproduce`; all figures in
benchmarks/REPORT.md): % on the test split, mean +- std over the seeds
finished (of 3), then n seeds and steps x batch size:
  regular data           kNN 81.60 +- 0.53 linear 87.59 +- 0.08 n=3, 390x256
  linear-imbalanced      kNN 74.74 +- 0.61 linear 84.28 +- 0.25 n=3, 390x256
  exponential-imbalanced kNN 36.18 +- 0.09 linear 50.48 +- 0.17 n=3, 390x256
Seed 0 of the first line, on the 50,000 training images the validation
holdout leaves (8 virtual CPU devices):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/simclr.py \
    --workdir=workdir/regular__simclr__s0 --config.augment.preset=fmnist \
    --config.batch_size=256 --config.checkpoint_every_steps=100 \
    --config.dataset.validation_size=10000 --config.eval.baselines=False \
    --config.eval.split=test --config.num_epochs=2.002564 \
    --config.online.knn_every_steps=0 --config.seed=0
Written by `python -m benchmarks.reproduce --update_configs`.

How it differs from configs/base.py, which every method config builds on:
only the temperature, tau = 0.2 against base.py's 0.1; everything else (loss,
data, encoder, optimizer, augmentation, epochs) is base.py's. The default job,
configs/default.py, is base.py plus the recipe chosen on the validation split
(the head reading the flattened map, batch 64 at the same peak lr), so this
is not the same run as the default job and its numbers
differ. tau = 0.2 is not a tuned value: it is the CACR paper's CL baseline
(tau = 0.19 at small scale, notes/cacr.md Sec. 2.10) and MoCo v2's, which is
why the study uses this config as the SimCLR side of the CACR comparisons. On
the validation split, at the default job's budget, tau 0.2 gave 82.83% kNN /
88.21% linear against tau 0.1's 83.33% / 88.18% (benchmarks/REPORT.md). The
SimCLR paper used 0.5 on CIFAR-10 and 0.1 on ImageNet.

Inherited from configs/base.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used ResNet-50, LARS (lr 0.3 * B / 256, wd 1e-6),
batch 4096, 100-1000 epochs, and random resized crop 0.08-1 + colour
distortion (+ blur on ImageNet).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'ntxent'
  config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.2})
  return config
