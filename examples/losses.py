# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Contrastive losses side by side
#
# Every loss in `contrastive_jax.losses` is a pure function
# `loss_fn(inputs, *, hyperparameters) -> (loss, metrics)`. This notebook
#
# 1. evaluates them on toy embeddings of increasing quality;
# 2. shows how CACR weighs positives and negatives against their distance
#    (and checks those weights against the loss's own gradient);
# 3. shows MACL's adaptive temperature against the batch alignment;
# 4. shows TCL's gradient magnitudes against k1.
#
# Figures go to `$CONTRASTIVE_JAX_FIGURES` (or a fresh temporary directory).
# Run headlessly with `python examples/losses.py`, or open it as a notebook
# with jupytext.

# %%
import os
import sys
import tempfile

import matplotlib

matplotlib.use('Agg')  # headless: figures are only saved
import matplotlib.pyplot as plt  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

try:
  ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
except NameError:  # inside Jupyter, started from examples/
  ROOT = os.path.abspath('..')
sys.path.insert(0, ROOT)
from contrastive_jax import losses  # noqa: E402

FIG_DIR = (os.environ.get('CONTRASTIVE_JAX_FIGURES')
           or tempfile.mkdtemp(prefix='contrastive_jax_figs_'))
os.makedirs(FIG_DIR, exist_ok=True)
print('figures ->', FIG_DIR)

# %% [markdown]
# ## 1. Toy embeddings
#
# N = 32 instances from 4 classes, V = 2 views, D = 16. Each view is the
# instance's centre plus noise; less noise means better-aligned views.
# Key-encoder losses get the second view as the key and a random queue.

# %%
N, V, D, Q, CLASSES = 32, 2, 16, 256, 4
rng = np.random.default_rng(0)
labels = np.arange(N) % CLASSES
class_means = rng.normal(size=(CLASSES, D))
centres = class_means[labels] + 0.5 * rng.normal(size=(N, D))
queue = jnp.asarray(rng.normal(size=(Q, D)), jnp.float32)


def toy_views(noise, views=V, seed=1):
  r = np.random.default_rng(seed)
  z = centres[:, None] + noise * r.normal(size=(N, views, D))
  return jnp.asarray(z, jnp.float32)


def evaluate(name, z):
  """Runs loss `name` on views z, giving it the inputs its signature takes.

  A loss that requires a key (MoCo-style) sees view 0 as the query and the
  other views as keys; queues and labels go to the losses that take them.
  """
  accepted, required = losses.inputs_of(name)
  keyed = 'key' in required
  inputs = losses.LossInputs(
      z=z[:, :1] if keyed else z, key=z[:, 1:] if keyed else None,
      queue=queue if 'queue' in required or (keyed and 'queue' in accepted)
      else None,
      labels=jnp.asarray(labels) if 'labels' in accepted else None)
  extra = {'num_data': N} if name == 'insdis' else {}
  return float(losses.apply(name, inputs, **extra)[0])


NOISES = (2.0, 1.0, 0.3)
table = {}
for name in sorted(losses.LOSSES):
  try:
    table[name] = [evaluate(name, toy_views(s)) for s in NOISES]
  except Exception as e:  # a loss that needs other inputs is just listed
    print(f'{name}: skipped ({type(e).__name__}: {e})')
print(f'{"loss":<14}' + ''.join(f'{f"noise={s}":>12}' for s in NOISES))
for name, vals in table.items():
  print(f'{name:<14}' + ''.join(f'{v:>12.4f}' for v in vals))

# %% [markdown]
# Every loss should prefer better-aligned views: the value falls as the noise
# falls (MACL's is always >= 1 by construction; JCL's bound uses the key
# spread, which also shrinks).

# %%
decreasing = {name: bool(np.all(np.diff(vals) < 0))
              for name, vals in table.items()}
print(decreasing)

# %% [markdown]
# ## 2. CACR: weights against distance
#
# CACR's repulsion weights are pi-_j = softmax_j(-t_neg ||q - n_j||^2) (hard
# negatives get more weight), its attraction weights
# pi+_k = softmax_k(+t_pos ||q - p_k||^2) (hard positives get more weight).
# Below, one query at the north pole with negatives and positives spread over
# the circle. Before plotting we check that these are the weights the loss
# really applies: with both weight sets detached, the gradient of `cacr` on
# the query is the weighted pull minus the weighted push (notes/cacr.md
# Sec. 7 item 10).

# %%
angles = np.linspace(0.05, np.pi - 0.05, 24)
circle = np.stack([np.cos(angles), np.sin(angles)], -1)
circle = np.concatenate([circle, np.zeros((len(angles), 2))], -1)   # D = 4
query = np.array([1., 0., 0., 0.])
sqdist = np.sum((query - circle) ** 2, -1)                          # 2 - 2 cos


