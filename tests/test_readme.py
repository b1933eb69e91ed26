"""README.md stays a user guide whose commands run as written.

Every command in its ```bash blocks names only repository paths that exist,
every `--config=file[:arg]` loads, and every `--config.x.y=...` override
names a field of that config; every repository path and relative link in the
text exists; the loss snippet runs; the study v2 rows of its results table
quote study v2's generated report. The README is at most 250 lines and
carries no dates, commit hashes, issue numbers or machine-load remarks (those
belong in docs/ and CHANGELOG.md).
"""

import ast
import glob
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = os.path.join(ROOT, 'studies', 'v2')
STUDY_REPORT = os.path.join(STUDY, 'REPORT.md')
README = os.path.join(ROOT, 'README.md')
TOP = ('configs', 'contrastive_jax', 'input_pipeline', 'benchmarks', 'studies',
       'scripts',
       'tests', 'notebooks', 'docs', '.ci')


def _text():
  with open(README) as f:
    return f.read()


def _blocks(text):
  """(language, body) of each fenced code block."""
  return re.findall(r'^```(\w*)\n(.*?)^```', text, re.S | re.M)


def _commands(text):
  """Each shell command of the bash blocks, continuation lines joined."""
  commands = []
  for lang, body in _blocks(text):
    if lang != 'bash':
      continue
    body = re.sub(r'\\\n\s*', ' ', body)
    for line in body.splitlines():
      line = line.strip()
      if line and not line.startswith('#'):
        commands.append(shlex.split(line, comments=True))
  return commands


def _repo_path(token):
  """The repository path a command token names, or None."""
  token = token.split('=', 1)[1] if token.startswith('--') else token
  if '=' in token and not token.startswith(TOP):   # VAR=value
    token = token.split('=', 1)[1]
  if token in ('main.py', 'LICENSE', 'CITATION.cff', 'requirements.txt',
               'pyproject.toml', '.', '".[cuda]"'):
    return token
  if token.startswith(tuple(t + '/' for t in TOP)):
    return token.split(':', 1)[0]
  return None


