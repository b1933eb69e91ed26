"""A memory bank of one feature per training example (InsDis, CMC).

The loss gets z [B, V, D], bank negatives ('per_instance': [B, K, D], as
NCEAverage; 'shared': one [K, D] set, the `cmc` loss's form) and, for NCE,
the batch's own rows as positives; after the step each row moves towards
its views' normalised mean embedding (Wu et al. 2018, Sec. 3.3).
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses
from contrastive_jax.losses.common import l2_normalize
from contrastive_jax.methods import base


# config.memory_bank, read by the memory_bank method; configs/base.py takes
# it from here.
DEFAULTS = {
    'momentum': 0.5,           # Bank row update (InsDis: 0.5).
    'num_negatives': 4096,     # Rows sampled as noise per step.
    # 'per_instance': K rows for every instance (InsDis); 'shared': one
    # K-row sample for the whole batch (CMC).
    'noise': 'per_instance',
}


@flax.struct.dataclass
class State:
  bank: jax.Array   # [bank_rows, D]; rows >= the data size are padding.


def bank_rows(num_examples: int, num_devices: int) -> int:
  """Bank rows: the data size rounded up so the bank shards evenly."""
  return -(-num_examples // num_devices) * num_devices


@dataclasses.dataclass(frozen=True)
class Method(base.Method):
  """Static settings (config.memory_bank); see the module docstring."""
  momentum: float = DEFAULTS['momentum']
  num_negatives: int = DEFAULTS['num_negatives']
  noise: str = DEFAULTS['noise']
  losses = ('insdis', 'cmc')

  @classmethod
  def validate(cls, config, num_devices: int) -> None:
    super().validate(config, num_devices)
    mb, v = config.memory_bank, config.augment.num_views
    if mb.num_negatives < 1:
      raise ValueError(f'config.memory_bank.num_negatives={mb.num_negatives} '
                       'must be >= 1.')
    if not 0. <= mb.momentum < 1.:
      raise ValueError(f'config.memory_bank.momentum={mb.momentum} must be in '
                       '[0, 1).')
    if mb.noise not in ('per_instance', 'shared'):
      raise ValueError(f'config.memory_bank.noise={mb.noise!r}; known: '
                       'per_instance (InsDis), shared (CMC).')
    if config.loss == 'cmc' and mb.noise != 'shared':
      raise ValueError(
          f'config.loss=cmc takes one noise sample shared by the batch '
          f'([K, D] beside its in-batch negatives), not '
          f'config.memory_bank.noise={mb.noise!r}; set '
          "config.memory_bank.noise='shared' (configs/cmc.py does).")
    if 'key' in losses.inputs_of(config.loss)[0] and v != 1:
      raise ValueError(f'{config.loss} uses one view per instance (its '
                       'positive is the bank row); set '
                       f'config.augment.num_views=1 (got {v}).')
    if mb.noise == 'per_instance' and mb.num_negatives % num_devices:
      raise ValueError(
          f'config.memory_bank.num_negatives={mb.num_negatives} is not '
          f'divisible by the {num_devices} devices: each device draws the '
          'same share of the per-instance noise rows from its own shard of '
          'the memory bank (memory_bank.sample_bank_noise); use a multiple of '
          f'{num_devices}.')

  @classmethod
  def from_config(cls, config, ctx: base.Context) -> 'Method':
    mb = config.memory_bank
    return cls(loss=config.loss, ctx=ctx, momentum=float(mb.momentum),
               num_negatives=int(mb.num_negatives), noise=mb.noise)

  def init(self, rngs, variables, *, out_dim: int) -> State:
    del variables
    rows = bank_rows(self.ctx.num_examples, self.ctx.num_devices)
    return State(bank=init_bank(rngs['bank'], rows, out_dim))

  def shardings(self, abstract_state: State, mesh) -> State:
    return State(bank=NamedSharding(mesh, P('data', None)))

  def prepare(self, state, batch, rng, *, model, mesh) -> base.Prepared:
    del model
    bank, index = state.method_state.bank, batch['index']
    if self.noise == 'per_instance':
      # Each device draws K / devices rows from its own shard.
      negatives = sample_bank_noise(
          bank, rng, batch=index.shape[0], num_negatives=self.num_negatives,
          num_examples=self.ctx.num_examples, mesh=mesh)     # [B, K, D]
    else:
      # A masked local gather plus an all-reduce of [K, D], never the bank.
      neg_idx = jax.random.randint(rng, (self.num_negatives,), 0,
                                   self.ctx.num_examples)
      negatives = bank[neg_idx]                             # [K, D]
    # Bank rows are records of past features, not functions of the params.
    negatives = jax.lax.stop_gradient(negatives)
    positives = None
    if 'key' in losses.inputs_of(self.loss)[0]:
      positives = jax.lax.stop_gradient(bank[index])[:, None]
    return base.Prepared(
        views=batch['views'],
        inputs=losses.LossInputs(z=None, key=positives, queue=negatives),
        method_state=state.method_state)

  def loss_kwargs(self) -> dict[str, int]:
    # NCE's normaliser needs the data size (Wu et al. 2018 eq. 4).
    takes = 'num_data' in base.loss_parameters(self.loss)
    return {'num_data': self.ctx.num_examples} if takes else {}

  def update(self, prepared, z, batch) -> State:
    # One bank row per instance: the normalised mean of its views' features.
    feats = losses.l2_normalize(losses.l2_normalize(z).mean(axis=1))
    return State(bank=update_bank(
        prepared.method_state.bank, batch['index'], feats, self.momentum))


def init_bank(rng: jax.Array, num_rows: int, dim: int) -> jax.Array:
  """A memory bank of random unit vectors, [num_rows, dim] float32."""
  return l2_normalize(jax.random.normal(rng, (num_rows, dim), jnp.float32))


def update_bank(bank: jax.Array, index: jax.Array, features: jax.Array,
                momentum: float) -> jax.Array:
  """InsDis's update (Sec. 3.3): v_i <- normalize(m v_i + (1 - m) f_i) at
  `index` (distinct within a batch), the features detached."""
  f = jax.lax.stop_gradient(l2_normalize(features))
  rows = momentum * bank[index] + (1. - momentum) * f
  return bank.at[index].set(l2_normalize(rows).astype(bank.dtype))


def _check_noise_shards(num_negatives: int, num_examples: int, num_rows: int,
                        num_shards: int) -> int:
  """Validates a stratified noise draw; returns the rows per shard."""
  if num_rows % num_shards or not 0 < num_examples <= num_rows:
    raise ValueError(f'a bank of {num_rows} rows for {num_examples} examples '
                     f'cannot be split into {num_shards} equal shards '
                     '(see bank_rows).')
  if num_negatives % num_shards:
    raise ValueError(
        f'config.memory_bank.num_negatives={num_negatives} is not divisible '
        f'by the {num_shards} devices the memory bank is sharded over: each '
        f'device draws the same share of the noise rows from its own rows; '
        f'use a multiple of {num_shards}.')
  per_shard = num_rows // num_shards
  if num_examples <= (num_shards - 1) * per_shard:
    raise ValueError(
        f'{num_examples} examples leave some of the {num_shards} memory-bank '
        f'shards ({per_shard} rows each) without a single data row to draw '
        'noise from; use more examples or fewer devices.')
  return per_shard


def _shard_noise_rows(key: jax.Array, shard: jax.Array, *, batch: int,
                      count: int, num_examples: int,
                      rows_per_shard: int) -> jax.Array:
  """[batch, count] local row ids, uniform over shard `shard`'s data rows."""
  # >= 1: `_check_noise_shards` refuses a shard without data rows.
  valid = jnp.minimum(num_examples - shard * rows_per_shard, rows_per_shard)
  return jax.random.randint(jax.random.fold_in(key, shard), (batch, count),
                            0, valid.astype(jnp.int32), dtype=jnp.int32)


