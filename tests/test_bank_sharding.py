"""InsDis's noise rows are drawn where the memory bank's rows live (issue 11).

`memory_bank.sample_bank_noise` draws, per instance, K / n rows on each of the n
devices from the data rows of that device's own bank shard (stratified
sampling; its docstring argues why that is still NCE's uniform noise), and
`state.bank_noise_indices` is the pure function naming the rows it reads.
That the compiled 8-device InsDis step never all-gathers the bank is checked
in tests/test_queue_sharding.py. Here:

(a) the sharded sampler reads exactly the rows `bank_noise_indices` names
    (every bank row holds its own id), moves no data between devices, and
    returns [B, K, D] sharded along K; with one device, or no mesh, it is
    plain uniform per-instance sampling over the data rows;
(b) no padding row (>= num_examples) is ever drawn, every data row can be,
    and each shard contributes exactly K / n draws to every instance;
(c) the empirical marginal over many draws is uniform (a chi-square bound);
(d) the compiled 8-device InsDis step's loss equals the InsDis loss computed
    by hand in float64 (numpy_reference.insdis) on the negatives it drew;
(e) the 8-device step equals the 1-device step fed the same draws (the draws
    themselves depend on the device count by design, so this replaces
    InsDis in test_train_step's device-count comparison);
(f) a K that the devices do not divide, or a shard with no data rows, is
    refused with a clear error.
"""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import numpy_reference as ref
import test_train_step
from benchmarks import queue_comm
from configs import cmc as configs_cmc
from contrastive_jax import runtime
from contrastive_jax import config_lib
from contrastive_jax import losses
from contrastive_jax import train
from contrastive_jax.methods import memory_bank
from tiny_step import build_step
from tiny_step import tiny_config

NDEV = 8


def _id_bank(num_rows, mesh, dim=2):
  """A [num_rows, dim] bank whose row r is (r, r), sharded by rows."""
  bank = np.repeat(np.arange(num_rows, dtype=np.float32)[:, None], dim, 1)
  return jax.device_put(bank, NamedSharding(mesh, P('data', None)))


def _sampler(mesh, *, batch, k, n_data):
  return jax.jit(functools.partial(
      memory_bank.sample_bank_noise, batch=batch, num_negatives=k,
      num_examples=n_data, mesh=mesh))


def _drawn_ids(sampler, bank, key):
  """The global row ids a sampler read: [B, K] (rows hold their ids)."""
  rows = np.asarray(sampler(bank, key))
  assert np.all(rows[..., 0] == rows[..., 1])
  return rows[..., 0].astype(np.int64)


# --- (a) what the sampler reads --------------------------------------------

def test_sharded_sampler_reads_the_named_rows_locally():
  n_data, b, k = 4003, 16, 64                # 501 rows per shard, 5 padding.
  rows = memory_bank.bank_rows(n_data, NDEV)
  mesh = runtime.create_mesh()
  bank = _id_bank(rows, mesh)
  sampler = _sampler(mesh, batch=b, k=k, n_data=n_data)
  key = jax.random.key(7)
  out = sampler(bank, key)
  assert out.shape == (b, k, 2)
  assert out.sharding.is_equivalent_to(
      NamedSharding(mesh, P(None, 'data', None)), 3)
  # Every device reads only its own rows: the program has no collective.
  assert queue_comm.collectives(
      sampler.lower(bank, key).compile().as_text()) == []
  want = memory_bank.bank_noise_indices(key, batch=b, num_negatives=k,
                                      num_examples=n_data, num_rows=rows,
                                      num_shards=NDEV)
  np.testing.assert_array_equal(_drawn_ids(sampler, bank, key), want)
  # Per instance: the instances do not share one set of rows.
  assert len({tuple(r) for r in np.asarray(want)}) == b


