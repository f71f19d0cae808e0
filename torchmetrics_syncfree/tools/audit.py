"""Sync audit: which metric calls would synchronize host and device, stock vs patched, and from which line.

``python -m torchmetrics_syncfree audit`` runs every configuration of :data:`CATALOGUE` (or the metrics named with
``--metric``) once stock and once under :func:`torchmetrics_syncfree.patched`, and counts with
:class:`~torchmetrics_syncfree.SyncProbe` the would-be syncs of ``update``, ``forward`` and ``compute``. Each call is
measured in steady state: the metric has already seen one ``update`` with the same inputs.

Metric specifications are parsed, never evaluated: ``"Accuracy(task='binary')"`` must be the name of a
:class:`torchmetrics.Metric` subclass exported by TorchMetrics (top level or a public sub-package), called with
literal arguments only; a wrapper's base metric is a nested specification (``"MinMaxMetric(MeanSquaredError())"``).

Example:
    >>> from torchmetrics_syncfree.tools.audit import audit
    >>> [row] = audit(["MeanMetric()"], inputs="loss")
    >>> row.counts("stock")["update"] >= 1, row.counts("patched")["update"]
    (True, 0)

"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import operator
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning_utilities.core.imports import compare_version

from torchmetrics_syncfree import _registry
from torchmetrics_syncfree.probe import SyncEvent, SyncProbe

CALLS = ("update", "forward", "compute")
MODES = ("stock", "patched")
#: Where metric names given to ``--metric`` are looked up (public TorchMetrics namespaces only).
NAMESPACES = (
    "torchmetrics",
    "torchmetrics.aggregation",
    "torchmetrics.classification",
    "torchmetrics.regression",
    "torchmetrics.retrieval",
    "torchmetrics.segmentation",
    "torchmetrics.clustering",
    "torchmetrics.nominal",
    "torchmetrics.wrappers",
    "torchmetrics.image",
    "torchmetrics.text",
    "torchmetrics.audio",
    "torchmetrics.detection",
    "torchmetrics.multimodal",
    "torchmetrics.shape",
)
BATCH = 32
NUM_CLASSES = 5
NUM_LABELS = 4
#: positions per sample of the multiclass sequence inputs (ExactMatch)
SEQUENCE = 4
#: outputs of the multi-output regression inputs, and the size of the distributions KLDivergence compares
OUTPUTS = 3
#: image inputs (PeakSignalNoiseRatio, GeneralizedDiceScore): channels and side; text inputs (Perplexity): the length
#: of a sequence and the vocabulary
CHANNELS, SIDE = 3, 16
SEQUENCE_LENGTH, VOCABULARY = 8, 100
#: documents per query of the retrieval inputs (a batch of BATCH documents: 4 queries)
RETRIEVAL_DOCS = 8


# ----------------------------------------------------------------------------------------------- specifications


class SpecError(ValueError):
    """A metric specification that is not ``Name(literal args)`` of a TorchMetrics metric."""


def _metric_base() -> type:
    from torchmetrics import Metric

    return Metric


def resolve_metric_class(name: str) -> type:
    """The TorchMetrics metric class (or task wrapper) called ``name`` in one of :data:`NAMESPACES`."""
    for namespace in NAMESPACES:
        try:
            module = importlib.import_module(namespace)
        except ImportError:  # optional sub-packages may need extras
            continue
        exported = getattr(module, "__all__", None)
        if exported is not None and name not in exported:
            continue
        cls = getattr(module, name, None)
        # a deprecated top-level alias (``torchmetrics.PeakSignalNoiseRatio`` is ``_PeakSignalNoiseRatio``, which
        # warns) is skipped for the sub-package's own class
        if isinstance(cls, type) and issubclass(cls, _metric_base()) and cls.__name__ == name:
            return cls
    raise SpecError(f"{name!r} is not a metric exported by torchmetrics (looked in {', '.join(NAMESPACES)})")


def parse_spec(spec: str) -> tuple[type, tuple[Any, ...], dict[str, Any]]:
    """Split ``"Name(arg, key=value)"`` into the metric class and literal arguments, without evaluating code.

    Example:
        >>> cls, args, kwargs = parse_spec("Accuracy(task='multiclass', num_classes=3)")
        >>> cls.__name__, args, kwargs
        ('Accuracy', (), {'task': 'multiclass', 'num_classes': 3})
        >>> parse_spec("__import__('os').system('true')")
        Traceback (most recent call last):
        ...
        torchmetrics_syncfree.tools.audit.SpecError: ...

    """
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as err:
        raise SpecError(f"{spec!r} is not of the form Name(arg=value, ...): {err.msg}") from None
    if isinstance(node, ast.Name):
        return resolve_metric_class(node.id), (), {}
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise SpecError(f"{spec!r}: expected a metric name, optionally called with literal arguments")
    if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
        raise SpecError(f"{spec!r}: *args and **kwargs are not allowed")
    try:
        args = tuple(_argument(arg) for arg in node.args)
        kwargs = {kw.arg: _argument(kw.value) for kw in node.keywords if kw.arg is not None}
    except ValueError:
        raise SpecError(f"{spec!r}: arguments must be Python literals (numbers, strings, None, tuples, ...)") from None
    return resolve_metric_class(node.func.id), args, kwargs


@dataclass(frozen=True)
class _Nested:
    """A metric specification inside another's arguments (a wrapper's base metric), built with the wrapper."""

    spec: str


def _argument(node: ast.expr) -> Any:
    """A literal, or (for wrappers such as ``MinMaxMetric(MeanSquaredError())``) a nested metric specification.

    A dict with literal keys may hold nested specifications as values (``MultitaskWrapper({'a': MeanMetric()})``).
    """
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        nested = ast.unparse(node)
        parse_spec(nested)  # the same rules, all the way down
        return _Nested(nested)
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        return {ast.literal_eval(key): _argument(value) for key, value in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _built(arg: Any) -> Any:
    if isinstance(arg, _Nested):
        return build_metric(arg.spec)
    if isinstance(arg, dict):
        return {key: _built(value) for key, value in arg.items()}
    return arg


def build_metric(spec: str) -> Any:
    """A new metric instance as the specification ``spec`` describes it (parsed with :func:`parse_spec`)."""
    cls, args, kwargs = parse_spec(spec)
    return cls(*(_built(arg) for arg in args), **{key: _built(value) for key, value in kwargs.items()})


# ----------------------------------------------------------------------------------------------- inputs


def _family(metric: Any) -> str:
    from torchmetrics.aggregation import BaseAggregator

    if isinstance(metric, BaseAggregator):
        return "vector"
    name = type(metric).__name__
    if name == "MulticlassExactMatch":  # a match is a whole sequence of labels: target (N, T)
        return "sequence"
    for prefix in ("Binary", "Multiclass", "Multilabel"):
        if name.startswith(prefix):
            return prefix.lower()
    if name == "KLDivergence":  # two distributions per sample: (N, d)
        return "distribution"
    if type(metric).__module__.startswith("torchmetrics.regression"):
        return "regression"
    if name == "MinMaxMetric":  # a wrapper is updated as its base metric
        return _family(metric._base_metric)
    if name == "PeakSignalNoiseRatio":
        return "image"
    if name == "Perplexity":
        return "text"
    if name == "GeneralizedDiceScore":
        return "segmentation"
    if type(metric).__module__.startswith("torchmetrics.retrieval"):
        return "retrieval"
    raise SpecError(
        f"cannot make inputs for {name}: the audit knows aggregators, Binary*/Multiclass*/Multilabel* classification"
        " metrics (task wrappers included) and regression metrics"
    )


def make_inputs(
    kind: str, metric: Any, device: torch.device, seed: int = 0, batch: int = BATCH
) -> tuple[tuple[Any, ...], dict]:
    """Update arguments of one input ``kind`` for ``batch`` samples (``"auto"``: the kind of the metric's family)."""
    if kind == "auto":
        kind = _family(metric)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen).to(device)

    def randint(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=gen).to(device)

    if kind == "vector":
        return (rand(batch),), {}
    if kind == "loss":
        return (torch.rand((), generator=gen).to(device),), {}
    if kind == "float":
        return (0.25,), {}
    if kind == "weighted":
        return (rand(batch),), {"weight": rand(batch)}
    if kind == "binary":
        return (rand(batch), randint(2, batch)), {}
    if kind == "multiclass":
        classes = int(metric.num_classes)
        return (rand(batch, classes).softmax(-1), randint(classes, batch)), {}
    if kind == "sequence":
        classes = int(metric.num_classes)
        return (rand(batch, classes, SEQUENCE).softmax(1), randint(classes, batch, SEQUENCE)), {}
    if kind == "multilabel":
        labels = int(metric.num_labels)
        return (rand(batch, labels), randint(2, batch, labels)), {}
    if kind == "regression":
        return (rand(batch), rand(batch)), {}
    if kind == "multioutput":
        return (rand(batch, OUTPUTS), rand(batch, OUTPUTS)), {}
    if kind == "distribution":
        return (rand(batch, OUTPUTS), rand(batch, OUTPUTS)), {}
    if kind == "image":
        return (rand(batch, CHANNELS, SIDE, SIDE), rand(batch, CHANNELS, SIDE, SIDE)), {}
    if kind == "text":  # logits; with ``ignore_index``, about a tenth of the positions ignored
        target = randint(VOCABULARY, batch, SEQUENCE_LENGTH)
        if metric.ignore_index is not None:
            target = target.masked_fill(rand(batch, SEQUENCE_LENGTH) < 0.1, metric.ignore_index)
        return (torch.randn(batch, SEQUENCE_LENGTH, VOCABULARY, generator=gen).to(device), target), {}
    if kind == "segmentation":  # labels, one-hot encoded unless the metric takes indices
        classes = int(metric.num_classes)
        preds, target = randint(classes, batch, SIDE, SIDE), randint(classes, batch, SIDE, SIDE)
        if metric.input_format == "index":
            return (preds, target), {}
        return tuple(torch.nn.functional.one_hot(x, classes).movedim(-1, 1) for x in (preds, target)), {}
    if kind == "retrieval":  # RETRIEVAL_DOCS documents per query; larger batches: 32 queries of batch // 32 documents
        docs = RETRIEVAL_DOCS if batch <= 32 * RETRIEVAL_DOCS else batch // 32
        indexes = torch.arange(batch, device=device) // docs + seed * batch
        return (rand(batch), randint(2, batch)), {"indexes": indexes}
    raise ValueError(f"unknown input kind {kind!r}")


