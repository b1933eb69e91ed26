"""MoCo v3, ResNet-50 (Chen, Xie, He 2021): symmetric InfoNCE between a
predictor's queries and an EMA key encoder's keys, in-batch negatives only.

Launch (every host of a pod runs the same command; configs/papers/common.py
says how to prepare ImageNet and join the hosts):

  python main.py --config=configs/papers/moco_v3.py:imagenet \\
      --workdir=gs://bucket/mocov3_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/moco_v3.py:cifar10 --workdir=...
  python main.py --config=configs/papers/moco_v3.py:cifar100 --workdir=...

imagenet: the released code's 100-epoch ResNet-50 recipe (moco-v3 README):
batch 4096, LARS lr 0.6 x B / 256, weight decay 1e-6, 10 warmup epochs then
cosine, tau 1.0, key momentum 0.99 rising to 1 on a cosine, the projector
2048-4096-256 and the predictor 256-4096-256 (BN, ReLU), BYOL's asymmetric
augmentation (blur 1.0 / 0.1, solarize 0 / 0.2, crop 0.08-1) with the
code's colour jitter (0.4, 0.4, 0.2, 0.1), the
symmetric loss ctr(q1, k2) + ctr(q2, k1). Evaluated with the code's linear
classification (SGD, lr 0.1 x B / 256, batch 1024, 90 epochs, cosine).
Paper: 68.9% top-1 linear at 100 epochs; 74.6% at 1000 epochs (lr 0.3,
weight decay 1.5e-6, momentum from 0.996, crop 0.2-1) (moco-v3 README;
Table 4 of the paper for the 1000-epoch number).

cifar10 / cifar100: solo-learn's MoCo v3 CIFAR recipe (LARS lr 0.3 x B / 256
with eta 0.02 and each layer's rate capped at the lr (clip_lr), batch 256,
weight decay 1e-6, 10 warmup epochs, tau 0.2, momentum 0.99 to 1,
projector 512-4096-256, predictor 4096, colour jitter (0.4, 0.4, 0.2, 0.1)
p 0.8) for 200 epochs, the lightly benchmark's length (solo-learn trains
1000). Paper: solo-learn's CIFAR-10
linear top-1 93.1% at 1000 epochs (a peer's number, quoted without its
source at hand: unverified here; not measured here).

Differs from the paper: the projector's last layer has no BatchNorm (the
paper's has an affine-free BN) and the predictor's last layer none either;
the host centre-crops ImageNet to 224 first; bf16 compute.
"""

import ml_collections

from configs.papers import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  scale = common.scale_of(arg)
  config = common.base(scale)
  config.method = 'moco'
  config.loss = 'infonce'
  config.moco.query_views = (0, 1)
  config.moco.key_views = (0, 1)      # Pairs (0, 1) and (1, 0): symmetric.
  config.moco.queue_size = 0
  config.moco.momentum = 0.99
  config.moco.momentum_schedule = 'cosine'
  config.moco.predictor_hidden_dim = 4096
  config.augment.preset = 'byol'
  config.model.head_hidden_dim = 4096
  config.model.head_out_dim = 256
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=100., base_learning_rate=0.6,
                       weight_decay=1e-6)
    config.model.head_hidden_dim, config.model.head_out_dim = 4096, 256
    config.augment.preset = 'byol'
    # moco-v3 main_moco.py L265, L277: ColorJitter(0.4, 0.4, 0.2, 0.1) p=0.8.
    config.augment.overrides = ({'jitter': (0.4, 0.4, 0.2, 0.1)},)
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 1.0, 'in_batch_negatives': True})
    config.evals.linear_eval.batch_size = 1024
  else:
    # solo-learn scripts/pretrain/cifar/mocov3.yaml: weight_decay 1e-6.
    common.lars_simclr(config, batch_size=256, epochs=200.,
                       base_learning_rate=0.3, weight_decay=1e-6)
    # solo-learn mocov3.yaml optimizer.kwargs: eta 0.02, clip_lr True.
    config.optimizer.trust_coefficient = 0.02
    config.optimizer.clip_lr = True
    config.model.head_hidden_dim, config.model.head_out_dim = 4096, 256
    config.augment.preset = 'simclr_small'
    # solo-learn scripts/pretrain/cifar/mocov3.yaml: brightness 0.4,
    # contrast 0.4, saturation 0.2, hue 0.1, prob 0.8.
    config.augment.overrides = ({'jitter': (0.4, 0.4, 0.2, 0.1)},)
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 0.2, 'in_batch_negatives': True})
    config.evals.linear_eval = common.linear_eval('cifar')
  return config
