"""Diagnostics of representations: alignment and uniformity (Wang & Isola
2020), CACR's conditional entropy, MACL's semantic sensitivity, plots."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import progress
from contrastive_jax import storage
from contrastive_jax.evaluators import base
from contrastive_jax.losses.baselines import alignment
from contrastive_jax.losses.baselines import uniformity
from contrastive_jax.losses.common import l2_normalize
from input_pipeline import augment
from input_pipeline import pipeline


@jax.jit
def conditional_entropy(z_a: jax.Array, z_b: jax.Array | None = None, *,
                        t_neg: float = 2.) -> jax.Array:
  """CACR's H(X^-|X) (eq. 8) in nats, in [0, log(M - 1)]: the mean over i of
  the entropy of pi^-_ij = softmax_{j != i}(-t_neg ||z_a[i] - z_b[j]||^2);
  z_a, z_b [M, D], M >= 2; z_b None: z_a (the paper's in-batch estimator)."""
  z_a = l2_normalize(z_a)
  z_b = z_a if z_b is None else l2_normalize(z_b)
  m = z_a.shape[0]
  # ||a - b||^2 = 2 - 2 a.b on the sphere (no sqrt: finite at distance 0).
  cost = jnp.maximum(2. - 2. * (z_a @ z_b.T), 0.)
  off = ~jnp.eye(m, dtype=bool)
  logw = jax.nn.log_softmax(jnp.where(off, -t_neg * cost, -jnp.inf), axis=1)
  # The diagonal's 0 * -inf would be NaN.
  plogp = jnp.where(off, jnp.exp(logw) * logw, 0.)
  return jnp.mean(-jnp.sum(plogp, axis=1))


@jax.jit
def semantic_sensitivity(f: jax.Array, labels: jax.Array,
                         g: jax.Array | None = None) -> jax.Array:
  """MACL's S = E_{x != y} exp(-(H_xy - f(x).g(y))^2) (eq. 7), in [e^-4, 1]
  (higher is better): H_xy = +1 for a same-class pair, else -1; f, g [M, D]
  normalised here (g None: f), labels [M], M >= 2; in row blocks."""
  f = l2_normalize(f)
  g = f if g is None else l2_normalize(g)
  m = f.shape[0]
  block = min(1024, m)                       # Memory: [block, M] floats.
  pad = -m % block
  rows = jnp.pad(f, ((0, pad), (0, 0))).reshape(-1, block, f.shape[1])
  row_labels = jnp.pad(labels, (0, pad)).reshape(-1, block)
  starts = jnp.arange(rows.shape[0]) * block

  def block_sum(args):
    fb, lb, start = args
    h = jnp.where(lb[:, None] == labels[None, :], 1., -1.)
    e = jnp.exp(-(h - fb @ g.T) ** 2)                          # [block, M]
    i = start + jnp.arange(block)[:, None]
    j = jnp.arange(m)[None, :]
    return jnp.sum(jnp.where((i != j) & (i < m), e, 0.))

  total = jnp.sum(jax.lax.map(block_sum, (rows, row_labels, starts)))
  return total / (m * (m - 1))


def similarity_histograms(z_a, z_b, *, labels=None, bins: int = 50,
                          max_negatives: int = 1_000_000, seed: int = 0,
                          path: str | None = None,
                          title: str | None = None) -> dict[str, np.ndarray]:
  """Cosine similarities of positive pairs (z_a[i], z_b[i]) of [N, D] views
  and negatives (z_a[i], z_b[j]), i != j, of different `labels` if given (a
  uniform sample of `max_negatives` where there are more); `path`: a PNG of
  both histograms. Returns numpy {'positive': [N], 'negative': [M],
  'bin_edges', 'positive_hist', 'negative_hist'} (densities over [-1, 1])."""
  a = np.asarray(l2_normalize(jnp.asarray(z_a)), np.float64)
  b = np.asarray(l2_normalize(jnp.asarray(z_b)), np.float64)
  n = a.shape[0]
  if b.shape != a.shape:
    raise ValueError(f'z_a and z_b must have the same shape; got {a.shape} '
                     f'and {b.shape}.')
  positive = np.einsum('nd,nd->n', a, b)
  if n * (n - 1) <= max_negatives:
    i, j = np.nonzero(~np.eye(n, dtype=bool))
  else:
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, max_negatives)
    j = (i + rng.integers(1, n, max_negatives)) % n    # uniform over j != i
  if labels is not None:
    keep = np.asarray(labels)[i] != np.asarray(labels)[j]
    i, j = i[keep], j[keep]
  # In chunks: all pairs at once would hold 2 x num_pairs x D float64.
  chunk = max(1, (1 << 24) // max(a.shape[1], 1))
  negative = np.concatenate(
      [np.einsum('nd,nd->n', a[i[s:s + chunk]], b[j[s:s + chunk]])
       for s in range(0, len(i), chunk)] or [np.zeros(0)])
  edges = np.linspace(-1., 1., bins + 1)
  pos_hist, _ = np.histogram(np.clip(positive, -1, 1), edges, density=True)
  neg_hist = (np.histogram(np.clip(negative, -1, 1), edges, density=True)[0]
              if negative.size else np.zeros(bins))
  out = {'positive': positive, 'negative': negative, 'bin_edges': edges,
         'positive_hist': pos_hist, 'negative_hist': neg_hist}
  if path is not None:
    fig, ax = _new_figure()
    for name, sims in (('negative', negative), ('positive', positive)):
      ax.hist(np.clip(sims, -1, 1), edges, density=True, alpha=0.6,
              label=f'{name} (n={sims.size})')
    ax.set(xlabel='cosine similarity', ylabel='density', title=title or '')
    ax.legend()
    fig.tight_layout()
    storage.save_figure(fig, path)
  return out


def project_2d(feats, method: str = 'pca', *, seed: int = 0) -> np.ndarray:
  """[N, D] features -> [N, 2] coordinates: 'pca' (SVD of the centred
  features, each axis' largest loading positive) or 'tsne' (scikit-learn's,
  perplexity 30, PCA init, on L2-normalised features, seeded by `seed`)."""
  x = np.asarray(feats, np.float64)
  if method == 'tsne':
    from sklearn.manifold import TSNE  # pylint: disable=g-import-not-at-top
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    perplexity = min(30., (len(x) - 1) / 3.)
    return TSNE(2, perplexity=perplexity, init='pca',
                random_state=seed).fit_transform(x)
  if method != 'pca':
    raise ValueError(f"method must be 'pca' or 'tsne'; got {method!r}.")
  x = x - x.mean(axis=0)
  _, _, vt = np.linalg.svd(x, full_matrices=False)
  axes = vt[:2]
  signs = np.sign(axes[np.arange(len(axes)), np.argmax(np.abs(axes), axis=1)])
  coords = x @ (axes * signs[:, None]).T
  if coords.shape[1] < 2:  # D == 1
    coords = np.pad(coords, ((0, 0), (0, 2 - coords.shape[1])))
  return coords


def scatter_classes(ax, coords, labels, *, max_points: int = 10_000,
                    seed: int = 0, legend: bool = True,
                    names=None) -> None:
  """Draws [N, 2] `coords` on `ax` coloured by `labels` (a uniform sample of
  <= `max_points`, `seed`); the legend names classes `names[label]`."""
  labels = np.asarray(labels)
  shown = np.arange(len(coords))
  if len(coords) > max_points:
    shown = np.sort(np.random.default_rng(seed).choice(
        len(coords), max_points, replace=False))
  sc = ax.scatter(coords[shown, 0], coords[shown, 1], c=labels[shown], s=4,
                  cmap='tab10' if labels.max() < 10 else 'tab20')
  if legend:
    handles, texts = sc.legend_elements(num=None)
    if names is not None:
      ids = np.unique(labels[shown])
      texts = [str(names[i]) if i < len(names) else str(i) for i in ids]
    ax.legend(handles, texts, title='class', fontsize='x-small',
              title_fontsize='x-small', loc='best', markerscale=0.6,
              ncols=2)


def embedding_plot(feats, labels, path: str, method: str = 'pca', *,
                   title: str | None = None) -> np.ndarray:
  """A PNG at `path` of [N, D] `feats` projected by `method` (`project_2d`,
  fitted on all) and scattered by class; returns the [N, 2] coordinates."""
  coords = project_2d(feats, method)
  fig, ax = _new_figure()
  scatter_classes(ax, coords, labels)
  name = {'pca': 'PC', 'tsne': 't-SNE'}[method]
  ax.set(xlabel=f'{name} 1', ylabel=f'{name} 2', title=title or '')
  fig.tight_layout()
  storage.save_figure(fig, path)
  return coords


def _new_figure():
  # Agg without touching the global backend (a notebook user may have another).
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(6, 4.5), dpi=100)
  FigureCanvasAgg(fig)
  return fig, fig.add_subplot()


