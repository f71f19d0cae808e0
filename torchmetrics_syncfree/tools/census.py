"""The census: every metric class TorchMetrics exports, stock vs patched, and why each remaining sync happens.

``python -m torchmetrics_syncfree audit --all`` walks ``torchmetrics`` and its sub-packages' ``__all__`` (deprecated
top-level aliases, whose names start with ``_``, and the ``Metric`` base left out), builds every class from a small
specification (:data:`SPECS`: batch :data:`~torchmetrics_syncfree.tools.audit.BATCH`, 5 classes, default arguments
otherwise: as a user tries a metric first) and counts with the :class:`~torchmetrics_syncfree.SyncProbe` the
would-be syncs of ``update``, ``forward`` and ``compute`` in steady state (after one warm-up ``update``):

* ``stock``: TorchMetrics as installed;
* ``patched``: under :func:`torchmetrics_syncfree.patched`, on the device path
  (:func:`~torchmetrics_syncfree._instrumentation.force_device_path`) with the check counters' host copy still in
  flight (:func:`~torchmetrics_syncfree._instrumentation.simulated_copy_delay` ``(None)``: a GPU a step behind the
  host), so that every read of the counters the project's default simulation would find already arrived counts as a
  host wait.

Each remaining sync is attributed to the innermost TorchMetrics or torchmetrics_syncfree frame on its stack (the
library line responsible, where the op itself may run in a helper) and the op that syncs. Classes that take no
tensors (text metrics that score strings) or need a package that is not installed are listed as skipped, with the
reason.

The per-family coverage table of the README is generated from the census of TorchMetrics 1.9.0, recorded in
:data:`RECORD` (``python tools/coverage_table.py --update`` re-runs the census, rewrites the record and the README
block; ``--check`` compares them).

Example:
    >>> from torchmetrics_syncfree.tools.census import census
    >>> [row] = census(["MeanMetric"])
    >>> row.family, row.counts("stock")["update"] > 0, row.counts("patched")
    ('aggregation', True, {'update': 0, 'forward': 0, 'compute': 1})

"""

from __future__ import annotations

import contextlib
import importlib
import json
import linecache
import pkgutil
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchmetrics_syncfree import _instrumentation, _registry
from torchmetrics_syncfree.probe import HOST_WAIT, SyncEvent, SyncProbe
from torchmetrics_syncfree.tools import audit

CALLS = audit.CALLS
MODES = audit.MODES
BATCH, NUM_CLASSES, NUM_LABELS = audit.BATCH, audit.NUM_CLASSES, audit.NUM_LABELS
#: the record of the census of TorchMetrics 1.9.0 from which the README's coverage table is generated, relative to a
#: checkout of the project (an installed package has no ``docs/``)
RECORD = Path("docs") / "coverage-1.9.0.json"
#: the README's generated block lies between these lines
BEGIN, END = "<!-- coverage-table:begin -->", "<!-- coverage-table:end -->"

# ----------------------------------------------------------------------------------------------- the classes


