"""contrastive_jax: contrastive representation learning in JAX/Flax.

The public API for notebooks and one's own code:

  contrastive_jax.losses.<name>(z, ...)   every loss, pure and jittable
                                          (`losses.LOSSES` lists them)
  contrastive_jax.load_encoder(workdir)   a trained run's encoder as a
                                          function of images

Importing the package has no side effects.
"""

__version__ = '0.2.0'


def load_encoder(workdir: str, **kwargs):
  """See `contrastive_jax.encoder.load_encoder`."""
  from contrastive_jax import encoder  # pylint: disable=g-import-not-at-top
  return encoder.load_encoder(workdir, **kwargs)


def __getattr__(name):
  # `contrastive_jax.losses` without an explicit submodule import.
  if name == 'losses':
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module('contrastive_jax.losses')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
