"""BYOL (Grill et al. 2020): `moco.Method` with a predictor, no queue, and
the regression of Eq. 2 (`losses.byol`) symmetrised as Eq. 3
(`key_views = (1, 0)`). The README's worked example of adding a method.
"""

from __future__ import annotations

import dataclasses

from contrastive_jax.methods import moco


@dataclasses.dataclass(frozen=True)
class Method(moco.Method):
  losses = ('byol',)
  pairing = {'byol': 'same_slot'}   # Query view v with target slot v.

  @classmethod
  def validate(cls, config, num_devices: int) -> None:
    super().validate(config, num_devices)
    if config.moco.queue_size:
      raise ValueError('BYOL uses no negatives; set config.moco.queue_size=0 '
                       f'(got {config.moco.queue_size}).')
    if config.moco.predictor_hidden_dim <= 0:
      raise ValueError('BYOL regresses a predictor\'s output on the target; '
                       'set config.moco.predictor_hidden_dim > 0 (the paper: '
                       '4096).')
    if len(config.moco.query_views) != len(config.moco.key_views):
      raise ValueError('BYOL pairs query view v with key view v: '
                       'config.moco.query_views and .key_views need the same '
                       'length.')
