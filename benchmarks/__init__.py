
# The benchmarks run with many virtual CPU devices: XLA:CPU's thread pools
# are sized for them before any benchmark starts jax's backend
# (contrastive_jax/runtime.py, `size_cpu_thread_pools`).
from contrastive_jax import runtime as _runtime  # pylint: disable=g-bad-import-order

_runtime.size_cpu_thread_pools()
