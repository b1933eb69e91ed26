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
# # Train a small model and watch it learn
#
# The same job as `python main.py --config=configs/test.py`, from a notebook:
# a config from `configs/`, overridden like `--config.xxx` flags,
# `train.train_and_evaluate`, then the run's curves. About a minute on a
# 2-core CPU (SimCLR's NT-Xent, a narrow CNN, 2,048 Fashion-MNIST images).
#
# The run writes to `WORKDIR` (checkpoints, `history.json`, `results.json`,
# `summary.png`, TensorBoard events); `03_checkpoint.ipynb` reads it back.
# Running this again resumes from its checkpoint (or change `WORKDIR`).

# %%
import json
import os
import sys

import jax
import matplotlib.pyplot as plt
from IPython.display import Image

sys.path.insert(0, os.path.abspath('..'))   # The repository root.
from configs import test as test_config  # noqa: E402
from contrastive_jax import progress  # noqa: E402
from contrastive_jax import runtime  # noqa: E402
from contrastive_jax import train  # noqa: E402

WORKDIR = os.environ.get('NOTEBOOK_WORKDIR', '../workdir/notebook')
print(f'{jax.device_count()} {jax.devices()[0].platform} devices; '
      f'workdir {WORKDIR}')

# %% [markdown]
# ## The config
#
# `configs/test.py` is the default SimCLR recipe shrunk: a (8, 16)-channel CNN,
# batch 32, one epoch of `train[:2048]`. Overrides are plain assignments
# (the notebook's `--config.xxx=...`): two epochs, and an online kNN monitor
# every 32 steps, on 1,024 training images as the bank and 512 test images as
# queries.

# %%
config = test_config.get_config()
config.num_epochs = 2.0
config.online.knn_every_steps = 32
config.online.knn_bank_size = 1024
config.online.knn_num_queries = 512
print(config.method, config.loss, dict(config.loss_kwargs),
      config.batch_size, config.dataset.train_split)

# %% [markdown]
# ## Train
#
# A progress bar for the pretraining and one per evaluated representation;
# the online kNN and the final evaluation print above them.

# %%
runtime.notebook_logging()   # The job's log lines, as main.py prints them.
progress.configure('on')     # A notebook's stderr is no terminal.
results = train.train_and_evaluate(config, WORKDIR)

# %% [markdown]
# ## What the run logged
#
# `history.json` holds every logged step: the loss, the learning rate, the
# online linear probe's accuracy on the training batch (labels are used by
# the monitor only, never by the encoder), the online kNN accuracy, and the
# alignment and uniformity of the batch's embeddings (Wang & Isola 2020).

# %%
with open(os.path.join(WORKDIR, 'history.json')) as f:
  history = json.load(f)


def curve(key):
  points = [(h['step'], h[key]) for h in history if key in h]
  return [p[0] for p in points], [p[1] for p in points]


knn_key = next(k for h in history for k in h if k.startswith('online/knn'))
fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
axes[0].plot(*curve('loss'))
axes[0].set(title='NT-Xent loss', xlabel='step')
axes[1].plot(*curve('online/linear_acc'), label='online linear probe')
axes[1].plot(*curve(knn_key), 'o-', label=knn_key)
axes[1].set(title='Online monitors', xlabel='step', ylabel='accuracy')
axes[1].legend()
axes[2].plot(*curve('alignment'), label='alignment')
axes[2].plot(*curve('uniformity'), label='uniformity')
axes[2].set(title='Alignment and uniformity (lower is better)', xlabel='step')
axes[2].legend()
plt.show()

# %% [markdown]
# ## The end-of-run evaluation
#
# Weighted kNN (k = 5 in this config) and a logistic-regression probe on
# frozen features, for the trained encoder, the same encoder at its random
# initialisation and the raw pixels. At this size the margins are small;
# `configs/default.py` trains long enough to show them.

# %%
for rep in ('raw_pixels', 'random_init', 'trained'):
  print(f'{rep:<12} kNN {100 * results[f"{rep}/knn_weighted_top1@5"]:6.2f}%'
        f'   linear {100 * results[f"{rep}/linear_top1"]:6.2f}%')

# %% [markdown]
# Every run also writes `summary.png`: the curves above, the final accuracies
# and t-SNE maps of test features of the trained and the random encoder.

# %%
Image(os.path.join(WORKDIR, 'summary.png'), width=900)
