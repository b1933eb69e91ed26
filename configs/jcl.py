"""JCL (Cai et al. 2020): MoCo v2 with M' = 4 positive keys and the lambda ramp.

configs/base.py with MoCo v2's method (as configs/moco_v2.py), five views
(1 query, 4 keys), tau 0.2, lambda ramped per epoch to 4.
Paper values and what differs: docs/configs.md, "jcl.py".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/jcl.py --workdir=workdir/jcl

Not measured by the current study (studies/v2 does not run it); the
superseded first study's figures, at an older recipe, are in
studies/v1/REPORT.md.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'moco'
  config.loss = 'jcl'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.2, 'lam': 4.0})
  config.augment.num_views = 5
  config.moco.momentum = 0.99
  config.moco.query_views = (0,)
  config.moco.key_views = (1, 2, 3, 4)
  config.moco.queue_size = 4096
  config.moco.shuffle_bn = True
  config.moco.enqueue_keys = 'mean'
  config.loss_schedules.lam = 'epoch_ramp'
  return config
