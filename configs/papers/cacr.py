"""CACR (Zheng et al. 2021): contrastive attraction (weighted positives) and
contrastive repulsion (weighted negatives), K = 4 positives per image.

  python main.py --config=configs/papers/cacr.py:imagenet \\
      --workdir=gs://bucket/cacr_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/cacr.py:cifar10 --workdir=...
  python main.py --config=configs/papers/cacr.py:cifar100 --workdir=...

imagenet: the released MoCo v2 variant (5 views, every view a query and a key,
t+ 1.0, t- 2.0, queue 65536 fed the last view's keys, batch 256, 200 epochs,
BN per 8-GPU group), MoCo's linear classification. cifar10 / cifar100: the SimCLR-framework
variant in the HCL setting (Adam lr 1e-3, batch 256, 400 epochs, t- 0.9 /
2.0) with ResNet-18.
Every value, its source and why it differs: configs/papers/recipes.yaml.
Paper: 70.35% top-1 linear on ImageNet (CACR paper Table 15; 68.40% with
K = 1); 92.89% (CIFAR-10) and 66.52% (CIFAR-100) linear top-1 with ResNet-50
(CACR paper Table 9).
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
    # CACR-SSL large_scale_shift_experiments/imagenet/ours/builder.py:
    # _dequeue_and_enqueue(k_list[-1]), the last view's keys.
    config.moco.enqueue_keys = 'last'
    config.model.bn_splits = 8          # MoCo's per-GPU BN on 8 GPUs.
  else:
    config.method = 'in_batch'
    # CACR-SSL small_scale_experiments README: --tau_neg 0.9 (CIFAR-10),
    # 2.0 (CIFAR-100) with K = 4.
    t_neg = 0.9 if scale == 'cifar10' else 2.0
    config.loss_kwargs = ml_collections.ConfigDict(
        {'t_pos': 1.0, 't_neg': t_neg, 'negatives': 'cross_view'})
    common.adam_small(config, epochs=400.)
    # HCL image/model.py: a fresh CIFAR conv1 (3x3, stride 1, padding 1) in
    # torchvision's ResNet, at torch's default init.
    common.fresh_cifar_stem(config)
    # HCL image/main.py Adam(model.parameters(), weight_decay=1e-6).
    config.optimizer.decay_biases_and_bn = True
    # HCL image/utils.py train_transform: ColorJitter(0.4, 0.4, 0.4, 0.1)
    # p 0.8, grayscale 0.2, blur (3 px, sigma 0.1-2) p 0.5, crop 0.08-1.
    config.augment.overrides = ({'jitter_strength': 0.5, 'blur_p': 0.5},)
    config.evals.linear_eval = common.linear_eval('cacr_small')
    # CACR-SSL small_scale_experiments/<dataset>/main_ours.py Normalize:
    # each dataset's own statistics.
    config.model.input_norm = scale
  return config
