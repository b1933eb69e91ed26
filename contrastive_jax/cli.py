"""The command-line entry points: training and evaluating a checkpoint.

  contrastive-jax-train --config=configs/default.py --workdir=workdir/default
  contrastive-jax-eval --workdir=workdir/default [--linear_eval=cifar]

From a checkout: `python main.py` or `python -m contrastive_jax.cli
<train|eval>`. `--help` lists the flags and main config fields; a user's
mistake ends in its message alone, exit status 2 (`--verbosity=1` adds the
traceback).
"""

from __future__ import annotations

import os
import re
import sys

from absl import app
from absl import flags

FLAGS = flags.FLAGS

# The fields a first run sets, with what they mean; `--help` prints them
# with configs/base.py's defaults (tests/test_first_hour.py checks each).
MAIN_FIELDS = (
    ('dataset.name', "a TFDS name (fashion_mnist, cifar10, imagenet2012), "
     "'image_folder' (DIR/<split>/<class>/*.jpg) or 'npz'"),
    ('dataset.data_dir', 'where the data are (a folder, or gs://bucket/...)'),
    ('dataset.train_split', 'the training split (a TFDS split or a folder)'),
    ('dataset.eval_split', 'the split the evaluators score'),
    ('dataset.image_size', 'the side images are decoded to (folders need it)'),
    ('model.encoder', "the backbone: small_cnn, resnet18, resnet50, ..."),
    ('loss', 'a loss of contrastive_jax.losses, with config.loss_kwargs'),
    ('method', 'how a batch feeds the loss: in_batch, moco, memory_bank'),
    ('batch_size', 'the global batch (all devices of all hosts)'),
    ('num_epochs', 'training length, in passes over the training split'),
    ('optimizer.name', 'adamw, adam, sgd or lars (config.optimizer.*)'),
    ('evals', 'the evaluators: knn (ks), linear (logreg), linear_eval, ...'),
    ('seed', 'the seed of initialisation, views and batches'),
)

DOCS = ('README.md (running, results, your own images); docs/configs.md '
        '(every field); configs/base.py (the defaults, commented); '
        'docs/evaluation.md; docs/input_pipeline.md; docs/storage.md')

USER_ERROR = 2     # A bad flag, value or file: absl's usage-error status.


def _fail(message: str) -> None:
  """Ends the process with `message` as the last line: no traceback."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(USER_ERROR)


def _print_help(summary: str, usage: str, flag_names, *, fields: bool
                ) -> None:
  """Prints the command's flags (and main config fields), then exits 0."""
  lines = [f'usage: {usage}', '', summary, '', 'Flags:']
  for name in flag_names:
    flag = FLAGS[name]
    default = '' if flag.default is None else f' [default: {flag.value}]'
    lines.append(f'  --{name}: {flag.help}{default}')
  lines.append('  --verbosity=1: every library log line, and the traceback '
               'of an error.')
  if fields:
    from configs import base  # pylint: disable=g-import-not-at-top
    config = base.get_config()
    lines += ['', 'Main config fields (set any as --config.FIELD=VALUE):']
    width = max(len(name) for name, _ in MAIN_FIELDS)
    for name, meaning in MAIN_FIELDS:
      value = config
      for part in name.split('.'):
        value = value[part]
      default = '' if name == 'evals' else f' [default: {value!r}]'
      lines.append(f'  {name:<{width}}  {meaning}{default}')
  lines += ['', f'Docs: {DOCS}.']
  print('\n'.join(lines))
  sys.exit(0)


def _config_file_problem(argv) -> str | None:
  """--config's missing file, which absl reports late, as a traceback."""
  for arg, following in zip(argv, list(argv[1:]) + [None]):
    value = (arg.split('=', 1)[1] if arg.startswith('--config=') else
             following if arg == '--config' else None)
    if value is not None:
      path = value.split(':', 1)[0]
      if not os.path.isfile(path):
        return (f'--config={value}: no such file {path!r}; an experiment '
                'is a file of configs/ (e.g. configs/default.py, '
                'configs/papers/simclr.py:cifar10).')
  return None


