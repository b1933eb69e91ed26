"""A tiny config for tests: a few steps of a narrow CNN on small batches.

configs/base.py shrunk for speed (64 steps of batch 32 on 2,048 Fashion-MNIST
images, evaluation on 1,024 test images with both baselines); its accuracies
mean nothing.

  python main.py --config=configs/test.py --workdir=/tmp/cjax_test

Expected: results.json and summary.png in the workdir, in about 35 s on 2 CPU
cores with 8 virtual devices.
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.encoder_kwargs.widths = (8, 16)
  config.model.head_hidden_dim = 32
  config.model.head_out_dim = 16
  # A slice of Fashion-MNIST (TFDS split syntax): 64 steps of batch 32.
  # Image-folder runs name whole splits (--config.dataset.train_split=train).
  config.dataset.train_split = 'train[:2048]'
  config.dataset.eval_split = 'test[:1024]'
  config.batch_size = 32
  config.num_epochs = 1.0
  config.log_every_steps = 2
  config.checkpoint_every_steps = 2
  config.eval.batch_size = 64
  config.evals.knn.ks = (5,)
  config.eval.embedding_points = 256     # t-SNE of 1,024 points: ~3 s/map.
  return config
