"""Frozen, un-augmented features of a split, sharded by rows over devices."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from contrastive_jax import progress
from input_pipeline import pipeline


class Features(NamedTuple):
  """A split's features, global arrays sharded by rows: rows with `mask`
  False are padding; rows are in the devices' order, `index` the example."""
  x: jax.Array      # [M_pad, F] float32
  label: jax.Array  # [M_pad] int32
  mask: jax.Array   # [M_pad] bool
  index: jax.Array  # [M_pad] int32, the row's position in the split


def variables_of(state):
  """A train state's {'params', 'batch_stats'}, as `model.apply` takes them."""
  return {'params': state.params, 'batch_stats': state.batch_stats}


def make_feature_fn(model, mesh):
  """Jitted (variables, images uint8 [B,H,W,C]) -> features [B, F], built
  once per run; `variables=None`: the raw pixels, flattened, in [0, 1]."""
  rows = NamedSharding(mesh, P('data'))

  @functools.partial(jax.jit, out_shardings=rows)
  def features(variables, images):
    x = images.astype(jnp.float32) / 255.
    if variables is None:
      return x.reshape(x.shape[0], -1)
    return model.apply(variables, x, train=False)['features']

  return features


@functools.partial(jax.jit, static_argnums=(0,))
def _stack_rows(sharding, xs, labels, masks) -> Features:
  """The n batches [B, ...] of a split as one Features, stacked on axis 1
  and merged so that no row leaves its device (concatenating would move most
  of them): row b * n + i holds example i * B + b (`index`)."""
  b, n = xs[0].shape[0], len(xs)
  merge = lambda parts: jax.lax.with_sharding_constraint(
      jnp.stack(parts, axis=1).reshape((b * n,) + parts[0].shape[1:]),
      sharding)
  index = jnp.arange(n)[None, :] * b + jnp.arange(b)[:, None]
  return Features(merge(xs), merge(labels), merge(masks),
                  jax.lax.with_sharding_constraint(
                      index.reshape(-1).astype(jnp.int32), sharding))


def num_batches(source, batch_size: int) -> int:
  return -(-len(source) // batch_size)


def extract_features(feature_fn, variables, source, mesh, batch_size: int,
                     bar=progress.NO_BAR) -> Features:
  """Features of every example of `source`; `bar` advances once a batch."""
  rows = NamedSharding(mesh, P('data'))
  xs, labels, masks = [], [], []
  for batch in pipeline.eval_batches(source, batch_size=batch_size,
                                     sharding=rows):
    xs.append(feature_fn(variables, batch['image']))
    labels.append(batch['label'])
    masks.append(batch['mask'])
    bar.update(1)
  return _stack_rows(rows, tuple(xs), tuple(labels), tuple(masks))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _first_rows(features: Features, n: int, replicated):
  """(x, label, mask) of the rows of index < n, in index order, replicated."""
  take = jnp.argsort(features.index)[:n]
  return jax.lax.with_sharding_constraint(
      (features.x[take], features.label[take], features.mask[take]),
      replicated)


def first_rows(features: Features, n: int) -> tuple[np.ndarray, np.ndarray]:
  """The split's first `n` real examples (x [n, F], labels [n]) in its own
  order as numpy on every host (a jitted gather replicates them first)."""
  n = min(n, features.x.shape[0])
  replicated = NamedSharding(features.x.sharding.mesh, P())
  x, label, mask = jax.device_get(_first_rows(features, n, replicated))
  return x[mask], label[mask]
