"""AUROC and AveragePrecision ``compute()`` (areas ``auroc`` and ``average_precision``): stock's values on both
patched paths (one implementation, up to the order of float sums), no would-be sync in ``forward``/``compute`` on
the device path (binned and unbinned), stock's warnings at once where reads are free and deferred to the next eager
point elsewhere (once each), ``max_fpr``, compute groups, the documented float32 deviation."""

from __future__ import annotations

import contextlib
import copy
import inspect
import pickle
import sys
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from tests._classification_cases import (
    NUM_CLASSES,
    PATHS,
    Case,
    curve_batches,
    forward_and_compute_syncs,
    parity,
    pending_checks,
)
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.classification import precision_recall_curve

#: the averages of each task (binary: none)
AVERAGES = {
    "binary": (None,),
    "multiclass": ("macro", "weighted", "none"),
    "multilabel": ("micro", "macro", "weighted", "none"),
}
IGNORE = {"binary": (None, -1), "multiclass": (None, -1, 1), "multilabel": (None, -1)}
THRESHOLDS: dict[str, Any] = {"None": None, "7": 7, "tensor": torch.tensor([0.0, 0.2, 0.5, 0.5, 0.9])}
#: device-path values differ from stock's in the order of float sums only (repeated points add exact zeros)
RTOL = 1e-6


def _make(name: str, task: str, thresholds: Any, ignore_index: int | None, average: str | None, **kwargs: Any) -> Any:
    size = {"multiclass": {"num_classes": NUM_CLASSES}, "multilabel": {"num_labels": NUM_CLASSES}}.get(task, {})
    if average is not None:
        kwargs["average"] = average
    if isinstance(thresholds, Tensor):
        thresholds = thresholds.clone()
    return getattr(torchmetrics, name)(task=task, thresholds=thresholds, ignore_index=ignore_index, **size, **kwargs)


def _batches(task: str, ignore_index: int | None, seed: int, n: int = 24) -> list[tuple[Tensor, Tensor]]:
    return curve_batches(task, ignore_index, seed, n, NUM_CLASSES)


