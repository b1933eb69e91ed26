"""Registry-wide tests: API contract and numerics for every buildable loss.

CASES maps a case name to (registry name, builder). A builder maps
(z, labels, queue, temperature) -> (LossInputs, hyperparameters), called
through `losses.apply` (the one way every caller calls a loss); z is
[N, V, D] with V = 3, labels [N] int, queue [Q, D] and temperature a traced
float32 scalar (CACR's builders take t = 1 / (2 tau) from it; other losses
without a temperature ignore it). A case
runs when its registry name is in `losses.LOSSES`, so covering a new loss is
one more CASES entry. Each case is compiled once per input dtype (with the
test-only FAST_COMPILE backend option) and shared by all tests below.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses
import numpy_reference as ref


def _tau(t):
  return {'temperature': t}


def _cacr_t(t):
  # t- = 1 / (2 tau) matches an InfoNCE temperature tau (2 - 2 cos / tau).
  return {'t_pos': 0.5 / t, 't_neg': 0.5 / t}


In = losses.LossInputs   # pylint: disable=invalid-name
CASES = {
    'ntxent': ('ntxent', lambda z, y, q, t: (In(z), _tau(t))),
    'infonce': ('infonce', lambda z, y, q, t: (
        In(z[:, :2], key=z[:, 1:], queue=q), _tau(t))),
    'insdis': ('insdis', lambda z, y, q, t: (
        In(z[:, :1], key=z[:, 1:2], queue=q),
        {'num_data': 10**6, **_tau(t)})),
    'cmc': ('cmc', lambda z, y, q, t: (
        In(z, queue=q), {'graph': 'full', **_tau(t)})),
    'supcon': ('supcon', lambda z, y, q, t: (In(z, labels=y), _tau(t))),
    'supcon_in': ('supcon', lambda z, y, q, t: (
        In(z, labels=y), {'variant': 'in', **_tau(t)})),
    'tcl': ('tcl', lambda z, y, q, t: (In(z, labels=y), _tau(t))),
    'align_uniform': ('align_uniform', lambda z, y, q, t: (In(z), {})),
    'align_uniform_alpha1': ('align_uniform', lambda z, y, q, t: (
        In(z), {'alpha': 1.})),
    'hard_negative': ('hard_negative', lambda z, y, q, t: (In(z), _tau(t))),
    'dcl': ('dcl', lambda z, y, q, t: (In(z), _tau(t))),
    'dcl_simclr': ('dcl', lambda z, y, q, t: (
        In(z), {'layout': 'simclr', **_tau(t)})),
    'cacr': ('cacr', lambda z, y, q, t: (In(z), _cacr_t(t))),
    'cacr_moco': ('cacr', lambda z, y, q, t: (
        In(z, key=z[:, ::-1], queue=q), _cacr_t(t))),
    'macl': ('macl', lambda z, y, q, t: (In(z), _tau(t))),
    'macl_simclr_b': ('macl', lambda z, y, q, t: (
        In(z), {'layout': 'simclr', 'variant': 'b', **_tau(t)})),
    'jcl': ('jcl', lambda z, y, q, t: (
        In(z[:, :1], key=z[:, 1:], queue=q), {'lam': 4., **_tau(t)})),
}
# Every loss but byol (tests/test_byol.py), which must have a case.
OWN = ('ntxent', 'infonce', 'insdis', 'cmc', 'supcon', 'tcl',
       'align_uniform', 'hard_negative', 'dcl', 'cacr', 'macl', 'jcl')
# Losses whose metrics have no mean negative cosine.
NO_NEG_SIM = ('cacr', 'macl', 'jcl')
BUILT = sorted(case for case, (name, _) in CASES.items()
               if name in losses.LOSSES)
LABELS = np.array([0, 1, 0, 2, 1, 0], np.int32)   # class 2 is a singleton
_COMPILED = {}


def _default_temperature(name):
  """The loss's own default temperature (tcl: its supervised default)."""
  params = inspect.signature(losses.get_loss(name)).parameters
  if 'temperature' not in params:
    return 1.
  default = params['temperature'].default
  return 0.1 if default is None else default


def _call(case, z, labels, queue, temperature):
  """Jit-compiled value and dL/dz of a case: (loss, metrics, grad)."""
  name, build = CASES[case]
  if case not in _COMPILED:

    def loss_of(z, labels, queue, temperature):
      inputs, kwargs = build(z, labels, queue, temperature)
      return losses.apply(name, inputs, **kwargs)

    _COMPILED[case] = ref.fast_jit(jax.value_and_grad(loss_of, has_aux=True))
  (loss, metrics), grad = _COMPILED[case](z, labels, queue,
                                          np.float32(temperature))
  return loss, metrics, grad


def _random(seed=0, d=16):
  rng = np.random.RandomState(seed)
  return (rng.randn(6, 3, d).astype(np.float32),
          rng.randn(5, d).astype(np.float32))


# -------------------------------------------------------------- registry ---

def test_every_registered_loss_follows_the_convention():
  """Inputs first, hyperparameters keyword-only with defaults
  (docs/losses.md), so `losses.apply` can call any of them. A loss with a
  positional or default-less hyperparameter fails here."""
  assert set(OWN) <= set(losses.LOSSES)
  inputs = {'key', 'queue', 'labels'}
  for name, fn in losses.LOSSES.items():
    params = list(inspect.signature(fn).parameters.values())
    assert params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
    for p in params[1:]:
      if p.name in inputs:
        continue
      assert p.kind is inspect.Parameter.KEYWORD_ONLY, (name, p.name)
      if p.name != 'num_data':   # InsDis's data size: the method supplies it.
        assert p.default is not inspect.Parameter.empty, (name, p.name)
    assert getattr(losses, name, fn) is fn   # No module shadows a loss.


