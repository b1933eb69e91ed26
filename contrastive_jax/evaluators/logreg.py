"""Logistic regression on frozen features by full-batch L-BFGS in whitened
coordinates (W = P U; docs/evaluation.md derives P): nothing to tune, the
cheap probe, not the papers' protocol (`linear_eval.py`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.linalg.lapack

from contrastive_jax import progress
from contrastive_jax.evaluators import base
from contrastive_jax.losses.common import l2_normalize


@functools.partial(jax.jit, static_argnames=('normalize',))
def _inputs(train_x, train_y, train_mask, test_x, test_y, test_mask, *,
            normalize: bool):
  """Features float32 (L2-normalised if asked), labels int32, masks float32
  (1 for real rows), in one program, each in its input's sharding."""
  def features(x):
    x = jnp.asarray(x, jnp.float32)
    return l2_normalize(x) if normalize else x
  return (features(train_x), train_y.astype(jnp.int32),
          train_mask.astype(jnp.float32), features(test_x),
          test_y.astype(jnp.int32), test_mask.astype(jnp.float32))


def _topk_accuracy(logits, labels, k: int, mask) -> jax.Array:
  """Fraction of rows of float `mask` 1 whose label is among the k largest
  logits (ties in the label's favour)."""
  true_logit = jnp.take_along_axis(logits, labels[:, None], axis=1)
  rank = jnp.sum(logits > true_logit, axis=1)
  return jnp.sum((rank < k) * mask) / jnp.sum(mask)



# Rows of the strided sample estimating the preconditioner's covariance: a
# D <= 2048 covariance to ~1% (P changes the speed, not the optimum).
PRECOND_ROWS = 16384


@functools.partial(jax.jit, static_argnames=('replicated',))
def _moments(x, mask, *, replicated):
  """(mu [D], Sigma [D, D]) of a strided sample of <= PRECOND_ROWS unmasked
  rows of x, in the `replicated` sharding (None off a mesh)."""
  stride = max(1, x.shape[0] // PRECOND_ROWS)
  xs, ms = x[::stride], mask[::stride, None]
  mu = jnp.sum(xs * ms, axis=0) / jnp.sum(ms)
  xc = (xs - mu) * ms
  cov = xc.T @ xc / jnp.sum(ms)
  if replicated is not None:
    mu, cov = jax.lax.with_sharding_constraint((mu, cov), replicated)
  return mu, cov


def _replicated(x) -> jax.sharding.NamedSharding | None:
  """The replicated sharding of x's mesh; None if x is not on a mesh."""
  sharding = getattr(x, 'sharding', None)
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh,
                                      jax.sharding.PartitionSpec())
  return None


def _layout(x) -> jax.sharding.NamedSharding | None:
  """x's sharding if its rows are split over a mesh axis, else None."""
  sharding = getattr(x, 'sharding', None)
  if (isinstance(sharding, jax.sharding.NamedSharding) and sharding.spec
      and sharding.spec[0] is not None):
    return sharding
  return None


def _split_rows(precond, layout: jax.sharding.NamedSharding):
  """P [D, D] -> [D', D], zero-padded to a multiple of the devices of the
  layout's row axis and split by rows over it."""
  axis = layout.spec[0]
  n = int(np.prod([layout.mesh.shape[a] for a in np.atleast_1d(axis)]))
  precond = jnp.pad(precond, ((0, -precond.shape[0] % n), (0, 0)))
  return jax.lax.with_sharding_constraint(precond, jax.sharding.NamedSharding(
      layout.mesh, jax.sharding.PartitionSpec(axis, None)))


def _preconditioner(x, mask, l2: float, *, num_classes: int):
  """(mu [D], P [D, D]): the features' mean and P = L^-T, L L^T = Sigma / C
  + l2 I, so that logits = (x - mu) P U_w + U_b have unit curvature in U at 0
  (docs/evaluation.md); factored on the host in float64."""
  replicated = _replicated(x)
  mu, cov = _moments(x, mask, replicated=replicated)
  d = cov.shape[0]
  chol = np.linalg.cholesky(np.asarray(cov, np.float64) / num_classes
                            + l2 * np.eye(d))
  # LAPACK's triangular inverse: a third of solving L X = I's flops.
  inverse, info = scipy.linalg.lapack.dtrtri(chol, lower=1)
  if info:
    raise np.linalg.LinAlgError(f'dtrtri failed (info={info}).')
  return mu, jax.device_put(inverse.T.astype(np.float32), replicated)


