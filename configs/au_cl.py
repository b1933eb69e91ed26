"""AU-CL (Wang & Isola 2020): alignment + uniformity.

configs/base.py with the loss alignment (alpha 2) + uniformity (t 2).
Paper values and what differs: docs/configs.md, "the baselines".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/au_cl.py --workdir=workdir/au_cl

Not measured by the current study (studies/v2 does not run it); the
superseded first study's figures, at an older recipe, are in
studies/v1/REPORT.md.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'align_uniform'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'alpha': 2.0, 't': 2.0, 'uniform_weight': 1.0})
  return config
