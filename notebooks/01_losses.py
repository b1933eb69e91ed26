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
# # The contrastive losses: how to call them, and what they do
#
# `contrastive_jax.losses` holds every objective of this library as a pure,
# jittable JAX function. You can use them without the rest of the library:
# give one your embeddings, take the gradient, step your own optimizer.
# This notebook
#
# 1. calls a loss and shows the shapes it takes and returns;
# 2. lists every loss with its inputs and hyperparameters;
# 3. trains a tiny encoder with one of them in plain JAX + optax;
# 4. runs every loss on the same toy embeddings, from poorly to well aligned
#    views;
# 5. checks every loss's gradient against finite differences;
# 6. looks inside four of them: NT-Xent's temperature, CACR's weights,
#    MACL's adaptive temperature and TCL's positive-gradient boost.
#
# It runs on a CPU in about a minute. Edit `01_losses.py` (the paired
# jupytext source) and regenerate with `.venv/bin/python notebooks/execute.py
# 01_losses`.

# %%
import functools
import inspect
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from IPython.display import Markdown, display

# The repository root (this notebook lives in notebooks/).
sys.path.insert(0, os.path.abspath('..'))
from contrastive_jax import losses  # noqa: E402


def markdown_table(header, rows):
  """A list of rows as a Markdown table (rendered by Jupyter and GitHub)."""
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
  return Markdown('\n'.join(lines))


# %% [markdown]
# ## 1. Calling a loss
#
# An in-batch loss takes `z` of shape **[N, V, D]**: N instances (images),
# V augmented views of each, D embedding dimensions. The views of one
# instance are its positives; every other instance's views are negatives.
# The embeddings need not be normalised: every loss L2-normalises them
# itself and computes its similarities in float32. Hyperparameters are
# keyword-only, with the paper's defaults.
#
# Every loss returns `(loss, metrics)`: a scalar and a flat dict of scalars
# to log (most report `pos_sim`, the mean cosine between positives, and
# `acc`, how often a view's most similar candidate is its positive).

# %%
N, V, D = 8, 2, 16
z = jax.random.normal(jax.random.key(0), (N, V, D))
loss, metrics = losses.ntxent(z, temperature=0.1)
print(f'z {z.shape} {z.dtype} -> loss {loss.shape} {loss.dtype}: '
      f'{float(loss):.4f}')
print({k: round(float(v), 4) for k, v in metrics.items()})

# %% [markdown]
# Losses with a key encoder (MoCo, InsDis, JCL, BYOL) take the online
# encoder's `query` [N, Vq, D] and the key encoder's `key` [N, Vk, D]
# (gradients flow only through the query), and MoCo-style ones a `queue`
# [Q, D] of negatives from earlier batches. Supervised losses (SupCon, TCL)
# also take `labels` [N]:

# %%
keys = jax.random.split(jax.random.key(1), 3)
query = jax.random.normal(keys[0], (N, 1, D))
key = jax.random.normal(keys[1], (N, 1, D))
queue = jax.random.normal(keys[2], (64, D))
loss, _ = losses.infonce(query, key, queue=queue, temperature=0.2)
print(f'infonce: {float(loss):.4f}')
loss, _ = losses.supcon(z, jnp.arange(N) % 4)     # 4 classes
print(f'supcon:  {float(loss):.4f}')

# %% [markdown]
# ## 2. Every loss
#
# The registry `losses.LOSSES` maps each name (the value of `config.loss`)
# to its function; `losses.inputs_of(name)` says which inputs it takes.
# Inputs in *italics* are optional.

# %%
def input_names(name):
  accepted, required = losses.inputs_of(name)
  params = list(inspect.signature(losses.get_loss(name)).parameters)
  shapes = {'key': 'key', 'queue': 'queue', 'labels': 'labels'}
  out = [f'`{params[0]}`']
  for field in ('key', 'queue', 'labels'):
    if field in accepted:
      out.append(f'`{shapes[field]}`' if field in required
                 else f'*`{shapes[field]}`*')
  return ', '.join(out)


def hyperparameters(name):
  return ', '.join(
      f'{p.name}={p.default!r}'
      for p in inspect.signature(losses.get_loss(name)).parameters.values()
      if p.kind == p.KEYWORD_ONLY and p.name not in ('key', 'queue', 'labels')
      and p.default is not inspect.Parameter.empty)


display(markdown_table(
    ('name', 'what it is', 'inputs', 'hyperparameters (defaults)'),
    [(f'`{name}`', losses.get_loss(name).__doc__.strip().splitlines()[0],
      input_names(name), hyperparameters(name)) for name in losses.names()]))

# %% [markdown]
# ## 3. In your own JAX code
#
# A loss is an ordinary differentiable function, so `jax.grad` and any optax
# optimizer work on it directly. Below, a linear encoder (32 -> 16
# dimensions) learns what an augmentation leaves alone: each input's first 8
# coordinates carry its identity, and the "augmentation" adds strong noise
# to the other 24. NT-Xent rewards embeddings in which two views of one input
# are closer to each other than to any other input's views, so the encoder
# should learn to read the first 8 coordinates and ignore the rest. Replace
# `encode` with your network and `make_views` with your augmentation;
# nothing else changes.

