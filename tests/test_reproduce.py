"""The study command (benchmarks/reproduce.py): its plan, statistics, and a
real `--quick` run of the whole pipeline (main.py subprocesses, JSONs, report).
"""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from contrastive_jax import config_lib

from benchmarks import reproduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ plan ---

def test_plan_covers_every_method_seed_and_variant():
  runs = reproduce.plan()
  ids = [r.run_id for r in runs]
  assert len(ids) == len(set(ids))
  want = {(v, m) for m, *_ in reproduce.METHODS for v in ('regular',)}
  want |= {('batch64', m) for m, _ in reproduce.SMALL_BATCH_METHODS}
  want |= {(v, m) for m, _ in reproduce.IMBALANCED_METHODS
           for v in ('linear', 'exponential')}
  want |= {('baselines', 'baselines')}
  for v, m in want:
    seeds = sorted(r.seed for r in runs if (r.variant, r.method) == (v, m))
    assert seeds == [0, 1, 2], (v, m)
  # The default-recipe candidates: one seed each, scored on validation.
  recipes = {('recipe', name) for name, *_ in reproduce.RECIPES}
  for v, m in recipes:
    assert [r.seed for r in runs if (r.variant, r.method) == (v, m)] == [0]
  assert {(r.variant, r.method) for r in runs} == want | recipes
  for name in ('simclr', 'moco_v2', 'insdis', 'cmc', 'supcon', 'tcl_sup',
               'tcl_ssl', 'cacr_k1', 'cacr_k4', 'cacr_moco', 'macl', 'jcl',
               'au_cl', 'hn_cl', 'dcl'):
    assert any(r.config == name for r in runs), name


def test_plan_is_seed_major():
  runs = reproduce.plan()
  seeds = [r.seed for r in runs if r.variant != 'recipe']
  assert seeds == sorted(seeds)
  # The recipe candidates run after seed 1, before seed 2.
  where = [i for i, r in enumerate(runs) if r.variant == 'recipe']
  assert where == list(range(where[0], where[-1] + 1))
  assert runs[where[0] - 1].seed == 1 and runs[where[-1] + 1].seed == 2


