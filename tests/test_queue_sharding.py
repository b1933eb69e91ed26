"""The MoCo queue stays sharded by rows: never all-gathered, same numbers.

(a) The real 8-device step (`step_lib.build`) of every loss fed by a
    queue (InfoNCE / MoCo v2, CACR-MoCo, JCL) is compiled and its HLO is
    searched for collectives that carry the queue: an all-gather whose result
    is the whole [Q, D] queue, or any collective with a Q-long axis (e.g. the
    [B, Q] logits). Q = 4096 and D = 48 occur nowhere else in these steps.
    When no collective carries queue-sized data, the queue logits can only
    have been formed on the devices that hold the rows. The same search does
    find the all-gather in two deliberately gathered variants (the old
    `dynamic_update_slice` enqueue; the queue replicated at the loss), so the
    check can fail. The memory-bank steps (InsDis, CMC) are checked the same
    way for the [N, D] bank, and the check finds the bank all-gather in the
    old InsDis noise read (tests/test_bank_sharding.py tests the sampler).
(b) Loss and gradient of each queue loss computed sharded as in the step
    (queries and keys split by instance, queue by rows over 8 devices) equal
    the unsharded 1-device computation to a float32 bound derived below; and
    the step without a mesh (notebook use) equals the step on a 1-device mesh.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import queue_comm
from contrastive_jax import step as step_lib
from contrastive_jax import runtime
from contrastive_jax.methods import moco
from contrastive_jax.methods import memory_bank
from contrastive_jax import config_lib
from contrastive_jax import losses
from contrastive_jax import train
from tiny_step import build_step
from tiny_step import tiny_config

B, HW, Q, D = 32, 8, 4096, 48
N_DATA = 4000          # Memory-bank rows (a multiple of 8: no padding rows).
TOTAL = 10


def _config(loss):
  c = tiny_config(batch=B, out_dim=D)
  c.method, c.loss = 'moco', loss
  c.moco.queue_size = Q
  if loss == 'infonce':            # MoCo v2: queue negatives, shuffle-BN.
    c.loss_kwargs = {'temperature': 0.2, 'in_batch_negatives': False}
    c.moco.shuffle_bn = True
  elif loss == 'cacr':             # CACR-MoCo: both views query and key.
    c.loss_kwargs = {'t_neg': 2.0}
    c.moco.query_views, c.moco.key_views = (0, 1), (0, 1)
  elif loss == 'jcl':
    c.loss_kwargs = {'temperature': 0.2, 'lam': 4.}
    c.augment.num_views = 3
    c.moco.key_views = (1, 2)
  elif loss == 'insdis':
    c.method = 'memory_bank'
    c.moco.queue_size = 0
    c.loss_kwargs = {'temperature': 0.1}
    c.augment.num_views = 1
    c.memory_bank.num_negatives = 256
  else:
    raise ValueError(loss)
  config_lib.validate(c)
  return c


def _build(config, mesh):
  return build_step(config, mesh, total_steps=TOTAL, num_examples=N_DATA,
                    image_shape=(HW, HW, 1))[1:]


def _step_hlo(config) -> str:
  """The compiled HLO text of the 8-device train step of `config`."""
  mesh = runtime.create_mesh()
  assert mesh.size == 8
  init_fn, step_fn = _build(config, mesh)
  state = jax.eval_shape(init_fn, jax.random.key(0))
  v = config.augment.num_views
  batch = {'views': jax.ShapeDtypeStruct((B, v, HW, HW, 1), jnp.float32),
           'label': jax.ShapeDtypeStruct((B,), jnp.int32),
           'index': jax.ShapeDtypeStruct((B,), jnp.int32)}
  return step_fn.lower(state, batch, jax.random.key(1)).compile().as_text()


def _queue_traffic(hlo: str) -> list:
  """Collectives that move the queue or anything with a Q-long axis."""
  return [c for c in queue_comm.collectives(hlo) if Q in c.shape]


@pytest.mark.parametrize('loss', ['infonce', 'cacr', 'jcl'])
def test_compiled_step_never_gathers_the_queue(loss):
  hlo = _step_hlo(_config(loss))
  assert queue_comm.gathers_of(hlo, (Q, D)) == []
  assert _queue_traffic(hlo) == []
  # The queries are what moves: an all-gather of the [B, D] embeddings.
  assert any(c.kind == 'all-gather' and c.shape[-1] == D and c.shape[0] == B
             for c in queue_comm.collectives(hlo))


def _replicated_queue_loss(mesh):
  """get_loss replacement: the loss sees the queue all-gathered (replicated)."""
  get_loss = losses.get_loss

  def get(name):
    fn = get_loss(name)

    @functools.wraps(fn)
    def wrapped(*args, queue=None, **kwargs):
      queue = jax.lax.with_sharding_constraint(queue, NamedSharding(mesh, P()))
      return fn(*args, queue=queue, **kwargs)
    return wrapped
  return get


@pytest.mark.parametrize('variant', ['dynamic_update_slice_enqueue',
                                     'replicated_queue_in_loss'])
def test_the_check_finds_a_gathered_queue(variant, monkeypatch):
  # The inspection above must be able to fail: in these variants the queue is
  # all-gathered whole, and the same search finds it.
  if variant == 'dynamic_update_slice_enqueue':
    monkeypatch.setattr(moco, 'enqueue', queue_comm.gathered_enqueue)
  else:
    monkeypatch.setattr(losses, 'get_loss',
                        _replicated_queue_loss(runtime.create_mesh()))
  hlo = _step_hlo(_config('infonce'))
  gathers = queue_comm.gathers_of(hlo, (Q, D))
  assert gathers, 'the deliberately gathered variant has no [Q, D] all-gather'
  assert _queue_traffic(hlo)


def _bank_traffic(hlo: str) -> list:
  """All-gathers of the whole bank, or any collective with an N_DATA axis."""
  return (queue_comm.gathers_of(hlo, (N_DATA, D)) +
          [c for c in queue_comm.collectives(hlo) if N_DATA in c.shape])


@pytest.mark.parametrize('loss', ['insdis', 'cmc'])
def test_memory_bank_step_does_not_gather_the_bank(loss):
  # The bank is sharded by rows like the queue; no step may gather it whole.
  # InsDis draws its [B, K] noise rows per device from the device's own
  # shard (memory_bank.sample_bank_noise); CMC's one shared [K] sample is read by
  # a masked local gather and an all-reduce of the [K, D] rows.
  config = _config('insdis')
  if loss == 'cmc':
    config.loss, config.loss_kwargs = 'cmc', {'temperature': 0.1}
    config.augment.num_views = 2
    config.memory_bank.noise = 'shared'
    config_lib.validate(config)
  assert _bank_traffic(_step_hlo(config)) == []


def test_the_check_finds_a_gathered_bank(monkeypatch):
  # The inspection above must be able to fail: the InsDis noise read as
  # bank[ids] with global [B, K] ids (before issue 11) gathers the bank.
  monkeypatch.setattr(memory_bank, 'sample_bank_noise',
                      queue_comm.gathered_bank_noise)
  hlo = _step_hlo(_config('insdis'))
  assert queue_comm.gathers_of(hlo, (N_DATA, D))


# --- (b) Sharded and unsharded numbers agree. ------------------------------

N = B                  # Instances in the loss-level comparison.


def _loss_inputs(loss, seed=0):
  """query, key, queue; a few queue rows near the queries sit on one shard."""
  rng = np.random.default_rng(seed)
  vq, vk = {'infonce': (1, 1), 'infonce_v3': (2, 2), 'cacr': (2, 2),
            'jcl': (1, 2)}[loss]
  query = rng.normal(size=(N, vq, D)).astype(np.float32)
  key = rng.normal(size=(N, vk, D)).astype(np.float32)
  queue = rng.normal(size=(Q, D))
  queue /= np.linalg.norm(queue, axis=1, keepdims=True)
  # Rows close to the first queries, all inside device 5's shard: the
  # log-sum-exp maximum of those anchors lives on one device, so the other
  # shards' partial sums must be rescaled correctly when combined.
  shard = Q // 8
  near = query[:8, 0] + 0.1 * rng.normal(size=(8, D))
  queue[5 * shard:5 * shard + 8] = near / np.linalg.norm(near, axis=1,
                                                         keepdims=True)
  if loss == 'jcl':         # JCL's queue holds key means, norm <= 1.
    queue *= rng.uniform(0.5, 1., size=(Q, 1))
  return query, key, queue.astype(np.float32)


_LOSSES = {
    'infonce': lambda q, k, queue: losses.infonce(
        q, k, queue=queue, temperature=0.2, in_batch_negatives=False),
    'infonce_v3': lambda q, k, queue: losses.infonce(
        q, k, queue=queue, temperature=0.2, in_batch_negatives=True),
    'cacr': lambda q, k, queue: losses.get_loss('cacr')(
        q, key=k, queue=queue, t_neg=2.0),
    'jcl': lambda q, k, queue: losses.get_loss('jcl')(
        q, k, queue=queue, lam=4., temperature=0.2),
}


def _value_and_grad(loss):
  """(loss, metrics), d loss / d query."""
  return jax.value_and_grad(_LOSSES[loss], has_aux=True)


@pytest.mark.parametrize('loss', ['infonce', 'infonce_v3', 'cacr', 'jcl'])
def test_sharded_queue_loss_and_grad_equal_the_unsharded(loss):
  query, key, queue = _loss_inputs(loss)
  f = _value_and_grad(loss)
  # Unsharded: one device holds everything.
  dev = jax.devices()[0]
  (l1, m1), g1 = jax.jit(f)(*(jax.device_put(x, dev)
                             for x in (query, key, queue)))
  # Sharded as in the train step: instances over 'data', queue rows over
  # 'data'. Its HLO moves no queue-sized data (so it is the local-logit path).
  mesh = runtime.create_mesh()
  data = NamedSharding(mesh, P('data'))
  rows = NamedSharding(mesh, P('data', None))
  f8 = jax.jit(f, in_shardings=(data, data, rows))
  args = (jax.device_put(query, data), jax.device_put(key, data),
          jax.device_put(queue, rows))
  assert _queue_traffic(f8.lower(*args).compile().as_text()) == []
  (l8, _), g8 = f8(*args)

  # Tolerance. The two computations differ only in the order of float32
  # reductions: the sums over the Q queue logits (plus N * Vk in-batch ones)
  # become 8 per-device partial sums and a cross-device combine, the
  # gradient's sum over the same logits likewise, and each logit is a
  # length-D dot product (whose blocking may differ). A recursive sum of L
  # terms in float32 has relative error <= gamma_L = L eps / (1 - L eps) ~
  # L eps times sum |terms| / |sum| (Higham, Accuracy and Stability of
  # Numerical Algorithms, Sec. 4.2), with L = Q + N * Vk + D the longest
  # chain here. Exponentials are positive, so for a log-sum-exp that ratio
  # is 1 and the log turns the relative error of the sum into an absolute
  # one of the same size; CACR's repulsion is a ratio of two such sums
  # (2 gamma_L). Both sides err: tol = 4 L eps, relative to the scale of the
  # loss's terms: |loss| for the log-sum-exp losses (a few units), and
  # |ca| + |cr| for CACR, whose loss is their near-cancelling difference.
  # Each gradient entry is a softmax-weighted average of bounded terms, so
  # its sum |terms| is of the order of the gradient's largest entry, which
  # sets the gradient's absolute scale. At Q = 4096, tol ~ 2e-3: far above
  # the ~1e-7 relative reassociation noise measured here, far below the
  # ~1e-1 change of a dropped or double-counted shard (log(8 / 7) of the
  # loss).
  eps = float(np.finfo(np.float32).eps)
  reduction = Q + N * key.shape[1] + D
  tol = 4 * reduction * eps
  scale = (abs(float(m1['ca'])) + abs(float(m1['cr'])) if loss == 'cacr'
           else abs(float(l1)))
  np.testing.assert_allclose(float(l8), float(l1), rtol=0, atol=tol * scale)
  g1 = np.asarray(g1)
  np.testing.assert_allclose(np.asarray(g8), g1, rtol=0,
                             atol=tol * float(np.max(np.abs(g1))))
  assert float(np.max(np.abs(g1))) > 0.


def test_step_without_a_mesh_equals_the_one_device_mesh_step():
  # Notebook use: train_step jitted plainly, no mesh, no shardings (global BN
  # on one device: the queue constraint in train_step is skipped). The same
  # step on a 1-device mesh goes through the sharding constraint and the
  # scatter enqueue; both are the same single-device program.
  config = _config('infonce')
  config.moco.shuffle_bn = False          # Shuffle-BN needs a mesh.
  mesh1 = runtime.create_mesh(jax.devices()[:1])
  setup = step_lib.build(config, mesh1, total_steps=TOTAL, steps_per_epoch=2,
                      num_examples=N_DATA, image_shape=(HW, HW, 1))
  plain = jax.jit(functools.partial(
      step_lib.train_step, model=setup.model, tx=setup.tx, method=setup.method,
      loss=setup.loss, classifier=setup.classifier, mesh=None))
  rng = np.random.default_rng(0)
  batch = {'views': rng.random((B, 2, HW, HW, 1), np.float32),
           'label': np.zeros(B, np.int32),
           'index': np.arange(B, dtype=np.int32)}
  s_plain = jax.device_get(step_lib.create_train_state(
      jax.random.key(0), model=setup.model, tx=setup.tx,
      image_shape=(HW, HW, 1), method=setup.method, classifier=setup.classifier))
  s_mesh = setup.init_fn(jax.random.key(0))
  for step in range(2):
    s_plain, m_plain = plain(s_plain, batch, jax.random.key(3))
    s_mesh, m_mesh = setup.step_fn(s_mesh, batch, jax.random.key(3))
  s_plain, s_mesh = jax.device_get(s_plain), jax.device_get(s_mesh)
  assert int(s_plain.method_state.queue_ptr) == int(
      s_mesh.method_state.queue_ptr) == 2 * B
  # Not bitwise: the two are compiled separately (in/out shardings and
  # donation change XLA's fusions, hence the order of float32 reductions in
  # BN statistics and gradient sums), so test_train_step's bound for
  # reassociation over two SGD steps applies.
  def close(a, b):
    b = np.asarray(b)
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4,
                               atol=1e-5 * max(1., float(np.max(np.abs(b)))))
  jax.tree.map(close, s_plain, s_mesh)
  jax.tree.map(close, jax.device_get(m_plain), jax.device_get(m_mesh))


def test_shuffle_bn_on_one_device_is_said_to_do_nothing(caplog):
  import logging  # pylint: disable=g-import-not-at-top
  from configs import moco_v2  # pylint: disable=g-import-not-at-top
  config = config_lib.with_defaults(moco_v2.get_config())
  config.moco.shuffle_bn = True
  with caplog.at_level(logging.WARNING):
    config_lib.validate(config, num_devices=1)
  assert 'shuffle-BN changes nothing here' in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    config_lib.validate(config, num_devices=8)
  assert 'shuffle-BN' not in caplog.text
  # With BatchNorm over groups the shuffle acts on one device too.
  config.model.bn_splits = 8
  with caplog.at_level(logging.WARNING):
    config_lib.validate(config, num_devices=1)
  assert 'shuffle-BN' not in caplog.text
