"""The studies (studies/): the statistics, study v1's report against its
records, and study v2's driver, analysis and report (regenerated from its
records, byte for byte)."""

import collections
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from contrastive_jax import config_lib

from studies import stats as study_stats
from studies.v2 import analysis
from studies.v2 import study as study_v2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V1 = os.path.join(ROOT, 'studies', 'v1')
V2 = os.path.join(ROOT, 'studies', 'v2')


# ------------------------------------------------------------ statistics ---

def test_cell_statistics_match_numpy():
  vals = [81.2, 83.5, 82.0]
  cell = study_stats.Cell(vals)
  assert cell.n == 3
  assert cell.mean == pytest.approx(np.mean(vals))
  assert cell.std == pytest.approx(np.std(vals, ddof=1))
  assert math.isnan(study_stats.Cell([1.]).std)
  assert math.isnan(study_stats.Cell([]).mean)


def test_paired_statistics_and_holm_match_hand_computation():
  # Differences 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 2 sqrt 3 on
  # 2 df. For 2 df the two-sided p has a closed form, 1 - |t| / sqrt(t^2 + 2)
  # = 1 - sqrt(12 / 14); t_0.975(2) = 4.302653 (tables).
  st = study_stats.Paired((1., 2., 3.))
  assert st.n == 3 and st.mean == pytest.approx(2.)
  assert st.se() == pytest.approx(1 / math.sqrt(3))
  assert st.p == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-6)
  half = 4.302653 / math.sqrt(3)
  assert st.ci == pytest.approx((2 - half, 2 + half), rel=1e-6)
  assert st.fmt() == '+2.00 [-0.48, +4.48]'
  one = study_stats.Paired((0.5,))
  assert math.isnan(one.p) and math.isnan(one.ci[0]) and one.fmt() == (
      '+0.50 (n=1)')
  assert study_stats.Paired(()).fmt() == '-'
  # Equal differences: no spread, p 0 (or 1 for a zero mean).
  assert study_stats.Paired((0.3, 0.3)).p == 0.
  assert study_stats.Paired((0., 0.)).p == 1.
  # Holm: sorted 0.005, 0.01, 0.03, 0.04 -> 4x, 3x, 2x, 1x = 0.02, 0.03,
  # 0.06, 0.04, then the running maximum: 0.02, 0.03, 0.06, 0.06.
  assert study_stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx(
      [0.03, 0.06, 0.06, 0.02])
  # Capped at 1; nan stays out of the family (m = 2 here).
  adj = study_stats.holm([0.6, 0.5, math.nan])
  assert adj[:2] == pytest.approx([1., 1.]) and math.isnan(adj[2])
  assert study_stats.holm([0.02, math.nan, 0.04]) == pytest.approx(
      [0.04, math.nan, 0.04], nan_ok=True)


@pytest.mark.parametrize('mean, p_adj, want', [
    (0.7, 0.01, 'supported'), (-0.8, 0.01, 'contradicted'),
    (0.7, 0.2, 'inconclusive'), (-0.8, 0.06, 'inconclusive'),
    (0.7, math.nan, 'not run yet (fewer than 2 seeds)'),
])
def test_verdicts(mean, p_adj, want):
  assert study_stats.verdict(mean, p_adj) == want


def test_p_values_print_as_the_reports_do():
  assert [study_stats.fmt_p(p) for p in (math.nan, 0.0534, 0.001, 1.2e-4)
          ] == ['-', '0.053', '0.001', '1.2e-04']


# ------------------------------------------- study v1: report vs records ---

def _v1_records():
  out = {}
  for name in os.listdir(os.path.join(V1, 'results')):
    with open(os.path.join(V1, 'results', name)) as f:
      rec = json.load(f)
    out[rec['run_id']] = rec
  return out


def _fmt_p(p):
  # Written out here, not read from studies.stats.
  return '-' if math.isnan(p) else (f'{p:.3f}' if p >= 0.001 else f'{p:.1e}')