def _load_config(spec):
  path, _, arg = spec.partition(':')
  sys.path.insert(0, ROOT)
  try:
    module_spec = importlib.util.spec_from_file_location(
        'readme_config', os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  finally:
    sys.path.remove(ROOT)


def test_readme_has_commands_and_they_name_existing_paths():
  commands = _commands(_text())
  assert len(commands) >= 10
  named = [p for cmd in commands for t in cmd if (p := _repo_path(t))]
  assert 'scripts/run_default.sh' in named and 'scripts/test.sh' in named
  missing = sorted({p for p in named
                    if p not in ('.', '".[cuda]"')
                    and not os.path.exists(os.path.join(ROOT, p))})
  assert not missing, missing


def test_every_config_in_a_command_loads_and_its_overrides_exist():
  loaded = 0
  for cmd in _commands(_text()):
    specs = [t.split('=', 1)[1] for t in cmd if t.startswith('--config=')]
    if not specs:
      continue
    config = _load_config(specs[0])
    loaded += 1
    for t in cmd:
      if t.startswith('--config.'):
        node = config
        for key in t[len('--config.'):].split('=', 1)[0].split('.'):
          assert key in node, f'{t}: no field {key!r} in {specs[0]}'
          node = node[key]
  assert loaded >= 4


def test_paths_and_links_in_the_text_exist():
  text = _text()
  paths = set(re.findall(
      r'(?<![\w/.$-])((?:%s)/[\w./-]*\w/?)' % '|'.join(map(re.escape, TOP)),
      text))
  links = {t for t in re.findall(r'\]\(([^)]+)\)', text)
           if not re.match(r'\w+://', t)}
  ticked = {t for t in re.findall(r'`([\w.-]+\.(?:py|sh|md|txt|cff|toml))`',
                                  text)}
  assert len(paths) > 20
  missing = sorted(p for p in paths | links
                   if not os.path.exists(os.path.join(ROOT, p)))
  missing += sorted(t for t in ticked if not any(
      os.path.exists(os.path.join(ROOT, d, t))
      for d in ('', 'configs', 'configs/papers')))
  assert not missing, missing


def test_the_loss_snippet_runs(tmp_path):
  snippets = [body for lang, body in _blocks(_text())
              if lang == 'python' and 'losses.ntxent' in body]
  assert len(snippets) == 1
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', snippets[0]], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  loss = float(out.stdout.split()[0])
  # 32 instances x 2 views: a uniform softmax over the 63 others gives
  # log 63; views that share their image must score better than chance.
  assert 0 < loss < math.log(63), out.stdout


def test_study_v2_results_quote_its_report():
  # One README row per study v2 arm, each linking the report and naming the
  # arm's config and tuned value; its trained and random-init means (kNN /
  # linear), the seed count and the budget are the generated report's.
  with open(STUDY_REPORT) as f:
    report = f.read()
  table = report.split('## Accuracy by arm (test split)')[1].split('\n## ')[0]
  epochs = re.search(r'Finished final runs, (\d+) epochs', table).group(1)
  arms = {}    # config path or row name -> (tuned value, kNN, linear, seeds)
  for line in table.splitlines():
    cells = line.strip('| ').split(' | ')
    if len(cells) == 5 and cells[0] != 'arm' and not line.startswith('|---'):
      key = cells[1].split(',')[0] if cells[1].startswith('configs/') else (
          cells[0])
      arms[key] = (cells[1].split(' ')[-1], cells[2].split(' ')[0],
                   cells[3].split(' ')[0], int(cells[4]))
  rows = [l for l in _text().splitlines()
          if '(studies/v2/REPORT.md)' in l and l.startswith('| ')]
  configs = [re.search(r'`(configs/\w+\.py)`', r).group(1) for r in rows]
  assert sorted(configs) == sorted(k for k in arms if k.startswith('configs/'))
  first = re.search(r'study v2, (\d+) epochs, mean of (\d) seeds', rows[0])
  assert first, rows[0]
  assert first.group(1) == epochs, rows[0]
  rknn, rlinear = arms['random init'][1:3]
  for row, config in zip(rows, configs):
    value, knn, linear, n = arms[config]
    cells = row.strip('| ').split(' | ')
    assert cells[0].endswith(f' {value})'), (row, value)
    assert cells[1] == f'{knn} / {linear}', row
    assert cells[2] == f'{rknn} / {rlinear}', row
    assert int(first.group(2)) == n, row


_VERDICTS = {   # The README's label for a group of claims -> REPORT's test.
    'Supported': lambda row: row['verdict'] == 'supported',
    'Contradicted': lambda row: row['verdict'] == 'contradicted',
    'Inconclusive': lambda row: row['verdict'] == 'inconclusive',
    'Untestable here': lambda row: row['verdict'].startswith('untestable'),
    'Pending': lambda row: row['verdict'].startswith('pending'),
    'Equivalent within ±1 point': lambda row: row['tost'].endswith(
        '(equivalent within ±1.0)'),
}


def _report_claims(report):
  """(claim id, metric) -> the row of the report's claims table."""
  table = report.split('## Claims')[1].split('\n## ')[0]
  rows = {}
  for line in table.splitlines():
    cells = line.strip('| ').split(' | ')
    if len(cells) == 9 and re.match(r'C\d ', cells[0]):
      rows[cells[0].split()[0], cells[1]] = {
          'mean': cells[2].split(' ')[0], 'holm': cells[5],
          'verdict': cells[6], 'tost': cells[7]}
  return rows


def _findings(text):
  """The README's study v2 findings: [(label, [(claim, metric or None,
  the mention's text)])], one entry per 'Label: ...' sentence."""
  paragraph = text.split('\nStudy v2 (studies/v2/)')[1].split(
      '\n\n')[0].replace('\n', ' ')
  out = []
  labels = '|'.join(re.escape(k) for k in _VERDICTS)
  for label, body in re.findall(rf'({labels})[^:]*: (.*?)(?:\.\s(?=[A-Z])|\.$)',
                                paragraph):
    mentions = []
    for group in re.findall(r'\((C\d[^)]*)\)', body):
      # '(C1, C3)', '(C4 linear, C5 linear)', '(C4 kNN, +0.79 points, ...)'.
      ids = re.findall(r'(?:^|, )(C\d)(?: (kNN|linear))?(?=,|;|$)', group)
      for claim, metric in ids:
        mentions.append((claim, {'kNN': 'knn', 'linear': 'linear'}.get(
            metric), group if len(ids) == 1 else ''))
    out.append((label, mentions))
  return out


def test_study_v2_findings_say_what_the_report_says():
  # Each 'Label: ...' sentence of the findings names claims as (C<n>) or
  # (C<n> <metric>); every named claim has the label's verdict in the
  # report, numbers quoted in a mention are that row's, and every claim
  # row of the report is named with its verdict.
  with open(STUDY_REPORT) as f:
    rows = _report_claims(f.read())
  assert len(rows) == 14, sorted(rows)
  findings = _findings(_text())
  assert findings, 'no "Label: ..." sentence in the study v2 findings'
  covered = set()
  for label, mentions in findings:
    assert mentions, label
    for claim, metric, mention in mentions:
      for m in ([metric] if metric else ['knn', 'linear']):
        row = rows[claim, m]
        assert _VERDICTS[label](row), (label, mention, row)
        if label != 'Equivalent within ±1 point':
          covered.add((claim, m))
        if metric:   # Quoted numbers are this row's.
          for number in re.findall(r'[+-]\d+\.\d\d', mention):
            assert number == row['mean'], (mention, row)
          for p in re.findall(r'Holm p (\d\.\d+)', mention):
            assert p == row['holm'], (mention, row)
  assert covered == set(rows), sorted(set(rows) - covered)


def _study_paragraph():
  return _text().split('\nStudy v2 (studies/v2/)')[1].split('\n\n')[0].replace(
      '\n', ' ')


def _arm_gains(report):
  """arm -> kNN gain over random init, from the report's gain table."""
  table = report.split('## Gain over the random-init encoder')[1].split(
      '\n## ')[0]
  return {cells[0]: float(cells[2].split()[0])
          for cells in (l.strip('| ').split(' | ') for l in table.splitlines())
          if len(cells) == 4 and cells[1] == 'knn'}


def test_study_v2_regime_gains_and_commits_are_the_records():
  # The regime the paragraph states, the range of kNN gains over random
  # init it quotes, and the commits it names, each read from the record.
  with open(STUDY_REPORT) as f:
    report = f.read()
  paragraph = _study_paragraph()
  epochs = re.search(r'Finished final runs, (\d+) epochs', report).group(1)
  assert f'for {epochs} epochs on a CPU, 4 seeds' in paragraph
  gains = _arm_gains(report)
  assert len(gains) == 7, gains
  low, high = re.search(r'by only \+(\d\.\d\d) to \+(\d\.\d\d) points',
                        paragraph).groups()
  assert (float(low), float(high)) == (min(gains.values()),
                                       max(gains.values()))
  commits = {}
  for path in glob.glob(os.path.join(STUDY, 'results', '*.json')):
    with open(path) as f:
      commits[os.path.basename(path)] = {
          i['commit'] for i in json.load(f)['invocations']}
  with open(os.path.join(STUDY, 'README.md')) as f:
    study_readme = f.read()
  main_commit, pilot_commit = re.search(
      r'Every run executes from commit ([0-9a-f]{40}),.*?two runs ran from\s+'
      r'([0-9a-f]{40})', study_readme, re.S).groups()
  assert 'two ran from one commit, which studies/v2/README.md names' in (
      paragraph)
  others = {k: c for k, c in commits.items() if c != {main_commit}}
  assert len(others) == 2 and all(k.startswith('pilot__') for k in others)
  assert all(c == {pilot_commit} for c in others.values()), others
  assert 'tag' not in paragraph        # Tags do not travel with a clone.


def test_config_docstrings_quote_the_current_study():
  # A method config quotes study v2's figures for its arm, or says it is not
  # measured; none quotes the superseded first study's numbers.
  with open(STUDY_REPORT) as f:
    report = f.read()
  table = report.split('## Accuracy by arm (test split)')[1].split('\n## ')[0]
  arms = {}
  for line in table.splitlines():
    cells = line.strip('| ').split(' | ')
    if len(cells) == 5 and cells[1].startswith('configs/'):
      arms[cells[1].split(',')[0]] = (cells[0], cells[2].split()[0],
                                      cells[3].split()[0])
  rknn, rlin = re.search(r'\| random init \| [^|]* \| ([\d.]+) [^|]* \| '
                         r'([\d.]+)', table).groups()
  for path in sorted(glob.glob(os.path.join(ROOT, 'configs', '*.py'))):
    with open(path) as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ''
    name = 'configs/' + os.path.basename(path)
    assert 'REPORT.md, row' not in doc and '+-' not in doc, name
    if name in arms:
      arm, knn, lin = arms[name]
      assert f'arm {arm} ' in doc and f'kNN {knn} / linear {lin}' in doc, name
      assert f'random-init encoder {rknn} / {rlin}' in doc, name


def test_readme_is_short_and_undated():
  text = _text()
  assert len(text.splitlines()) <= 250
  months = ('January|February|March|April|May|June|July|August|September|'
            'October|November|December')
  forbidden = {
      'date': r'\b(19|20)\d\d-\d\d-\d\d\b|\b(%s) (\d{1,2}, )?(19|20)\d\d\b'
              % months,
      'commit hash': r'\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b',
      'issue number': r'(?i)\bissues? #?\d+|(?<![\w/&])#\d+\b',
      'machine load': r'(?i)load average|other tenants|machine load|'
                      r'running beside it',
  }
  found = {what: [m.group(0) for m in re.finditer(pattern, text)]
           for what, pattern in forbidden.items()}
  assert not any(found.values()), found


@pytest.mark.parametrize('bad', [
    'measured on 2026-11-26', 'at commit 1f2b4ec', 'see issue 13',
    'fixed in #14', 'load average 10-16'])
def test_the_forbidden_patterns_catch_what_they_name(bad, monkeypatch):
  monkeypatch.setattr(sys.modules[__name__], '_text',
                      lambda: 'clean line\n' + bad + '\n')
  with pytest.raises(AssertionError):
    test_readme_is_short_and_undated()
