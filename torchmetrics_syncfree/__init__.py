"""torchmetrics-syncfree: TorchMetrics without host-device synchronizations in ``update()`` and ``forward()``.

Example:
    >>> import torch, torchmetrics_syncfree
    >>> from torchmetrics.aggregation import MeanMetric
    >>> targets = torchmetrics_syncfree.patch_all()
    >>> metric = MeanMetric()
    >>> with torchmetrics_syncfree.SyncProbe() as probe:
    ...     metric.update(torch.tensor(0.5))
    ...     metric.update(0.25)
    >>> probe.count, metric.compute()
    (0, tensor(0.3750))
    >>> restored = torchmetrics_syncfree.unpatch_all()

"""

from torchmetrics_syncfree._registry import (
    FORCE_ENV_VAR,
    SUPPORTED_TORCHMETRICS,
    PatchTargetError,
    UnsupportedVersionError,
    declared_targets,
    get_original,
    is_patched,
    patch_all,
    patched,
    patched_targets,
    register_area,
    registered_areas,
    unavailable_targets,
    unpatch_all,
)
from torchmetrics_syncfree.probe import SyncEvent, SyncProbe

__version__ = "0.1.0"

register_area("metric", "torchmetrics_syncfree.metric")
register_area("aggregation", "torchmetrics_syncfree.aggregation", requires=("metric",))
register_area("distributed", "torchmetrics_syncfree.distributed")
register_area("classification", "torchmetrics_syncfree.classification", requires=("metric",))
register_area(
    "confusion_matrix", "torchmetrics_syncfree.classification.confusion_matrix", requires=("metric", "classification")
)
register_area("hinge", "torchmetrics_syncfree.classification.hinge", requires=("metric", "confusion_matrix"))
register_area(
    "precision_recall_curve",
    "torchmetrics_syncfree.classification.precision_recall_curve",
    requires=("metric", "confusion_matrix"),
)
register_area("auroc", "torchmetrics_syncfree.classification.auroc", requires=("metric", "precision_recall_curve"))
register_area(
    "average_precision",
    "torchmetrics_syncfree.classification.average_precision",
    requires=("metric", "precision_recall_curve"),
)
register_area("logauc", "torchmetrics_syncfree.classification.logauc", requires=("metric", "precision_recall_curve"))
# PrecisionAtFixedRecall, RecallAtFixedPrecision, SensitivityAtSpecificity, SpecificityAtSensitivity, EER
register_area(
    "fixed_point_curves",
    "torchmetrics_syncfree.classification.fixed_point_curves",
    requires=("metric", "precision_recall_curve"),
)
register_area("exact_match", "torchmetrics_syncfree.classification.exact_match", requires=("metric", "classification"))
# CalibrationError, BinaryFairness/BinaryGroupStatRates, the multilabel ranking metrics
register_area(
    "calibration_error",
    "torchmetrics_syncfree.classification.calibration_error",
    requires=("metric", "confusion_matrix"),
)
register_area(
    "group_fairness", "torchmetrics_syncfree.classification.group_fairness", requires=("metric", "classification")
)
register_area("ranking", "torchmetrics_syncfree.classification.ranking", requires=("metric", "confusion_matrix"))
register_area("r2", "torchmetrics_syncfree.regression.r2", requires=("metric",))
register_area("explained_variance", "torchmetrics_syncfree.regression.explained_variance", requires=("metric",))
register_area("pearson", "torchmetrics_syncfree.regression.pearson", requires=("metric",))
register_area("kl_divergence", "torchmetrics_syncfree.regression.kl_divergence")
register_area("spearman", "torchmetrics_syncfree.regression.spearman", requires=("metric",))
# LogCoshError, TweedieDevianceScore, KendallRankCorrCoef, ConcordanceCorrCoef
register_area("log_cosh", "torchmetrics_syncfree.regression.log_cosh")
register_area("tweedie_deviance", "torchmetrics_syncfree.regression.tweedie_deviance", requires=("metric",))
register_area("concordance", "torchmetrics_syncfree.regression.concordance", requires=("metric", "pearson"))
register_area("kendall", "torchmetrics_syncfree.regression.kendall")
# MinMaxMetric, PeakSignalNoiseRatio, Perplexity, GeneralizedDiceScore (one area per upstream module)
register_area("minmax", "torchmetrics_syncfree.wrappers.minmax", requires=("metric",))
register_area("psnr", "torchmetrics_syncfree.image.psnr", requires=("metric",))
register_area("perplexity", "torchmetrics_syncfree.text.perplexity", requires=("metric",))
register_area(
    "generalized_dice", "torchmetrics_syncfree.segmentation.generalized_dice", requires=("metric", "classification")
)
register_area(
    "hausdorff_distance",
    "torchmetrics_syncfree.segmentation.hausdorff_distance",
    requires=("metric", "classification", "generalized_dice"),
)
register_area("detection_iou", "torchmetrics_syncfree.detection.iou", requires=("metric",))
register_area("panoptic_qualities", "torchmetrics_syncfree.detection.panoptic_qualities", requires=("metric",))
register_area("retrieval", "torchmetrics_syncfree.retrieval.base", requires=("metric",))
register_area("retrieval_fall_out", "torchmetrics_syncfree.retrieval.fall_out", requires=("metric", "retrieval"))
# RetrievalPrecisionRecallCurve, RetrievalRecallAtFixedPrecision
register_area(
    "retrieval_precision_recall_curve",
    "torchmetrics_syncfree.retrieval.precision_recall_curve",
    requires=("metric", "retrieval"),
)
# the twelve clustering metrics, one host read per compute()/forward() (the number of clusters)
register_area("clustering", "torchmetrics_syncfree.clustering", requires=("metric",))
# a MetricCollection's members synced in one collective
register_area("collections", "torchmetrics_syncfree.collections", requires=("metric", "distributed"))
# the wrappers' internal resets and computes of the metrics they wrap read no check counters
register_area("wrapper_checks", "torchmetrics_syncfree.wrappers.checks", requires=("metric",))
# BootStrapper's samples drawn on the device; MultioutputWrapper's selection without host copies
register_area("bootstrapping", "torchmetrics_syncfree.wrappers.bootstrapping", requires=("metric",))
register_area("multioutput", "torchmetrics_syncfree.wrappers.multioutput", requires=("metric",))
# the nominal metrics (CramersV, TschuprowsT, PearsonsContingencyCoefficient, TheilsU), one area per module
register_area("cramers", "torchmetrics_syncfree.nominal.cramers", requires=("metric", "classification"))
register_area("tschuprows", "torchmetrics_syncfree.nominal.tschuprows", requires=("metric", "classification"))
register_area("pearsons_contingency", "torchmetrics_syncfree.nominal.pearson", requires=("metric", "classification"))
register_area("theils_u", "torchmetrics_syncfree.nominal.theils_u", requires=("metric", "classification"))
# the image metrics' host copies, index tensors and masked writes (one area per upstream module)
register_area("psnrb", "torchmetrics_syncfree.image.psnrb", requires=("metric",))
register_area("ssim", "torchmetrics_syncfree.image.ssim", requires=("metric",))
register_area("vif", "torchmetrics_syncfree.image.vif", requires=("metric",))
register_area("rase", "torchmetrics_syncfree.image.rase", requires=("metric",))
register_area("scc", "torchmetrics_syncfree.image.scc", requires=("metric",))

__all__ = [
    "FORCE_ENV_VAR",
    "SUPPORTED_TORCHMETRICS",
    "PatchTargetError",
    "SyncEvent",
    "SyncProbe",
    "UnsupportedVersionError",
    "__version__",
    "declared_targets",
    "get_original",
    "is_patched",
    "patch_all",
    "patched",
    "patched_targets",
    "registered_areas",
    "unavailable_targets",
    "unpatch_all",
]