def test_v1_report_claims_recomputed_from_its_records():
  """Study v1's 16 tested comparisons (its runner is gone): each row of
  studies/v1/REPORT.md recomputed from the JSONs with scipy.stats.ttest_rel,
  the t interval on 2 df and Holm over the 16."""
  from scipy import stats as sps
  res = _v1_records()
  def acc(variant, method, seed, metric):
    return 100 * res[f'{variant}__{method}__s{seed}']['test']['trained'][
        metric]
  diffs = {}
  for a, b in [('cacr_k4', 'cmc_k4'), ('cmc_k4', 'simclr'),
               ('cacr_k1', 'simclr'), ('macl', 'ntxent_t0.1'),
               ('macl', 'dcl'), ('cacr_moco', 'moco_v2')]:
    for metric in ('knn', 'linear'):
      diffs[(f'{a} (regular) > {b} (regular)', metric)] = np.array(
          [acc('regular', a, s, metric) - acc('regular', b, s, metric)
           for s in (0, 1, 2)])
  for rule in ('linear', 'exponential'):
    for metric in ('knn', 'linear'):
      drop = lambda m: np.array([acc('regular', m, s, metric) -
                                 acc(rule, m, s, metric) for s in (0, 1, 2)])
      diffs[(f'{rule}: SimCLR drop > CACR drop', metric)] = (
          drop('simclr') - drop('cacr_k1'))
  keys = list(diffs)
  p = np.array([sps.ttest_1samp(diffs[k], 0).pvalue for k in keys])
  order = np.argsort(p)
  adj = np.empty_like(p)
  adj[order] = np.minimum(1, np.maximum.accumulate(
      p[order] * (len(p) - np.arange(len(p)))))
  with open(os.path.join(V1, 'REPORT.md'), encoding='utf-8') as f:
    report = f.read()
  assert len(keys) == 16
  for k, pi, ph in zip(keys, p, adj):
    d = diffs[k]
    half = sps.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    want = ('inconclusive' if ph >= 0.05 else
            'supported' if d.mean() > 0 else 'contradicted')
    row = (f'| {k[0]} | {k[1]} | {d.mean():+.2f} [{d.mean() - half:+.2f}, '
           f'{d.mean() + half:+.2f}] | 3 | {_fmt_p(pi)} | {_fmt_p(ph)} | '
           f'{want} |')
    assert row in report, row


def test_v1_report_accuracies_recomputed_from_its_records():
  """Study v1's accuracy table (the configs' docstrings quote it): every
  method's mean ± sample sd over its 3 seeds, from the JSONs."""
  cells = collections.defaultdict(list)
  for rec in sorted(_v1_records().values(), key=lambda r: r['seed']):
    if rec['variant'] in ('recipe', 'baselines'):
      continue
    cells[(rec['variant'], rec['method'])].append(
        [100 * rec['test']['trained'][m] for m in ('knn', 'linear')])
  with open(os.path.join(V1, 'REPORT.md'), encoding='utf-8') as f:
    report = f.read()
  assert len(cells) == 22
  for (variant, method), v in cells.items():
    v = np.array(v)
    assert len(v) == 3, (variant, method)
    want = f'| {variant} | {method} | ' + ' | '.join(
        f'{v[:, i].mean():.2f} ± {v[:, i].std(ddof=1):.2f} (n=3)'
        for i in (0, 1)) + ' |'
    assert want in report, want


# ---------------------------------------------- study v2: run options ---

def test_train_examples_follow_cacr_rules():
  assert study_v2.train_examples('none') == 50_000
  assert study_v2.train_examples('linear') == 27_500
  assert study_v2.train_examples('exponential') == 7_904