def _parser(summary: str, usage: str, flag_names, *, fields: bool):
  """absl's flag parser with `--help` and one-line errors."""

  def parse(argv):
    if any(a in ('-h', '--help', '-?', '--helpshort') for a in argv[1:]):
      _print_help(summary, usage, flag_names, fields=fields)
    if problem := _config_file_problem(argv[1:]):
      _fail(problem)
    verbose = any(re.fullmatch(r'(--verbosity|-v)=?[1-9]\d*', a) or (
        a in ('--verbosity', '-v') and re.fullmatch(r'[1-9]\d*', b))
                  for a, b in zip(argv[1:], argv[2:] + ['']))
    try:
      return FLAGS(argv)
    except (flags.Error, AttributeError) as e:
      if verbose:
        raise
      _fail(_parse_error_message(e, argv))

  return parse


def _parse_error_message(e: Exception, argv) -> str:
  """What failed in parsing `argv`, in one line."""
  if isinstance(e, flags.Error):
    # A config file that fails embeds its traceback; its last line is the error.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    message = lines[0] if len(lines) == 1 else f'{lines[0]} {lines[-1]}'
    return f'{message} (`--help` lists the flags).'
  # ml_collections: an override that names no field; its message is the repr
  # of "'batch_sise'\nDid you mean "batch_size" instead of "batch_sise"?".
  text = str(e)
  hint = re.search(r'Did you mean "(\w+)" instead of "(\w+)"', text)
  name = hint.group(2) if hint else (re.findall(r"'(\w+)'", text) or [''])[0]
  flag = next((a.split('=')[0] for a in argv[1:] if name and
               a.startswith('--config.') and
               a.split('=')[0].endswith('.' + name)), None)
  if flag is None:     # Not an override: the config file itself failed.
    return (f'the config file failed: AttributeError: {text} '
            '(--verbosity=1 for the traceback).')
  return (f'{flag}: the config has no field {name!r}'
          + (f'; did you mean {hint.group(1)!r}?' if hint else '')
          + ' (configs/base.py lists every field).')


def _run_reporting_user_errors(fn, *, interrupted: str, more=()):
  """fn(); a user error (or `more`) or an unhandled Ctrl-C ends in one line."""
  from contrastive_jax import errors  # pylint: disable=g-import-not-at-top
  from contrastive_jax import storage  # pylint: disable=g-import-not-at-top
  from input_pipeline import datasets  # pylint: disable=g-import-not-at-top
  try:
    return fn()
  except (errors.ConfigError, storage.StorageError,
          datasets.DatasetUnavailableError, *more) as e:
    if FLAGS.verbosity >= 1:
      raise
    text = str(e)
    _fail(text if ' problems:\n' in text else ' '.join(text.split()))
  except KeyboardInterrupt:
    # Outside training's own handling, or a second Ctrl-C: 128 + SIGINT.
    print(f'interrupted (Ctrl-C). {interrupted}', file=sys.stderr)
    sys.exit(130)


def _start(args) -> None:
  """Process set-up shared by the entry points, before any jax computation."""
  if len(args) > 1:
    raise app.UsageError(f'unexpected arguments: {args[1:]}')
  if FLAGS.verbosity < 1:
    # TensorFlow's C++ start-up lines: TF only reads data here.
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
    # The resource tracker unlinks the decoding workers' last shared-memory
    # batches at exit, calling each one "leaked".
    os.environ.setdefault('PYTHONWARNINGS',
                          'ignore:resource_tracker:UserWarning')
  # Imported here so that --help and flag errors return before jax loads.
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from contrastive_jax import progress  # pylint: disable=g-import-not-at-top
  from contrastive_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.size_cpu_thread_pools()
  runtime.initialize_distributed()
  if FLAGS.verbosity < 1:
    runtime.quiet_library_logs()
  progress.configure(FLAGS.progress)
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
                      'TensorBoard events, plots and results.json; rerun '
                      'the same command to resume.')
  config_flags.DEFINE_config_file(
      'config', None, 'Experiment config file (configs/*.py; '
      'configs/papers/<paper>.py:<scale>).', lock_config=True)
  _define_progress()
  flags.mark_flags_as_required(['config', 'workdir'])

  def main(args):
    _start(args)
    from absl import logging  # pylint: disable=g-import-not-at-top
    from contrastive_jax import train as train_lib  # pylint: disable=g-import-not-at-top
    workdir = FLAGS.workdir

    def run():
      try:
        train_lib.train_and_evaluate(FLAGS.config, workdir)
      except train_lib.Preempted as e:
        logging.warning('%s', e)
        # 128 + the signal's number, as if the signal had ended the process.
        sys.exit(130 if e.signal == 'SIGINT' else 143)

    _run_reporting_user_errors(run, interrupted=(
        f'Checkpoints saved so far, if any, are in {workdir}/checkpoints; '
        'rerun the same command to resume.'))

  app.run(main, argv=argv, flags_parser=_parser(
      'Pretrains a contrastive model on config.dataset, checkpointing to '
      '--workdir (rerunning resumes; SIGTERM or Ctrl-C saves the step '
      'reached), then evaluates the trained encoder and writes '
      'results.json, summary.png and TensorBoard events there.',
      'python main.py --config=configs/default.py --workdir=workdir/default '
      '[--config.FIELD=VALUE ...]   (installed: contrastive-jax-train)',
      ('config', 'workdir', 'progress'), fields=True))


