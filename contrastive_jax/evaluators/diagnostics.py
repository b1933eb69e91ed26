"""Representation diagnostics: alignment, uniformity, similarity histograms,
2-D embedding plots.

Alignment and uniformity follow Wang & Isola (2020), on L2-normalised
embeddings:

    alignment(alpha) = E_{(x, y) positive} ||f(x) - f(y)||_2^alpha
    uniformity(t)    = log E_{x, y i.i.d.} exp(-t ||f(x) - f(y)||_2^2)

with the expectation in `uniformity` taken over distinct pairs i < j, as in
their reference code (`torch.pdist(x).pow(2).mul(-t).exp().mean().log()`).
Lower is better for both. Both are the AU-CL loss's own terms
(`losses.baselines`), so the monitor and the loss cannot drift apart.

Plots use matplotlib's Agg backend (no display needed) and write PNG files.

CACR's conditional entropy of the negative weights (Zheng et al. 2023, eq. 8)
and MACL's semantic sensitivity (eq. 7) are below (docs/evaluation.md writes
out both).

`Diagnostics` is the evaluator (`config.evals.<name>.type = 'diagnostics'`)
that runs all of them on a trained encoder, in the projection space (the
loss's) and the backbone's feature space.
"""

from __future__ import annotations


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

# Rows of a pairwise block in `semantic_sensitivity`: bounds memory to
# [block, M].
_PAIR_BLOCK = 1024

@jax.jit
def conditional_entropy(z_a: jax.Array, z_b: jax.Array | None = None, *,
                        t_neg: float = 2.) -> jax.Array:
  """CACR's H(X^-|X): mean entropy of the negative weights pi^- (eq. 8).

  For query i the negatives are z_b[j], j != i, weighted by

      pi^-_ij = softmax_{j != i}(-t_neg ||z_a[i] - z_b[j]||^2),

  and H = mean_i -sum_{j != i} pi^-_ij log pi^-_ij, in [0, log(M - 1)]: the
  maximum (the paper's "unif" line) when the weights are uniform, 0 when one
  negative takes all the weight. The mutual information of eq. 7 is
  log(M - 1) - H. The paper averages this over validation mini-batches; call
  it once per batch.

  Args:
    z_a: [M, D] query embeddings (normalised here), M >= 2.
    z_b: [M, D] embeddings the negatives come from; None (default) uses z_a,
      the paper's in-batch estimator (sec. 3.2). Passing the other view gives
      the released small-scale code's cross-view negatives.
    t_neg: CACR's t^- (2.0 for K=1 on CIFAR-10); it multiplies the squared
      distance, so it acts as an inverse temperature.

  Returns:
    Scalar float32 entropy in nats.
  """
  z_a = l2_normalize(z_a)
  z_b = z_a if z_b is None else l2_normalize(z_b)
  m = z_a.shape[0]
  # ||a - b||^2 = 2 - 2 a.b on the sphere (no sqrt: finite at distance 0).
  cost = jnp.maximum(2. - 2. * (z_a @ z_b.T), 0.)
  off = ~jnp.eye(m, dtype=bool)
  logw = jax.nn.log_softmax(jnp.where(off, -t_neg * cost, -jnp.inf), axis=1)
  # The diagonal has weight 0; 0 * -inf would be NaN, so select it out.
  plogp = jnp.where(off, jnp.exp(logw) * logw, 0.)
  return jnp.mean(-jnp.sum(plogp, axis=1))


