"""Contrastive objectives as pure, jit-compatible functions.

Every loss has the signature ``loss_fn(inputs..., *, hyperparameters) ->
(loss, metrics)``; see `common.py` for the input convention. A config selects a
loss by name through `LOSSES` (or `get_loss`, which raises a clear error for an
unknown name).

One way to call any loss by name: put what you have in a `LossInputs` and
`apply` passes each loss the inputs its signature names (the train step, the
examples, the benchmarks and the tests all call losses this way):

    >>> from contrastive_jax import losses
    >>> loss, metrics = losses.ntxent(z, temperature=0.1)   # z: [N, V, D]
    >>> loss, metrics = losses.apply(
    ...     'infonce', losses.LossInputs(z=q, key=k, queue=queue),
    ...     temperature=0.2)
"""

import inspect
from collections.abc import Callable

import flax
import jax

# Modules are named by idea, not by method, so that the method names below
# (`losses.cacr`, ...) are the functions and never shadow a module.
from contrastive_jax.losses import attraction_repulsion  # CACR
from contrastive_jax.losses import baselines             # AU-CL, HN-CL, DCL
from contrastive_jax.losses import instance              # NT-Xent, MoCo, ...
from contrastive_jax.losses import joint                 # JCL
from contrastive_jax.losses import model_aware           # MACL
from contrastive_jax.losses import regression            # BYOL
from contrastive_jax.losses import supervised            # SupCon, TCL
from contrastive_jax.losses.attraction_repulsion import cacr
from contrastive_jax.losses.baselines import align_uniform, dcl, hard_negative
from contrastive_jax.losses.common import l2_normalize
from contrastive_jax.losses.instance import cmc, infonce, insdis, ntxent
from contrastive_jax.losses.joint import jcl
from contrastive_jax.losses.model_aware import macl
from contrastive_jax.losses.regression import byol
from contrastive_jax.losses.supervised import supcon, tcl

# Each module lists its own losses in a module-level `LOSSES` dict; the union is
# the public registry.
LOSSES: dict[str, Callable] = {
    **instance.LOSSES,
    **supervised.LOSSES,
    **baselines.LOSSES,
    **attraction_repulsion.LOSSES,
    **model_aware.LOSSES,
    **joint.LOSSES,
    **regression.LOSSES,
}


@flax.struct.dataclass
class LossInputs:
  """Everything a loss can take besides its hyperparameters.

  Attributes:
    z: [N, V, D] online embeddings (the queries); gradients flow here. Every
      loss's first argument.
    key: [N, Vk, D] targets of the same instances: key-encoder embeddings
      (MoCo, JCL, CACR-MoCo) or their memory-bank rows (InsDis).
    queue: negatives, [Q, D] (a MoCo queue, CMC's bank sample) or [N, K, D]
      (InsDis's per-instance noise rows).
    labels: [N] int class ids (supervised losses).
  """
  z: jax.Array
  key: jax.Array | None = None
  queue: jax.Array | None = None
  labels: jax.Array | None = None


_OPTIONAL_INPUTS = ('key', 'queue', 'labels')


def inputs_of(name: str) -> tuple[frozenset[str], frozenset[str]]:
  """(accepted, required) `LossInputs` fields of loss `name`, from its signature.

  The first parameter always takes `z`; `key`, `queue` and `labels` are
  inputs when the signature names them, required when it gives no default.
  """
  params = inspect.signature(get_loss(name)).parameters
  accepted, required = {'z'}, {'z'}
  for field in _OPTIONAL_INPUTS:
    if field in params:
      accepted.add(field)
      if params[field].default is inspect.Parameter.empty:
        required.add(field)
  return frozenset(accepted), frozenset(required)


def apply(name: str, inputs: LossInputs, **hyperparameters):
  """Calls loss `name` with the inputs it takes: (loss, metrics).

  An input the signature requires (no default) is passed even when None,
  so the loss's own check explains what is missing.

  Raises:
    ValueError: `inputs` holds an input the loss does not take (e.g. labels
      for an unsupervised loss), which would otherwise be silently dropped.
  """
  fn = get_loss(name)
  accepted, required = inputs_of(name)
  first = next(iter(inspect.signature(fn).parameters))
  kwargs = {first: inputs.z}
  for field in _OPTIONAL_INPUTS:
    value = getattr(inputs, field)
    if value is not None and field not in accepted:
      raise ValueError(f'loss {name!r} takes no {field}; leave '
                       f'LossInputs.{field} as None.')
    if value is not None or field in required:
      kwargs[field] = value
  return fn(**kwargs, **hyperparameters)


def names() -> tuple[str, ...]:
  """Every loss's name."""
  return tuple(sorted(LOSSES))


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
  outside a call (`step.Loss.from_config`: the base value of a scheduled
  one, such as JCL's lambda) read it from here.
  """
  param = inspect.signature(get_loss(name)).parameters.get(kwarg)
  if param is None or param.default is inspect.Parameter.empty:
    raise ValueError(f'loss {name!r} has no keyword argument {kwarg!r} with a '
                     'default.')
  return param.default