def test_every_run_has_the_same_protocol_and_steps():
  runs = reproduce.plan()
  for r in runs:
    o = dict(r.overrides)
    assert o['augment.preset'] == 'fmnist'
    assert o['dataset.validation_size'] == 10_000
    batch = o['batch_size']
    examples = reproduce.train_examples(o.get('dataset.imbalance', 'none'))
    steps = int(o['num_epochs'] * (examples // batch))   # As train.py does.
    if r.variant == 'recipe':
      # Chosen on validation, with the default job's images: 936 x 256.
      assert o['eval.split'] == 'validation' and r.config == 'default'
      assert steps * batch == 936 * 256, r.run_id
      continue
    assert o['eval.split'] == 'test'
    if r.variant == 'baselines':
      assert steps == 1 and o['eval.baselines']
      continue
    assert not o['eval.baselines']
    # Same images seen (batch 64) or same steps (imbalanced): same compute.
    assert steps * batch == 390 * 256, r.run_id
  # Peak lr 1e-3 at batch 64 too (base * 64 / 256).
  b64 = [r for r in runs if r.variant == 'batch64']
  assert all(dict(r.overrides)['optimizer.base_learning_rate'] * 64 / 256 ==
             pytest.approx(1e-3) for r in b64)


def _parse_flags(args: list[str]):
  """The config main.py would build from these command-line arguments."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  argv = ['main.py'] + args
  values = flags.FlagValues()
  # sys_argv: the overrides are read from this argv, not the test runner's.
  config_flags.DEFINE_config_file('config', flag_values=values,
                                  sys_argv=argv)
  values(argv)
  return values.config


def test_pinned_settings_survive_a_change_of_the_default(tmp_path):
  # A configs/default.py whose recipe changed after the study began (the
  # head reading the map, peak lr 3e-3): every run still trains with the
  # study's values, unless the run itself sets the key.
  changed = tmp_path / 'changed_default.py'
  changed.write_text(
      'from configs import base\n'
      'def get_config():\n'
      '  config = base.get_config()\n'
      "  config.model.head_input = 'features'\n"
      '  config.optimizer.base_learning_rate = 3e-3\n'
      '  return config\n')
  runs = {r.run_id: r for r in reproduce.plan()}
  for run_id, head_input, lr in [
      ('regular__ntxent_t0.1__s2', 'pooled', 1e-3),
      ('batch64__ntxent_t0.1__s2', 'pooled', 4e-3),     # its own lr
      ('recipe__default__s0', 'pooled', 1e-3),
      ('recipe__head_features__s0', 'features', 1e-3),  # its own head
      ('recipe__lr3e-3__s0', 'pooled', 3e-3)]:
    run = runs[run_id]
    assert run.config == 'default'
    args = run.command_args()
    assert args[0] == '--config=configs/default.py'
    config = _parse_flags([f'--config={changed}'] + args[1:])
    assert config.model.head_input == head_input, run_id
    assert config.optimizer.base_learning_rate == pytest.approx(lr), run_id
    # The pins are not part of the run's identity (finished runs stay done).
    assert not any('head_input=pooled' in a for a in run.args())


def test_runs_naming_configs_default_train_configs_base():
  # configs/default.py is configs/base.py plus the recipe chosen on the
  # validation split. The study's NT-Xent, baseline and recipe runs name
  # configs/default.py (their identity, and so their finished results,
  # predate that choice); with the pins they must build exactly the config
  # that configs/base.py with the run's own overrides builds.
  runs = [r for r in reproduce.plan() if r.config == 'default']
  assert len({r.variant for r in runs}) == 4   # regular, batch64, ...
  configs = os.path.join(reproduce.ROOT, 'configs')
  for r in runs:
    if r.seed == 2 or (r.seed == 1 and r.variant != 'batch64'):
      continue   # The seeds differ in config.seed only.
    args = r.command_args()
    assert args[0] == '--config=configs/default.py'
    via_default = _parse_flags([f'--config={configs}/default.py'] + args[1:])
    via_base = _parse_flags([f'--config={configs}/base.py'] + [
        f'--config.{k}={reproduce._flag_value(v)}'  # pylint: disable=protected-access
        for k, v in reproduce.current_options(r.overrides)])
    assert via_default.to_dict() == via_base.to_dict(), r.run_id


def test_train_examples_follow_cacr_rules():
  assert reproduce.train_examples('none') == 50_000
  assert reproduce.train_examples('linear') == 27_500
  assert reproduce.train_examples('exponential') == 7_904


def _set_options(config, options) -> None:
  """Sets a run's (key, value) options on `config`, in today's names, as
  main.py's flags would."""
  for key, value in reproduce.current_options(options):
    node = config
    *path, leaf = key.split('.')
    for p in path:
      node = node[p]
    node[leaf] = value


def test_every_study_config_passes_validation():
  import importlib
  for r in reproduce.plan():
    if r.seed:
      continue
    config = importlib.import_module(f'configs.{r.config}').get_config()
    # As `Run.command_args`: the pins go to configs/default.py's runs only
    # (a method config's loss may take no temperature, e.g. CACR's).
    pins = {k: v for k, v in reproduce.PINNED.items()
            if k not in dict(r.overrides) and r.config == 'default'}
    _set_options(config, list(r.overrides) + list(pins.items()))
    config_lib.validate(config, num_devices=8)


# ------------------------------------------------------------ statistics ---

def test_cell_statistics_match_numpy():
  vals = [81.2, 83.5, 82.0]
  cell = reproduce.Cell(vals)
  assert cell.mean == pytest.approx(np.mean(vals))
  assert cell.std == pytest.approx(np.std(vals, ddof=1))
  assert reproduce.Cell([1.]).fmt() == '1.00 (n=1)'
  assert math.isnan(reproduce.Cell([1.]).std)


def test_paired_statistics_and_holm_match_hand_computation():
  # Differences 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 2 sqrt 3 on
  # 2 df. For 2 df the two-sided p has a closed form, 1 - |t| / sqrt(t^2 + 2)
  # = 1 - sqrt(12 / 14); t_0.975(2) = 4.302653 (tables).
  st = reproduce.Paired((1., 2., 3.))
  assert st.n == 3 and st.mean == pytest.approx(2.)
  assert st.p == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-6)
  half = 4.302653 / math.sqrt(3)
  assert st.ci == pytest.approx((2 - half, 2 + half), rel=1e-6)
  assert st.fmt() == '+2.00 [-0.48, +4.48]'
  one = reproduce.Paired((0.5,))
  assert math.isnan(one.p) and math.isnan(one.ci[0]) and one.fmt() == (
      '+0.50 (n=1)')
  # Holm: sorted 0.005, 0.01, 0.03, 0.04 -> 4x, 3x, 2x, 1x = 0.02, 0.03,
  # 0.06, 0.04, then the running maximum: 0.02, 0.03, 0.06, 0.06.
  assert reproduce.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx(
      [0.03, 0.06, 0.06, 0.02])
  # Capped at 1; nan stays out of the family (m = 2 here).
  adj = reproduce.holm([0.6, 0.5, math.nan])
  assert adj[:2] == pytest.approx([1., 1.]) and math.isnan(adj[2])
  assert reproduce.holm([0.02, math.nan, 0.04]) == pytest.approx(
      [0.04, math.nan, 0.04], nan_ok=True)


@pytest.mark.parametrize('mean, p_adj, want', [
    (0.7, 0.01, 'supported'), (-0.8, 0.01, 'contradicted'),
    (0.7, 0.2, 'inconclusive'), (-0.8, 0.06, 'inconclusive'),
])
def test_verdicts(mean, p_adj, want):
  assert reproduce.verdict(mean, p_adj) == want


def test_equivalence_verdicts():
  assert reproduce.equivalence_verdict(-0.1, 0.3).startswith('supported')
  assert reproduce.equivalence_verdict(-0.6, 0.3).startswith('inconclusive')
  assert reproduce.equivalence_verdict(-1.2, -0.7).startswith('contradicted')
  assert reproduce.equivalence_verdict(0.6, 0.9).startswith('inconclusive')


def test_untestable_claims_are_outside_the_family():
  fam = reproduce.family()
  labels = {comp.label for comp, _ in fam}
  assert len(fam) == 2 * len(labels) == 16
  untestable = {c.label for _, _, comps in reproduce.CLAIMS for c in comps
                if c.untestable}
  assert untestable == {
      'tcl_sup (regular) > supcon (regular)',
      'macl (batch64) > ntxent_t0.1 (batch64)',
      'gain over NT-Xent at batch 64 > at batch 256',
      'jcl (regular) > moco_v2 (regular)'}
  assert not labels & untestable


def _committed_results():
  out = {}
  for name in os.listdir(reproduce.RESULTS_DIR):
    with open(os.path.join(reproduce.RESULTS_DIR, name)) as f:
      rec = json.load(f)
    out[rec['run_id']] = rec
  return out


def test_claim_numbers_recomputed_from_the_committed_results():
  """The report's paired statistics, recomputed here from the JSONs with
  scipy.stats.ttest_rel and an independent Holm, for every testable test;
  and the committed REPORT.md shows them."""
  from scipy import stats
  res = _committed_results()
  def acc(variant, method, seed, metric):
    return 100 * res[f'{variant}__{method}__s{seed}']['test']['trained'][
        metric]
  pairs = [('cacr_k4', 'cmc_k4'), ('cmc_k4', 'simclr'),
           ('cacr_k1', 'simclr'), ('macl', 'ntxent_t0.1'), ('macl', 'dcl'),
           ('cacr_moco', 'moco_v2')]
  mine = {}
  for a, b in pairs:
    for metric in ('knn', 'linear'):
      xa = [acc('regular', a, s, metric) for s in (0, 1, 2)]
      xb = [acc('regular', b, s, metric) for s in (0, 1, 2)]
      mine[(f'{a} (regular) > {b} (regular)', metric)] = (
          np.mean(np.subtract(xa, xb)), stats.ttest_rel(xa, xb).pvalue)
  for rule in ('linear', 'exponential'):
    for metric in ('knn', 'linear'):
      drop = lambda m: np.array([acc('regular', m, s, metric) -
                                 acc(rule, m, s, metric) for s in (0, 1, 2)])
      mine[(f'{rule}: SimCLR drop > CACR drop', metric)] = (
          np.mean(drop('simclr') - drop('cacr_k1')),
          stats.ttest_rel(drop('simclr'), drop('cacr_k1')).pvalue)
  # Holm, written differently: p_(i) * (m - i) by rank, cumulative maximum.
  keys = list(mine)
  p = np.array([mine[k][1] for k in keys])
  order = np.argsort(p)
  adj_sorted = np.minimum(1, np.maximum.accumulate(
      p[order] * (len(p) - np.arange(len(p)))))
  holm_p = dict(zip([keys[i] for i in order], adj_sorted))

  records = reproduce.load_results(reproduce.RESULTS_DIR, reproduce.plan())
  rows = {(comp.label, metric): (st, p_adj, v) for _, comp, metric, st,
          p_adj, v in reproduce.claim_table(records)}
  assert len(keys) == 16
  for k in keys:
    st, p_adj, v = rows[k]
    assert st.n == 3
    assert st.mean == pytest.approx(mine[k][0], abs=1e-9), k
    assert st.p == pytest.approx(mine[k][1], rel=1e-9), k
    assert p_adj == pytest.approx(holm_p[k], rel=1e-9), k
    want = ('inconclusive' if holm_p[k] >= 0.05 else
            'supported' if mine[k][0] > 0 else 'contradicted')
    assert v == want, k
  # One row in full: CI from the t distribution on 2 df.
  d = [acc('regular', 'cacr_moco', s, 'knn') - acc('regular', 'moco_v2', s,
                                                    'knn') for s in (0, 1, 2)]
  half = stats.t.ppf(0.975, 2) * np.std(d, ddof=1) / np.sqrt(3)
  st, p_adj, v = rows[('cacr_moco (regular) > moco_v2 (regular)', 'knn')]
  assert st.ci == pytest.approx((np.mean(d) - half, np.mean(d) + half))
  with open(reproduce.REPORT) as f:
    report = f.read()
  row = (f'| cacr_moco (regular) > moco_v2 (regular) | knn | {st.fmt()} | 3 '
         f'| {reproduce._p(st.p)} | {reproduce._p(p_adj)} | {v} |')
  assert row in report, 'REPORT.md is stale: python -m benchmarks.reproduce ' \
      '--report'
  # Untestable rows carry no adjusted p and no directional verdict.
  st, p_adj, v = rows[('jcl (regular) > moco_v2 (regular)', 'knn')]
  assert math.isnan(p_adj) and v == 'untestable here' and st.n == 3


def test_gain_over_random_init_is_paired_by_seed():
  res = _committed_results()
  records = reproduce.load_results(reproduce.RESULTS_DIR, reproduce.plan())
  gains = {(v, m, metric): g for v, m, metric, g in
           reproduce.gains_over_random_init(records)}
  for method in ('simclr', 'insdis'):
    d = [100 * (res[f'regular__{method}__s{s}']['test']['trained']['knn'] -
                res[f'baselines__baselines__s{s}']['test']['random_init'][
                    'knn']) for s in (0, 1, 2)]
    assert gains[('regular', method, 'knn')].diffs == pytest.approx(d)
  assert len(gains) == 2 * (len(reproduce.METHODS) +
                            len(reproduce.SMALL_BATCH_METHODS))


def test_provenance_lists_resumed_dirty_runs_and_commits():
  def rec(run_id, commit, finished, resumed=None, dirty=False, steps=390):
    return {'run_id': run_id, 'git_commit': commit, 'finished': finished,
            'resumed_from_step': resumed, 'git_dirty': dirty, 'steps': steps}
  records = [rec('b', 'f' * 40, '2026-01-02 00:00:00', resumed=100),
             rec('a', 'e' * 40, '2026-01-01 00:00:00', dirty=True),
             rec('c', 'f' * 40, '2026-01-03 00:00:00', resumed=390)]
  prov = reproduce.provenance(records)
  assert prov['resumed'] == {'b': (100, 390), 'c': (390, 390)}
  assert prov['dirty'] == ['a']
  assert prov['commits'] == ['e' * 40, 'f' * 40]
  assert prov['span'] == ('2026-01-01 00:00:00', '2026-01-03 00:00:00')
  assert prov['probe'] == {'a': None, 'b': None, 'c': None}  # not in git
  # The committed study: the probe change splits it.
  real = reproduce.provenance(
      reproduce.load_results(reproduce.RESULTS_DIR, reproduce.plan()))
  assert set(real['probe'].values()) == {True, False}
  assert real['resumed']['batch64__macl__s1'] == (1560, 1560)


# ------------------------------------------------------- --quick for real ---

def _report_cell(report: str, variant: str, method: str):
  row = re.search(rf'^\| {variant} \| {re.escape(method)} \| (.*?) \| (.*?) \|',
                  report, re.M)
  assert row, (variant, method)
  return row.group(1), row.group(2)


def test_quick_study_end_to_end(tmp_path):
  out = str(tmp_path / 'study')
  cmd = [sys.executable, '-m', 'benchmarks.reproduce', '--quick',
         f'--out={out}', '--retries=0']
  env = dict(os.environ)
  env.pop('XLA_FLAGS', None)     # reproduce sets it for main.py itself.
  first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=3600)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  runs = reproduce.plan(quick=True)
  records = {}
  for run in runs:
    with open(os.path.join(out, run.run_id + '.json')) as f:
      records[run.run_id] = json.load(f)
  for rec in records.values():
    assert rec['eval_split'] == 'test' and rec['steps'] == 4
    acc = rec['test']['trained']
    assert 0.1 < acc['knn'] <= 1 and 0.1 < acc['linear'] <= 1
    assert rec['train_seconds'] > 0 and len(rec['git_commit']) == 40
  # The report's SimCLR cell is the mean +- std of the two seeds' JSONs.
  with open(os.path.join(out, 'REPORT.md')) as f:
    report = f.read()
  assert os.path.getsize(os.path.join(out, 'report.png')) > 1000
  knn = [100 * records[f'regular__simclr__s{s}']['test']['trained']['knn']
         for s in (0, 1)]
  lin = [100 * records[f'regular__simclr__s{s}']['test']['trained']['linear']
         for s in (0, 1)]
  knn_cell, lin_cell = _report_cell(report, 'regular', 'simclr')
  assert knn_cell == f'{np.mean(knn):.2f} ± {np.std(knn, ddof=1):.2f} (n=2)'
  assert lin_cell == f'{np.mean(lin):.2f} ± {np.std(lin, ddof=1):.2f} (n=2)'
  lk, _ = _report_cell(report, 'linear', 'cacr_k1')
  cacr = records['linear__cacr_k1__s0']['test']['trained']['knn']
  assert lk == f'{100 * cacr:.2f} (n=1)'
  assert '3 of 3 runs finished' in report
  # The imbalanced run trained on CACR's linear subset: same steps.
  assert records['linear__cacr_k1__s0']['overrides']['dataset.imbalance'] == \
      'linear'

  # A rerun skips every finished run and leaves the results untouched.
  mtimes = {p: os.path.getmtime(os.path.join(out, p)) for p in os.listdir(out)
            if p.endswith('.json')}
  second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
  assert second.returncode == 0, second.stderr[-3000:]
  assert 'main.py' not in second.stdout
  assert mtimes == {p: os.path.getmtime(os.path.join(out, p)) for p in mtimes}


