"""Float64 numpy references for the loss tests, written from the papers.

Deliberately naive: explicit Python loops over anchors, positives and
negatives, plain exp/log sums (no logsumexp tricks, no masks), so that they
share no structure with the vectorised JAX code. Inputs are small (N <= 8).
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def unit(x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _flat(z):
  """[N, V, D] -> list of (instance, view, unit vector), instance-major."""
  z = unit(z)
  n, v, _ = z.shape
  return [(i, a, z[i, a]) for i in range(n) for a in range(v)]


def supcon(z, labels, tau, variant='out'):
  """Khosla et al. eqs. 2/3, mean over anchors with >= 1 positive."""
  rows = _flat(z)
  total, count = 0., 0
  for i, (ii, _, zi) in enumerate(rows):
    denom = sum(math.exp(zi @ za / tau)
                for a, (_, _, za) in enumerate(rows) if a != i)
    positives = [zp for p, (ip, _, zp) in enumerate(rows)
                 if p != i and labels[ip] == labels[ii]]
    if not positives:
      continue
    if variant == 'out':
      li = -sum(math.log(math.exp(zi @ zp / tau) / denom)
                for zp in positives) / len(positives)
    else:
      li = -math.log(sum(math.exp(zi @ zp / tau) / denom
                         for zp in positives) / len(positives))
    total += li
    count += 1
  return total / count


def ntxent(z, tau):
  """SimCLR NT-Xent: each other view of the instance is a positive."""
  n = np.shape(z)[0]
  return supcon(z, list(range(n)), tau, 'out')


def ntxent_v2_crossentropy(z, tau):
  """SimCLR's two-view form: CE over the 2N - 1 non-self logits (V = 2)."""
  z = unit(z)
  n = z.shape[0]
  stacked = np.concatenate([z[:, 0], z[:, 1]])              # view-major
  total = 0.
  for i in range(2 * n):
    partner = (i + n) % (2 * n)
    logits = [stacked[i] @ stacked[j] / tau for j in range(2 * n) if j != i]
    num = math.exp(stacked[i] @ stacked[partner] / tau)
    total += -math.log(num / sum(math.exp(l) for l in logits))
  return total / (2 * n)


def tcl(z, labels, tau, k1, k2):
  """Animesh 2023 eqs. 4.1-4.3, naive official-code formula, mean."""
  rows = _flat(z)
  total, count = 0., 0
  for i, (ii, _, zi) in enumerate(rows):
    pos = [zp for p, (ip, _, zp) in enumerate(rows)
           if p != i and labels[ip] == labels[ii]]
    negs = [zn for (ik, _, zn) in rows if labels[ik] != labels[ii]]
    if not pos:
      continue
    d = (sum(math.exp(zi @ zp / tau) for zp in pos)
         + k1 * sum(math.exp(-(zi @ zp)) for zp in pos)
         + k2 * sum(math.exp(zi @ zn / tau) for zn in negs))
    total += -sum(math.log(math.exp(zi @ zp / tau) / d) for zp in pos) / len(
        pos)
    count += 1
  return total / count


def tcl_grad_coefs(z, labels, tau, k1, k2):
  """Animesh 2023 Lemma 2 (eqs. 4.6-4.9) as the loss's metrics define them:
  per anchor i with D_i as in `tcl`, X = 1/|P(i)|, P_ij = e^{s_ij/tau} / D_i,
  Y_ij = tau k1 e^{-s_ij} / D_i; returns (mean over anchors with positives of
  mean_p |X - P_ip + Y_ip|, mean over anchors with negatives of
  mean_n k2 P_in)."""
  rows = _flat(z)
  pos_coefs, neg_coefs = [], []
  for i, (ii, _, zi) in enumerate(rows):
    pos = [zp for p, (ip, _, zp) in enumerate(rows)
           if p != i and labels[ip] == labels[ii]]
    negs = [zn for (ik, _, zn) in rows if labels[ik] != labels[ii]]
    d = (sum(math.exp(zi @ zp / tau) for zp in pos)
         + k1 * sum(math.exp(-(zi @ zp)) for zp in pos)
         + k2 * sum(math.exp(zi @ zn / tau) for zn in negs))
    if pos:
      x = 1. / len(pos)
      pos_coefs.append(sum(abs(x - math.exp(zi @ zp / tau) / d
                               + tau * k1 * math.exp(-(zi @ zp)) / d)
                           for zp in pos) / len(pos))
    if negs:
      neg_coefs.append(sum(k2 * math.exp(zi @ zn / tau) / d for zn in negs)
                       / len(negs))
  return sum(pos_coefs) / len(pos_coefs), sum(neg_coefs) / len(neg_coefs)


