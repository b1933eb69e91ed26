"""SimCLR (Chen et al. 2020): NT-Xent over the 2N views of a batch.

  python main.py --config=configs/papers/simclr.py:imagenet \\
      --workdir=gs://bucket/simclr_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/simclr.py:cifar10 --workdir=...
  python main.py --config=configs/papers/simclr.py:cifar100 --workdir=...

imagenet: SimCLR's released ResNet-50 recipe (batch 4096, LARS, 100 epochs);
its longer runs keep 10 warmup epochs (800 epochs: --config.num_epochs=800
--config.optimizer.warmup_fraction=0.0125). cifar10 / cifar100: lightly's
CIFAR-10 benchmark recipe (ResNet-18, batch 512, 200 epochs).
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: 69.3% top-1 linear, ResNet-50, 1000 epochs (SimCLR paper Table 6;
unverified here); the code's README gives about 64.5% for its 100-epoch
command. lightly's CIFAR-10 table: kNN 84.8% (batch 512, 200 epochs). No
published CIFAR-100 number for this recipe.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'in_batch'
  config.loss = 'ntxent'
  # A BatchNorm on the head's output, after a bias-free last layer.
  config.model.head_final_bn = True
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=100.)
    # SimCLR v1 resnet.py and model_util.py: zero-init residual (init_zero
    # on each block's last BN), convs tf.variance_scaling_initializer(), head
    # random_normal(0.01).
    common.tf_init(config)
    # simclr data_util.py preprocess_image: [0, 1], no mean / std.
    config.model.input_norm = 'none'
    config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.1})
    # simclr model_util.py linear_layer(use_bias=False, use_bn=True): BN
    # with center=use_bias=False, a learned scale only.
    config.model.head_final_bn_center = False
    # simclr objective.py add_contrastive_loss: loss_a + loss_b, each a mean
    # over the N anchors of one view; ntxent is their mean.
    config.loss_scale = 2.0
  else:
    common.sgd_cifar(config)
    common.torch_conv_init(config)  # lightly's ResNet has no init loop.
    # lightly SimCLRProjectionHead: BatchNorm1d(128), scale and offset.
    config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.5})
    # lightly cifar10_benchmark.py SimCLRTransform cj_strength=0.5; simclr
    # README CIFAR command --color_jitter_strength=0.5.
    config.augment.overrides = ({'jitter_strength': 0.5},)
  return config