def test_apply_refuses_inputs_a_loss_does_not_take():
  z = np.ones((4, 2, 8), np.float32)
  with pytest.raises(ValueError, match='takes no labels'):
    losses.apply('ntxent', losses.LossInputs(z, labels=np.zeros(4, np.int32)))
  accepted, required = losses.inputs_of('infonce')
  assert accepted == {'z', 'key', 'queue'} and required == {'z', 'key'}


def test_every_owned_loss_has_a_case():
  covered = {name for name, _ in CASES.values()}
  assert set(OWN) <= covered


def test_get_loss_unknown_name_lists_known_losses():
  with pytest.raises(ValueError, match='unknown loss') as err:
    losses.get_loss('nope')
  for name in OWN:
    assert name in str(err.value)


# ------------------------------------------------------------ API shape ---

@pytest.mark.parametrize('case', BUILT)
def test_jit_returns_float32_scalars_and_finite_grads(case):
  z, queue = _random()
  loss, metrics, grad = _call(case, z, LABELS, queue,
                              _default_temperature(CASES[case][0]))
  assert loss.shape == () and loss.dtype == jnp.float32
  assert np.isfinite(loss)
  assert isinstance(metrics, dict) and metrics
  for key, value in metrics.items():
    assert isinstance(key, str)
    assert value.shape == () and value.dtype == jnp.float32, key
    assert np.isfinite(value), key
  assert 'pos_sim' in metrics
  assert 'neg_sim' in metrics or CASES[case][0] in NO_NEG_SIM
  assert grad.shape == z.shape
  assert np.all(np.isfinite(grad)) and np.any(grad != 0)


@pytest.mark.parametrize('case', BUILT)
def test_metrics_on_a_perfect_batch(case):
  # Views of an instance identical, instances and queue rows orthonormal:
  # pos_sim = 1, neg_sim = 0 and top-1 accuracy = 1 for every loss.
  basis = np.linalg.qr(np.random.RandomState(1).randn(16, 16))[0]
  basis = basis.astype(np.float32)
  z = np.repeat(basis[:6, None, :], 3, axis=1) * 2.5
  _, metrics, _ = _call(case, z, np.arange(6, dtype=np.int32), basis[6:11],
                        0.1)
  np.testing.assert_allclose(metrics['pos_sim'], 1., atol=1e-5)
  if 'neg_sim' in metrics:
    np.testing.assert_allclose(metrics['neg_sim'], 0., atol=1e-5)
  if 'acc' in metrics:
    np.testing.assert_allclose(metrics['acc'], 1.)


# -------------------------------------------------------------- numerics ---

@pytest.mark.parametrize('case', BUILT)
@pytest.mark.parametrize('kind', ['aligned', 'bf16', 'duplicate'])
def test_finite_at_small_temperature(case, kind):
  # tau = 0.02 (logits up to 50, e^{(1+beta) 50} overflows float32; CACR's
  # t = 25) with nearly aligned embeddings, bfloat16 inputs, or one embedding
  # repeated everywhere (zero distances, tied logits); LABELS has a singleton
  # class.
  z, queue = _random(seed=2)
  if kind == 'aligned':
    z = z[:1, :1] + 1e-3 * z
    queue = z[0, :1] + 1e-3 * queue
  elif kind == 'bf16':
    z, queue = jnp.asarray(z, jnp.bfloat16), jnp.asarray(queue, jnp.bfloat16)
  else:
    z = np.broadcast_to(z[:1, :1], z.shape).copy()
    queue = np.broadcast_to(z[0, :1], queue.shape).copy()
  loss, metrics, grad = _call(case, z, LABELS, queue, 0.02)
  assert loss.dtype == jnp.float32 and np.isfinite(loss)
  assert all(np.isfinite(v) for v in metrics.values())
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


@pytest.mark.parametrize('case', BUILT)
def test_bfloat16_inputs_are_computed_in_float32(case):
  z, queue = _random(seed=3)
  z16, q16 = jnp.asarray(z, jnp.bfloat16), jnp.asarray(queue, jnp.bfloat16)
  loss16, _, _ = _call(case, z16, LABELS, q16, 0.02)
  loss32, _, _ = _call(case, np.asarray(z16, np.float32), LABELS,
                       np.asarray(q16, np.float32), 0.02)
  # The same float32 computation after the cast, up to the order of the
  # d = 16-term dot products (a kernel taking bf16 may sum differently):
  # rounding at the size of the logits, |q.k| / tau <= 50, or of the loss if
  # larger. Computing in bfloat16 would be off by ~2^-8 of that, 0.2: 1000x
  # this.
  scale = max(1 / 0.02, abs(float(loss32)))
  np.testing.assert_allclose(loss16, loss32, rtol=0,
                             atol=ref.f32_rtol(16) * scale)


@pytest.mark.parametrize('case', BUILT)
def test_matmuls_run_in_full_float32_whatever_the_default(case):
  # On NVIDIA GPUs a float32 matmul defaults to TF32 (~1e-3 relative), which
  # a temperature of 0.02-0.5 amplifies in the logits; every registered loss
  # pins its products to full float32, forward and backward, even when the
  # default asks for less.
  name, build = CASES[case]
  z, queue = _random()

  def loss_of(z, queue):
    inputs, kwargs = build(z, LABELS, queue, 0.1)
    return losses.apply(name, inputs, **kwargs)[0]

  with jax.default_matmul_precision('bfloat16'):
    text = jax.jit(jax.grad(loss_of)).lower(z, queue).as_text()
  dots = [line for line in text.splitlines() if 'dot_general' in line]
  assert dots, 'every case multiplies embeddings'
  assert all('precision = [HIGHEST, HIGHEST]' in line for line in dots), dots