def _cases(name: str, **kwargs: Any) -> dict[str, Case]:
    cases = {}
    for task, averages in AVERAGES.items():
        for key, thresholds in THRESHOLDS.items():
            for ignore_index in IGNORE[task]:
                for average in averages:
                    label = f"{name}-{task}-{average}-thresholds={key}-ignore={ignore_index}"
                    make = lambda t=task, th=thresholds, i=ignore_index, a=average: _make(name, t, th, i, a, **kwargs)  # noqa: E731
                    cases[label] = make, _batches(task, ignore_index, seed=sum(map(ord, label)))
    return cases


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["AUROC", "AveragePrecision"])
def test_parity_with_stock(name: str, path: str) -> None:
    """forward() per batch and compute(): stock's values (up to the order of float sums), dtypes and shapes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parity(_cases(name), path=path, rtol=lambda label: RTOL)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("max_fpr", [0.05, 0.3, 0.5, 0.99])
def test_partial_auc_parity(path: str, max_fpr: float) -> None:
    """Binary AUROC with ``max_fpr``, binned and unbinned, also where stock returns the full area (all targets one)."""
    cases: dict[str, Case] = {}
    for key, thresholds in THRESHOLDS.items():
        data = _batches("binary", None, seed=len(key))
        cases[f"{key}"] = (lambda th=thresholds: _make("AUROC", "binary", th, None, None, max_fpr=max_fpr)), data
        ones = [(preds, torch.ones_like(target)) for preds, target in data]
        cases[f"{key}-positives only"] = (
            (lambda th=thresholds: _make("AUROC", "binary", th, None, None, max_fpr=max_fpr)),
            ones,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parity(cases, path=path, rtol=lambda label: RTOL)


@pytest.mark.parametrize("path", PATHS)
def test_partial_auc_of_a_binned_curve_that_starts_past_max_fpr(path: str) -> None:
    """No point at or below ``max_fpr`` (the highest threshold's false positive rate is above it, as in a small
    batch's forward): stock cuts the curve to the interpolated point alone, area 0, and returns the McClish floor. The
    device path moved every point onto that point; a flat curve made its interpolation 0 / 0, and the area NaN."""
    cases: dict[str, Case] = {
        "flat": (
            lambda: _make("AUROC", "binary", [0.2, 0.4, 0.6], None, None, max_fpr=0.5),
            [(torch.tensor([0.9258, 0.0542, 0.8386]), torch.tensor([0, 1, 1]))],
        ),
        "rising": (
            lambda: _make("AUROC", "binary", 5, None, None, max_fpr=0.1),
            [(torch.tensor([0.97, 0.9, 0.1, 0.6, 0.3]), torch.tensor([0, 0, 1, 1, 0]))],
        ),
    }
    parity(cases, path=path, rtol=lambda label: RTOL)


@pytest.mark.parametrize("task", list(AVERAGES))
@pytest.mark.parametrize("key", list(THRESHOLDS))
def test_forward_and_compute_are_sync_free(syncfree: Any, task: str, key: str) -> None:
    """0 would-be syncs in forward and compute on the device path, every average, ``ignore_index`` and max_fpr."""
    for name in ("AUROC", "AveragePrecision"):
        for average in AVERAGES[task]:
            for ignore_index in IGNORE[task]:
                extra = [{}, {"max_fpr": 0.4}] if (name, task) == ("AUROC", "binary") else [{}]
                for kwargs in extra:
                    metric = _make(name, task, THRESHOLDS[key], ignore_index, average, **kwargs)
                    syncs = forward_and_compute_syncs(metric, _batches(task, ignore_index, seed=4))
                    assert syncs == {"forward": 0, "compute": 0}, (name, average, ignore_index, kwargs, syncs)


@pytest.mark.parametrize("task", list(AVERAGES))
def test_stock_compute_syncs_are_seen(task: str) -> None:
    """The probe sees stock's reads: without the patch these computes do sync (so the test above can fail)."""
    average = "macro" if task != "binary" else None
    metric = _make("AveragePrecision", task, None, None, average)
    assert forward_and_compute_syncs(metric, _batches(task, None, seed=4))["compute"] > 0


def _warnings_of(run: Any) -> Counter[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    # leaves out the wrapper's "compute before update" notice and torch's notice about stock 1.6's
    # ``torch.tensor(tensor)`` in LogAUC (not a metric warning; the device path does not copy)
    return Counter(
        str(w.message) for w in caught if "compute" not in str(w.message) and "copy construct" not in str(w.message)
    )


def _stock_warnings(make: Any, data: list[tuple[Tensor, Tensor]]) -> Counter[str]:
    def run() -> None:
        metric = make()
        for preds, target in data:
            metric.update(preds, target)
        metric.compute()
        metric.reset()

    return _warnings_of(run)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("name", "task", "average"),
    [
        ("AveragePrecision", "multiclass", "macro"),  # class 5 never occurs: NaN score, ignored with a warning
        ("AveragePrecision", "multiclass", "weighted"),
        ("AveragePrecision", "binary", None),  # no positives: recall set to one, a warning
        ("AUROC", "multiclass", "macro"),  # class 5 never occurs: no positives, a warning for it
        ("AUROC", "multilabel", "none"),  # label 0 never positive, label 1 never negative
        ("AveragePrecision", "multilabel", "macro"),
    ],
)
def test_compute_warnings_are_stocks_once_each(path: str, name: str, task: str, average: str | None) -> None:
    """The warnings stock's compute emits reach the user, each as many times as stock emits it: at once where reads are
    free; on the device path at the next eager point (here: ``reset()``), and none of them twice."""
    data = _batches(task, None, seed=11)
    if task == "binary":
        data = [(preds, torch.zeros_like(target)) for preds, target in data]
    if task == "multilabel":
        data = [
            (preds, target.index_fill(1, torch.tensor([0]), 0).index_fill(1, torch.tensor([1]), 1))
            for preds, target in data
        ]
    make = lambda: _make(name, task, None, None, average)  # noqa: E731
    expected = _stock_warnings(make, data)
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


def test_forward_warnings_arrive_at_the_end_of_the_forward(syncfree: Any) -> None:
    """forward() computes on the batch: its warnings are filed inside and reported by forward's own eager end."""
    make = lambda: _make("AveragePrecision", "multiclass", None, None, "macro")  # noqa: E731
    preds, target = _batches("multiclass", None, seed=2)[0]
    with SyncProbe():
        metric = make()
        found = _warnings_of(lambda: metric(preds, target))
    assert found[precision_recall_curve.NAN_IN_MACRO.message] == 1
    assert pending_checks(metric) == 0


@pytest.mark.parametrize("path", PATHS)
def test_compute_group_of_auroc_and_average_precision(path: str) -> None:
    """AUROC and AveragePrecision with equal states share them (and the counters) in a compute group: stock's values,
    and every warning of both computes once."""

    def make() -> Any:
        return torchmetrics.MetricCollection(
            {
                "auroc": _make("AUROC", "multiclass", None, None, "macro"),
                "ap": _make("AveragePrecision", "multiclass", None, None, "macro"),
            },
            compute_groups=True,
        )

    data = _batches("multiclass", None, seed=9)

    def run(collection: Any) -> tuple[dict[str, Tensor], Counter[str]]:
        def go() -> None:
            for preds, target in data:
                collection.update(preds, target)
            run.values = collection.compute()
            collection.reset()

        found = _warnings_of(go)
        return run.values, found

    stock_values, stock_found = run(make())
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        collection = make()
        values, found = run(collection)
        assert len(collection.compute_groups) == 1
    for key in stock_values:
        torch.testing.assert_close(values[key], stock_values[key], rtol=RTOL, atol=0)
    assert found == stock_found


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["AUROC", "AveragePrecision"])
def test_float64_scores_give_float32_where_stock_promotes(syncfree: Any, name: str, path: str) -> None:
    """Documented deviation (every device): stock's unbinned multiclass value becomes float64 for float64 scores when a
    class has no positives (its zero rates are ``zeros_like`` the float64 thresholds); here it is float32, the dtype of
    every other case, with stock's value."""
    preds, target = _batches("multiclass", None, seed=3)[0]
    torchmetrics_syncfree.unpatch_all()
    stock = _make(name, "multiclass", None, None, "macro")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = stock(preds.double(), target)
    torchmetrics_syncfree.patch_all()
    with SyncProbe() if path == "device" else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = _make(name, "multiclass", None, None, "macro")(preds.double(), target)
    assert value.dtype == torch.float32
    if name == "AUROC":
        assert expected.dtype == torch.float64
    torch.testing.assert_close(value.double(), expected.double(), rtol=RTOL, atol=0)


