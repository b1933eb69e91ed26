"""A trained encoder as a function of images: `load_encoder(workdir)`.

    >>> encoder = contrastive_jax.load_encoder('workdir/default')
    >>> features = encoder(images)             # uint8 [B, H, W, C] -> [B, F]
    >>> z = encoder.project(images)            # the projection head's [B, D]

The images it takes: `help(contrastive_jax.load_encoder)`.
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


def _shape(dims) -> str:
  return '[' + ', '.join(str(d) for d in dims) + ']'


def _channel_fix(have: int, want: int, name: str, scale: str) -> str:
  """How to give `name` `want` channels; `scale`: ' / 255' for integers."""
  if want == 3 and have == 1:
    return f'grey to RGB: np.repeat({name}, 3, axis=-1)'
  if want == 3 and have == 4:
    return f'drop the alpha channel: {name}[..., :3]'
  if want == 1 and have in (3, 4):
    return f'RGB to grey: {name}[..., :3].mean(axis=-1, keepdims=True){scale}'
  return f'give them the run\'s {want} channels'


def _range_problem(lo: float, hi: float, integer: bool) -> str | None:
  """What is wrong with pixel values spanning [lo, hi] and its fix, or None."""
  if integer:
    if lo >= 0 and hi <= 255:
      return None
    bits = (' (e.g. images / 65535 for 16-bit pixels)'
            if lo >= 0 and hi <= 65535 else '')
    return (f'integer images must be pixels in [0, 255]; these span '
            f'[{lo:.0f}, {hi:.0f}]: pass uint8 pixels, or floats in [0, 1]'
            f'{bits}.')
  if not (np.isfinite(lo) and np.isfinite(hi)):
    return ('images hold NaN or inf; this encoder takes pixels, uint8 in '
            '[0, 255] or floats in [0, 1].')
  clip = "clip them (a resize's overshoot): np.clip(images, 0, 1)"
  if hi > 1:
    fix = (clip if hi <= 2 else
           'divide them by 255 (images / 255)' if hi <= 255 else
           "scale them by their format's maximum (65535 for 16-bit)")
    return f'float images must be in [0, 1]; these reach {hi:g}: {fix}.'
  if lo < 0:
    fix = (clip if lo >= -0.5 else
           "pass the pixels before any mean/std normalization (the run's "
           'own is part of the model), or (images + 1) / 2 for [-1, 1]')
    return f'float images must be in [0, 1]; these reach {lo:g}: {fix}.'
  return None


def check_images(images, image_shape) -> tuple[Any, bool]:
  """(x [B, H, W, C] uint8 or float32, single) from `images`, or ValueError.

  `single`: one image [H, W, C] was given. A jax.Array stays on its device.
  """
  xp = jnp if isinstance(images, jax.Array) else np
  x = images if xp is jnp else np.asarray(images)
  h, w, c = image_shape
  integer = jnp.issubdtype(x.dtype, jnp.integer)
  if not (integer or jnp.issubdtype(x.dtype, jnp.floating)):
    fix = ('(images * 255).astype(np.uint8)' if x.dtype == bool else
           'pass pixel values')
    raise ValueError(
        f'images of dtype {x.dtype} are not pixels; this encoder takes '
        f'uint8 (or integer) pixels in [0, 255] or floats in [0, 1]: {fix}.')
  scale = ' / 255' if integer else ''
  shape = _shape(x.shape)
  if x.ndim == 3 and c == 1 and x.shape[1:] == (h, w) and x.shape != (
      h, w, c):
    raise ValueError(
        f'images {shape} have no channel axis; this encoder takes '
        f'{_shape(("B", h, w, c))}: images[..., None].')
  if x.ndim not in (3, 4):
    raise ValueError(
        f'images must be a batch {_shape(("B", h, w, c))} or one image '
        f'{_shape((h, w, c))}; got shape {shape}.')
  single = x.ndim == 3
  if single:
    x = x[None]
    what, name, has, want = 'the image is', 'image', 'has', _shape((h, w, c))
    layout, transpose = '[C, H, W]', 'image.transpose(1, 2, 0)'
    size = (h, w, c)
  else:
    what, name, has = 'images are', 'images', 'have'
    want = _shape(('B', h, w, c))
    layout, transpose = '[B, C, H, W]', 'images.transpose(0, 2, 3, 1)'
    size = f'(len(images), {h}, {w}, {c})'
  if x.shape[1] == c and x.shape[3] != c:
    raise ValueError(
        f'{what} {layout} = {shape} (channels first); this encoder takes '
        f'{want}: {transpose}.')
  if x.shape[3] != c:
    raise ValueError(
        f'{name} {shape} {has} {x.shape[3]} channels; this encoder takes {c} '
        f'({want}, the run\'s images): '
        f'{_channel_fix(x.shape[3], c, name, scale)}.')
  if x.shape[1:3] != (h, w):
    raise ValueError(
        f'{what} {x.shape[1]}x{x.shape[2]}; this encoder takes {h}x{w} '
        f'({want}, the run\'s image size): resize, e.g. '
        f"jax.image.resize({name}, {size}, 'linear'){scale}.")

  if x.size and x.dtype != np.uint8:
    lo, hi = (float(v) for v in jax.device_get((xp.min(x), xp.max(x))))
    if problem := _range_problem(lo, hi, integer):
      raise ValueError(problem)
  return x.astype(xp.uint8 if integer else xp.float32), single


@dataclasses.dataclass(frozen=True)
class Encoder:
  """A run's frozen encoder: `encoder(images)` -> backbone features; with
  the run's `config`, the checkpoint's `step`, an image folder's `classes`
  (else None) and the (H, W, C) `image_shape` it takes."""
  config: ml_collections.ConfigDict
  step: int
  classes: tuple[str, ...] | None
  image_shape: tuple[int, int, int]
  _model: Any = dataclasses.field(repr=False)
  _variables: Any = dataclasses.field(repr=False)

  @functools.cached_property
  def _apply(self):
    def apply(variables, x):
      if x.dtype == jnp.uint8:
        x = x.astype(jnp.float32) / 255.
      return self._model.apply(variables, x, train=False)
    return jax.jit(apply)

  def _output(self, images, name: str) -> np.ndarray:
    x, single = check_images(images, self.image_shape)
    if not len(x):       # The model cannot run on 0 images; its width can.
      one = jax.ShapeDtypeStruct((1,) + x.shape[1:], x.dtype)
      out = jax.eval_shape(self._apply, self._variables, one)[name]
      return np.zeros((0,) + out.shape[1:], out.dtype)
    out = np.asarray(self._apply(self._variables, x)[name])
    return out[0] if single else out

  def __call__(self, images) -> np.ndarray:
    """Backbone features [B, F]; [F] for one image [H, W, C]."""
    return self._output(images, 'features')

  def project(self, images) -> np.ndarray:
    """Projection-head outputs [B, D]; [D] for one image [H, W, C]."""
    return self._output(images, 'projection')


def load_encoder(workdir: str, *, step: int | None = None,
                 image_shape: tuple[int, int, int] | None = None) -> Encoder:
  """`contrastive_jax.load_encoder`, documented there."""
  storage.check(workdir, what='workdir', write=False)
  config = config_lib.load(workdir)
  classes = workdir_lib.load_classes(workdir)
  image_shape = image_shape or workdir_lib.load_image_shape(workdir)
  if image_shape is None:
    image_shape = data_lib.load(config, classes)[0].image_shape
  image_shape = tuple(int(d) for d in image_shape)
  model = step_lib.create_model(config)
  variables, restored = checkpointing.restore_variables(
      workdir, model, image_shape, runtime.create_mesh(), step)
  return Encoder(config=config, step=restored, classes=classes,
                 image_shape=image_shape, _model=model, _variables=variables)
