"""Sync-free ``torchmetrics.regression``, one module per upstream module it patches (each its own area).

* :mod:`~torchmetrics_syncfree.regression.r2` (area ``r2``): R2Score's compute (and forward's batch value) and update;
* :mod:`~torchmetrics_syncfree.regression.explained_variance` (area ``explained_variance``): ExplainedVariance's;
* :mod:`~torchmetrics_syncfree.regression.pearson` (area ``pearson``): PearsonCorrCoef's compute (and the update of
  the releases whose update reads);
* :mod:`~torchmetrics_syncfree.regression.kl_divergence` (area ``kl_divergence``): KLDivergence's update;
* :mod:`~torchmetrics_syncfree.regression.spearman` (area ``spearman``): SpearmanCorrCoef's compute.

Details: ``docs/regression.md``.

The areas' modules are imported by :func:`torchmetrics_syncfree.patch_all` when they are patched.
"""