@jax.jit
def semantic_sensitivity(f: jax.Array, labels: jax.Array,
                         g: jax.Array | None = None) -> jax.Array:
  """MACL's S = E_{x != y} exp(-(H_xy - f(x).g(y))^2) (eq. 7), in [e^-4, 1].

  H_xy = +1 for a same-class pair and -1 otherwise, and the dot product is
  the cosine of L2-normalised features, so S = 1 when same-class pairs
  coincide and different classes are antipodal; collapse gives
  p_same + (1 - p_same) e^-4. The mean is over ordered pairs x != y (the
  diagonal would add ~1/M), in row blocks so
  memory is [block, M].

  Args:
    f: [M, D] features (normalised here), M >= 2.
    labels: [M] int class ids.
    g: [M, D] features of the second encoder; None (SimCLR: one encoder)
      uses f.

  Returns:
    Scalar float32 (higher is better).
  """
  f = l2_normalize(f)
  g = f if g is None else l2_normalize(g)
  m = f.shape[0]
  block = min(_PAIR_BLOCK, m)
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
  """Cosine similarities of positive and negative pairs (+ optional PNG).

  Positives are (z_a[i], z_b[i]); negatives are (z_a[i], z_b[j]) with i != j
  and, if `labels` is given, labels[i] != labels[j] (so same-class pairs do
  not count as negatives). If there are more than `max_negatives` such pairs,
  a uniform sample of them (fixed `seed`) is returned.

  Args:
    z_a: [N, D] embeddings of one view.
    z_b: [N, D] embeddings of the other view.
    labels: optional [N] int class ids.
    bins: histogram bins over [-1, 1].
    max_negatives: cap on returned negative similarities.
    seed: seed of the negative-pair sample.
    path: if given, a PNG with both (density-normalised) histograms.
    title: optional plot title.

  Returns:
    {'positive': [N], 'negative': [M], 'bin_edges': [bins + 1],
     'positive_hist', 'negative_hist': [bins] densities}, numpy float64.
  """
  a = np.asarray(l2_normalize(jnp.asarray(z_a)), np.float64)
  b = np.asarray(l2_normalize(jnp.asarray(z_b)), np.float64)
  n = a.shape[0]
  if b.shape != a.shape:
    raise ValueError(f'z_a and z_b must have the same shape; got {a.shape} '
                     f'and {b.shape}.')
  positive = np.einsum('nd,nd->n', a, b)
  labels = None if labels is None else np.asarray(labels)
  num_pairs = n * (n - 1)
  if num_pairs <= max_negatives:
    i, j = np.nonzero(~np.eye(n, dtype=bool))
  else:
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, max_negatives)
    j = (i + rng.integers(1, n, max_negatives)) % n    # uniform over j != i
  if labels is not None:
    keep = labels[i] != labels[j]
    i, j = i[keep], j[keep]
  # In chunks: gathering all pairs at once would hold 2 x num_pairs x D
  # float64 values (18 GB for 1M pairs of 2304-d features).
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
    ax.hist(np.clip(negative, -1, 1), edges, density=True, alpha=0.6,
            label=f'negative (n={negative.size})')
    ax.hist(np.clip(positive, -1, 1), edges, density=True, alpha=0.6,
            label=f'positive (n={positive.size})')
    ax.set_xlabel('cosine similarity')
    ax.set_ylabel('density')
    ax.legend()
    if title:
      ax.set_title(title)
    _save(fig, path)
  return out


def project_2d(feats, method: str = 'pca', *, seed: int = 0) -> np.ndarray:
  """[N, D] features -> [N, 2] coordinates for a scatter plot.

  Args:
    feats: [N, D] features.
    method: 'pca' (exact, via SVD of the centred features; the sign of each
      axis fixed so that its largest |loading| is positive, deterministic
      across LAPACKs) or 'tsne' (scikit-learn's Barnes-Hut t-SNE, perplexity
      30, PCA init, on L2-normalised features: the cosine geometry that the
      kNN and the losses see; stochastic, seeded by `seed`; ~6 s for 2k
      points on 2 CPU cores).
    seed: t-SNE's random state.
  """
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
  """Draws [N, 2] `coords` on `ax`, coloured by int `labels` (a sample of at
  most `max_points`, drawn uniformly with `seed`); the legend names each
  class by `names[label]` when given."""
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
                   title: str | None = None,
                   max_points: int = 10_000, seed: int = 0) -> np.ndarray:
  """2-D projection of features, scattered and coloured by class, as a PNG.

  Args:
    feats: [N, D] features.
    labels: [N] int class ids (colours).
    path: output PNG path.
    method: 'pca' or 'tsne' (see `project_2d`).
    title: optional plot title.
    max_points: at most this many points are drawn (uniform sample, `seed`);
      the projection is fitted on all of them.
    seed: seed of that sample and of t-SNE.

  Returns:
    [N, 2] coordinates of every point.
  """
  coords = project_2d(feats, method, seed=seed)
  fig, ax = _new_figure()
  scatter_classes(ax, coords, labels, max_points=max_points, seed=seed)
  name = {'pca': 'PC', 'tsne': 't-SNE'}[method]
  ax.set_xlabel(f'{name} 1')
  ax.set_ylabel(f'{name} 2')
  if title:
    ax.set_title(title)
  _save(fig, path)
  return coords