def test_report_lists_the_recipe_candidates_on_validation(tmp_path):
  runs = reproduce.plan()
  cand = [r for r in runs if r.variant == 'recipe']
  rec = _record(cand[0], 0.8412, 0.8850, 936)
  rec['eval_split'] = 'validation'
  rec['validation'] = dict(rec.pop('test'), random_init={
      'knn': 0.8190, 'linear': 0.8533})
  report, plot = str(tmp_path / 'REPORT.md'), str(tmp_path / 'r.png')
  reproduce.write_report([rec], runs, report, plot)
  with open(report) as f:
    text = f.read()
  section = text.split('## The default recipe')[1].split('\n## ')[0]
  rows = [l for l in section.splitlines() if l.startswith('| ')][1:]
  assert len(rows) == len(reproduce.RECIPES) + 1       # + random init
  assert rows[0].startswith('| default:') and '| 84.12 | 88.50 |' in rows[0]
  assert all('| - | - |' in r for r in rows[1:-1])     # not run yet
  assert rows[-1] == '| baseline: random_init | - | 81.90 | 85.33 | - |'
  # Validation numbers never enter the test-split table.
  table = text.split('## Accuracy per method')[1].split('###')[0]
  assert 'recipe' not in table and '84.12' not in table


# ---------------------------------------------------------------- helpers ---

def _record(run, knn, linear, steps):
  return {'args': run.args(), 'run_id': run.run_id, 'variant': run.variant,
          'method': run.method, 'config': run.config, 'seed': run.seed,
          'eval_split': 'test', 'steps': steps,
          'overrides': dict(run.overrides),
          'test': {'trained': {'knn': knn, 'linear': linear}}}


# -------------------------------------------------------------- watchdog ---

def test_watchdog_kills_a_silent_run_and_spares_a_progressing_one(tmp_path):
  """A child that stops writing to its workdir is killed after the stall
  time; one that keeps writing runs to its own end (exit 0)."""
  silent = subprocess.Popen([sys.executable, '-c', 'import time; '
                             'time.sleep(60)'])
  t0 = reproduce.time.time()
  rc = reproduce._wait_watching(silent, str(tmp_path), 2., log=lambda s: None)
  assert rc != 0 and reproduce.time.time() - t0 < 30
  busy_dir = tmp_path / 'busy'
  busy_dir.mkdir()
  code = ('import time, pathlib\n'
          f'p = pathlib.Path({str(busy_dir)!r}) / "log"\n'
          'for i in range(6):\n'
          '  p.write_text(str(i)); time.sleep(1)\n')
  busy = subprocess.Popen([sys.executable, '-c', code])
  assert reproduce._wait_watching(busy, str(busy_dir), 2.5,
                                  log=lambda s: None) == 0


# ------------------------------------------------ study v2: frozen code ---

from benchmarks.study_v2 import study as study_v2  # pylint: disable=g-import-not-at-top,wrong-import-position


def _git(repo, *args):
  return subprocess.run(['git', *args], cwd=repo, check=True,
                        capture_output=True, text=True).stdout.strip()


# A stand-in for main.py: writes a checkpoint directory at step 100 and
# fails on its first start (an interruption), then finishes from it.
_FAKE_MAIN = '''
import json, os, sys
workdir = [a.split('=', 1)[1] for a in sys.argv if a.startswith('--workdir=')][0]
ckpt = os.path.join(workdir, 'checkpoints')
if not os.path.isdir(ckpt):
  os.makedirs(os.path.join(ckpt, '100'))
  sys.exit(3)
os.makedirs(os.path.join(ckpt, '200'))
json.dump({'steps': 200, 'train_seconds': 1.5, 'resumed_from_step': 100,
           'trained/knn_weighted_top1@200': 0.75,
           'trained/linear_top1': 0.8}, open(os.path.join(workdir, 'results.json'), 'w'))
'''


