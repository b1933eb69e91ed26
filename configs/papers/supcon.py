"""SupCon (Khosla et al. 2020): supervised contrastive loss, every view with
the anchor's label is a positive.

  python main.py --config=configs/papers/supcon.py:imagenet \\
      --workdir=gs://bucket/supcon_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/supcon.py:cifar10 --workdir=...
  python main.py --config=configs/papers/supcon.py:cifar100 --workdir=...

imagenet: ResNet-50, tau 0.1, L_out, SupContrast's head, SimCLR's LARS recipe
at batch 4096 for 350 epochs (the paper's ImageNet values are unverified).
cifar10 / cifar100: SupContrast's CIFAR command (batch 1024, SGD lr 0.5, 10
warmup epochs from 0.01, cosine, tau 0.1) with ResNet-18 for 200 epochs,
and its linear evaluation (main_linear.py: SGD lr 5 at batch 512, step decay).
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: 78.7% top-1, ResNet-50 (SupCon paper Table 1, with AutoAugment;
unverified here); SupContrast README: 96.0% (CIFAR-10) and 76.5% (CIFAR-100)
top-1 with ResNet-50 over 1000 epochs, a stronger and longer setting.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'in_batch'
  config.use_labels = True
  config.loss = 'supcon'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.1, 'variant': 'out'})
  # SupContrast networks/resnet_big.py SupConResNet head='mlp':
  # Linear-ReLU-Linear, no BatchNorm.
  config.model.head_batch_norm = False
  # SupContrast losses.py: loss x (temperature / base_temperature), 0.1 /
  # 0.07; supcon itself leaves that factor out.
  config.loss_scale = 0.1 / 0.07
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=350.)
  else:
    common.sgd_cifar(config, batch_size=1024)
    config.optimizer.base_learning_rate = 0.5 * 256 / 1024
    config.optimizer.weight_decay = 1e-4
    # SupContrast main_supcon.py L106-118 (warm forced at batch > 256):
    # warm_epochs 10, warmup_from 0.01, then cosine.
    config.optimizer.warmup_fraction = 10. / config.num_epochs
    config.optimizer.warmup_init_lr = 0.01
    # SupContrast main_supcon.py L146-155: RandomResizedCrop(32, scale=(0.2,
    # 1.)), ColorJitter(0.4, 0.4, 0.4, 0.1) p=0.8.
    config.augment.overrides = ({'crop_scale': (0.2, 1.0),
                                 'jitter': (0.4, 0.4, 0.4, 0.1)},)
    # SupContrast main_linear.py with its README command (batch 512, lr 5).
    config.evals.linear_eval = common.linear_eval('supcon')
  return config