def label_batch_metrics(z, labels):
  """The supervised losses' batch metrics, pair by pair: mean cosine over all
  (anchor, positive) and over all (anchor, negative) pairs, the fraction of
  anchors with a positive whose nearest other embedding is a positive, and
  the mean number of positives per anchor. labels=None: instance labels."""
  rows = _flat(z)
  if labels is None:
    labels = list(range(len(z)))
  pos_sims, neg_sims, hits, n_pos = [], [], [], []
  for i, (ii, _, zi) in enumerate(rows):
    others = [(labels[ij] == labels[ii], zi @ zj)
              for j, (ij, _, zj) in enumerate(rows) if j != i]
    pos_sims += [s for same, s in others if same]
    neg_sims += [s for same, s in others if not same]
    n_pos.append(sum(same for same, _ in others))
    if n_pos[-1]:
      hits.append(max(others, key=lambda o: o[1])[0])
  return {'pos_sim': np.mean(pos_sims), 'neg_sim': np.mean(neg_sims),
          'acc': np.mean(hits), 'num_pos': np.mean(n_pos)}


def infonce(query, key, queue, tau, in_batch=True):
  """MoCo eq. 1 per (query view a, key view b) pair, mean over anchors."""
  q, k = unit(query), unit(key)
  qu = [] if queue is None else list(unit(queue))
  n, vq, _ = q.shape
  vk = k.shape[1]
  pairs = [(a, b) for a in range(vq) for b in range(vk) if vk == 1 or a != b]
  total, count = 0., 0
  for a, b in pairs:
    for i in range(n):
      pos = math.exp(q[i, a] @ k[i, b] / tau)
      negs = [math.exp(q[i, a] @ r / tau) for r in qu]
      if in_batch:
        negs += [math.exp(q[i, a] @ k[j, b] / tau) for j in range(n) if j != i]
      total += -math.log(pos / (pos + sum(negs)))
      count += 1
  return total / count


def insdis(query, key, queue, tau, num_data, lam, nce_z=None):
  """Wu et al. 2018: NCE with uniform noise, MC estimate of Z, proximal term.

  `queue` is [m, D] (noise shared by the batch) or [N, m, D] (instance i's
  own noise rows queue[i], as lemniscate's NCEAverage draws them).
  """
  f, v = unit(query)[:, 0], unit(key)[:, 0]
  n = f.shape[0]
  queue = np.asarray(queue, np.float64)
  noise = [unit(queue[i] if queue.ndim == 3 else queue) for i in range(n)]
  m = noise[0].shape[0]
  if nce_z is None:
    # Z ~ num_data * E_j exp(v_j . f / tau), averaged over the whole batch.
    nce_z = num_data * np.mean([math.exp(f[i] @ noise[i][k] / tau)
                                for i in range(n) for k in range(m)])
  pn = 1. / num_data
  total = 0.
  for i in range(n):
    p = math.exp(f[i] @ v[i] / tau) / nce_z
    h = p / (p + m * pn)
    term = -math.log(h)
    for k in range(m):
      pk = math.exp(f[i] @ noise[i][k] / tau) / nce_z
      term -= math.log(1. - pk / (pk + m * pn))
    term += lam * float(np.sum((f[i] - v[i]) ** 2))
    total += term
  return total / n, nce_z