def _weights(u, mu, precond, layout=None):
  """(W^T [C, D], b [C]) from the solver's U: W^T = U_w^T P^T (transposed:
  XLA:CPU's gradient g^T x is ~3x faster than x^T g). On a mesh each device
  computes its columns of W^T from its rows of P, in a shard_map."""
  if layout is None:
    wt = u['w'] @ precond.T
  else:
    axis = layout.spec[0]

    def columns(uw, rows):        # [C, D], [D' / devices, D] -> [C, D']
      return jax.lax.all_gather(uw @ rows.T, axis, axis=1, tiled=True,
                                to='invarying')
    wt = jax.shard_map(
        columns, mesh=layout.mesh,
        in_specs=(jax.sharding.PartitionSpec(),
                  jax.sharding.PartitionSpec(axis, None)),
        out_specs=jax.sharding.PartitionSpec())(
            u['w'], precond)[:, :mu.shape[0]]
  return wt, u['b'] - wt @ mu


def _objective(x, y, mask, l2, mu, precond, layout=None):
  """U -> mean over real rows (mask 1) of CE(x W + b, y) + l2 / 2 ||W||^2,
  (W^T, b) = `_weights(U)`; x [N, D], y [N], mask [N], sharded or not."""
  def objective(u):
    wt, b = _weights(u, mu, precond, layout)
    logits = jnp.einsum('nd,cd->nc', x, wt) + b
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return (jnp.sum(ce * mask) / jnp.sum(mask)
            + 0.5 * l2 * jnp.sum(jnp.square(wt)))
  return objective


def _progress(state):
  """(iterations, ||grad||) of an optax L-BFGS state."""
  return (optax.tree.get(state, 'count'),
          optax.tree.norm(optax.tree.get(state, 'grad')))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _initial_carry(num_classes: int, d: int):
  """(U = 0: U_w^T [C, D], U_b [C]; L-BFGS state), strongly typed so that
  every chunk of the L-BFGS loop shares one compilation."""
  params = {'w': jnp.zeros((num_classes, d), jnp.float32),
            'b': jnp.zeros((num_classes,), jnp.float32)}
  return jax.tree.map(lambda a: a.astype(a.dtype),
                      (params, optax.lbfgs().init(params)))


@functools.partial(jax.jit, static_argnames=('layout',))
def _lbfgs_until(carry, x, y, mask, l2, mu, precond, tol, until, *,
                 layout=None):
  """L-BFGS from `carry` until `until` iterations in all (traced) or
  ||grad_U|| < tol: (carry, (iterations so far, ||grad_U||))."""
  def not_done(carry):
    count, grad_norm = _progress(carry[1])
    return (count == 0) | ((count < until) & (grad_norm >= tol))

  if layout is not None:
    precond = _split_rows(precond, layout)
  objective = _objective(x, y, mask, l2, mu, precond, layout)
  solver = optax.lbfgs()
  # Reuses the value and gradient the line search already computed.
  value_and_grad = optax.value_and_grad_from_state(objective)

  def step(carry):
    p, state = carry
    value, grad = value_and_grad(p, state=state)
    updates, state = solver.update(grad, state, p, value=value, grad=grad,
                                   value_fn=objective)
    return optax.apply_updates(p, updates), state

  carry = jax.lax.while_loop(not_done, step, carry)
  return carry, _progress(carry[1])


@jax.jit
def _solution(carry, mu, precond):
  """({'w': [D, C], 'b': [C]}, final objective) from the solver's carry."""
  u, state = carry
  wt, b = _weights(u, mu, precond)
  return {'w': wt.T, 'b': b}, optax.tree.get(state, 'value')


@jax.jit
def _probe_accuracies(params, x, y, train_mask, tx, ty, test_mask):
  """(test top-1, test top-5, train top-1): 0-d, hence replicated, scalars."""
  logits = tx @ params['w'] + params['b']
  train_logits = x @ params['w'] + params['b']
  return (_topk_accuracy(logits, ty, 1, test_mask),
          _topk_accuracy(logits, ty, 5, test_mask),
          _topk_accuracy(train_logits, y, 1, train_mask))


