# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
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
# `loss_fn(z, [key, queue, labels], *, hyperparameters) -> (loss, metrics)`
# with z of shape [N, V, D] (N instances, V views, D dimensions);
# `losses.apply(name, losses.LossInputs(...))` calls any of them by name.
# This notebook
#
# 1. evaluates every loss, jitted, on toy embeddings of increasing quality;
# 2. checks each loss's gradient against finite differences;
# 3. plots the similarity matrix the InfoNCE family sees, and what the
#    temperature does to it;
# 4. shows how CACR weighs positives and negatives against their distance
#    (and checks those weights against the loss's own gradient);
# 5. shows MACL's adaptive temperature against the batch alignment;
# 6. shows TCL's gradient magnitudes against k1.
#
# Open `01_losses.ipynb` in Jupyter, or run `jupytext --sync` after editing
# the paired `01_losses.py`. Runs on CPU in about a minute.

# %%
import functools
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

# The repository root (this notebook lives in notebooks/).
sys.path.insert(0, os.path.abspath('..'))
from contrastive_jax import losses  # noqa: E402

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
  return float(jitted(name, **extra)(inputs)[0])


@functools.cache
def jitted(name, **hyperparameters):
  """losses.apply(name, ...) compiled once per loss and hyperparameters."""
  return jax.jit(lambda inputs: losses.apply(name, inputs, **hyperparameters))


NOISES = (2.0, 1.0, 0.3)
table = {}
for name in losses.names():
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
# ## 2. Gradients against finite differences
#
# For every loss: the derivative of the loss along a random direction u,
# from `jax.grad`, against the central difference
# (L(z + eps u) - L(z - eps u)) / (2 eps). The losses compute in float32, so
# eps = 1e-2 balances the difference's rounding error (~1e-7 L / eps) against
# its truncation error (~eps^2 times L's third derivative). The keys, queue
# and labels are held fixed; z moves.
#
# MACL is the exception, by design: its temperature is a stop-gradient
# function of the batch's alignment (Eq. 10), and its value is Eq. 14 while
# its gradient is DCL's, so its gradient is not the derivative of its value.

# %%
def directional_derivatives(name, eps=1e-2):
  z0 = toy_views(1.0)
  accepted, required = losses.inputs_of(name)
  keyed = 'key' in required
  u = jnp.asarray(np.random.default_rng(2).normal(size=z0.shape), jnp.float32)
  extra = {'num_data': N} if name == 'insdis' else {}

  def value(z):
    inputs = losses.LossInputs(
        z=z[:, :1] if keyed else z, key=z0[:, 1:] if keyed else None,
        queue=queue
        if 'queue' in required or (keyed and 'queue' in accepted) else None,
        labels=jnp.asarray(labels) if 'labels' in accepted else None)
    return losses.apply(name, inputs, **extra)[0]

  autodiff = float(jnp.vdot(jax.grad(value)(z0), u))
  numeric = float((value(z0 + eps * u) - value(z0 - eps * u)) / (2 * eps))
  return autodiff, numeric


gradient_check = {name: directional_derivatives(name) for name in table}
print(f'{"loss":<14}{"autodiff":>14}{"finite diff":>14}{"rel. error":>12}')
for name, (a, f) in gradient_check.items():
  note = '  (stop-gradient by design)' if name == 'macl' else ''
  print(f'{name:<14}{a:>14.6f}{f:>14.6f}'
        f'{abs(a - f) / max(abs(f), 1e-12):>12.1e}{note}')

# %% [markdown]
# ## 3. The similarity matrix and the temperature
#
# NT-Xent (SimCLR) scores each of the 2N views against the other 2N - 1 with
# cosine similarity / tau; the positive of view i is the other view of the
# same instance (the off-diagonal stripes below). The softmax over a row is
# the probability the loss assigns to each candidate being the positive: a
# small tau makes it peaked on the hardest candidates, a large tau spreads it
# (Wang & Liu 2021's "uniformity-tolerance" trade-off).

# %%
z_sim = toy_views(1.0)
flat = z_sim.transpose(1, 0, 2).reshape(2 * N, D)        # view-major rows
unit = flat / jnp.linalg.norm(flat, axis=1, keepdims=True)
similarity = np.asarray(unit @ unit.T)
TAUS = (0.05, 0.2, 1.0)

fig, axes = plt.subplots(1, 1 + len(TAUS), figsize=(16, 3.8))
im = axes[0].imshow(similarity, cmap='RdBu_r', vmin=-1, vmax=1)
axes[0].set_title('cosine similarity (2N views)')
fig.colorbar(im, ax=axes[0], fraction=0.046)
positive_probability = {}
for ax, tau in zip(axes[1:], TAUS):
  logits = similarity / tau - np.where(np.eye(2 * N), np.inf, 0.)
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  partner = (np.arange(2 * N) + N) % (2 * N)
  positive_probability[tau] = float(p[np.arange(2 * N), partner].mean())
  ax.imshow(p, cmap='viridis')
  ax.set_title(f'softmax rows, tau={tau}: '
               f'p(positive)={positive_probability[tau]:.2f}')
for ax in axes:
  ax.set(xticks=[], yticks=[])
plt.show()
print('NT-Xent at these temperatures:',
      {tau: round(float(losses.ntxent(z_sim, temperature=tau)[0]), 4)
       for tau in TAUS})

# %% [markdown]
# ## 4. CACR: weights against distance
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
plt.show()

# Repulsion weight as a function of cosine similarity (1 - d/2): increasing.
cacr_similarity = 1. - sqdist / 2.
cacr_repulsion = cacr_weights(T_NEG, -1.)
cacr_attraction = cacr_weights(1.0, +1.)

# %% [markdown]
# ## 5. MACL: adaptive temperature against alignment
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
plt.show()
print(np.round(macl_m, 3), np.round(macl_tau['a'], 4))

# %% [markdown]
# ## 6. TCL: gradient magnitudes against k1
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
plt.show()
print(np.round(tcl_grad_norm, 4), np.round(tcl_pos_coef, 4))
