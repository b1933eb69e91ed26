"""HN-CL (Robinson et al. 2021): hard-negative, debiased contrastive loss.

configs/base.py with HN-CL's loss, tau 0.5, beta 1, tau+ 0.1.
Paper values and what differs: docs/configs.md, "the baselines".

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python main.py \
    --config=configs/hn_cl.py --workdir=workdir/hn_cl

Not measured by the current study (studies/v2 does not run it); the
superseded first study's figures, at an older recipe, are in
studies/v1/REPORT.md.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.method = 'in_batch'
  config.loss = 'hard_negative'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'temperature': 0.5, 'beta': 1.0, 'tau_plus': 0.1})
  return config
