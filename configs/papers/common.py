"""The two scales of configs/papers/*.py: ImageNet ResNet-50, CIFAR ResNet-18.

Every file of configs/papers/ is one method; the scale is its config
argument (ml_collections' `file.py:arg`, as big_vision's configs):

  --config=configs/papers/<method>.py:imagenet   ImageNet-1k, ResNet-50
  --config=configs/papers/<method>.py:cifar10    CIFAR-10, ResNet-18
  --config=configs/papers/<method>.py:cifar100   CIFAR-100, ResNet-18

`base(scale)` holds what every method shares at a scale: data, encoder, mixed
precision, evaluation. The method file then sets the paper's method, loss,
optimizer, schedule and augmentation, and names in its docstring the
published number it targets, labelled as the paper's (nothing at these
scales has been measured where this project is developed: a 2-core CPU).

Launching. ImageNet is read from TFDS's ArrayRecord files, which TFDS never
downloads: put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar into
$DATA/downloads/manual/ and run once
`tfds build imagenet2012 --data_dir=$DATA --file_format=array_record`.
CIFAR is downloaded by TFDS on first use (needs the network; offline it
fails at once with a message saying so). On a pod every host runs the same
command (README, "Scaling up"): TPU pods and SLURM need JAX_DISTRIBUTED=1,
other clusters JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID.
"""

import ml_collections

from configs import base as base_config

SCALES = ('imagenet', 'cifar10', 'cifar100')
# The encoder's initialisation in torchvision's resnet.py (MoCo v2 and its
# copies, SupContrast, TCL, solo-learn, lemniscate's ImageNet ResNet): every
# conv kaiming_normal_(mode='fan_out'), every BatchNorm scale 1
# (zero_init_residual=False). configs/papers/recipes.yaml rows
# `encoder.zero_init_residual` and `encoder.conv_init` give each config's.
TORCHVISION_INIT = {'zero_init_residual': False,
                    'conv_init': 'kaiming_normal_fan_out',
                    'stem_conv_init': '', 'stem_padding': 0}


def scale_of(arg: str | None) -> str:
  """The scale named by the config argument (default 'imagenet')."""
  scale = arg or 'imagenet'
  if scale not in SCALES:
    raise ValueError(f'unknown scale {scale!r} after the config file\'s ":"; '
                     f'known: {", ".join(SCALES)} (e.g. '
                     '--config=configs/papers/simclr.py:cifar10).')
  return scale


def linear_eval(preset: str, **fields) -> dict:
  """A `config.evals` entry for the papers' linear evaluation with `preset`
  (contrastive_jax/evaluators/linear_eval.py PRESETS)."""
  return {'type': 'linear_eval', 'every_steps': 0, 'preset': preset,
          'epochs': 0, 'batch_size': 0, **fields}


def base(scale: str) -> ml_collections.ConfigDict:
  """configs/base.py at `scale`: data, encoder, precision, evaluation."""
  config = base_config.get_config()
  config.model.dtype = 'bfloat16'     # Mixed precision (models.py).
  # The PyTorch references' head: nn.Linear's default init (kernel and bias
  # U(+-1 / sqrt(fan_in))); the TF codes' is set by `tf_init`.
  config.model.head_init = 'torch_default'
  # torchvision's ImageNet mean / std on the [0, 1] images (models.py
  # INPUT_NORMS): MoCo v2 / v3 and lemniscate main_moco.py / main.py at
  # ImageNet, lightly's IMAGENET_NORMALIZE on its CIFAR-10 benchmark. Configs
  # whose reference normalises otherwise set their own.
  config.model.input_norm = 'imagenet'
  config.eval.baselines = False       # Raw pixels of 224 px: 150k-d rows.
  config.eval.batch_size = 1024
  config.log_every_steps = 100
  if scale == 'imagenet':
    config.dataset.name = 'imagenet2012'
    config.dataset.eval_split = 'validation'
    # The reference codes' ImageNet pipeline: each view's random resized
    # crop cut from the full decoded image and resized to 224 (torchvision's
    # RandomResizedCrop, SimCLR's distorted_bounding_box_crop), evaluation
    # images Resize(256) + CenterCrop(224) (SimCLR: CROP_PROPORTION 0.875).
    config.dataset.image_size = 224
    config.dataset.train_crop_source = 'full_image'
    config.dataset.eval_crop_fraction = 224 / 256
    config.dataset.in_memory = False  # Every host reads only its part.
    config.model.encoder = 'resnet50'
    config.model.encoder_kwargs = ml_collections.ConfigDict(
        {'stem': 'imagenet', 'stage_sizes': (3, 4, 6, 3), 'width': 64,
         **TORCHVISION_INIT})
    config.checkpoint_every_steps = 2000
    config.evals.online_knn.every_steps = 5000
  else:
    config.dataset.name = scale
    config.dataset.eval_split = 'test'
    config.dataset.image_size = None  # TFDS's 32 x 32.
    config.dataset.in_memory = True   # 50k 32 x 32 x 3 images: 150 MB.
    config.model.encoder = 'resnet18'
    config.model.encoder_kwargs = ml_collections.ConfigDict(
        {'stem': 'cifar', 'stage_sizes': (2, 2, 2, 2), 'width': 64,
         **TORCHVISION_INIT})
    config.augment.preset = 'simclr_small'   # SimCLR's, no blur at 32 px.
    config.checkpoint_every_steps = 1000
    config.evals.online_knn.every_steps = 2000
  return config