def test_one_device_draws_uniformly_over_the_data_rows():
  # One shard (no mesh, or a 1-device mesh): every draw is a data row, the
  # rows read are the ones the ids name, and over many keys each of the N
  # rows is drawn equally often (chi-square), instances independently.
  from scipy import stats
  n_data, b, k, keys = 203, 8, 12, 200
  ids = np.stack([np.asarray(memory_bank.bank_noise_indices(
      jax.random.key(s), batch=b, num_negatives=k, num_examples=n_data,
      num_rows=n_data)) for s in range(keys)])               # [keys, B, K]
  assert ids.min() >= 0 and ids.max() < n_data
  counts = np.bincount(ids.ravel(), minlength=n_data)
  assert stats.chisquare(counts).pvalue > 1e-3
  # Instances get different rows (no shared sample): a pair of instances
  # agrees on about K / N of its positions.
  assert np.mean(ids[:, 0] == ids[:, 1]) < 5 / n_data
  mesh1 = runtime.create_mesh(jax.devices()[:1])
  bank = _id_bank(n_data, mesh1)
  for mesh in (None, mesh1):
    sampler = _sampler(mesh, batch=b, k=k, n_data=n_data)
    np.testing.assert_array_equal(_drawn_ids(sampler, bank,
                                             jax.random.key(3)), ids[3])


# --- (b) padding and strata ------------------------------------------------

