r"""Study v2's analysis, as PROTOCOL.md Sec. 7 fixes it, and its report.

    python -m studies.v2.analysis

writes studies/v2/REPORT.md from the run records in studies/v2/results/
(nothing else), in this order: the budget statement; each claim's per-seed
contrast, paired t-test (n - 1 df), 95% CI, Holm over the family, verdict
and equivalence test (TOST, +-`EQUIVALENCE_MARGIN`); each arm's test
accuracy over its seeds; the imbalance runs with both banks and their
drops; each arm's gain over the same seed's random-init encoder; then the
stages that fixed the setting (the shared recipe, the budget pilots, the
tuning) and every run's invocations.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

from studies import stats as study_stats
from studies.v2 import study

REPORT = os.path.join(study.ROOT, 'studies', 'v2', 'REPORT.md')
METRICS = ('knn', 'linear')
ALPHA = 0.05
EQUIVALENCE_MARGIN = 1.0
# PROTOCOL.md Sec. 6: a claim is tested once all its seeds are in.
PLANNED_SEEDS = len(study.SEEDS)
# Steps of one epoch of the 50,000 training images, as the driver counts.
STEPS_PER_EPOCH = study._steps(1)  # pylint: disable=protected-access
# The first tag: the first budget pilot ran at it (PROTOCOL.md Amendment 1
# moved every later run to study.STUDY_TAG).
FIRST_TAG = 'study-v2'

# (id, claim, terms): a term is (sign, (stage, arm, rule)); rule '' is the
# final (balanced) run, read on 'test'; a rule reads the imbalance run's
# balanced-bank scores, 'test_balanced'.
CLAIMS = [
    ('C1', 'MACL > NT-Xent', ((1, ('macl', '')), (-1, ('ntxent', '')))),
    ('C2', 'MACL > DCL', ((1, ('macl', '')), (-1, ('dcl', '')))),
    ('C3', 'CACR (K=1) > SimCLR', ((1, ('cacr_k1', '')),
                                   (-1, ('ntxent', '')))),
    ('C4', 'CACR-MoCo > MoCo v2 (equal query views)',
     ((1, ('cacr_moco', '')), (-1, ('moco_v2', '')))),
    ('C5', 'CMC > SimCLR (two views)', ((1, ('cmc', '')),
                                        (-1, ('ntxent', '')))),
] + [
    (cid, f'CACR (K=1) degrades less than SimCLR, {rule} imbalance '
     '(drop = balanced-data run - imbalanced run, balanced bank)',
     ((1, ('ntxent', '')), (-1, ('ntxent', rule)),
      (-1, ('cacr_k1', '')), (1, ('cacr_k1', rule))))
    for cid, rule in (('C6', 'linear'), ('C7', 'exponential'))]


def _scores(rec: dict | None, split: str, encoder: str) -> dict:
  """A record's `{metric: accuracy}` for one split ('validation', 'test',
  'test_balanced') and encoder ('trained', 'random_init'); empty where the
  record, the split or the encoder is missing."""
  return ((rec or {}).get(split) or {}).get(encoder) or {}


def is_done(rec: dict) -> bool:
  """A finished run with every score the analysis reads: an imbalance run
  also needs its balanced-bank scores (a driver stopped during its
  balanced evaluation records the run done without them)."""
  if rec.get('status') != 'done':
    return False
  if rec['stage'] == 'imbalance':
    scores = _scores(rec, 'test_balanced', 'trained')
    return all(scores.get(m) is not None for m in METRICS)
  return True


def per_seed(records: list[dict]) -> dict[tuple[str, str, str], dict]:
  """(arm, rule, metric) -> {seed: accuracy %} of the finished final and
  imbalance runs; ('baselines', '', metric) is the random-init encoder."""
  out: dict = {}
  for rec in records:
    if not is_done(rec) or rec['stage'] not in ('final', 'imbalance'):
      continue
    if rec['stage'] == 'imbalance':
      scores, rule = _scores(rec, 'test_balanced', 'trained'), rec['tag']
    elif rec['arm'] == 'baselines':
      scores, rule = _scores(rec, 'test', 'random_init'), ''
    else:
      scores, rule = _scores(rec, 'test', 'trained'), ''
    for metric in METRICS:
      if scores.get(metric) is not None:
        out.setdefault((rec['arm'], rule, metric), {})[rec['seed']] = (
            100 * scores[metric])
  return out


def contrast(data: dict, terms, metric: str) -> tuple[float, ...]:
  cols = [data.get((arm, rule, metric), {}) for _, (arm, rule) in terms]
  seeds = sorted(set.intersection(*(set(c) for c in cols)))
  return tuple(sum(s * c[seed] for (s, _), c in zip(terms, cols))
               for seed in seeds)


def tost_p(diffs, margin: float = EQUIVALENCE_MARGIN) -> float:
  """Two one-sided t-tests of |mean| < margin (n - 1 df): the larger p."""
  st = study_stats.Paired(tuple(diffs))
  if st.n < 2:
    return math.nan
  from scipy import stats  # pylint: disable=g-import-not-at-top
  se = st.se()
  if se == 0:
    return 0. if abs(st.mean) < margin else 1.
  lower = stats.t.sf((st.mean + margin) / se, st.n - 1)   # H0: mean <= -m
  upper = stats.t.cdf((st.mean - margin) / se, st.n - 1)  # H0: mean >= m
  return float(max(lower, upper))


@dataclasses.dataclass(frozen=True)
class Row:
  cid: str
  claim: str
  metric: str
  stats: study_stats.Paired
  p_holm: float
  verdict: str
  p_tost: float
  p_tost_holm: float


def gain(data: dict, arm: str, metric: str) -> study_stats.Paired:
  """`arm`'s balanced final runs minus the same seeds' random-init
  encoder, in accuracy points."""
  return study_stats.Paired(contrast(
      data, ((1, (arm, '')), (-1, ('baselines', ''))), metric))


def at_random_init(data: dict, terms, metric: str) -> list[str]:
  """The claim's arms whose gain over random init is not shown above 0
  (its paired 95% CI does not lie above 0; PROTOCOL.md Amendment 3)."""
  arms = sorted({arm for _, (arm, _) in terms})
  return [arm for arm in arms
          if not gain(data, arm, metric).ci[0] > 0]


def seeds_in(data: dict, terms, metric: str) -> int:
  """Seeds a claim can be judged on: those of its contrast that also have
  every arm's random-init run (Amendment 3 reads each arm's gain)."""
  arms = {arm for _, (arm, _) in terms}
  return min([len(contrast(data, terms, metric))] +
             [gain(data, arm, metric).n for arm in arms])


def claim_rows(records: list[dict], closed: str | None = None) -> list[Row]:
  """One row per claim and metric. Holm's family is always the 14 tests
  (Sec. 7): a test whose claim has fewer than PLANNED_SEEDS seeds in
  (`seeds_in`) enters it with p = 1, and its row has no verdict. Holm's
  adjusted p values only fall as those p values arrive, so a complete
  claim's "supported" or "contradicted" holds as the study finishes; an
  "inconclusive" may still change. With `closed` (the study stopped with
  runs not made, and why), such a row's verdict is "untestable here"
  (Sec. 6 and 7)."""
  data = per_seed(records)
  keys = [(cid, claim, terms, m) for cid, claim, terms in CLAIMS
          for m in METRICS]
  st = [study_stats.Paired(contrast(data, terms, m)) for _, _, terms, m in keys]
  ready = [seeds_in(data, terms, m) for _, _, terms, m in keys]
  complete = [k >= PLANNED_SEEDS for k in ready]
  holm = study_stats.holm([s.p if c else 1. for s, c in zip(st, complete)])
  tost = [tost_p(s.diffs) if c else 1. for s, c in zip(st, complete)]
  tost_holm = study_stats.holm(tost)
  rows = []
  for (cid, claim, terms, m), s, k, c, ph, pt, pth in zip(
      keys, st, ready, complete, holm, tost, tost_holm):
    # Started: any run of the claim's own stage (its imbalance runs, for an
    # imbalance claim) has finished.
    own = [t for _, t in terms if t[1]] or [t for _, t in terms]
    started = any(data.get((arm, rule, m)) for arm, rule in own)
    if not c:
      if closed:
        verdict = (f'untestable here: {k} of {PLANNED_SEEDS} seeds made '
                   f'({closed})')
      else:
        verdict = ('not run yet' if not started else
                   f'pending: {k} of {PLANNED_SEEDS} seeds complete')
      rows.append(Row(cid, claim, m, s, math.nan, verdict, math.nan,
                      math.nan))
      continue
    flat = at_random_init(data, terms, m)
    if flat:
      verdict = ('untestable here: ' + ', '.join(flat) +
                 ' not above random init')
    else:
      verdict = study_stats.verdict(s.mean, ph)
    rows.append(Row(cid, claim, m, s, ph, verdict, pt, pth))
  return rows


def accuracy_rows(records: list[dict]) -> list[tuple[str, str, dict]]:
  """(row, setting, {metric: [% per seed, in seed order]}) of the finished
  final runs on the test split: each arm's trained encoder at its chosen
  value, then the random-init encoder and raw pixels (the baselines runs)."""
  finals = sorted((r for r in records if r.get('status') == 'done'
                   and r['stage'] == 'final'), key=lambda r: r['seed'])
  rows = []
  for arm, (config, own, key, _) in study.ARMS.items():
    runs = [r for r in finals if r['arm'] == arm]
    setting = ', '.join(
        [f'configs/{config}.py'] + [f'{k} {v}' for k, v in own.items()] +
        ([f'{key.split(".")[-1]} {runs[0]["overrides"][key]}'] if runs
         else []))
    rows.append((arm, setting, {m: [100 * r['test']['trained'][m]
                                    for r in runs] for m in METRICS}))
  base = [r for r in finals if r['arm'] == 'baselines']
  for name, rep in (('random init', 'random_init'),
                    ('raw pixels', 'raw_pixels')):
    rows.append((name, 'the same seeds\' initial encoder' if rep ==
                 'random_init' else 'flattened images',
                 {m: [100 * r['test'][rep][m] for r in base]
                  for m in METRICS}))
  return rows


def imbalance_rows(records: list[dict]) -> list[tuple[str, str, dict]]:
  """(arm, rule, cells) of the imbalance runs: per metric, the test accuracy
  (% per seed, in seed order) with the balanced bank and probe ('balanced',
  what C6 and C7 read) and with the run's own imbalanced ones
  ('imbalanced', reported beside), and the drop from the same seeds'
  balanced-data final run (balanced bank; a `studies.stats.Paired`)."""
  data = per_seed(records)
  runs = sorted((r for r in records if is_done(r)
                 and r['stage'] == 'imbalance'), key=lambda r: r['seed'])
  rows = []
  for rule in study.IMBALANCE_RULES:
    for arm in study.IMBALANCED_ARMS:
      mine = [r for r in runs if r['arm'] == arm and r['tag'] == rule]
      cells = {}
      for m in METRICS:
        cells[m] = {
            'balanced': [100 * r['test_balanced']['trained'][m]
                         for r in mine],
            'imbalanced': [100 * r['test']['trained'][m] for r in mine],
            'drop': study_stats.Paired(contrast(
                data, ((1, (arm, '')), (-1, (arm, rule))), m))}
      rows.append((arm, rule, cells))
  return rows


def _mean_sd(values: list[float]) -> str:
  """'mean ± sample sd' of the seeds' accuracies (`studies.stats.Cell`, whose
  seed count the tables give in a column of their own); '-' with none."""
  cell = study_stats.Cell(values)
  if not cell.n:
    return '-'
  return f'{cell.mean:.2f}' if cell.n == 1 else (
      f'{cell.mean:.2f} ± {cell.std:.2f}')


def gains(records: list[dict]) -> list[tuple[str, str, study_stats.Paired]]:
  data = per_seed(records)
  return [(arm, m, gain(data, arm, m)) for arm in study.ARMS
          for m in METRICS]


def _epochs(records: list[dict], stage: str) -> int | None:
  """The budget the balanced runs of `stage` ('tune' or 'final') ran at,
  in epochs of the 50,000 images (a finished record's steps); None before
  any finished."""
  for rec in records:
    if (rec['stage'] == stage and rec.get('status') == 'done' and
        rec['arm'] != 'baselines'):
      return round(rec['steps'] / STEPS_PER_EPOCH)
  return None


def tune_table(results_dir: str, epochs: int, recipe) -> str:
  """The tuning runs (validation split) and each arm's chosen value."""
  try:
    chosen = study.chosen_values(results_dir, epochs, recipe)
  except study.StudyError:
    chosen = {}
  fmt = lambda x: '-' if x is None else f'{100 * x:.2f}'
  lines = [f'Seed 0, {epochs} epochs, validation split, weighted kNN (k = '
           '200) / linear probe, %; chosen: the highest validation kNN '
           '(PROTOCOL.md Sec. 5).', '',
           '| arm | value | kNN | linear | chosen |', '|---|---|---|---|---|']
  for run in study.tune_runs(epochs, recipe):
    rec = study.load_record(results_dir, run) or {}
    score = (_scores(rec, 'validation', 'trained')
             if rec.get('status') == 'done' else {})
    value = dict(run.overrides)[study.ARMS[run.arm][2]]
    mark = 'yes' if chosen.get(run.arm) == value else ''
    lines.append(f'| {run.arm} | {run.tag} | {fmt(score.get("knn"))} | '
                 f'{fmt(score.get("linear"))} | {mark} |')
  return '\n'.join(lines) + '\n'


def budget_text(results_dir: str, records: list[dict], recipe) -> str:
  """What PROTOCOL.md Sec. 4 and Amendment 2 make the report say: the
  5-point criterion, the largest gain the pilot reached, E and E_t."""
  base_run, sim_run = study.pilot_runs(study.PILOT_EPOCHS, recipe)
  sim = study.load_record(results_dir, sim_run) or {}
  base = study.load_record(results_dir, base_run) or {}
  rand = _scores(base, 'validation', 'random_init').get('knn')
  curve = sim.get('curve') or []
  e, e_t = _epochs(records, 'final'), _epochs(records, 'tune')
  if not curve or rand is None:
    return 'Budget: the pilot has not finished.'
  best_step, best = max(curve, key=lambda c: c[1])
  hit = [step for step, acc in curve if 100 * (acc - rand) >= 5]
  text = ('Budget: PROTOCOL.md Sec. 4 asks for the smallest epoch at which '
          'the trained NT-Xent encoder beats the random-init encoder by at '
          'least 5 kNN points on validation and its curve has flattened. ')
  if hit:
    text += (f'The pilot first gained 5 points at epoch '
             f'{hit[0] / STEPS_PER_EPOCH:g}. ')
  else:
    text += ('The pilot of the chosen recipe reached it at no epoch up to '
             f'{study.PILOT_EPOCHS}: its largest gain is '
             f'{100 * (best - rand):+.2f} points (epoch '
             f'{best_step / STEPS_PER_EPOCH:g}), so the criterion was not '
             'reachable here and the budget is the largest the CPU budget '
             'allows (Amendment 2). ')
  if e is None:
    text += 'Final runs: none finished yet. '
  else:
    steps = study._steps(e)  # pylint: disable=protected-access
    subsets = ' and '.join(
        f'{steps * study.BATCH / study.train_examples(rule):.1f}'
        for rule in study.IMBALANCE_RULES)
    sizes = ' and '.join(f'{study.train_examples(rule):,}'
                         for rule in study.IMBALANCE_RULES)
    text += (f'Final runs: {steps} steps of {study.BATCH} images ({e} epochs '
             'of the 50,000 training images); the imbalance runs take the '
             f'same steps (about {subsets} epochs of their {sizes} images). ')
  text += f'Tuning: {e_t if e_t is not None else "-"} epochs.'
  # Amendment 2: the gain at the budget, from the run scheduled for it.
  rec_base, *rec_runs = study.recipe_runs()
  r_rand = _scores(study.load_record(results_dir, rec_base), 'validation',
                   'random_init').get('knn')
  if recipe is not None:
    run = rec_runs[study.RECIPES.index(recipe)]
    rec = study.load_record(results_dir, run) or {}
    knn = _scores(rec, 'validation', 'trained').get('knn')
    if knn is not None and r_rand is not None and e == study.RECIPE_EPOCHS:
      text += (f' At that budget the trained NT-Xent encoder beat the '
               f'random-init encoder by {100 * (knn - r_rand):+.2f} kNN '
               f'points on validation (the recipe run `{run.run_id}`, a '
               f'{study.RECIPE_EPOCHS}-epoch schedule).')
  text += (' Caveat (Sec. 4): the pilot\'s curve at epoch e comes from a '
           f'{study.PILOT_EPOCHS}-epoch cosine schedule; a run scheduled '
           'for e epochs usually ends higher, as its lr has decayed by then.')
  return text


def planned_runs() -> dict[str, list[str]]:
  """The run ids of the final and imbalance stages, in the driver's order
  (a run's id does not depend on its tuned value or budget)."""
  values = dict.fromkeys(study.ARMS, 0.)
  return {'final': [r.run_id for r in study.final_runs(1, values)],
          'imbalance': [r.run_id for r in study.imbalance_runs(1, values)]}


def progress(records: list[dict], closed: str | None = None) -> str:
  """How many of the planned final and imbalance runs are done, and which
  are not; `closed`: why the study stopped with runs not made."""
  planned = planned_runs()
  done_ids = {r['run_id'] for r in records if is_done(r)}
  unscored = sorted(r['run_id'] for r in records
                    if r.get('status') == 'done' and not is_done(r))
  text = ', '.join(f'{stage} {sum(i in done_ids for i in ids)} of {len(ids)}'
                   for stage, ids in planned.items())
  missing = [i for ids in planned.values() for i in ids if i not in done_ids]
  repair = ''
  if unscored:
    repair = (f' Recorded done without their balanced evaluation, so not '
              f'counted (rerun it, studies/v2/README.md): '
              f'{", ".join(unscored)}.')
  if not missing:
    return f'Runs done: {text} (complete).'
  state = (f'Closed with runs not made ({closed}): the claims that need them '
           'are untestable here.' if closed else
           'Interim: the study is still running.')
  return (f'Runs done: {text}. {state} Not done ({len(missing)}, in the '
          f'driver\'s order): {", ".join(missing)}.{repair}')


def load_all(results_dir: str) -> list[dict]:
  import json  # pylint: disable=g-import-not-at-top
  out = []
  if os.path.isdir(results_dir):
    for name in sorted(os.listdir(results_dir)):
      if name.endswith('.json'):
        with open(os.path.join(results_dir, name)) as f:
          out.append(json.load(f))
  return out


def _p(p: float) -> str:
  return study_stats.fmt_p(p)


def power_text(n: int = PLANNED_SEEDS) -> str:
  """PROTOCOL.md Sec. 7's power statement, with the t quantiles it needs."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  m = len(CLAIMS) * len(METRICS)
  t_two = stats.t.ppf(1 - ALPHA / m / 2, n - 1)
  t_one = stats.t.ppf(1 - ALPHA / m, n - 1)
  return (f'Power (Sec. 7): with {n} seeds ({n - 1} df) and Holm over {m}, '
          f'the smallest p of the family must be below {ALPHA} / {m} = '
          f'{ALPHA / m:.4f}, |t| > {t_two:.1f}: at a paired sd of 0.3 point, '
          f'a mean difference of about {t_two * 0.3 / math.sqrt(n):.1f} '
          'points. Smaller effects come out "inconclusive", which does not '
          'mean absent. Likewise, "equivalent within '
          f'±{EQUIVALENCE_MARGIN}" needs the first-ranked TOST\'s one-sided '
          f't above {t_one:.1f}.')


def reading_text(records: list[dict]) -> str:
  """What a reader needs beside the verdicts (the setting, the baselines,
  the interim tables)."""
  acc = {row: a for row, _, a in accuracy_rows(records)}
  mean = lambda v: study_stats.Cell(v).mean
  text = ('Reading these results: the setting is a small CNN on '
          'Fashion-MNIST for a few epochs, far from the papers\' (ResNets, '
          'hundreds of epochs, CIFAR or ImageNet); a verdict here is about '
          'this setting. ')
  if (acc['random init']['linear'] and acc['raw pixels']['linear'] and
      mean(acc['raw pixels']['linear']) > mean(acc['random init']['linear'])):
    text += (
        'The random-init encoder\'s pooled features score '
        f'{mean(acc["random init"]["knn"]):.2f} kNN / '
        f'{mean(acc["random init"]["linear"]):.2f} linear, raw pixels '
        f'{mean(acc["raw pixels"]["knn"]):.2f} / '
        f'{mean(acc["raw pixels"]["linear"]):.2f}: a linear probe reads '
        'raw pixels better than random pooled features, so the linear '
        'gains over random init are large partly because that reference '
        'is weak; the accuracy table shows every arm beside raw pixels. ')
  text += ('Amendment 3 (arms at the random-init level are untestable) was '
           'written after the tuning runs left the two MoCo arms near that '
           'level on validation, before any test number was read. All the '
           'study\'s choices were fixed on validation before its first final '
           'run; the test tables below show arms as their runs finish, '
           'before their claims are judged, and change no choice.')
  return text


def write_report(results_dir: str, path: str, *, tag_commit: str | None,
                 first_tag_commit: str | None = None,
                 closed: str | None = None) -> str:
  """Writes REPORT.md to `path` from the records in `results_dir`.
  `closed`: the study stopped with runs not made, and why (PROTOCOL.md
  Sec. 6); the claims missing runs become "untestable here"."""
  records = load_all(results_dir)
  data = per_seed(records)
  lines = [
      '# Study v2: report', '',
      'Generated by `python -m studies.v2.analysis` from the run '
      f'records in `studies/v2/results/` on '
      f'{time.strftime("%Y-%m-%d %H:%M")}; do not edit by hand. The '
      'protocol, fixed before the runs, is `PROTOCOL.md` beside this file.',
      '']
  try:
    recipe = study.chosen_recipe(results_dir)
  except study.StudyError:
    recipe = None
  lines += [budget_text(results_dir, records, recipe), '',
            'Sections: the claims and their verdicts; accuracy by arm; the '
            'imbalance runs; each arm\'s gain over random init; then how the '
            'setting was fixed (shared recipe, budget pilots, tuning) and '
            'every run\'s invocations.', '']
  # How the setting was fixed; after the results.
  fixing = ['## Shared recipe (Amendment 1)', '',
             study.recipe_table(results_dir).rstrip(), '',
             '## Budget pilot, chosen recipe (Sec. 4, Amendment 2)', '',
             study.pilot_table(results_dir, recipe=recipe).rstrip(), '',
             '## Budget pilot, the configs\' recipe (Sec. 4)', '',
             study.pilot_table(results_dir).rstrip(), '']
  e_t = _epochs(records, 'tune')
  if e_t is not None:
    fixing += ['## Tuning (Sec. 5)', '',
                tune_table(results_dir, e_t, recipe).rstrip(), '']
  lines += [
      '## Claims', '', progress(records, closed), '',
      'Per-seed contrasts in accuracy points (test split), paired t-test '
      'with n - 1 df, 95% t interval, Holm over the '
      f'{len(CLAIMS) * len(METRICS)} tests; equivalence: TOST against '
      f'±{EQUIVALENCE_MARGIN} point, Holm over the same tests. A claim '
      f'without all {PLANNED_SEEDS} seeds (its arms\' and their random-init '
      'runs) shows its n and no statistics, and its tests enter both '
      'families with p = 1: adjusted p values only fall as they arrive, so '
      'a "supported" or "contradicted" holds as the study finishes, an '
      '"inconclusive" may still change. A claim with an arm whose paired '
      '95% CI of gain over random init does not lie above 0 is "untestable '
      'here" (Amendment 3); the last column gives each arm\'s gain (Sec. '
      '7). ' + power_text(), '',
      '| claim | metric | mean [95% CI] | n | p | Holm p | verdict | '
      f'TOST Holm p (±{EQUIVALENCE_MARGIN}) | arms\' gain over random init '
      '[95% CI] |', '|---|---|---|---|---|---|---|---|---|']
  terms_of = {cid: terms for cid, _, terms in CLAIMS}
  for r in claim_rows(records, closed):
    arms = sorted({arm for _, (arm, _) in terms_of[r.cid]})
    arm_gains = '; '.join(f'{arm} {gain(data, arm, r.metric).fmt()}'
                          for arm in arms)
    if math.isnan(r.p_holm):
      lines.append(f'| {r.cid} {r.claim} | {r.metric} | - | {r.stats.n} | '
                   f'- | - | {r.verdict} | - | {arm_gains} |')
      continue
    if r.verdict.startswith('untestable'):
      label = 'untestable here'
    elif r.p_tost_holm < ALPHA:
      label = f'equivalent within ±{EQUIVALENCE_MARGIN}'
    else:
      label = 'not shown equivalent'
    lines.append(f'| {r.cid} {r.claim} | {r.metric} | {r.stats.fmt()} | '
                 f'{r.stats.n} | {_p(r.stats.p)} | {_p(r.p_holm)} | '
                 f'{r.verdict} | {_p(r.p_tost_holm)} ({label}) | '
                 f'{arm_gains} |')
  lines += ['', reading_text(records)]
  e_final = _epochs(records, 'final')
  if e_final is not None:
    lines += ['', '## Accuracy by arm (test split)', '',
              f'Finished final runs, {e_final} epochs of the 50,000 '
              'training images, weighted kNN (k = 200, T = 0.1) and linear '
              'probe on the frozen pooled representation, %: mean ± sample '
              'sd over the seeds in. The claims above are read from the '
              'per-seed differences, not from these columns.', '',
              '| arm | setting | kNN | linear | seeds |',
              '|---|---|---|---|---|']
    for arm, setting, acc in accuracy_rows(records):
      lines.append(f'| {arm} | {setting} | {_mean_sd(acc["knn"])} | '
                   f'{_mean_sd(acc["linear"])} | {len(acc["knn"])} |')
  lines += ['', '## Imbalance runs (test split)', '',
            'NT-Xent and CACR (K=1) at their chosen values on CACR\'s '
            'linear and exponential subsets of the 50,000 training images, '
            'the final runs\' steps. Scored with the kNN bank and linear '
            'probe fitted on the balanced 50,000 (what C6 and C7 read) and, '
            'beside, on the run\'s own imbalanced training set, %: mean ± '
            'sample sd over the seeds in. Drop: the same seed\'s '
            'balanced-data final run minus the imbalanced run (balanced '
            'bank), mean [95% CI], points.', '',
            '| arm | subset | kNN, balanced bank | linear, balanced | '
            'kNN, imbalanced bank | linear, imbalanced | kNN drop | '
            'linear drop | seeds |', '|---|---|---|---|---|---|---|---|---|']
  for arm, rule, c in imbalance_rows(records):
    lines.append(
        f'| {arm} | {rule} | {_mean_sd(c["knn"]["balanced"])} | '
        f'{_mean_sd(c["linear"]["balanced"])} | '
        f'{_mean_sd(c["knn"]["imbalanced"])} | '
        f'{_mean_sd(c["linear"]["imbalanced"])} | {c["knn"]["drop"].fmt()} | '
        f'{c["linear"]["drop"].fmt()} | {len(c["knn"]["balanced"])} |')
  lines += ['', '## Gain over the random-init encoder (same seed)', '',
            '| arm | metric | gain [95% CI] | n |', '|---|---|---|---|']
  for arm, m, g in gains(records):
    lines.append(f'| {arm} | {m} | {g.fmt()} | {g.n} |')
  lines += [''] + fixing + ['## Runs and their invocations', '',
            '| run | status | invocations (commit, resumed from, reached, '
            'wall s, CPU s, outcome) |', '|---|---|---|']
  off_tag, first_tag, killed = [], [], 0
  for rec in records:
    inv = rec.get('invocations', [])
    cells = []
    for k, i in enumerate(inv):
      if i['dirty'] or tag_commit and i['commit'] != tag_commit:
        (first_tag if first_tag_commit and not i['dirty'] and
         i['commit'] == first_tag_commit else off_tag).append(rec['run_id'])
      outcome = i['outcome']
      # An invocation still marked running that is not the record's live
      # one was killed before the driver could record its end.
      if outcome == 'running' and not (rec.get('status') == 'running' and
                                       k == len(inv) - 1):
        outcome, killed = 'killed, no CPU record', killed + 1
      cells.append(f'{i["commit"][:7]}, {i["resumed_from_step"]}, '
                   f'{i.get("reached_step")}, {i.get("wall_seconds")}, '
                   f'{i.get("cpu_seconds")}, {outcome}')
    status = rec.get('status')
    if status == 'done' and not is_done(rec):
      status = 'done, no balanced evaluation'
    lines.append(f'| {rec["run_id"]} | {status} | ' + '; '.join(cells) +
                 ' |')
  cpu = sum(i.get('cpu_seconds') or 0 for rec in records
            for i in rec.get('invocations', []))
  text = (f'CPU time of all runs so far: {"at least " if killed else ""}'
          f'{cpu / 3600:.2f} h (budget 20 h)')
  if killed:
    text += (f'; {killed} invocation(s) were killed before recording their '
             'CPU time, which this sum leaves out')
  text += ('. Invocations not at the tag or on a dirty tree: '
           f'{", ".join(sorted(set(off_tag))) or "none"}.')
  if first_tag:
    base_run, configs_pilot = study.pilot_runs()
    knn = lambda run: _scores(study.load_record(results_dir, run),
                              'validation', 'random_init').get('knn')
    first, later = knn(base_run), knn(study.recipe_runs()[0])
    base_role = ('the pilots\' random-init encoder, which both pilot tables '
                 'and the budget statement read')
    if first is not None and later is not None:
      base_role += (f' (its validation kNN, {100 * first:.2f}, '
                    f'{"equals" if first == later else "differs from"} the '
                    f'same encoder\'s at `{study.STUDY_TAG}`, '
                    f'`{study.recipe_runs()[0].run_id}`: {100 * later:.2f})')
    roles = {base_run.run_id: base_role,
             configs_pilot.run_id: 'the configs\' recipe pilot'}
    text += (f' At the first tag, `{FIRST_TAG}` (before Amendment 1 moved '
             f'every later run to `{study.STUDY_TAG}`): ' + '; '.join(
                 f'{run_id}, {roles.get(run_id, "not read by the report")}'
                 for run_id in sorted(set(first_tag))) + '.')

  lines += ['', text, '']
  text = '\n'.join(lines)
  with open(path + '.tmp', 'w') as f:
    f.write(text)
  os.replace(path + '.tmp', path)
  return text


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--results_dir', default=study.RESULTS_DIR)
  p.add_argument('--out', default=REPORT)
  p.add_argument('--closed', default=None,
                 help='the study stopped with runs not made: why (the '
                 'claims missing runs become "untestable here")')
  args = p.parse_args(argv)
  if args.closed is not None and (not args.closed.strip() or any(
      c in args.closed for c in '|()\n')):
    p.error('--closed: a short reason without "|", parentheses or line '
            'breaks (it goes into the report\'s table cells), e.g. '
            '--closed="CPU budget spent".')
  write_report(args.results_dir, args.out,
               tag_commit=study.tag_commit(study.ROOT),
               first_tag_commit=study.tag_commit(study.ROOT, FIRST_TAG),
               closed=args.closed)
  print(f'report: {args.out}')
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
