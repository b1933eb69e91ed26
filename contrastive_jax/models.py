"""Encoders and projection heads (Flax Linen), selected by name from the config.

`ContrastiveModel` returns both the backbone features `h` (what evaluation
reads: kNN and linear probes run on frozen `h`) and the projection `z` (what the
loss reads), as in SimCLR where the head is discarded after pretraining.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

ModuleDef = Any


class SmallCNN(nn.Module):
  """A CPU-sized CNN: `len(widths)` stages of [3x3 conv, BN, ReLU], 2x2 pool.

  On 28x28 inputs with widths (32, 64, 128, 256) the maps are 28, 14, 7, 3
  pixels; the output is the global average of the last map, [B, widths[-1]].
  """
  widths: Sequence[int] = (32, 64, 128, 256)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, train: bool):
    norm = functools.partial(nn.BatchNorm, use_running_average=not train,
                             momentum=0.9, epsilon=1e-5, dtype=self.dtype)
    x = x.astype(self.dtype)
    for i, width in enumerate(self.widths):
      x = nn.Conv(width, (3, 3), use_bias=False, dtype=self.dtype,
                  name=f'conv{i}')(x)
      x = nn.relu(norm(name=f'bn{i}')(x))
      if i < len(self.widths) - 1:
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
    return jnp.mean(x, axis=(1, 2))


class ProjectionHead(nn.Module):
  """SimCLR's MLP head: (num_layers - 1) x [Dense, BN, ReLU], then Dense."""
  hidden_dim: int = 512
  out_dim: int = 128
  num_layers: int = 2
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, h, *, train: bool):
    x = h
    for i in range(self.num_layers - 1):
      x = nn.Dense(self.hidden_dim, use_bias=False, dtype=self.dtype,
                   name=f'dense{i}')(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.9,
                       dtype=self.dtype, name=f'bn{i}')(x)
      x = nn.relu(x)
    return nn.Dense(self.out_dim, dtype=self.dtype,
                    name=f'dense{self.num_layers - 1}')(x)


ENCODERS: dict[str, Callable[..., nn.Module]] = {
    'small_cnn': SmallCNN,
}


class ContrastiveModel(nn.Module):
  """Encoder + projection head.

  Returns a dict with `features` [B, F] (backbone output) and `projection`
  [B, out_dim] (head output, the input of the loss).
  """
  encoder: nn.Module
  head: nn.Module

  def __call__(self, x, *, train: bool):
    h = self.encoder(x, train=train)
    return {'features': h, 'projection': self.head(h, train=train)}


def create_model(config) -> ContrastiveModel:
  """Builds the model named by `config.model` (a ConfigDict)."""
  name = config.model.encoder
  if name not in ENCODERS:
    raise ValueError(f'unknown encoder {name!r} (config.model.encoder); known: '
                     f'{", ".join(sorted(ENCODERS))}.')
  encoder = ENCODERS[name](**config.model.encoder_kwargs)
  head = ProjectionHead(hidden_dim=config.model.head_hidden_dim,
                        out_dim=config.model.head_out_dim,
                        num_layers=config.model.head_layers)
  return ContrastiveModel(encoder=encoder, head=head)
