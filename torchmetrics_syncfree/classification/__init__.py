"""Sync-free ``torchmetrics.classification``, one module per upstream module it patches.

* :mod:`~torchmetrics_syncfree.classification.stat_scores` (area ``classification``): the stat-score metrics
  (Accuracy, Precision, Recall, F1Score/FBetaScore, Specificity, StatScores, ...) and their reductions;
* :mod:`~torchmetrics_syncfree.classification.confusion_matrix` (area ``confusion_matrix``): ConfusionMatrix and
  the metrics built on it (CohenKappa, MatthewsCorrCoef, JaccardIndex).

Importing this package registers the ``classification`` area's patches; the ``confusion_matrix`` area is imported
by :func:`torchmetrics_syncfree.patch_all` when it is patched.
"""

from torchmetrics_syncfree.classification import stat_scores  # noqa: F401  (declares the area's patches)
