"""The fast probe: L-BFGS logistic regression vs scikit-learn and optax.

The papers' SGD protocol is tested in test_linear_eval.py."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from contrastive_jax.evaluators import logreg

import compilations


def gaussian_mixture(seed, n, dim=20, num_classes=8, spread=2.2):
  """Overlapping, anisotropic classes: linear accuracy well below 100%."""
  rng = np.random.default_rng(seed)
  centers = rng.normal(size=(num_classes, dim))
  labels = rng.integers(0, num_classes, n)
  scales = rng.uniform(0.3, 1.5, size=dim)
  x = centers[labels] + spread * rng.normal(size=(n, dim)) * scales + 3.0
  return x.astype(np.float32), labels


def unit_rows(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def objective(w, b, x, y, l2):
  """Mean cross-entropy + l2 / 2 ||w||^2 in float64 (independent of JAX)."""
  logits = x @ w + b
  logits = logits - logits.max(1, keepdims=True)
  log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  return -log_p[np.arange(len(y)), y].mean() + 0.5 * l2 * np.sum(w * w)


def top5(scores, y):
  return np.mean([y[i] in np.argsort(-s)[:5] for i, s in enumerate(scores)])


def test_logistic_regression_matches_sklearn():
  train_x, train_y = gaussian_mixture(0, 3000)
  test_x, test_y = gaussian_mixture(0, 4000)
  test_x, test_y = test_x[3000:], test_y[3000:]   # same mixture, fresh draws
  l2 = 1e-3
  got = logreg.logistic_regression(
      train_x, train_y, test_x, test_y, num_classes=8, l2=l2, normalize=True,
      max_iter=500, tol=1e-6)
  # Same objective in sklearn's parametrisation: C * sum(CE) + ||W||^2 / 2
  # = N * C * (mean CE + ||W||^2 / (2 N C)), so C = 1 / (l2 * N).
  xs, xt = unit_rows(train_x), unit_rows(test_x)
  ref = LogisticRegression(C=1.0 / (l2 * len(train_y)), max_iter=5000,
                           tol=1e-10).fit(xs, train_y)
  ref_top1 = ref.score(xt, test_y)
  assert 0.45 < ref_top1 < 0.9      # the problem is not trivial
  assert abs(got['top1'] - ref_top1) <= 0.01
  assert abs(got['top5'] - top5(ref.decision_function(xt), test_y)) <= 0.01
  # The solver reaches sklearn's optimum of the same objective.
  ref_obj = objective(ref.coef_.T, ref.intercept_, xs, train_y, l2)
  assert got['loss'] == pytest.approx(ref_obj, rel=1e-4)
  assert got['train_top1'] == pytest.approx(ref.score(xs, train_y), abs=0.01)


def test_logistic_regression_normalize_flag():
  train_x, train_y = gaussian_mixture(1, 600, dim=10, num_classes=4)
  test_x, test_y = gaussian_mixture(2, 300, dim=10, num_classes=4)
  a = logreg.logistic_regression(train_x, train_y, test_x, test_y,
                                       num_classes=4, normalize=True,
                                       max_iter=50)
  b = logreg.logistic_regression(
      unit_rows(train_x).astype(np.float32), train_y,
      unit_rows(test_x).astype(np.float32), test_y, num_classes=4,
      normalize=False, max_iter=50)
  assert a['top1'] == pytest.approx(b['top1'], abs=1 / 300)
  assert a['loss'] == pytest.approx(b['loss'], rel=1e-4)
  # Top-5 of 4 classes is always right.
  assert a['top5'] == 1.0


def test_masked_rows_are_left_out_of_the_fit_and_the_accuracy():
  # Padding rows (mask False) of a multi-process feature array: the probe on
  # the masked arrays must equal the probe on the real rows alone.
  rng = np.random.default_rng(0)
  x = rng.normal(size=(120, 6)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0)
  mask = rng.random(120) > 0.3
  noisy_x = x.copy()
  noisy_x[~mask] = 50.            # would dominate the fit if counted
  noisy_y = np.where(mask, y, 3)
  kw = dict(num_classes=4, l2=1e-3, max_iter=200)
  want = logreg.logistic_regression(x[mask][:60], y[mask][:60],
                                          x[mask][60:], y[mask][60:], **kw)
  n_train = np.flatnonzero(mask)[59] + 1     # first 60 real rows: train
  got = logreg.logistic_regression(
      noisy_x[:n_train], noisy_y[:n_train], noisy_x[n_train:],
      noisy_y[n_train:], train_mask=mask[:n_train], test_mask=mask[n_train:],
      **kw)
  for k in ('top1', 'top5', 'train_top1'):
    assert got[k] == want[k], k
  # Same objective, summed in float32 over different row counts: the L-BFGS
  # iterates may differ by reassociation noise (~1e-7 relative per pass), and
  # at the optimum the objective is flat in them, so 1e-5 relative (~80 ulps)
  # bounds it; a counted padding row would move it by O(1).
  assert abs(got['loss'] - want['loss']) <= 1e-5 * abs(want['loss'])


def test_lbfgs_in_chunks_follows_one_plain_loop_and_reports_progress():
  """The fit runs in ~10 jitted chunks (for a progress bar); its iterates are
  those of a plain Python loop of optax L-BFGS iterations (each one jitted,
  for speed) over the same objective (unpreconditioned: P = I). The chunks
  share one compilation."""
  import jax
  import jax.numpy as jnp
  import optax
  x, y = gaussian_mixture(1, 500)
  xs = unit_rows(x).astype(np.float32)
  calls = []
  logreg._lbfgs_until.clear_cache()
  got = logreg.logistic_regression(
      x, y, x[:50], y[:50], num_classes=8, l2=1e-3, max_iter=23, tol=0.,
      precondition=False,
      on_progress=lambda it, total: calls.append((it, total)))
  assert calls == [(i, 23) for i in (3, 6, 9, 12, 15, 18, 21, 23)]
  assert logreg._lbfgs_until._cache_size() == 1

  def obj(p):
    logits = jnp.asarray(xs) @ p['w'] + p['b']
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.mean(ce) + 0.5e-3 * jnp.sum(p['w'] ** 2)

  solver = optax.lbfgs()

  @jax.jit
  def iteration(p, state):
    value, grad = optax.value_and_grad_from_state(obj)(p, state=state)
    updates, state = solver.update(grad, state, p, value=value, grad=grad,
                                   value_fn=obj)
    return optax.apply_updates(p, updates), state

  p = {'w': jnp.zeros((20, 8)), 'b': jnp.zeros((8,))}
  state = solver.init(p)
  for _ in range(23):
    p, state = iteration(p, state)
  assert got['num_iter'] == 23
  assert got['loss'] == pytest.approx(float(optax.tree.get(state, 'value')),
                                      rel=1e-5)


def test_sharded_features_compile_the_chunks_once():
  """On the evaluation's mesh (features sharded by rows, as the evaluators
  holds them) the chunks share one compilation too: the first chunk's carry
  is placed as the chunks return it (replicated on the mesh); an unplaced
  one compiled the loop twice per feature width."""
  import jax
  from contrastive_jax import runtime
  mesh = runtime.create_mesh()
  assert mesh.size == 8
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  x, y = gaussian_mixture(2, 512)
  sharded = [jax.device_put(a, rows) for a in (x, y, x[:64], y[:64])]
  logreg._lbfgs_until.clear_cache()
  got = logreg.logistic_regression(*sharded, num_classes=8, l2=1e-3,
                                         max_iter=20, tol=0.)
  assert got['num_iter'] == 20           # ten chunks of two iterations ran
  assert logreg._lbfgs_until._cache_size() == 1
  want = logreg.logistic_regression(x, y, x[:64], y[:64], num_classes=8,
                                          l2=1e-3, max_iter=20, tol=0.)
  assert abs(got['loss'] - want['loss']) <= 1e-5 * abs(want['loss'])


def test_on_a_mesh_each_device_multiplies_by_its_rows_of_the_preconditioner():
  """W^T = U_w^T P^T [C, D] on the evaluation's mesh: each of the 8 devices
  computes the C x D' / 8 columns of its rows of P (D = 20 padded to D' =
  24: 3 rows each), and only those columns are gathered, never P (D x D).
  Replicated, every device computed all of W^T; the loss equals the
  one-device fit's (test_sharded_features_compile_the_chunks_once)."""
  import re
  import jax
  from contrastive_jax import runtime
  mesh = runtime.create_mesh()
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  n, d, c = 512, 20, 8
  x, y, mask = (jax.device_put(a, rows) for a in (
      np.ones((n, d), np.float32), np.zeros(n, np.int32),
      np.ones(n, np.float32)))
  carry, mu, precond = jax.device_put(
      (logreg._initial_carry(c, d), np.zeros(d, np.float32),
       np.eye(d, dtype=np.float32)), replicated)
  hlo = logreg._lbfgs_until.lower(
      carry, x, y, mask, np.float32(1e-3), mu, precond, np.float32(0.),
      np.int32(5), layout=logreg._layout(x)).compile().as_text()
  gathered = [np.prod([int(s) for s in shape.split(',')]) for shape in
              re.findall(r'= f32\[([\d,]+)\]\S* all-gather\(', hlo)]
  assert gathered and max(gathered) == c * 24, gathered
  assert re.search(r'= f32\[8,3\]\S* dot\(', hlo)


