"""BYOL (Grill et al. 2020): a predictor on the online side, an EMA target,
no negatives.

The README's worked example of adding a method: its loss in losses/, this
module, configs/byol.py and tests/test_byol.py. It reuses the key-encoder method
(`moco.Method`: EMA target updated before the keys, stop_gradient on them,
the momentum schedule of `config.moco`) and adds what BYOL changes:

  * the online network has a predictor q_theta, an MLP on the projection
    (`config.moco.predictor_hidden_dim`, shared with MoCo v3); the loss takes
    its output, the target its projection;
  * the loss is the normalised regression of Eq. 2 (`losses.byol`, in
    losses/regression.py), symmetrised over the two views (Eq. 3: query view
    v is regressed on the target's other view, `config.moco.key_views =
    (1, 0)`);
  * no queue (Sec. 3.1: no negatives).

The target's parameters are an EMA of the whole online tree, predictor
included (the predictor's copy is never used; its EMA is a few [512, 128]
multiply-adds, which keeps the key encoder the moco method's own).
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
