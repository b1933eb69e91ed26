"""MoCo v1/v2/v3, CACR's MoCo regime, JCL: an EMA key encoder and a queue.

The loss gets the online queries z [B, Vq, D] (MoCo v3: a predictor's), the
EMA encoder's keys [B, Vk, D] under stop_gradient and the queue [Q, D] (None
when `queue_size` is 0), which the keys then enter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax
import jax
from absl import logging
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses
from contrastive_jax import models
from contrastive_jax import schedules
from contrastive_jax.losses.common import l2_normalize
from contrastive_jax.methods import base


# config.moco, read by the moco and byol methods; configs/base.py takes it
# from here and a config sets what its recipe changes.
DEFAULTS = {
    'momentum': 0.999,                # EMA momentum m (at step 0).
    'momentum_schedule': 'constant',  # Or 'cosine' (to 1; MoCo v3).
    'query_views': (0,),              # Views through the online encoder.
    'key_views': (1,),                # Views through the key encoder.
    'queue_size': 0,                  # 0: no queue; else % batch_size.
    'shuffle_bn': False,              # Key encoder: per-device shuffle-BN.
    # > 0: a predictor MLP (this hidden width, out head_out_dim) on the
    # query branch, MoCo v3's and BYOL's; 0: none (MoCo v1/v2).
    'predictor_hidden_dim': 0,
    # What enters the queue (ENQUEUE_KEYS): the 'first' key view (MoCo), the
    # 'last' (CACR's MoCo v2 code), the 'mean' of the normalised key views
    # (JCL) or 'all', one after the other in key_views order (lightly's
    # symmetric MoCo; queue_size then a multiple of batch_size x
    # len(key_views)).
    'enqueue_keys': 'first',
}
ENQUEUE_KEYS = ('first', 'last', 'mean', 'all')


def positive_pairs(rule: str, num_query: int, num_key: int
                   ) -> list[tuple[int, int]]:
  """The (query slot, key slot) positive pairs of a loss's rule:
  'other_slot' (infonce, cacr: every key slot b != a, or the only one),
  'every_slot' (jcl: every key slot) or 'same_slot' (byol: v with v)."""
  if rule == 'same_slot':
    return [(v, v) for v in range(min(num_query, num_key))]
  return [(a, b) for a in range(num_query) for b in range(num_key)
          if rule == 'every_slot' or num_key == 1 or a != b]


@flax.struct.dataclass
class State:
  key_params: Any                 # The EMA key encoder.
  key_batch_stats: Any            # Its own BatchNorm statistics.
  queue: jax.Array | None = None      # [Q, D] past keys.
  queue_ptr: jax.Array | None = None  # int32: the next row written.


@dataclasses.dataclass(frozen=True)
class Method(base.Method):
  """Static settings (config.moco)."""
  query_views: tuple[int, ...] = DEFAULTS['query_views']
  key_views: tuple[int, ...] = DEFAULTS['key_views']
  queue_size: int = DEFAULTS['queue_size']
  shuffle_bn: bool = DEFAULTS['shuffle_bn']
  enqueue_keys: str = DEFAULTS['enqueue_keys']
  momentum: Any = None            # Schedule step -> m (schedules.build).
  predictor_hidden_dim: int = DEFAULTS['predictor_hidden_dim']
  losses = ('infonce', 'jcl', 'cacr')
  pairing: ClassVar[dict[str, str]] = {
      'infonce': 'other_slot', 'cacr': 'other_slot', 'jcl': 'every_slot'}

  @property
  def embedding(self) -> str:
    return 'prediction' if self.predictor_hidden_dim else 'projection'

  @classmethod
  def wrap_model(cls, config, model):
    """The model with a predictor when config.moco.predictor_hidden_dim > 0.
    The key encoder is an EMA of the whole tree (its predictor unread)."""
    hidden = config.moco.predictor_hidden_dim
    if not hidden:
      return model
    return models.WithPredictor(base=model, hidden_dim=hidden,
                                out_dim=config.model.head_out_dim,
                                dense_init=config.model.head_init,
                                dtype=models.compute_dtype(config))

  @classmethod
  def validate(cls, config, num_devices: int) -> None:
    super().validate(config, num_devices)
    mc, v, b = config.moco, config.augment.num_views, config.batch_size
    for name in ('query_views', 'key_views'):
      views = tuple(mc[name])
      if not views or any(not 0 <= i < v for i in views):
        raise ValueError(f'config.moco.{name}={views} must be a non-empty '
                         f'list of view ids in [0, {v}) '
                         f'(config.augment.num_views={v}).')
    qv, kv = tuple(mc.query_views), tuple(mc.key_views)
    rule = cls.pairing[config.loss]
    same = sorted({qv[a] for a, b in positive_pairs(rule, len(qv), len(kv))
                   if qv[a] == kv[b]})
    if same:
      raise ValueError(
          f'config.moco.query_views={qv} and key_views={kv}: '
          f'{config.loss} pairs query slot a with key slot '
          + {'other_slot': 'b != a', 'every_slot': 'b, every one',
             'same_slot': 'a'}[rule]
          + f', so view {same[0]} would be its own positive (the key '
          'encoder\'s copy of the same augmented image, a trivial task). '
          'Order key_views so that every positive is another view.')
    if mc.enqueue_keys not in ENQUEUE_KEYS:
      raise ValueError(f'config.moco.enqueue_keys={mc.enqueue_keys!r}; known: '
                       'first (MoCo), last (the last key view, CACR\'s '
                       'MoCo v2 code), mean (JCL\'s key means), all (every '
                       'key view, lightly\'s symmetric MoCo).')
    q = mc.queue_size
    w = b * (len(tuple(mc.key_views)) if mc.enqueue_keys == 'all' else 1)
    if q < 0 or (q and q % w):
      raise ValueError(
          f'config.moco.queue_size={q} must be 0 (no queue) or a multiple of '
          f'the {w} keys a step enqueues (the global batch size {b}'
          + (f' x {w // b} key views, config.moco.enqueue_keys=\'all\''
             if w != b else '')
          + '): MoCo writes whole batches into the queue; a batch must never '
          'wrap around its end.')
    if mc.predictor_hidden_dim < 0:
      raise ValueError(f'config.moco.predictor_hidden_dim='
                       f'{mc.predictor_hidden_dim} must be >= 0 (0: no '
                       'predictor; MoCo v3 uses 4096).')
    if not 0. <= mc.momentum <= 1.:
      raise ValueError(f'config.moco.momentum={mc.momentum} must be in [0, 1].')
    momentum(config, base.Context(1, 1, 1, 1, 1.))   # Known kind?
    if mc.shuffle_bn and num_devices == 1 and not config.model.bn_splits:
      logging.warning(
          'config.moco.shuffle_bn=True on one device: the key batch is '
          'normalised as a whole, so shuffle-BN changes nothing here (MoCo '
          'shuffles over 8 GPUs). Run on several devices (on a CPU, '
          'XLA_FLAGS=--xla_force_host_platform_device_count=8), or set '
          'config.model.bn_splits (BatchNorm over groups of the batch, '
          'lightly\'s one-GPU shuffle-BN), for it to act.')
    if config.loss == 'jcl' and not q and not config.loss_kwargs.get(
        'in_batch_negatives', False):
      raise ValueError('JCL needs negatives: set config.moco.queue_size > 0 '
                       'or config.loss_kwargs.in_batch_negatives=True.')

  @classmethod
  def from_config(cls, config, ctx: base.Context) -> 'Method':
    mc = config.moco
    return cls(loss=config.loss, ctx=ctx,
               query_views=tuple(mc.query_views),
               key_views=tuple(mc.key_views), queue_size=int(mc.queue_size),
               shuffle_bn=bool(mc.shuffle_bn), enqueue_keys=mc.enqueue_keys,
               momentum=momentum(config, ctx),
               predictor_hidden_dim=int(mc.predictor_hidden_dim))

  def init(self, rngs, variables, *, out_dim: int) -> State:
    copy = lambda tree: jax.tree.map(jnp.copy, tree)
    state = State(key_params=copy(variables['params']),
                  key_batch_stats=copy(variables.get('batch_stats', {})))
    if self.queue_size:
      state = state.replace(
          queue=init_queue(rngs['queue'], self.queue_size, out_dim),
          queue_ptr=jnp.zeros((), jnp.int32))
    return state

  def shardings(self, abstract_state: State, mesh) -> State:
    """Replicated, but the queue is sharded by rows: no device holds it all."""
    out = super().shardings(abstract_state, mesh)
    if abstract_state.queue is None:
      return out
    return out.replace(queue=NamedSharding(mesh, P('data', None)))

  def prepare(self, state, batch, rng, *, model, mesh) -> base.Prepared:
    ms = state.method_state
    m = self.momentum(state.step)
    # MoCo's order: the EMA update first, then the keys.
    key_params = ema_update(ms.key_params, state.params, m)
    key_z, key_bs = key_forward(
        model, {'params': key_params, 'batch_stats': ms.key_batch_stats},
        batch['views'][:, list(self.key_views)], rng,
        shuffle_bn=self.shuffle_bn, mesh=mesh,
        bn_splits=models.bn_splits_of(model))
    # Keys are targets (MoCo computes k under no_grad).
    key_z = jax.lax.stop_gradient(key_z)
    queue = ms.queue
    if queue is not None and mesh is not None:
      # Fixing the row sharding lets XLA form the [B, Q] logits per device
      # with [B]-sized all-reduces, never gathering the queue
      # (tests/test_queue_sharding.py).
      queue = jax.lax.with_sharding_constraint(
          queue, NamedSharding(mesh, P('data', None)))
    return base.Prepared(
        views=batch['views'][:, list(self.query_views)],
        inputs=losses.LossInputs(z=None, key=key_z, queue=queue),
        method_state=ms.replace(key_params=key_params,
                                key_batch_stats=key_bs),
        metrics={'momentum': m}, aux=key_z)

  def update(self, prepared, z, batch) -> State:
    del z, batch
    ms = prepared.method_state
    if ms.queue is None:
      return ms
    key_z = prepared.aux
    if self.enqueue_keys == 'mean':
      # JCL enqueues the mean of the normalised keys, not re-normalised.
      keys = losses.l2_normalize(key_z).mean(axis=1)
    elif self.enqueue_keys == 'all':
      # Every key view in key_views order (lightly's symmetric MoCo).
      keys = losses.l2_normalize(key_z).swapaxes(0, 1).reshape(
          -1, key_z.shape[-1])
    elif self.enqueue_keys == 'last':
      # The last key view (CACR's MoCo v2 code enqueues k_list[-1]).
      keys = losses.l2_normalize(key_z[:, -1])
    else:
      keys = losses.l2_normalize(key_z[:, 0])
    queue, ptr = enqueue(ms.queue, ms.queue_ptr, keys)
    return ms.replace(queue=queue, queue_ptr=ptr)


def momentum(config, ctx: base.Context):
  """The key encoder's EMA momentum schedule: step -> m (config.moco)."""
  return schedules.build(config.moco.momentum_schedule,
                         float(config.moco.momentum),
                         total_steps=ctx.total_steps,
                         steps_per_epoch=ctx.steps_per_epoch,
                         num_epochs=ctx.num_epochs,
                         name='config.moco.momentum_schedule')


