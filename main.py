"""Pretrains and evaluates a contrastive model: the job's entry point.

  python main.py --config=configs/default.py --workdir=workdir/default \
      [--config.loss_kwargs.temperature=0.1 ...]

The same as the installed `contrastive-jax-train`; the job itself is
`contrastive_jax.train.train_and_evaluate`.
"""

from contrastive_jax import cli

if __name__ == '__main__':
  cli.train()
