"""Float64 numpy references for CACR, MACL, JCL and the losses they reduce to.

Written from the papers' equations (CACR: Zheng et al. 2021, Sec. 3 and
App. C; MACL: Huang et al. 2022, Eqs. 8-14; JCL: Cai et al. 2020, Eq. 8) and
their released code, with explicit Python loops over anchors, deliberately without sharing code or tricks
with the JAX implementations (explicit differences for distances, 1 - P for W,
an explicit D x D covariance for JCL). Also a central finite-difference
gradient, so stop-gradient semantics can be checked by freezing inputs.
"""

from __future__ import annotations

import numpy as np


def normalize(x):
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - np.max(x))
  return e / np.sum(e)


def entropy(w):
  w = np.asarray(w)
  w = w[w > 0]
  return float(-np.sum(w * np.log(w)))


def sqdist(a, b):
  return float(np.sum((a - b) ** 2))


def num_grad(f, x, eps=1e-6):
  """Central finite differences of scalar f at x (float64)."""
  x = np.asarray(x, np.float64)
  g = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    xp, xm = x.copy(), x.copy()
    xp[idx] += eps
    xm[idx] -= eps
    g[idx] = (f(xp) - f(xm)) / (2 * eps)
  return g


# ----------------------------------------------------------------------- CACR
def cacr_in_batch(z, *, t_pos=1.0, t_neg=2.0, wz_pos=None, wz_neg=None):
  """CACR, in-batch regime (paper Sec. 3.2, released small-scale code); z: [N, V, D].

  wz_pos / wz_neg: embeddings used only inside the pi+ / pi- weights (freeze
  them to emulate stop-gradient); default z.
  """
  u = normalize(z)
  wp = u if wz_pos is None else normalize(wz_pos)
  wn = u if wz_neg is None else normalize(wz_neg)
  n, v, _ = u.shape
  ca, h_pos = 0., 0.
  for i in range(n):
    for a in range(v):
      others = [b for b in range(v) if b != a]
      c = np.array([sqdist(u[i, a], u[i, b]) for b in others])
      cw = np.array([sqdist(wp[i, a], wp[i, b]) for b in others])
      w = softmax(t_pos * cw)
      ca += np.sum(w * c)
      h_pos += entropy(softmax(t_pos * c))
  ca /= n * v
  h_pos /= n * v
  pairs = [(a, b) for a in range(v) for b in range(a + 1, v)]   # cross-view
  cr, h_neg = 0., 0.
  for a, b in pairs:
    acc = 0.
    for i in range(n):
      js = [j for j in range(n) if j != i]
      c = np.array([sqdist(u[i, a], u[j, b]) for j in js])
      cw = np.array([sqdist(wn[i, a], wn[j, b]) for j in js])
      w = softmax(-t_neg * cw)
      h_neg += entropy(softmax(-t_neg * c))
      acc += -np.sum(w * c)
    cr += acc / n
  cr /= len(pairs)
  h_neg /= n * len(pairs)
  return ca + cr, {'ca': ca, 'cr': cr, 'pos_entropy': h_pos,
                   'neg_entropy': h_neg}


def cacr_moco(z, key, queue, *, t_pos=1.0, t_neg=2.0, intra_batch=True,
              wz_pos=None, wz_neg=None):
  """CACR, MoCo-v2 regime (paper App. C.2, Algorithm 3).

  wz_pos: queries used inside pi+; wz_neg: queries used inside pi- (both
  the queue and the in-batch part).
  """
  q = normalize(z)
  k = normalize(key)
  qu = None if queue is None else normalize(queue)
  wp = q if wz_pos is None else normalize(wz_pos)
  wn = q if wz_neg is None else normalize(wz_neg)
  n, v, _ = q.shape
  ca, h_pos, h_neg = 0., 0., 0.
  cr_views = []
  for a in range(v):
    acc = 0.
    for i in range(n):
      others = [b for b in range(v) if b != a]
      c = np.array([sqdist(q[i, a], k[i, b]) for b in others])
      cw = np.array([sqdist(wp[i, a], k[i, b]) for b in others])
      ca += np.sum(softmax(t_pos * cw) * c)
      h_pos += entropy(softmax(t_pos * c))
      costs, wcosts = [], []
      if qu is not None:
        for m in range(len(qu)):
          costs.append(sqdist(q[i, a], qu[m]))
          wcosts.append(sqdist(wn[i, a], qu[m]))
      if intra_batch:
        for j in range(n):
          if j != i:
            costs.append(sqdist(q[i, a], q[j, a]))
            wcosts.append(sqdist(wn[i, a], wn[j, a]))
      costs = np.array(costs)
      w = softmax(-t_neg * np.array(wcosts))
      h_neg += entropy(softmax(-t_neg * costs))
      acc += -np.sum(w * costs)
    cr_views.append(acc / n)
  ca /= n * v
  cr = float(np.mean(cr_views))
  return ca + cr, {'ca': ca, 'cr': cr, 'pos_entropy': h_pos / (n * v),
                   'neg_entropy': h_neg / (n * v)}


