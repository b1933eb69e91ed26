"""Linear probes on frozen (cached) features.

Two protocols, kept apart on purpose because they give different numbers:

* `logistic_regression`: full-batch multinomial logistic regression with L2
  regularisation, solved to convergence with L-BFGS. Deterministic, no
  learning rate or epochs to tune; the cheap probe for monitoring and
  ablations (features optionally L2-normalised first).
* `train_linear_probe`: the papers' minibatch SGD/Adam linear classifier on
  cached features, with their hyperparameters in `PRESETS`. It reports the
  last-epoch and the best-epoch test accuracy under separate names, since
  papers differ in which one they print.

Accuracies are fractions in [0, 1]. Neither probe augments: features are
computed once (the papers' probes use crop/flip augmentation; with cached
features that is not possible).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from contrastive_jax.losses.common import l2_normalize


def _prepare(x, normalize: bool) -> jax.Array:
  """[N, D] float32 features, L2-normalised per row if asked."""
  x = jnp.asarray(x, jnp.float32)
  return l2_normalize(x) if normalize else x


def _topk_accuracy(logits: jax.Array, labels: jax.Array, k: int,
                   mask: jax.Array | None = None) -> jax.Array:
  """Fraction of (unmasked) rows whose label is among the k largest logits.

  Counting logits strictly greater than the label's logit ranks ties in the
  label's favour, so top-k with k >= num_classes is exactly 1.
  """
  true_logit = jnp.take_along_axis(logits, labels[:, None], axis=1)
  rank = jnp.sum(logits > true_logit, axis=1)
  if mask is None:
    return jnp.mean(rank < k)
  mask = mask.astype(jnp.float32)
  return jnp.sum((rank < k) * mask) / jnp.sum(mask)


def _check_xy(x, y, name):
  if np.ndim(x) != 2 or np.shape(y) != (np.shape(x)[0],):
    raise ValueError(f'{name}_x must be [N, D] and {name}_y [N]; got '
                     f'{np.shape(x)} and {np.shape(y)}.')


# ---------------------------------------------------------------------------
# Full-batch L-BFGS logistic regression.
# ---------------------------------------------------------------------------


def _lbfgs_step(x, y, mask, l2):
  """One L-BFGS iteration on (params, state) for mean CE + l2 / 2 ||W||^2
  (bias unpenalised).

  x: [N, D] float32 features (sharded by rows or not: under jit the
  partitioner reduces the mean across devices and processes); y: [N] int32
  labels; mask: [N] float32, 1 for real rows, 0 for padding (left out of the
  mean).
  """
  def objective(p):
    logits = x @ p['w'] + p['b']
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.sum(ce * mask) / jnp.sum(mask) + 0.5 * l2 * jnp.sum(jnp.square(p['w']))

  solver = optax.lbfgs()
  # Reuses the value and gradient the line search already computed.
  value_and_grad = optax.value_and_grad_from_state(objective)

  def step(carry):
    p, state = carry
    value, grad = value_and_grad(p, state=state)
    updates, state = solver.update(grad, state, p, value=value, grad=grad,
                                   value_fn=objective)
    return optax.apply_updates(p, updates), state

  return step


@jax.jit
def _lbfgs_until(carry, x, y, mask, l2, tol, until):
  """L-BFGS iterations from `carry` until `until` in all or ||grad|| < tol.

  `until` is traced: the chunks of one fit share one compilation.
  """
  def not_done(carry):
    _, state = carry
    count = optax.tree.get(state, 'count')
    grad_norm = optax.tree.norm(optax.tree.get(state, 'grad'))
    return (count == 0) | ((count < until) & (grad_norm >= tol))

  return jax.lax.while_loop(not_done, _lbfgs_step(x, y, mask, l2), carry)


def _fit_logistic(x, y, mask, l2, tol, *, num_classes, max_iter,
                  on_progress=None):
  """Minimises the probe's objective (`_lbfgs_step`) with L-BFGS from zero.

  Runs in ~10 jitted chunks of iterations, so that `on_progress(iterations,
  max_iter)` can report after each; the iterates are those of one loop.

  Returns:
    (params {'w': [D, C], 'b': [C]}, final objective, iterations, grad norm).
  """
  d = x.shape[1]
  params = {'w': jnp.zeros((d, num_classes), jnp.float32),
            'b': jnp.zeros((num_classes,), jnp.float32)}
  carry = (params, optax.lbfgs().init(params))
  chunk = max(1, -(-max_iter // 10))
  for until in range(chunk, max_iter + chunk, chunk):
    until = min(until, max_iter)
    carry = _lbfgs_until(carry, x, y, mask, l2, tol, jnp.int32(until))
    count, grad_norm = jax.device_get(
        (optax.tree.get(carry[1], 'count'),
         optax.tree.norm(optax.tree.get(carry[1], 'grad'))))
    if on_progress is not None:
      on_progress(int(count), max_iter)
    if count < until or grad_norm < tol:   # Converged before the cap.
      break
  params, state = carry
  return (params, optax.tree.get(state, 'value'),
          optax.tree.get(state, 'count'),
          optax.tree.norm(optax.tree.get(state, 'grad')))


def _mask(mask, n: int) -> jax.Array:
  return jnp.ones((n,), jnp.float32) if mask is None else jnp.asarray(
      mask, jnp.float32)


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
                        max_iter: int = 100, tol: float = 1e-5,
                        train_mask=None, test_mask=None,
                        on_progress=None) -> dict[str, float]:
  """Multinomial logistic-regression probe (full batch, L-BFGS, in JAX).

  Minimises  mean_i CE(W x_i + b, y_i) + l2 / 2 * ||W||_F^2  (the bias is not
  penalised). This is scikit-learn's `LogisticRegression(C=1 / (l2 * N_train))`
  objective (lbfgs solver, multinomial), up to a factor of N_train.

  Deterministic: zero initialisation, full batch, no randomness.

  Args:
    train_x: [N, D] training features (numpy or jax).
    train_y: [N] int labels in [0, num_classes).
    test_x: [M, D] test features.
    test_y: [M] int labels.
    num_classes: C.
    l2: weight-decay coefficient on the mean loss. The default suits
      L2-normalised features (unit-norm inputs need large weights).
    normalize: L2-normalise every feature row (train and test) first.
    max_iter: cap on L-BFGS iterations. 100 (sklearn's default) is usually
      not full convergence: on Fashion-MNIST pixels (60k x 784) it gives
      84.1% vs 84.3% at 300 iterations, at a third of the cost.
    tol: stop once ||grad||_2 < tol.
    train_mask, test_mask: [N] / [M] bool, False for padding rows (the
      padded tails of a multi-process feature array); default all real.
      Features and labels may be global jax Arrays sharded over processes.
    on_progress: called as on_progress(iterations so far, max_iter) about
      ten times during the fit (a progress bar).

  Returns:
    {'top1', 'top5': test accuracy, 'train_top1', 'loss': final training
    objective, 'num_iter': iterations run, 'grad_norm': final ||grad||}.
  """
  _check_xy(train_x, train_y, 'train')
  _check_xy(test_x, test_y, 'test')
  x = _prepare(train_x, normalize)
  y = jnp.asarray(train_y, jnp.int32)
  train_mask = _mask(train_mask, np.shape(train_y)[0])
  test_mask = _mask(test_mask, np.shape(test_y)[0])
  params, value, count, grad_norm = _fit_logistic(
      x, y, train_mask, jnp.float32(l2), jnp.float32(tol),
      num_classes=int(num_classes), max_iter=int(max_iter),
      on_progress=on_progress)
  tx = _prepare(test_x, normalize)
  ty = jnp.asarray(test_y, jnp.int32)
  top1, top5, train_top1 = _probe_accuracies(params, x, y, train_mask, tx, ty,
                                             test_mask)
  return {
      'top1': float(top1),
      'top5': float(top5),
      'train_top1': float(train_top1),
      'loss': float(value),
      'num_iter': int(count),
      'grad_norm': float(grad_norm),
  }


# ---------------------------------------------------------------------------
# Minibatch SGD / Adam probe with the papers' presets.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """Hyperparameters of `train_linear_probe` (see PRESETS for sources)."""
  optimizer: str = 'sgd'            # 'sgd' or 'adam'
  lr: float = 0.1
  epochs: int = 100
  batch_size: int = 256
  momentum: float = 0.9             # SGD only (PyTorch-style heavy ball)
  adam_b1: float = 0.9              # Adam only
  adam_b2: float = 0.999
  weight_decay: float = 0.0         # coupled L2 (PyTorch weight_decay)
  schedule: str = 'constant'        # 'constant', 'cosine' or 'step'
  milestones: tuple[int, ...] = ()  # epochs at which 'step' decays
  lr_decay: float = 0.1             # 'step' multiplier per milestone
  cosine_final: float = 0.0         # 'cosine' final lr as a fraction of lr


# Values and sources: /work/shared/notes (cacr.md section 4, tcl.md 5.1-5.3,
# macl.md 6.1).
PRESETS: dict[str, ProbeConfig] = {
    # MoCo v1/v2 ImageNet linear eval (also CACR's ImageNet protocol).
    'moco': ProbeConfig(optimizer='sgd', lr=30.0, epochs=100, batch_size=256,
                        momentum=0.9, weight_decay=0.0, schedule='step',
                        milestones=(60, 80), lr_decay=0.1),
    # CACR small-scale code: Adam(0.5, 0.999), batch 128, x0.2 at 60 and 80.
    'cacr_small': ProbeConfig(optimizer='adam', lr=1e-3, epochs=100,
                              batch_size=128, adam_b1=0.5, adam_b2=0.999,
                              weight_decay=0.0, schedule='step',
                              milestones=(60, 80), lr_decay=0.2),
    # TCL linear stage: SGD(0.9, wd 1e-4), lr 0.5, cosine to 1e-3 * lr,
    # 50 epochs, 64 images per step (FMNIST code). The code decays per epoch;
    # here per step.
    'tcl': ProbeConfig(optimizer='sgd', lr=0.5, epochs=50, batch_size=64,
                       momentum=0.9, weight_decay=1e-4, schedule='cosine',
                       cosine_final=1e-3),
    # MACL: SGD lr 0.02, momentum 0.9, wd 0, 100 epochs; batch and schedule
    # unstated (notes recommend 256, constant).
    'macl': ProbeConfig(optimizer='sgd', lr=0.02, epochs=100, batch_size=256,
                        momentum=0.9, weight_decay=0.0, schedule='constant'),
}


def _lr_schedule(cfg: ProbeConfig, steps_per_epoch: int) -> optax.Schedule:
  total = cfg.epochs * steps_per_epoch
  if cfg.schedule == 'constant':
    return optax.constant_schedule(cfg.lr)
  if cfg.schedule == 'cosine':
    return optax.cosine_decay_schedule(cfg.lr, total, alpha=cfg.cosine_final)
  if cfg.schedule == 'step':
    return optax.piecewise_constant_schedule(
        cfg.lr, {m * steps_per_epoch: cfg.lr_decay for m in cfg.milestones})
  raise ValueError(f"schedule must be 'constant', 'cosine' or 'step'; got "
                   f'{cfg.schedule!r}.')


def _make_optimizer(cfg: ProbeConfig,
                    steps_per_epoch: int) -> optax.GradientTransformation:
  lr = _lr_schedule(cfg, steps_per_epoch)
  # Coupled L2 added to the gradient before the optimiser, as PyTorch's
  # SGD/Adam `weight_decay` does (what the papers' code used).
  decay = optax.add_decayed_weights(cfg.weight_decay)
  if cfg.optimizer == 'sgd':
    opt = optax.sgd(lr, momentum=cfg.momentum or None)
  elif cfg.optimizer == 'adam':
    opt = optax.adam(lr, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=1e-8)
  else:
    raise ValueError(f"optimizer must be 'sgd' or 'adam'; got "
                     f'{cfg.optimizer!r}.')
  return optax.chain(decay, opt)


def train_linear_probe(train_x, train_y, test_x, test_y, *, num_classes: int,
                       preset: str | None = None,
                       optimizer: str | None = None, lr: float | None = None,
                       epochs: int | None = None,
                       batch_size: int | None = None,
                       momentum: float | None = None,
                       weight_decay: float | None = None,
                       schedule: str | None = None,
                       milestones: tuple[int, ...] | None = None,
                       lr_decay: float | None = None, seed: int = 0,
                       normalize: bool = False) -> dict[str, Any]:
  """Minibatch linear classifier on cached features, evaluated every epoch.

  Each epoch visits every training example once in a fresh random order (the
  last batch is smaller if N is not a multiple of the batch size, like a
  PyTorch DataLoader without drop_last). After each epoch the test set is
  scored; `top1_last` is the final epoch, `top1_best` the maximum over epochs
  (a number some papers report, which is optimistic: it selects on the test
  set).

  Args:
    train_x: [N, D] training features.
    train_y: [N] int labels.
    test_x: [M, D] test features.
    test_y: [M] int labels.
    num_classes: C.
    preset: a key of PRESETS, or None for the ProbeConfig defaults.
    optimizer: 'sgd' or 'adam'.
    lr: peak learning rate.
    epochs: passes over the training set.
    batch_size: examples per step.
    momentum: SGD momentum (0 for plain SGD).
    weight_decay: coupled L2 coefficient (PyTorch `weight_decay`).
    schedule: 'constant', 'cosine' (per step, over all epochs) or 'step'.
    milestones: epochs at which 'step' multiplies the lr by `lr_decay`.
    lr_decay: the 'step' factor.
    seed: shuffling seed (the weights start at zero, as in the MoCo code).
    normalize: L2-normalise features first (the papers' probes do not).

  Every hyperparameter left as None comes from the preset (or ProbeConfig's
  defaults); the config actually used is returned under 'config'.

  Returns:
    {'top1_last', 'top5_last', 'top1_best', 'best_epoch' (1-based; first
    epoch reaching the best), 'train_loss_last', 'top1_per_epoch' (list),
    'config' (the ProbeConfig used)}.
  """
  _check_xy(train_x, train_y, 'train')
  _check_xy(test_x, test_y, 'test')
  if preset is not None and preset not in PRESETS:
    raise ValueError(f'unknown preset {preset!r}; known: {sorted(PRESETS)}.')
  cfg = PRESETS[preset] if preset is not None else ProbeConfig()
  overrides = dict(optimizer=optimizer, lr=lr, epochs=epochs,
                   batch_size=batch_size, momentum=momentum,
                   weight_decay=weight_decay, schedule=schedule,
                   milestones=milestones, lr_decay=lr_decay)
  cfg = dataclasses.replace(
      cfg, **{k: v for k, v in overrides.items() if v is not None})
  x = _prepare(train_x, normalize)
  y = jnp.asarray(train_y, jnp.int32)
  tx = _prepare(test_x, normalize)
  ty = jnp.asarray(test_y, jnp.int32)
  n, d = x.shape
  batch = min(cfg.batch_size, n)
  steps_per_epoch = math.ceil(n / batch)
  tx_opt = _make_optimizer(cfg, steps_per_epoch)
  params = {'w': jnp.zeros((d, num_classes), jnp.float32),
            'b': jnp.zeros((num_classes,), jnp.float32)}
  opt_state = tx_opt.init(params)
  run_epoch = _make_epoch_fn(tx_opt, n=n, batch=batch,
                             steps_per_epoch=steps_per_epoch)
  key = jax.random.key(seed)
  top1, top5, losses = [], [], []
  for epoch in range(cfg.epochs):
    params, opt_state, loss = run_epoch(params, opt_state, x, y,
                                        jax.random.fold_in(key, epoch))
    e_top1, e_top5 = _evaluate(params, tx, ty)
    top1.append(float(e_top1))
    top5.append(float(e_top5))
    losses.append(float(loss))
  best = int(np.argmax(top1))
  return {
      'top1_last': top1[-1],
      'top5_last': top5[-1],
      'top1_best': top1[best],
      'best_epoch': best + 1,
      'train_loss_last': losses[-1],
      'top1_per_epoch': top1,
      'config': cfg,
  }


@jax.jit
def _evaluate(params, x, y):
  logits = x @ params['w'] + params['b']
  return _topk_accuracy(logits, y, 1), _topk_accuracy(logits, y, 5)


def _make_epoch_fn(tx_opt, *, n, batch, steps_per_epoch):
  """A jitted function running one shuffled epoch as a `lax.scan` of steps."""

  def loss_fn(params, xb, yb, mask):
    logits = xb @ params['w'] + params['b']
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, yb)
    # Mean over the real rows of the batch only (the last one may be short).
    return jnp.sum(ce * mask) / jnp.sum(mask)

  @jax.jit
  def run_epoch(params, opt_state, x, y, key):
    perm = jax.random.permutation(key, n)
    pad = steps_per_epoch * batch - n
    # Padding slots point at row 0 with mask 0: fixed shapes for the scan.
    perm = jnp.concatenate([perm, jnp.zeros((pad,), perm.dtype)])
    mask = (jnp.arange(steps_per_epoch * batch) < n).astype(jnp.float32)
    perm = perm.reshape(steps_per_epoch, batch)
    mask = mask.reshape(steps_per_epoch, batch)

    def step(carry, inputs):
      params, opt_state = carry
      idx, m = inputs
      loss, grads = jax.value_and_grad(loss_fn)(params, x[idx], y[idx], m)
      updates, opt_state = tx_opt.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state),
                                               (perm, mask))
    return params, opt_state, jnp.mean(losses)

  return run_epoch
