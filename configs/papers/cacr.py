"""CACR (Zheng et al. 2021): contrastive attraction (weighted positives) and
contrastive repulsion (weighted negatives); at ImageNet scale on MoCo v2.

Launch (every host of a pod runs the same command; configs/papers/common.py
says how to prepare ImageNet and join the hosts):

  python main.py --config=configs/papers/cacr.py:imagenet \\
      --workdir=gs://bucket/cacr_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/cacr.py:cifar10 --workdir=...
  python main.py --config=configs/papers/cacr.py:cifar100 --workdir=...

imagenet: the paper's MoCo v2 variant (Table 15; /work/shared/notes/cacr.md
Sec. 3.4): K = 4 positives (5 views per image, every view a query and a
key), t+ = 1.0, t- = 2.0, queue 65536, key momentum 0.999, MoCo v2's
optimizer (SGD lr 0.03, batch 256, cosine, 200 epochs), head and "aug+",
MoCo's linear classification. Paper: 70.35% top-1 linear (CACR K=4, Table
15; 68.40% with K=1: --config.augment.num_views=2
--config.moco.query_views='(0,1)' --config.moco.key_views='(0,1)').

cifar10 / cifar100: the paper's small-scale SimCLR-framework variant (Table
9: in-batch negatives, K = 4, the HCL setting: Adam lr 1e-3, weight decay
1e-6, batch 256, 400 epochs, a 512-128 head) with ResNet-18 (the paper:
ResNet-50). Paper: 92.89% (CIFAR-10) and 66.52% (CIFAR-100) linear top-1
with ResNet-50 (Table 9).

Differs from the paper: MoCo v2's key encoder is updated once per step for
all five key views (as the released code); the host centre-crops ImageNet
to 224 first; bf16 compute; AdamW's decoupled decay (1e-6 x lr, negligible)
for the paper's Adam L2 on CIFAR.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.loss = 'cacr'
  config.augment.num_views = 5          # K + 1 = 5 views of each image.
  if scale == 'imagenet':
    common.sgd_moco_v2(config, epochs=200.)
    config.method = 'moco'
    config.loss_kwargs = ml_collections.ConfigDict(
        {'t_pos': 1.0, 't_neg': 2.0, 'intra_batch': True})
    config.moco.momentum = 0.999
    config.moco.queue_size = 65536
    config.moco.query_views = (0, 1, 2, 3, 4)
    config.moco.key_views = (0, 1, 2, 3, 4)
    config.moco.shuffle_bn = True
  else:
    config.method = 'in_batch'
    config.loss_kwargs = ml_collections.ConfigDict(
        {'t_pos': 1.0, 't_neg': 0.9, 'negatives': 'cross_view'})
    common.adam_small(config, epochs=400.)
    config.evals.linear_eval = common.linear_eval('cacr_small')
  return config
