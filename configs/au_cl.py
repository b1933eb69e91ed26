"""AU-CL (Wang & Isola 2020): alignment + uniformity.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/au_cl.py --workdir=workdir/au_cl

Expected, from the study (`python -m benchmarks.reproduce`; all figures in
benchmarks/REPORT.md): % on the test split, mean +- std over the seeds
finished (of 3), then n seeds and steps x batch size:
  regular data           kNN 82.19 +- 0.13 linear 87.86 +- 0.17 n=3, 390x256
Seed 0 of the first line, on the 50,000 training images the validation
holdout leaves (8 virtual CPU devices):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/au_cl.py \
    --workdir=workdir/regular__au_cl__s0 --config.augment.preset=fmnist \
    --config.batch_size=256 --config.checkpoint_every_steps=100 \
    --config.dataset.validation_size=10000 --config.eval.baselines=False \
    --config.eval.split=test --config.num_epochs=2.002564 \
    --config.online.knn_every_steps=0 --config.seed=0
Written by `python -m benchmarks.reproduce --update_configs`.

Defaults (notes/cacr.md Sec. 2.10): alpha = 2, t = 2, weight 1; no temperature.

Inherited from configs/base.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used an AlexNet-style encoder (CACR's small-scale
setup, batch 768, 200 epochs), SGD lr 0.12 * B / 256 with momentum 0.9, and
Wang & Isola's augmentation (random resized crop 0.2-1, flip, colour jitter
0.4, grayscale 0.2).
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
