"""A tiny config for tests: a few steps of a narrow CNN on small batches.

  python main.py --config=configs/test.py --workdir=/tmp/cjax_test

End to end (64 steps on 2,048 Fashion-MNIST images, evaluation on 1,024 test
images with both baselines, results.json) in 35 s here, 8 virtual devices.

Not any paper's recipe: configs/base.py (its docstring lists how that
differs from SimCLR) shrunk for speed; its numbers mean nothing.
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
