"""The committed notebooks (notebooks/*.ipynb), checked without executing
anything: each is its `.py` source executed by the current code (it records a
hash of the code that produced it, notebooks/execute.py), and the variables
it recorded pass notebooks/checks.py's independent checks.
"""

import hashlib
import os
import shutil
import sys

import jupytext
import nbformat
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'notebooks'))
import checks  # noqa: E402  (notebooks/checks.py)
import execute  # noqa: E402  (notebooks/execute.py)

@pytest.mark.parametrize('name', execute.NOTEBOOKS)
def test_committed_notebook_passes_its_checks(name):
  """The variables the committed notebook recorded when notebooks/execute.py
  ran it (and checked them, with the run's files) pass notebooks/checks.py;
  the hash test below ties them to the current code."""
  nb = nbformat.read(os.path.join(execute.HERE, name + '.ipynb'), 4)
  values = nb.metadata['contrastive_jax']['checked']
  assert sorted(values) == sorted(checks.names(name))
  reads = checks.READS.get(name)
  checks.CHECKS[name](nb, values, read=reads and execute.recorded_variables(
      reads))


@pytest.mark.parametrize('name,variable,value', [
    ('01_losses', 'decreasing', {'ntxent': False}),
    ('01_losses', 'view_cosine', [0.9, 0.5]),
    ('02_train', 'gap', 1.0),
    ('03_checkpoint', 'knn_accuracy', 0.5),
])
def test_the_checks_catch_a_wrong_value(name, variable, value):
  nb = nbformat.read(os.path.join(execute.HERE, name + '.ipynb'), 4)
  values = dict(nb.metadata['contrastive_jax']['checked'], **{variable: value})
  reads = checks.READS.get(name)
  with pytest.raises(AssertionError):
    checks.CHECKS[name](nb, values, read=reads and execute.recorded_variables(
        reads))


@pytest.mark.parametrize('name', execute.NOTEBOOKS)
def test_committed_notebook_is_its_source_executed(name):
  source = jupytext.read(os.path.join(execute.HERE, name + '.py'))
  nb = nbformat.read(os.path.join(execute.HERE, name + '.ipynb'), 4)
  assert ([(c.cell_type, c.source) for c in nb.cells] ==
          [(c.cell_type, c.source) for c in source.cells]), (
              f'notebooks/{name}.ipynb differs from its .py: run '
              f'.venv/bin/python notebooks/execute.py {name}')
  code = [c for c in nb.cells if c.cell_type == 'code']
  assert all(c.execution_count for c in code)
  assert checks.images(nb) >= 1


@pytest.mark.parametrize('name', execute.NOTEBOOKS)
def test_committed_notebook_is_current(name):
  """Fails when the library, configs or the notebook changed after the
  committed outputs were produced (no execution: a hash comparison)."""
  nb = nbformat.read(os.path.join(execute.HERE, name + '.ipynb'), 4)
  recorded = execute.recorded_hash(nb)
  assert recorded == execute.code_hash(name), (
      f'notebooks/{name}.ipynb was produced by other code than the current '
      f'one (contrastive_jax/, input_pipeline/, configs/ or its .py changed '
      f'since): regenerate the notebooks with {execute.COMMAND} and commit '
      'them.')


def test_code_hash_covers_the_code(tmp_path):
  """The hash of a copy of the repository's code moves with any .py under
  contrastive_jax/, input_pipeline/, configs/ and the notebook's sources,
  and with nothing else."""
  for top in execute.CODE_DIRS + ('notebooks',):
    shutil.copytree(os.path.join(execute.ROOT, top), tmp_path / top,
                    ignore=shutil.ignore_patterns('*.ipynb', '__pycache__'))
  # Independently: sha256 over each sorted path, length and content.
  h = hashlib.sha256()
  files = sorted(str(p.relative_to(tmp_path)).replace(os.sep, '/')
                 for top in execute.CODE_DIRS
                 for p in (tmp_path / top).rglob('*.py'))
  files = sorted(files + ['notebooks/01_losses.py', 'notebooks/execute.py'])
  for f in files:
    data = (tmp_path / f).read_bytes()
    for part in (f.encode(), str(len(data)).encode(), data):
      h.update(part + b'\0')
  assert execute.code_hash('01_losses', str(tmp_path)) == h.hexdigest()
  assert execute.code_hash('01_losses', str(tmp_path)) == execute.code_hash(
      '01_losses')

  def hashes():
    return {n: execute.code_hash(n, str(tmp_path)) for n in execute.NOTEBOOKS}

  before = hashes()
  (tmp_path / 'README.md').write_text('not code')
  (tmp_path / 'contrastive_jax' / 'notes.txt').write_text('not code')
  assert hashes() == before
  for path in ('contrastive_jax/evaluators/knn.py', 'input_pipeline/augment.py',
               'configs/test.py'):
    with open(tmp_path / path, 'a') as f:
      f.write('# a change\n')
    after = hashes()
    assert all(after[n] != before[n] for n in before), path
    before = after
  # A new module counts too.
  (tmp_path / 'configs' / 'new.py').write_text('')
  after = hashes()
  assert all(after[n] != before[n] for n in before)
  before = after
  # A notebook's source moves its own hash and those of the notebooks that
  # read its outputs only.
  with open(tmp_path / 'notebooks' / '02_train.py', 'a') as f:
    f.write('\n')
  after = hashes()
  assert after['01_losses'] == before['01_losses']
  assert after['02_train'] != before['02_train']
  assert after['03_checkpoint'] != before['03_checkpoint']