def evaluate(argv=None) -> None:
  """Evaluates a run's checkpoint (`eval_checkpoint.evaluate_checkpoint`)."""
  flags.DEFINE_string('workdir', None, 'Directory of the training run.')
  flags.DEFINE_string('outdir', None, 'Output directory (default '
                      'workdir/eval).')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: newest).')
  flags.DEFINE_list('knn_ks', ['10', '20', '200'],
                    'Extra kNN neighbour counts.')
  flags.DEFINE_string('linear_eval', None, "Also run the papers' linear "
                      'evaluation with this preset (evaluators/linear_eval.py '
                      'PRESETS).')
  flags.DEFINE_integer('linear_eval_epochs', 0, "Override the preset's epochs.")
  flags.DEFINE_bool('diagnostics', True, 'Run the diagnostics evaluator.')
  flags.DEFINE_float('cacr_t_neg', 2., "t^- of CACR's conditional entropy.")
  flags.DEFINE_integer('seed', 0, 'Seed of the diagnostic views.')
  _define_progress()
  flags.mark_flags_as_required(['workdir'])

  def main(args):
    _start(args)
    from contrastive_jax import eval_checkpoint  # pylint: disable=g-import-not-at-top
    results = _run_reporting_user_errors(
        lambda: eval_checkpoint.evaluate_checkpoint(
            FLAGS.workdir, FLAGS.outdir, step=FLAGS.step,
            knn_ks=tuple(int(k) for k in FLAGS.knn_ks),
            linear_eval=FLAGS.linear_eval,
            linear_eval_epochs=FLAGS.linear_eval_epochs,
            diagnostics=FLAGS.diagnostics, cacr_t_neg=FLAGS.cacr_t_neg,
            seed=FLAGS.seed),
        interrupted='results.json was not written.',
        # A workdir, checkpoint or step that is not there.
        more=(FileNotFoundError,))
    width = max(len(k) for k in results)
    for k in sorted(results):
      print(f'{k:<{width}}  {results[k]}')
    print(f'results: '
          f'{eval_checkpoint.results_path(FLAGS.workdir, FLAGS.outdir)}')

  app.run(main, argv=argv, flags_parser=_parser(
      "Evaluates a training run's checkpoint: kNN at several k, the "
      'logistic-regression probe, diagnostics and, with --linear_eval, '
      "the papers' linear evaluation; prints the results and writes them "
      'to --outdir.',
      'contrastive-jax-eval --workdir=workdir/default [--linear_eval=cifar] '
      '   (from a checkout: python -m contrastive_jax.cli eval ...)',
      ('workdir', 'outdir', 'step', 'knn_ks', 'linear_eval',
       'linear_eval_epochs', 'diagnostics', 'cacr_t_neg', 'seed',
       'progress'), fields=False))


_COMMANDS = {'train': train, 'eval': evaluate}


if __name__ == '__main__':
  if len(sys.argv) < 2 or sys.argv[1] not in _COMMANDS:
    sys.exit(f'usage: python -m contrastive_jax.cli '
             f'{{{",".join(_COMMANDS)}}} [flags]')
  command = sys.argv.pop(1)
  sys.exit(_COMMANDS[command]())
