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
# # Use a trained encoder: embed images, classify by neighbours
#
# Every training run's `--workdir` holds its config (`config.json`) and its
# checkpoints. `contrastive_jax.load_encoder(workdir)` turns them into a
# function from images to features; this notebook embeds the run's training
# and test images with it, scores a weighted kNN classifier written in a few
# lines of numpy, looks at which training images a test image is closest
# to, and evaluates the checkpoint the way the run did.
#
# `WORKDIR` defaults to the run of `02_train.ipynb`; point it at any other
# run (e.g. `../workdir/default` after `bash scripts/run_default.sh`).

# %%
import os
import sys

sys.path.insert(0, os.path.abspath('..'))   # The repository root.
from contrastive_jax import runtime  # noqa: E402

# With 8 virtual CPU devices (notebooks/execute.py sets them), XLA's thread
# pools must be sized before jax starts; a no-op on one device or a GPU.
runtime.size_cpu_thread_pools()

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import contrastive_jax  # noqa: E402
from contrastive_jax import data  # noqa: E402
from contrastive_jax import eval_checkpoint  # noqa: E402

runtime.notebook_logging()
WORKDIR = os.environ.get('NOTEBOOK_WORKDIR', '../workdir/notebook')

# %% [markdown]
# ## Load the encoder
#
# `load_encoder` rebuilds the model the run's config describes and restores
# the newest checkpoint's parameters and BatchNorm statistics (nothing
# else: not the optimizer state, queue or memory bank). `encoder(images)`
# takes a batch of images, uint8 [B, H, W, C] as the dataset stores them,
# and returns the backbone's features [B, F], the representation the run
# evaluates; `encoder.project(images)` gives the projection head's output,
# the space the loss saw.

# %%
encoder = contrastive_jax.load_encoder(WORKDIR)
config, step = encoder.config, encoder.step
print(f'{config.method} / {config.loss} at step {step}')

# The run's own images: its training and evaluation splits.
train_data, test_data = data.load(config)
images = test_data.read(np.arange(4))['image']
print('images', images.shape, images.dtype, '-> features',
      encoder(images).shape, ', projections', encoder.project(images).shape)

# %% [markdown]
# ## Embed every image
#
# Batch by batch, un-augmented, as evaluation does.

# %%
def embed(source, batch_size=512):
  """Features and labels of every example of a data source."""
  feats, labels = [], []
  for start in range(0, len(source), batch_size):
    batch = source.read(np.arange(start, min(start + batch_size,
                                             len(source))))
    feats.append(encoder(batch['image']))
    labels.append(batch['label'])
  return np.concatenate(feats), np.concatenate(labels)


bank_x, bank_y = embed(train_data)
query_x, query_y = embed(test_data)
print('bank', bank_x.shape, 'queries', query_x.shape)

# %% [markdown]
# ## Weighted kNN
#
# The InstDisc/MoCo protocol: cosine similarity of each test image's
# features to every training image's; the k most similar vote for their
# class, each with weight exp(similarity / T). k and T are the run's.

# %%
knn = config.evals.knn
K, T = max(knn.ks), knn.temperature
unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
similarity = unit(query_x) @ unit(bank_x).T              # [queries, bank]
nearest = np.argsort(-similarity, axis=1, kind='stable')[:, :K]
votes = np.zeros((len(query_x), train_data.num_classes))
np.add.at(votes, (np.arange(len(query_x))[:, None], bank_y[nearest]),
          np.exp(np.take_along_axis(similarity, nearest, axis=1) / T))
knn_accuracy = float(np.mean(votes.argmax(axis=1) == query_y))
print(f'weighted kNN (k={K}, T={T}): {100 * knn_accuracy:.2f}% of '
      f'{len(query_y)} test images')

# %% [markdown]
# ## Nearest neighbours
#
# For eight test images, the eight training images with the most similar
# features, with their cosine similarity; a green border when the
# neighbour's class is the query's, red otherwise.

# %%
names = train_data.classes or [str(c) for c in range(train_data.num_classes)]
neighbour_agreement = float(np.mean(bank_y[nearest[:8, :8]] ==
                                    query_y[:8, None]))
fig, axes = plt.subplots(8, 9, figsize=(9, 9))
for i in range(8):
  axes[i, 0].imshow(test_data.read([i])['image'][0].squeeze(), cmap='gray')
  axes[i, 0].set_title(names[query_y[i]], fontsize=8, fontweight='bold')
  neighbours = train_data.read(nearest[i, :8])['image']
  for j in range(8):
    ax = axes[i, j + 1]
    ax.imshow(neighbours[j].squeeze(), cmap='gray')
    same = bank_y[nearest[i, j]] == query_y[i]
    ax.set_title(f'{similarity[i, nearest[i, j]]:.2f}', fontsize=7)
    for side in ax.spines.values():
      side.set(color='tab:green' if same else 'tab:red', linewidth=2)
for ax in axes.flat:
  ax.set(xticks=[], yticks=[])
fig.suptitle(f'Test images (left) and their nearest training images by '
             f'feature similarity;\n{100 * neighbour_agreement:.0f}% share '
             f'the query\'s class (step {step})')
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The run's own evaluation of the checkpoint
#
# `eval_checkpoint.evaluate_checkpoint` (the `contrastive-jax-eval`
# command) runs the run's final evaluators on the checkpoint, here the kNN
# above (over the devices) and the linear probe, and writes
# `<workdir>/eval/results.json`. Its kNN is the one computed above.

# %%
evaluation = eval_checkpoint.evaluate_checkpoint(
    WORKDIR, knn_ks=(), diagnostics=False)
for key in (f'trained/knn_weighted_top1@{K}', 'trained/linear_top1'):
  print(f'{key:<32}{100 * evaluation[key]:6.2f}%')
