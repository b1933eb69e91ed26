"""MoCo v3, ResNet-50 (Chen, Xie, He 2021): symmetric InfoNCE between a
predictor's queries and an EMA key encoder's keys, in-batch negatives only.

  python main.py --config=configs/papers/moco_v3.py:imagenet \\
      --workdir=gs://bucket/mocov3_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/moco_v3.py:cifar10 --workdir=...
  python main.py --config=configs/papers/moco_v3.py:cifar100 --workdir=...

imagenet: the released code's 100-epoch ResNet-50 command (batch 4096, LARS lr
0.6 x B / 256, tau 1.0, momentum 0.99 to 1, crop 0.2-1, BYOL's asymmetric
blur and solarisation). cifar10 / cifar100: solo-learn's MoCo v3 CIFAR recipe
(LARS eta 0.02 with clip_lr, batch 256) for 200 epochs (solo-learn: 1000).
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: 68.9% top-1 linear at 100 epochs (moco-v3 CONFIG.md). solo-learn's
README: CIFAR-10 93.10%, CIFAR-100 68.83% (online linear, 1000 epochs).
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
  # moco-v3 builder.py _build_mlp(last_bn=True) on the projector only:
  # BatchNorm1d(256, affine=False) after a bias-free last Linear.
  config.model.head_final_bn = True
  config.model.head_final_bn_scale = False
  config.model.head_final_bn_center = False
  if scale == 'imagenet':
    common.lars_simclr(config, epochs=100., base_learning_rate=0.6,
                       weight_decay=1e-6)
    config.model.head_hidden_dim, config.model.head_out_dim = 4096, 256
    # moco-v3 main_moco.py: MoCo_ResNet(partial(torchvision_models.resnet50,
    # zero_init_residual=True), ...): each block's last BN scale 0.
    config.model.encoder_kwargs.zero_init_residual = True
    config.augment.preset = 'byol'
    # moco-v3 main_moco.py: ColorJitter(0.4, 0.4, 0.2, 0.1) p=0.8; CONFIG.md
    # ResNet-50 commands: --crop-min=.2.
    config.augment.overrides = ({'jitter': (0.4, 0.4, 0.2, 0.1),
                                 'crop_scale': (0.2, 1.0)},)
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 1.0, 'in_batch_negatives': True})
    # builder.py contrastive_loss: CE x 2T per direction, both summed: 4T x
    # the mean over both directions that infonce returns.
    config.loss_scale = 4 * 1.0
    config.evals.linear_eval = common.linear_eval('moco_v3')
  else:
    # solo-learn scripts/pretrain/cifar/mocov3.yaml: weight_decay 1e-6.
    common.lars_simclr(config, batch_size=256, epochs=200.,
                       base_learning_rate=0.3, weight_decay=1e-6)
    # solo-learn mocov3.yaml optimizer.kwargs: eta 0.02, clip_lr True.
    config.optimizer.trust_coefficient = 0.02
    config.optimizer.clip_lr = True
    # solo-learn solo/methods/base.py: scheduler.warmup_start_lr 3e-5.
    config.optimizer.warmup_init_lr = 3e-5
    config.model.head_hidden_dim, config.model.head_out_dim = 4096, 256
    # solo-learn solo/methods/base.py: a fresh CIFAR conv1,
    # nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=2, bias=False).
    common.fresh_cifar_stem(config, padding=2)
    config.augment.preset = 'simclr_small'
    # solo-learn scripts/pretrain/cifar/augmentations/asymmetric.yaml:
    # jitter (0.4, 0.4, 0.2, 0.1) p 0.8, solarisation 0.0 / 0.2, no blur.
    config.augment.overrides = (
        {'jitter': (0.4, 0.4, 0.2, 0.1), 'solarize_p': 0.0},
        {'jitter': (0.4, 0.4, 0.2, 0.1), 'solarize_p': 0.2})
    config.loss_kwargs = ml_collections.ConfigDict(
        {'temperature': 0.2, 'in_batch_negatives': True})
    # solo/losses/mocov3.py: CE x 2T per direction, both summed (4T).
    config.loss_scale = 4 * 0.2
    config.evals.linear_eval = common.linear_eval('cifar')
    # solo-learn solo/data/pretrain_dataloader.py MEANS_N_STD.
    config.model.input_norm = f'{scale}_solo'
  return config
