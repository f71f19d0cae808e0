"""Sync-free ``torchmetrics.retrieval``, one module per upstream module it patches.

* :mod:`~torchmetrics_syncfree.retrieval.base` (area ``retrieval``): ``RetrievalMetric.update`` (every retrieval
  metric built on it) and ``RetrievalMetric.compute`` (fixed-shape per-query values for RetrievalMRR,
  RetrievalHitRate, RetrievalPrecision, RetrievalRecall, RetrievalMAP, RetrievalNormalizedDCG, RetrievalRPrecision,
  RetrievalAUROC);
* :mod:`~torchmetrics_syncfree.retrieval.fall_out` (area ``retrieval_fall_out``): ``RetrievalFallOut.compute``;
* :mod:`~torchmetrics_syncfree.retrieval.precision_recall_curve` (area ``retrieval_precision_recall_curve``):
  ``RetrievalPrecisionRecallCurve`` (``__init__``, ``update``, ``compute``) and ``_retrieval_recall_at_fixed_precision``
  (``RetrievalRecallAtFixedPrecision``).

The areas are imported by :func:`torchmetrics_syncfree.patch_all` when they are patched.
"""
