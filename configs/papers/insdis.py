"""InsDis / Instance Discrimination (Wu et al. 2018): a memory bank of every
example's 128-d embedding, NCE against 4096 sampled bank rows.

  python main.py --config=configs/papers/insdis.py:imagenet \\
      --workdir=gs://bucket/insdis_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/insdis.py:cifar10 --workdir=...
  python main.py --config=configs/papers/insdis.py:cifar100 --workdir=...

imagenet: the released code's recipe (ResNet-50, linear 128-d embedding, tau
0.07, bank momentum 0.5, SGD lr 0.03 at batch 256, x0.1 at epochs 120 and
160 of 200, kNN at sigma 0.07), MoCo's linear classification. cifar10 /
cifar100: the released CIFAR code's defaults (ResNet-18, batch 128, lr 0.03,
tau 0.1, no flip).
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: 54.0% top-1 linear, ResNet-50 (InsDis paper Table 2; unverified here);
80.4% kNN top-1 on CIFAR-10 with 4096 noise rows (InsDis paper Table 1;
unverified here). No CIFAR-100 number.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'memory_bank'
  config.loss = 'insdis'
  # lemniscate lib/NCECriterion.py: the NCE terms only, no proximal term.
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.07, 'proximal_weight': 0.0})
  config.augment.num_views = 1
  config.memory_bank.momentum = 0.5
  config.memory_bank.num_negatives = 4096
  if scale == 'imagenet':
    common.sgd_moco_v2(config, epochs=200.)
    config.augment.preset = 'moco_v1'
    # lemniscate main.py: ColorJitter(0.4, 0.4, 0.4, 0.4), always, after
    # RandomGrayscale(0.2): RandomResizedCrop, RandomGrayscale, ColorJitter,
    # RandomHorizontalFlip.
    config.augment.overrides = ({'jitter': (0.4, 0.4, 0.4, 0.4)},)
    config.augment.op_order = 'crop, grayscale, jitter, flip'
    config.optimizer.schedule = 'step'
    config.optimizer.decay_epochs = (120, 160)
    # lemniscate main.py: kNN(..., sigma=args.nce_t), 0.07 on ImageNet.
    config.evals.knn.temperature = 0.07
  else:
    common.sgd_cifar(config, batch_size=128)
    # lemniscate models/resnet_cifar.py has no init loop: nn.Conv2d's
    # default init (its ImageNet models/resnet.py draws torchvision's
    # kaiming_normal fan_out, the default here).
    common.torch_conv_init(config)
    # lemniscate cifar.py: --nce-t 0.1, batch 128, SGD lr 0.03 (momentum
    # 0.9, weight decay 5e-4), x0.1 at epochs 120 and 160 of 200;
    # RandomResizedCrop(32, (0.2, 1)), ColorJitter(0.4, 0.4, 0.4, 0.4)
    # always, grayscale 0.2, no flip.
    config.loss_kwargs.temperature = 0.1
    config.optimizer.base_learning_rate = 0.03 * 256 / 128
    config.optimizer.schedule = 'step'
    config.optimizer.decay_epochs = (120, 160)
    config.augment.preset = 'moco_v1'
    config.augment.overrides = ({'jitter': (0.4, 0.4, 0.4, 0.4),
                                 'flip_p': 0.0},)
    # lemniscate cifar.py Normalize: CIFAR-10's statistics, hard-coded.
    config.model.input_norm = 'cifar10'
  config.model.head_layers = 1          # A linear 128-d embedding.
  config.model.head_out_dim = 128
  return config