def tf_init(config):
  """The TF codes' initialisation (SimCLR v1 resnet.py and model_util.py;
  the SupCon authors' blocks.py and projection_head.py): the last BatchNorm
  of every residual block with scale 0 (`batch_norm_relu(..., init_zero=True)`
  / `batch_norm(init_zero=True)`), every conv
  `tf.variance_scaling_initializer()` (scale 1, fan_in, truncated normal:
  'lecun_normal'), every head Dense `tf.random_normal_initializer(
  stddev=.01)` with zero biases."""
  config.model.encoder_kwargs.zero_init_residual = True
  config.model.encoder_kwargs.conv_init = 'lecun_normal'
  config.model.head_init = 'normal_0.01'
  return config


def fresh_cifar_stem(config, *, padding: int = 0):
  """The CIFAR stem of codes that replace torchvision's conv1 by a fresh
  nn.Conv2d(3, 64, 3, stride=1, bias=False): its kernel keeps torch's
  default init while the rest stays kaiming (HCL image/model.py, solo-learn
  solo/methods/base.py), with solo-learn's padding 2 where given."""
  config.model.encoder_kwargs.stem_conv_init = 'torch_default'
  config.model.encoder_kwargs.stem_padding = padding
  return config


def torch_conv_init(config):
  """Every conv with torch.nn.Conv2d's default init (kaiming_uniform_(
  a=sqrt(5)) = U(+-1 / sqrt(fan_in))): the CIFAR ResNets without an init
  loop, lightly's (lightly/models/resnet.py ResNetGenerator) and
  lemniscate's (models/resnet_cifar.py)."""
  config.model.encoder_kwargs.conv_init = 'torch_default'
  return config


def sgd_cifar(config, *, batch_size: int = 512, epochs: float = 200.):
  """lightly's CIFAR-10 benchmark recipe (the issue's yardstick; lightly
  docs, "Benchmarks"): batch 512, 200 epochs, SGD lr 0.06 x B / 128 (=
  0.12 x B / 256 here), momentum 0.9, weight decay 5e-4, cosine, no warmup;
  a 512-512-128 head; kNN with k = 200, T = 0.1. Weight decay on every
  parameter (SGD(self.parameters(), weight_decay=5e-4)), biases and
  BatchNorm included."""
  config.batch_size = batch_size
  config.num_epochs = epochs
  config.optimizer.name = 'sgd'
  config.optimizer.base_learning_rate = 0.12
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 5e-4
  config.optimizer.decay_biases_and_bn = True
  config.optimizer.warmup_fraction = 0.
  config.model.head_hidden_dim = 512
  config.model.head_out_dim = 128
  config.evals.knn.ks = (200,)
  config.evals.knn.temperature = 0.1
  config.evals.linear_eval = linear_eval('cifar')
  return config


def sgd_moco_v2(config, *, epochs: float = 200.):
  """MoCo v2's ImageNet optimizer (Chen et al. 2020, "Improved baselines"):
  SGD lr 0.03 x B / 256 at batch 256, momentum 0.9, weight decay 1e-4,
  cosine, no warmup, decay on every parameter (main_moco.py
  SGD(model.parameters(), weight_decay=1e-4)); its 2048-2048-128 head
  without BatchNorm; its linear classification protocol (SGD lr 30, 100
  epochs)."""
  config.batch_size = 256
  config.num_epochs = epochs
  config.optimizer.name = 'sgd'
  config.optimizer.base_learning_rate = 0.03
  config.optimizer.momentum = 0.9
  config.optimizer.weight_decay = 1e-4
  config.optimizer.decay_biases_and_bn = True
  config.optimizer.warmup_fraction = 0.
  config.model.head_hidden_dim = 2048
  config.model.head_out_dim = 128
  config.model.head_batch_norm = False
  config.augment.preset = 'moco_v2'
  config.evals.linear_eval = linear_eval('moco')
  return config


def lars_simclr(config, *, batch_size: int = 4096, epochs: float = 100.,
                base_learning_rate: float = 0.3, weight_decay: float = 1e-6,
                warmup_epochs: float = 10.):
  """SimCLR's ImageNet optimizer (Chen et al. 2020, Sec. B.6): LARS, lr
  0.3 x B / 256, weight decay 1e-6, BN and biases excluded from adaptation
  and decay, 10 warmup epochs then cosine; its 2048-2048-128 head; its
  linear evaluation (Nesterov SGD, lr 0.1 x B / 256, 90 epochs)."""
  config.batch_size = batch_size
  config.num_epochs = epochs
  config.optimizer.name = 'lars'
  config.optimizer.base_learning_rate = base_learning_rate
  config.optimizer.weight_decay = weight_decay
  # lars_optimizer.py exclude_from_weight_decay=['batch_normalization',
  # 'bias'], which is also its exclude_from_layer_adaptation.
  config.optimizer.decay_biases_and_bn = False
  config.optimizer.momentum = 0.9
  config.optimizer.warmup_fraction = warmup_epochs / epochs
  config.model.head_hidden_dim = 2048
  config.model.head_out_dim = 128
  config.augment.preset = 'simclr'
  config.evals.linear_eval = linear_eval('simclr')
  return config


def adam_small(config, *, epochs: float):
  """The small-scale Adam setting of HCL (Robinson et al. 2021), which CACR's
  and MACL's CIFAR experiments follow: Adam lr 1e-3 (fixed) with torch's
  coupled L2 weight decay 1e-6 (`optimizer.name='adam'`), batch 256, a
  512-128 head."""
  config.batch_size = 256
  config.num_epochs = epochs
  config.optimizer.name = 'adam'
  config.optimizer.base_learning_rate = 1e-3
  config.optimizer.weight_decay = 1e-6
  config.optimizer.warmup_fraction = 0.
  config.optimizer.schedule = 'step'    # No decay_epochs: a constant lr.
  config.model.head_hidden_dim, config.model.head_out_dim = 512, 128
  return config