@pytest.fixture
def study_repo(tmp_path):
  repo = tmp_path / 'repo'
  repo.mkdir()
  (repo / 'fake_main.py').write_text(_FAKE_MAIN)
  _git(repo, 'init', '-q')
  _git(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'add', '.')
  _git(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm',
       'frozen')
  return repo


def _study_run():
  return study_v2.pilot_runs()[1]


def _execute(repo, tmp_path, **kw):
  return study_v2.execute(_study_run(), str(tmp_path / 'results'),
                          str(tmp_path / 'work'), root=str(repo),
                          main=('fake_main.py',), log=lambda s: None, **kw)


def test_study_records_every_invocation(study_repo, tmp_path):
  commit = _git(study_repo, 'rev-parse', 'HEAD')
  first = _execute(study_repo, tmp_path, required_commit=commit)
  assert first['status'] == 'failed' and first['study_commit'] == commit
  second = _execute(study_repo, tmp_path, required_commit=commit)
  assert second['status'] == 'done'
  with open(study_v2.record_path(str(tmp_path / 'results'),
                                 _study_run())) as f:
    rec = json.load(f)
  inv = rec['invocations']
  assert [i['outcome'] for i in inv] == ['failed', 'finished']
  assert [i['exit_code'] for i in inv] == [3, 0]
  assert [i['resumed_from_step'] for i in inv] == [None, 100]
  assert [i['reached_step'] for i in inv] == [100, 200]
  assert all(i['commit'] == commit and i['dirty'] is False for i in inv)
  assert all(i['wall_seconds'] >= 0 and i['cpu_seconds'] >= 0 for i in inv)
  assert rec['validation']['trained'] == {'knn': 0.75, 'linear': 0.8}
  assert rec['args'] == _study_run().args()
  # Done: a third call starts nothing and leaves the record alone.
  assert _execute(study_repo, tmp_path)['invocations'] == inv


def test_study_refuses_to_resume_on_another_commit(study_repo, tmp_path):
  first = _execute(study_repo, tmp_path)
  assert first['status'] == 'failed'
  (study_repo / 'other.py').write_text('x = 1\n')
  _git(study_repo, 'add', 'other.py')
  _git(study_repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit',
       '-qm', 'later')
  with pytest.raises(study_v2.StudyError, match='refusing to resume'):
    _execute(study_repo, tmp_path)
  # Nothing ran: the record still has the one invocation.
  with open(study_v2.record_path(str(tmp_path / 'results'),
                                 _study_run())) as f:
    assert len(json.load(f)['invocations']) == 1


def test_study_refuses_a_dirty_tree_and_a_commit_not_the_tags(study_repo,
                                                               tmp_path):
  (study_repo / 'fake_main.py').write_text(_FAKE_MAIN + '\n# edited\n')
  with pytest.raises(study_v2.StudyError, match='uncommitted changes.*'
                     'fake_main.py'):
    _execute(study_repo, tmp_path)
  assert not os.path.exists(study_v2.record_path(str(tmp_path / 'results'),
                                                 _study_run()))
  _git(study_repo, 'checkout', '--', 'fake_main.py')
  # Started clean, interrupted, then the tree is edited: no resume either.
  assert _execute(study_repo, tmp_path)['status'] == 'failed'
  (study_repo / 'fake_main.py').write_text(_FAKE_MAIN + '\n# edited\n')
  with pytest.raises(study_v2.StudyError, match='uncommitted changes'):
    _execute(study_repo, tmp_path)
  with open(study_v2.record_path(str(tmp_path / 'results'),
                                 _study_run())) as f:
    assert len(json.load(f)['invocations']) == 1
  _git(study_repo, 'checkout', '--', 'fake_main.py')
  with pytest.raises(study_v2.StudyError, match='frozen at'):
    _execute(study_repo, tmp_path, required_commit='0' * 40)
  # The tag's commit, found by git.
  _git(study_repo, 'tag', study_v2.STUDY_TAG)
  assert study_v2.tag_commit(str(study_repo)) == _git(study_repo, 'rev-parse',
                                                      'HEAD')