def _new_figure():
  # Agg without touching the global backend (a notebook user may have another).
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(6, 4.5), dpi=100)
  FigureCanvasAgg(fig)
  return fig, fig.add_subplot()


def _save(fig, path: str) -> None:
  fig.tight_layout()
  storage.save_figure(fig, path)


def _to_host(*arrays, mask) -> list[np.ndarray]:
  """Global arrays (sharded over processes) -> full host copies, real rows.

  Every process gets the whole array (`process_allgather`), so keep this to
  test-set-sized features.
  """
  mask = np.asarray(multihost_utils.process_allgather(mask, tiled=True))
  return [np.asarray(multihost_utils.process_allgather(a, tiled=True))[mask]
          for a in arrays]


def _embed_views(model, variables, data, mesh, *, batch_size: int, views_cfg,
                 seed: int):
  """Embeddings of un-augmented images and of two augmented views.

  Returns:
    {'clean', 'view0', 'view1'} -> (features [M, F], projection [M, D]).
  """
  sharding = NamedSharding(mesh, P('data'))

  @jax.jit
  def embed(variables, x):
    out = model.apply(variables, x, train=False)
    return (jax.lax.with_sharding_constraint(out['features'], sharding),
            jax.lax.with_sharding_constraint(out['projection'], sharding))

  augment_fn = jax.jit(
      lambda rng, images: augment.augment_batch(rng, images, views_cfg),
      out_shardings=sharding)
  rng = jax.random.key(seed)
  parts = {k: ([], []) for k in ('clean', 'view0', 'view1')}
  for i, batch in enumerate(pipeline.eval_batches(
      data, batch_size=batch_size, sharding=sharding)):
    images = batch['image']
    views = augment_fn(jax.random.fold_in(rng, i), images)   # [B, 2, ...]
    inputs = {'clean': images.astype(jnp.float32) / 255.,
              'view0': views[:, 0], 'view1': views[:, 1]}
    for name, x in inputs.items():
      f, z = _to_host(*embed(variables, x), mask=batch['mask'])
      parts[name][0].append(f)
      parts[name][1].append(z)
  return {k: (np.concatenate(f), np.concatenate(z))
          for k, (f, z) in parts.items()}


def batched_entropy(z_a, *, batch_size: int, t_neg: float) -> float:
  """CACR's H(X^-|X) averaged over full mini-batches (paper, Figs. 3-5)."""
  n = (len(z_a) // batch_size) * batch_size
  if n == 0:                  # fewer test images than one batch: one batch
    return float(conditional_entropy(z_a, t_neg=t_neg))
  vals = [float(conditional_entropy(z_a[s:s + batch_size], t_neg=t_neg))
          for s in range(0, n, batch_size)]
  return float(np.mean(vals))


class Diagnostics(base.Evaluator):
  """The papers' diagnostics of a trained encoder, on the evaluation split.

  On two augmented views of every evaluation image (the run's first two
  views, per-view overrides included) and on the un-augmented images, in the
  projection and the feature space: Wang & Isola's alignment and uniformity,
  CACR's conditional entropy of the negative weights (mini-batches of
  `batch_size`, default the run's `config.batch_size`, as the paper averages
  over mini-batches; t^- = `t_neg`), MACL's semantic sensitivity, the mean
  positive and negative cosines; with an output directory, a histogram of
  the cosines per space and a PCA plot of the features (PNG files).
  Metrics: 'diagnostics/<space>/<name>'.
  """
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
