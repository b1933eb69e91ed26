"""The optimizer and its learning-rate schedule, from `config.optimizer`.

Linear scaling (peak lr = base_learning_rate x batch / 256), warmup, then
cosine decay (to 0 or to a floor, `cosine_final`) or step decay; AdamW, SGD
with momentum, or LARS (optax's, or solo-learn's clipped variant). Weight
decay and LARS adaptation skip biases and BatchNorm parameters (1-D leaves)
unless `decay_biases_and_bn`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(config, total_steps: int) -> optax.Schedule:
  """Step -> learning rate: linear warmup, then cosine decay or steps.

  `config.optimizer.schedule`: 'cosine' (SimCLR, MoCo v2/v3) or 'step'
  (InsDis, MoCo v1: multiplied by `lr_decay` at each of `decay_epochs`).
  The warmup rises linearly from `warmup_init_lr` (an absolute learning
  rate: 0 for SimCLR and MoCo v3, 0.01 for SupContrast) to the peak. The
  cosine runs from the peak at the warmup's end to `cosine_final` x peak at
  the last step (0: to 0, SimCLR and MoCo; 1e-3: SupContrast's eta_min):
    lr(t) = f + (peak - f) (1 + cos(pi (t - W) / (T - W))) / 2
  for W <= t <= T (W warmup steps of T), f = cosine_final x peak. It is
  evaluated at every step, also for the recipes whose official code sets it
  once per epoch (MoCo v2, lightly's CIFAR benchmark, SupContrast, TCL;
  docs/recipe_audit.md).
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
    # No warmup configured (MoCo v2): the peak from step 0. (A nonzero
    # warmup that rounds to 0 steps takes the branch below: one warmup step
    # from the initial value.)
    return optax.cosine_decay_schedule(peak, max(total_steps, 1),
                                       alpha=float(final))
  if kind == 'cosine':
    # warmup + 2: a run of 0 or 1 steps (an untrained baseline) still gets
    # a valid schedule; from 2 steps on this is total_steps.
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

  For a leaf w of `mask` with gradient g (both nonzero) at learning rate lr:
    ratio = eta ||w|| / (||g|| + wd ||w|| + eps)
    u = min(ratio / lr, 1) (g + wd w)
  so that after the momentum trace and the step's x lr, the layer's rate is
  min(eta ||w|| / (||g|| + wd ||w||), lr): the trust ratio caps the global lr
  and never raises it. Other leaves (biases, BN) and zero w or g pass g
  unchanged, without weight decay, as solo-learn's `exclude_bias_n_norm`
  (with `decay_mask(params, decay_biases_and_bn=False)`).
  lr is `learning_rate` at this transformation's own step count, which
  advances with `optax.scale_by_learning_rate`'s.
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
  """params -> a same-shaped tree of bools: the leaves weight decay (and
  LARS's trust ratio) apply to.

  Without `decay_biases_and_bn`, the leaves of more than one dimension (conv
  and dense kernels): biases and BatchNorm scales/offsets are left out, as
  SimCLR's LARS (exclude_from_weight_decay=['batch_normalization', 'bias'])
  and MoCo v3's (p.ndim > 1). With it, every leaf, as torch's
  SGD(model.parameters(), weight_decay=...).
  """
  every = bool(decay_biases_and_bn)
  return jax.tree.map(lambda p: every or p.ndim > 1, params)


def create_optimizer(config, schedule: optax.Schedule
                     ) -> optax.GradientTransformation:
  """The configured optimizer on `schedule` (`learning_rate_schedule`).

  Weight decay skips biases and BatchNorm scales/offsets (1-D leaves), as is
  standard for SimCLR/MoCo-style training, unless
  `config.optimizer.decay_biases_and_bn`, which decays (and under LARS
  adapts) every parameter (`decay_mask`). LARS takes its trust coefficient
  from `trust_coefficient` (SimCLR and MoCo v3: 0.001; solo-learn's `eta`)
  and with `clip_lr` caps each layer's rate at the global lr, as solo-learn
  (`scale_by_clipped_trust_ratio`).
  """
  opt = config.optimizer
  mask = functools.partial(decay_mask,
                           decay_biases_and_bn=opt.decay_biases_and_bn)
  if opt.name == 'adamw':
    return optax.adamw(schedule, weight_decay=opt.weight_decay, mask=mask)
  if opt.name == 'adam':
    # torch's Adam(weight_decay=wd): an L2 term wd * w added to the gradient
    # before the moments (coupled), unlike AdamW's decay outside them.
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
