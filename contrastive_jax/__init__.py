"""contrastive_jax: contrastive representation learning in JAX/Flax.

The public API for notebooks and one's own code:

  contrastive_jax.losses.<name>(z, ...)   every loss, pure and jittable
                                          (`losses.LOSSES` lists them)
  contrastive_jax.load_encoder(workdir)   a trained run's encoder as a
                                          function of images

Importing the package has no side effects.
"""

__version__ = '0.2.0'


def load_encoder(workdir: str, *, step: int | None = None,
                 image_shape: tuple[int, int, int] | None = None):
  """A trained run's encoder, as a function of images.

  Rebuilds the model the run's config describes and restores the params and
  BatchNorm statistics of its newest readable checkpoint (nothing else: not
  the optimizer state, queue or memory bank). The encoder runs in eval mode
  (BatchNorm's running statistics), as every evaluation of the run does.

      >>> import contrastive_jax
      >>> encoder = contrastive_jax.load_encoder('workdir/default')
      >>> encoder.image_shape                    # the run's (H, W, C)
      (28, 28, 1)
      >>> features = encoder(images)             # [B, 28, 28, 1] -> [B, F]
      >>> z = encoder.project(images)            # the projection head's [B, D]

  Args:
    workdir: a training run's --workdir (config.json, checkpoints/): a
      local path or an object store URL (`gs://bucket/run`).
    step: a checkpoint step instead of the newest.
    image_shape: (H, W, C) of the run's images; by default the run's
      `data.json`, else (a run that did not write one) its dataset's, which
      is opened for it.

  Returns:
    An `Encoder`: `encoder(images)` gives the backbone features [B, F] (the
    representation the run evaluates), `encoder.project(images)` the
    projection head's outputs [B, D] (the space the loss saw), both numpy
    float32. Its attributes: `config` (the run's, with the defaults),
    `step` (the checkpoint's), `classes` (an image folder's class names,
    else None) and `image_shape`.

  The images, a numpy or jax array, are checked against the run's before
  the encoder reads them:
    - shape: [B, H, W, C] with the run's `image_shape`; one image [H, W, C]
      gets a batch axis and gives [F] (or [D]). Another size, another
      channel count, channels first ([B, C, H, W]) or no channel axis is
      refused.
    - values: uint8 pixels in [0, 255] are divided by 255, as the run's
      evaluation does; other integer dtypes (int64, ...) holding values in
      [0, 255] are the same pixels and read as uint8, outside it they are
      refused. Floats must lie in [0, 1] (no NaN or inf) and are read as
      float32; others (floats in 0-255, standardized ones) are refused.
      Other dtypes (bool, ...) are refused.
  A refusal is a ValueError naming the problem, what the encoder takes and
  the fix, e.g. "images are [B, C, H, W] = [8, 3, 32, 32] (channels first);
  this encoder takes [B, 32, 32, 3]: images.transpose(0, 2, 3, 1)." or
  "float images must be in [0, 1]; these reach 255: divide them by 255
  (images / 255).". The checks read the shape and dtype and, except for
  uint8, one min and max of the values.
  """
  from contrastive_jax import encoder  # pylint: disable=g-import-not-at-top
  return encoder.load_encoder(workdir, step=step, image_shape=image_shape)


def __getattr__(name):
  # `contrastive_jax.losses` without an explicit submodule import.
  if name == 'losses':
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module('contrastive_jax.losses')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
