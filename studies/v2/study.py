r"""Study v2: the driver of the pre-registered study (PROTOCOL.md beside it).

Every run of the study executes from one tagged commit (`STUDY_TAG`), in a
git worktree of that tag, so that the rest of the project can change while
the study runs. The tag's checkout holds this driver as
`benchmarks.study_v2`; here it is `studies.v2` (the same plan, for the
tables, the report and `backfill_curves`):

    git worktree add <study checkout> study-v2.1    # once
    cd <study checkout> && ln -s <a virtual environment> .venv
    nohup nice -n 19 .venv/bin/python -m benchmarks.study_v2 pilot \
        --results_dir=<branch checkout>/studies/v2/results \
        > <log file> 2>&1 &

Stages (PROTOCOL.md says what each is for and what is decided from it):

* `recipe`: NT-Xent (tau 0.2) for `RECIPE_EPOCHS` epochs at each shared
  recipe of `RECIPES` (peak learning rate x crop scale, Amendment 1), seed 0,
  the validation kNN after every epoch; the recipe with the highest final
  validation kNN (the largest gain over the one random-init encoder) is the
  shared recipe of every later stage (`chosen_recipe`).
* `pilot`: the random-init encoder (and raw pixels) on the validation split,
  then SimCLR trained for `PILOT_EPOCHS` epochs with the kNN of the trained
  encoder on the validation split after every epoch (the same evaluator:
  the whole training set as the bank, the whole validation split as queries,
  k = 200, T = 0.1). `--recipe=config` is the first pilot (the configs'
  recipe, tag `study-v2`), `--recipe=chosen` (the default) its rerun with
  the recipe stage's choice.
* `tune --epochs=E`: each arm's main hyperparameter at its grid values
  (`ARMS`), seed 0, scored on the validation split.
* `final --epochs=E`: each arm at the value its tuning runs chose (the
  highest validation kNN), seeds `SEEDS`, and the random-init baseline of
  each seed, scored on the test split.
* `imbalance --epochs=E`: NT-Xent and CACR (K=1) at their chosen values on
  CACR's linear and exponential class-imbalanced training sets (the final
  runs' number of steps), scored on the test split with a kNN bank and a
  linear probe fitted on the balanced training set
  (`contrastive_jax.cli eval` on the run's checkpoint).

A run is one main.py subprocess (8 virtual CPU devices), its workdir
`workdir/study_v2/<run id>-<hash of its command>` (checkpoints: an
interrupted run resumes), and its record `<results_dir>/<run id>.json`. The
record exists from the run's first start and lists every invocation, written
by this driver: the commit and whether the tree was dirty, the checkpoint
step it resumed from and the one it reached, its wall and CPU time and how
it ended. A run refuses to
start, or to resume, on a dirty tree or at another commit than the one it
started at; with `--require_tag` (the default outside --quick) every run
must come from the commit of `STUDY_TAG`.

Stop it with SIGTERM (`kill <pid of this driver>`): main.py saves the step
it reached, the invocation is recorded as interrupted, and the same command
resumes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(ROOT, 'studies', 'v2', 'results')
WORK_ROOT = os.path.join(ROOT, 'workdir', 'study_v2')
# Amendment 1: the recipe stage and every stage after it run from this tag;
# the first pilot ran from 'study-v2'.
STUDY_TAG = 'study-v2.1'

VALIDATION_SIZE = 10_000
# Fashion-MNIST: 6000 training images per class, 10 classes.
TRAIN_PER_CLASS, NUM_CLASSES = 6000, 10
BATCH = 256
SEEDS = (0, 1, 2, 3)
PILOT_EPOCHS = 16
KNN_KEY = 'knn_weighted_top1@200'
# The weighted online kNN's history key: today's name first, then the name
# the code of tag 'study-v2' wrote. The code of tag 'study-v2.1' looks for
# the old name only, so its records get their curves from `backfill_curves`.
ONLINE_KEYS = ('online/knn_weighted_top1@200', 'online/knn_top1@200')

# Every run: the 50,000 training images the validation holdout leaves, the
# papers' representation (the encoder's pooled output, 256-d, which the head
# reads too), batch 256, the fmnist augmentation, no t-SNE maps.
COMMON = {
    'dataset.validation_size': VALIDATION_SIZE,
    'model.encoder_kwargs.pool': 'avg',
    'augment.preset': 'fmnist',
    'batch_size': BATCH,
    'eval.baselines': False,
    'eval.embedding_points': 0,
    'online.knn_every_steps': 0,
    'checkpoint_every_steps': 100,
}
TEMPERATURES = (0.1, 0.2, 0.5)
# Amendment 1: the shared recipes, (base_learning_rate, crop scale).
RECIPE_EPOCHS = 6
RECIPE_LRS = (1e-3, 1e-2, 6e-2)
RECIPE_CROPS = ((0.3, 1.0), (0.08, 1.0))
RECIPES = tuple((lr, crop) for lr in RECIPE_LRS for crop in RECIPE_CROPS)
# arm: (config, overrides, tuned key, grid, the config's own value).
ARMS = {
    'ntxent': ('simclr', {}, 'loss_kwargs.temperature', TEMPERATURES),
    'dcl': ('dcl', {}, 'loss_kwargs.temperature', TEMPERATURES),
    'macl': ('macl', {}, 'loss_kwargs.temperature', TEMPERATURES),
    'cacr_k1': ('cacr_k1', {}, 'loss_kwargs.t_neg', (1.0, 2.0, 4.0)),
    # MoCo v2 with both views as queries and as keys (symmetric), as
    # CACR-MoCo: equal query views.
    'moco_v2': ('moco_v2', {'moco.query_views': (0, 1),
                            'moco.key_views': (0, 1)},
                'loss_kwargs.temperature', TEMPERATURES),
    'cacr_moco': ('cacr_moco', {}, 'loss_kwargs.t_neg', (1.0, 2.0, 4.0)),
    # Two views, as every other arm.
    'cmc': ('cmc', {'augment.num_views': 2}, 'loss_kwargs.temperature',
            TEMPERATURES),
}
IMBALANCED_ARMS = ('ntxent', 'cacr_k1')
IMBALANCE_RULES = ('linear', 'exponential')


# --------------------------------------------------------------------------
# Run options: main.py's flags, the training set's size, the epochs.
# --------------------------------------------------------------------------

# 8 virtual CPU devices; XLA's CPU collectives wait up to 2 h in a
# rendezvous instead of aborting the run after 40 s (a device thread starved
# under `nice -n 19` is slow, not dead).
XLA_FLAGS = ('--xla_force_host_platform_device_count=8 '
             '--xla_cpu_collective_call_terminate_timeout_seconds=7200 '
             '--xla_cpu_collective_timeout_seconds=7200')

# A run's options keep the names of the code the study ran on (its record
# and fingerprint hold them); main.py takes today's names
# (contrastive_jax/config_lib.py, RENAMED), where a 0 that turns a monitor
# or the probe off is every_steps=-1.
_RENAMED = {'online.knn_every_steps': 'evals.online_knn.every_steps',
            'online.knn_k': 'evals.online_knn.ks',
            'online.knn_bank_size': 'evals.online_knn.bank_size',
            'online.knn_num_queries': 'evals.online_knn.num_queries',
            'eval.linear_max_iter': 'evals.linear.max_iter'}


def current_options(options) -> list[tuple[str, object]]:
  """(key, value) options in today's config names, for main.py."""
  out = []
  for key, value in options:
    if key == 'online.knn_every_steps' and not value:
      out.append(('evals.online_knn.every_steps', -1))
    elif key == 'eval.linear_max_iter' and not value:
      out.append(('evals.linear.every_steps', -1))
    elif key == 'online.knn_k':
      out.append(('evals.online_knn.ks', (int(value),)))
    else:
      out.append((_RENAMED.get(key, key), value))
  return out