def _to_host(*arrays, mask) -> list[np.ndarray]:
  """Global arrays -> full host copies of the real rows, on every process
  (`process_allgather`: test-set-sized features only)."""
  mask = np.asarray(multihost_utils.process_allgather(mask, tiled=True))
  return [np.asarray(multihost_utils.process_allgather(a, tiled=True))[mask]
          for a in arrays]


def _embed_views(model, variables, data, mesh, *, batch_size: int, views_cfg,
                 seed: int):
  """{'clean', 'view0', 'view1'} -> (features [M, F], projection [M, D]) of
  the un-augmented images and two augmented views."""
  sharding = NamedSharding(mesh, P('data'))

  @functools.partial(jax.jit, out_shardings=sharding)
  def embed(variables, x):
    out = model.apply(variables, x, train=False)
    return out['features'], out['projection']

  augment_fn = jax.jit(
      lambda rng, images: augment.augment_batch(rng, images, views_cfg),
      out_shardings=sharding)
  rng = jax.random.key(seed)
  parts = {k: [] for k in ('clean', 'view0', 'view1')}
  for i, batch in enumerate(pipeline.eval_batches(
      data, batch_size=batch_size, sharding=sharding)):
    images = batch['image']
    views = augment_fn(jax.random.fold_in(rng, i), images)   # [B, 2, ...]
    inputs = {'clean': images.astype(jnp.float32) / 255.,
              'view0': views[:, 0], 'view1': views[:, 1]}
    for name, x in inputs.items():
      parts[name].append(_to_host(*embed(variables, x), mask=batch['mask']))
  return {k: tuple(np.concatenate(a) for a in zip(*v))
          for k, v in parts.items()}