def test_study_v2_plan():
  pilot = study_v2.pilot_runs()
  assert [r.run_id for r in pilot] == ['pilot__baselines__s0',
                                       'pilot__ntxent__s0']
  o = dict(pilot[1].overrides)
  # The online kNN scores the whole validation split against the whole
  # training set every epoch, with the end-of-run kNN's k.
  assert o['online.knn_every_steps'] == 195 == 50_000 // 256
  assert (o['online.knn_k'], o['online.knn_bank_size'],
          o['online.knn_num_queries']) == (200, 50_000, 10_000)
  assert o['eval.split'] == 'validation'
  assert int(o['num_epochs'] * 195) == 16 * 195
  tune = study_v2.tune_runs(2)
  assert len(tune) == sum(len(a[3]) for a in study_v2.ARMS.values()) == 21
  assert all(dict(r.overrides)['eval.split'] == 'validation' for r in tune)
  chosen = {arm: grid[0] for arm, (_, _, _, grid) in study_v2.ARMS.items()}
  final = study_v2.final_runs(4, chosen)
  for arm in list(study_v2.ARMS) + ['baselines']:
    assert sorted(r.seed for r in final if r.arm == arm) == [0, 1, 2, 3]
  for r in final + tune + study_v2.imbalance_runs(4, chosen):
    o = dict(r.overrides)
    assert o['model.encoder_kwargs.pool'] == 'avg'
    if r.arm != 'baselines':
      steps = int(o['num_epochs'] * (reproduce.train_examples(
          o.get('dataset.imbalance', 'none')) // 256))
      assert steps == (390 if r.stage == 'tune' else 780), r.run_id
  # Equal query views: MoCo v2 embeds both views as queries, as CACR-MoCo.
  import importlib  # pylint: disable=g-import-not-at-top
  for r in final[:len(study_v2.ARMS) + 1] + study_v2.imbalance_runs(
      4, chosen)[:4] + pilot:
    config = importlib.import_module(f'configs.{r.config}').get_config()
    _set_options(config, r.overrides)
    config_lib.validate(config, num_devices=8)
    if r.arm in ('moco_v2', 'cacr_moco'):
      assert tuple(config.moco.query_views) == (0, 1), r.run_id
    if r.arm != 'baselines':
      assert config.augment.num_views == 2, r.run_id


def test_report_figure_rows_pair_each_method_with_its_seeds_random_init():
  res = _committed_results()
  records = reproduce.load_results(reproduce.RESULTS_DIR, reproduce.plan())
  rows = reproduce.plot_rows(records, reproduce.plan())
  assert {v for v, _, _ in rows['regular']} == {'regular', 'batch64'}
  assert {v for v, _, _ in rows['imbalanced']} == {'linear', 'exponential'}
  row = {(v, m): r for v, m, r in rows['regular']}
  rand = np.mean([100 * res[f'baselines__baselines__s{s}']['test'][
      'random_init']['knn'] for s in (0, 1, 2)])
  knn = [100 * res[f'regular__cmc_k4__s{s}']['test']['trained']['knn']
         for s in (0, 1, 2)]
  mean, std, random_init, n = row[('regular', 'cmc_k4')]['knn']
  assert (mean, std, n) == pytest.approx((np.mean(knn), np.std(knn, ddof=1),
                                          3))
  assert random_init == pytest.approx(rand)


def _v2_records(seed_values):
  """Final and imbalance records: seed_values[(arm, rule)] = [acc per seed]
  (fractions), baselines' random init under ('baselines', '')."""
  recs = []
  for (arm, rule), values in seed_values.items():
    for seed, v in enumerate(values):
      scores = {'knn': v, 'linear': v + 0.05}
      if rule:
        recs.append({'stage': 'imbalance', 'arm': arm, 'tag': rule,
                     'seed': seed, 'status': 'done',
                     'test': {'trained': {'knn': 0.1, 'linear': 0.1}},
                     'test_balanced': {'trained': scores}})
      elif arm == 'baselines':
        recs.append({'stage': 'final', 'arm': arm, 'tag': '', 'seed': seed,
                     'status': 'done',
                     'test': {'random_init': scores,
                              'raw_pixels': {'knn': 0.78 + seed / 1e4,
                                             'linear': 0.84}}})
      else:
        recs.append({'stage': 'final', 'arm': arm, 'tag': '', 'seed': seed,
                     'status': 'done', 'test': {'trained': scores},
                     'overrides': {study_v2.ARMS[arm][2]: 0.5}})
  return recs


def test_study_v2_analysis_matches_scipy():
  from scipy import stats
  from benchmarks.study_v2 import analysis
  rng = np.random.default_rng(0)
  vals = {(a, ''): list(0.85 + 0.01 * rng.standard_normal(4))
          for a in study_v2.ARMS}
  vals[('macl', '')] = list(np.array(vals[('ntxent', '')]) + 0.02
                           + 0.001 * rng.standard_normal(4))
  vals[('baselines', '')] = list(0.80 + 0.002 * rng.standard_normal(4))
  for rule in ('linear', 'exponential'):
    for a in ('ntxent', 'cacr_k1'):
      vals[(a, rule)] = list(0.7 + 0.01 * rng.standard_normal(4))
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(
      _v2_records(vals))}
  assert len(rows) == 14
  pct = lambda k: 100 * np.array(vals[k])
  mine = {}
  for cid, a, b in [('C1', 'macl', 'ntxent'), ('C2', 'macl', 'dcl'),
                    ('C3', 'cacr_k1', 'ntxent'), ('C4', 'cacr_moco',
                                                  'moco_v2'),
                    ('C5', 'cmc', 'ntxent')]:
    mine[cid] = pct((a, '')) - pct((b, ''))
  for cid, rule in (('C6', 'linear'), ('C7', 'exponential')):
    mine[cid] = ((pct(('ntxent', '')) - pct(('ntxent', rule)))
                 - (pct(('cacr_k1', '')) - pct(('cacr_k1', rule))))
  keys = [(c, m) for c in mine for m in ('knn', 'linear')]
  p = np.array([stats.ttest_1samp(mine[c], 0).pvalue for c, _ in keys])
  # TOST as two one-sided scipy tests against the margins.
  tost = np.array([max(stats.ttest_1samp(mine[c], -1., alternative='greater'
                                         ).pvalue,
                       stats.ttest_1samp(mine[c], 1., alternative='less'
                                         ).pvalue) for c, _ in keys])
  def holm(p):
    order = np.argsort(p)
    adj = np.minimum(1, np.maximum.accumulate(p[order] * (len(p) -
                                                          np.arange(len(p)))))
    out = np.empty_like(adj)
    out[order] = adj
    return out
  for (c, m), pi, hi, ti, thi in zip(keys, p, holm(p), tost, holm(tost)):
    r = rows[(c, m)]
    # linear = knn + 5 points in every record: the contrasts are equal.
    assert r.stats.mean == pytest.approx(np.mean(mine[c])), (c, m)
    assert r.stats.p == pytest.approx(pi, rel=1e-9)
    assert r.p_holm == pytest.approx(hi, rel=1e-9)
    assert r.p_tost == pytest.approx(ti, rel=1e-9)
    assert r.p_tost_holm == pytest.approx(thi, rel=1e-9)
  assert rows[('C1', 'knn')].verdict == 'supported'   # +2 points, sd 0.1
  g = {(a, m): x for a, m, x in analysis.gains(_v2_records(vals))}
  assert g[('cmc', 'knn')].diffs == pytest.approx(
      tuple(pct(('cmc', '')) - pct(('baselines', ''))))
  # A claim with 3 of its 4 seeds (the study still running) has no
  # verdict; its two tests stay in Holm's family of 14 with p = 1, so the
  # complete claims' adjusted p values are Holm's over that family.
  vals[('cmc', '')] = vals[('cmc', '')][:3]
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(
      _v2_records(vals))}
  assert rows[('C5', 'knn')].verdict == 'pending: 3 of 4 seeds complete'
  assert rows[('C5', 'knn')].stats.n == 3
  assert math.isnan(rows[('C5', 'knn')].p_holm)
  assert math.isnan(rows[('C5', 'knn')].p_tost_holm)
  p_one = np.where([c == 'C5' for c, _ in keys], 1., p)
  tost_one = np.where([c == 'C5' for c, _ in keys], 1., tost)
  for (c, m), hi, thi in zip(keys, holm(p_one), holm(tost_one)):
    if c != 'C5':
      assert rows[(c, m)].p_holm == pytest.approx(hi, rel=1e-9), (c, m)
      assert rows[(c, m)].p_tost_holm == pytest.approx(thi, rel=1e-9)
  # p = 1 in place of the pending tests only raises the others' adjusted p.
  assert rows[('C1', 'knn')].p_holm >= holm(p)[keys.index(('C1', 'knn'))]
  assert rows[('C1', 'knn')].verdict == 'supported'
  # Every arm's 4 seeds but seed 3's random-init run: Amendment 3 needs each
  # arm's gain, so every claim waits for it.
  vals[('cmc', '')] = list(0.85 + 0.01 * rng.standard_normal(4))
  short = [r for r in _v2_records(vals)
           if not (r['arm'] == 'baselines' and r['seed'] == 3)]
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(short)}
  assert all(r.verdict == 'pending: 3 of 4 seeds complete' and
             r.stats.n == 4 for r in rows.values())
  # An imbalance claim none of whose imbalance runs is done: 'not run yet';
  # one with some done but no complete seed: pending, 0 of 4.
  del vals[('cacr_k1', 'exponential')]
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(
      _v2_records(vals))}
  assert rows[('C7', 'knn')].verdict == 'pending: 0 of 4 seeds complete'
  del vals[('ntxent', 'exponential')]
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(
      _v2_records(vals))}
  assert rows[('C7', 'knn')].verdict == 'not run yet'
  assert math.isnan(rows[('C7', 'knn')].p_holm)
  # A balanced claim with an arm's final runs missing: pending.
  del vals[('cmc', '')]
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(
      _v2_records(vals))}
  assert rows[('C5', 'knn')].verdict == 'pending: 0 of 4 seeds complete'


def _v2_values_moco_at_random_init(rng, sd):
  """4 seeds of every arm at 85% +- sd, the random-init encoder at 80%,
  moco_v2 within 0.4 point of it, the imbalance runs at 70% (fractions)."""
  vals = {(a, ''): list(0.85 + sd * rng.standard_normal(4))
          for a in study_v2.ARMS}
  vals[('baselines', '')] = list(0.80 + 0.002 * rng.standard_normal(4))
  vals[('moco_v2', '')] = list(np.array(vals[('baselines', '')]) +
                               np.array([0.004, -0.003, 0.002, -0.001]))
  for rule in ('linear', 'exponential'):
    for a in ('ntxent', 'cacr_k1'):
      vals[(a, rule)] = list(0.7 + 0.01 * rng.standard_normal(4))
  return vals


