"""SimCLR, ResNet-50 on ImageNet: the multi-host launch of README "Multi-host pods".

Command, on each host of a pod (here 4 hosts; TPU pods and SLURM need only
JAX_DISTRIBUTED=1 instead of the three variables):

  JAX_COORDINATOR_ADDRESS=host0:1234 JAX_NUM_PROCESSES=4 JAX_PROCESS_ID=$RANK \
    python main.py --config=configs/imagenet_simclr.py \
      --workdir=gs://bucket/simclr_in1k --config.dataset.data_dir=$DATA

ImageNet must be prepared first, once, in the ArrayRecord format the input
pipeline reads at random (TFDS never downloads it: put ILSVRC2012_img_train.tar
and ILSVRC2012_img_val.tar into $DATA/downloads/manual/):

  tfds build imagenet2012 --data_dir=$DATA --file_format=array_record

Expected: not measured (no ImageNet or accelerator where this project is
developed). Tested here only in shape: tests/test_sources.py and
scripts/multiprocess_check.py run the same streamed, multi-process path on a
generated JPEG folder.

Follows SimCLR (Chen et al. 2020) in: ResNet-50, batch 4096, tau 0.1, LARS
(lr 0.3 * B / 256, weight decay 1e-6, BN/bias excluded), 10 warmup epochs
of 100, a 2048-2048-128 projection head, and its augmentation preset (random
resized crop 0.08-1, flip, colour distortion 1.0, grayscale, blur). Differs:
the host resizes every image's shorter side to 224 and centre-crops it before
the on-device random resized crop (the paper crops the full image), and the
end-of-run probe is the full-batch L-BFGS one on frozen features, not the
paper's 90-epoch SGD linear evaluation on augmented images (issue 14).
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.dataset.name = 'imagenet2012'
  config.dataset.eval_split = 'validation'
  config.dataset.image_size = 224
  config.dataset.in_memory = False

  config.augment.preset = 'simclr'
  config.model.encoder = 'resnet50'
  config.model.encoder_kwargs = ml_collections.ConfigDict(
      {'stem': 'imagenet'})
  config.model.head_hidden_dim = 2048
  config.model.head_out_dim = 128

  config.loss = 'ntxent'
  config.loss_kwargs = ml_collections.ConfigDict({'temperature': 0.1})

  config.optimizer.name = 'lars'
  config.optimizer.base_learning_rate = 0.3
  config.optimizer.weight_decay = 1e-6
  config.optimizer.warmup_fraction = 0.1
  config.batch_size = 4096
  config.num_epochs = 100.

  config.log_every_steps = 100
  config.checkpoint_every_steps = 1000
  config.online.knn_every_steps = 5000
  config.eval.batch_size = 1024
  return config
