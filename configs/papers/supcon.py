"""SupCon (Khosla et al. 2020): supervised contrastive loss, every view with
the anchor's label is a positive.

  python main.py --config=configs/papers/supcon.py:imagenet \\
      --workdir=gs://bucket/supcon_in1k --config.dataset.data_dir=$DATA
  python main.py --config=configs/papers/supcon.py:cifar10 --workdir=...
  python main.py --config=configs/papers/supcon.py:cifar100 --workdir=...

imagenet: the authors' TF code (google-research supcon/scripts/
supcon_imagenet_resnet50.sh): ResNet-50, tau 0.1, L_out with the loss scaled
by tau, a linear 128-d head on the L2-normalised encoder output, LARS at
batch 6144 (lr 0.4 x B / 256 = 9.6, weight decay 1e-3, 12 warmup epochs,
cosine) for 350 epochs, AutoAugment (TF Model Garden's 'v0' policy in
its conventions), and its linear stage (preset 'supcon_tf': RMSProp at
batch 6144, 12 warmup epochs then x0.97 every half epoch, label smoothing
0.05, on the L2-normalised encoder output, the frozen encoder's BatchNorm
on the batch's statistics).
cifar10 / cifar100: SupContrast's CIFAR command (batch 1024, SGD lr 0.5, 10
warmup epochs from 0.01, cosine to 1e-3 x lr, tau 0.1) with ResNet-18 for 200
epochs, and its linear evaluation (main_linear.py: SGD lr 5 at batch 512, step
decay).
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
  # Linear-ReLU-Linear, no BatchNorm (ImageNet: one linear layer, below).
  config.model.head_batch_norm = False
  # SupContrast losses.py: loss x (temperature / base_temperature), 0.1 /
  # 0.07; supcon itself leaves that factor out (ImageNet: below).
  config.loss_scale = 0.1 / 0.07
  if scale == 'imagenet':
    # supcon/preprocessing.py _convert_image_dtype: x / 127.5 - 1, and
    # inputs.py imagenet() sets no image_mean_std whitening.
    config.model.input_norm = 'symmetric'
    # The authors' TF code, google-research supcon/scripts/
    # supcon_imagenet_resnet50.sh with configs.sh SUPCON_FLAGS: LARS (eta
    # 1e-3, momentum 0.9) at batch 6144, lr 0.4 x B / 256, weight decay 1e-3
    # (BatchNorm excluded; its convolutions have no biases), 12 warmup epochs
    # (--stage_1_warmup_epochs default) then cosine, 350 epochs.
    common.lars_simclr(config, batch_size=6144, epochs=350.,
                       base_learning_rate=0.4, weight_decay=1e-3,
                       warmup_epochs=12.)
    # blocks.py: each block's last BN init_zero=True, convs
    # tf.variance_scaling_initializer(); projection_head.py: kernel
    # tf.random_normal_initializer(stddev=.01) (launcher.py passes none).
    common.tf_init(config)
    # --projection_head_layers=128: one Dense(128), no BatchNorm (the code's
    # Dense has no bias; this head's keeps one, undecayed).
    config.model.head_layers = 1
    config.model.head_out_dim = 128
    # SUPCON_FLAGS --normalize_embedding=True: models.py ContrastiveModel
    # feeds tf.nn.l2_normalize of the encoder output to the projection head
    # (SupContrast's SupConResNet normalises the head's output only: CIFAR
    # leaves this off).
    config.model.normalize_head_input = True
    # --scale_by_temperature=True: losses.py loss *= temperature (no
    # base_temperature, unlike SupContrast's 0.1 / 0.07).
    config.loss_scale = 0.1
    # --augmentation_type=AUTOAUGMENT: preprocessing.py distorted crop
    # (area 0.08-1), flip, AutoAugment; no colour jitter, grayscale or blur.
    # Its AutoAugment is tensorflow/models' AutoAugment().distort: policy
    # 'v0' with that file's ops, levels and uint8 arithmetic.
    config.augment.overrides = ({'autoaugment': 'v0',
                                 'autoaugment_impl': 'tf_model_garden',
                                 'jitter_strength': 0., 'jitter_p': 0.,
                                 'grayscale_p': 0., 'blur_p': 0.},)
    # Stage 2 of the same script (launcher.py, --stage_2_* flags): the
    # 'supcon_tf' preset (its values and sources in linear_eval.py).
    config.evals.linear_eval = common.linear_eval('supcon_tf')
  else:
    common.sgd_cifar(config, batch_size=1024)
    config.model.input_norm = scale   # main_supcon.py L133-139 mean / std.
    config.optimizer.base_learning_rate = 0.5 * 256 / 1024
    config.optimizer.weight_decay = 1e-4
    # SupContrast main_supcon.py L106-118 (warm forced at batch > 256):
    # warm_epochs 10, warmup_from 0.01, then cosine to eta_min = lr x
    # lr_decay_rate^3 = 1e-3 x lr (util.py adjust_learning_rate, set once per
    # epoch; here per step).
    config.optimizer.warmup_fraction = 10. / config.num_epochs
    config.optimizer.warmup_init_lr = 0.01
    config.optimizer.cosine_final = 1e-3
    # SupContrast main_supcon.py L146-155: RandomResizedCrop(32, scale=(0.2,
    # 1.)), ColorJitter(0.4, 0.4, 0.4, 0.1) p=0.8.
    config.augment.overrides = ({'crop_scale': (0.2, 1.0),
                                 'jitter': (0.4, 0.4, 0.4, 0.1)},)
    # SupContrast main_linear.py with its README command (batch 512, lr 5).
    config.evals.linear_eval = common.linear_eval('supcon')
  return config