#: How the update arguments of each input kind read in a table.
CALL_TEXT = {
    "vector": "update(x)",
    "loss": "update(loss)",
    "float": "update(0.25)",
    "weighted": "update(x, weight=w)",
    "binary": "update(preds, target)",
    "multiclass": "update(preds, target)",
    "multilabel": "update(preds, target)",
    "sequence": "update(preds, target)",
    "regression": "update(preds, target)",
    "multioutput": f"update(preds, target) x {OUTPUTS} outputs",
    "distribution": "update(p, q)",
    "image": "update(preds, target)",
    "text": "update(preds, target)",
    "segmentation": "update(preds, target)",
    "retrieval": "update(preds, target, indexes=indexes)",
}


# ----------------------------------------------------------------------------------------------- the catalogue


#: modules of the metrics built on ``*ConfusionMatrix``, whose update and compute the ``confusion_matrix`` area patches
_CONFUSION_MATRIX_MODULES = {
    f"torchmetrics.classification.{name}"
    for name in ("confusion_matrix", "cohen_kappa", "jaccard", "matthews_corrcoef")
}


#: modules of classification metrics that are a patch area of their own, named as the module
#: modules patched by an area of their own name (AUROC and AveragePrecision: their compute; the update is the curve's,
#: whose area theirs requires)
_OWN_AREA_MODULES = {
    f"torchmetrics.classification.{name}" for name in ("hinge", "exact_match", "auroc", "average_precision", "logauc")
}
#: modules of the metrics built on ``*PrecisionRecallCurve``, whose update the ``precision_recall_curve`` area patches
_CURVE_MODULES = {f"torchmetrics.classification.{name}" for name in ("precision_recall_curve", "roc")}
#: modules of the retrieval metrics -> the area that patches them (the base class's update and compute; FallOut's own
#: compute); RetrievalPrecisionRecallCurve/RecallAtFixedPrecision have their own update and are not patched
_RETRIEVAL_MODULES = {
    **{
        f"torchmetrics.retrieval.{name}": "retrieval"
        for name in ("reciprocal_rank", "hit_rate", "precision", "recall", "average_precision", "ndcg", "r_precision")
    },
    "torchmetrics.retrieval.fall_out": "retrieval_fall_out",
}
#: modules outside classification patched by an area of their own -> the area's name
_MODULE_AREAS = {
    **{
        f"torchmetrics.regression.{name}": name
        for name in ("r2", "explained_variance", "pearson", "kl_divergence", "spearman")
    },
    "torchmetrics.wrappers.minmax": "minmax",
    "torchmetrics.image.psnr": "psnr",
    "torchmetrics.text.perplexity": "perplexity",
    "torchmetrics.segmentation.generalized_dice": "generalized_dice",
    **_RETRIEVAL_MODULES,
}


