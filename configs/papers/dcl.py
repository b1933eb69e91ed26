"""DCL, decoupled contrastive learning (Yeh et al. 2022): NT-Xent without the
positive in the denominator; a baseline of the MACL paper.

Launch (every host of a pod runs the same command; configs/papers/common.py
says how to prepare ImageNet and join the hosts):

  python main.py --config=configs/papers/dcl.py:imagenet \\
      --workdir=gs://bucket/dcl_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/dcl.py:cifar10 --workdir=...
  python main.py --config=configs/papers/dcl.py:cifar100 --workdir=...

cifar10 / cifar100: lightly's CIFAR-10 benchmark recipe (common.sgd_cifar)
with lightly's DCLLoss temperature 0.1. Paper: lightly's table, kNN (k=200)
84.0% on CIFAR-10 at batch 512, 200 epochs (a peer's number, not measured
here).

imagenet: SimCLR's ImageNet recipe (common.lars_simclr, 100 epochs) with the
DCL loss at tau 0.1. Paper: no ImageNet number in this project's sources
(the DCL paper's own ImageNet runs used batch 256 and SGD); SimCLR's
64-65% at 100 epochs is the baseline it would be compared with.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'in_batch'
  config.loss = 'dcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'layout': 'cross_view'})
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=100.)
  else:
    common.sgd_cifar(config)
    # lightly cifar10_benchmark.py SimCLRTransform cj_strength=0.5 (DCL too).
    config.augment.overrides = ({'jitter_strength': 0.5},)
  return config
