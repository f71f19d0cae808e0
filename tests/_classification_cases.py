"""Configurations and random batches shared by the classification sync and parity tests."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe, _deferred, probe

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
#: devices of the parity and sync tests; CUDA is marked and skipped without a GPU
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, cuda])]

NUM_CLASSES = 6
#: classes ``ABSENT`` and up never occur in preds or target of the default batches: zero division in compute()
ABSENT = 4
METRICS = ("Accuracy", "Precision", "Recall", "F1Score", "FBetaScore", "Specificity", "StatScores")
TASK_AVERAGES = (
    ("binary", "micro"),
    *(("multiclass", a) for a in ("micro", "macro", "weighted", "none")),
    *(("multilabel", a) for a in ("micro", "macro", "weighted", "none")),
)
#: ignore_index values per task: outside the labels, and (multiclass) one of the classes
IGNORE = {"binary": (None, -1), "multiclass": (None, -1, 1), "multilabel": (None, -1)}


def make_metric(name: str, task: str, average: str, ignore_index: int | None = None, **kwargs: Any) -> Any:
    """A task metric with the given configuration (``average`` is ignored for binary)."""
    args: dict[str, Any] = {"task": task, "ignore_index": ignore_index, **kwargs}
    if task == "multiclass":
        args["num_classes"] = NUM_CLASSES
    if task == "multilabel":
        args["num_labels"] = NUM_CLASSES
    if task != "binary":
        args["average"] = average
    if name == "FBetaScore":
        args["beta"] = 2.0
    return getattr(torchmetrics, name)(**args)


def _ignore(target: Tensor, ignore_index: int | None, gen: torch.Generator, p: float = 0.25) -> Tensor:
    if ignore_index is None:
        return target
    return target.masked_fill(torch.rand(target.shape, generator=gen) < p, ignore_index)


def batches(task: str, ignore_index: int | None, seed: int, n: int = 16) -> list[tuple[Tensor, Tensor]]:
    """Random valid batches: probabilities, logits and labels, extra dimensions, a batch with only class/label 0,
    and (with ``ignore_index``) a batch whose targets are all ignored."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(5):
        extra = (3,) if i == 3 else ()
        if task == "binary":
            preds: Tensor = torch.rand((n, *extra), generator=gen)
            if i == 1:
                preds = torch.randn((n, *extra), generator=gen) * 3  # logits
            if i == 2:
                preds = torch.randint(0, 2, (n, *extra), generator=gen)
            target = torch.randint(0, 2, (n, *extra), generator=gen)
            if i == 4:
                target = torch.zeros_like(target)
        elif task == "multiclass":
            logits = torch.randn((n, NUM_CLASSES, *extra), generator=gen)
            logits[:, ABSENT:] = -1e4  # never predicted
            preds = logits.softmax(1) if i == 0 else logits
            if i == 2:
                preds = logits.argmax(1)
            target = torch.randint(0, ABSENT, (n, *extra), generator=gen)
            if i == 4:
                target = torch.zeros_like(target)
        else:
            preds = torch.rand((n, NUM_CLASSES, *extra), generator=gen)
            if i == 1:
                preds = torch.randn((n, NUM_CLASSES, *extra), generator=gen) * 3
            if i == 2:
                preds = torch.randint(0, 2, (n, NUM_CLASSES, *extra), generator=gen)
            target = torch.randint(0, 2, (n, NUM_CLASSES, *extra), generator=gen)
            target[:, ABSENT:] = 0  # labels that are never positive
            if i == 4:
                target = torch.zeros_like(target)
        out.append((preds, _ignore(target, ignore_index, gen)))
    if ignore_index is not None:
        preds, target = out[0]
        out.append((preds, torch.full_like(target, ignore_index)))
    return out


def configs(metrics: tuple[str, ...] = METRICS) -> list[tuple[str, str, str, int | None]]:
    """(metric name, task, average, ignore_index) for every combination."""
    return [
        (name, task, average, ignore_index)
        for name in metrics
        for task, average in TASK_AVERAGES
        for ignore_index in IGNORE[task]
    ]


def config_id(config: tuple[Any, ...]) -> str:
    return "-".join(str(part) for part in config)


def pending_checks(metric: Any) -> int:
    """Offending updates of ``metric`` not reported yet: the sum of its check counters (the same metric state in the
    layer and in the series)."""
    counters = getattr(metric, _deferred.STATE, None)
    with probe.quiet():  # the test's own look at the counters
        return 0 if counters is None else int(counters.sum())