def flag_value(v) -> str:
  """A --config.key= value: tuples as '(a,b)', '(a,)' for one element."""
  if isinstance(v, tuple):
    return '(' + ','.join(str(x) for x in v) + (',)' if len(v) == 1 else ')')
  return str(v)


def train_examples(rule: str) -> int:
  """Training examples after the holdout and CACR's rule (Fashion-MNIST)."""
  from input_pipeline import imbalance  # pylint: disable=g-import-not-at-top
  per_class = TRAIN_PER_CLASS - VALIDATION_SIZE // NUM_CLASSES
  if rule == 'none':
    return per_class * NUM_CLASSES
  return int(imbalance.kept_counts([per_class] * NUM_CLASSES, rule=rule).sum())


def epochs_for_steps(steps: int, examples: int, batch: int) -> float:
  """num_epochs giving exactly `steps` (train.py: int(epochs * per_epoch))."""
  per_epoch = examples // batch
  return round((steps + 0.5) / per_epoch, 6)


def newest_mtime(workdir: str) -> float:
  """The latest modification time of a file under `workdir` (0 if none)."""
  newest = 0.
  for dirpath, _, files in os.walk(workdir):
    for name in files:
      try:
        newest = max(newest, os.path.getmtime(os.path.join(dirpath, name)))
      except OSError:   # Removed while we walked (an orbax temporary).
        pass
  return newest


class StudyError(Exception):
  """A run may not start or resume here; the message says why and the fix."""