def cacr_weights(t, sign):
  return np.asarray(jax.nn.softmax(sign * t * jnp.asarray(sqdist)))


# One instance, K+1 = 2 views (both at the query), the positive key of each
# view is the other view's key; the circle is the queue.
pos_key = np.array([0.6, 0.8, 0., 0.])
zq = jnp.asarray(np.stack([query, query])[None], jnp.float32)
zk = jnp.asarray(np.stack([pos_key, pos_key])[None], jnp.float32)
T_NEG = 2.0
grad = np.asarray(jax.grad(lambda x: losses.cacr(
    x, key=zk, queue=jnp.asarray(circle, jnp.float32), intra_batch=False,
    t_neg=T_NEG, sg_neg=True)[0])(zq))[0, 0]
w_neg = cacr_weights(T_NEG, -1.)
ambient = (query - pos_key) - np.sum(w_neg[:, None] * (query - circle), 0)
expected = ambient - (ambient @ query) * query     # tangent projection
cacr_grad_matches = bool(np.allclose(grad, expected, atol=1e-5))
print('gradient implied by the weights matches autodiff:', cacr_grad_matches)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for t in (0.5, 1.0, 2.0, 4.0):
  axes[0].plot(sqdist, cacr_weights(t, -1.), label=f't_neg={t}')
  axes[1].plot(sqdist, cacr_weights(t, +1.), label=f't_pos={t}')
axes[0].set(title='CACR repulsion weights pi-', xlabel='||q - n||^2',
            ylabel='weight')
axes[1].set(title='CACR attraction weights pi+', xlabel='||q - p||^2')
for ax in axes:
  ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(FIG_DIR, 'cacr_weights.png'))
plt.close(fig)

# Repulsion weight as a function of cosine similarity (1 - d/2): increasing.
cacr_similarity = 1. - sqdist / 2.
cacr_repulsion = cacr_weights(T_NEG, -1.)
cacr_attraction = cacr_weights(1.0, +1.)

# %% [markdown]
# ## 3. MACL: adaptive temperature against alignment
#
# MACL sets tau' = tau_0 alpha^m (variant a) or tau_0 (1 + beta m) (variant b),
# with m the batch's mean positive cosine. Better alignment gives a larger
# temperature, i.e. more tolerance to semantically similar negatives.

# %%
macl_noise = np.geomspace(3.0, 0.05, 12)
macl_m, macl_tau = [], {'a': [], 'b': []}
for s in macl_noise:
  z = toy_views(s)
  for variant in 'ab':
    _, metrics = losses.macl(z, variant=variant)
    macl_tau[variant].append(float(metrics['tau']))
  macl_m.append(float(metrics['pos_sim']))
macl_m = np.array(macl_m)

fig, ax = plt.subplots(figsize=(5, 3.5))
for variant in 'ab':
  ax.plot(macl_m, macl_tau[variant], 'o-', label=f'MACL-{variant}')
ax.set(xlabel='mean positive cosine m', ylabel="tau'",
       title='MACL adaptive temperature')
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(FIG_DIR, 'macl_temperature.png'))
plt.close(fig)
print(np.round(macl_m, 3), np.round(macl_tau['a'], 4))

# %% [markdown]
# ## 4. TCL: gradient magnitudes against k1
#
# TCL adds k1 sum_p e^{-s_ip} to SupCon's denominator; a larger k1 should
# strengthen the gradient from (hard) positives. We measure the norm of the
# autodiff gradient on the embeddings and the loss's own positive-gradient
# coefficient, for k1 from 1 to 10^4 (labels given, k2 = 1, tau = 0.1).

# %%
tcl_k1 = np.array([1., 10., 100., 1000., 5000., 10000.])
z_tcl = toy_views(1.0)
lab = jnp.asarray(labels)
tcl_step = jax.jit(jax.value_and_grad(
    lambda z, k1: losses.tcl(z, lab, k1=k1, k2=1., temperature=0.1),
    has_aux=True))
tcl_grad_norm, tcl_pos_coef = [], []
for k1 in tcl_k1:
  (_, metrics), g = tcl_step(z_tcl, jnp.float32(k1))
  tcl_grad_norm.append(float(jnp.linalg.norm(g)))
  tcl_pos_coef.append(float(metrics['pos_grad_coef']))

fig, ax = plt.subplots(figsize=(5, 3.5))
ax.semilogx(tcl_k1, tcl_grad_norm, 'o-', label='||dL/dz||')
ax.semilogx(tcl_k1, tcl_pos_coef, 's-', label='pos_grad_coef')
ax.set(xlabel='k1', title='TCL gradient magnitude')
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(FIG_DIR, 'tcl_gradients.png'))
plt.close(fig)
print(np.round(tcl_grad_norm, 4), np.round(tcl_pos_coef, 4))

# %%
figures = sorted(f for f in os.listdir(FIG_DIR) if f.endswith('.png'))
print('saved:', figures)