def cmc(z, tau, graph, queue=None):
  """Tian et al.: sum over graph pairs of L^{a,b} + L^{b,a}."""
  z = unit(z)
  qu = [] if queue is None else list(unit(queue))
  n, v, _ = z.shape
  if graph == 'core':
    pairs = [(0, j) for j in range(1, v)]
  else:
    pairs = list(itertools.combinations(range(v), 2))
  total = 0.
  for a, b in pairs:
    for x, y in ((a, b), (b, a)):
      direction = 0.
      for i in range(n):
        cands = [math.exp(z[i, x] @ z[j, y] / tau) for j in range(n)]
        cands += [math.exp(z[i, x] @ r / tau) for r in qu]
        direction += -math.log(cands[i] / sum(cands))
      total += direction / n
  return total


def align_uniform(z, alpha, t, weight):
  """Wang & Isola reference code, views averaged."""
  z = unit(z)
  n, v, _ = z.shape
  aligns = [np.linalg.norm(z[i, a] - z[i, b]) ** alpha
            for a, b in itertools.combinations(range(v), 2) for i in range(n)]
  uniforms = []
  for a in range(v):
    vals = [math.exp(-t * np.linalg.norm(z[i, a] - z[j, a]) ** 2)
            for i, j in itertools.combinations(range(n), 2)]
    uniforms.append(math.log(np.mean(vals)))
  align, uniform = float(np.mean(aligns)), float(np.mean(uniforms))
  return align + weight * uniform, align, uniform


def hard_negative(z, tau, beta, tau_plus):
  """joshr17/HCL loss, generalised to V views (per anchor/positive pair)."""
  rows = _flat(z)
  total = 0.
  for i, (ii, _, zi) in enumerate(rows):
    negs = [math.exp(zi @ zn / tau) for (ik, _, zn) in rows if ik != ii]
    k = len(negs)
    imp = [x ** beta for x in negs]
    reweight = sum(w * x for w, x in zip(imp, negs)) / (sum(imp) / k)
    pos_list = [zp for p, (ip, _, zp) in enumerate(rows)
                if p != i and ip == ii]
    li = 0.
    for zp in pos_list:
      pos = math.exp(zi @ zp / tau)
      ng = (-tau_plus * k * pos + reweight) / (1. - tau_plus)
      ng = max(ng, k * math.exp(-1. / tau))
      li += -math.log(pos / (pos + ng))
    total += li / len(pos_list)
  return total / len(rows)


def dcl(z, tau, layout='cross_view'):
  """Yeh et al.: -s_pos / tau + log sum_neg exp(s / tau)."""
  if layout == 'simclr':
    rows = _flat(z)
    total = 0.
    for i, (ii, _, zi) in enumerate(rows):
      lneg = math.log(sum(math.exp(zi @ zn / tau)
                          for (ik, _, zn) in rows if ik != ii))
      pos_list = [zp for p, (ip, _, zp) in enumerate(rows)
                  if p != i and ip == ii]
      total += sum(-(zi @ zp) / tau + lneg for zp in pos_list) / len(pos_list)
    return total / len(rows)
  z = unit(z)
  n, v, _ = z.shape
  total, count = 0., 0
  for a in range(v):
    for b in range(v):
      if a == b:
        continue
      for i in range(n):
        lneg = math.log(sum(math.exp(z[i, a] @ z[j, b] / tau)
                            for j in range(n) if j != i))
        total += -(z[i, a] @ z[i, b]) / tau + lneg
        count += 1
  return total / count


# --------------------------------------------------------------------------
# Test-support helper (not a reference): cached jit of a loss call.

_JIT_CACHE = {}
_TRACED = ('temperature', 'k1', 'k2', 'beta')
# Test-only XLA option: the CPU backend's LLVM optimisation level 0 compiles
# these small graphs 2-4x faster. HLO-level rewrites still run, and the
# registry tests compile the same losses with default options.
FAST_COMPILE = {'xla_backend_optimization_level': 0}


