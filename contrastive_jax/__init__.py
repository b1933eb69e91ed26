"""contrastive_jax: contrastive representation learning in JAX/Flax."""

from contrastive_jax import runtime as _runtime

# Before anything starts jax's CPU backend: with several virtual CPU devices,
# XLA:CPU's default thread pools can deadlock collectives (runtime.py).
_runtime.size_cpu_thread_pools()
