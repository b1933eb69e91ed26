"""CACR on MoCo v2 (Zheng et al. 2021, Algorithm 3 / App. C.2): EMA keys and a queue.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/cacr_moco.py --workdir=workdir/cacr_moco

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper (ImageNet): t+ = 1.0, t- = 2.0, Q = 65536, m = 0.999, pi+ under
stop-gradient (the loss's default when keys are given), intra-batch negatives.
Here Q = 4096 and m = 0.99 (see configs/moco_v2.py). Both views are queries
and both are keys (every view takes a turn as the query, as in the code);
the queue receives the keys of view 0.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
  config.method = 'moco'
  config.loss = 'cacr'
  config.loss_kwargs = ml_collections.ConfigDict(
      {'t_pos': 1.0, 't_neg': 2.0, 'intra_batch': True})
  config.augment.num_views = 2
  config.moco.momentum = 0.99
  config.moco.query_views = (0, 1)
  config.moco.key_views = (0, 1)
  config.moco.queue_size = 4096
  return config