#: "cpu": the patched code's CPU path (free host reads: cheaper CPU-only counting and validation); "device": the
#: path a GPU takes, simulated on CPU by a SyncProbe. Both must give stock's values.
PATHS = ["cpu", "device"]


Case = tuple[Callable[[], Any], list[tuple[Tensor, Tensor]]]


def run_case(make: Callable[[], Any], data: list[tuple[Tensor, Tensor]], device: str) -> list[Tensor]:
    """forward() of every batch and compute() after them, then compute() after plain update()s."""
    metric = make().to(device)
    out = [metric(preds.to(device), target.to(device)) for preds, target in data]
    out.append(metric.compute())
    other = make().to(device)
    for preds, target in data:
        other.update(preds.to(device), target.to(device))
    out.append(other.compute())
    return [value.cpu() for value in out]


def assert_identical(stock: list[Tensor], patched: list[Tensor], label: str = "", rtol: float = 0.0) -> None:
    """Same dtypes, shapes and values (to the bit unless ``rtol``: a documented change of summation order)."""
    assert len(stock) == len(patched)
    for i, (s, p) in enumerate(zip(stock, patched)):
        where = f"{label} value {i}"
        assert (p.dtype, p.shape) == (s.dtype, s.shape), (
            f"{where}: {p.dtype}{tuple(p.shape)} vs {s.dtype}{tuple(s.shape)}"
        )
        torch.testing.assert_close(p, s, rtol=rtol, atol=0, equal_nan=True, msg=lambda m, where=where: f"{where}: {m}")


class Combining:
    """A metric whose ``forward``/``compute`` results (tuples, lists) come back as one tensor, ``combine(result)``:
    for ``parity``, which compares tensors."""

    def __init__(self, metric: Any, combine: Callable[[Any], Tensor]) -> None:
        self.metric = metric
        self.combine = combine

    def to(self, device: str) -> Combining:
        self.metric = self.metric.to(device)
        return self

    def __call__(self, *args: Any) -> Tensor:
        return self.combine(self.metric(*args))

    def update(self, *args: Any) -> None:
        self.metric.update(*args)

    def compute(self) -> Tensor:
        return self.combine(self.metric.compute())


def parity(
    cases: dict[str, Case],
    device: str = "cpu",
    path: str = "cpu",
    documented: Callable[[Tensor], Tensor] | None = None,
    rtol: Callable[[str], float] | None = None,
) -> None:
    """Run every case stock, then patched (one patch cycle for all: patching is the slow part), and compare.

    ``path="device"`` runs the patched metrics inside a CPU SyncProbe, so they take their GPU code path.
    ``documented`` maps a stock value to the one a documented deviation gives instead; ``rtol`` gives the relative
    tolerance of a case (by label) whose float sums are documented to run in another order.
    """
    stock = {label: run_case(make, data, device) for label, (make, data) in cases.items()}
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = {label: run_case(make, data, device) for label, (make, data) in cases.items()}
    for label in cases:
        expected = stock[label] if documented is None else [documented(value) for value in stock[label]]
        assert_identical(expected, patched[label], label, rtol=0.0 if rtol is None else rtol(label))


def curve_batches(
    task: str, ignore_index: int | None, seed: int, n: int, num_classes: int
) -> list[tuple[Tensor, Tensor]]:
    """Four float32 score batches for the curve metrics: probabilities, logits, ties (rounded scores), an extra
    dimension; multiclass: the last class never occurs (a NaN AveragePrecision in stock); with ``ignore_index`` a
    quarter of the targets ignored."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if task == "binary" else (n, num_classes)
    out = []
    for i in range(4):
        extra = (2,) if i == 3 else ()
        logits = torch.randn((*shape, *extra), generator=gen) * 2
        if task == "multiclass":
            preds = logits if i == 1 else logits.softmax(1)
            target = torch.randint(0, num_classes - 1, (n, *extra), generator=gen)
        else:
            preds = logits if i == 1 else logits.sigmoid()
            target = torch.randint(0, 2, preds.shape, generator=gen)
        if i == 2:
            preds = torch.round(preds * 4) / 4
        if ignore_index is not None:
            target = target.masked_fill(torch.rand(target.shape, generator=gen) < 0.25, ignore_index)
        out.append((preds, target))
    return out


def forward_and_compute_syncs(metric: Any, data: list[tuple[Tensor, Tensor]]) -> dict[str, int]:
    """Would-be syncs of a ``forward`` of the first batch and of a ``compute`` after an update with the second."""
    counts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with SyncProbe() as probe:
            metric(*data[0])
        counts["forward"] = probe.count
        metric.update(*data[1])
        with SyncProbe() as probe:
            metric.compute()
        counts["compute"] = probe.count
    return counts