def test_study_v2_claims_with_an_arm_at_random_init_are_untestable():
  # PROTOCOL.md Amendment 3: moco_v2 at the random-init level (its paired
  # gain's 95% CI reaches below 0) makes C4 untestable for that metric;
  # the test statistics are still computed and Holm's family keeps 14.
  from scipy import stats
  from benchmarks.study_v2 import analysis
  vals = _v2_values_moco_at_random_init(np.random.default_rng(1), 0.003)
  gain = 100 * (np.array(vals[('moco_v2', '')]) -
                np.array(vals[('baselines', '')]))
  half = stats.t.ppf(0.975, 3) * gain.std(ddof=1) / 2
  assert gain.mean() - half < 0 < gain.mean() + half   # CI straddles 0.
  rows = {(r.cid, r.metric): r for r in analysis.claim_rows(
      _v2_records(vals))}
  assert len(rows) == 14
  for m in ('knn', 'linear'):
    c4 = rows[('C4', m)]
    assert c4.verdict == 'untestable here: moco_v2 not above random init'
    assert c4.stats.n == 4 and not math.isnan(c4.p_holm)
    # Arms 5 points above random init keep their verdicts: C1's +0 is
    # inconclusive, not untestable.
    assert not rows[('C1', m)].verdict.startswith('untestable')


def test_study_v2_recipe_stage_plan_and_choice(tmp_path):
  """Amendment 1: six NT-Xent runs (3 learning rates x 2 crops) and one
  random-init run from the tag; each run's options reach the config (the
  crop of every view, the learning rate); the choice is the highest final
  validation kNN, and nothing is chosen before all six finished."""
  import importlib  # pylint: disable=g-import-not-at-top
  from input_pipeline import augment  # pylint: disable=g-import-not-at-top
  runs = study_v2.recipe_runs()
  assert [r.run_id for r in runs][:2] == [
      'recipe__baselines__s0', 'recipe__ntxent__lr0.001_crop0.3__s0']
  assert len(runs) == 7 and len({r.run_id for r in runs}) == 7
  seen = set()
  for r in runs[1:]:
    config = importlib.import_module(f'configs.{r.config}').get_config()
    _set_options(config, r.overrides)
    config_lib.validate(config, num_devices=8)
    views = augment.build_views(config.augment.preset,
                                config.augment.num_views,
                                config.augment.overrides)
    assert len(views) == 2
    crop = {v.crop_scale for v in views}
    assert len(crop) == 1
    seen.add((config.optimizer.base_learning_rate, crop.pop()))
    assert config.loss_kwargs.temperature == 0.2
    assert config.model.encoder_kwargs.pool == 'avg'
    assert config.eval.split == 'validation'
    assert int(config.num_epochs * 195) == 6 * 195
    assert config.evals.online_knn.every_steps == 195
  assert seen == {(lr, c) for lr in (1e-3, 1e-2, 6e-2)
                  for c in ((0.3, 1.0), (0.08, 1.0))}
  # The later stages carry the chosen recipe; the first pilot does not.
  recipe = (6e-2, (0.08, 1.0))
  for r in (study_v2.pilot_runs(16, recipe)[1:] +
            study_v2.tune_runs(3, recipe)):
    o = dict(r.overrides)
    assert o['optimizer.base_learning_rate'] == 6e-2, r.run_id
    assert o['augment.overrides'] == ({'crop_scale': (0.08, 1.0)},)
  assert 'optimizer.base_learning_rate' not in dict(
      study_v2.pilot_runs()[1].overrides)
  assert study_v2.pilot_runs(16, recipe)[1].run_id == (
      'pilot__ntxent__lr0.06_crop0.08__s0')

  results = str(tmp_path)
  knn = [0.80, 0.83, 0.86, 0.84, 0.86, 0.81]   # Tie: the first (0.01, 0.3).
  for r, acc in zip(runs[1:], knn):
    with pytest.raises(study_v2.StudyError, match='not finished'):
      study_v2.chosen_recipe(results)
    study_v2._write(study_v2.record_path(results, r), {  # pylint: disable=protected-access
        'args': r.args(), 'status': 'done',
        'validation': {'trained': {'knn': acc, 'linear': acc}}})
  assert study_v2.chosen_recipe(results) == (1e-2, (0.3, 1.0))
  table = study_v2.recipe_table(results)
  assert 'Chosen (the highest final validation kNN): base lr 0.01, crop ' \
      'scale (0.3, 1.0).' in table


def test_study_v2_backfills_a_missing_curve_from_history(study_repo, tmp_path):
  """A finished run whose driver looked for another history key gets its
  curve from its workdir's history.json, with the reading commit noted;
  a record that has a curve is left alone."""
  results, work = str(tmp_path / 'results'), str(tmp_path / 'work')
  empty, full = study_v2.recipe_runs()[1:3]
  history = [{'step': 195, 'online/knn_weighted_top1@200': 0.80,
              'online/knn_majority_top1@200': 0.70},
             {'step': 390, 'loss': 1.0},
             {'step': 390, 'online/knn_weighted_top1@200': 0.82}]
  for run, curve in ((empty, None), (full, [[195, 0.5]])):
    wd = os.path.join(work, f'{run.run_id}-{run.fingerprint}')
    os.makedirs(wd)
    with open(os.path.join(wd, 'history.json'), 'w') as f:
      json.dump(history, f)
    rec = {'args': run.args(), 'status': 'done'}
    if curve:
      rec['curve'] = curve
    study_v2._write(study_v2.record_path(results, run), rec)  # pylint: disable=protected-access
  assert study_v2.backfill_curves([empty, full], results, work,
                                  root=str(study_repo)) == [empty.run_id]
  rec = study_v2.load_record(results, empty)
  assert rec['curve'] == [[195, 0.80], [390, 0.82]]
  assert rec['curve_backfilled_by'] == _git(study_repo, 'rev-parse', 'HEAD')
  assert study_v2.load_record(results, full)['curve'] == [[195, 0.5]]


# PROTOCOL.md Sec. 1, written out here rather than read from analysis.py:
# claim -> [(sign, arm, rule)], rule '' the balanced final run.
_V2_CLAIMS = {
    'C1': [(1, 'macl', ''), (-1, 'ntxent', '')],
    'C2': [(1, 'macl', ''), (-1, 'dcl', '')],
    'C3': [(1, 'cacr_k1', ''), (-1, 'ntxent', '')],
    'C4': [(1, 'cacr_moco', ''), (-1, 'moco_v2', '')],
    'C5': [(1, 'cmc', ''), (-1, 'ntxent', '')],
    'C6': [(1, 'ntxent', ''), (-1, 'ntxent', 'linear'),
           (-1, 'cacr_k1', ''), (1, 'cacr_k1', 'linear')],
    'C7': [(1, 'ntxent', ''), (-1, 'ntxent', 'exponential'),
           (-1, 'cacr_k1', ''), (1, 'cacr_k1', 'exponential')],
}


