"""The optimizer and its learning-rate schedule, from `config.optimizer`.

Peak lr = base_learning_rate x batch / 256, linear warmup, then cosine or
step decay; Adam(W), SGD with momentum or LARS. Weight decay and LARS skip
1-D leaves (biases, BatchNorm) unless `decay_biases_and_bn`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(config, total_steps: int) -> optax.Schedule:
  """Step -> learning rate: linear warmup, then cosine decay or steps.

  Warmup rises from `warmup_init_lr` to the peak over W steps; 'cosine' is
    lr(t) = f + (peak - f) (1 + cos(pi (t - W) / (T - W))) / 2,
  f = cosine_final x peak; 'step' multiplies by `lr_decay` at each of
  `decay_epochs`. Evaluated at every step (docs/recipe_audit.md).
  """
  opt = config.optimizer
  # Linear scaling rule (Goyal et al. 2017): lr = base_lr * batch / 256.
  peak = opt.base_learning_rate * config.batch_size / 256
  warmup = int(opt.warmup_fraction * total_steps)
  init = opt.warmup_init_lr
  kind = opt.schedule
  if kind not in ('cosine', 'step'):
    raise ValueError(f'config.optimizer.schedule={kind!r}; known: cosine, '
                     'step.')
  final = opt.cosine_final
  if (isinstance(final, bool) or not isinstance(final, (int, float))
      or not 0. <= final < 1.):
    raise ValueError(
        f'config.optimizer.cosine_final={final!r} must be a number in [0, 1): '
        'the cosine\'s last learning rate as a fraction of the peak (0: '
        'decay to 0; SupContrast: 1e-3).')
  if kind != 'cosine' and final:
    raise ValueError(
        f'config.optimizer.cosine_final={final!r} applies to '
        f"config.optimizer.schedule='cosine' only; got schedule {kind!r} "
        '(set cosine_final=0).')
  if kind == 'cosine' and not opt.warmup_fraction:
    # No warmup configured (MoCo v2); one that rounds to 0 steps gets one.
    return optax.cosine_decay_schedule(peak, max(total_steps, 1),
                                       alpha=float(final))
  if kind == 'cosine':
    # warmup + 2: a valid schedule for runs of 0 or 1 steps.
    return optax.warmup_cosine_decay_schedule(
        init_value=init, peak_value=peak, warmup_steps=max(warmup, 1),
        decay_steps=max(total_steps, warmup + 2), end_value=final * peak)
  steps_per_epoch = total_steps / float(config.num_epochs)
  steps = optax.piecewise_constant_schedule(peak, {
      int(round(e * steps_per_epoch)): opt.lr_decay
      for e in opt.decay_epochs})
  if not warmup:
    return steps
  return optax.join_schedules(
      [optax.linear_schedule(init, peak, warmup),
       lambda step: steps(step + warmup)], [warmup])


def scale_by_clipped_trust_ratio(trust_coefficient: float,
                                 weight_decay: float,
                                 learning_rate: optax.Schedule, *, mask,
                                 eps: float = 1e-8
                                 ) -> optax.GradientTransformation:
  """solo-learn's LARS adaptation with `clip_lr` (solo/utils/lars.py).

  For a `mask` leaf w with gradient g, both nonzero, at learning rate lr:
    ratio = eta ||w|| / (||g|| + wd ||w|| + eps),
    u = min(ratio / lr, 1) (g + wd w),
  so the trust ratio caps the layer's rate at lr. Other leaves pass g.
  """

  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params):
    lr = learning_rate(state.count)

    def leaf(g, w, adapt):
      if not adapt:
        return g
      w_norm, g_norm = jnp.linalg.norm(w), jnp.linalg.norm(g)
      ratio = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm
                                            + eps)
      factor = jnp.where(ratio < lr, ratio / jnp.where(lr > 0, lr, 1.), 1.)
      return jnp.where((w_norm > 0) & (g_norm > 0),
                       factor * (g + weight_decay * w), g)

    out = jax.tree.map(leaf, updates, params, mask(params))
    return out, optax.ScaleByScheduleState(
        count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def decay_mask(params, *, decay_biases_and_bn: bool):
  """The leaves weight decay and LARS apply to: kernels (ndim > 1), or every
  leaf with `decay_biases_and_bn`."""
  return jax.tree.map(lambda p: bool(decay_biases_and_bn) or p.ndim > 1,
                      params)


def create_optimizer(config, schedule: optax.Schedule
                     ) -> optax.GradientTransformation:
  """The configured optimizer on `schedule` (`learning_rate_schedule`)."""
  opt = config.optimizer
  mask = functools.partial(decay_mask,
                           decay_biases_and_bn=opt.decay_biases_and_bn)
  if opt.name == 'adamw':
    return optax.adamw(schedule, weight_decay=opt.weight_decay, mask=mask)
  if opt.name == 'adam':
    # torch's Adam(weight_decay=wd): L2 added to the gradient (coupled).
    return optax.chain(optax.add_decayed_weights(opt.weight_decay, mask=mask),
                       optax.adam(schedule))
  if opt.name == 'sgd':
    return optax.chain(
        optax.add_decayed_weights(opt.weight_decay, mask=mask),
        optax.sgd(schedule, momentum=opt.momentum, nesterov=False))
  if opt.name == 'lars':
    trust = opt.trust_coefficient
    if not opt.clip_lr:
      return optax.lars(schedule, weight_decay=opt.weight_decay,
                        weight_decay_mask=mask,
                        trust_ratio_mask=mask, momentum=opt.momentum,
                        trust_coefficient=trust)
    return optax.chain(
        scale_by_clipped_trust_ratio(trust, opt.weight_decay, schedule,
                                     mask=mask),
        optax.trace(decay=opt.momentum),
        optax.scale_by_learning_rate(schedule))
  raise ValueError(f'unknown optimizer {opt.name!r} (config.optimizer.name); '
                   'known: adam, adamw, sgd, lars.')
