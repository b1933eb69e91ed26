"""A trained encoder as a function of images: `load_encoder(workdir)`.

    >>> import contrastive_jax
    >>> encoder = contrastive_jax.load_encoder('workdir/default')
    >>> features = encoder(images)             # uint8 [B, H, W, C] -> [B, F]
    >>> z = encoder.project(images)            # the projection head's [B, D]

The images are those of the run's dataset (its size and channels), uint8 in
[0, 255] or float in [0, 1]. The encoder runs in eval mode (BatchNorm's
running statistics), as every evaluation of the run does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from contrastive_jax import checkpointing
from contrastive_jax import config_lib
from contrastive_jax import data as data_lib
from contrastive_jax import runtime
from contrastive_jax import step as step_lib
from contrastive_jax import storage
from contrastive_jax import workdir as workdir_lib


@dataclasses.dataclass(frozen=True)
class Encoder:
  """A run's frozen encoder: `encoder(images)` -> backbone features.

  Attributes:
    config: the run's config (with the defaults).
    step: the checkpoint's step.
    classes: the run's class names for an image folder (classes.json), else
      None.
  """
  config: ml_collections.ConfigDict
  step: int
  classes: tuple[str, ...] | None
  _model: Any = dataclasses.field(repr=False)
  _variables: Any = dataclasses.field(repr=False)

  @functools.cached_property
  def _apply(self):
    return jax.jit(lambda v, x: self._model.apply(v, x, train=False))

  def _outputs(self, images) -> dict[str, jax.Array]:
    x = jnp.asarray(images)
    if x.dtype == jnp.uint8:
      x = x.astype(jnp.float32) / 255.
    if x.ndim != 4:
      raise ValueError(f'images must be [B, H, W, C]; got shape {x.shape}.')
    return self._apply(self._variables, x.astype(jnp.float32))

  def __call__(self, images) -> np.ndarray:
    """Backbone features [B, F] (the representation the run evaluates)."""
    return np.asarray(self._outputs(images)['features'])

  def project(self, images) -> np.ndarray:
    """Projection-head outputs [B, D] (the space the loss saw)."""
    return np.asarray(self._outputs(images)['projection'])


def load_encoder(workdir: str, *, step: int | None = None,
                 image_shape: tuple[int, int, int] | None = None) -> Encoder:
  """The encoder of the run in `workdir` at its newest readable checkpoint.

  Args:
    workdir: a training run's --workdir (config.json, checkpoints/): a
      local path or an object store URL (`gs://bucket/run`).
    step: a checkpoint step instead of the newest.
    image_shape: (H, W, C) of the run's images; by default the run's
      `data.json`, else (a run that did not write one) its dataset's, which
      is opened for it.
  """
  storage.check(workdir, what='workdir', write=False)
  config = config_lib.load(workdir)
  classes = workdir_lib.load_classes(workdir)
  image_shape = image_shape or workdir_lib.load_image_shape(workdir)
  if image_shape is None:
    train, _ = data_lib.load(config, classes)
    image_shape = train.image_shape
  model = step_lib.create_model(config)
  variables, restored = checkpointing.restore_variables(
      workdir, model, image_shape, runtime.create_mesh(), step)
  return Encoder(config=config, step=restored, classes=classes,
                 _model=model, _variables=variables)