# %%
D_IN, SIGNAL = 32, 8
data = np.random.default_rng(0).normal(size=(512, D_IN)).astype(np.float32)


def encode(params, x):                       # [..., D_IN] -> [..., D]
  return x @ params['w']


def make_views(rng, x, views=2):             # [B, D_IN] -> [B, V, D_IN]
  noise = jnp.where(jnp.arange(D_IN) < SIGNAL, 0.1, 2.0)
  return x[:, None] + noise * jax.random.normal(
      rng, (x.shape[0], views, D_IN))


def loss_fn(params, rng, x):
  return losses.ntxent(encode(params, make_views(rng, x)), temperature=0.2)


optimizer = optax.adam(1e-2)


@jax.jit
def train_step(params, opt_state, rng, x):
  (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, rng, x)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss, metrics


params = {'w': jax.random.normal(jax.random.key(2), (D_IN, D)) / D_IN ** .5}
opt_state = optimizer.init(params)
rng = jax.random.key(3)
own_loop = []
for step in range(201):
  rng, step_rng, batch_rng = jax.random.split(rng, 3)
  batch = data[np.asarray(jax.random.choice(batch_rng, len(data), (64,),
                                            replace=False))]
  params, opt_state, loss, metrics = train_step(params, opt_state, step_rng,
                                                batch)
  if step % 40 == 0:
    own_loop.append((step, float(loss), float(metrics['pos_sim']),
                     float(metrics['acc'])))
display(markdown_table(
    ('step', 'NT-Xent loss', 'cosine between views',
     'views whose nearest candidate is their positive'),
    [(s, f'{l:.3f}', f'{p:.3f}', f'{100 * a:.0f}%') for s, l, p, a in own_loop]))
w = np.asarray(params['w'])
signal_weight, nuisance_weight = (float(np.linalg.norm(w[:SIGNAL])),
                                  float(np.linalg.norm(w[SIGNAL:])))
print(f'norm of the weights reading the identity coordinates: '
      f'{signal_weight:.2f}; the noisy ones: {nuisance_weight:.2f}')

# %% [markdown]
# To select a loss by name, as a config does, put what you have in a
# `losses.LossInputs` and call `losses.apply(name, inputs, **hyperparameters)`:
# it passes each loss the inputs its signature names, and raises if you give
# one an input it does not take (labels to an unsupervised loss, say).

# %% [markdown]
# ## 4. Every loss on the same inputs
#
# N = 32 instances from 4 classes, V = 2 views, D = 16: each view is its
# instance's centre plus Gaussian noise, at three noise levels (the views of
# an instance are poorly, moderately and well aligned). Losses with a key
# encoder get view 0 as the query and view 1 as the key, and a random queue
# of 256 negatives; supervised ones get the class labels.

# %%
N, V, D, Q, CLASSES = 32, 2, 16, 256, 4
rng_np = np.random.default_rng(0)
labels = np.arange(N) % CLASSES
class_means = rng_np.normal(size=(CLASSES, D))
centres = class_means[labels] + 0.5 * rng_np.normal(size=(N, D))
queue = jnp.asarray(rng_np.normal(size=(Q, D)), jnp.float32)


def toy_views(noise, views=V, seed=1):
  r = np.random.default_rng(seed)
  z = centres[:, None] + noise * r.normal(size=(N, views, D))
  return jnp.asarray(z, jnp.float32)


def loss_inputs(name, z, key_views=None):
  """The LossInputs loss `name` takes, built from views z.

  A loss that requires a key (MoCo-style) sees view 0 as the query and the
  other views (or `key_views`) as keys; queues and labels go to the losses
  that take them.
  """
  accepted, required = losses.inputs_of(name)
  keyed = 'key' in required
  key_views = z[:, 1:] if key_views is None else key_views
  return losses.LossInputs(
      z=z[:, :1] if keyed else z, key=key_views if keyed else None,
      queue=queue if 'queue' in required or (keyed and 'queue' in accepted)
      else None,
      labels=jnp.asarray(labels) if 'labels' in accepted else None)


# InsDis needs the dataset size for its NCE normalisation.
EXTRA = {'insdis': {'num_data': N}}


@functools.cache
def jitted(name):
  """losses.apply(name, ...) compiled once per loss."""
  return jax.jit(lambda inputs: losses.apply(name, inputs,
                                             **EXTRA.get(name, {})))


NOISES = (2.0, 1.0, 0.3)
table = {name: [float(jitted(name)(loss_inputs(name, toy_views(s)))[0])
                for s in NOISES]
         for name in losses.names()}
decreasing = {name: bool(np.all(np.diff(vals) < 0))
              for name, vals in table.items()}

