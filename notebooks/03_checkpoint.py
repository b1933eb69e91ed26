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
# # Load a checkpoint, embed images, find their neighbours
#
# Any run's `--workdir` holds its config (`config.json`) and checkpoints.
# From them: rebuild the model, restore the newest checkpoint, embed the
# training and test images with the frozen encoder, score a weighted kNN
# classifier, and look at which training images a test image's features are
# closest to. `WORKDIR` defaults to the run of `02_train.ipynb`; point it at
# any other (e.g. `../workdir/default` after `bash scripts/run_default.sh`).

# %%
import os
import sys

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, os.path.abspath('..'))   # The repository root.
from contrastive_jax import step as step_lib
from contrastive_jax.evaluators import features
from contrastive_jax import data as data_lib
from contrastive_jax import config_lib
from contrastive_jax import checkpointing
from contrastive_jax import eval_checkpoint  # noqa: E402
from contrastive_jax import evaluate  # noqa: E402
from contrastive_jax import runtime  # noqa: E402
from contrastive_jax import train  # noqa: E402
from contrastive_jax.evaluators import knn  # noqa: E402

runtime.notebook_logging()
WORKDIR = os.environ.get('NOTEBOOK_WORKDIR', '../workdir/notebook')

# %% [markdown]
# ## The run's model and its newest checkpoint
#
# `step_lib.create_model` builds the model the config trained (with whatever the
# method adds, e.g. BYOL's predictor), so the checkpoint's parameter tree
# fits it; only `params` and `batch_stats` are read from the checkpoint
# (not the optimizer state, queue or memory bank).

# %%
config = config_lib.load(WORKDIR)
train_data, test_data = data_lib.load(config)
mesh = runtime.create_mesh()
model = step_lib.create_model(config)
variables, step = checkpointing.restore_variables(
    WORKDIR, model, train_data.image_shape, mesh)
n_params = sum(x.size for x in jax.tree.leaves(variables['params']))
print(f'{config.method} / {config.loss}: step {step}, {n_params:,} parameters;'
      f' {len(train_data)} training and {len(test_data)} test images')

# %% [markdown]
# ## Features
#
# The backbone's features (the representation the papers evaluate, before
# the projection head) of every image, un-augmented, extracted batch by
# batch on every device; `first_rows` brings them to the host as numpy.

# %%
feature_fn = features.make_feature_fn(model, mesh)
bank = features.extract_features(feature_fn, variables, train_data, mesh,
                                 config.eval.batch_size)
queries = features.extract_features(feature_fn, variables, test_data, mesh,
                                    config.eval.batch_size)
print('bank', bank.x.shape, 'queries', queries.x.shape)

# %% [markdown]
# ## Weighted kNN
#
# The InstDisc/MoCo protocol: cosine similarity to every training image, the
# k nearest vote with weights exp(s / T).

# %%
scores = knn.knn_evaluate(bank.x, bank.label, queries.x, queries.label,
                          num_classes=train_data.num_classes, ks=(1, 5, 20),
                          temperature=config.eval.knn_temperature, mesh=mesh,
                          bank_mask=bank.mask, query_mask=queries.mask)
for name, value in sorted(scores.items()):
  print(f'{name:<24}{100 * float(value):6.2f}%')

# %% [markdown]
# ## Nearest neighbours
#
# For eight test images, the eight training images with the most similar
# features (cosine), with their similarity; a border in green when the
# neighbour's class is the query's.

# %%
bank_x, bank_y = features.first_rows(bank, len(train_data))
query_x, query_y = features.first_rows(queries, 8)
unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
similarity = unit(query_x) @ unit(bank_x).T                # [8, N_train]
neighbours = np.argsort(-similarity, axis=1)[:, :8]
neighbour_agreement = float(np.mean(bank_y[neighbours] == query_y[:, None]))

query_images = test_data.read(np.arange(8))['image']
fig, axes = plt.subplots(8, 9, figsize=(9, 8.4))
for i in range(8):
  axes[i, 0].imshow(query_images[i].squeeze(), cmap='gray')
  axes[i, 0].set_title(f'query {query_y[i]}', fontsize=8)
  images = train_data.read(neighbours[i])['image']
  for j in range(8):
    ax = axes[i, j + 1]
    ax.imshow(images[j].squeeze(), cmap='gray')
    same = bank_y[neighbours[i, j]] == query_y[i]
    ax.set_title(f'{similarity[i, neighbours[i, j]]:.2f}', fontsize=7)
    for side in ax.spines.values():
      side.set(color='tab:green' if same else 'tab:red', linewidth=2)
for ax in axes.flat:
  ax.set(xticks=[], yticks=[])
fig.suptitle(f'Nearest training images by feature similarity (step {step}); '
             f'{100 * neighbour_agreement:.0f}% share the query\'s class')
fig.tight_layout()
plt.show()