def batched_entropy(z_a, *, batch_size: int, t_neg: float) -> float:
  """CACR's H(X^-|X) averaged over full mini-batches (paper, Figs. 3-5), or
  of all rows as one batch when they are fewer than `batch_size`."""
  n = len(z_a) // batch_size * batch_size
  return float(np.mean([
      float(conditional_entropy(z_a[s:s + batch_size], t_neg=t_neg))
      for s in range(0, max(n, 1), batch_size)]))


class Diagnostics(base.Evaluator):
  """The papers' diagnostics ('diagnostics/<space>/<name>') on the test
  split's images and two augmented views; CACR's entropy on batches of
  `batch_size` (0: `config.batch_size`); with `env.outdir`, the plots."""
  type = 'diagnostics'
  DEFAULTS = {'t_neg': 2., 'batch_size': 0, 'seed': 0}
  baselines = False

  def __call__(self, rep: base.Representation, *, bar=progress.NO_BAR
               ) -> dict[str, float]:
    env, config = rep.env, rep.env.config
    bar.set_postfix_str('diagnostics')
    views_cfg = augment.build_views(
        config.augment.preset, max(2, config.augment.num_views),
        config.augment.overrides, config.augment.op_order)[:2]
    emb = _embed_views(env.model, rep.variables, env.test, env.mesh,
                       batch_size=config.eval.batch_size, views_cfg=views_cfg,
                       seed=self.cfg.seed)
    test = rep.features('test')
    labels, = _to_host(test.label, mask=test.mask)
    entropy_batch = int(self.cfg.batch_size or config.batch_size)
    out = {}
    for space, idx in (('projection', 1), ('features', 0)):
      z0, z1, clean = emb['view0'][idx], emb['view1'][idx], emb['clean'][idx]
      pre = f'diagnostics/{space}/'
      out[pre + 'alignment'] = float(alignment(z0, z1))
      # Wang & Isola average the uniformity of the two views.
      out[pre + 'uniformity'] = float((uniformity(z0) + uniformity(z1)) / 2)
      out[pre + 'cacr_conditional_entropy'] = batched_entropy(
          z0, batch_size=entropy_batch, t_neg=self.cfg.t_neg)
      out[pre + 'macl_semantic_sensitivity'] = float(
          semantic_sensitivity(clean, labels))
      path = env.outdir and os.path.join(
          env.outdir, f'similarity_histogram_{space}.png')
      hist = similarity_histograms(z0, z1, labels=labels, path=path,
                                   title=f'{space}: {config.loss}')
      out[pre + 'positive_cos_mean'] = float(np.mean(hist['positive']))
      out[pre + 'negative_cos_mean'] = float(np.mean(
          hist['negative'])) if hist['negative'].size else float('nan')
    m = min(entropy_batch, len(labels))
    out['diagnostics/cacr_conditional_entropy_max'] = float(np.log(m - 1))
    out['diagnostics/cacr_t_neg'] = float(self.cfg.t_neg)
    out['diagnostics/cacr_entropy_batch_size'] = m
    if env.outdir:
      embedding_plot(emb['clean'][0], labels,
                     os.path.join(env.outdir, 'embedding_pca.png'),
                     title='PCA of evaluation features')
    bar.update(1)
    return out
