"""Sync-free ``torchmetrics.classification``, one module per upstream module it patches.

* :mod:`~torchmetrics_syncfree.classification.stat_scores` (area ``classification``): the stat-score metrics
  (Accuracy, Precision, Recall, F1Score/FBetaScore, Specificity, StatScores, ...) and their reductions;
* :mod:`~torchmetrics_syncfree.classification.confusion_matrix` (area ``confusion_matrix``): ConfusionMatrix and
  the metrics built on it (CohenKappa, MatthewsCorrCoef, JaccardIndex);
* :mod:`~torchmetrics_syncfree.classification.hinge`, :mod:`~torchmetrics_syncfree.classification.exact_match`:
  HingeLoss and ExactMatch;
* :mod:`~torchmetrics_syncfree.classification.precision_recall_curve` (area ``precision_recall_curve``): the update
  of PrecisionRecallCurve and of everything built on it (ROC, AUROC, AveragePrecision, LogAUC);
* :mod:`~torchmetrics_syncfree.classification.auroc`, :mod:`~torchmetrics_syncfree.classification.average_precision`:
  the computes of AUROC and AveragePrecision.

Importing this package registers the ``classification`` area's patches; the other areas are imported by
:func:`torchmetrics_syncfree.patch_all` when they are patched.
"""

from torchmetrics_syncfree.classification import stat_scores  # noqa: F401  (declares the area's patches)