@pytest.mark.parametrize("name", ["AUROC", "AveragePrecision"])
@pytest.mark.compile
def test_unbinned_compute_traces_without_a_graph_break(syncfree: Any, name: str) -> None:
    """The device path's compute is tensor work: ``torch.compile(fullgraph=True)`` traces it (warnings: counters)."""
    import importlib

    module = importlib.import_module(
        f"torchmetrics_syncfree.classification.{'auroc' if name == 'AUROC' else 'average_precision'}"
    )
    metric = _make(name, "multiclass", None, None, "weighted")
    preds, target = _batches("multiclass", None, seed=6)[0]
    metric.update(preds, target)
    with SyncProbe():
        eager = module._multiclass_compute(metric)
    torch._dynamo.reset()
    compiled = torch.compile(module._multiclass_compute, fullgraph=True, backend="aot_eager")(metric)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_ignored_entries_kept_by_the_device_path_reach_no_compute(task: str) -> None:
    """Documented deviation: on the device path the unbinned binary/multiclass update keeps ignored entries in its
    list state (stock drops them with a boolean mask, one sync per update); every compute of the family leaves them
    out: ROC and PrecisionRecallCurve (a mask in compute, where their length depends on the data), LogAUC through
    ROC, AUROC/AveragePrecision (weights of 0), also after ``compute_on_cpu`` moved the state to the CPU."""
    data = _batches(task, 1 if task == "multiclass" else -1, seed=21)
    ignore_index = 1 if task == "multiclass" else -1
    specs = [
        ("ROC", {}),
        ("PrecisionRecallCurve", {}),
        ("LogAUC", {}),
        ("AUROC", {"compute_on_cpu": True}),
        ("AveragePrecision", {"compute_on_cpu": True}),
    ]

    def make(name: str, kwargs: dict[str, Any]) -> Any:
        average = None if task == "binary" or name not in ("AUROC", "AveragePrecision", "LogAUC") else "macro"
        return _make(name, task, None, ignore_index, average, **kwargs)

    def flat(out: Any) -> list[Tensor]:
        items = out if isinstance(out, tuple) else (out,)
        return [t.double().flatten() for item in items for t in (item if isinstance(item, list) else [item])]

    def values(metric: Any) -> list[Tensor]:
        for preds, target in data:
            metric.update(preds, target)
        return flat(metric.compute())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = {name: values(make(name, kwargs)) for name, kwargs in specs}
        with torchmetrics_syncfree.patched():
            with SyncProbe() as probe:
                patched = {name: make(name, kwargs) for name, kwargs in specs}
                for metric in patched.values():
                    for preds, target in data:
                        metric.update(preds, target)
            assert probe.count == 0
            kept_entries = sum(t.numel() for t in patched["ROC"].target)
            assert kept_entries == sum(t.numel() for _, t in data)  # the ignored entries are in the state
            with SyncProbe():
                # the kept entries travel with the state: copies, pickles and a merge of two halves compute the same
                copies = {name: copy.deepcopy(metric) for name, metric in patched.items()}
                pickled = {name: pickle.loads(pickle.dumps(metric)) for name, metric in patched.items()}
                merged = {}
                for name, kwargs in specs:
                    first, second = make(name, kwargs), make(name, kwargs)
                    for i, (preds, target) in enumerate(data):
                        (first if i % 2 else second).update(preds, target)
                    first.merge_state(second)
                    merged[name] = first
                found = {name: flat(metric.compute()) for name, metric in patched.items()}
                variants = [
                    {name: flat(m.compute()) for name, m in group.items()} for group in (copies, pickled, merged)
                ]
    for name, _ in specs:
        for result in (found, *variants):
            assert len(result[name]) == len(expected[name]), name
            for value, reference in zip(result[name], expected[name]):
                torch.testing.assert_close(value, reference, rtol=RTOL, atol=0, equal_nan=True, msg=name)


