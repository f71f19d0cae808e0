"""The fixed-output curve metrics (area ``fixed_point_curves``): PrecisionAtFixedRecall, RecallAtFixedPrecision,
SensitivityAtSpecificity, SpecificityAtSensitivity and EER (torchmetrics 1.7+), every task.

forward() and compute() give stock's values, dtypes, shapes and thresholds to the bit on both patched paths, and make
no would-be sync on the device path; stock's compute warnings reach the user as often as stock emits them.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
import torchmetrics.classification
from torch import Tensor

import torchmetrics_syncfree
from tests._classification_cases import (
    PATHS,
    assert_identical,
    curve_batches,
    forward_and_compute_syncs,
    pending_checks,
)
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.classification.fixed_point_curves import HAS_EER

NUM = 4
#: the task wrappers and their minimum-value arguments (EER has none; it exists from torchmetrics 1.7)
METRICS: dict[str, dict[str, float]] = {
    "PrecisionAtFixedRecall": {"min_recall": 0.5},
    "RecallAtFixedPrecision": {"min_precision": 0.5},
    "SensitivityAtSpecificity": {"min_specificity": 0.5},
    "SpecificityAtSensitivity": {"min_sensitivity": 0.5},
    **({"EER": {}} if HAS_EER else {}),
}
TASKS = ("binary", "multiclass", "multilabel")
#: unbinned; a count; an unordered list; a tensor with a repeated threshold
THRESHOLDS: dict[str, Any] = {
    "None": None,
    "5": 5,
    "list": [0.1, 0.5, 0.3, 0.9],
    "tensor": torch.tensor([0.0, 0.2, 0.5, 0.5, 0.9]),
}


def _make(name: str, task: str, thresholds: Any, ignore_index: int | None = None, **kwargs: Any) -> Any:
    size = {"multiclass": {"num_classes": NUM}, "multilabel": {"num_labels": NUM}}.get(task, {})
    if isinstance(thresholds, Tensor):
        thresholds = thresholds.clone()
    kwargs = {**METRICS[name], **kwargs}
    return getattr(torchmetrics.classification, name)(
        task=task, thresholds=thresholds, ignore_index=ignore_index, **size, **kwargs
    )


def _batches(task: str, ignore_index: int | None, seed: int, n: int = 20) -> list[tuple[Tensor, Tensor]]:
    return curve_batches(task, ignore_index, seed, n, NUM)


def _flat(value: Any) -> list[Tensor]:
    return list(value) if isinstance(value, tuple) else [value]


def _run(make: Any, data: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
    """forward() of every batch and compute() after them, then compute() after plain update()s."""
    metric, out = make(), []
    for preds, target in data:
        out += _flat(metric(preds, target))
    out += _flat(metric.compute())
    other = make()
    for preds, target in data:
        other.update(preds, target)
    return out + _flat(other.compute())


def _parity(cases: dict[str, tuple[Any, list[tuple[Tensor, Tensor]]]], path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = {label: _run(make, data) for label, (make, data) in cases.items()}
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            patched = {label: _run(make, data) for label, (make, data) in cases.items()}
    for label in cases:
        assert_identical(stock[label], patched[label], label)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(METRICS))
def test_parity_with_stock(name: str, path: str) -> None:
    """Every task, thresholds None/int/list/tensor, with and without ``ignore_index``: stock's outputs to the bit."""
    cases = {}
    for task in TASKS:
        for key, thresholds in THRESHOLDS.items():
            for ignore_index in (None, -1):
                label = f"{name}-{task}-thresholds={key}-ignore={ignore_index}"
                make = lambda t=task, th=thresholds, i=ignore_index: _make(name, t, th, i)  # noqa: E731
                cases[label] = make, _batches(task, ignore_index, seed=sum(map(ord, label)))
    _parity(cases, path)


#: minimum values at the edges: every point qualifies (binned 1.8+ curves have NaN precisions there), none does
EDGES = {
    "PrecisionAtFixedRecall": ({"min_recall": 0.0}, {"min_recall": 1.0}),
    # (0.01: at 0, stock's ``_lexargmax`` fails with an IndexError on a NaN recall of a class without positives)
    "RecallAtFixedPrecision": ({"min_precision": 0.01}, {"min_precision": 1.0}),
    "SensitivityAtSpecificity": ({"min_specificity": 0.0}, {"min_specificity": 1.0}),
    "SpecificityAtSensitivity": ({"min_sensitivity": 0.0}, {"min_sensitivity": 1.0}),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(EDGES))