def _check_v2_report(base):
  """Every number, label and verdict of `base`/REPORT.md's claims, accuracy
  and imbalance tables and gains, and its list of runs not done,
  recomputed with numpy/scipy from the records in `base`/results of the
  runs the report lists as done (records finished after it do not enter),
  by PROTOCOL.md Sec. 6-7 and Amendments 3-4 as written there."""
  from scipy import stats
  with open(os.path.join(base, 'REPORT.md')) as f:
    text = f.read()
  runs_part = text.split('## Runs and their invocations')[1]
  done = [l.split(' | ')[0][2:] for l in runs_part.splitlines()
          if l.startswith('| ') and l.split(' | ')[1] == 'done']
  acc = {}   # (arm, rule, metric) -> {seed: %}
  imb = {}     # (arm, rule, bank, metric) -> {seed: %}
  by_arm = {}  # Accuracy table: row -> {metric: {seed: %}}, and settings.
  settings = {}
  for run_id in done:
    with open(os.path.join(base, 'results', run_id + '.json')) as f:
      rec = json.load(f)
    assert rec['status'] == 'done' and rec['run_id'] == run_id
    if rec['stage'] == 'final':
      rep = 'random_init' if rec['arm'] == 'baselines' else 'trained'
      scores, rule = rec['test'][rep], ''
      reps = ({'random init': rec['test']['random_init'],
               'raw pixels': rec['test']['raw_pixels']}
              if rec['arm'] == 'baselines' else {rec['arm']: scores})
      for row, sc in reps.items():
        for m in ('knn', 'linear'):
          by_arm.setdefault(row, {}).setdefault(m, {})[rec['seed']] = (
              100 * sc[m])
      if rec['arm'] != 'baselines':
        config, own, key, _ = study_v2.ARMS[rec['arm']]
        settings[rec['arm']] = ', '.join(
            [f'configs/{config}.py'] + [f'{k} {v}' for k, v in own.items()]
            + [f'{key.split(".")[-1]} {rec["overrides"][key]}'])
    elif rec['stage'] == 'imbalance':
      scores, rule = rec['test_balanced']['trained'], rec['tag']
      for bank, sc in (('balanced', scores),
                       ('imbalanced', rec['test']['trained'])):
        for m in ('knn', 'linear'):
          imb.setdefault((rec['arm'], rule, bank, m), {})[rec['seed']] = (
              100 * sc[m])
    else:
      continue
    for m in ('knn', 'linear'):
      if scores.get(m) is not None:
        acc.setdefault((rec['arm'], rule, m), {})[rec['seed']] = (
            100 * scores[m])
  n_final = sum(r.startswith('final__') for r in done)
  n_imb = sum(r.startswith('imbalance__') for r in done)
  assert f'Runs done: final {n_final} of 32, imbalance {n_imb} of 16' in text
  # The planned runs not done, by PROTOCOL.md Sec. 6's list of runs.
  planned = {f'final__{a}__s{k}' for a in list(study_v2.ARMS) + ['baselines']
             for k in range(4)} | {
                 f'imbalance__{a}__{rule}__s{k}' for a in ('ntxent', 'cacr_k1')
                 for rule in ('linear', 'exponential') for k in range(4)}
  not_done = re.search(r'Not done \((\d+), in the driver\'s order\): '
                       r'([^.]*)\.', text)
  missing = planned - set(done)
  closed = re.search(r'Closed with runs not made \((.*?)\): the claims', text)
  if missing:
    assert int(not_done.group(1)) == len(missing)
    assert set(not_done.group(2).split(', ')) == missing
  else:
    assert not_done is None and '(complete).' in text

  def diffs(terms, m):
    cols = [acc.get((a, rule, m), {}) for _, a, rule in terms]
    seeds = sorted(set.intersection(*(set(c) for c in cols)))
    return np.array([sum(s * c[k] for (s, _, _), c in zip(terms, cols))
                     for k in seeds])

  def ci(d):
    # The mean summed in seed order, as the report's; the half-width from
    # scipy's t quantile.
    mean = sum(d) / len(d)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return mean, mean - half, mean + half

  def interval(d):
    return '{:+.2f} [{:+.2f}, {:+.2f}]'.format(*ci(d))

  def gain(arm, m):
    return diffs([(1, arm, ''), (-1, 'baselines', '')], m)

  # Gains over the same seed's random-init encoder.
  gain_part = text.split('## Gain over the random-init encoder')[1].split(
      '\n## ')[0]
  gain_rows = [l.split(' | ') for l in gain_part.splitlines()
               if l.startswith('| ') and not l.startswith('| arm')]
  assert len(gain_rows) == 14
  for row in gain_rows:
    arm, m, cell, n = row[0][2:], row[1], row[2], int(row[3].rstrip(' |'))
    d = gain(arm, m)
    assert n == len(d), row
    want = ('-' if len(d) == 0 else f'{d[0]:+.2f} (n=1)' if len(d) == 1
            else interval(d))
    assert cell == want, row
  # Accuracy by arm: mean and sample sd over the done seeds, numpy's.
  acc_part = text.split('## Accuracy by arm (test split)')[1].split(
      '\n## ')[0]
  acc_rows = [l.split(' | ') for l in acc_part.splitlines()
              if l.startswith('| ') and not l.startswith('| arm')]
  assert [r[0][2:] for r in acc_rows] == list(study_v2.ARMS) + [
      'random init', 'raw pixels']

  def mean_sd(by_seed):
    # The mean summed in seed order, as the report's; the sd numpy's.
    v = np.array([by_seed[k] for k in sorted(by_seed)])
    mean = sum(v) / max(len(v), 1)
    return ('-' if len(v) == 0 else f'{mean:.2f}' if len(v) == 1 else
            f'{mean:.2f} ± {v.std(ddof=1):.2f}')

  for row in acc_rows:
    name = row[0][2:]
    got = by_arm.get(name, {'knn': {}, 'linear': {}})
    assert row[2] == mean_sd(got['knn']), row
    assert row[3] == mean_sd(got['linear']), row
    assert int(row[4].rstrip(' |')) == len(got['knn']), row
    if name in settings:
      assert row[1] == settings[name], row
  # Imbalance runs: both banks' accuracies, and the drop from the same
  # seed's balanced-data run, paired.
  imb_part = text.split('## Imbalance runs (test split)')[1].split(
      '\n## ')[0]
  imb_rows = [l.split(' | ') for l in imb_part.splitlines()
              if l.startswith('| ') and not l.startswith('| arm')]
  assert [(r[0][2:], r[1]) for r in imb_rows] == [
      (a, rule) for rule in ('linear', 'exponential')
      for a in ('ntxent', 'cacr_k1')]
  for row in imb_rows:
    arm, rule = row[0][2:], row[1]
    got = [mean_sd(imb.get((arm, rule, bank, m), {}))
           for bank in ('balanced', 'imbalanced') for m in ('knn', 'linear')]
    assert [row[2], row[3], row[4], row[5]] == [got[0], got[1], got[2],
                                                 got[3]], row
    for cell, m in ((row[6], 'knn'), (row[7], 'linear')):
      d = diffs([(1, arm, ''), (-1, arm, rule)], m)
      assert cell == ('-' if len(d) == 0 else f'{d[0]:+.2f} (n=1)'
                      if len(d) == 1 else interval(d)), row
    assert int(row[8].rstrip(' |')) == len(
        imb.get((arm, rule, 'balanced', 'knn'), {})), row
  # Claims. A claim is judged once 4 seeds have its contrast and every arm's
  # random-init run; Holm's family is the 14 tests, the others at p = 1.
  claim_part = text.split('## Claims')[1].split('\n## ')[0]
  rows = [l.split(' | ') for l in claim_part.splitlines()
          if re.match(r'\| C\d ', l)]
  assert len(rows) == 14
  judged, p, p_tost = [], [], []
  for row in rows:
    cid, m, n = row[0][2:4], row[1], int(row[3])
    d = diffs(_V2_CLAIMS[cid], m)
    assert n == len(d), row
    arms = sorted({a for _, a, _ in _V2_CLAIMS[cid]})
    # Each arm's gain over random init beside the claim (Sec. 7).
    want_gains = []
    for a in arms:
      g = gain(a, m)
      want_gains.append(f'{a} ' + ('-' if len(g) == 0 else
                                   f'{g[0]:+.2f} (n=1)' if len(g) == 1
                                   else interval(g)))
    assert row[8].rstrip(' |') == '; '.join(want_gains), row
    ready = min([len(d)] + [len(gain(a, m)) for a in arms])
    if ready < 4:
      assert row[2] == '-' and row[4] == row[5] == row[7] == '-'
      if closed:
        want = f'untestable here: {ready} of 4 seeds made ({closed.group(1)})'
      else:
        # "not run yet" until a run of the claim's own stage is done (an
        # imbalance claim's imbalance runs; the final runs otherwise).
        own = ([(a, rule) for _, a, rule in _V2_CLAIMS[cid] if rule] or
               [(a, rule) for _, a, rule in _V2_CLAIMS[cid]])
        started = any(acc.get((a, rule, m)) for a, rule in own)
        want = ('not run yet' if not started else
                f'pending: {ready} of 4 seeds complete')
      assert row[6] == want, row
      p.append(1.)
      p_tost.append(1.)
      judged.append(None)
      continue
    assert row[2] == interval(d), row
    p.append(stats.ttest_1samp(d, 0).pvalue)
    p_tost.append(max(
        stats.ttest_1samp(d, -1., alternative='greater').pvalue,
        stats.ttest_1samp(d, 1., alternative='less').pvalue))
    flat = [a for a in arms if not ci(gain(a, m))[1] > 0]
    judged.append((row, d, flat))

  def holm(p):
    p = np.asarray(p)
    order = np.argsort(p, kind='stable')
    adj = np.minimum(1, np.maximum.accumulate(p[order] * (len(p) -
                                                          np.arange(len(p)))))
    out = np.empty_like(adj)
    out[order] = adj
    return out

  for j, pi, ph, pth in zip(judged, p, holm(p), holm(p_tost)):
    if j is None:
      continue
    row, d, flat = j
    assert row[4] == reproduce._p(pi) and row[5] == reproduce._p(ph), row  # pylint: disable=protected-access
    if flat:
      want = 'untestable here: ' + ', '.join(flat) + ' not above random init'
    elif ph < 0.05:
      want = 'supported' if sum(d) > 0 else 'contradicted'
    else:
      want = 'inconclusive'
    assert row[6] == want, row
    label = ('untestable here' if flat else 'equivalent within ±1.0'
             if pth < 0.05 else 'not shown equivalent')
    assert row[7] == f'{reproduce._p(pth)} ({label})', row  # pylint: disable=protected-access


