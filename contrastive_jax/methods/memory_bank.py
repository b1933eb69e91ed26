"""A memory bank of one feature per training example (InsDis, CMC).

InsDis (Wu et al. 2018) and CMC (Tian et al. 2019): every view goes through
the online encoder; the loss gets z [B, V, D], negatives drawn from the bank
and, if it takes them (InsDis's NCE), the bank rows of the batch's own
instances as positives; after the step each instance's row moves towards the
normalised mean of its views' embeddings with momentum (Sec. 3.3).

Noise (`config.memory_bank.noise`): 'per_instance' draws K rows for every
instance, [B, K, D] (lemniscate's NCEAverage); 'shared' draws one [K, D] set
for the whole batch (CMC's released code).
"""

from __future__ import annotations

import dataclasses

import flax
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import losses
from contrastive_jax import state as state_lib
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
    if 'key' in losses.inputs_of(config.loss)[0] and v != 1:
      raise ValueError(f'{config.loss} uses one view per instance (its '
                       'positive is the bank row); set '
                       f'config.augment.num_views=1 (got {v}).')
    if mb.noise == 'per_instance' and mb.num_negatives % num_devices:
      raise ValueError(
          f'config.memory_bank.num_negatives={mb.num_negatives} is not '
          f'divisible by the {num_devices} devices: each device draws the '
          'same share of the per-instance noise rows from its own shard of '
          'the memory bank (state.sample_bank_noise); use a multiple of '
          f'{num_devices}.')

  @classmethod
  def from_config(cls, config, ctx: base.Context) -> 'Method':
    mb = config.memory_bank
    return cls(loss=config.loss, ctx=ctx, momentum=float(mb.momentum),
               num_negatives=int(mb.num_negatives), noise=mb.noise)

  def init(self, rngs, variables, *, out_dim: int) -> State:
    del variables
    rows = bank_rows(self.ctx.num_examples, self.ctx.num_devices)
    return State(bank=state_lib.init_bank(rngs['bank'], rows, out_dim))

  def shardings(self, abstract_state: State, mesh) -> State:
    return State(bank=NamedSharding(mesh, P('data', None)))

  def prepare(self, state, batch, rng, *, model, mesh) -> base.Prepared:
    del model
    bank, index = state.method_state.bank, batch['index']
    if self.noise == 'per_instance':
      # K rows per instance, [B, K, D]. Each device draws K / devices of
      # them from the data rows of its own bank shard and reads them there,
      # so the row-sharded bank is never gathered and the [B, K, D] rows stay
      # sharded along K (see `state.sample_bank_noise` for why stratified
      # draws are still NCE's uniform noise).
      negatives = state_lib.sample_bank_noise(
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
    return State(bank=state_lib.update_bank(
        prepared.method_state.bank, batch['index'], feats, self.momentum))