def test_minimum_at_the_edges_and_degenerate_targets(name: str, path: str) -> None:
    """Minimums 0 and 1, targets all negative or all positive (binary), labels never positive/negative (multilabel):
    stock's values and thresholds (NaN, or 1e6 before 1.8 and for the ROC-based metrics, where nothing qualifies)."""
    cases = {}
    for kwargs in EDGES[name]:
        for task in TASKS:
            for key in ("None", "5"):
                label = f"{name}-{task}-{kwargs}-thresholds={key}"
                data = _batches(task, None, seed=sum(map(ord, label)))[:3]
                make = lambda t=task, th=THRESHOLDS[key], kw=kwargs: _make(name, t, th, **kw)  # noqa: E731
                cases[label] = make, data
                if task == "binary":
                    cases[f"{label}-negatives"] = make, [(p, torch.zeros_like(t)) for p, t in data]
                    cases[f"{label}-positives"] = make, [(p, torch.ones_like(t)) for p, t in data]
                if task == "multilabel":
                    cases[f"{label}-degenerate labels"] = (
                        make,
                        [
                            (p, t.index_fill(1, torch.tensor([0]), 0).index_fill(1, torch.tensor([1]), 1))
                            for p, t in data
                        ],
                    )
    _parity(cases, path)


@pytest.mark.parametrize("name", list(METRICS))
def test_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    """0 would-be syncs in forward and compute on the device path: every task, thresholds and ``ignore_index``."""
    for task in TASKS:
        for key, thresholds in THRESHOLDS.items():
            for ignore_index in (None, -1):
                syncs = forward_and_compute_syncs(
                    _make(name, task, thresholds, ignore_index), _batches(task, ignore_index, seed=4)
                )
                assert syncs == {"forward": 0, "compute": 0}, (task, key, ignore_index, syncs)


@pytest.mark.parametrize("name", list(METRICS))
def test_stock_syncs_are_seen(name: str) -> None:
    """The probe sees stock's reads (so the test above can fail): unbinned and binned, forward and compute."""
    for task in TASKS:
        for thresholds in (None, 5):
            syncs = forward_and_compute_syncs(_make(name, task, thresholds), _batches(task, None, seed=4))
            assert syncs["forward"] > 0 and syncs["compute"] > 0, (task, thresholds, syncs)