@dataclass(frozen=True)
class Config:
    """One audited configuration: a metric specification and the kind of input it is updated with."""

    spec: str
    inputs: str = "auto"

    @property
    def label(self) -> str:
        """How the configuration reads in a table: the spec, plus the update call unless the inputs are ``auto``."""
        return self.spec if self.inputs == "auto" else f"{self.spec} {CALL_TEXT[self.inputs]}"

    @property
    def area(self) -> str:
        """The patch area (see :func:`torchmetrics_syncfree._registry.register_area`) that covers this metric."""
        cls = parse_spec(self.spec)[0]
        module = cls.__module__
        # deprecated top-level retrieval classes (``torchmetrics.RetrievalMRR``) subclass the retrieval modules' ones
        module = next((c.__module__ for c in cls.__mro__ if c.__module__ in _RETRIEVAL_MODULES), module)
        if module in _CONFUSION_MATRIX_MODULES:
            return "confusion_matrix"
        if module in _CURVE_MODULES:
            return "precision_recall_curve"
        if module in _OWN_AREA_MODULES:
            return module.rsplit(".", 1)[-1]
        if module in _MODULE_AREAS:
            return _MODULE_AREAS[module]
        for area in ("aggregation", "classification", "regression"):
            if module.startswith(f"torchmetrics.{area}"):
                return area
        return module

    @property
    def covered(self) -> bool:
        """Whether the patch declares this metric's area sync-free (its ``update``/``forward`` must not sync)."""
        return self.area in registered_areas()


