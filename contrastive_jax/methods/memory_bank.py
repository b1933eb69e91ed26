"""A memory bank of one feature per training example (InsDis, CMC).

InsDis (Wu et al. 2018) and CMC (Tian et al. 2019): every view goes through
the online encoder; the loss gets z [B, V, D], negatives drawn from the bank
and, if it takes them (InsDis's NCE), the bank rows of the batch's own
instances as positives; after the step each instance's row moves towards the
normalised mean of its views' embeddings with momentum (Sec. 3.3).

Noise (`config.memory_bank.noise`): 'per_instance' draws K rows for every
instance, [B, K, D], as InsDis's and CMC's released code (NCEAverage);
'shared' draws one [K, D] set for the whole batch, the form the `cmc` loss
takes: its softmax adds these rows to the in-batch negatives of every
anchor (CMC's code instead draws K rows per instance and takes each
positive from the other view's bank row; docs/configs.md, "cmc.py").
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


@flax.struct.dataclass
class State:
  bank: jax.Array   # [num_rows, D]; rows >= the data size are padding, never
                    # read (num_rows = `bank_rows`).


def bank_rows(num_examples: int, num_devices: int) -> int:
  """Bank rows: the data size rounded up so the bank shards evenly."""
  return -(-num_examples // num_devices) * num_devices


@dataclasses.dataclass(frozen=True)
class Method(base.Method):
  """Static settings (config.memory_bank); see the module docstring."""
  momentum: float = 0.5
  num_negatives: int = 4096
  noise: str = 'per_instance'
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
      # K rows per instance, [B, K, D]. Each device draws K / devices of
      # them from the data rows of its own bank shard and reads them there,
      # so the row-sharded bank is never gathered and the [B, K, D] rows stay
      # sharded along K (see `sample_bank_noise` for why stratified
      # draws are still NCE's uniform noise).
      negatives = sample_bank_noise(
          bank, rng, batch=index.shape[0], num_negatives=self.num_negatives,
          num_examples=self.ctx.num_examples, mesh=mesh)     # [B, K, D]
    else:
      # One [K] sample for the batch, which XLA reads as a masked local
      # gather plus an all-reduce of the [K, D] rows, never a gather of the
      # bank. tests/test_queue_sharding.py checks both compiled steps.
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
  """InsDis's bank update: v_i <- normalize(m v_i + (1 - m) f_i) at `index`.

  (Wu et al. 2018 Sec. 3.3; lemniscate's `LinearAverage` update.) Indices in
  one batch are distinct (batches are slices of a permutation), so the
  scatter has no collisions. The features are detached: the bank is a record
  of past features, never differentiated through.
  """
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
  """[batch, count] LOCAL row ids drawn uniformly from one shard's data rows.

  Shard `shard` holds global rows [shard * rows_per_shard, (shard + 1) *
  rows_per_shard); those >= num_examples are padding, so it draws from its
  first min(rows_per_shard, num_examples - shard * rows_per_shard) rows.
  """
  # >= 1: `_check_noise_shards` refuses a shard without data rows.
  valid = jnp.minimum(num_examples - shard * rows_per_shard, rows_per_shard)
  return jax.random.randint(jax.random.fold_in(key, shard), (batch, count),
                            0, valid.astype(jnp.int32), dtype=jnp.int32)


def bank_noise_indices(key: jax.Array, *, batch: int, num_negatives: int,
                       num_examples: int, num_rows: int,
                       num_shards: int = 1) -> jax.Array:
  """The [batch, num_negatives] global bank rows `sample_bank_noise` reads.

  A pure function of its arguments: columns [s * K / n, (s + 1) * K / n) are
  shard s's draws, offset to global row ids. With num_shards = 1 it is plain
  uniform sampling of every entry from [0, num_examples).
  """
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
  """InsDis's noise: [batch, K, D] bank rows, K per instance, drawn locally.

  The bank is sharded by rows over the mesh axis 'data' (n devices, n equal
  shards; rows >= num_examples are padding at the end, see bank_rows).
  Each device draws, for every instance, K / n row ids uniformly (with
  replacement) from the data rows of its OWN shard, with the key folded with
  its shard index, and reads them from its shard (a `jax.shard_map`). The
  result is sharded along K, P(None, 'data', None): no device reads a row
  it does not hold, so the bank is never gathered (reading [B, K] scattered
  rows from a row-sharded bank otherwise makes XLA all-gather the whole bank
  on every step: 29 MiB per device at 60000 x 128, 625 MiB at ImageNet's
  1.28M rows), and the loss's [B, K] noise logits are formed where the rows
  are, with only [B]-sized and scalar all-reduces to combine them. Padding
  rows are never drawn. The drawn ids are `bank_noise_indices(key, ...,
  num_shards=n)`; without a mesh (or with one device) n = 1 and this is
  plain uniform per-instance sampling over the data rows, bank[ids].

  Statistics. Lemniscate's NCEAverage draws the B * K noise ids i.i.d. from
  P_n = uniform over the N examples (AliasMethod.draw). Here each draw is
  uniform over its shard's data rows. The loss is symmetric in an
  instance's K noise rows (sums, a max and a log-sum-exp over them), so
  their order is immaterial, and a draw at a uniformly random one of the K
  positions is a uniform shard, then a uniform row in it: when the shards
  hold equally many data rows (N divisible by n, e.g. 60000 over 8
  devices) its marginal is exactly P_n = 1 / N, and every example's
  expected count per instance is K / N, as with i.i.d. draws. The draws are
  stratified instead of i.i.d.: each instance gets exactly K / n rows from
  every shard, rather than a Multinomial(K, 1/n) count per shard. That is
  immaterial for NCE: NCE needs samples from its noise distribution (Gutmann
  & Hyvarinen 2010), here P_n = uniform, and its objective (Wu et al. 2018
  eq. 4) contains the noise only through K * E_{j ~ P_n}[log(1 - h(j))],
  which the sum over the K drawn rows estimates without bias: by linearity
  of expectation the sum's mean is sum_s (K / n) mean_{shard s}(.) =
  K * mean over the data(.), whatever the dependence between the draws.
  Stratification keeps the noise distribution and only lowers the
  estimator's variance (at proportional allocation a stratified mean never
  has more variance than an i.i.d. one: Cochran, Sampling Techniques,
  Sec. 5.6). The Monte-Carlo estimate of Z in `losses.insdis` (a mean of
  exp(logit) over the same draws) stays unbiased for the same reason.

  When N is not divisible by n, only the last shard holds padding (p < n
  rows; a shard with no data rows is refused below), so each of its data
  rows is drawn with probability (K / n) / (its data rows) per instance
  instead of K / N, a relative excess of (n - 1) p / (N - (n - 1) p); e.g.
  1281167 ImageNet examples over 8 devices: 160146 rows per shard, p = 1,
  excess 5.5e-6.

  Args:
    bank: [num_rows, D] memory bank (sharded P('data', None) under `mesh`).
    key: a PRNG key, the same on every device.
    batch: B, the number of instances (global).
    num_negatives: K, a multiple of the mesh size.
    num_examples: N, the number of data rows.
    mesh: the 1-D 'data' mesh the bank is sharded over, or None.

  Returns:
    [B, K, D] rows of `bank`.

  Raises:
    ValueError: K is not a multiple of the devices, or a shard holds no
      data row (N <= (n - 1) * num_rows / n, possible only for tiny data
      sets, N < n (n - 1)).
  """
  num_shards = 1 if mesh is None else mesh.shape['data']
  if num_shards == 1:
    return bank[bank_noise_indices(
        key, batch=batch, num_negatives=num_negatives,
        num_examples=num_examples, num_rows=bank.shape[0])]
  per_shard = _check_noise_shards(num_negatives, num_examples, bank.shape[0],
                                  num_shards)
  P = jax.sharding.PartitionSpec  # pylint: disable=invalid-name

  def per_device(local_bank, key):
    ids = _shard_noise_rows(key, jax.lax.axis_index('data'), batch=batch,
                            count=num_negatives // num_shards,
                            num_examples=num_examples,
                            rows_per_shard=per_shard)
    return local_bank[ids]                      # [B, K / n, D]

  return jax.shard_map(per_device, mesh=mesh,
                       in_specs=(P('data', None), P()),
                       out_specs=P(None, 'data', None))(bank, key)
