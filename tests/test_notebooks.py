"""The notebooks (notebooks/*.ipynb) executed as a user runs them, in a fresh
kernel, and what their cells computed checked against independent values.

Each test appends one cell that prints the notebook's variables as JSON.
The committed notebooks are checked, without executing anything, to be their
`.py` sources executed by the current code: each records a hash of the code
that produced it (notebooks/execute.py), which must be the current code's.
"""

import hashlib
import json
import os
import shutil
import sys

import jupytext
import nbformat
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'notebooks'))
import execute  # noqa: E402  (notebooks/execute.py)

DUMP = 'import json; print("JSON:" + json.dumps({}))'


def _run(name, variables, **kw):
  """Executes notebook `name`; returns (notebook, {variable: value})."""
  cell = DUMP.format('{' + ', '.join(f'{v!r}: {v}' for v in variables) + '}')
  nb = execute.execute(name, extra_cells=(cell,), **kw)
  text = ''.join(o.get('text', '') for o in nb.cells[-1].outputs)
  return nb, json.loads(text.split('JSON:', 1)[1])


def _images(nb):
  return sum('image/png' in o.get('data', {})
             for c in nb.cells for o in c.get('outputs', []))


def test_losses_notebook():
  nb, v = _run('01_losses', [
      'table', 'decreasing', 'gradient_check', 'cacr_grad_matches',
      'cacr_similarity.tolist()', 'cacr_repulsion.tolist()',
      'cacr_attraction.tolist()', 'macl_m.tolist()', 'macl_tau',
      'tcl_grad_norm', 'similarity.tolist()', 'own_loop', 'signal_weight',
      'nuisance_weight', 'view_cosine'])
  assert _images(nb) == 4
  assert sum('text/markdown' in o.get('data', {}) for c in nb.cells
             for o in c.get('outputs', [])) == 5   # The tables.

  # The plain JAX + optax loop learns the augmentation's invariance: the
  # loss falls, views find their positive, and the encoder reads the
  # identity coordinates, not the noisy ones.
  first, last = v['own_loop'][0], v['own_loop'][-1]
  assert last[1] < first[1] - 1.5 and last[3] >= 0.9 > first[3], v['own_loop']
  assert v['signal_weight'] > 10 * v['nuisance_weight']
  # The table's columns are in order of rising view alignment.
  assert np.all(np.diff(v['view_cosine']) > 0)

  # Every registered loss was evaluated, jitted, and prefers better-aligned
  # views.
  from contrastive_jax import losses
  assert sorted(v['table']) == list(losses.names())
  assert all(v['decreasing'].values()), v['decreasing']

  # Gradients: autodiff against central differences (float32, eps 1e-2),
  # every loss but MACL, whose gradient is stop-gradient by design.
  assert sorted(v['gradient_check']) == list(losses.names())
  for name, (autodiff, numeric) in v['gradient_check'].items():
    if name != 'macl':
      assert abs(autodiff - numeric) <= 2e-3 * abs(numeric) + 1e-5, name

  # The similarity matrix: cosines (unit diagonal, symmetric, in [-1, 1]).
  s = np.array(v['similarity.tolist()'])
  np.testing.assert_allclose(np.diag(s), 1., atol=1e-5)
  np.testing.assert_allclose(s, s.T, atol=1e-6)

  # CACR: the plotted weights are the ones the loss applies; repulsion
  # weights increase with similarity, attraction weights with distance.
  assert v['cacr_grad_matches']
  order = np.argsort(v['cacr_similarity.tolist()'])
  assert np.all(np.diff(np.array(v['cacr_repulsion.tolist()'])[order]) > 0)
  assert np.all(np.diff(np.array(v['cacr_attraction.tolist()'])[order]) < 0)

  # MACL: the temperature grows with alignment and stays in
  # [tau0 / alpha, tau0 * alpha] = [0.05, 0.2] (variant a).
  m, tau_a = np.array(v['macl_m.tolist()']), np.array(v['macl_tau']['a'])
  assert np.all(np.diff(m) > 0) and np.all(np.diff(tau_a) > 0)
  assert tau_a.min() >= 0.05 and tau_a.max() <= 0.2

  # TCL: a larger k1 gives a larger gradient.
  assert np.all(np.diff(v['tcl_grad_norm']) > 0)


def test_train_then_checkpoint_notebooks(tmp_path):
  env = {'NOTEBOOK_WORKDIR': str(tmp_path)}
  nb, v = _run('02_train', ['results', 'history', 'gap'], env=env)
  with open(tmp_path / 'results.json') as f:
    assert v['results'] == json.load(f)
  assert v['results']['steps'] == 128          # 2 epochs of 2048 / 32.
  knn_steps = [h['step'] for h in v['history']
               if 'online/knn_weighted_top1@20' in h]
  assert knn_steps == list(range(16, 129, 16))
  assert _images(nb) == 2                      # The curves, summary.png.
  stderr = ''.join(o.get('text', '') for c in nb.cells
                   for o in c.get('outputs', []) if o.get('name') == 'stderr')
  assert 'pretraining: 100%' in stderr and 'online/knn_weighted_top1@20' in stderr
  # The run visibly learns: the trained encoder's kNN beats its random
  # initialisation's by several points (the notebook quotes the margin).
  r = v['results']
  assert v['gap'] == pytest.approx(100 * (
      r['trained/knn_weighted_top1@20'] - r['random_init/knn_weighted_top1@20']))
  assert v['gap'] > 4, v['gap']

  # The checkpoint, restored in another kernel by load_encoder: the
  # notebook's numpy kNN gives the end-of-run kNN accuracy of the in-memory
  # encoder (the library's sharded kNN) again, as does evaluate_checkpoint.
  nb, w = _run('03_checkpoint', [
      'step', 'knn_accuracy', 'K', 'evaluation', 'neighbour_agreement',
      'bank_x.shape', 'query_x.shape'], env=env)
  assert w['step'] == 128 and w['K'] == 20
  # The flattened 14 x 14 x 16 map of the (8, 16)-channel CNN.
  assert w['bank_x.shape'] == [2048, 3136]
  assert w['query_x.shape'] == [1024, 3136]
  assert w['knn_accuracy'] == pytest.approx(
      r['trained/knn_weighted_top1@20'], abs=1.5 / 1024)
  for key in ('trained/knn_weighted_top1@20', 'trained/linear_top1'):
    assert w['evaluation'][key] == pytest.approx(r[key], abs=1.5 / 1024), key
  assert (tmp_path / 'eval' / 'results.json').exists()
  assert _images(nb) == 1
  assert 0 <= w['neighbour_agreement'] <= 1


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
  assert _images(nb) >= 1


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