def registered_areas() -> list[str]:
    """The patch areas :func:`torchmetrics_syncfree.patch_all` installs."""
    return _registry.registered_areas()


def _nan_strategies() -> list[Any]:
    strategies: list[Any] = ["error", "warn", "ignore"]
    if compare_version("torchmetrics", operator.ge, "1.7.0"):
        strategies.append("disable")
    return [*strategies, 0.0]


def catalogue(num_classes: int = NUM_CLASSES, num_labels: int = NUM_LABELS) -> list[Config]:
    """Common metric configurations for the installed TorchMetrics release (classification at the given sizes)."""
    NUM_CLASSES, NUM_LABELS = num_classes, num_labels
    configs = [
        Config("MeanMetric()", "loss"),
        Config("MeanMetric()", "float"),
        Config("MeanMetric()", "weighted"),
        Config("SumMetric()", "loss"),
    ]
    for name in ("MeanMetric", "SumMetric", "MaxMetric", "MinMetric", "CatMetric"):
        configs += [Config(f"{name}(nan_strategy={strategy!r})", "vector") for strategy in _nan_strategies()]
    configs.append(Config("Accuracy(task='binary')"))
    configs.append(Config("F1Score(task='binary')"))
    for name in ("Accuracy", "Precision", "Recall", "F1Score"):
        for average in ("micro", "macro", "weighted", "none"):
            configs.append(Config(f"{name}(task='multiclass', num_classes={NUM_CLASSES}, average={average!r})"))
    for average in ("micro", "macro"):
        configs.append(Config(f"Accuracy(task='multilabel', num_labels={NUM_LABELS}, average={average!r})"))
    configs.append(Config(f"F1Score(task='multilabel', num_labels={NUM_LABELS}, average='macro')"))
    configs.append(Config("ConfusionMatrix(task='binary')"))
    for normalize in (None, "true"):
        configs.append(
            Config(f"ConfusionMatrix(task='multiclass', num_classes={NUM_CLASSES}, normalize={normalize!r})")
        )
    configs.append(Config(f"ConfusionMatrix(task='multilabel', num_labels={NUM_LABELS})"))
    configs.append(Config(f"CohenKappa(task='multiclass', num_classes={NUM_CLASSES})"))
    configs.append(Config(f"JaccardIndex(task='multiclass', num_classes={NUM_CLASSES}, average='macro')"))
    configs.append(Config(f"MatthewsCorrCoef(task='multiclass', num_classes={NUM_CLASSES})"))
    for thresholds in (None, 100):
        configs.append(Config(f"AUROC(task='binary', thresholds={thresholds})"))
        configs.append(Config(f"AUROC(task='multiclass', num_classes={NUM_CLASSES}, thresholds={thresholds})"))
        configs.append(Config(f"AveragePrecision(task='multilabel', num_labels={NUM_LABELS}, thresholds={thresholds})"))
    configs.append(Config("AUROC(task='binary', max_fpr=0.5)"))
    configs.append(Config(f"LogAUC(task='multiclass', num_classes={NUM_CLASSES}, average='macro')"))
    configs.append(Config(f"AveragePrecision(task='multiclass', num_classes={NUM_CLASSES}, average='weighted')"))
    configs.append(Config(f"PrecisionRecallCurve(task='multiclass', num_classes={NUM_CLASSES}, thresholds=100)"))
    configs.append(Config("ROC(task='binary', thresholds=100)"))
    configs.append(Config("HingeLoss(task='binary')"))
    for mode in ("crammer-singer", "one-vs-all"):
        configs.append(Config(f"HingeLoss(task='multiclass', num_classes={NUM_CLASSES}, multiclass_mode={mode!r})"))
    configs.append(Config(f"ExactMatch(task='multiclass', num_classes={NUM_CLASSES})"))
    configs.append(Config(f"ExactMatch(task='multilabel', num_labels={NUM_LABELS})"))
    configs += [Config(f"{name}()") for name in ("MeanSquaredError", "MeanAbsoluteError", "R2Score")]
    # the regression metrics whose forward/compute (KLDivergence: update) read the device
    configs.append(Config("R2Score(multioutput='raw_values')", "multioutput"))
    configs.append(Config("R2Score(adjusted=2)"))
    configs.append(Config("ExplainedVariance()"))
    configs.append(Config("ExplainedVariance(multioutput='variance_weighted')", "multioutput"))
    configs.append(Config("PearsonCorrCoef()"))
    configs.append(Config(f"PearsonCorrCoef(num_outputs={OUTPUTS})", "multioutput"))
    for spec in ("KLDivergence()", "KLDivergence(reduction='none')", "KLDivergence(log_prob=True)"):
        configs.append(Config(spec))
    configs.append(Config("SpearmanCorrCoef()"))
    configs.append(Config(f"SpearmanCorrCoef(num_outputs={OUTPUTS})", "multioutput"))
    # a wrapper, an image, a text and a segmentation metric
    configs.append(Config("MinMaxMetric(MeanSquaredError())"))
    configs.append(Config("PeakSignalNoiseRatio(data_range=1.0)"))
    configs.append(Config("PeakSignalNoiseRatio(data_range=(0.0, 1.0), dim=(1, 2, 3), reduction='none')"))
    configs += [Config(f"Perplexity(ignore_index={ignore_index})") for ignore_index in (None, -100)]
    configs.append(Config(f"GeneralizedDiceScore(num_classes={NUM_CLASSES})"))
    configs.append(Config(f"GeneralizedDiceScore(num_classes={NUM_CLASSES}, input_format='index', per_class=True)"))
    configs += [Config(spec) for spec in _RETRIEVAL_CATALOGUE]
    return configs


