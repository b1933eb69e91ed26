"""Runs examples/losses.py headlessly and checks what it produced."""

import os
import runpy

import jupytext
import numpy as np

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'examples',
                       'losses.py')


def test_losses_notebook(tmp_path, monkeypatch):
  # It is a valid jupytext percent notebook, with prose and code cells.
  nb = jupytext.read(EXAMPLE)
  kinds = [cell.cell_type for cell in nb.cells]
  assert kinds.count('markdown') >= 4 and kinds.count('code') >= 5

  monkeypatch.setenv('CONTRASTIVE_JAX_FIGURES', str(tmp_path))
  out = runpy.run_path(EXAMPLE, run_name='__main__')

  assert sorted(os.listdir(tmp_path)) == [
      'cacr_weights.png', 'macl_temperature.png', 'tcl_gradients.png']
  assert all(os.path.getsize(tmp_path / f) > 10_000 for f in
             os.listdir(tmp_path))

  # Every registered loss was evaluated and prefers better-aligned views.
  from contrastive_jax.losses import LOSSES
  assert set(out['table']) == set(LOSSES)
  assert all(out['decreasing'].values()), out['decreasing']

  # CACR: the plotted weights are the ones the loss applies, repulsion
  # weights increase with similarity, attraction weights with distance.
  assert out['cacr_grad_matches']
  order = np.argsort(out['cacr_similarity'])
  assert np.all(np.diff(out['cacr_repulsion'][order]) > 0)
  assert np.all(np.diff(out['cacr_attraction'][order]) < 0)

  # MACL: the temperature grows with alignment and stays in
  # [tau0 / alpha, tau0 * alpha] = [0.05, 0.2] (variant a).
  m, tau_a = out['macl_m'], np.array(out['macl_tau']['a'])
  assert np.all(np.diff(m) > 0) and np.all(np.diff(tau_a) > 0)
  assert tau_a.min() >= 0.05 and tau_a.max() <= 0.2

  # TCL: a larger k1 gives a larger gradient.
  assert np.all(np.diff(out['tcl_grad_norm']) > 0)