# The views' alignment at each noise level: mean cosine of view 0 and 1.
unit_views = lambda z: z / np.linalg.norm(z, axis=-1, keepdims=True)
view_cosine = [float(np.mean(np.sum(np.prod(unit_views(np.asarray(
    toy_views(s))), axis=1), -1))) for s in NOISES]
display(markdown_table(
    ('loss', 'inputs') + tuple(f'noise {s} (cosine {c:.2f})'
                               for s, c in zip(NOISES, view_cosine))
    + ('falls as views align',),
    [(f'`{name}`', input_names(name)) + tuple(f'{v:.3f}' for v in vals)
     + ('yes' if decreasing[name] else '**no**',)
     for name, vals in table.items()]))

# %% [markdown]
# Read the table along a row, not down a column: each loss is in its own
# units, so only the direction and relative size of a change mean
# something. The InfoNCE family (NT-Xent, InfoNCE, CMC, SupCon, ...) is a
# cross-entropy over candidates, near the log of their number for
# uninformative embeddings (NT-Xent here: log 63 = 4.14); InsDis sums NCE
# terms and its proximal term; AU-CL adds alignment to a log-mean Gaussian
# potential, which is negative; CACR's value is an expected distance
# difference, negative too; BYOL's is 2 - 2 cos between prediction and key.
# Every loss falls as the views of an instance align. JCL's bound includes
# the key spread, which shrinks with the noise too.

# %% [markdown]
# ## 5. Gradients against finite differences
#
# For every loss: the derivative of the loss along a random direction u,
# from `jax.grad`, against the central difference
# (L(z + eps u) - L(z - eps u)) / (2 eps). The losses compute in float32, so
# eps = 1e-2 balances the difference's rounding error (~1e-7 L / eps) against
# its truncation error (~eps^2 times L's third derivative). The keys, queue
# and labels are held fixed; z moves.
#
# MACL is the exception, by design: its temperature is a stop-gradient
# function of the batch's alignment (its Eq. 10), and its value is Eq. 14
# while its gradient is DCL's, so its gradient is not the derivative of its
# value.

# %%
def directional_derivatives(name, eps=1e-2):
  z0 = toy_views(1.0)
  u = jnp.asarray(np.random.default_rng(2).normal(size=z0.shape), jnp.float32)

  def value(z):
    inputs = loss_inputs(name, z, key_views=z0[:, 1:])
    return losses.apply(name, inputs, **EXTRA.get(name, {}))[0]

  autodiff = float(jnp.vdot(jax.grad(value)(z0), u))
  numeric = float((value(z0 + eps * u) - value(z0 - eps * u)) / (2 * eps))
  return autodiff, numeric


gradient_check = {name: directional_derivatives(name) for name in table}
display(markdown_table(
    ('loss', 'autodiff', 'finite difference', 'relative error'),
    [(f'`{name}`', f'{a:.6f}', f'{f:.6f}',
      f'{abs(a - f) / max(abs(f), 1e-12):.1e}'
      + (' (stop-gradient by design)' if name == 'macl' else ''))
     for name, (a, f) in gradient_check.items()]))

# %% [markdown]
# ## 6. Inside NT-Xent: the similarity matrix and the temperature
#
# NT-Xent (SimCLR) scores each of the 2N views against the other 2N - 1 with
# cosine similarity / tau; the positive of view i is the other view of the
# same instance (the off-diagonal stripes below). The softmax over a row is
# the probability the loss assigns to each candidate being the positive: a
# small tau makes it peaked on the hardest candidates, a large tau spreads it
# (Wang & Liu 2021's uniformity-tolerance trade-off).

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
display(markdown_table(
    ('tau', 'mean p(positive)', 'NT-Xent loss'),
    [(tau, f'{positive_probability[tau]:.3f}',
      f'{float(losses.ntxent(z_sim, temperature=tau)[0]):.4f}')
     for tau in TAUS]))

# %% [markdown]
# ## 7. Inside CACR: weights against distance
#
# CACR's repulsion weights are pi-_j = softmax_j(-t_neg ||q - n_j||^2) (hard
# negatives get more weight), its attraction weights
# pi+_k = softmax_k(+t_pos ||q - p_k||^2) (hard positives get more weight).
# Below, one query at the north pole with negatives and positives spread over
# the circle. Before plotting we check that these are the weights the loss
# really applies: with both weight sets detached (`sg_neg=True`), the
# gradient of `cacr` with respect to the query is the weighted pull minus the
# weighted push, (q - p) - sum_j pi-_j (q - n_j), projected onto the sphere's
# tangent plane at q (the loss normalises q).

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
# ## 8. Inside MACL: adaptive temperature against alignment
#
# MACL sets tau' = tau_0 alpha^m (variant a) or tau_0 (1 + beta m) (variant
# b), with m the batch's mean positive cosine. Better alignment gives a
# larger temperature, i.e. more tolerance to semantically similar negatives.

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
       title='MACL adaptive temperature (tau_0 = 0.1)')
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 9. Inside TCL: gradient magnitudes against k1
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