def exported_classes() -> dict[str, type]:
    """Every public metric class exported by the installed TorchMetrics: name -> class, in module order.

    Walks ``torchmetrics`` and every sub-package's ``__all__``; sub-packages that fail to import (optional
    dependencies) export nothing. Deprecated top-level aliases (``torchmetrics._PeakSignalNoiseRatio``, exported as
    ``PeakSignalNoiseRatio`` at the top level on older releases) and the ``Metric`` base class are left out: the
    census counts each class once, under its own name.
    """
    from torchmetrics import Metric

    found: dict[type, None] = {}

    def walk(name: str) -> None:
        try:
            module = importlib.import_module(name)
        except Exception:  # an optional sub-package without its extras
            return
        for exported in getattr(module, "__all__", ()):
            obj = getattr(module, exported, None)
            # one name per class: its own (aliases and deprecated ``_Name`` subclasses are left out)
            is_metric = isinstance(obj, type) and issubclass(obj, Metric) and obj is not Metric
            if is_metric and not obj.__name__.startswith("_") and exported == obj.__name__:
                found[obj] = None
        for info in pkgutil.iter_modules(getattr(module, "__path__", ())):
            if info.ispkg:
                walk(f"{name}.{info.name}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        walk("torchmetrics")
    return {cls.__name__: cls for cls in sorted(found, key=lambda cls: (cls.__module__, cls.__name__))}


#: classification modules -> family (the project's areas: stat scores, confusion matrix, curves, ...)
_CLASSIFICATION_FAMILIES = {
    **dict.fromkeys(
        (
            "accuracy",
            "precision_recall",
            "f_beta",
            "specificity",
            "stat_scores",
            "hamming",
            "negative_predictive_value",
        ),
        "classification: stat scores",
    ),
    **dict.fromkeys(
        ("confusion_matrix", "cohen_kappa", "jaccard", "matthews_corrcoef"), "classification: confusion matrix"
    ),
    **dict.fromkeys(
        ("precision_recall_curve", "roc", "auroc", "average_precision", "logauc"), "classification: curves"
    ),
    **dict.fromkeys(
        (
            "eer",
            "precision_fixed_recall",
            "recall_fixed_precision",
            "sensitivity_specificity",
            "specificity_sensitivity",
        ),
        "classification: fixed-point curves",
    ),
    **dict.fromkeys(("hinge", "exact_match"), "classification: hinge, exact match"),
    **dict.fromkeys(
        ("calibration_error", "group_fairness", "ranking"), "classification: calibration, fairness, ranking"
    ),
}


def family_of(cls: type) -> str:
    """The family of a metric class in the census: its sub-package (classification: by area)."""
    parts = cls.__module__.split(".")
    if parts[1] == "classification":
        return _CLASSIFICATION_FAMILIES.get(parts[2], "classification: other")
    return parts[1]


# ----------------------------------------------------------------------------------------------- specifications


@dataclass(frozen=True)
class ClassSpec:
    """How the census builds and feeds one class: a specification (``audit.parse_spec`` syntax) and its inputs.

    ``build`` (for the few arguments that are no literals: a callable) replaces the specification; ``skip`` says why
    the class is not measured.
    """

    name: str
    spec: str = ""
    inputs: str = "auto"
    skip: str = ""
    build: Callable[[], Any] | None = None


#: extra constructor arguments of the classification metrics, by the name without its task prefix
_CLASSIFICATION_ARGS = {
    "FBetaScore": "beta=2.0",
    "PrecisionAtFixedRecall": "min_recall=0.5",
    "RecallAtFixedPrecision": "min_precision=0.5",
    "SensitivityAtSpecificity": "min_specificity=0.5",
    "SpecificityAtSensitivity": "min_sensitivity=0.5",
    "Fairness": "num_groups=2",
    "GroupStatRates": "num_groups=2",
}
_SIZES = {"Binary": "", "Multiclass": f"num_classes={NUM_CLASSES}", "Multilabel": f"num_labels={NUM_LABELS}"}


def _classification_spec(name: str) -> ClassSpec:
    for prefix, size in _SIZES.items():
        if name.startswith(prefix):
            args = [a for a in (size, _CLASSIFICATION_ARGS.get(name[len(prefix) :], "")) if a]
            inputs = "fairness" if name in ("BinaryFairness", "BinaryGroupStatRates") else "auto"
            return ClassSpec(name, f"{name}({', '.join(args)})", inputs)
    # a task wrapper (``Accuracy(task=...)``): its multiclass task
    args = ["task='multiclass'", f"num_classes={NUM_CLASSES}", _CLASSIFICATION_ARGS.get(name, "")]
    return ClassSpec(name, f"{name}({', '.join(a for a in args if a)})")


def _pit() -> Any:
    from torchmetrics.audio import PermutationInvariantTraining
    from torchmetrics.functional.audio import scale_invariant_signal_noise_ratio

    return PermutationInvariantTraining(scale_invariant_signal_noise_ratio)


_STRINGS = "takes strings, not tensors"
_MULTICLASS = f"MulticlassAccuracy(num_classes={NUM_CLASSES})"

#: Every class that is not a Binary*/Multiclass*/Multilabel* metric or a classification task wrapper.
_OTHER_SPECS = [
    # aggregation: the default nan_strategy ("warn")
    *(ClassSpec(name, f"{name}()", "vector") for name in ("CatMetric", "MaxMetric", "MeanMetric", "MinMetric")),
    ClassSpec("SumMetric", "SumMetric()", "vector"),
    ClassSpec("RunningMean", "RunningMean(window=3)", "vector"),
    ClassSpec("RunningSum", "RunningSum(window=3)", "vector"),
    # audio
    ClassSpec("PermutationInvariantTraining", inputs="speakers", build=_pit),
    ClassSpec("ScaleInvariantSignalDistortionRatio", "ScaleInvariantSignalDistortionRatio()", "audio"),
    ClassSpec("SignalDistortionRatio", "SignalDistortionRatio()", "audio"),
    ClassSpec("SourceAggregatedSignalDistortionRatio", "SourceAggregatedSignalDistortionRatio()", "speakers"),
    ClassSpec("ComplexScaleInvariantSignalNoiseRatio", "ComplexScaleInvariantSignalNoiseRatio()", "spectrogram"),
    ClassSpec("ScaleInvariantSignalNoiseRatio", "ScaleInvariantSignalNoiseRatio()", "audio"),
    ClassSpec("SignalNoiseRatio", "SignalNoiseRatio()", "audio"),
    # clustering: cluster labels, or data points and their labels
    *(
        ClassSpec(name, f"{name}()", "labels")
        for name in (
            "AdjustedMutualInfoScore",
            "AdjustedRandScore",
            "CompletenessScore",
            "FowlkesMallowsIndex",
            "HomogeneityScore",
            "MutualInfoScore",
            "NormalizedMutualInfoScore",
            "RandScore",
            "VMeasureScore",
        )
    ),
    ClassSpec("ClusterAccuracy", f"ClusterAccuracy(num_classes={NUM_CLASSES})", "labels"),
    *(
        ClassSpec(name, f"{name}()", "clustered")
        for name in ("CalinskiHarabaszScore", "DaviesBouldinScore", "DunnIndex")
    ),
    # detection
    *(
        ClassSpec(name, f"{name}(things={{0, 1}}, stuffs={{2}})", "panoptic")
        for name in ("PanopticQuality", "ModifiedPanopticQuality")
    ),
    # (torchvision) boxes: BATCH images of 4 predicted and 3 true boxes
    *(
        ClassSpec(name, f"{name}()", "boxes")
        for name in (
            "IntersectionOverUnion",
            "GeneralizedIntersectionOverUnion",
            "DistanceIntersectionOverUnion",
            "CompleteIntersectionOverUnion",
        )
    ),
    # its COCO backends evaluate on the host by design (measured where pycocotools or faster_coco_eval is installed)
    ClassSpec("MeanAveragePrecision", "MeanAveragePrecision()", "boxes"),
    # image
    ClassSpec("SpectralDistortionIndex", "SpectralDistortionIndex()", "image"),
    ClassSpec("SpatialDistortionIndex", "SpatialDistortionIndex()", "pansharpening"),
    ClassSpec("DeepImageStructureAndTextureSimilarity", "DeepImageStructureAndTextureSimilarity()", "image"),
    ClassSpec("ErrorRelativeGlobalDimensionlessSynthesis", "ErrorRelativeGlobalDimensionlessSynthesis()", "image"),
    ClassSpec(
        "MemorizationInformedFrechetInceptionDistance", "MemorizationInformedFrechetInceptionDistance()", "uint8-image"
    ),
    ClassSpec("PeakSignalNoiseRatio", "PeakSignalNoiseRatio(data_range=1.0)", "image"),
    ClassSpec("PeakSignalNoiseRatioWithBlockedEffect", "PeakSignalNoiseRatioWithBlockedEffect(data_range=1.0)", "gray"),
    ClassSpec("QualityWithNoReference", "QualityWithNoReference()", "pansharpening"),
    ClassSpec("RelativeAverageSpectralError", "RelativeAverageSpectralError()", "image"),
    ClassSpec("RootMeanSquaredErrorUsingSlidingWindow", "RootMeanSquaredErrorUsingSlidingWindow()", "image"),
    ClassSpec("SpectralAngleMapper", "SpectralAngleMapper()", "image"),
    ClassSpec("SpatialCorrelationCoefficient", "SpatialCorrelationCoefficient()", "image"),
    # five scales of the default 11-pixel kernel need 176-pixel images: two scales of a 3-pixel one fit 16 pixels
    ClassSpec(
        "MultiScaleStructuralSimilarityIndexMeasure",
        "MultiScaleStructuralSimilarityIndexMeasure(kernel_size=3, betas=(0.5, 0.5), data_range=1.0)",
        "image",
    ),
    ClassSpec("StructuralSimilarityIndexMeasure", "StructuralSimilarityIndexMeasure(data_range=1.0)", "image"),
    ClassSpec("TotalVariation", "TotalVariation()", "one-image"),
    ClassSpec("UniversalImageQualityIndex", "UniversalImageQualityIndex()", "image"),
    ClassSpec("VisualInformationFidelity", "VisualInformationFidelity()", "large-image"),
    # multimodal, nominal
    ClassSpec("LipVertexError", "LipVertexError(mouth_map=[0, 1, 2])", "vertices"),
    *(
        ClassSpec(name, f"{name}(num_classes={NUM_CLASSES})", "labels")
        for name in ("CramersV", "PearsonsContingencyCoefficient", "TheilsU", "TschuprowsT")
    ),
    ClassSpec("FleissKappa", "FleissKappa()", "ratings"),
    # regression
    ClassSpec("CosineSimilarity", "CosineSimilarity()", "multioutput"),
    ClassSpec("ContinuousRankedProbabilityScore", "ContinuousRankedProbabilityScore()", "ensemble"),
    ClassSpec("CriticalSuccessIndex", "CriticalSuccessIndex(threshold=0.5)", "regression"),
    ClassSpec("JensenShannonDivergence", "JensenShannonDivergence()", "distribution"),
    ClassSpec("KLDivergence", "KLDivergence()", "distribution"),
    ClassSpec("MinkowskiDistance", "MinkowskiDistance(p=2.0)", "regression"),
    # retrieval
    ClassSpec("RetrievalRecallAtFixedPrecision", "RetrievalRecallAtFixedPrecision(min_precision=0.5)", "retrieval"),
    # segmentation (one-hot inputs, the default format), shape
    *(
        ClassSpec(name, f"{name}(num_classes={NUM_CLASSES})", "segmentation")
        for name in ("DiceScore", "GeneralizedDiceScore", "HausdorffDistance", "MeanIoU")
    ),
    ClassSpec("ProcrustesDisparity", "ProcrustesDisparity()", "point-clouds"),
    # text
    ClassSpec("Perplexity", "Perplexity()", "text"),
    # wrappers
    ClassSpec("BootStrapper", "BootStrapper(MeanSquaredError())", "regression"),
    ClassSpec(
        "ClasswiseWrapper", f"ClasswiseWrapper(MulticlassAccuracy(num_classes={NUM_CLASSES}, average=None))", "classes"
    ),
    ClassSpec("MinMaxMetric", f"MinMaxMetric({_MULTICLASS})", "classes"),
    ClassSpec("MultioutputWrapper", "MultioutputWrapper(MeanSquaredError(), num_outputs=3)", "multioutput"),
    ClassSpec(
        "MultitaskWrapper",
        f"MultitaskWrapper({{'classification': {_MULTICLASS}, 'regression': MeanSquaredError()}})",
        "multitask",
    ),
    ClassSpec("Running", "Running(MeanMetric(), window=3)", "vector"),
    ClassSpec("BinaryTargetTransformer", "BinaryTargetTransformer(BinaryAccuracy())", "regression"),
    ClassSpec("LambdaInputTransformer", "LambdaInputTransformer(BinaryAccuracy())", "binary"),
    ClassSpec("MetricInputTransformer", "MetricInputTransformer(BinaryAccuracy())", "binary"),
]
_BY_NAME = {spec.name: spec for spec in _OTHER_SPECS}


def spec_for(name: str, cls: type) -> ClassSpec:
    """The census specification of the exported class ``name``."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    module = cls.__module__
    if module.startswith("torchmetrics.classification."):
        return _classification_spec(name)
    if module.startswith("torchmetrics.text."):
        return ClassSpec(name, skip=_STRINGS)
    # regression and retrieval metrics with default arguments take (preds, target[, indexes]) of the audit's kinds
    return ClassSpec(name, f"{name}()")


# ----------------------------------------------------------------------------------------------- inputs


def make_inputs(kind: str, metric: Any, device: torch.device, seed: int = 0) -> tuple[tuple[Any, ...], dict]:
    """Update arguments of one input ``kind`` (the census's kinds; others are :func:`audit.make_inputs`'s)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen).to(device)

    def randint(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=gen).to(device)

    side = audit.SIDE
    if kind == "fairness":  # binary predictions, targets and 2 groups
        return (rand(BATCH), randint(2, BATCH), randint(2, BATCH)), {}
    if kind == "classes":  # multiclass inputs for a wrapper (no num_classes attribute)
        return (rand(BATCH, NUM_CLASSES).softmax(-1), randint(NUM_CLASSES, BATCH)), {}
    if kind == "labels":  # predicted and true labels (cluster ids, categories)
        return (randint(NUM_CLASSES, BATCH), randint(NUM_CLASSES, BATCH)), {}
    if kind == "clustered":  # 3-d points and their cluster labels
        return (rand(BATCH, 3), randint(NUM_CLASSES, BATCH)), {}
    if kind == "audio":
        return (torch.randn(BATCH, 64, generator=gen).to(device), torch.randn(BATCH, 64, generator=gen).to(device)), {}
    if kind == "speakers":  # (batch, speakers, time)
        return tuple(torch.randn(BATCH, 2, 64, generator=gen).to(device) for _ in range(2)), {}
    if kind == "spectrogram":  # complex spectrograms as (..., frequency, time, 2)
        return tuple(torch.randn(BATCH, 9, 8, 2, generator=gen).to(device) for _ in range(2)), {}
    if kind == "panoptic":  # (batch, H, W, [category, instance]): categories 0-1 things, 2 stuff

        def panoptic() -> torch.Tensor:
            return torch.stack([randint(3, BATCH, 8, 8), randint(3, BATCH, 8, 8)], dim=-1)

        return (panoptic(), panoptic()), {}
    if kind == "boxes":  # per image: 4 predicted and 3 true xyxy boxes of NUM_CLASSES labels in a 16-pixel image

        def boxes(n: int) -> torch.Tensor:
            corner = rand(n, 2) * side
            return torch.cat([corner, corner + 1 + rand(n, 2) * side / 2], dim=-1)

        preds = [{"boxes": boxes(4), "scores": rand(4), "labels": randint(NUM_CLASSES, 4)} for _ in range(BATCH)]
        target = [{"boxes": boxes(3), "labels": randint(NUM_CLASSES, 3)} for _ in range(BATCH)]
        return (preds, target), {}
    if kind in ("image", "gray", "one-image", "large-image", "uint8-image"):
        channels = 1 if kind == "gray" else audit.CHANNELS
        size = 48 if kind == "large-image" else side  # VisualInformationFidelity needs 41 pixels
        if kind == "one-image":
            return (rand(BATCH, channels, size, size),), {}
        if kind == "uint8-image":
            return (randint(256, BATCH, channels, size, size).to(torch.uint8),) * 2, {}
        return (rand(BATCH, channels, size, size), rand(BATCH, channels, size, size)), {}
    if kind == "pansharpening":  # high resolution multispectral; low resolution multispectral and panchromatic
        target = {"ms": rand(BATCH, 3, side // 2, side // 2), "pan": rand(BATCH, 3, side, side)}
        return (rand(BATCH, 3, side, side), target), {}
    if kind == "vertices":  # (frames, vertices, 3)
        return (rand(BATCH, 10, 3), rand(BATCH, 10, 3)), {}
    if kind == "ratings":  # per subject, how many of 4 raters chose each category
        raters = randint(NUM_CLASSES, BATCH, 4)
        return (torch.nn.functional.one_hot(raters, NUM_CLASSES).sum(1),), {}
    if kind == "ensemble":  # (batch, ensemble members), (batch,)
        return (rand(BATCH, 5), rand(BATCH)), {}
    if kind == "point-clouds":
        return (rand(BATCH, 10, 3), rand(BATCH, 10, 3)), {}
    if kind == "multitask":
        preds = {"classification": rand(BATCH, NUM_CLASSES).softmax(-1), "regression": rand(BATCH)}
        target = {"classification": randint(NUM_CLASSES, BATCH), "regression": rand(BATCH)}
        return (preds, target), {}
    return audit.make_inputs(kind, metric, device, seed)


# ----------------------------------------------------------------------------------------------- measuring


@dataclass
class Row:
    """The census of one class: its family, specification, the sync events per mode and call, or why it was not run."""

    name: str
    family: str
    spec: str
    skipped: str = ""
    events: dict[str, dict[str, list[SyncEvent]]] = field(default_factory=dict)  # mode -> call -> events
    errors: dict[str, str] = field(default_factory=dict)  # mode -> error text
    seconds: float = 0.0

    def counts(self, mode: str) -> dict[str, int]:
        """Sync events per call in ``mode``."""
        return {call: len(events) for call, events in self.events.get(mode, {}).items()}

    def syncs(self, mode: str, calls: Sequence[str] = ("update", "forward")) -> bool:
        """Whether ``calls`` sync (or fail) in ``mode``."""
        return mode in self.errors or any(self.counts(mode).get(call, 0) for call in calls)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: counts and, per mode and call, every distinct sync with its count and reason."""
        return {
            "name": self.name,
            "family": self.family,
            "spec": self.spec,
            "skipped": self.skipped,
            "errors": self.errors,
            "counts": {mode: self.counts(mode) for mode in self.events},
            "reasons": {
                mode: {call: [_reason_dict(n, e) for n, e in _grouped(events)] for call, events in calls.items()}
                for mode, calls in self.events.items()
            },
        }


def _grouped(events: Sequence[SyncEvent]) -> Iterator[tuple[int, SyncEvent]]:
    """Distinct events (kind, op, library line), in order, with how often each occurred."""
    counts = Counter((e.kind, e.op, e.library or e.location) for e in events)
    seen = set()
    for event in events:
        key = (event.kind, event.op, event.library or event.location)
        if key not in seen:
            seen.add(key)
            yield counts[key], event


def _reason_dict(count: int, event: SyncEvent) -> dict[str, Any]:
    where = event.library or event.location
    path, _, line = where.rpartition(":")
    source = linecache.getline(path, int(line)).strip() if line.isdigit() else event.source
    return {"count": count, "kind": event.kind, "op": event.op, "at": audit.short_location(where), "source": source}


def reason_text(reason: dict[str, Any]) -> str:
    """``1x aten.bincount.default (data-dependent shape) at torchmetrics/utilities/data.py:206: <source line>``."""
    return f"{reason['count']}x {reason['op']} ({reason['kind']}) at {reason['at']}: {reason['source']}"


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    """Stock, or patched on the device path with the counters' host copy in flight."""
    if mode == "stock":
        yield
        return
    with _registry.patched(), _instrumentation.simulated_copy_delay(None):
        _instrumentation.force_device_path(True)
        try:
            yield
        finally:
            _instrumentation.force_device_path(False)


def _probe(spec: ClassSpec, device: torch.device) -> dict[str, list[SyncEvent]]:
    metric = spec.build() if spec.build is not None else audit.build_metric(spec.spec)
    metric = metric.to(device)
    args, kwargs = make_inputs(spec.inputs, metric, device)
    metric.update(*args, **kwargs)  # warm-up: first-update effects are not what a training loop pays per step
    events = {}
    for call, run in (("update", metric.update), ("forward", metric), ("compute", None)):
        with SyncProbe(device) as probe:
            if run is None:
                metric.compute()
            else:
                run(*args, **kwargs)
        events[call] = probe.events
    return events


def _missing_module(err: BaseException) -> str:
    """The optional package a failure asks for (``ModuleNotFoundError``, or TorchMetrics' "requires ... installed")."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        return err.name.split(".")[0]
    text = str(err)
    for marker in ("requires that ", "requires `", "requires the ", "`pip install "):
        if marker in text and ("install" in text or "available" in text):
            return text.split(marker, 1)[1].split()[0].strip("`'\",.")
    return ""


def census_class(name: str, cls: type, device: torch.device | str = "cpu") -> Row:
    """Probe one class stock, then patched; a class that needs a missing package is skipped with its name."""
    spec = spec_for(name, cls)
    row = Row(name, family_of(cls), spec.spec or ("<built in code>" if spec.build else ""), spec.skip)
    if spec.skip:
        return row
    start = time.perf_counter()
    device = torch.device(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stock's and the checks' warnings on random inputs are not the subject
        for mode in MODES:
            with _mode(mode):
                try:
                    row.events[mode] = _probe(spec, device)
                except Exception as err:  # any failure of a metric is a finding of the census
                    missing = _missing_module(err)
                    if missing:
                        row.skipped, row.events, row.errors = f"needs {missing}", {}, {}
                        break
                    row.errors[mode] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    row.seconds = time.perf_counter() - start
    return row


def census(
    names: Sequence[str] | None = None,
    device: torch.device | str = "cpu",
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Row]:
    """The census of ``names`` (default: every exported class); stock TorchMetrics must be active."""
    audit._require_stock()
    _registry._load_areas()
    classes = exported_classes()
    if names:
        unknown = [name for name in names if name not in classes]
        if unknown:
            raise audit.SpecError(f"not exported by torchmetrics: {', '.join(unknown)}")
        classes = {name: classes[name] for name in names}
    rows = []
    for index, (name, cls) in enumerate(classes.items()):
        if progress is not None:
            progress(index, len(classes), name)
        rows.append(census_class(name, cls, device))
    return rows


# ----------------------------------------------------------------------------------------------- reporting


def to_payload(rows: Sequence[Row], device: torch.device | str = "cpu") -> dict[str, Any]:
    """The census as JSON-ready data, with the versions and what "patched" means."""
    import torchmetrics

    return {
        "torchmetrics": torchmetrics.__version__,
        "torch": torch.__version__,
        "device": str(device),
        "batch": BATCH,
        "classes": NUM_CLASSES,
        "patched": "patch_all(), device path forced, the check counters' host copy in flight",
        "rows": [row.as_dict() for row in rows],
    }


def _counts_text(entry: dict[str, Any], mode: str) -> str:
    if mode in entry["errors"]:
        return "error"
    counts = entry["counts"].get(mode)
    return "/".join(str(counts[call]) for call in CALLS) if counts else "-"


def format_text(payload: dict[str, Any]) -> str:
    """A table (class, family, stock and patched update/forward/compute counts), then every remaining reason."""
    entries = payload["rows"]
    width = max(len(e["name"]) for e in entries)
    fam = max(len(e["family"]) for e in entries)
    lines = [
        f"torchmetrics {payload['torchmetrics']} | torch {payload['torch']} | would-be syncs per call, batch"
        f" {payload['batch']}, {payload['classes']} classes | patched: {payload['patched']}",
        "",
        f"{'class':<{width}}  {'family':<{fam}}  {'stock u/f/c':>12}  {'patched u/f/c':>13}",
    ]
    for e in entries:
        stock = f"skipped: {e['skipped']}" if e["skipped"] else _counts_text(e, "stock")
        patched = "" if e["skipped"] else _counts_text(e, "patched")
        lines.append(f"{e['name']:<{width}}  {e['family']:<{fam}}  {stock:>12}  {patched:>13}")
    lines += ["", "Where the patched calls still sync (innermost TorchMetrics/torchmetrics_syncfree line, op):"]
    for e in entries:
        block = [f"  {mode} could not run: {error}" for mode, error in e["errors"].items()]
        for call, reasons in e["reasons"].get("patched", {}).items():
            block += [f"  {call:<8} {reason_text(r)}" for r in reasons]
        if block:
            lines += [f"{e['name']} ({e['spec']})", *block]
    return "\n".join(lines)


@dataclass
class FamilyStats:
    """Per family: classes, skipped ones, and per call how many measured classes are clean stock and patched."""

    classes: int = 0
    skipped: Counter = field(default_factory=Counter)
    measured: int = 0
    clean: dict[str, Counter] = field(default_factory=lambda: {mode: Counter() for mode in MODES})
    #: classes whose patched ``compute()`` syncs only by reading the check counters (the one read that may wait)
    compute_reads_checks: int = 0
    #: classes whose patched ``forward()`` syncs once, in the project's own code: the one read of a size only the data
    #: knows (the number of clusters, the length of a curve, the keys of a result), by design
    forward_reads_size_once: int = 0
    syncing: Counter = field(default_factory=Counter)  # mode -> classes that sync (or fail) in update or forward

    def add(self, other: FamilyStats) -> None:
        """Add ``other``'s numbers to these (for the total)."""
        self.classes += other.classes
        self.measured += other.measured
        self.skipped.update(other.skipped)
        self.compute_reads_checks += other.compute_reads_checks
        self.forward_reads_size_once += other.forward_reads_size_once
        self.syncing.update(other.syncing)
        for mode in MODES:
            self.clean[mode].update(other.clean[mode])


def _reads_size_once(reasons: Sequence[dict[str, Any]]) -> bool:
    """Whether a call's syncs are one read in the project's code (a data-sized algorithm's documented read)."""
    return (
        len(reasons) == 1
        and reasons[0]["count"] == 1
        and reasons[0]["kind"] != HOST_WAIT
        and reasons[0]["at"].startswith("torchmetrics_syncfree/")
    )


def family_stats(payload: dict[str, Any]) -> dict[str, FamilyStats]:
    """The per-family summary of a census payload (families sorted by name)."""
    stats: dict[str, FamilyStats] = {}
    for e in payload["rows"]:
        s = stats.setdefault(e["family"], FamilyStats())
        s.classes += 1
        if e["skipped"]:
            s.skipped[e["skipped"]] += 1
            continue
        s.measured += 1
        for mode in MODES:
            counts = e["counts"].get(mode, {})
            failed = mode in e["errors"]
            for call in CALLS:
                s.clean[mode][call] += not failed and counts.get(call, 1) == 0
            s.syncing[mode] += failed or any(counts.get(call, 1) for call in ("update", "forward"))
        reasons = e["reasons"].get("patched", {}).get("compute", [])
        s.compute_reads_checks += bool(reasons) and all(r["kind"] == HOST_WAIT for r in reasons)
        s.forward_reads_size_once += _reads_size_once(e["reasons"].get("patched", {}).get("forward", []))
    return dict(sorted(stats.items()))


def _total(stats: dict[str, FamilyStats]) -> FamilyStats:
    total = FamilyStats()
    for s in stats.values():
        total.add(s)
    return total


def format_summary(payload: dict[str, Any]) -> str:
    """Per family: classes, measured, how many sync in ``update`` or ``forward`` stock and patched, skipped."""
    stats = family_stats(payload)
    width = max(len(f) for f in stats)
    lines = [
        f"{'family':<{width}}  classes  measured  syncing in update/forward: stock  patched  skipped",
    ]
    for family, s in [*stats.items(), ("all", _total(stats))]:
        skipped = "; ".join(f"{n} {reason}" for reason, n in sorted(s.skipped.items())) or "-"
        lines.append(
            f"{family:<{width}}  {s.classes:>7}  {s.measured:>8}  {s.syncing['stock']:>32}  {s.syncing['patched']:>7}"
            f"  {skipped}"
        )
    return "\n".join(lines)


def format_markdown(payload: dict[str, Any]) -> str:
    """The coverage table: per family, patched classes clean in update/forward/compute (stock in parentheses)."""
    stats = family_stats(payload)
    lines = [
        f"| family (TorchMetrics {payload['torchmetrics']}) | classes | `update` clean | `forward` clean |"
        " `compute` clean | not measured |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def row(name: str, s: FamilyStats) -> str:
        cells = [f"{s.clean['patched'][c]}/{s.measured} (stock {s.clean['stock'][c]})" for c in CALLS]
        if s.forward_reads_size_once:
            cells[1] += f", {s.forward_reads_size_once} read a data-sized length once"
        if s.compute_reads_checks:
            cells[-1] += f", {s.compute_reads_checks} read the checks once"
        skipped = "; ".join(f"{n}: {reason}" for reason, n in sorted(s.skipped.items())) or "-"
        return f"| {name} | {s.classes} | {' | '.join(cells)} | {skipped} |"

    lines += [row(family, s) for family, s in stats.items()]
    lines.append(row("**all**", _total(stats)))
    return "\n".join(lines)


def readme_block(payload: dict[str, Any]) -> str:
    """The README's generated block: markers, a one-line legend and the coverage table."""
    legend = (
        f"Classes of TorchMetrics {payload['torchmetrics']} whose calls cause no host-device sync, counted by the"
        f" project's probe over every exported metric class (batch {payload['batch']}, {payload['classes']} classes,"
        " default arguments), with `patch_all()` on the device path (what a GPU runs, the checks' host copy still in"
        ' flight); stock in parentheses. "read the checks once": `compute()` waits once for the deferred input'
        ' checks (`validate_args`, `nan_strategy`), and only where they have not arrived. "read a data-sized length'
        ' once": `forward()` reads one number that only the data knows (the number of clusters, the length of a'
        " retrieval curve, the groups that name BinaryFairness's keys), by design; the other `forward` syncs left are"
        " stock's unbinned ROC/PR-curve computes, whose outputs have a data-dependent length. Generated by"
        " `python tools/coverage_table.py --update`; `python -m torchmetrics_syncfree audit --all` lists every class"
        " and the line of every remaining sync."
    )
    return "\n".join([BEGIN, legend, "", format_markdown(payload), END])


def replace_block(text: str, block: str) -> str:
    """``text`` with the part from :data:`BEGIN` to :data:`END` (both lines included) replaced by ``block``."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block + text[end:]


def load_record(root: Path) -> dict[str, Any]:
    """The recorded census payload of the checkout at ``root``."""
    return json.loads((root / RECORD).read_text())
