"""Contrastive objectives as pure, jit-compatible functions.

Every loss has the signature ``loss_fn(inputs..., *, hyperparameters) ->
(loss, metrics)``; see `common.py` for the input convention. A config selects a
loss by name through `LOSSES` (or `get_loss`, which raises a clear error for an
unknown name).

    >>> from contrastive_jax import losses
    >>> loss, metrics = losses.ntxent(z, temperature=0.1)   # z: [N, V, D]
"""

import inspect
from collections.abc import Callable

# Modules are named by idea, not by method, so that the method names below
# (`losses.cacr`, ...) are the functions and never shadow a module.
from contrastive_jax.losses import attraction_repulsion  # CACR
from contrastive_jax.losses import baselines             # AU-CL, HN-CL, DCL
from contrastive_jax.losses import instance              # NT-Xent, MoCo, ...
from contrastive_jax.losses import joint                 # JCL
from contrastive_jax.losses import model_aware           # MACL
from contrastive_jax.losses import supervised            # SupCon, TCL
from contrastive_jax.losses.common import l2_normalize

# Each module lists its own losses in a module-level `LOSSES` dict; the union is
# the public registry.
LOSSES: dict[str, Callable] = {
    **instance.LOSSES,
    **supervised.LOSSES,
    **baselines.LOSSES,
    **attraction_repulsion.LOSSES,
    **model_aware.LOSSES,
    **joint.LOSSES,
}
globals().update(LOSSES)


def get_loss(name: str) -> Callable:
  """Returns the loss registered as `name`; ValueError listing the known ones."""
  try:
    return LOSSES[name]
  except KeyError:
    raise ValueError(f'unknown loss {name!r}; known losses: '
                     f'{", ".join(sorted(LOSSES))}.') from None


def default_kwarg(name: str, kwarg: str):
  """The default of keyword argument `kwarg` in loss `name`'s signature.

  The loss's signature is the one place a default lives; callers that need it
  outside a call (e.g. `train.Method` for JCL's lambda) read it from here.
  """
  param = inspect.signature(get_loss(name)).parameters.get(kwarg)
  if param is None or param.default is inspect.Parameter.empty:
    raise ValueError(f'loss {name!r} has no keyword argument {kwarg!r} with a '
                     'default.')
  return param.default