def key_forward(model, variables, views, rng, *, shuffle_bn: bool, mesh,
                bn_splits: int = 0) -> tuple[jax.Array, Any]:
  """The key encoder on views [B, Vk, H, W, C]: (z [B, Vk, D], BN stats).

  Without shuffle-BN: one forward, statistics over the whole key batch.
  Shuffle-BN (MoCo): the B Vk images are permuted over the global batch,
  each device normalises its shard (`jax.shard_map`, running statistics
  averaged), then unpermuted, so a query and its key never share BN
  statistics (which leaks the positive). With split BN (`bn_splits` > 0)
  each key view is permuted and forwarded alone (lightly's one-device
  shuffle-BN): the BN groups, not the devices, set the statistics.
  """
  if not shuffle_bn:
    z, _, bs = base.forward(model, variables, views)
    return z, bs
  if bn_splits:
    return _split_shuffle_forward(model, variables, views, rng)
  b, v = views.shape[:2]
  flat = views.reshape((b * v,) + views.shape[2:])
  perm = jax.random.permutation(rng, b * v)

  def per_device(variables, x):
    out, new_vars = model.apply(variables, x, train=True,
                                mutable=['batch_stats'])
    return out['projection'], jax.lax.pmean(new_vars['batch_stats'], 'data')

  z, batch_stats = jax.shard_map(
      per_device, mesh=mesh, in_specs=(P(), P('data')),
      out_specs=(P('data'), P()))(
          {'params': variables['params'],
           'batch_stats': variables.get('batch_stats', {})}, flat[perm])
  return z[jnp.argsort(perm)].reshape(b, v, -1), batch_stats


