"""DCL, decoupled contrastive learning (Yeh et al. 2022): NT-Xent without the
positive in the denominator, all 2N - 2 negatives of both views.

  python main.py --config=configs/papers/dcl.py:imagenet \\
      --workdir=gs://bucket/dcl_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/dcl.py:cifar10 --workdir=...
  python main.py --config=configs/papers/dcl.py:cifar100 --workdir=...

cifar10 / cifar100: lightly's CIFAR-10 DCL benchmark recipe (ResNet-18, batch
512, 200 epochs, tau 0.1). imagenet: SimCLR's ImageNet recipe (batch 4096,
LARS, 100 epochs) with the DCL loss at tau 0.1.
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: lightly's CIFAR-10 table, kNN 84.0% (batch 512, 200 epochs). The DCL
paper's ImageNet number, 68.2% top-1 linear (ResNet-50, batch 256, 200
epochs; abstract), is for a different batch and schedule than this config.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'in_batch'
  config.loss = 'dcl'
  # The DCL paper's SimCLR form and lightly's DCLLoss: all 2N - 2 negatives
  # of both views (layout 'simclr'), not the other view's N - 1.
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'layout': 'simclr'})
  # SimCLR's head: a BatchNorm on the output, after a bias-free last layer;
  # at imagenet SimCLR's code (learned scale, no offset), at cifar lightly's
  # SimCLRProjectionHead (BatchNorm1d(128): scale and offset).
  config.model.head_final_bn = True
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=100.)
    common.tf_init(config)  # SimCLR v1 resnet.py / model_util.py init.
    config.model.input_norm = 'none'   # SimCLR data_util.py: [0, 1].
    config.model.head_final_bn_center = False
  else:
    common.sgd_cifar(config)
    common.torch_conv_init(config)  # lightly's ResNet has no init loop.
    # lightly cifar10_benchmark.py SimCLRTransform cj_strength=0.5 (DCL too).
    config.augment.overrides = ({'jitter_strength': 0.5},)
  return config
