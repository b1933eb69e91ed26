"""Evaluation on frozen features: kNN, linear probes, diagnostics.

One module per kind; import the module you need:

    >>> from contrastive_jax.evaluators import knn, linear_probe
    >>> knn.knn_evaluate(train_f, train_y, test_f, test_y, num_classes=10,
    ...                  ks=(20, 200))
    >>> linear_probe.logistic_regression(train_f, train_y, test_f, test_y,
    ...                                  num_classes=10)

Entry points take feature arrays (numpy or jax) and return plain Python
numbers (accuracies are fractions in [0, 1]), so a train loop can log them.
"""