def logistic_regression(train_x, train_y, test_x, test_y, *, num_classes: int,
                        l2: float = 1e-5, normalize: bool = True,
                        max_iter: int = 50, tol: float = 1e-5,
                        precondition: bool = True, train_mask=None,
                        test_mask=None, on_progress=None) -> dict[str, float]:
  """Multinomial logistic-regression probe: minimises mean_i CE(W x_i + b,
  y_i) + l2 / 2 ||W||_F^2 (scikit-learn's C = 1 / (l2 N_train) objective
  / N_train) from zero on features [N, D] / [M, D] (numpy or global jax
  arrays), masks False on padding. Returns {'top1', 'top5' (test),
  'train_top1', 'loss', 'num_iter', 'grad_norm'}."""
  for name, x, y in (('train', train_x, train_y), ('test', test_x, test_y)):
    if np.ndim(x) != 2 or np.shape(y) != (np.shape(x)[0],):
      raise ValueError(f'{name}_x must be [N, D] and {name}_y [N]; got '
                       f'{np.shape(x)} and {np.shape(y)}.')
  # Host arrays stay numpy (not jnp: an eager op is one more program).
  host = lambda a: a if isinstance(a, jax.Array) else np.asarray(a)
  mask = lambda m, y: (np.ones((np.shape(y)[0],), np.float32) if m is None
                       else host(m))
  x, y, train_mask, tx, ty, test_mask = _inputs(
      host(train_x), host(train_y), mask(train_mask, train_y), host(test_x),
      host(test_y), mask(test_mask, test_y), normalize=bool(normalize))
  num_classes, max_iter, d = int(num_classes), int(max_iter), x.shape[1]
  l2, tol = np.float32(l2), np.float32(tol)   # The objective's float32 values.
  if precondition:
    mu, precond = _preconditioner(x, train_mask, float(l2),
                                  num_classes=num_classes)
  else:                                       # Plain L-BFGS on W.
    mu, precond = np.zeros((d,), np.float32), np.eye(d, dtype=np.float32)
  carry = _initial_carry(num_classes, d)
  # Replicated as a chunk returns it: one compilation for every chunk.
  if (replicated := _replicated(x)) is not None:
    carry, mu, precond = jax.device_put((carry, mu, precond), replicated)
  layout = _layout(x)
  chunk = max(1, -(-max_iter // 10))          # ~10 chunks for on_progress.
  for until in range(chunk, max_iter + chunk, chunk):
    until = min(until, max_iter)
    carry, (count, grad_norm) = _lbfgs_until(
        carry, x, y, train_mask, l2, mu, precond, tol, np.int32(until),
        layout=layout)
    count, grad_norm = jax.device_get((count, grad_norm))
    if on_progress is not None:
      on_progress(int(count), max_iter)
    if count < until or grad_norm < tol:   # Converged before the cap.
      break
  params, value = _solution(carry, mu, precond)
  top1, top5, train_top1 = _probe_accuracies(params, x, y, train_mask, tx, ty,
                                             test_mask)
  return {'top1': float(top1), 'top5': float(top5),
          'train_top1': float(train_top1), 'loss': float(value),
          'num_iter': int(count), 'grad_norm': float(grad_norm)}


class LogReg(base.Evaluator):
  """`logistic_regression` on L2-normalised features of the training split,
  scored on the evaluation split. Metrics: 'linear_top1', 'linear_top5', ...
  """
  type = 'logreg'
  DEFAULTS = {'l2': 1e-5, 'max_iter': 50}
  UNITS = 10      # Its share of a progress bar, filled with its iterations.

  def validate(self, config, *, num_devices: int,
               num_train: int | None = None) -> None:
    if self.cfg.max_iter < 1:
      raise ValueError(f'config.evals.{self.name}.max_iter='
                       f'{self.cfg.max_iter} must be >= 1 (to turn it off: '
                       f'config.evals.{self.name}.every_steps=-1).')

  def units(self, env) -> int:
    return self.UNITS

  def __call__(self, rep: base.Representation, *, bar=progress.NO_BAR
               ) -> dict[str, float]:
    train, test = rep.features('train'), rep.features('test')
    shown = [0]    # Units shown so far: UNITS over max_iter.

    def on_progress(iterations, max_iter):
      units = self.UNITS * iterations // max_iter
      bar.update(units - shown[0])
      shown[0] = units
      bar.set_postfix_str(f'logistic regression (L-BFGS), iteration '
                          f'{iterations}/{max_iter}')

    out = logistic_regression(
        train.x, train.label, test.x, test.label,
        num_classes=rep.env.num_classes, l2=self.cfg.l2,
        max_iter=self.cfg.max_iter, train_mask=train.mask,
        test_mask=test.mask, on_progress=on_progress)
    bar.update(self.UNITS - shown[0])    # Converged early: the rest at once.
    return {f'linear_{k}': float(v) for k, v in out.items()}