def _write_v2_study(tmp_path, skip=(), unscored=()):
  """A synthetic study v2 (`_v2_values_moco_at_random_init`: moco_v2 at the
  random-init level) written as run records into tmp_path/results, less the
  runs in `skip`; the imbalance runs in `unscored` lack their balanced-bank
  scores. Returns the results directory."""
  vals = _v2_values_moco_at_random_init(np.random.default_rng(3), 0.01)
  results = tmp_path / 'results'
  results.mkdir()
  for rec in _v2_records(vals):
    rec['run_id'] = '__'.join(x for x in (rec['stage'], rec['arm'],
                                          rec['tag'], f's{rec["seed"]}') if x)
    if rec['run_id'] in skip:
      continue
    if rec['run_id'] in unscored:
      del rec['test_balanced']
    rec['steps'], rec['invocations'] = 1170, []
    (results / (rec['run_id'] + '.json')).write_text(json.dumps(rec))
  return str(results)


def test_study_v2_closed_study_marks_claims_missing_runs_untestable(
    tmp_path):
  # A study stopped with runs not made (PROTOCOL.md Sec. 6): the claims
  # missing a run are "untestable here" with the reason, the report lists
  # the runs, and the complete claims keep their verdicts.
  from benchmarks.study_v2 import analysis
  results = _write_v2_study(tmp_path, skip=('final__cmc__s3',
                                            'imbalance__cacr_k1__linear__s2'))
  text = analysis.write_report(results, str(tmp_path / 'REPORT.md'),
                               tag_commit=None, closed='CPU budget spent')
  assert ('Closed with runs not made (CPU budget spent): the claims that '
          'need them are untestable here. Not done (2, in the driver\'s '
          'order): final__cmc__s3, imbalance__cacr_k1__linear__s2.') in text
  verdicts = {tuple(l.split(' | ')[i] for i in (0, 1)): l.split(' | ')[6]
              for l in text.splitlines() if re.match(r'\| C\d ', l)}
  for metric in ('knn', 'linear'):
    assert verdicts[('| C5 CMC > SimCLR (two views)', metric)] == (
        'untestable here: 3 of 4 seeds made (CPU budget spent)')
    c6 = next(v for k, v in verdicts.items()
              if k[0].startswith('| C6 ') and k[1] == metric)
    assert c6 == 'untestable here: 3 of 4 seeds made (CPU budget spent)'
    c4 = next(v for k, v in verdicts.items()
              if k[0].startswith('| C4 ') and k[1] == metric)
    assert c4 == 'untestable here: moco_v2 not above random init'
  _check_v2_report(str(tmp_path))


def test_study_v2_imbalance_run_without_balanced_scores_is_not_counted(
    tmp_path):
  # A driver stopped during an imbalance run's balanced evaluation records
  # the run done without 'test_balanced': the report does not count it,
  # says so, and its claims wait for that seed.
  from benchmarks.study_v2 import analysis
  results = _write_v2_study(tmp_path,
                            unscored=('imbalance__ntxent__linear__s1',))
  text = analysis.write_report(results, str(tmp_path / 'REPORT.md'),
                               tag_commit=None)
  assert 'imbalance 15 of 16' in text
  assert ('Recorded done without their balanced evaluation, so not counted '
          '(rerun it, benchmarks/study_v2/README.md): '
          'imbalance__ntxent__linear__s1.') in text
  assert '| imbalance__ntxent__linear__s1 | done, no balanced evaluation |' \
      in text
  c6 = [l for l in text.splitlines() if l.startswith('| C6 ')]
  assert all(' | pending: 3 of 4 seeds complete | ' in l for l in c6), c6
  _check_v2_report(str(tmp_path))


def test_study_v2_committed_report_recomputes_from_the_records():
  _check_v2_report(os.path.join(ROOT, 'benchmarks', 'study_v2'))


def test_study_v2_report_check_reads_a_complete_study(tmp_path):
  # A complete synthetic study (4 seeds of every arm, the baselines and
  # the imbalance runs): the report analysis.py writes passes the check,
  # and one changed digit in it fails.
  from benchmarks.study_v2 import analysis
  # moco_v2 at the random-init level: C4 is untestable (Amendment 3).
  results = _write_v2_study(tmp_path)
  report = str(tmp_path / 'REPORT.md')
  text = analysis.write_report(results, report, tag_commit=None)
  assert 'final 32 of 32, imbalance 16 of 16 (complete)' in text
  assert '| untestable here: moco_v2 not above random init |' in text
  _check_v2_report(str(tmp_path))
  row = next(l for l in text.splitlines() if l.startswith('| C3 '))
  cell = row.split(' | ')[2]
  changed = cell[:-2] + str((int(cell[-2]) + 1) % 10) + cell[-1]
  with open(report, 'w') as f:
    f.write(text.replace(row, row.replace(cell, changed)))
  with pytest.raises(AssertionError):
    _check_v2_report(str(tmp_path))
  # A verdict changed, every number kept.
  verdict = row.split(' | ')[6]
  assert verdict in ('supported', 'inconclusive', 'contradicted'), row
  other = 'inconclusive' if verdict != 'inconclusive' else 'supported'
  with open(report, 'w') as f:
    f.write(text.replace(row, row.replace(f' | {verdict} | ',
                                          f' | {other} | ')))
  with pytest.raises(AssertionError):
    _check_v2_report(str(tmp_path))
  # One digit of an imbalance run's drop changed.
  row = next(l for l in text.splitlines()
             if l.startswith('| cacr_k1 | exponential | '))
  cell = row.split(' | ')[6]
  changed = cell[:1] + str((int(cell[1]) + 1) % 10) + cell[2:]
  with open(report, 'w') as f:
    f.write(text.replace(row, row.replace(f' | {cell} | ',
                                          f' | {changed} | ')))
  with pytest.raises(AssertionError):
    _check_v2_report(str(tmp_path))
  # One digit of an arm's mean accuracy changed.
  row = next(l for l in text.splitlines() if l.startswith('| macl | '))
  cell = row.split(' | ')[2]
  changed = str((int(cell[0]) + 1) % 10) + cell[1:]
  with open(report, 'w') as f:
    f.write(text.replace(row, row.replace(f' | {cell} | ',
                                          f' | {changed} | ')))
  with pytest.raises(AssertionError):
    _check_v2_report(str(tmp_path))
