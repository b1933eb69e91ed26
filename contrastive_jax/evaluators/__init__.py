"""Evaluation on frozen features: kNN, linear probes, diagnostics.

All entry points take feature arrays (numpy or jax) and return plain Python
numbers (accuracies are fractions in [0, 1]), so a train loop can log them
directly:

    >>> from contrastive_jax import evaluators
    >>> evaluators.knn_evaluate(train_f, train_y, test_f, test_y,
    ...                         num_classes=10, ks=(20, 200))
    >>> evaluators.logistic_regression(train_f, train_y, test_f, test_y,
    ...                                num_classes=10)
"""

from contrastive_jax.evaluators.diagnostics import alignment
from contrastive_jax.evaluators.diagnostics import DIAGNOSTICS
from contrastive_jax.evaluators.diagnostics import embedding_plot
from contrastive_jax.evaluators.diagnostics import similarity_histograms
from contrastive_jax.evaluators.diagnostics import uniformity
from contrastive_jax.evaluators.knn import knn_evaluate
from contrastive_jax.evaluators.knn import knn_predict
from contrastive_jax.evaluators.knn import KnnPredictions
from contrastive_jax.evaluators.knn import shard_bank
from contrastive_jax.evaluators.linear_probe import logistic_regression
from contrastive_jax.evaluators.linear_probe import PRESETS
from contrastive_jax.evaluators.linear_probe import ProbeConfig
from contrastive_jax.evaluators.linear_probe import train_linear_probe
