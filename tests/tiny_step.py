"""The tiny train-step set-up shared by the step-level tests.

A narrow 2-stage CNN with a small head trained by SGD, and the jitted
(init_fn, step_fn) that `train.train_and_evaluate` would build for it, so
every step-level test exercises the real `create_step_fns`.
"""

from configs import test as test_config
from contrastive_jax import step as step_lib
from contrastive_jax import train


def tiny_config(*, batch: int, out_dim: int):
  """configs/test.py narrowed further: widths (4, 8), head 16 -> out_dim."""
  c = test_config.get_config()
  c.model.encoder_kwargs.widths = (4, 8)
  c.model.head_hidden_dim = 16
  c.model.head_out_dim = out_dim
  c.batch_size = batch
  c.optimizer.name = 'sgd'
  return c


def build_step(config, mesh, *, total_steps: int, num_examples: int,
               image_shape, steps_per_epoch: int = 2, num_classes: int = 0):
  """(model, init_fn, step_fn) exactly as the training job builds them."""
  setup = step_lib.build(config, mesh, total_steps=total_steps,
                      steps_per_epoch=steps_per_epoch,
                      num_examples=num_examples, image_shape=image_shape,
                      num_classes=num_classes)
  return setup.model, setup.init_fn, setup.step_fn
