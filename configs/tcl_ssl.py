"""Tuned Contrastive Learning, self-supervised (Animesh 2023): positive triplets.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/tcl_ssl.py --workdir=workdir/tcl_ssl

Expected: not measured yet. The study (python -m benchmarks.reproduce; results
in benchmarks/REPORT.md) trains this config for 2 epochs with 3 seeds; its mean
+- std replaces this line when it has finished.

Thesis defaults (notes/tcl.md Sec. 0): k1 = 1, k2 = 1.5, three views; tau is
not stated (0.2, solo-learn's SimCLR value, per the note).

Inherited from configs/default.py and so different from the paper: the small
CNN (4 conv stages, 32-256 channels; the flattened 3x3x256 map is the evaluated
representation; a 512-128 MLP head), AdamW (lr 1e-3 * B / 256, 5% warmup then
cosine, wd 1e-4), batch 256, 4 epochs, and the 'fmnist' augmentation (crop
0.3-1, flip, brightness/contrast jitter, random erasing) on 28x28 grayscale
Fashion-MNIST. The paper used solo-learn's SimCLR setting: ResNet-18, LARS,
SimAugment with Gaussian blur.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'in_batch'
  config.loss = 'tcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.2, 'k1': 1., 'k2': 1.5})
  config.augment.num_views = 3
  return config
