"""The notebooks (notebooks/*.ipynb) executed as a user runs them, in a fresh
kernel, and what their cells computed checked against independent values.

Each test appends one cell that prints the notebook's variables as JSON; the
committed notebooks are checked to be their `.py` sources, executed.
"""

import json
import os
import sys

import jupytext
import nbformat
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'notebooks'))
from contrastive_jax.evaluators import features
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
      'tcl_grad_norm', 'similarity.tolist()'])
  assert _images(nb) == 4

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
  nb, v = _run('02_train', ['results', 'history'], env=env)
  with open(tmp_path / 'results.json') as f:
    assert v['results'] == json.load(f)
  assert v['results']['steps'] == 128          # 2 epochs of 2048 / 32.
  knn_steps = [h['step'] for h in v['history'] if 'online/knn_weighted_top1@20' in h]
  assert knn_steps == [32, 64, 96, 128]
  assert _images(nb) == 2                      # The curves, summary.png.
  stderr = ''.join(o.get('text', '') for c in nb.cells
                   for o in c.get('outputs', []) if o.get('name') == 'stderr')
  assert 'pretraining: 100%' in stderr and 'online/knn_weighted_top1@20' in stderr

  # The checkpoint, restored in another kernel, gives the end-of-run kNN
  # accuracy of the in-memory encoder again.
  one_nn = ('(lambda q, qy, b, by: float(np.mean(by[np.argmax('
            '(q / np.linalg.norm(q, axis=1, keepdims=True)) @ '
            '(b / np.linalg.norm(b, axis=1, keepdims=True)).T, axis=1)] == qy'
            ')))(*features.first_rows(queries, 10 ** 9), bank_x, bank_y)')
  nb, w = _run('03_checkpoint', [
      'step', '{k: float(x) for k, x in scores.items()}', one_nn,
      'neighbour_agreement'], env=env)
  assert w['step'] == 128
  scores = w['{k: float(x) for k, x in scores.items()}']
  assert scores['knn_weighted_top1@5'] == pytest.approx(
      v['results']['trained/knn_weighted_top1@5'], abs=1.5 / 1024)
  # k = 1: the kNN module's vote is the nearest neighbour's label, as a
  # plain numpy cosine search over the bank finds it.
  assert scores['knn_weighted_top1@1'] == pytest.approx(w[one_nn], abs=1e-9)
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
