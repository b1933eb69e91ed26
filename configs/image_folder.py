"""A folder of one's own images: SimCLR on a few hundred of them, on a CPU.

The folder is laid out DIR/train/<class>/*.jpg|png and DIR/test/<class>/...
(the class folders name the labels the evaluators score; one class works
too, scoring nothing useful). The images are decoded once to 32 x 32 and held
in memory; the small CNN trains for 100 epochs in batches of 64 with
SimCLR's small-image views, then kNN (k = 10) and the logistic-regression
probe score the test split against raw pixels and the untrained encoder.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/image_folder.py --workdir=workdir/mine \
    --config.dataset.data_dir=/path/to/DIR

Fits: at least 64 training images (the batch) and 10 (k); a smaller folder
is refused before anything runs, naming the values that fit, e.g.
`--config.batch_size=32 --config.evals.knn.ks=5,`. More images: the same
command, longer (about 400 steps here per 256 training images); larger
images: `--config.dataset.image_size=64`; a GPU and thousands of images: a
paper's recipe (configs/papers/simclr.py:cifar10) with this dataset.

Expected: on a generated folder of 320 training and 80 test images (four
classes told apart by stripes and tint under noise; tests/test_first_hour.py),
about 2.5 minutes on 2 CPU cores, kNN 96.25% (untrained encoder 58.75%, raw
pixels 65.00%; toy data); docs/configs.md, "Your own images".
"""

from configs import base


def get_config():
  config = base.get_config()
  config.dataset.name = 'image_folder'
  config.dataset.train_split = 'train'
  config.dataset.eval_split = 'test'
  config.dataset.image_size = 32
  config.augment.preset = 'simclr_small'
  config.loss_kwargs.temperature = 0.2
  config.batch_size = 64
  config.num_epochs = 100.
  config.optimizer.base_learning_rate = 4e-3  # Peak lr 1e-3 at batch 64.
  config.log_every_steps = 10
  config.checkpoint_every_steps = 100
  config.eval.batch_size = 256
  config.eval.embedding_points = 500
  config.evals.knn.ks = (10,)
  config.evals.online_knn.every_steps = -1
  return config