@pytest.mark.parametrize('n_data', [4003, 57])
def test_no_padding_row_is_drawn_and_every_shard_gives_k_over_n(n_data):
  # 4003 rows: 501 per shard, the last shard holds 496 data rows and 5
  # padding rows. 57: 8 rows per shard, the last shard holds ONE data row
  # (56) and 7 padding rows, so all its draws must be row 56.
  b, k, draws = 32, 64, 20
  rows = memory_bank.bank_rows(n_data, NDEV)
  per_shard = rows // NDEV
  mesh = runtime.create_mesh()
  bank = _id_bank(rows, mesh)
  sampler = _sampler(mesh, batch=b, k=k, n_data=n_data)
  ids = np.stack([_drawn_ids(sampler, bank, jax.random.key(s))
                  for s in range(draws)])                 # [draws, B, K]
  assert ids.min() >= 0 and ids.max() < n_data            # No padding row.
  shard = ids // per_shard
  for s in range(NDEV):
    # Columns [s K/n, (s+1) K/n) are shard s's draws, and no other column
    # draws from shard s: exactly K / n draws per instance from each shard.
    block = shard[..., s * k // NDEV:(s + 1) * k // NDEV]
    assert np.all(block == s)
    assert np.all((shard == s).sum(-1) == k // NDEV)
  # Every data row of the last shard is reachable (its range is not cut).
  last = np.arange((NDEV - 1) * per_shard, n_data)
  assert set(ids.ravel()) >= set(last)
  if n_data == 57:
    assert np.all(ids[..., -k // NDEV:] == 56)


# --- (c) the marginal is uniform -------------------------------------------

def test_empirical_marginal_is_uniform():
  # N = 200 data rows in 8 equal shards of r = 25; T keys x B x K draws.
  n_data, b, k, t = 200, 64, 64, 64
  mesh = runtime.create_mesh()
  bank = _id_bank(n_data, mesh)
  sampler = _sampler(mesh, batch=b, k=k, n_data=n_data)
  counts = np.zeros(n_data)
  for s in range(t):
    counts += np.bincount(_drawn_ids(sampler, bank, jax.random.key(100 + s))
                          .ravel(), minlength=n_data)
  m = t * b * k                                            # 262144 draws
  e = m / n_data                                           # 1310.72 per row
  assert counts.sum() == m
  x2 = float(np.sum((counts - e) ** 2 / e))
  # Bound. Within shard s the M / n draws that land there are independent
  # and uniform over its r rows (distinct PRNG keys and counters), so its
  # counts are Multinomial(M / n, 1 / r) and Pearson's X2_s is ~ chi2(r - 1)
  # (every expected count E = M / N = 1311 >> 5). The shards' totals are
  # fixed at M / n by the stratification, so X2 = sum_s X2_s ~ chi2(N - n)
  # (an i.i.d. sampler would give chi2(N - 1)). Laurent & Massart (2000,
  # Lemma 1): P(chi2_k >= k + 2 sqrt(k x) + 2 x) <= exp(-x); k = N - n = 192
  # and x = 20 give 355.9 with a false-alarm probability <= 2e-9 (and the
  # seeds are fixed, so the test is deterministic). Power: one row never
  # drawn alone adds E = 1311 to X2; a relative bias delta on one shard's
  # rows adds about r E delta^2 = 32768 delta^2, detected from delta ~ 0.1.
  kdf, x = n_data - NDEV, 20.
  bound = kdf + 2 * np.sqrt(kdf * x) + 2 * x
  assert x2 < bound, (x2, bound)
  # The statistic is not trivially small either: it is chi2-sized.
  assert x2 > kdf - 2 * np.sqrt(kdf * x), (x2, kdf)


# --- (d), (e) the InsDis step ----------------------------------------------

B, HW, D = 16, 8, 8


def _insdis_config(k, proximal_weight):
  c = tiny_config(batch=B, out_dim=D)
  c.method, c.loss = 'memory_bank', 'insdis'
  c.loss_kwargs = {'temperature': 0.1, 'proximal_weight': proximal_weight}
  c.augment.num_views = 1
  c.memory_bank.num_negatives = k
  config_lib.validate(c, num_devices=NDEV)
  return c


def _spy_loss(captured):
  """get_loss replacement recording the InsDis inputs of the step."""
  get_loss = losses.get_loss

  def get(name):
    fn = get_loss(name)

    @functools.wraps(fn)
    def spy(query, key, *, queue, **kwargs):
      jax.debug.callback(lambda *a: captured.append([np.asarray(x) for x in a]),
                         query, key, queue)
      return fn(query, key, queue=queue, **kwargs)
    return spy
  return get


def test_insdis_step_loss_equals_the_loss_by_hand(monkeypatch):
  n_data, k, tau, lam = 203, 64, 0.1, 1.     # 26 rows per shard, 5 padding.
  config = _insdis_config(k, lam)
  captured = []
  monkeypatch.setattr(losses, 'get_loss', _spy_loss(captured))
  mesh = runtime.create_mesh()
  model, init_fn, step_fn = build_step(
      config, mesh, total_steps=10, num_examples=n_data,
      image_shape=(HW, HW, 1), steps_per_epoch=5)
  state = init_fn(jax.random.key(0))
  bank0 = np.asarray(state.method_state.bank)   # Before the donating step.
  rows = bank0.shape[0]
  assert rows == memory_bank.bank_rows(n_data, NDEV) == 208
  rng = np.random.default_rng(0)
  data = NamedSharding(mesh, P('data'))
  index = rng.permutation(n_data)[:B].astype(np.int32)
  batch = {'views': jax.device_put(
      rng.random((B, 1, HW, HW, 1), np.float32), data),
           'label': jax.device_put(np.zeros(B, np.int32), data),
           'index': jax.device_put(index, data)}
  base = jax.random.key(3)
  _, metrics = step_fn(state, batch, base)
  metrics = jax.device_get(metrics)

  # The step's noise: the rows bank_noise_indices names for the step's key
  # (train_step folds in the step number, 0 here), read from the initial
  # bank; its positives are the bank rows of the batch.
  ids = np.asarray(memory_bank.bank_noise_indices(
      jax.random.fold_in(base, 0), batch=B, num_negatives=k,
      num_examples=n_data, num_rows=rows, num_shards=NDEV))
  assert ids.max() < n_data
  query, key, noise = captured[0]
  np.testing.assert_array_equal(noise, bank0[ids])
  np.testing.assert_array_equal(key[:, 0], bank0[index])

  want, want_z = ref.insdis(query, key, bank0[ids], tau, n_data, lam)
  # Tolerance: the same float32 inputs; the step rounds in float32. Its
  # longest reduction is the log-sum-exp over the B * K noise logits that
  # estimates log Z, and every NCE logit a = s / tau - log Z - log(m P_n)
  # carries the rounding of its parts, whose magnitude is at most
  # 1 / tau + |log Z| + |log(m P_n)| (~ 16 here). Following f32_rtol's rule
  # (rounding allowance for n terms times the largest rounded magnitude):
  # tol = f32_rtol(B K) * that magnitude ~ 5e-4. Softplus is 1-Lipschitz
  # and the noise terms enter through sum_k sigmoid(a_k) ~ h ~ O(1), so the
  # loss inherits about one such error. A different draw of the noise moves
  # the loss by far more (checked below).
  scale = 1. / tau + abs(np.log(want_z)) + abs(np.log(k / n_data))
  tol = ref.f32_rtol(B * k) * scale
  np.testing.assert_allclose(float(metrics['loss']), want, rtol=0, atol=tol)
  np.testing.assert_allclose(float(metrics['nce_z']), want_z,
                             rtol=tol)
  # The comparison can fail: the loss on an i.i.d. (unstratified) draw of the
  # same size, or on the next step's draw, is far outside the tolerance.
  for other in (
      memory_bank.bank_noise_indices(
          jax.random.fold_in(base, 0), batch=B, num_negatives=k,
          num_examples=n_data, num_rows=rows, num_shards=1),
      memory_bank.bank_noise_indices(
          jax.random.fold_in(base, 1), batch=B, num_negatives=k,
          num_examples=n_data, num_rows=rows, num_shards=NDEV)):
    wrong, _ = ref.insdis(query, key, bank0[np.asarray(other)], tau, n_data,
                          lam)
    assert abs(wrong - want) > 10 * tol, (wrong, want, tol)


def _draws_of(num_shards):
  """sample_bank_noise replacement: any mesh reads `num_shards` shards' draws."""
  def sample(bank, key, *, batch, num_negatives, num_examples, mesh=None):
    del mesh
    return bank[memory_bank.bank_noise_indices(
        key, batch=batch, num_negatives=num_negatives,
        num_examples=num_examples, num_rows=bank.shape[0],
        num_shards=num_shards)]
  return sample


def test_eight_devices_equal_one_device_fed_the_same_draws(monkeypatch):
  # test_train_step's device-count invariance for InsDis: the bank update,
  # loss, gradients and metrics of 2 steps agree to its float32 bound when
  # the 1-device step reads the rows the 8 devices draw.
  config = test_train_step._config('insdis')
  mesh1 = runtime.create_mesh(jax.devices()[:1])
  mesh8 = runtime.create_mesh()
  with monkeypatch.context() as patch:
    patch.setattr(memory_bank, 'sample_bank_noise', _draws_of(NDEV))
    init, s1, m1, _ = test_train_step._run(config, mesh1)
  _, s8, m8, _ = test_train_step._run(config, mesh8)
  assert s8.method_state.bank.sharding.spec == P('data', None)
  s1, s8 = jax.device_get(s1), jax.device_get(s8)
  moved = max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(init.params), jax.tree.leaves(s1.params)))
  assert moved > 1e-3
  assert not np.array_equal(init.method_state.bank, s1.method_state.bank)
  jax.tree.map(test_train_step._close, s1, s8)
  for a, b in zip(m1, m8):
    assert a.keys() == b.keys()
    for name in a:
      test_train_step._close(a[name], b[name])
  # Without the patch the 1-device step draws other rows (plain uniform over
  # the data), so its loss differs: the draws depend on the device count.
  _, _, m1_plain, _ = test_train_step._run(config, mesh1)
  assert abs(float(m1_plain[0]['loss']) - float(m8[0]['loss'])) > 1e-3


# --- (f) refused configurations --------------------------------------------

def test_cmc_requires_the_shared_noise_sample():
  # The cmc loss takes a [K, D] sample; per-instance noise ([B, K, D]) would
  # fail only when the step is traced.
  config = configs_cmc.get_config()
  config_lib.validate(config, num_devices=8)
  config.memory_bank.noise = 'per_instance'
  with pytest.raises(ValueError, match=r"config.loss=cmc takes one noise "
                     r".*set config.memory_bank.noise='shared'"):
    config_lib.validate(config, num_devices=8)


def test_k_must_be_divisible_by_the_devices():
  with pytest.raises(ValueError, match='num_negatives=60 is not divisible'):
    _insdis_config(60, 0.)
  c = _insdis_config(64, 0.)
  c.memory_bank.num_negatives = 60
  config_lib.validate(c, num_devices=4)                 # 60 % 4 == 0.
  with pytest.raises(ValueError, match='not divisible'):
    memory_bank.bank_noise_indices(jax.random.key(0), batch=2,
                                 num_negatives=60, num_examples=4000,
                                 num_rows=4000, num_shards=8)


def test_a_shard_without_data_rows_is_refused():
  # 49 examples over 8 devices: 7 rows per shard, shard 7 is all padding.
  with pytest.raises(ValueError, match='without a single data row'):
    memory_bank.bank_noise_indices(jax.random.key(0), batch=2, num_negatives=8,
                                 num_examples=49, num_rows=56, num_shards=8)