def jit_call(fn, *args, **kwargs):
  """Calls fn(*args, **kwargs) through a cached jax.jit.

  On this small CPU machine one XLA compile per (loss, hyperparameters,
  shapes) is far cheaper than eager dispatch, which compiles every primitive
  for every new shape. Array-valued keyword arguments (e.g. queue) and the
  float hyperparameters in _TRACED are traced, so tests that only vary those
  share one compile (and the losses are exercised with traced
  hyperparameters, as a schedule would pass them); the rest is static.
  """
  import jax  # pylint: disable=g-import-not-at-top
  dynamic = {k: v for k, v in kwargs.items()
             if isinstance(v, (np.ndarray, jax.Array))
             or (k in _TRACED and isinstance(v, float))}
  names = tuple(sorted(dynamic))
  static = tuple(sorted((k, v) for k, v in kwargs.items() if k not in dynamic))
  key = (fn, static, names)
  if key not in _JIT_CACHE:
    def call(args, values):
      return fn(*args, **dict(static), **dict(zip(names, values)))
    _JIT_CACHE[key] = jax.jit(call, compiler_options=FAST_COMPILE)
  values = tuple(np.float32(dynamic[k]) if k in _TRACED else dynamic[k]
                 for k in names)
  return _JIT_CACHE[key](args, values)


def grads_with_fd_check(fn, *args, argnum=0, eps=1e-3, seed=0):
  """Gradients of fn(*args)[0] wrt every arg, from a single jit compile.

  Also checks the reverse-mode gradient wrt args[argnum] against a central
  finite difference along a random direction, the check that
  jax.test_util.check_grads(order=1, modes=['rev']) makes, at the cost of one
  compile instead of several (the tolerances suit float32).
  """
  import jax  # pylint: disable=g-import-not-at-top
  vg = jax.jit(jax.value_and_grad(lambda *a: fn(*a)[0],
                                  argnums=tuple(range(len(args)))),
               compiler_options=FAST_COMPILE)
  _, grads = vg(*args)
  direction = np.random.RandomState(seed).randn(*np.shape(args[argnum]))
  direction = (direction / np.linalg.norm(direction)).astype(np.float32)

  def shifted(sign):
    moved = list(args)
    moved[argnum] = np.asarray(args[argnum]) + sign * eps * direction
    return float(vg(*moved)[0])

  plus, minus = shifted(1.), shifted(-1.)
  numeric = (plus - minus) / (2 * eps)
  analytic = float(np.sum(np.asarray(grads[argnum]) * direction))
  # Each float32 loss value carries a rounding error of up to f32_rtol() |L|;
  # the quotient divides the difference of two of them by 2 eps, so atol =
  # f32_rtol() |L| / eps (an InsDis loss of ~120 makes that 3.8e-3). rtol
  # 1e-2 covers the O(eps^2) truncation and the float32 rounding of the step
  # x +- eps d. A wrong sign, a missing term or a factor of 2 in a gradient
  # larger than atol fails.
  np.testing.assert_allclose(
      analytic, numeric, rtol=1e-2,
      atol=f32_rtol() * max(abs(plus), abs(minus)) / eps)
  return grads


def fast_jit(fn):
  """jax.jit with the test-only FAST_COMPILE options."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.jit(fn, compiler_options=FAST_COMPILE)


# --------------------------------------------------------------------------
# Test-support helper (not a reference): float32 tolerances (issue 10).

EPS32 = float(np.finfo(np.float32).eps)     # 2^-23 ~ 1.19e-7, the ulp of 1.0


def f32_rtol(n_terms: int = 1, k: float = 8.) -> float:
  """Relative rounding allowance of a float32 result: k * eps32 * sqrt(n).

  A float32 sum of n terms, in whatever order a CPU's kernels, a device count
  or an XLA fusion choose, is off the exact sum by about sqrt(n) eps32 / 2
  times sum |terms| (n roundings of at most eps32 / 2 each, accumulating like
  a random walk: Higham, Accuracy and Stability of Numerical Algorithms, 2nd
  ed., Sec. 4.2), so two float32 evaluations in different orders differ by
  about as much. k = 8 covers the few roundings of each term before the sum
  (a product, an exp, a log) with a margin of 2-4. For an atol, multiply by
  the magnitude of the values that are rounded: the largest intermediate,
  not a near-cancelling result (e.g. log(#pairs) for a uniformity that is 0).

  Tolerances built this way are ~1e-6 relative for n = 1 and ~1e-5 for
  n = 100, far below the O(1) relative change of a wrong sign, a missing term
  or a factor of 2, and they do not depend on what one machine produced.
  """
  return k * EPS32 * math.sqrt(n_terms)