def _split_shuffle_forward(model, variables, views, rng
                           ) -> tuple[jax.Array, Any]:
  """Shuffle-BN over split-BN groups, view by view."""
  batch_stats, zs = variables.get('batch_stats', {}), []
  for i in range(views.shape[1]):
    x = views[:, i]
    perm = jax.random.permutation(jax.random.fold_in(rng, i), x.shape[0])
    out, new_vars = model.apply(
        {'params': variables['params'], 'batch_stats': batch_stats}, x[perm],
        train=True, mutable=['batch_stats'])
    batch_stats = new_vars['batch_stats']
    zs.append(out['projection'][jnp.argsort(perm)])
  return jnp.stack(zs, axis=1), batch_stats


def ema_update(target: Any, online: Any, momentum: jax.Array | float) -> Any:
  """momentum * target + (1 - momentum) * online, leaf by leaf; the online
  side under stop_gradient, as MoCo's `param_k.data = ...` (no gradient may
  flow into the online weights through the keys)."""
  m = jnp.asarray(momentum, jnp.float32)
  return jax.tree.map(
      lambda t, o: (m * t + (1. - m) * jax.lax.stop_gradient(o)).astype(
          t.dtype), target, online)


def init_queue(rng: jax.Array, size: int, dim: int) -> jax.Array:
  """MoCo's initial queue: random unit vectors, [size, dim] float32."""
  return l2_normalize(jax.random.normal(rng, (size, dim), jnp.float32))


def enqueue(queue: jax.Array, ptr: jax.Array, keys: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
  """MoCo's `_dequeue_and_enqueue`: keys [B, D] (the global batch) written
  at rows ptr..ptr + B - 1 (Q % B == 0: no wrap); returns (queue, new ptr).

  A scatter, not a dynamic_update_slice: XLA partitions a scatter into the
  row-sharded queue locally, while a dynamic_update_slice at a traced offset
  all-gathers the whole queue (tests/test_queue_sharding.py).
  """
  q, b = queue.shape[0], keys.shape[0]
  # Keys are targets, not a path for gradients (MoCo enqueues detached keys).
  keys = jax.lax.stop_gradient(keys).astype(queue.dtype)
  rows = ptr + jnp.arange(b, dtype=ptr.dtype)    # In bounds: Q % B == 0.
  new_queue = queue.at[rows].set(keys, indices_are_sorted=True,
                                 unique_indices=True)
  return new_queue, ((ptr + b) % q).astype(ptr.dtype)