def bank_noise_indices(key: jax.Array, *, batch: int, num_negatives: int,
                       num_examples: int, num_rows: int,
                       num_shards: int = 1) -> jax.Array:
  """The [batch, num_negatives] global rows `sample_bank_noise` reads:
  columns [s K / n, (s + 1) K / n) are shard s's draws."""
  per_shard = _check_noise_shards(num_negatives, num_examples, num_rows,
                                  num_shards)
  count = num_negatives // num_shards
  return jnp.concatenate([
      _shard_noise_rows(key, jnp.asarray(s, jnp.int32), batch=batch,
                        count=count, num_examples=num_examples,
                        rows_per_shard=per_shard) + s * per_shard
      for s in range(num_shards)], axis=1)


def sample_bank_noise(bank: jax.Array, key: jax.Array, *, batch: int,
                      num_negatives: int, num_examples: int,
                      mesh=None) -> jax.Array:
  """InsDis's noise: [batch, K, D] rows of `bank` [num_rows, D], drawn locally.

  Each of the n devices of `mesh` (None: n = 1) draws K / n rows per
  instance uniformly from its own shard's data rows and reads them there,
  so the bank is never gathered; the result is sharded along K. Stratified
  draws keep NCE's uniform noise (the loss is symmetric in the K rows; its
  noise term's mean is unchanged). Raises ValueError for K not a multiple
  of n or a shard without data rows.
  """
  num_shards = 1 if mesh is None else mesh.shape['data']
  if num_shards == 1:
    return bank[bank_noise_indices(
        key, batch=batch, num_negatives=num_negatives,
        num_examples=num_examples, num_rows=bank.shape[0])]
  per_shard = _check_noise_shards(num_negatives, num_examples, bank.shape[0],
                                  num_shards)

  def per_device(local_bank, key):
    ids = _shard_noise_rows(key, jax.lax.axis_index('data'), batch=batch,
                            count=num_negatives // num_shards,
                            num_examples=num_examples,
                            rows_per_shard=per_shard)
    return local_bank[ids]                      # [B, K / n, D]

  return jax.shard_map(per_device, mesh=mesh,
                       in_specs=(P('data', None), P()),
                       out_specs=P(None, 'data', None))(bank, key)
