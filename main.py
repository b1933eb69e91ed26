"""Pretrains and evaluates a contrastive model: the job's only entry point.

  python main.py --config=configs/default.py --workdir=workdir/default \
      [--config.loss_kwargs.temperature=0.1 ...]

This file is intentionally short: everything happens in
`contrastive_jax.train.train_and_evaluate`.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, TensorBoard '
                    'events, plots and results.json.')
config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file (configs/*.py).', lock_config=True)
flags.DEFINE_enum('progress', 'auto', ['auto', 'on', 'off'],
                  'Progress bars: auto shows them when stderr is a terminal.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.verbosity < 1:
    # TensorFlow's C++ start-up lines ("oneDNN custom operations are on"):
    # TF only reads data here, so its oneDNN kernels do not matter.
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  # Imported here so that --help and flag errors return before jax loads.
  # TensorFlow is imported only to build a TFDS dataset
  # (input_pipeline/datasets.py, which keeps it off the accelerators).
  import jax  # pylint: disable=g-import-not-at-top
  from contrastive_jax import progress  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  from contrastive_jax import train  # pylint: disable=g-import-not-at-top

  # Several hosts: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID
  # (see contrastive_jax/runtime.py); a no-op for a single process.
  runtime.initialize_distributed()
  if FLAGS.verbosity < 1:
    runtime.quiet_library_logs()
  progress.configure(FLAGS.progress)
  logging.info('JAX process %d/%d, %d local / %d global devices (%s).',
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(),
               jax.devices()[0].platform)
  try:
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except train.Preempted as e:
    logging.warning('%s', e)
    sys.exit(143)   # 128 + SIGTERM, as if the signal had ended the process.


if __name__ == '__main__':
  app.run(main)
