"""MoCo v2 (Chen, Fan, Girshick, He 2020): EMA key encoder, a queue of 65536
past keys, InfoNCE, shuffle-BN.

Launch (every host of a pod runs the same command; configs/papers/common.py
says how to prepare ImageNet and join the hosts):

  python main.py --config=configs/papers/moco_v2.py:imagenet \\
      --workdir=gs://bucket/mocov2_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/moco_v2.py:cifar10 --workdir=...
  python main.py --config=configs/papers/moco_v2.py:cifar100 --workdir=...

imagenet: the paper's recipe: ResNet-50, batch 256, SGD lr 0.03 (momentum
0.9, weight decay 1e-4), cosine, 200 epochs (--config.num_epochs=800 for the
long one), queue 65536, key momentum 0.999, tau 0.2, shuffle-BN, the
2048-2048-128 MLP head (no BN), "aug+" (crop 0.2-1, colour jitter 0.4 p=0.8,
grayscale 0.2, blur 0.5, flip). Evaluated with MoCo's linear classification
(SGD lr 30, 100 epochs, x0.1 at 60 and 80, augmented images).
Paper: 67.5% top-1 linear at 200 epochs, 71.1% at 800 epochs (Table 2).

cifar10 / cifar100: lightly's CIFAR-10 benchmark recipe for MoCo
(common.sgd_cifar; key momentum 0.99, a 4096-key queue, tau 0.1, split
(shuffle) BN, a 512-512-128 head). Paper: lightly's table, kNN (k=200) 84.7%
on CIFAR-10 at batch 512, 200 epochs (a peer's number, not measured here).

Differs from the paper: shuffle-BN permutes the key batch across all devices
of the mesh and normalises per device (the paper: per GPU, 8 GPUs); the host
centre-crops ImageNet to 224 first; bf16 compute.
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
  if scale == 'imagenet':
    common.sgd_moco_v2(config, epochs=200.)
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 0.2, 'in_batch_negatives': False})
    config.moco.momentum = 0.999
    config.moco.queue_size = 65536
  else:
    common.sgd_cifar(config)
    # lightly cifar10_benchmark.py SimCLRTransform cj_strength=0.5 (MoCo too).
    config.augment.overrides = ({'jitter_strength': 0.5},)
    config.model.head_batch_norm = False      # MoCo's head.
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 0.1, 'in_batch_negatives': False})
    config.moco.momentum = 0.99
    config.moco.queue_size = 4096
  return config
