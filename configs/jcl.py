"""JCL (Cai et al. 2020): MoCo v2 with M' = 4 positive keys and the lambda ramp.

Command (from the repository root, 8 virtual CPU devices):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/jcl.py --workdir=workdir/jcl

Expected: UNMEASURED (no full run of this config has been made yet); a 4-epoch Fashion-MNIST run with the small CNN should land near the default SimCLR run's kNN accuracy (README "Results").

Paper/code (notes/jcl.md Sec. 0): tau = 0.2, 1 query crop + M' = 4 key crops
(the released script), lambda ramped per epoch to lambda_max, queue of key
means. lambda_max = 4.0 (the paper's ablation value; the released ImageNet
script uses 2.0). Q = 4096 and m = 0.99 as in configs/moco_v2.py; shuffle-BN
over the concatenated key crops, as in the code.
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config()
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
  config.moco.lambda_ramp = True
  return config
