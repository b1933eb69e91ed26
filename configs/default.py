"""The default job: SimCLR (NT-Xent) on Fashion-MNIST with a small CNN, on CPU.

Command (from the repository root; builds Fashion-MNIST offline on first use):

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    python main.py --config=configs/default.py --workdir=workdir/default

Expected, measured on the 2-core CPU with 8 virtual devices on 2026-11-26
(4 epochs, 3748 steps of 64; 1148 s of training at 226 images/s and 22.7 min
in all, with the reproduction study and a test suite running beside it and
the load average at 10-16), test split:

  representation   kNN (k=200, T=0.1)   linear probe
  raw pixels             78.85%              84.27%
  random init            81.92%              85.21%
  trained (SimCLR)       83.54%              88.58%

The recipe is configs/base.py (NT-Xent tau 0.1, the small CNN, AdamW with 5%
warmup then cosine, 4 epochs, the 'fmnist' augmentation) with two changes,
chosen on the validation split: the projection head reads the flattened
3x3x256 map, the representation that evaluation scores, instead of its
global average (model.head_input = 'features'; averaging lets the loss
ignore where in the image a part is, which is what tells a shirt from a coat
at 28x28), and batch 64 instead of 256 at the same peak lr 1e-3 (4x the
steps over the same images; base_learning_rate 4e-3, as the peak is
base_learning_rate * batch / 256).

How it was chosen: on the validation split, a fixed stratified 10,000 of the
training images (config.dataset.validation_size), each candidate trained on
this job's 239,616 images (936 x 256) from the 50,000 others and scored on
the 10,000 only, seed 0 (benchmarks/reproduce.py RECIPES; REPORT.md's recipe
table; python -m benchmarks.reproduce). The test split played no part. %:

  candidate (overrides of base.py)                 kNN    linear   mean
  none: base.py, the previous default             83.33   88.18   85.76
  temperature 0.2                                 82.83   88.21   85.52
  peak lr 3e-3                                    83.63   88.50   86.07
  head reads the map                              83.82   88.94   86.38
  crops 0.08-1 (SimCLR's) instead of 0.3-1        83.23   88.03   85.63
  head reads the map, peak lr 3e-3                83.85   88.91   86.38
  batch 64 (4x the steps), peak lr 1e-3           83.87   88.55   86.21
  batch 64, peak lr 2e-3                          84.09   88.41   86.25
  head reads the map, batch 64, peak lr 2e-3      84.17   88.80   86.49
  head reads the map, batch 64, peak lr 1e-3      83.79   89.22   86.51  <- this file
  random-init encoder / raw pixels (no training)  82.05 / 78.93   86.08 / 85.53

The rule, set before the last candidate finished: the best mean of kNN and
linear. It picks the last candidate (86.51), this file; the batch-64 pair at
lr 2e-3 (86.49) and 1e-3 are a tie within noise (one seed's spread is
0.01-0.47 point in the study), and so is the head reading the map at batch
256 (86.38), which this file shipped until the batch-64 job's hang was
understood: all 5 batch-64 default jobs on 2026-11-25 hung at their first
steps, 7 of 8 devices waiting in an all-gather until XLA aborted after
40 s. That was XLA:CPU's thread pools, one thread per virtual device,
deadlocking two collective launches (contrastive_jax/runtime.py, which now
sizes them at two threads per device; tests/test_runtime.py). It is a race:
on 2026-11-26, before the fix, 7 short batch-64 jobs (0.05-0.1 epochs) ran
through; the full job above ran with it. The default job at batch
256 (2026-11-26, load 5-8) gave 83.17% / 88.39% in 840 s of training at 294
images/s; batch 64 processes images at the same rate in an alternated
measurement (base.py's step on 8 devices, 64 vs 256 instances: 361 and 278
against 332 and 325 images/s, `benchmarks/train_step.py`'s worker), so the
longer training above is the heavier load.

The issue's target, a trained encoder +3 kNN / +4 linear points over the
random-init encoder on the test split within the default job's time budget,
is not met: +1.62 / +3.37 (batch 256: +1.25 / +3.18; base.py: +0.95 / +2.97
on 2026-11-24). On validation the best candidates gained +2.12 kNN (the head
reading the map at batch 64, peak lr 2e-3) and +3.14 linear (this file) over
the random-init encoder.

Before the validation split existed, base.py's settings were chosen on the
test split: 1 epoch of batch 512 / tau 0.2 / crops 0.3-1 gave kNN 81.0%, and
only 79.0% with pooled features (the random CNN's pooled features give
80.3%); 3 epochs of batch 256 / tau 0.1 gave 82.7% kNN, 87.8% linear with the
flattened last map against 80.6% / 84.7% pooled. Hence tau 0.1, batch 256, 4
epochs and the flattened map as representation; the search above started
from there.

Different from the SimCLR paper: the small CNN instead of ResNet-50, a head
reading the spatial map, AdamW instead of LARS, batch 64 instead of 4096, 4
epochs, and the 'fmnist' augmentation (crop 0.3-1, flip, brightness/contrast
jitter, erasing) for 28x28 grayscale images instead of random resized crop
0.08-1 + colour distortion.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.model.head_input = 'features'
  config.batch_size = 64
  config.optimizer.base_learning_rate = 4e-3   # Peak lr 1e-3, as base.py's.
  return config
