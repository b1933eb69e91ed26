"""SimCLR with ResNet-18 on Fashion-MNIST at a paper-sized budget (one GPU).

  python main.py --config=configs/simclr_resnet18_fmnist.py \\
      --workdir=workdir/simclr_resnet18_fmnist

The CIFAR-10 recipe of configs/papers/simclr.py (lightly's benchmark:
ResNet-18 with the CIFAR stem, batch 512, SGD 0.06 x B / 128 with momentum
0.9 and weight decay 5e-4, cosine, tau 0.5, a 512-512-128 head, bf16
compute) on Fashion-MNIST's 28 x 28 grayscale images with their augmentation
('fmnist': crop 0.3-1, flip, brightness/contrast jitter, erasing), 100
epochs. Evaluated as every run here: weighted kNN (k = 200) and the L-BFGS
linear probe on the frozen pooled features, beside raw pixels and the
randomly initialised encoder.

Expected: see docs/results.md ("ResNet-18 on a GPU"), which gives the
measured accuracies, the epochs run and the GPU.
"""

from configs.papers import simclr


def get_config():
  config = simclr.get_config('cifar10')
  config.dataset.name = 'fashion_mnist'
  config.dataset.image_size = None          # The dataset's own 28 x 28.
  config.augment.preset = 'fmnist'
  config.num_epochs = 100.
  config.evals.linear_eval.every_steps = -1  # kNN and logistic regression.
  config.eval.baselines = True
  steps_per_epoch = 60_000 // config.batch_size
  config.log_every_steps = steps_per_epoch
  config.checkpoint_every_steps = 10 * steps_per_epoch
  config.evals.online_knn.every_steps = 10 * steps_per_epoch
  return config
