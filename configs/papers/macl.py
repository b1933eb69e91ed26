"""MACL (Huang et al. 2023): model-aware contrastive learning, a temperature
that follows the batch's alignment (MACL-a: tau = tau0 * alpha^A).

Launch (every host of a pod runs the same command; configs/papers/common.py
says how to prepare ImageNet and join the hosts):

  python main.py --config=configs/papers/macl.py:imagenet \\
      --workdir=gs://bucket/macl_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/macl.py:cifar10 --workdir=...
  python main.py --config=configs/papers/macl.py:cifar100 --workdir=...

cifar10 / cifar100: the paper's recipe (/work/shared/notes/macl.md Sec. 4-5):
SimCLR framework, ResNet-18 with the CIFAR stem, Adam lr 1e-3 fixed, weight
decay 1e-6, batch 256, 200 epochs, tau0 0.1, alpha 2, crop (0.08-1) +
colour jitter (0.4, p 0.8) + grayscale 0.2 + flip, no blur; linear probe SGD
lr 0.02 for 100 epochs; kNN k = 200. Paper: 87.37% linear / 85.52% kNN on
CIFAR-10 and 60.81% / 55.70% on CIFAR-100 (MACL-a, Table 4).

imagenet: the paper has no ImageNet experiment; this is SimCLR's ImageNet
recipe (common.lars_simclr: batch 4096, LARS, 100 epochs) with MACL's loss.
Paper: no ImageNet number exists; SimCLR's 64-65% at 100 epochs (Figure 9)
is the baseline it would be compared with.

Differs from the paper: AdamW's decoupled weight decay (1e-6 x lr per step,
negligible) for Adam's L2 1e-6; the head's BatchNorm (the paper does not
specify its head; notes/macl.md recommends this one); bf16 compute.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'in_batch'
  config.loss = 'macl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'variant': 'a', 'alpha': 2.0})
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=100.)
  else:
    common.adam_small(config, epochs=200.)
    config.augment.preset = 'cifar_small'
    config.augment.overrides = ({'crop_scale': (0.08, 1.0)},)
    config.evals.knn.ks = (200,)
    config.evals.linear_eval = common.linear_eval('macl')
  return config