LOGAUC_AVERAGES = {"binary": (None,), "multiclass": (None, "macro"), "multilabel": (None, "macro")}


def _logauc_cases() -> dict[str, Case]:
    cases = {}
    for task, averages in LOGAUC_AVERAGES.items():
        for key, thresholds in THRESHOLDS.items():
            for ignore_index in IGNORE[task]:
                for average in averages:
                    for fpr_range in ((0.001, 0.1), (0.05, 0.8)):
                        label = f"LogAUC-{task}-{average}-thresholds={key}-ignore={ignore_index}-range={fpr_range}"
                        make = lambda t=task, th=thresholds, i=ignore_index, a=average, r=fpr_range: _make(  # noqa: E731
                            "LogAUC", t, th, i, a, fpr_range=r
                        )
                        cases[label] = make, _batches(task, ignore_index, seed=sum(map(ord, label)))
    return cases


def _stable_interp(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Stock's ``torchmetrics.utilities.data.interp`` with a stable sort of the points (np.interp's order)."""
    order = torch.argsort(xp, stable=True)
    xp, fp = xp[order], fp[order]
    slopes = (fp[1:] - fp[:-1]) / (xp[1:] - xp[:-1])
    indices = torch.clamp(torch.searchsorted(xp, x) - 1, 0, len(slopes) - 1)
    return fp[indices] + slopes[indices] * (x - xp[indices])


@pytest.mark.parametrize("path", PATHS)
def test_logauc_parity_with_stock(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """LogAUC (area ``logauc``): stock's values for every task, thresholds, ignore_index, average and fpr_range.

    Documented deviation: stock interpolates at the bounds of ``fpr_range`` after an *unstable*
    ``argsort`` of the curve's false positive rates, so at a vertical run of the curve (equal rates) it may start from
    a point inside the run, depending on the sort implementation; the patched compute interpolates along the curve
    (from the run's top, np.interp's order). Its reference is stock's compute with a stable sort there.
    """
    monkeypatch.setattr(sys.modules["torchmetrics.functional.classification.logauc"], "interp", _stable_interp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parity(_logauc_cases(), path=path, rtol=lambda label: RTOL)


def test_logauc_forward_and_compute_are_sync_free(syncfree: Any) -> None:
    for label, (make, data) in _logauc_cases().items():
        assert forward_and_compute_syncs(make(), data) == {"forward": 0, "compute": 0}, label


def test_logauc_stock_syncs_are_seen() -> None:
    metric = _make("LogAUC", "multiclass", None, None, "macro")
    assert forward_and_compute_syncs(metric, _batches("multiclass", None, seed=4))["compute"] > 0


@pytest.mark.parametrize("path", PATHS)
def test_logauc_warnings_are_stocks_once_each(path: str) -> None:
    """A class without positives: stock's ROC warning per compute and its reduction's NaN-free path; the unbinned
    multiclass curve of a class that never occurs gives zero rates (stock's warning), reported once."""
    data = _batches("multiclass", None, seed=12)
    make = lambda: _make("LogAUC", "multiclass", None, None, "macro")  # noqa: E731
    expected = _stock_warnings(make, data)
    assert expected
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = make()
        for preds, target in data:
            metric.update(preds, target)
        found = _warnings_of(metric.compute) + _warnings_of(metric.reset) + _warnings_of(metric.reset)
    assert found == expected


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
@pytest.mark.parametrize("thresholds", [None, 7], ids=["unbinned", "binned"])
def test_logauc_of_each_column_warns_only_as_stock(path: str, task: str, thresholds: int | None) -> None:
    """Every column of a multiclass or multilabel curve is interpolated without torch's warning about a copy of a
    non-contiguous ``searchsorted`` boundary (stock interpolates without ``searchsorted``; torch gives that warning
    once per process, so the test asks for it every time)."""
    data = _batches(task, None, seed=5)
    make = lambda: _make("LogAUC", task, thresholds, None, None)  # noqa: E731
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        expected = _stock_warnings(make, data)
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            metric = make()
            for preds, target in data:
                metric.update(preds, target)
            found = _warnings_of(metric.compute) + _warnings_of(metric.reset)
    finally:
        torch.set_warn_always(warn_always)
    assert found == expected


@pytest.mark.skipif(
    "normalization" not in inspect.signature(torchmetrics.classification.BinaryPrecisionRecallCurve).parameters,
    reason="`normalization` is an argument since torchmetrics 1.8",
)
@pytest.mark.parametrize("normalization", [None, "sigmoid"])
def test_unbinned_binary_ignore_index_with_each_normalization(normalization: str | None) -> None:
    """The device path's unbinned binary update with ``ignore_index`` keeps the scores as given with
    ``normalization=None`` (it took a softmax over dim 1 of 1-D scores and failed)."""
    preds = torch.tensor([-1.5, 0.2, 2.0, 0.7, -0.3, 1.1])
    target = torch.tensor([0, 1, -1, 1, 0, -1])

    def make() -> Any:
        return torchmetrics.classification.BinaryPrecisionRecallCurve(ignore_index=-1, normalization=normalization)

    expected = make()(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe():
        found = make()(preds, target)
    for value, reference in zip(found, expected):
        torch.testing.assert_close(value, reference, rtol=RTOL, atol=0)