@dataclasses.dataclass(frozen=True)
class Run:
  stage: str          # recipe | pilot | tune | final | imbalance
  arm: str            # An ARMS key, or 'baselines'.
  config: str         # configs/<config>.py
  seed: int
  overrides: tuple    # ((key, value), ...) passed as --config.key=value
  tag: str = ''       # The tuned value or the imbalance rule, in the id.

  @property
  def run_id(self) -> str:
    return '__'.join(x for x in (self.stage, self.arm, self.tag,
                                 f's{self.seed}') if x)

  def args(self) -> list[str]:
    return [f'--config=configs/{self.config}.py'] + [
        f'--config.{k}={flag_value(v)}' for k, v in self.overrides]

  @property
  def fingerprint(self) -> str:
    return hashlib.sha1(' '.join(self.args()).encode()).hexdigest()[:8]

  @property
  def split(self) -> str:
    return dict(self.overrides)['eval.split']

  @property
  def balanced_eval(self) -> bool:
    return self.stage == 'imbalance'


def _steps(epochs: float, examples: int = 50_000, batch: int = BATCH) -> int:
  return int(epochs * (examples // batch))


def recipe_overrides(recipe) -> dict:
  """The config options of a shared recipe (lr, crop); {} for None (the
  configs' own: base_learning_rate 1e-3, the fmnist preset's crop)."""
  if recipe is None:
    return {}
  lr, crop = recipe
  return {'optimizer.base_learning_rate': lr,
          # One mapping: every view's crop.
          'augment.overrides': ({'crop_scale': tuple(crop)},)}


def recipe_tag(recipe) -> str:
  lr, crop = recipe
  return f'lr{lr:g}_crop{crop[0]:g}'


def _make(stage, arm, seed, split, epochs, extra=None, tag='',
          examples=50_000, steps=None, recipe=None) -> Run:
  # The baselines run's encoder is initialised as every arm's (the same
  # model and seed); its one step of training is not scored.
  config, own, *_ = ARMS[arm] if arm in ARMS else ('simclr', {})
  o = dict(COMMON, seed=seed, **{'eval.split': split})
  o.update(own)
  o.update(recipe_overrides(recipe))
  o.update(extra or {})
  steps = _steps(epochs) if steps is None else steps
  o['num_epochs'] = epochs_for_steps(steps, examples, BATCH)
  return Run(stage, arm, config, seed, tuple(sorted(o.items())), tag)


def _curve_options() -> dict:
  """The validation kNN of the current encoder after every epoch, with the
  end-of-run kNN's evaluator: every training image in the bank, every
  validation image a query, k = 200."""
  per_epoch = 50_000 // BATCH
  return {'online.knn_every_steps': per_epoch,
          'online.knn_k': 200,
          'online.knn_bank_size': 50_000,
          'online.knn_num_queries': VALIDATION_SIZE,
          'checkpoint_every_steps': per_epoch}


def _baselines(stage: str) -> Run:
  # One step of training (its 'trained' row is ignored), baselines on.
  return _make(stage, 'baselines', 0, 'validation', 0, steps=1,
               extra={'eval.baselines': True})


def pilot_runs(epochs: float = PILOT_EPOCHS, recipe=None) -> list[Run]:
  """The random-init encoder on validation, then the SimCLR curve: the
  configs' recipe (recipe None, the first pilot) or a shared recipe."""
  tag = recipe_tag(recipe) if recipe is not None else ''
  return [_baselines('pilot'),
          _make('pilot', 'ntxent', 0, 'validation', epochs,
                extra=_curve_options(), tag=tag, recipe=recipe)]


def recipe_runs(epochs: float = RECIPE_EPOCHS) -> list[Run]:
  """Amendment 1: the random-init encoder from this tag, then NT-Xent at
  tau 0.2 for every recipe of RECIPES, seed 0, on the validation split."""
  return [_baselines('recipe')] + [
      _make('recipe', 'ntxent', 0, 'validation', epochs,
            extra=dict(_curve_options(), **{'loss_kwargs.temperature': 0.2}),
            tag=recipe_tag(r), recipe=r)
      for r in RECIPES]


def chosen_recipe(results_dir: str, epochs: float = RECIPE_EPOCHS):
  """The recipe stage's choice: the recipe whose run ends with the highest
  validation kNN (the same random-init encoder for all, so the largest gain
  over it; the first in RECIPES on a tie). StudyError until all finished."""
  runs = recipe_runs(epochs)[1:]
  recs = [load_record(results_dir, r) for r in runs]
  missing = [r.run_id for r, rec in zip(runs, recs)
             if rec is None or rec.get('status') != 'done']
  if missing:
    raise StudyError(
        'the shared recipe comes from the recipe runs (PROTOCOL.md, '
        f'Amendment 1); not finished: {", ".join(missing)}. Run `python -m '
        'studies.v2 recipe` first.')
  knn = [rec['validation']['trained']['knn'] for rec in recs]
  return RECIPES[max(range(len(RECIPES)), key=lambda i: (knn[i], -i))]


def _value_tag(key: str, value) -> str:
  return f'{key.rsplit(".", 1)[-1]}{value}'


def tune_runs(epochs: float, recipe=None) -> list[Run]:
  return [_make('tune', arm, 0, 'validation', epochs, {key: v},
                tag=_value_tag(key, v), recipe=recipe)
          for arm, (_, _, key, grid) in ARMS.items() for v in grid]


def chosen_values(results_dir: str, epochs: float,
                  recipe=None) -> dict[str, float]:
  """Each arm's tuned value: the highest validation kNN of its finished
  tuning runs; StudyError when one is missing."""
  chosen, missing = {}, []
  for arm, (_, _, key, grid) in ARMS.items():
    scores = {}
    for v in grid:
      run = _make('tune', arm, 0, 'validation', epochs, {key: v},
                  tag=_value_tag(key, v), recipe=recipe)
      rec = load_record(results_dir, run)
      if rec is None or rec.get('status') != 'done':
        missing.append(run.run_id)
        continue
      scores[v] = rec['validation']['trained']['knn']
    if len(scores) == len(grid):
      chosen[arm] = max(grid, key=lambda v: scores[v])   # First on ties.
  if missing:
    raise StudyError(
        f'the final runs take each arm\'s value from its tuning runs; not '
        f'finished at --tune_epochs={epochs}: {", ".join(missing)}. Run '
        f'`python -m studies.v2 tune --epochs={epochs}` first.')
  return chosen


def final_runs(epochs: float, chosen: dict[str, float],
               recipe=None) -> list[Run]:
  runs = []
  for seed in SEEDS:
    for arm, (_, _, key, _) in ARMS.items():
      runs.append(_make('final', arm, seed, 'test', epochs,
                        {key: chosen[arm]}, recipe=recipe))
    runs.append(_make('final', 'baselines', seed, 'test', 0, steps=1,
                      extra={'eval.baselines': True}))
  return runs


def imbalance_runs(epochs: float, chosen: dict[str, float],
                   recipe=None) -> list[Run]:
  """The final runs' steps on CACR's imbalanced subsets (more epochs of
  fewer images), seeds SEEDS."""
  runs = []
  for seed in SEEDS:
    for rule in IMBALANCE_RULES:
      for arm in IMBALANCED_ARMS:
        key = ARMS[arm][2]
        runs.append(_make(
            'imbalance', arm, seed, 'test', epochs,
            {key: chosen[arm], 'dataset.imbalance': rule}, tag=rule,
            examples=train_examples(rule), steps=_steps(epochs),
            recipe=recipe))
  return runs


# --------------------------------------------------------------------------
# Frozen code: the commit guard.
# --------------------------------------------------------------------------

def git_state(root: str) -> tuple[str, bool, list[str]]:
  """(HEAD commit, dirty, modified tracked files) of the checkout `root`.

  Untracked files do not count (the study writes none into tracked paths).
  """
  def git(*args):
    return subprocess.run(['git', *args], cwd=root, capture_output=True,
                          text=True, check=True).stdout
  try:
    commit = git('rev-parse', 'HEAD').strip()
    status = git('status', '--porcelain', '--untracked-files=no')
  except (OSError, subprocess.CalledProcessError) as e:
    raise StudyError(f'{root} is not a git checkout git can read ({e}); the '
                     'study runs only from a checkout of its tag.') from e
  files = [line[3:] for line in status.splitlines() if line.strip()]
  return commit, bool(files), files


def tag_commit(root: str, tag: str = STUDY_TAG) -> str | None:
  r = subprocess.run(['git', 'rev-parse', '--verify', '--quiet',
                      f'{tag}^{{commit}}'], cwd=root, capture_output=True,
                     text=True)
  return r.stdout.strip() or None


def check_code(root: str, record: dict | None, run_id: str,
               required_commit: str | None) -> tuple[str, bool]:
  """Refuses (StudyError) to start or resume `run_id` unless the checkout
  is clean, at the commit the run started at (its record's `study_commit`)
  and, when given, at `required_commit`. Returns (commit, dirty)."""
  commit, dirty, files = git_state(root)
  if dirty:
    raise StudyError(
        f'refusing to run {run_id}: the checkout {root} has uncommitted '
        f'changes to tracked files ({", ".join(files[:10])}). Study runs '
        'come from a clean checkout of the study\'s commit: run from a '
        f'worktree of the tag (git worktree add <dir> {STUDY_TAG}), or '
        'restore these files (git stash / git checkout -- <file>).')
  if required_commit and commit != required_commit:
    raise StudyError(
        f'refusing to run {run_id}: this checkout is at {commit[:12]}, the '
        f'study is frozen at {required_commit[:12]} (tag {STUDY_TAG}). Run '
        f'from a worktree of the tag: git worktree add <dir> {STUDY_TAG}.')
  started = (record or {}).get('study_commit')
  if started and started != commit:
    raise StudyError(
        f'refusing to resume {run_id}: it started at commit {started[:12]}, '
        f'this checkout is at {commit[:12]}. A run resumes only under the '
        f'code it started with: run from a worktree of {started[:12]} '
        '(git worktree add <dir> <commit>), or delete its record and its '
        'workdir to start it again from scratch.')
  return commit, dirty


# --------------------------------------------------------------------------
# Running.
# --------------------------------------------------------------------------

def record_path(results_dir: str, run: Run) -> str:
  return os.path.join(results_dir, run.run_id + '.json')


def load_record(results_dir: str, run: Run) -> dict | None:
  path = record_path(results_dir, run)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    rec = json.load(f)
  if rec.get('args') != run.args():
    raise StudyError(
        f'{path} records a run with other arguments than this study\'s '
        f'{run.run_id} ({rec.get("args")} vs {run.args()}); the study\'s '
        'plan changed under it. Use another --results_dir.')
  return rec


def _write(path: str, record: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + '.tmp', 'w') as f:
    json.dump(record, f, indent=1, sort_keys=True)
  os.replace(path + '.tmp', path)


def latest_checkpoint(workdir: str) -> int | None:
  d = os.path.join(workdir, 'checkpoints')
  steps = [int(n) for n in os.listdir(d) if n.isdigit()] if os.path.isdir(
      d) else []
  return max(steps) if steps else None


def online_curve(workdir: str) -> list[list[float]]:
  """[[step, online kNN], ...] from the run's history.json."""
  path = os.path.join(workdir, 'history.json')
  if not os.path.exists(path):
    return []
  try:
    with open(path) as f:
      history = json.load(f)
  except (OSError, ValueError):
    return []
  for key in ONLINE_KEYS:
    curve = [[h['step'], h[key]] for h in history if key in h]
    if curve:
      return curve
  return []


def backfill_curves(runs: Sequence[Run], results_dir: str, work_root: str,
                    root: str = ROOT) -> list[str]:
  """Writes the online kNN curve of each finished run whose record has none
  (a driver that looked for another history key) from its workdir's
  history.json, noting the commit of the code that read it
  (`curve_backfilled_by`). Returns the run ids it filled."""
  filled = []
  for run in runs:
    rec = load_record(results_dir, run)
    if rec is None or rec.get('status') != 'done' or rec.get('curve'):
      continue
    curve = online_curve(os.path.join(work_root,
                                      f'{run.run_id}-{run.fingerprint}'))
    if curve:
      rec['curve'] = curve
      rec['curve_backfilled_by'] = git_state(root)[0]
      _write(record_path(results_dir, run), rec)
      filled.append(run.run_id)
  return filled


def _watch(child: subprocess.Popen, workdir: str, stall_seconds: float,
           on_poll: Callable[[], None], log) -> int:
  """Waits for `child`, calling `on_poll` every poll; kills a child whose
  workdir has not changed for `stall_seconds` (an XLA:CPU collective
  deadlock: the process is alive but makes no progress)."""
  started = time.time()
  while True:
    try:
      return child.wait(timeout=min(30., stall_seconds))
    except subprocess.TimeoutExpired:
      on_poll()
      idle = time.time() - max(newest_mtime(workdir), started)
      if idle > stall_seconds:
        log(f'  STALLED: no progress in {workdir} for {idle:.0f} s; killing '
            'it (the retry resumes from its checkpoint)')
        child.kill()
        return child.wait()


def _scores(res: dict, knn_key: str = KNN_KEY) -> dict:
  return {rep: {'knn': res.get(f'{rep}/{knn_key}'),
                'linear': res.get(f'{rep}/linear_top1')}
          for rep in ('trained', 'random_init', 'raw_pixels')
          if f'{rep}/linear_top1' in res}


def execute(run: Run, results_dir: str, work_root: str, *, root: str = ROOT,
            required_commit: str | None = None,
            main: Sequence[str] = ('main.py',), stall_seconds: float = 1200.,
            log=print) -> dict:
  """Starts or resumes `run`; returns its record (status 'done' when it
  finished, else 'interrupted' or 'failed').

  The record is written before main.py starts and after it ends (and, while
  it runs, whenever its online kNN curve grows), with this invocation in
  its `invocations`. Raises StudyError before anything starts if the
  checkout may not run it (`check_code`).
  """
  path = record_path(results_dir, run)
  record = load_record(results_dir, run)
  if record and record.get('status') == 'done':
    return record
  commit, dirty = check_code(root, record, run.run_id, required_commit)
  workdir = os.path.join(work_root, f'{run.run_id}-{run.fingerprint}')
  os.makedirs(workdir, exist_ok=True)
  if record is None:
    record = {
        'run_id': run.run_id, 'stage': run.stage, 'arm': run.arm,
        'config': run.config, 'seed': run.seed, 'tag': run.tag,
        'args': run.args(), 'eval_split': run.split,
        'overrides': {k: list(v) if isinstance(v, tuple) else v
                      for k, v in run.overrides},
        'study_commit': commit, 'invocations': []}
  invocation = {
      'commit': commit, 'dirty': dirty, 'host': socket.gethostname(),
      'started': time.strftime('%Y-%m-%d %H:%M:%S'),
      'resumed_from_step': latest_checkpoint(workdir),
      'outcome': 'running', 'exit_code': None, 'wall_seconds': None}
  record['invocations'].append(invocation)
  record['status'] = 'running'
  _write(path, record)

  cmd = [sys.executable, *main, f'--workdir={workdir}',
         f'--config=configs/{run.config}.py'] + [
             f'--config.{k}={flag_value(v)}'
             for k, v in current_options(run.overrides)]
  env = dict(os.environ, XLA_FLAGS=XLA_FLAGS,
             TF_CPP_MIN_LOG_LEVEL='2')
  log(f'[{time.strftime("%H:%M:%S")}] {run.run_id}: {" ".join(cmd[1:])}')
  t0, rc, cpu0 = time.time(), None, os.times()

  def on_poll():
    curve = online_curve(workdir)
    if curve != record.get('curve', []):
      record['curve'] = curve
      invocation['wall_seconds'] = round(time.time() - t0, 1)
      _write(path, record)

  try:
    with open(os.path.join(workdir, 'main.log'), 'a') as out:
      child = subprocess.Popen(cmd, cwd=root, env=env, stdout=out,
                               stderr=subprocess.STDOUT)
      try:
        rc = _watch(child, workdir, stall_seconds, on_poll, log)
      finally:
        if child.poll() is None:
          # Stopped (SIGTERM): main.py saves the step it reached on SIGTERM.
          child.terminate()
          try:
            rc = child.wait(120)
          except subprocess.TimeoutExpired:
            child.kill()
            rc = child.wait()
          invocation['outcome'] = 'interrupted'
    if rc == 0 and run.balanced_eval:
      rc = balanced_evaluation(workdir, root, env, record)
  finally:
    invocation['wall_seconds'] = round(time.time() - t0, 1)
    invocation['exit_code'] = rc
    cpu1 = os.times()
    # The children's CPU time (main.py and the balanced evaluation: this
    # driver waits for one child at a time), the study's budget unit.
    invocation['cpu_seconds'] = round(
        cpu1.children_user + cpu1.children_system
        - cpu0.children_user - cpu0.children_system, 1)
    invocation['reached_step'] = latest_checkpoint(workdir)
    if curve := online_curve(workdir):
      record['curve'] = curve
    res_file = os.path.join(workdir, 'results.json')
    if rc == 0 and os.path.exists(res_file):
      with open(res_file) as f:
        res = json.load(f)
      invocation['outcome'] = 'finished'
      # This invocation's own training time (results.json's
      # `train_seconds` sums every invocation where it has this field).
      invocation['train_seconds'] = res.get('train_seconds_this_run',
                                            res.get('train_seconds'))
      if res.get('resumed_from_step') != invocation['resumed_from_step']:
        invocation['main_resumed_from_step'] = res.get('resumed_from_step')
      record.update({
          'status': 'done', run.split: _scores(res),
          'steps': res.get('steps'), 'final_loss': res.get('final_loss'),
          'images_per_sec': res.get('images_per_sec'),
          'online_final': {k: v for k, v in res.items()
                           if k.startswith('online/')},
          'finished': time.strftime('%Y-%m-%d %H:%M:%S')})
    else:
      if invocation['outcome'] == 'running':
        invocation['outcome'] = 'failed'
      record['status'] = invocation['outcome']
    _write(path, record)
  log(f'  {record["status"]} after {invocation["wall_seconds"]:.0f} s '
      f'(exit {rc}; checkpoint {invocation["reached_step"]})')
  return record


def balanced_evaluation(workdir: str, root: str, env: dict,
                        record: dict) -> int:
  """Scores an imbalanced run's checkpoint with the kNN bank and the linear
  probe fitted on the balanced training set: `contrastive_jax.cli eval`
  on a copy of the run's config with `dataset.imbalance = 'none'` (the same
  validation holdout, the same test split). Adds 'test_balanced' to the
  record; returns the exit code."""
  bdir = os.path.join(workdir, 'balanced')
  os.makedirs(bdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  config['dataset']['imbalance'] = 'none'
  _write(os.path.join(bdir, 'config.json'), config)
  link = os.path.join(bdir, 'checkpoints')
  if not os.path.lexists(link):
    os.symlink(os.path.join('..', 'checkpoints'), link)
  out = os.path.join(bdir, 'eval')
  cmd = [sys.executable, '-m', 'contrastive_jax.cli', 'eval',
         f'--workdir={bdir}', f'--outdir={out}', '--knn_ks=200',
         '--nodiagnostics']
  with open(os.path.join(bdir, 'eval.log'), 'a') as log_file:
    rc = subprocess.run(cmd, cwd=root, env=env, stdout=log_file,
                        stderr=subprocess.STDOUT).returncode
  if rc == 0:
    with open(os.path.join(out, 'results.json')) as f:
      res = json.load(f)
    record['test_balanced'] = {'trained': {
        'knn': res.get(f'trained/{KNN_KEY}'),
        'linear': res.get('trained/linear_top1')}}
  return rc


# --------------------------------------------------------------------------
# The pilot's curve.
# --------------------------------------------------------------------------

def pilot_table(results_dir: str, epochs: float = PILOT_EPOCHS,
                recipe=None) -> str:
  """The pilot's curve as a markdown table: validation kNN (%) of the
  trained encoder per epoch, the random-init encoder's, and the gain."""
  base_run, sim_run = pilot_runs(epochs, recipe)
  base = load_record(results_dir, base_run) or {}
  sim = load_record(results_dir, sim_run) or {}
  rand = (base.get('validation') or {}).get('random_init', {}).get('knn')
  raw = (base.get('validation') or {}).get('raw_pixels', {}).get('knn')
  per_epoch = 50_000 // BATCH
  fmt = lambda x: '-' if x is None else f'{100 * x:.2f}'
  name = ('the configs\' recipe' if recipe is None else
          f'base lr {recipe[0]:g}, crop scale {tuple(recipe[1])}')
  lines = [
      f'SimCLR (configs/simclr.py, tau 0.2, {name}, {epochs:g}-epoch cosine '
      'schedule), seed 0, weighted kNN (k = 200, T = 0.1; bank: the 50,000 '
      'training images, queries: the 10,000 validation images), %. '
      f'Random-init encoder (same seed): {fmt(rand)}; raw pixels: '
      f'{fmt(raw)}.', '',
      '| epoch | step | trained kNN | gain over random init |',
      '|---|---|---|---|']
  for step, acc in sim.get('curve', []):
    gain = '-' if rand is None else f'{100 * (acc - rand):+.2f}'
    lines.append(f'| {step / per_epoch:g} | {step} | {100 * acc:.2f} | '
                 f'{gain} |')
  inv = sim.get('invocations', [])
  lines += ['', f'Status: {sim.get("status", "not started")}; '
            f'{len(inv)} invocation(s), '
            f'{sum(i.get("wall_seconds") or 0 for i in inv) / 3600:.2f} h '
            'of wall time.']
  return '\n'.join(lines) + '\n'


def recipe_table(results_dir: str, epochs: float = RECIPE_EPOCHS) -> str:
  """The recipe runs as a markdown table: validation kNN (%) after every
  epoch, the final kNN and linear probe, the gains over the random-init
  encoder, CPU time; and the choice (`chosen_recipe`) once all finished."""
  base_run, *runs = recipe_runs(epochs)
  base = (load_record(results_dir, base_run) or {}).get('validation') or {}
  rand = base.get('random_init', {})
  fmt = lambda x: '-' if x is None else f'{100 * x:.2f}'
  gain = lambda x, r: ('-' if x is None or r is None
                       else f'{100 * (x - r):+.2f}')
  n = int(round(epochs))
  lines = [
      f'NT-Xent (configs/simclr.py, tau 0.2), seed 0, {epochs:g} epochs; '
      'validation split, weighted kNN (k = 200, T = 0.1, bank: the 50,000 '
      'training images) and the linear probe, %. Random-init encoder: kNN '
      f'{fmt(rand.get("knn"))}, linear {fmt(rand.get("linear"))}; raw '
      f'pixels: kNN {fmt(base.get("raw_pixels", {}).get("knn"))}, linear '
      f'{fmt(base.get("raw_pixels", {}).get("linear"))}.', '',
      '| base lr | crop scale | ' + ' | '.join(
          f'kNN ep {e}' for e in range(1, n + 1)) +
      ' | final kNN | kNN gain | linear | linear gain | CPU s | status |',
      '|---|---|' + '---|' * (n + 6)]
  for recipe, run in zip(RECIPES, runs):
    rec = load_record(results_dir, run) or {}
    curve = [acc for _, acc in rec.get('curve', [])]
    curve += [None] * (n - len(curve))
    final = (rec.get('validation') or {}).get('trained', {})
    cpu = sum(i.get('cpu_seconds') or 0 for i in rec.get('invocations', []))
    lines.append(
        f'| {recipe[0]:g} | {tuple(recipe[1])} | ' +
        ' | '.join(fmt(c) for c in curve[:n]) +
        f' | {fmt(final.get("knn"))} | {gain(final.get("knn"), rand.get("knn"))}'
        f' | {fmt(final.get("linear"))} | '
        f'{gain(final.get("linear"), rand.get("linear"))} | {cpu:.0f} | '
        f'{rec.get("status", "not started")} |')
  try:
    lr, crop = chosen_recipe(results_dir, epochs)
    lines += ['', f'Chosen (the highest final validation kNN): base lr '
              f'{lr:g}, crop scale {tuple(crop)}.']
  except StudyError:
    lines += ['', 'Chosen: not yet (runs unfinished).']
  return '\n'.join(lines) + '\n'


# --------------------------------------------------------------------------

def _exit_on_sigterm(signum, frame):
  del signum, frame
  raise SystemExit(143)   # Unwinds through execute(), which stops main.py.


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('stage', choices=('recipe', 'pilot', 'tune', 'final',
                                   'imbalance', 'recipe_table',
                                   'pilot_table', 'backfill_curves'))
  p.add_argument('--epochs', type=float, default=0.,
                 help='tune/final/imbalance: the budget in epochs '
                 '(PROTOCOL.md says how it is chosen)')
  p.add_argument('--tune_epochs', type=float, default=0.,
                 help='final/imbalance: the budget the tuning ran at')
  p.add_argument('--pilot_epochs', type=float, default=PILOT_EPOCHS)
  p.add_argument('--recipe', choices=('chosen', 'config'), default='chosen',
                 help='pilot/pilot_table/tune/final/imbalance: the recipe '
                 'stage\'s choice (Amendment 1), or the configs\' own (the '
                 'first pilot only)')
  p.add_argument('--results_dir', default=RESULTS_DIR)
  p.add_argument('--work_root', default=WORK_ROOT)
  p.add_argument('--no_require_tag', action='store_true',
                 help=f'allow a commit other than tag {STUDY_TAG}\'s (a '
                 'trial of the driver; never for the study\'s runs)')
  p.add_argument('--max_runs', type=int, default=0)
  p.add_argument('--retries', type=int, default=2)
  p.add_argument('--stall_minutes', type=float, default=20.)
  args = p.parse_args(argv)

  if args.stage == 'recipe_table':
    print(recipe_table(args.results_dir), end='')
    return 0
  if args.stage == 'backfill_curves':
    runs = recipe_runs()
    try:
      runs += pilot_runs(args.pilot_epochs, chosen_recipe(args.results_dir))
    except StudyError:
      pass
    for run_id in backfill_curves(runs, args.results_dir, args.work_root):
      print(f'{run_id}: curve filled from its history.json')
    return 0
  if args.stage in ('tune', 'final', 'imbalance') and args.epochs <= 0:
    p.error(f'{args.stage} needs --epochs')
  if args.stage in ('final', 'imbalance') and args.tune_epochs <= 0:
    p.error(f'{args.stage} needs --tune_epochs (the tuning runs\' budget)')
  try:
    recipe = None
    if args.stage != 'recipe' and args.recipe == 'chosen':
      recipe = chosen_recipe(args.results_dir)
    if args.stage == 'pilot_table':
      print(pilot_table(args.results_dir, args.pilot_epochs, recipe), end='')
      return 0
    if args.stage == 'recipe':
      runs = recipe_runs()
    elif args.stage == 'pilot':
      runs = pilot_runs(args.pilot_epochs, recipe)
    elif args.stage == 'tune':
      runs = tune_runs(args.epochs, recipe)
    else:
      chosen = chosen_values(args.results_dir, args.tune_epochs, recipe)
      runs = (final_runs if args.stage == 'final' else imbalance_runs)(
          args.epochs, chosen, recipe)
    required = None
    if not args.no_require_tag:
      required = tag_commit(ROOT)
      if required is None:
        raise StudyError(f'no tag {STUDY_TAG} in this repository; the study '
                         'runs from its tagged commit (PROTOCOL.md).')
  except StudyError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  signal.signal(signal.SIGTERM, _exit_on_sigterm)
  print(f'results: {args.results_dir}', flush=True)
  log = lambda s: print(s, flush=True)
  executed = 0
  for run in runs:
    try:
      rec = load_record(args.results_dir, run)
      if rec and rec.get('status') == 'done':
        continue
      if args.max_runs and executed >= args.max_runs:
        break
      executed += 1
      for attempt in range(args.retries + 1):
        rec = execute(run, args.results_dir, args.work_root,
                      required_commit=required,
                      stall_seconds=60 * args.stall_minutes, log=log)
        if rec['status'] == 'done':
          break
        if attempt < args.retries:
          time.sleep(60)
    except StudyError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