#: the retrieval rows of the catalogue
_RETRIEVAL_CATALOGUE = (
    "RetrievalMRR()",
    "RetrievalHitRate(top_k=3)",
    "RetrievalPrecision(top_k=3)",
    "RetrievalRecall(top_k=3)",
    "RetrievalMAP()",
    "RetrievalNormalizedDCG()",
    "RetrievalRPrecision()",
    "RetrievalFallOut(top_k=3)",
    "RetrievalMRR(ignore_index=-1, aggregation='median')",
)

CATALOGUE: tuple[Config, ...] = tuple(catalogue())


# ----------------------------------------------------------------------------------------------- measuring


@dataclass
class Result:
    """The sync events of ``update``, ``forward`` and ``compute`` of one configuration, stock and patched."""

    config: Config
    events: dict[str, dict[str, list[SyncEvent]]] = field(default_factory=dict)  # mode -> call -> events
    errors: dict[str, str] = field(default_factory=dict)  # mode -> error text, if the metric could not run

    def counts(self, mode: str) -> dict[str, int]:
        """Number of sync events per probed call in ``mode`` (``"stock"`` or ``"patched"``)."""
        return {call: len(events) for call, events in self.events.get(mode, {}).items()}

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data: configuration, area, counts, errors and every event."""
        return {
            "config": self.config.label,
            "spec": self.config.spec,
            "inputs": self.config.inputs,
            "area": self.config.area,
            "covered_by_patch": self.config.covered,
            "counts": {mode: self.counts(mode) for mode in self.events},
            "errors": self.errors,
            "events": {
                mode: {
                    call: [{"kind": e.kind, "op": e.op, "location": e.location, "source": e.source} for e in events]
                    for call, events in calls.items()
                }
                for mode, calls in self.events.items()
            },
        }


def _require_stock() -> None:
    active = _registry.patched_targets()
    if active:
        raise RuntimeError(
            f"the audit compares against stock TorchMetrics, but {len(active)} targets are patched; call"
            " torchmetrics_syncfree.unpatch_all() first"
        )


def _mode(mode: str) -> contextlib.AbstractContextManager:
    return _registry.patched() if mode == "patched" else contextlib.nullcontext()


def probe_calls(config: Config, device: torch.device) -> dict[str, list[SyncEvent]]:
    """Build the metric (under whatever patch state is active) and probe each call once, in steady state."""
    metric = build_metric(config.spec).to(device)
    args, kwargs = make_inputs(config.inputs, metric, device)
    metric.update(*args, **kwargs)  # warm-up: first-update effects are not what a training loop pays per step
    events = {}
    with SyncProbe(device) as probe:
        metric.update(*args, **kwargs)
    events["update"] = probe.events
    with SyncProbe(device) as probe:
        metric(*args, **kwargs)
    events["forward"] = probe.events
    with SyncProbe(device) as probe:
        metric.compute()
    events["compute"] = probe.events
    return events


def audit_config(config: Config, device: torch.device | str = "cpu") -> Result:
    """Probe one configuration stock, then patched; a mode in which the metric fails records its error instead."""
    device = torch.device(device)
    result = Result(config)
    for mode in MODES:
        with _mode(mode):
            try:
                result.events[mode] = probe_calls(config, device)
            except Exception as err:
                result.errors[mode] = f"{type(err).__name__}: {err}"
    return result


def audit(
    specs: Sequence[str] | None = None,
    *,
    inputs: str = "auto",
    device: torch.device | str = "cpu",
    include_catalogue: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Result]:
    """Audit the given metric specifications (and/or the catalogue); stock TorchMetrics must be active."""
    _require_stock()
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device {device}: torch {torch.__version__} sees no CUDA device")
    _registry._load_areas()
    configs = [Config(spec, inputs) for spec in specs or ()]
    for config in configs:
        parse_spec(config.spec)  # fail on a bad spec before measuring anything
    if include_catalogue or not configs:
        configs = list(CATALOGUE) + configs
    results = []
    for index, config in enumerate(configs):
        if progress is not None:
            progress(index, len(configs), config.label)
        results.append(audit_config(config, device))
    return results


# ----------------------------------------------------------------------------------------------- launches

#: class counts of the launch audit (``--launches``): the sizes users have
LAUNCH_CLASSES = (10, 1000)
LAUNCH_CALLS = ("update", "forward")


@dataclass
class LaunchResult:
    """Kernel launches of one ``update`` and one ``forward`` (steady state), stock vs the patched device path."""

    config: Config
    classes: int
    launches: dict[str, dict[str, int]] = field(default_factory=dict)  # mode -> call -> launches
    ops: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # mode -> call -> op -> launches

    def budget(self, call: str) -> int:
        """The most launches the patched ``call`` may take: the larger of 1.25x stock's and stock's + 4."""
        stock = self.launches["stock"][call]
        return max(int(stock * 1.25), stock + 4)

    def over_budget(self, call: str) -> bool:
        """Whether the patched ``call`` launches more than :meth:`budget` allows."""
        return self.launches["patched"][call] > self.budget(call)


def _count_call_launches(config: Config) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    from torchmetrics_syncfree.tools.launches import count_launches

    metric = build_metric(config.spec)
    args, kwargs = make_inputs(config.inputs, metric, torch.device("cpu"))
    metric.update(*args, **kwargs)  # warm-up: first-update effects are not what a training loop pays per step
    counts, ops = {}, {}
    counts["update"], update_ops = count_launches(metric.update, *args, **kwargs)
    counts["forward"], forward_ops = count_launches(metric, *args, **kwargs)
    ops["update"], ops["forward"] = dict(update_ops), dict(forward_ops)
    return counts, ops


def launch_audit(
    class_counts: Sequence[int] = LAUNCH_CLASSES, specs: Sequence[str] = (), include_catalogue: bool = False
) -> list[LaunchResult]:
    """Launches per ``update``/``forward`` of ``specs`` (default: the catalogue at each class count), stock vs patched.

    Patched is the device path (what a GPU runs: ``force_device_path``) with the check counters' host copy still in
    flight (a GPU a step behind: the end-of-update sweep launches no copy while one is under way). Stock TorchMetrics
    must be active.
    """
    from torchmetrics_syncfree import _instrumentation

    _require_stock()
    _registry._load_areas()
    for spec in specs:
        parse_spec(spec)  # fail on a bad spec before measuring anything
    results = [LaunchResult(Config(spec), 0) for spec in specs]
    if include_catalogue or not specs:
        results += [LaunchResult(config, classes) for classes in class_counts for config in catalogue(classes, classes)]
    for mode in MODES:
        with _mode(mode), _instrumentation.simulated_copy_delay(None):
            _instrumentation.force_device_path(mode == "patched")
            try:
                for result in results:
                    result.launches[mode], result.ops[mode] = _count_call_launches(result.config)
            finally:
                _instrumentation.force_device_path(False)
    return results


def format_launch_table(results: Sequence[LaunchResult]) -> str:
    """One row per configuration and class count; totals per call; ``!`` marks a patched call over its budget."""
    width = max(len(r.config.label) for r in results)
    lines = [f"{'configuration':<{width}}  classes  update stock/patched  forward stock/patched"]
    for r in results:
        cells = []
        for call in LAUNCH_CALLS:
            stock, patched = r.launches["stock"][call], r.launches["patched"][call]
            cells.append(f"{stock:>6} /{patched:>4}{' !' if r.over_budget(call) else '  '}")
        lines.append(f"{r.config.label:<{width}}  {r.classes:>7}  {cells[0]:<20}  {cells[1]}")
    for call in LAUNCH_CALLS:
        stock = sum(r.launches["stock"][call] for r in results)
        patched = sum(r.launches["patched"][call] for r in results)
        more = sum(r.launches["patched"][call] > r.launches["stock"][call] for r in results)
        over = sum(r.over_budget(call) for r in results)
        lines.append(
            f"{call}: {stock} launches stock, {patched} patched ({patched / stock:.2f}x); {more} of {len(results)}"
            f" configurations launch more than stock, {over} over the budget (max(1.25x, +4))"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- reporting


def short_location(location: str) -> str:
    """``.../site-packages/torchmetrics/aggregation.py:93`` -> ``torchmetrics/aggregation.py:93``."""
    for package in ("torchmetrics_syncfree", "torchmetrics", "torch"):
        marker = f"{os.sep}{package}{os.sep}"
        if marker in location:
            return package + os.sep + location.rsplit(marker, 1)[1]
    return location


def _cell(result: Result, mode: str, call: str) -> str:
    if mode in result.errors:
        return "err"
    return str(result.counts(mode).get(call, "-"))


def format_table(results: Sequence[Result]) -> str:
    """A text table of sync counts per call, stock vs patched, one row per configuration."""
    width = max([len("configuration"), *(len(r.config.label) for r in results)])
    head1 = " " * width + "  " + "  ".join(f"{call:<15}" for call in CALLS)
    head2 = (
        f"{'configuration':<{width}}  " + "  ".join(f"{'stock':>6} {'patched':>8}" for _ in CALLS) + "  sync-free area"
    )
    lines = [head1.rstrip(), head2, "-" * len(head2)]
    for r in results:
        cells = "  ".join(f"{_cell(r, 'stock', c):>6} {_cell(r, 'patched', c):>8}" for c in CALLS)
        lines.append(f"{r.config.label:<{width}}  {cells}  {r.config.area if r.config.covered else '-'}")
    return "\n".join(lines)


def _grouped(events: Sequence[SyncEvent]) -> Iterator[tuple[int, SyncEvent]]:
    counts = Counter((e.kind, e.op, e.location) for e in events)
    seen = set()
    for event in events:
        key = (event.kind, event.op, event.location)
        if key not in seen:
            seen.add(key)
            yield counts[key], event


def format_sources(results: Sequence[Result]) -> str:
    """Every distinct sync source per configuration, mode and call, with its line of code."""
    lines = []
    for r in results:
        block = []
        for mode in MODES:
            if mode in r.errors:
                block.append(f"  {mode:<8} could not run: {r.errors[mode]}")
                continue
            for call in CALLS:
                for n, event in _grouped(r.events[mode][call]):
                    block.append(f"  {mode:<8} {call:<8} {n}x {event.kind:<21} {short_location(event.location)}")
                    if event.source:
                        block.append(f"  {'':<8} {'':<8}    {event.source}")
        if block:
            lines += [r.config.label, *block]
    return "\n".join(lines) if lines else "no would-be syncs anywhere"


def report(results: Sequence[Result], device: torch.device | str = "cpu") -> str:
    """The text report: a header (versions, device, sync-free areas), the count table and the sync sources."""
    import torchmetrics

    kind = (
        "real syncs (torch.cuda.set_sync_debug_mode)"
        if torch.device(device).type == "cuda"
        else "would-be syncs (CPU probe)"
    )
    header = (
        f"torchmetrics {torchmetrics.__version__} | torch {torch.__version__} | device {device} | {kind} per call,"
        f" steady state | sync-free areas: {', '.join(registered_areas())}"
    )
    return "\n\n".join([header, format_table(results), "Where they come from:\n" + format_sources(results)])


def to_json(results: Sequence[Result], device: torch.device | str = "cpu") -> str:
    """The results as indented JSON, with the torch and TorchMetrics versions, the device and sync-free areas."""
    import torchmetrics

    payload = {
        "torchmetrics": torchmetrics.__version__,
        "torch": torch.__version__,
        "device": str(device),
        "sync_free_areas": registered_areas(),
        "results": [r.as_dict() for r in results],
    }
    return json.dumps(payload, indent=2)


def patched_syncs(
    results: Sequence[Result], calls: Sequence[str] = ("update", "forward"), only_covered: bool = False
) -> list[str]:
    """Labels of configurations whose patched ``calls`` still sync (or fail); ``--strict`` rejects any."""
    bad = []
    for r in results:
        if only_covered and not r.config.covered:
            continue
        if "patched" in r.errors or any(r.counts("patched").get(call, 0) for call in calls):
            bad.append(r.config.label)
    return bad