def align(z1, z2):
  """Wang & Isola's L_align with alpha = 2: mean ||z1 - z2||^2."""
  u1, u2 = normalize(z1), normalize(z2)
  return float(np.mean([sqdist(a, b) for a, b in zip(u1, u2)]))


# ----------------------------------------------------------------------- MACL
def _macl_rows(u, layout):
  """Yields (i, a, b, positive sim, [negative sims]) for every ordered pair."""
  n, v, _ = u.shape
  for i in range(n):
    for a in range(v):
      for b in range(v):
        if b == a:
          continue
        pos = float(u[i, a] @ u[i, b])
        if layout == 'cross_view':
          negs = [float(u[i, a] @ u[j, b]) for j in range(n) if j != i]
        else:
          negs = [float(u[i, a] @ u[j, w]) for j in range(n) if j != i
                  for w in range(v)]
        yield i, a, b, pos, np.array(negs)


def macl_tau(z, *, temperature=0.1, variant='a', alpha=2.0, beta=0.5):
  u = normalize(z)
  n, v, _ = u.shape
  m = np.mean([u[i, a] @ u[i, b] for i in range(n) for a in range(v)
               for b in range(v) if a != b])
  if variant == 'a':
    return temperature * alpha ** m, m
  return temperature * (1 + beta * m), m


def macl(z, *, temperature=0.1, variant='a', alpha=2.0, beta=0.5,
         layout='cross_view', freeze=None):
  """MACL Eq. 14 with the Eq. 8/9 temperature.

  freeze: embeddings at which tau' and W are evaluated (emulates their
  stop-gradients); default z (no freezing).
  """
  tau, _ = macl_tau(z if freeze is None else freeze, temperature=temperature,
                    variant=variant, alpha=alpha, beta=beta)
  u = normalize(z)
  uf = u if freeze is None else normalize(freeze)
  rows_f = list(_macl_rows(uf, layout))
  total, count = 0., 0
  for (_, _, _, pos, negs), (_, _, _, pos_f, negs_f) in zip(
      _macl_rows(u, layout), rows_f):
    p_pos = np.exp(pos / tau) / (np.exp(pos / tau) + np.sum(np.exp(negs / tau)))
    pf = np.exp(pos_f / tau) / (np.exp(pos_f / tau)
                                + np.sum(np.exp(negs_f / tau)))
    w_i = 1. - pf
    total += -np.log(p_pos) / w_i
    count += 1
  return total / count


def dcl(z, *, temperature=0.1, layout='cross_view'):
  """Decoupled CL (Yeh et al.): -s_pos/tau + log sum_neg exp(s/tau)."""
  u = normalize(z)
  vals = [-pos / temperature + np.log(np.sum(np.exp(negs / temperature)))
          for _, _, _, pos, negs in _macl_rows(u, layout)]
  return float(np.mean(vals))


# ------------------------------------------------------------------------ JCL
def jcl(query, key, queue, *, lam=4.0, temperature=0.2,
        in_batch_negatives=False):
  """JCL Eq. 8/9 with an explicit biased covariance matrix."""
  q = normalize(query)
  k = normalize(key)
  n, vq, d = q.shape
  mus = k.mean(axis=1)
  total, var_terms = 0., []
  for i in range(n):
    ks = k[i]
    mu = ks.mean(axis=0)
    sigma = np.zeros((d, d))
    for m in range(len(ks)):
      sigma += np.outer(ks[m] - mu, ks[m] - mu)
    sigma /= len(ks)
    for a in range(vq):
      qa = q[i, a]
      pos = qa @ mu / temperature
      c = lam / (2 * temperature ** 2) * (qa @ sigma @ qa)
      var_terms.append(c)
      negs = []
      if queue is not None:
        negs += [qa @ nj / temperature for nj in np.asarray(queue, np.float64)]
      if in_batch_negatives:
        negs += [qa @ mus[j] / temperature for j in range(n) if j != i]
      denom = np.exp(pos + c) + np.sum(np.exp(np.array(negs)))
      total += -np.log(np.exp(pos) / denom)
  return total / (n * vq), {'var_term': float(np.mean(var_terms))}


def infonce(query, positive, negatives, *, temperature):
  """-log e^{q.k+/t} / (e^{q.k+/t} + sum_j e^{q.n_j/t}); q, k+: [N, D].

  The positive is used as given (not re-normalised); the query is normalised.
  """
  q = normalize(query)
  vals = []
  for i in range(len(q)):
    pos = np.exp(q[i] @ positive[i] / temperature)
    neg = np.sum(np.exp(np.asarray(negatives, np.float64) @ q[i]
                        / temperature))
    vals.append(-np.log(pos / (pos + neg)))
  return float(np.mean(vals))
