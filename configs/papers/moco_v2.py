"""MoCo v2 (Chen, Fan, Girshick, He 2020): EMA key encoder, a queue of past
keys, InfoNCE, shuffle-BN.

  python main.py --config=configs/papers/moco_v2.py:imagenet \\
      --workdir=gs://bucket/mocov2_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/moco_v2.py:cifar10 --workdir=...
  python main.py --config=configs/papers/moco_v2.py:cifar100 --workdir=...

imagenet: the released code's MoCo v2 command (ResNet-50, batch 256, SGD lr
0.03, cosine, 200 epochs, queue 65536, tau 0.2, aug+, BN per 8-GPU group),
MoCo's linear classification. cifar10 / cifar100: lightly's CIFAR-10 MoCo
benchmark recipe (ResNet-18, batch 512, symmetric loss, both views' keys
enqueued, memory bank 8192, tau 0.1, SplitBatchNorm over 8 groups).
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: 67.5% top-1 linear at 200 epochs (facebookresearch/moco README table);
lightly's CIFAR-10 table: kNN 84.7% (batch 512, 200 epochs). No published
CIFAR-100 number for this recipe.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'moco'
  config.loss = 'infonce'
  config.moco.query_views = (0,)
  config.moco.key_views = (1,)
  config.moco.shuffle_bn = True
  # BatchNorm per 1/8 of each view's batch: MoCo's per-GPU BN on 8 GPUs (32
  # images each at batch 256); lightly's SplitBatchNorm(num_splits=8) on CIFAR.
  config.model.bn_splits = 8
  if scale == 'imagenet':
    common.sgd_moco_v2(config, epochs=200.)
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 0.2, 'in_batch_negatives': False})
    config.moco.momentum = 0.999
    config.moco.queue_size = 65536
  else:
    common.sgd_cifar(config)
    common.torch_conv_init(config)  # lightly's ResNet has no init loop.
    # lightly cifar10_benchmark.py SimCLRTransform cj_strength=0.5 (MoCo too).
    config.augment.overrides = ({'jitter_strength': 0.5},)
    config.model.head_batch_norm = False      # MoCo's head.
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 0.1, 'in_batch_negatives': False})
    # lightly cifar10_benchmark.py MocoModel: loss 0.5 (l(x0, x1) +
    # l(x1, x0)); benchmarks.rst: a memory bank of 8192 for batch 512.
    config.moco.query_views = (0, 1)
    config.moco.key_views = (0, 1)
    # Each of lightly's two criterion calls enqueues its keys: both views'.
    config.moco.enqueue_keys = 'all'
    config.moco.momentum = 0.99
    config.moco.queue_size = 8192
  return config
