"""contrastive_jax: contrastive representation learning in JAX/Flax."""
