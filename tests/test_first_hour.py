"""A new user's first hour, through the real entry points: `--help`, a
mistake in a flag or a config, a folder of one's own images (README's
command), a failed start and its corrected rerun in the same workdir.

Each mistake ends in one line naming the field and the fix (every problem
found at once), exit status 2, nothing written to the workdir; the
traceback only with --verbosity=1. (Ctrl-C: tests/test_main.py.)
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from synthetic_data import make_jpeg_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8')


def _run(*argv, timeout=600):
  return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True,
                        text=True, timeout=timeout, env=ENV)


def _error(out) -> str:
  """The failure's message: what stderr holds besides absl's log records."""
  lines = [l for l in out.stderr.strip().splitlines()
           if not re.match(r'[IWE]\d{4} ', l)]
  return '\n'.join(lines)


@pytest.mark.parametrize('argv', [
    ('main.py', '--help'),
    ('-m', 'contrastive_jax.cli', 'train', '-h'),
    ('-m', 'contrastive_jax.cli', 'eval', '--help')])
def test_help_says_what_runs_and_exits_0(argv):
  from configs import base  # pylint: disable=g-import-not-at-top
  from contrastive_jax import cli  # pylint: disable=g-import-not-at-top
  out = _run(*argv)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith('usage: '), out.stdout[:500]
  assert 'docs/configs.md' in out.stdout and 'Try --helpfull' not in out.stdout
  assert '--workdir' in out.stdout and '--verbosity=1' in out.stdout
  config = base.get_config()
  for field, _ in cli.MAIN_FIELDS:
    value = config
    for part in field.split('.'):
      value = value[part]            # Every listed field is a real one.
    if 'eval' not in argv:
      assert re.search(rf'^  {re.escape(field)} ', out.stdout, re.M), field
  if 'eval' in argv:
    assert '--linear_eval' in out.stdout and '--outdir' in out.stdout
    assert 'dataset.name' not in out.stdout


@pytest.mark.parametrize('flags,said', [
    (('--config.batch_sise=64',),
     "--config.batch_sise: the config has no field 'batch_sise'; did you "
     "mean 'batch_size'?"),
    (('--config.dataset.nme=x',), "did you mean 'name'?"),
    (('--config=configs/nope.py',), "no such file 'configs/nope.py'"),
    (('--config.batch_size=abc',), "flag --config.batch_size=abc: invalid "
     "literal for int()"),
    (('--config=configs/test.py:cifar',), 'get_config() takes 0 positional '
     'arguments but 1 was given'),
])
def test_a_flag_mistake_is_one_line(tmp_path, flags, said):
  out = _run('main.py', '--config=configs/test.py', f'--workdir={tmp_path}/w',
             *flags)
  message = _error(out)
  assert out.returncode == 2, out.stderr[-2000:]
  assert message.startswith('error: ') and '\n' not in message, message
  assert said in message, message
  assert not os.path.exists(tmp_path / 'w')
  if flags == ('--config.batch_sise=64',):
    # The traceback, for whoever wants it.
    out = _run('main.py', '--config=configs/test.py', f'--workdir={tmp_path}/w',
               *flags, '--verbosity=1')
    assert 'Traceback' in out.stderr and 'batch_sise' in out.stderr


def test_every_config_problem_at_once_and_nothing_written(tmp_path):
  """Problems that used to surface one per try, some only after config.json
  was written (the optimizer's name) or after compiling (one view for
  NT-Xent, naming z): all of them in one message before anything runs; the
  corrected command then starts in the same workdir."""
  workdir = tmp_path / 'w'
  out = _run('main.py', '--config=configs/test.py', f'--workdir={workdir}',
             '--config.optimizer.name=adamm', '--config.augment.num_views=1',
             '--config.batch_size=36', '--config.evals.knn.ks=0,')
  message = _error(out)
  assert out.returncode == 2, out.stderr[-2000:]
  assert message.startswith('error: 4 problems:'), message
  for said in ("unknown optimizer 'adamm' (config.optimizer.name)",
               'config.augment.num_views=1', 'needs at least 2 views',
               'config.batch_size=36 is not divisible by the 8 devices',
               'config.evals.knn.ks=(0,) needs neighbour counts >= 1'):
    assert said in message, (said, message)
  assert 'Traceback' not in out.stderr
  assert not os.path.exists(workdir)


def _readme_folder_command():
  """README's own-images command: main.py's argv."""
  with open(os.path.join(REPO, 'README.md')) as f:
    block = re.search(r'```bash\n(XLA_FLAGS=\S+ python main.py \\\n'
                      r'  --config=configs/image_folder.py.*?)```', f.read(),
                      re.S).group(1)
  words = shlex.split(block.replace('\\\n', ' '))
  assert words[0] == 'XLA_FLAGS=--xla_force_host_platform_device_count=8'
  return words[2:]


def test_readme_own_images_refuses_a_tiny_folder_then_runs(tmp_path):
  """README's command on a folder of 8 training images: refused before
  anything is written, both size problems named with values that fit; a
  config.json that an earlier failed start left (no checkpoint) neither
  locks the workdir nor is touched by the refusal. The same command on a
  few hundred images then runs to results.json in that workdir."""
  argv = _readme_folder_command()
  assert argv[:2] == ['main.py', '--config=configs/image_folder.py'], argv
  tiny, small = tmp_path / 'tiny', tmp_path / 'small'
  make_jpeg_folder(str(tiny), num_train=8, num_test=8)
  make_jpeg_folder(str(small), num_train=320, num_test=80)
  workdir = tmp_path / 'mine'
  workdir.mkdir()
  stale = {'batch_size': 512, 'evals': {'knn': {'ks': [200]}}}
  (workdir / 'config.json').write_text(json.dumps(stale))

  def command(data_dir, *extra):
    return [a.replace('/path/to/DIR', str(data_dir)).replace(
        'workdir/mine', str(workdir)) for a in argv] + list(extra)

  out = _run(*command(tiny))
  message = _error(out)
  assert out.returncode == 2, out.stderr[-2000:]
  assert message.startswith('error: 2 problems:'), message
  assert ('config.batch_size=64 is larger than the 8 training images; set '
          '--config.batch_size=8 or lower') in message, message
  assert ('config.evals.knn.ks=(10,) asks for more neighbours than the 8 '
          'training examples') in message, message
  assert sorted(os.listdir(workdir)) == ['config.json']
  assert json.loads((workdir / 'config.json').read_text()) == stale

  # Shortened for the test's time: 2 of the recipe's 100 epochs, no
  # baselines, no t-SNE maps.
  out = _run(*command(small, '--config.num_epochs=2',
                      '--config.eval.baselines=False',
                      '--config.eval.embedding_points=0'))
  assert out.returncode == 0, out.stderr[-3000:]
  results = json.loads((workdir / 'results.json').read_text())
  assert results['steps'] == 10                 # 2 x 320 // 64.
  assert 0 <= results['trained/knn_weighted_top1@10'] <= 1
  config = json.loads((workdir / 'config.json').read_text())
  assert config['batch_size'] == 64 and config['dataset']['data_dir'] == str(
      small)
  assert json.loads((workdir / 'classes.json').read_text()) == {
      'classes': ['class_0', 'class_1', 'class_2', 'class_3']}


def test_a_checkpointed_run_still_refuses_another_config(tmp_path):
  """What the workdir protects: a run with a checkpoint. A different config
  there is refused, in one line naming the difference, nothing changed."""
  from contrastive_jax import config_lib  # pylint: disable=g-import-not-at-top
  from contrastive_jax import errors  # pylint: disable=g-import-not-at-top
  from contrastive_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  import configs.test as test_config  # pylint: disable=g-import-not-at-top
  config = config_lib.with_defaults(test_config.get_config())
  workdir_lib.bind(str(tmp_path), config, classes=None, image_shape=(8, 8, 1))
  other = config_lib.with_defaults(test_config.get_config())
  other.optimizer.name = 'sgd'
  workdir_lib.check_config(other, str(tmp_path))      # No checkpoint: free.
  (tmp_path / 'checkpoints' / '4').mkdir(parents=True)
  with pytest.raises(errors.ConfigError,
                     match=r"different config \(optimizer.name: 'adamw' -> "
                     r"'sgd'\)"):
    workdir_lib.check_config(other, str(tmp_path))
  workdir_lib.check_config(config, str(tmp_path))     # Its own config: on.


def test_views_stacked_first_are_refused_by_the_losses():
  """[V, N, D] for [N, V, D]: with 2 views of 256 instances the swapped
  shape claims 256 views of 2, more than any recipe makes; the loss says
  how to fix it instead of computing a wrong value."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from contrastive_jax import losses  # pylint: disable=g-import-not-at-top
  z = np.random.default_rng(0).normal(size=(256, 2, 8)).astype(np.float32)
  swapped = jnp.asarray(z.swapaxes(0, 1))
  with pytest.raises(ValueError, match=r'256 views of 2 instances.*'
                     r'z.swapaxes\(0, 1\)'):
    losses.ntxent(swapped)
  with pytest.raises(ValueError, match=r'query has shape \(2, 256, 8\)'):
    losses.infonce(swapped, key=swapped)
  loss, _ = losses.ntxent(jnp.asarray(z))      # The right layout runs.
  assert np.isfinite(float(loss))
