"""SupCon (Khosla et al. 2020): supervised contrastive loss, every view with
the anchor's label is a positive.

Launch (every host of a pod runs the same command; configs/papers/common.py
says how to prepare ImageNet and join the hosts):

  python main.py --config=configs/papers/supcon.py:imagenet \\
      --workdir=gs://bucket/supcon_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/supcon.py:cifar10 --workdir=...
  python main.py --config=configs/papers/supcon.py:cifar100 --workdir=...

imagenet: ResNet-50, tau 0.1, L_out, LARS with SimCLR's settings at batch
4096, 10 warmup epochs then cosine, 2048-2048-128 head, SimCLR's
augmentation, 350 epochs. Paper: 78.7% top-1 (ResNet-50, Table 1; the
batch and epochs quoted without the paper at hand, unverified here), with
AutoAugment and batch 6144 over 700 epochs, which this does not follow (no
AutoAugment here; --config.batch_size=6144 --config.num_epochs=700 for the
paper's size).

cifar10 / cifar100: the SupContrast code's recipe (batch 1024, SGD lr 0.5 x B
/ 1024, momentum 0.9, weight decay 1e-4, 10 warmup epochs from lr 0.01 then
cosine, tau 0.1, crop 0.2-1, colour
jitter (0.4, 0.4, 0.4, 0.1) p 0.8) with ResNet-18
for 200 epochs. Paper: 96.0% (CIFAR-10) and 76.5% (CIFAR-100) top-1 with
ResNet-50 over 1000 epochs (Table 2): a stronger encoder and a 5x longer
schedule than this config.
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
  return config
