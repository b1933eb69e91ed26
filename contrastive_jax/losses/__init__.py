"""Contrastive objectives as pure, jit-compatible functions.

Every loss has the signature ``loss_fn(inputs..., *, hyperparameters) ->
(loss, metrics)``; see `common.py` for the input convention. A config selects a
loss by name through `LOSSES` (or `get_loss`, which raises a clear error for an
unknown name).

    >>> from contrastive_jax import losses
    >>> loss, metrics = losses.ntxent(z, temperature=0.1)   # z: [N, V, D]
"""

from collections.abc import Callable

from contrastive_jax.losses import baselines
from contrastive_jax.losses import cacr
from contrastive_jax.losses import instance
from contrastive_jax.losses import jcl
from contrastive_jax.losses import macl
from contrastive_jax.losses import supervised
from contrastive_jax.losses.common import l2_normalize

# Each module lists its own losses in a module-level `LOSSES` dict; the union is
# the public registry.
LOSSES: dict[str, Callable] = {
    **instance.LOSSES,
    **supervised.LOSSES,
    **baselines.LOSSES,
    **cacr.LOSSES,
    **macl.LOSSES,
    **jcl.LOSSES,
}
globals().update(LOSSES)


def get_loss(name: str) -> Callable:
  """Returns the loss registered as `name`; ValueError listing the known ones."""
  try:
    return LOSSES[name]
  except KeyError:
    raise ValueError(f'unknown loss {name!r}; known losses: '
                     f'{", ".join(sorted(LOSSES))}.') from None
