"""contrastive_jax: contrastive representation learning in JAX/Flax.

  contrastive_jax.losses.<name>(z, ...)   every loss, pure and jittable
  contrastive_jax.load_encoder(workdir)   a trained run's encoder

Importing the package has no side effects.
"""

__version__ = '0.2.0'


def load_encoder(workdir: str, *, step: int | None = None,
                 image_shape: tuple[int, int, int] | None = None):
  """A trained run's encoder, as a function of images, in eval mode.

      >>> encoder = contrastive_jax.load_encoder('workdir/default')
      >>> encoder.image_shape                    # the run's (H, W, C)
      (28, 28, 1)
      >>> features = encoder(images)             # [B, 28, 28, 1] -> [B, F]
      >>> z = encoder.project(images)            # the projection head's [B, D]

  `workdir`: a run's --workdir (local, or `gs://bucket/run`); `step`: a
  checkpoint step (default the newest readable one); `image_shape`: (H, W, C)
  (default the run's `data.json`, else its dataset's). The `Encoder` holds
  params and BatchNorm statistics, with `config`, `step`, `classes` and
  `image_shape`; its outputs are numpy float32 ([F] or [D] for one image).

  Images (numpy or jax) are [B, H, W, C] of the run's `image_shape`; integers
  are pixels in [0, 255] (read as uint8, divided by 255), floats lie in
  [0, 1]. Anything else is a ValueError naming the fix, e.g. "images are
  [B, C, H, W] = [8, 3, 32, 32] (channels first); this encoder takes
  [B, 32, 32, 3]: images.transpose(0, 2, 3, 1).".
  """
  from contrastive_jax import encoder  # pylint: disable=g-import-not-at-top
  return encoder.load_encoder(workdir, step=step, image_shape=image_shape)


def __getattr__(name):
  # `contrastive_jax.losses` without an explicit submodule import.
  if name == 'losses':
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module('contrastive_jax.losses')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