def _warnings_of(run: Any) -> Counter[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return Counter(str(w.message) for w in caught if "compute" not in str(w.message))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.parametrize("task", ["binary", "multiclass", "multilabel"])
def test_compute_warnings_are_stocks_once_each(path: str, name: str, task: str) -> None:
    """No positives / no negatives: stock's warnings, as many as stock emits; on the device path at the next eager
    point (here ``reset()``), none twice."""
    data = _batches(task, None, seed=11)[:2]
    if task != "multilabel":  # binary: no positives; multiclass: every label 0 (stock's "no positives" quirk)
        data = [(p, torch.zeros_like(t)) for p, t in data]
    else:
        data = [(p, t.index_fill(1, torch.tensor([0]), 0).index_fill(1, torch.tensor([1]), 1)) for p, t in data]
    make = lambda: _make(name, task, None)  # noqa: E731

    def stock_run() -> None:
        metric = make()
        for preds, target in data:
            metric.update(preds, target)
        metric.compute()
        metric.reset()

    expected = _warnings_of(stock_run)
    assert expected, "the case must make stock warn"
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = make()
        for preds, target in data:
            metric.update(preds, target)
        found = _warnings_of(metric.compute)
        if path == "device":
            assert not found  # compute read nothing: the warnings are pending
            assert pending_checks(metric) == sum(expected.values())
        found += _warnings_of(metric.reset)
        assert pending_checks(metric) == 0
        found += _warnings_of(metric.reset)  # nothing twice
    assert found == expected


def test_the_area_replaces_every_class_of_the_release() -> None:
    """Each fixed-output class's compute is replaced, EER only where the release has it."""
    from torchmetrics_syncfree.classification.fixed_point_curves import COMPUTES

    assert len(COMPUTES) == 3 * len(METRICS)
    with torchmetrics_syncfree.patched(areas=["fixed_point_curves"]) as targets:
        assert set(COMPUTES) <= set(targets)


def _compute_once(name: str, preds: Tensor, target: Tensor) -> Any:
    metric = _make(name, "binary", None)
    metric.update(preds, target)
    return metric.compute()


@pytest.mark.parametrize("name", list(METRICS))
def test_float64_scores_give_the_documented_dtypes(name: str) -> None:
    """Documented deviation (device path): stock's values; the rates of a class without negatives are float32 (stock:
    the scores' dtype), and RecallAtFixedPrecision's outputs always take its stack's promoted dtype (stock: only where
    a point qualifies)."""
    preds = torch.rand(16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for target in (torch.arange(16) % 2, torch.ones(16, dtype=torch.long)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = _flat(_compute_once(name, preds, target))
            with torchmetrics_syncfree.patched(), SyncProbe():
                found = _flat(_compute_once(name, preds, target))
        for stock_value, value in zip(expected, found):
            torch.testing.assert_close(value.double(), stock_value.double(), rtol=0, atol=0, equal_nan=True)
            if name == "RecallAtFixedPrecision":
                assert value.dtype == torch.float64
            elif stock_value.dtype != value.dtype:  # a rate of the class without negatives
                assert (stock_value.dtype, value.dtype) == (torch.float64, torch.float32)


def test_a_state_of_ignored_entries_only_gives_a_value_where_stock_fails() -> None:
    """Documented deviation (device path): stock's unbinned curve of no entries fails (``IndexError``); the device path
    returns 0 and the no-threshold value (the ROC-based metrics: the curve's origin, threshold 1; EER 0.5)."""
    preds, target = torch.tensor([0.2, 0.7]), torch.tensor([-1, -1])
    with pytest.raises(IndexError):
        _make("PrecisionAtFixedRecall", "binary", None, -1)(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no positives, no negatives)
        value, threshold = _make("PrecisionAtFixedRecall", "binary", None, -1)(preds, target)
        _, roc_threshold = _make("SensitivityAtSpecificity", "binary", None, -1)(preds, target)
    assert value.item() == 0 and (threshold.isnan().item() or threshold.item() == 1e6)
    assert roc_threshold.item() == 1.0


@pytest.mark.parametrize("name", ["PrecisionAtFixedRecall", "SpecificityAtSensitivity"])
@pytest.mark.compile
def test_unbinned_compute_traces_without_a_graph_break(syncfree: Any, name: str) -> None:
    """The device path's compute is tensor work: ``torch.compile(fullgraph=True)`` traces it (a lexicographic maximum;
    a masked ``argmax``)."""
    from torchmetrics_syncfree.classification.fixed_point_curves import COMPUTES

    metric = _make(name, "multiclass", None)
    metric.update(*_batches("multiclass", None, seed=6)[0])
    compute = next(fn for target, fn in COMPUTES.items() if target.endswith(f".Multiclass{name}.compute"))
    with SyncProbe():
        eager = compute(metric)
    torch._dynamo.reset()
    compiled = torch.compile(compute, fullgraph=True, backend="aot_eager")(metric)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager, equal_nan=True)  # (the class that never occurs: a NaN threshold)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", list(METRICS))
def test_device_path_results_need_no_grad_and_take_half(name: str, task: str) -> None:
    """Found by upstream's suites on the device path: ``forward`` of scores that require grad gives results that do
    not (stock's curve is made under ``no_grad``; ``is_differentiable`` is False), and half precision scores give
    stock's values (its no-value threshold ``1e6`` is ``inf`` in half precision; ``full_like`` of more than one
    element refused it)."""
    preds, target = _batches(task, None, seed=7, n=32)[0]
    if task == "multiclass":
        preds = preds.softmax(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _flat(_make(name, task, None)(preds.half(), target))
        with torchmetrics_syncfree.patched(), SyncProbe():
            found = _flat(_make(name, task, None)(preds.clone().requires_grad_(True), target))
            half = _flat(_make(name, task, None)(preds.half(), target))
    assert not any(value.requires_grad for value in found)
    for value, reference in zip(half, expected):
        if name == "RecallAtFixedPrecision":
            # the documented dtype deviation: its stack's dtype (float32 here) also where nothing qualifies. Before
            # torchmetrics 1.8 stock's no-value threshold there is ``1e6`` made in half precision (``inf``) and then
            # stacked; the device path keeps ``1e6``. Compared where stock's value is finite or NaN
            shown = reference.isfinite() | reference.isnan()
            value, reference = value[shown], reference[shown].to(value.dtype)
        torch.testing.assert_close(value, reference, rtol=0, atol=0, equal_nan=True)