def test_preconditioning_reaches_the_optimum_in_fewer_iterations():
  """On anisotropic, uncentred features (per-dimension scales over 3
  decades, like a trained encoder's spectrum; overlapping classes), 40
  preconditioned iterations reach sklearn's optimum of the same objective,
  where 40 plain ones are still far from it; both converge to the same
  point given enough iterations."""
  rng = np.random.default_rng(3)
  n, dim, classes = 4000, 60, 6
  scales = np.logspace(-3, 0, dim)
  centers = rng.normal(size=(classes, dim))
  y = rng.integers(0, classes, n)
  x = ((centers[y] + 4.0 * rng.normal(size=(n, dim))) * scales
       + 0.2).astype(np.float32)
  l2 = 1e-5
  # Newton's method: its few steps do not depend on the conditioning
  # (sklearn's L-BFGS needs ~2,900 iterations, 30 s, to the same optimum).
  ref = LogisticRegression(C=1.0 / (l2 * n), solver='newton-cholesky',
                           max_iter=100, tol=1e-12).fit(x.astype(np.float64),
                                                        y)
  best = objective(ref.coef_.T, ref.intercept_, x.astype(np.float64), y, l2)

  def gap(**kw):
    got = logreg.logistic_regression(
        x, y, x[:10], y[:10], num_classes=classes, l2=l2, normalize=False,
        tol=0., **kw)
    return (got['loss'] - best) / best

  assert abs(gap(max_iter=40)) <= 1e-5         # measured ~1e-7
  assert gap(max_iter=40, precondition=False) >= 0.1   # measured 0.27
  assert abs(gap(max_iter=1000, precondition=False)) <= 1e-4


def test_a_probe_on_new_shapes_builds_six_programs():
  """Inputs, moments, initial state, the L-BFGS loop, the solution and the
  accuracies: each one jitted program, and no eager op around them (on 8
  devices each eager op was a program of its own: 51 in all, ~2.5 s of
  compilation per feature width before the loop ran)."""
  import jax
  from contrastive_jax import runtime
  rows = jax.sharding.NamedSharding(runtime.create_mesh(),
                                    jax.sharding.PartitionSpec('data'))
  x, y = gaussian_mixture(4, 512)
  x = np.concatenate([x, x[:, :7]], axis=1)     # a width no test used
  args = [jax.device_put(a, rows) for a in (x, y, x[:64], y[:64])]
  with compilations.programs_built() as built:
    logreg.logistic_regression(*args, num_classes=8, max_iter=4)
  assert len(built) <= 6
