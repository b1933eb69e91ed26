"""InsDis (Wu et al. 2018): memory bank, NCE against sampled bank rows, one view.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/insdis.py --workdir=workdir/insdis

Expected, from the study (`python -m benchmarks.reproduce`; all figures in
benchmarks/REPORT.md): % on the test split, mean +- std over the seeds
finished (of 3), then n seeds and steps x batch size:
  regular data           kNN 79.76 +- 0.40 linear 85.98 +- 0.17 n=3, 390x256
Seed 0 of the first line, on the 50,000 training images the validation
holdout leaves (8 virtual CPU devices):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/insdis.py \
    --workdir=workdir/regular__insdis__s0 --config.augment.preset=fmnist \
    --config.batch_size=256 --config.checkpoint_every_steps=100 \
    --config.dataset.validation_size=10000 --config.eval.baselines=False \
    --config.eval.split=test --config.num_epochs=2.002564 \
    --config.online.knn_every_steps=0 --config.seed=0
Written by `python -m benchmarks.reproduce --update_configs`.

Paper: tau = 0.07, m = 4096 noise samples, bank momentum 0.5, 128-d.
Noise rows are drawn per instance, as in the reference code (lemniscate's
NCEAverage), each device drawing m / devices of them from its own shard of
the bank (state.sample_bank_noise: stratified, still uniform noise), so the
step reads [B, m, D] rows spread over the devices. Here m = 1024, not 4096, to
keep them small on the 2-core CPU: B * m * D = 256 * 1024 * 128 float32 =
134 MB per step in all (m = 4096 would be 537 MB and a slower step).
The normalising constant Z is the per-batch Monte-Carlo estimate (the
released code fixes Z after the first batch; see losses.insdis).
The proximal weight lambda = 50 (the loss's default) is NOT VERIFIED against
the paper's text; the released lemniscate code has no proximal term.

Inherited from configs/base.py and different from the paper: the optimizer
(AdamW, lr 1e-3 * B / 256, warmup + cosine; the paper: SGD lr 0.03, momentum
0.9), the augmentation (the 'fmnist' preset on 28x28 grayscale; the paper:
ImageNet random resized crop, colour jitter, grayscale, flip), the encoder
(the small CNN and its 2-layer head; the paper: ResNet-50 with a linear
128-d layer), batch 256 and 4 epochs (the paper: 200 epochs).
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
