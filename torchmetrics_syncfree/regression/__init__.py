"""Sync-free ``torchmetrics.regression``, one module per upstream module it patches (each its own area).

* :mod:`~torchmetrics_syncfree.regression.r2` (area ``r2``): R2Score's compute (and forward's batch value);
* :mod:`~torchmetrics_syncfree.regression.explained_variance` (area ``explained_variance``): ExplainedVariance's.

The areas' modules are imported by :func:`torchmetrics_syncfree.patch_all` when they are patched.
"""
