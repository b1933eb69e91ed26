"""What each notebook must compute, checked against independent values.

`execute.py` runs every notebook with one extra cell that prints the
variables named in `VARIABLES` as JSON, checks them here and writes the
notebook only if they pass, recording them in its metadata
(`contrastive_jax.checked`). tests/test_notebooks.py runs the same checks on
the committed notebooks without executing anything; the code hash each one
records ties those values to the current code.

A check takes the executed notebook, its variables and, at generation only,
the run's workdir (`None` in the tests: the files are not committed).
"""

from __future__ import annotations

import json
import os

import numpy as np

VARIABLES = {
    '01_losses': (
        'table', 'decreasing', 'gradient_check', 'cacr_grad_matches',
        'cacr_similarity.tolist()', 'cacr_repulsion.tolist()',
        'cacr_attraction.tolist()', 'macl_m.tolist()', 'macl_tau',
        'tcl_grad_norm', 'similarity.tolist()', 'own_loop', 'signal_weight',
        'nuisance_weight', 'view_cosine'),
    '02_train': ('results', 'history', 'gap'),
    # evaluate_checkpoint's results without the run's path on this machine.
    '03_checkpoint': ('step', 'knn_accuracy', 'K', (
        'evaluation', "{k: v for k, v in evaluation.items() if k != 'workdir'}"),
                      'neighbour_agreement', 'bank_x.shape', 'query_x.shape'),
}
# The notebook whose recorded variables a check also reads.
READS = {'03_checkpoint': '02_train'}


def names(name: str) -> list[str]:
  """The recorded variables' names (an entry is a name or (name, expression))."""
  return [v if isinstance(v, str) else v[0] for v in VARIABLES[name]]


def dump_cell(name: str) -> str:
  """The cell that prints `VARIABLES[name]` as one JSON line."""
  items = ', '.join(f'{v!r}: {v}' if isinstance(v, str) else f'{v[0]!r}: {v[1]}'
                    for v in VARIABLES[name])
  return f'import json; print("JSON:" + json.dumps({{{items}}}))'


def images(nb) -> int:
  return sum('image/png' in o.get('data', {})
             for c in nb.cells for o in c.get('outputs', []))


def _close(a, b, tol):
  assert abs(a - b) <= tol, (a, b, tol)


def losses_notebook(nb, v, workdir=None, read=None):
  del workdir, read
  assert images(nb) == 4
  assert sum('text/markdown' in o.get('data', {}) for c in nb.cells
             for o in c.get('outputs', [])) == 5   # The tables.
  # The plain JAX + optax loop learns the augmentation's invariance: the
  # loss falls, views find their positive, and the encoder reads the
  # identity coordinates, not the noisy ones.
  first, last = v['own_loop'][0], v['own_loop'][-1]
  assert last[1] < first[1] - 1.5 and last[3] >= 0.9 > first[3], v['own_loop']
  assert v['signal_weight'] > 10 * v['nuisance_weight']
  assert np.all(np.diff(v['view_cosine']) > 0)   # Columns by alignment.
  # Every registered loss was evaluated, jitted, and prefers better-aligned
  # views.
  from contrastive_jax import losses  # pylint: disable=g-import-not-at-top
  assert sorted(v['table']) == list(losses.names())
  assert all(v['decreasing'].values()), v['decreasing']
  # Autodiff against central differences (float32, eps 1e-2), every loss but
  # MACL, whose gradient is stop-gradient by design.
  assert sorted(v['gradient_check']) == list(losses.names())
  for name, (autodiff, numeric) in v['gradient_check'].items():
    if name != 'macl':
      assert abs(autodiff - numeric) <= 2e-3 * abs(numeric) + 1e-5, name
  # The similarity matrix: cosines (unit diagonal, symmetric).
  s = np.array(v['similarity.tolist()'])
  np.testing.assert_allclose(np.diag(s), 1., atol=1e-5)
  np.testing.assert_allclose(s, s.T, atol=1e-6)
  # CACR: the plotted weights are the ones the loss applies; repulsion
  # weights rise with similarity, attraction weights with distance.
  assert v['cacr_grad_matches']
  order = np.argsort(v['cacr_similarity.tolist()'])
  assert np.all(np.diff(np.array(v['cacr_repulsion.tolist()'])[order]) > 0)
  assert np.all(np.diff(np.array(v['cacr_attraction.tolist()'])[order]) < 0)
  # MACL: the temperature grows with alignment, within [tau0 / alpha,
  # tau0 * alpha] = [0.05, 0.2] (variant a).
  m, tau_a = np.array(v['macl_m.tolist()']), np.array(v['macl_tau']['a'])
  assert np.all(np.diff(m) > 0) and np.all(np.diff(tau_a) > 0)
  assert tau_a.min() >= 0.05 and tau_a.max() <= 0.2
  assert np.all(np.diff(v['tcl_grad_norm']) > 0)   # TCL: larger k1, larger grad.


def train_notebook(nb, v, workdir=None, read=None):
  del read
  r = v['results']
  if workdir is not None:
    with open(os.path.join(workdir, 'results.json')) as f:
      assert r == json.load(f)
  assert r['steps'] == 128          # 2 epochs of 2048 / 32.
  knn_steps = [h['step'] for h in v['history']
               if 'online/knn_weighted_top1@20' in h]
  assert knn_steps == list(range(16, 129, 16))
  assert images(nb) == 2            # The curves, summary.png.
  stderr = ''.join(o.get('text', '') for c in nb.cells
                   for o in c.get('outputs', []) if o.get('name') == 'stderr')
  assert 'pretraining: 100%' in stderr
  assert 'online/knn_weighted_top1@20' in stderr
  # The run visibly learns: the trained encoder's kNN beats its random
  # initialisation's by several points (the notebook quotes the margin).
  _close(v['gap'], 100 * (r['trained/knn_weighted_top1@20'] -
                          r['random_init/knn_weighted_top1@20']),
         1e-6 * abs(v['gap']))
  assert v['gap'] > 4, v['gap']


def checkpoint_notebook(nb, w, workdir=None, read=None):
  """`read`: 02_train's variables (the run this notebook restores)."""
  r = read['results']
  assert w['step'] == 128 and w['K'] == 20
  # The flattened 14 x 14 x 16 map of the (8, 16)-channel CNN.
  assert w['bank_x.shape'] == [2048, 3136]
  assert w['query_x.shape'] == [1024, 3136]
  # The notebook's numpy kNN on the restored encoder gives the library's
  # sharded kNN of the in-memory encoder again, as does evaluate_checkpoint.
  _close(w['knn_accuracy'], r['trained/knn_weighted_top1@20'], 1.5 / 1024)
  for key in ('trained/knn_weighted_top1@20', 'trained/linear_top1'):
    _close(w['evaluation'][key], r[key], 1.5 / 1024)
  if workdir is not None:
    assert os.path.exists(os.path.join(workdir, 'eval', 'results.json'))
  assert images(nb) == 1
  assert 0 <= w['neighbour_agreement'] <= 1


CHECKS = {'01_losses': losses_notebook, '02_train': train_notebook,
          '03_checkpoint': checkpoint_notebook}