def test_flag_values_and_todays_option_names():
  assert study_v2.flag_value((0, 1)) == '(0,1)'
  assert study_v2.flag_value(({'crop_scale': (0.08, 1.0)},)) == (
      "({'crop_scale': (0.08, 1.0)},)")
  assert study_v2.flag_value(0.5) == '0.5'
  assert study_v2.current_options([
      ('online.knn_every_steps', 0), ('eval.linear_max_iter', 0),
      ('online.knn_k', 200), ('online.knn_bank_size', 50_000),
      ('seed', 3)]) == [
          ('evals.online_knn.every_steps', -1),
          ('evals.linear.every_steps', -1), ('evals.online_knn.ks', (200,)),
          ('evals.online_knn.bank_size', 50_000), ('seed', 3)]
  # num_epochs that train.py turns into exactly the steps asked for.
  for steps, examples in ((780, 50_000), (780, 7_904), (1, 50_000)):
    epochs = study_v2.epochs_for_steps(steps, examples, 256)
    assert int(epochs * (examples // 256)) == steps


def _set_options(config, options) -> None:
  """Sets a run's (key, value) options on `config`, in today's names, as
  main.py's flags would."""
  for key, value in study_v2.current_options(options):
    node = config
    *path, leaf = key.split('.')
    for p in path:
      node = node[p]
    node[leaf] = value


def test_watchdog_kills_a_silent_run_and_spares_a_progressing_one(tmp_path):
  """A child that stops writing to its workdir is killed after the stall
  time; one that keeps writing runs to its own end (exit 0)."""
  silent = subprocess.Popen([sys.executable, '-c', 'import time; '
                             'time.sleep(60)'])
  t0 = time.time()
  rc = study_v2._watch(silent, str(tmp_path), 2., lambda: None,  # pylint: disable=protected-access
                       log=lambda s: None)
  assert rc != 0 and time.time() - t0 < 30
  busy_dir = tmp_path / 'busy'
  busy_dir.mkdir()
  code = ('import time, pathlib\n'
          f'p = pathlib.Path({str(busy_dir)!r}) / "log"\n'
          'for i in range(6):\n'
          '  p.write_text(str(i)); time.sleep(1)\n')
  busy = subprocess.Popen([sys.executable, '-c', code])
  assert study_v2._watch(busy, str(busy_dir), 2.5, lambda: None,  # pylint: disable=protected-access
                         log=lambda s: None) == 0


# ------------------------------------------------ study v2: frozen code ---

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
      steps = int(o['num_epochs'] * (study_v2.train_examples(
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
    assert row[4] == study_stats.fmt_p(pi), row
    assert row[5] == study_stats.fmt_p(ph), row
    if flat:
      want = 'untestable here: ' + ', '.join(flat) + ' not above random init'
    elif ph < 0.05:
      want = 'supported' if sum(d) > 0 else 'contradicted'
    else:
      want = 'inconclusive'
    assert row[6] == want, row
    label = ('untestable here' if flat else 'equivalent within ±1.0'
             if pth < 0.05 else 'not shown equivalent')
    assert row[7] == f'{study_stats.fmt_p(pth)} ({label})', row


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
  results = _write_v2_study(tmp_path,
                            unscored=('imbalance__ntxent__linear__s1',))
  text = analysis.write_report(results, str(tmp_path / 'REPORT.md'),
                               tag_commit=None)
  assert 'imbalance 15 of 16' in text
  assert ('Recorded done without their balanced evaluation, so not counted '
          '(rerun it, studies/v2/README.md): '
          'imbalance__ntxent__linear__s1.') in text
  assert '| imbalance__ntxent__linear__s1 | done, no balanced evaluation |' \
      in text
  c6 = [l for l in text.splitlines() if l.startswith('| C6 ')]
  assert all(' | pending: 3 of 4 seeds complete | ' in l for l in c6), c6
  _check_v2_report(str(tmp_path))


def test_study_v2_committed_report_recomputes_from_the_records():
  _check_v2_report(os.path.join(ROOT, 'studies', 'v2'))


def test_study_v2_report_check_reads_a_complete_study(tmp_path):
  # A complete synthetic study (4 seeds of every arm, the baselines and
  # the imbalance runs): the report analysis.py writes passes the check,
  # and one changed digit in it fails.
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


def test_study_v2_committed_report_regenerates_byte_for_byte(tmp_path,
                                                              monkeypatch):
  """`python -m studies.v2.analysis` on the committed records writes the
  committed REPORT.md, given its date and the tags' commits (this checkout
  may have no tags: they are the first pilot's and the recipe stage's
  `study_commit`)."""
  with open(os.path.join(V2, 'REPORT.md'), encoding='utf-8') as f:
    committed = f.read()
  stamp = re.search(r' on (\d{4}-\d\d-\d\d \d\d:\d\d); do not edit',
                    committed).group(1)
  strftime = time.strftime
  monkeypatch.setattr(time, 'strftime', lambda fmt, *a: (
      stamp if fmt == '%Y-%m-%d %H:%M' and not a else strftime(fmt, *a)))
  results = os.path.join(V2, 'results')
  def commit(run_id):
    with open(os.path.join(results, run_id + '.json')) as f:
      return json.load(f)['study_commit']
  out = str(tmp_path / 'REPORT.md')
  text = analysis.write_report(
      results, out, tag_commit=commit('recipe__baselines__s0'),
      first_tag_commit=commit('pilot__ntxent__s0'))
  assert text == committed
  with open(out, 'rb') as f, open(os.path.join(V2, 'REPORT.md'), 'rb') as g:
    assert f.read() == g.read()
