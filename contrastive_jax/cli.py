"""The command-line entry points: training, evaluating a checkpoint, the study.

Installed (`pip install -e .`) they are console scripts; from a checkout,
`python main.py` is the training one and `python -m contrastive_jax.cli
<train|eval|study> ...` runs any of them:

  contrastive-jax-train --config=configs/default.py --workdir=workdir/default
  contrastive-jax-eval --workdir=workdir/default [--linear_eval=cifar]
  contrastive-jax-study [--plan | --report | --quick]

Each sets up the process the same way before jax starts (XLA:CPU's thread
pools for virtual devices, `runtime.size_cpu_thread_pools`; several hosts,
`runtime.initialize_distributed`) and keeps library logs to warnings
(`--verbosity=1` shows everything).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def _start(progress_mode: str) -> None:
  """Process set-up shared by the entry points, before any jax computation."""
  if FLAGS.verbosity < 1:
    # TensorFlow's C++ start-up lines: TF only reads data here.
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  # Imported here so that --help and flag errors return before jax loads.
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from contrastive_jax import progress  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.size_cpu_thread_pools()
  runtime.initialize_distributed()
  if FLAGS.verbosity < 1:
    runtime.quiet_library_logs()
  progress.configure(progress_mode)
  logging.info('JAX process %d/%d, %d local / %d global devices (%s).',
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(),
               jax.devices()[0].platform)


def _define_progress() -> None:
  flags.DEFINE_enum('progress', 'auto', ['auto', 'on', 'off'],
                    'Progress bars: auto shows them when stderr is a '
                    'terminal.')


def train(argv=None) -> None:
  """Pretrains and evaluates one config (main.py's flags)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints, '
                      'TensorBoard events, plots and results.json.')
  config_flags.DEFINE_config_file(
      'config', None, 'Experiment config file (configs/*.py).',
      lock_config=True)
  _define_progress()
  flags.mark_flags_as_required(['config', 'workdir'])

  def main(args):
    if len(args) > 1:
      raise app.UsageError(f'unexpected arguments: {args[1:]}')
    _start(FLAGS.progress)
    from absl import logging  # pylint: disable=g-import-not-at-top
    from contrastive_jax import train as train_lib  # pylint: disable=g-import-not-at-top
    from contrastive_jax import storage  # pylint: disable=g-import-not-at-top
    try:
      train_lib.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    except train_lib.Preempted as e:
      logging.warning('%s', e)
      sys.exit(143)   # 128 + SIGTERM, as if the signal had ended the process.
    except storage.StorageError as e:
      sys.exit(f'StorageError: {e}')   # Nothing ran: no traceback.

  app.run(main, argv=argv)


def evaluate(argv=None) -> None:
  """Evaluates a run's checkpoint (`eval_checkpoint.evaluate_checkpoint`)."""
  flags.DEFINE_string('workdir', None, 'Directory of the training run.')
  flags.DEFINE_string('outdir', None, 'Output directory (default '
                      'workdir/eval).')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: newest).')
  flags.DEFINE_list('knn_ks', ['10', '20', '200'], 'Extra kNN neighbour '
                    'counts.')
  flags.DEFINE_string('linear_eval', None, "Also run the papers' linear "
                      'evaluation with this preset (evaluators/linear_eval.py '
                      'PRESETS).')
  flags.DEFINE_integer('linear_eval_epochs', 0, "Override the preset's "
                       'epochs.')
  flags.DEFINE_bool('diagnostics', True, 'Run the diagnostics evaluator.')
  flags.DEFINE_float('cacr_t_neg', 2., "t^- of CACR's conditional entropy.")
  flags.DEFINE_integer('seed', 0, 'Seed of the diagnostic views.')
  _define_progress()
  flags.mark_flags_as_required(['workdir'])

  def main(args):
    if len(args) > 1:
      raise app.UsageError(f'unexpected arguments: {args[1:]}')
    _start(FLAGS.progress)
    from contrastive_jax import eval_checkpoint  # pylint: disable=g-import-not-at-top
    from contrastive_jax import storage  # pylint: disable=g-import-not-at-top
    try:
      results = eval_checkpoint.evaluate_checkpoint(
          FLAGS.workdir, FLAGS.outdir, step=FLAGS.step,
          knn_ks=tuple(int(k) for k in FLAGS.knn_ks),
          linear_eval=FLAGS.linear_eval,
          linear_eval_epochs=FLAGS.linear_eval_epochs,
          diagnostics=FLAGS.diagnostics, cacr_t_neg=FLAGS.cacr_t_neg,
          seed=FLAGS.seed)
    except storage.StorageError as e:
      sys.exit(f'StorageError: {e}')   # Nothing ran: no traceback.
    width = max(len(k) for k in results)
    for k in sorted(results):
      print(f'{k:<{width}}  {results[k]}')

  app.run(main, argv=argv)


def study(argv=None) -> int:
  """The study of the methods' claims (benchmarks/reproduce.py), from a
  checkout: its runs, results and report live in the repository."""
  if os.path.exists(os.path.join('benchmarks', 'reproduce.py')):
    sys.path.insert(0, os.getcwd())     # The checkout it runs from.
  try:
    from benchmarks import reproduce  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit(
        'contrastive-jax-study runs from a checkout of the repository (its '
        'results and report live there): cd into it, or run `python -m '
        f'benchmarks.reproduce` there ({e}).') from e
  return reproduce.main(argv)


_COMMANDS = {'train': train, 'eval': evaluate, 'study': study}


if __name__ == '__main__':
  if len(sys.argv) < 2 or sys.argv[1] not in _COMMANDS:
    sys.exit(f'usage: python -m contrastive_jax.cli '
             f'{{{",".join(_COMMANDS)}}} [flags]')
  command = sys.argv.pop(1)
  sys.exit(_COMMANDS[command]())
