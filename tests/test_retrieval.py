"""Retrieval metrics: stock's values (within float rounding: one implementation on every device), sync-free
update/forward/compute on the device path, stock's errors (at once on CPU, at the next eager point on the device
path), compile without graph breaks."""

from __future__ import annotations

import contextlib
import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import Tensor
from torchmetrics import retrieval

import torchmetrics_syncfree
from tests._classification_cases import pending_checks
from tests._probing import graph_breaks
from torchmetrics_syncfree import SyncProbe, _deferred, _instrumentation
from torchmetrics_syncfree.tools.allocations import PEAK_MEASURABLE, peak_allocated_by

PATHS = ["cpu", "device"]
Batch = tuple[Tensor, Tensor, Tensor]  # preds, target, indexes

#: the metrics with a fixed-shape compute, in the order of the work, with their top_k-like arguments
METRICS: dict[str, tuple[type, list[dict[str, Any]]]] = {
    "MRR": (retrieval.RetrievalMRR, [{}, {"top_k": 3}]),
    "HitRate": (retrieval.RetrievalHitRate, [{}, {"top_k": 3}]),
    "Precision": (
        retrieval.RetrievalPrecision,
        [{}, {"top_k": 3}, {"top_k": 3, "adaptive_k": True}, {"top_k": 12, "adaptive_k": True}],
    ),
    "Recall": (retrieval.RetrievalRecall, [{}, {"top_k": 3}]),
    "MAP": (retrieval.RetrievalMAP, [{}, {"top_k": 3}]),
    "NormalizedDCG": (retrieval.RetrievalNormalizedDCG, [{}, {"top_k": 3}]),
    "RPrecision": (retrieval.RetrievalRPrecision, [{}]),
    "FallOut": (retrieval.RetrievalFallOut, [{}, {"top_k": 3}]),
    "AUROC": (retrieval.RetrievalAUROC, [{}, {"top_k": 3}, {"max_fpr": 0.5}]),
}

ACTIONS = ("neg", "pos", "skip")
AGGREGATIONS = ("mean", "median", "min", "max")


def _batches(
    seed: int, ignore_index: int | None = None, graded: bool = False, n: int = 40, every_kind: bool = True
) -> list[Batch]:
    """Queries with and without relevant (and non-relevant) documents, tied scores of equal relevance, float32 and
    float64 scores, bool/long/float targets, extra dimensions, and (with ``ignore_index``) ignored entries.

    ``every_kind=False``: every query has a relevant and a non-relevant document (for ``empty_target_action="error"``).
    """
    gen = torch.Generator().manual_seed(seed)
    top = 2 if graded else 1
    out = []
    for i in range(4):
        indexes = torch.randint(0, 9, (n,), generator=gen)
        preds = torch.randn(n, generator=gen)
        target = torch.randint(0, 4, (n,), generator=gen) if graded else (torch.rand(n, generator=gen) < 0.3).long()
        if i == 1:  # ties: scores of a few values, the tied documents of equal relevance (stock's order is arbitrary)
            preds = (torch.randint(-2, 3, (n,), generator=gen) / 2).double()
            target = (preds > 0.2).long() * top
        if every_kind:
            target[indexes == 7] = 0  # a query without a relevant document
            target[indexes == 8] = top  # one without a non-relevant document
        else:
            indexes[:18] = torch.arange(18) % 9
            target[:9], target[9:18] = 0, top
            preds[:18] = torch.where(target[:18] > 0, 1.0, -1.0)  # never tied with one of other relevance
        if ignore_index is not None:
            ignored = torch.rand(n, generator=gen) < 0.2
            ignored[:18] &= every_kind
            target = target.masked_fill(ignored, ignore_index)
        if i == 2:
            preds = preds.double()
            target = target.float() if graded else target.bool() if ignore_index is None else target
        elif i == 3:
            indexes, preds, target = indexes.view(4, -1), preds.view(4, -1), target.view(4, -1)
        out.append((preds, target, indexes))
    return out


def _run(make: Callable[[], Any], data: list[Batch]) -> list[Tensor]:
    """forward() of every batch and compute() after them, then compute() after plain update()s."""
    metric = make()
    out = [metric(preds, target, indexes=indexes) for preds, target, indexes in data]
    out.append(metric.compute())
    other = make()
    for preds, target, indexes in data:
        other.update(preds, target, indexes=indexes)
    out.append(other.compute())
    return out


def _cases(aggregations: tuple[str, ...] = AGGREGATIONS) -> dict[str, tuple[Callable[[], Any], list[Batch]]]:
    cases = {}
    for name, (cls, extras) in METRICS.items():
        for extra in extras:
            for action in ACTIONS:
                for aggregation in aggregations:
                    for ignore_index in (None, -1):
                        if aggregation != "mean" and (extra or ignore_index is not None):
                            continue  # the aggregations with the defaults; the rest with the mean
                        label = f"{name}-{extra}-{action}-{aggregation}-ignore={ignore_index}"
                        kwargs = dict(extra, empty_target_action=action, aggregation=aggregation)
                        data = _batches(len(cases), ignore_index, graded=name == "NormalizedDCG")
                        cases[label] = (
                            lambda c=cls, k=kwargs, i=ignore_index: c(ignore_index=i, **k),
                            data,
                        )
    return cases


def _parity(cases: dict[str, tuple[Callable[[], Any], list[Batch]]], path: str) -> None:
    stock = {label: _run(make, data) for label, (make, data) in cases.items()}
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = {label: _run(make, data) for label, (make, data) in cases.items()}
    for label in cases:
        for i, (s, p) in enumerate(zip(stock[label], patched[label])):
            assert (p.dtype, p.shape, p.device) == (s.dtype, s.shape, s.device), (label, i)
            # one implementation on every device: float sums in another order than stock's
            torch.testing.assert_close(p, s, rtol=1e-6, atol=0, msg=lambda m, w=f"{label} value {i}": f"{w}: {m}")


#: a fast cover of the matrix: (the metric's first or last top_k-like argument, action, aggregation, ignore_index)
QUICK = [(0, "neg", "mean", None), (0, "skip", "median", None), (0, "pos", "max", None), (0, "error", "min", None)]
QUICK += [(-1, "skip", "mean", -1), (-1, "neg", "mean", -1), (-1, "pos", "mean", None)]


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes for every metric, top_k/adaptive_k,
    empty_target_action, aggregation and ignore_index, ties of equal relevance, float64 scores (a cover of the
    matrix; the whole of it below). "error" with data where every query has a relevant and a non-relevant document."""
    cases = {}
    for name, (cls, extras) in METRICS.items():
        for which, action, aggregation, ignore_index in QUICK:
            kwargs = dict(extras[which], empty_target_action=action, aggregation=aggregation, ignore_index=ignore_index)
            data = _batches(len(cases), ignore_index, graded=name == "NormalizedDCG", every_kind=action != "error")
            cases[f"{name}-{kwargs}"] = (lambda c=cls, k=kwargs: c(**k)), data
    _parity(cases, path)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock_whole_matrix(path: str) -> None:
    """Every metric x top_k/adaptive_k x empty_target_action x aggregation (with the defaults; the mean otherwise) x
    ignore_index."""
    _parity(_cases(), path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(METRICS))
def test_empty_target_action_error_raises_stocks_error_from_compute(path: str, name: str) -> None:
    cls = METRICS[name][0]
    preds, indexes = torch.randn(6), torch.tensor([0, 0, 1, 1, 2, 2])
    empty = torch.tensor([1, 1, 0, 1, 1, 0]) if name == "FallOut" else torch.tensor([0, 0, 0, 1, 1, 0])
    full = torch.tensor([1, 0, 0, 1, 1, 0])
    stock = cls(empty_target_action="error")
    stock.update(preds, empty, indexes=indexes)
    with pytest.raises(ValueError) as expected:
        stock.compute()
    with torchmetrics_syncfree.patched():
        metric, fine = cls(empty_target_action="error"), cls(empty_target_action="error")
        with SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
            metric.update(preds, empty, indexes=indexes)
            fine.update(preds, full, indexes=indexes)
            with pytest.raises(ValueError, match=str(expected.value)):
                metric.compute()
            value = fine.compute()
        if path == "device":  # the one read of compute: whether to raise, at the eager point
            assert [event.kind for event in probe.events] == ["host wait", "host wait"]
        assert pending_checks(metric) == 0
        reference = cls(empty_target_action="error")
    reference.update(preds, full, indexes=indexes)
    torch.testing.assert_close(value, reference.compute(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", list(METRICS))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    cls, extras = METRICS[name]
    for extra in extras:
        for ignore_index in (None, -1):
            data = _batches(3, ignore_index, graded=name == "NormalizedDCG")
            metric = cls(ignore_index=ignore_index, **extra)
            with SyncProbe() as probe:
                for preds, target, indexes in data[:2]:
                    metric.update(preds, target, indexes=indexes)
                for preds, target, indexes in data[2:]:
                    metric(preds, target, indexes=indexes)
                metric.compute()
            assert probe.count == 0, (extra, ignore_index, probe.summary())


@pytest.mark.parametrize("name", [*METRICS, "PrecisionRecallCurve", "RecallAtFixedPrecision"])
def test_stock_syncs_are_seen(name: str) -> None:
    """The probe sees stock's reads (the binary check or ignore_index's mask in update, the loop in compute): the
    zeros above mean something."""
    cls = METRICS[name][0] if name in METRICS else getattr(retrieval, f"Retrieval{name}")
    preds, target, indexes = _batches(1, -1)[0]
    metric = cls(ignore_index=-1)
    with SyncProbe() as probe:
        metric.update(preds, target, indexes=indexes)
    assert probe.count > 0
    with SyncProbe() as probe:
        metric.compute()
    assert probe.count > 0


INVALID = {
    "target 2": (torch.tensor([0.2, 0.7, 0.1]), torch.tensor([0, 2, 1]), None),
    "target -1": (torch.tensor([0.2, 0.7, 0.1]), torch.tensor([0, -1, 1]), None),
    "float target 1.5": (torch.tensor([0.2, 0.7, 0.1]), torch.tensor([0.0, 1.5, 1.0]), None),
    "all ignored": (torch.tensor([0.2, 0.7, 0.1]), torch.tensor([-1, -1, -1]), -1),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error(path: str, case: str) -> None:
    """Stock's ValueError and message: at once on CPU; on the device path at the end of the update (the simulated
    copy arrives), and the batch never counts."""
    preds, target, ignore_index = INVALID[case]
    indexes = torch.tensor([0, 0, 1])
    stock = retrieval.RetrievalMRR(ignore_index=ignore_index)
    with pytest.raises(ValueError) as expected:
        stock.update(preds, target, indexes=indexes)
    good = _batches(5)[0]
    reference = retrieval.RetrievalMRR(ignore_index=ignore_index)
    reference.update(*good[:2], indexes=good[2])
    with torchmetrics_syncfree.patched():
        metric = retrieval.RetrievalMRR(ignore_index=ignore_index)
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(*good[:2], indexes=good[2])
            with pytest.raises(ValueError, match=str(expected.value).replace("`", ".")):
                metric.update(preds, target, indexes=indexes)
            value = metric.compute()
        assert pending_checks(metric) == 0
    torch.testing.assert_close(value, reference.compute(), rtol=1e-6, atol=0)


def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    metric = retrieval.RetrievalPrecision()
    preds, indexes = torch.tensor([0.2, 0.7, 0.1]), torch.tensor([0, 0, 1])
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(preds, torch.tensor([0, 1, 1]), indexes=indexes)
        metric.update(preds, torch.tensor([0, 3, 1]), indexes=indexes)
        assert pending_checks(metric) == 1
        twin = copy.deepcopy(metric)
        with pytest.raises(ValueError, match="must contain `binary` values"):
            metric.compute()
        with pytest.raises(ValueError, match="must contain `binary` values"):
            twin.reset()  # a copy carries the pending report; reset reports it before dropping the state
        value = metric.compute()
    assert pending_checks(metric) == 0
    reference = retrieval.RetrievalPrecision()
    reference.update(preds, torch.tensor([0, 1, 1]), indexes=indexes)
    torch.testing.assert_close(value, reference.compute())  # the bad batch is left out


def test_device_path_keeps_ignored_entries_in_the_list_states() -> None:
    """Documented deviation of the state: the device path stores the ignored entries (and invalid batches, targets
    -1); every compute leaves them out, also after deepcopy, pickle and merge_state."""
    data = _batches(11, -1)
    reference = retrieval.RetrievalMAP(ignore_index=-1)
    for preds, target, indexes in data:
        reference.update(preds, target, indexes=indexes)
    expected = reference.compute()
    torchmetrics_syncfree.patch_all()
    metric, other = retrieval.RetrievalMAP(ignore_index=-1), retrieval.RetrievalMAP(ignore_index=-1)
    with SyncProbe():
        for preds, target, indexes in data[:2]:
            metric.update(preds, target, indexes=indexes)
        for preds, target, indexes in data[2:]:
            other.update(preds, target, indexes=indexes)
    stored = sum(t.numel() for t in metric.target) + sum(t.numel() for t in other.target)
    assert stored == sum(t.numel() for _, t, _ in data) > sum(t.numel() for t in reference.target)
    for twin in (copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))):
        twin.merge_state(other)
        _deferred.report_pending(twin)  # merge_state added to the check counters: compute's one read (none pending)
        with SyncProbe() as probe:
            value = twin.compute()
        assert probe.count == 0
        torch.testing.assert_close(value, expected, rtol=1e-6, atol=0)
    metric.merge_state(other)
    torch.testing.assert_close(metric.compute(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_stock_compute_stays_for_a_callable_aggregation(path: str) -> None:
    """No fixed-shape form: stock's compute, on the list states without the entries the device path kept."""

    def make() -> Any:
        return retrieval.RetrievalMRR(ignore_index=-1, aggregation=lambda v, dim=None: v.sum())

    data = _batches(21, -1)
    stock = _run(make, data)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = _run(make, data)
    for s, p in zip(stock, patched):
        torch.testing.assert_close(p, s, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_tied_scores_across_a_cut_off_rank_in_the_order_of_arrival(syncfree: Any, path: str) -> None:
    """Documented deviation: where tied documents of different relevance straddle a cut-off, stock's value depends on
    its (unstable) sort's order of the ties; every device ranks tied documents in the order they were added."""
    preds, indexes = torch.full((4,), 0.5), torch.zeros(4, dtype=torch.long)
    target = torch.tensor([0, 1, 0, 1])
    with SyncProbe() if path == "device" else contextlib.nullcontext():
        mrr, precision = retrieval.RetrievalMRR(), retrieval.RetrievalPrecision(top_k=1)
        mrr.update(preds, target, indexes=indexes)
        precision.update(preds, target, indexes=indexes)
        assert float(mrr.compute()) == 0.5  # the relevant document added second is ranked second
        assert float(precision.compute()) == 0.0


#: the most bytes per document of the state that one fixed-shape compute holds at once (the ranked copy of the
#: states, per-document query ids and ranks; stock's loop holds about 36); measured 66 / 94 / 127 on 2026-11-29
COMPUTE_PEAK_BYTES_PER_DOCUMENT = {"Precision": 72, "MAP": 100, "NormalizedDCG": 135}


@pytest.mark.skipif(not PEAK_MEASURABLE, reason=f"torch {torch.__version__}: a storage's release is not watchable")
@pytest.mark.parametrize("name", list(COMPUTE_PEAK_BYTES_PER_DOCUMENT))
def test_compute_memory_per_document_is_bounded(syncfree: Any, name: str) -> None:
    """The concatenated states are freed once ranked and the ranks made in place: the compute's peak stays under
    its bound per document (before: 99 / 122 / 183 bytes)."""
    queries, documents = 200, 100
    generator = torch.Generator().manual_seed(0)
    metric = METRICS[name][0](**({"top_k": 10} if name == "Precision" else {}))
    for _ in range(2):  # two stored batches: the compute concatenates them
        indexes = torch.arange(queries).repeat_interleave(documents // 2)
        target = torch.randint(0, 2, (indexes.numel(),), generator=generator)
        metric.update(torch.rand(indexes.numel(), generator=generator), target, indexes=indexes)
    metric.compute()
    metric._computed = None  # compute() returns its cached value otherwise
    peak = peak_allocated_by(metric.compute)
    assert peak <= COMPUTE_PEAK_BYTES_PER_DOCUMENT[name] * queries * documents, peak / (queries * documents)


@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.compile
def test_update_traces_without_a_graph_break(name: str) -> None:
    torch._dynamo.reset()
    cls = METRICS[name][0]
    with torchmetrics_syncfree.patched():
        metric = cls(ignore_index=-1)
        preds, target, indexes = _batches(2, -1)[0]
        explanation = torch._dynamo.explain(lambda p, t, i: metric.update(p, t, indexes=i))(preds, target, indexes)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


# --------------------------------------------------------------------------------------------------------------------
# RetrievalPrecisionRecallCurve and RetrievalRecallAtFixedPrecision (area retrieval_precision_recall_curve)

CURVE_CASES: dict[str, tuple[type, dict[str, Any]]] = {
    "curve": (retrieval.RetrievalPrecisionRecallCurve, {}),
    "curve-max_k": (retrieval.RetrievalPrecisionRecallCurve, {"max_k": 5}),
    "curve-adaptive": (retrieval.RetrievalPrecisionRecallCurve, {"max_k": 12, "adaptive_k": True}),
    "curve-median-skip-ignore": (
        retrieval.RetrievalPrecisionRecallCurve,
        {"max_k": 4, "aggregation": "median", "empty_target_action": "skip", "ignore_index": -1},
    ),
    "curve-max-pos": (
        retrieval.RetrievalPrecisionRecallCurve,
        {"max_k": 4, "aggregation": "max", "empty_target_action": "pos"},
    ),
    "curve-min": (retrieval.RetrievalPrecisionRecallCurve, {"max_k": 4, "aggregation": "min"}),
    "recall@precision": (retrieval.RetrievalRecallAtFixedPrecision, {"min_precision": 0.5}),
    "recall@precision-max_k": (retrieval.RetrievalRecallAtFixedPrecision, {"min_precision": 0.3, "max_k": 6}),
    "recall@precision-none-qualifies": (retrieval.RetrievalRecallAtFixedPrecision, {"min_precision": 0.99, "max_k": 6}),
    "recall@precision-adaptive": (
        retrieval.RetrievalRecallAtFixedPrecision,
        {"min_precision": 0.0, "max_k": 6, "adaptive_k": True, "ignore_index": -1},
    ),
}


def _curve_run(cls: type, kwargs: dict[str, Any], data: list[Batch]) -> list[Tensor]:
    """Every value of forward() per batch and of compute() after them (tuples flattened)."""
    metric, out = cls(**kwargs), []
    for preds, target, indexes in data:
        out.extend(metric(preds, target, indexes=indexes))
    out.extend(metric.compute())
    return out


@pytest.mark.parametrize("path", PATHS)
def test_curves_parity_with_stock(path: str) -> None:
    """Precision/recall curves and recall at fixed precision: stock's values, dtypes, shapes and devices (max_k set or
    not, adaptive_k, every aggregation, empty_target_action, ignore_index, ties of equal relevance, float64 scores)."""
    for seed, (label, (cls, kwargs)) in enumerate(CURVE_CASES.items()):
        data = _batches(seed, kwargs.get("ignore_index"))
        stock = _curve_run(cls, kwargs, data)
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            patched = _curve_run(cls, kwargs, data)
        assert len(patched) == len(stock), label
        for i, (s, p) in enumerate(zip(stock, patched)):
            assert (p.dtype, p.shape, p.device) == (s.dtype, s.shape, s.device), (label, i)
            torch.testing.assert_close(p, s, rtol=1e-6, atol=0, msg=lambda m, w=f"{label} value {i}": f"{w}: {m}")


@pytest.mark.parametrize("delay", [0, None], ids=["copy-arrived", "copy-in-flight"])
@pytest.mark.parametrize("label", ["curve-max_k", "recall@precision-adaptive", "curve", "AUROC"])
def test_curves_update_forward_and_compute_are_sync_free(syncfree: Any, label: str, delay: int | None) -> None:
    """0 reads in update; forward and compute read only the size of the largest query when ``max_k`` is not set
    (the length of their output), once each; also with the check counters' copy in flight (a GPU a step behind),
    where compute() reads the counters once more (its eager point)."""
    auroc = (retrieval.RetrievalAUROC, {"max_fpr": 0.5, "ignore_index": -1})
    cls, kwargs = auroc if label == "AUROC" else CURVE_CASES[label]
    data = _batches(3, kwargs.get("ignore_index"))
    metric = cls(**kwargs)
    with _instrumentation.simulated_copy_delay(delay), SyncProbe() as probe:
        for preds, target, indexes in data[:2]:
            metric.update(preds, target, indexes=indexes)
    assert probe.count == 0, probe.summary()
    reads = 0 if kwargs.get("max_k") or label == "AUROC" else 1
    for preds, target, indexes in data[2:]:
        with _instrumentation.simulated_copy_delay(delay), SyncProbe() as probe:
            metric(preds, target, indexes=indexes)
        assert probe.count == reads, probe.summary()
    with _instrumentation.simulated_copy_delay(delay), SyncProbe() as probe:
        metric.compute()
    assert probe.count == reads + (delay is None), probe.summary()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", ["target 2", "all ignored", "no positive"])
def test_curves_raise_stocks_errors(path: str, case: str) -> None:
    """Stock's ValueError and message: invalid batches at once on CPU, at the end of the update on the device path
    (left out of the state); ``empty_target_action="error"`` from compute."""
    indexes = torch.tensor([5, 5, 1])  # "no positive": query 5
    ignore_index = -1 if case == "all ignored" else None
    preds, target = INVALID.get(case, (torch.tensor([0.2, 0.7, 0.1]), torch.tensor([0, 0, 1]), None))[:2]
    kwargs = {"max_k": 3, "ignore_index": ignore_index, "empty_target_action": "error"}
    good = (torch.tensor([0.5, 0.2, 0.3, 0.9]), torch.tensor([1, 0, 1, 0]), torch.tensor([0, 0, 1, 1]))

    def run(metric: Any) -> tuple[Tensor, Tensor, Tensor]:
        metric.update(*good[:2], indexes=good[2])
        metric.update(preds, target, indexes=indexes)
        return metric.compute()

    with pytest.raises(ValueError) as expected:
        run(retrieval.RetrievalPrecisionRecallCurve(**kwargs))
    with torchmetrics_syncfree.patched():
        metric = retrieval.RetrievalPrecisionRecallCurve(**kwargs)
        probe = SyncProbe() if path == "device" else contextlib.nullcontext()
        with probe, pytest.raises(ValueError, match=str(expected.value).replace("`", ".")):
            run(metric)
        assert pending_checks(metric) == 0
        if case != "no positive":  # the invalid batch never counted
            reference = retrieval.RetrievalPrecisionRecallCurve(**kwargs)
            reference.update(*good[:2], indexes=good[2])
            for p, s in zip(metric.compute(), reference.compute()):
                torch.testing.assert_close(p, s, rtol=1e-6, atol=0)


def test_curve_states_survive_deepcopy_pickle_and_merge_state(syncfree: Any) -> None:
    """The device path's list states (ignored entries kept) through deepcopy, pickle and merge_state: stock's curve."""
    data = _batches(12, -1)
    kwargs = {"max_k": 5, "ignore_index": -1}
    torchmetrics_syncfree.unpatch_all()
    reference = retrieval.RetrievalPrecisionRecallCurve(**kwargs)
    for preds, target, indexes in data:
        reference.update(preds, target, indexes=indexes)
    expected = reference.compute()
    torchmetrics_syncfree.patch_all()
    metric, other = (retrieval.RetrievalPrecisionRecallCurve(**kwargs) for _ in range(2))
    with SyncProbe() as probe:
        for preds, target, indexes in data[:2]:
            metric.update(preds, target, indexes=indexes)
        for preds, target, indexes in data[2:]:
            other.update(preds, target, indexes=indexes)
    assert probe.count == 0
    for twin in (copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))):
        twin.merge_state(other)
        with SyncProbe():
            values = twin.compute()
        for v, e in zip(values, expected):
            torch.testing.assert_close(v, e, rtol=1e-6, atol=0)
    metric.reset()
    assert metric.target == []


@pytest.mark.compile
def test_curve_update_traces_without_a_graph_break() -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = retrieval.RetrievalPrecisionRecallCurve(max_k=4, ignore_index=-1)
        preds, target, indexes = _batches(2, -1)[0]
        explanation = torch._dynamo.explain(lambda p, t, i: metric.update(p, t, indexes=i))(preds, target, indexes)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
@pytest.mark.parametrize(
    "make",
    [
        lambda: retrieval.RetrievalAUROC(max_fpr=0.5, ignore_index=-1),
        lambda: retrieval.RetrievalPrecisionRecallCurve(max_k=4, ignore_index=-1),
        lambda: retrieval.RetrievalRecallAtFixedPrecision(min_precision=0.3, max_k=4, ignore_index=-1),
    ],
    ids=["AUROC", "PrecisionRecallCurve", "RecallAtFixedPrecision"],
)
def test_cuda_update_and_forward_never_sync(make: Callable[[], Any]) -> None:
    """``torch.cuda.set_sync_debug_mode("error")`` around update and forward; values as on the CPU (rtol 1e-5)."""
    from tests._probing import syncs_are_errors

    batches = [tuple(x.cuda() for x in batch) for batch in _batches(7, -1)]
    expected = make()
    with torchmetrics_syncfree.patched():
        metric = make().cuda()
        metric.update(*batches[0][:2], indexes=batches[0][2])  # allocations and lazy CUDA initialisation outside
        metric.reset()
        with syncs_are_errors():
            got = [metric(p, t, indexes=i) for p, t, i in batches]
    for (p, t, i), value in zip(_batches(7, -1), got):
        want = expected(p, t, indexes=i)
        for w, g in zip(want if isinstance(want, tuple) else (want,), value if isinstance(value, tuple) else (value,)):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6)


def _retrieval_world_data(rank: int) -> list[Batch]:
    return _batches(40 + rank, -1)


def _retrieval_world(rank: int, world_size: int) -> dict[str, Any]:
    """Every rank updates MRR (ignore_index, device path); rank 1 also an invalid batch, and an "error" metric gets a
    query without a relevant document on rank 1 only: compute() raises on every rank, then gives stock's value."""
    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    torchmetrics_syncfree.patch_all()
    _instrumentation.force_device_path(True)
    out: dict[str, Any] = {}
    metric = retrieval.RetrievalMRR(ignore_index=-1)
    strict = retrieval.RetrievalMRR(empty_target_action="error")
    for preds, target, indexes in _retrieval_world_data(rank):
        metric.update(preds, target, indexes=indexes)
    strict.update(torch.tensor([0.5, 0.2]), torch.tensor([1, rank % 2]), indexes=torch.tensor([0, 1 + rank]))
    # as many updates on every rank (stock's list states, dist_reduce_fx=None, are gathered per stored batch)
    with _instrumentation.simulated_copy_delay(None):  # not reported before compute()
        bad = torch.tensor([0, 2 if rank == 1 else 1])
        metric.update(torch.tensor([0.5, 0.2]), bad, indexes=torch.tensor([100, 100]))
    for name, m in (("mrr", metric), ("strict", strict)):
        try:
            m.compute()
            out[f"{name}_error"] = None
        except ValueError as err:
            out[f"{name}_error"] = str(err)
    out["mrr"] = metric.compute()
    out["strict_synced"] = strict._is_synced
    _instrumentation.force_device_path(False)
    return out


@pytest.mark.slow  # two spawned ranks: about a minute on the 2-core VM
def test_ddp_ranks_raise_together_and_compute_stocks_value(tmp_path: Any) -> None:
    from tests import _ddp_world

    world_size = 2
    results = [
        res["_retrieval_world@gloo"] for res in _ddp_world.run_world([("gloo", _retrieval_world)], world_size, tmp_path)
    ]
    stock = retrieval.RetrievalMRR(ignore_index=-1)
    for rank in range(world_size):
        for preds, target, indexes in _retrieval_world_data(rank):
            stock.update(preds, target, indexes=indexes)
    stock.update(torch.tensor([0.5, 0.2]), torch.tensor([0, 1]), indexes=torch.tensor([100, 100]))  # rank 0's
    for res in results:
        assert res["mrr_error"] == "`target` must contain `binary` values"
        assert res["strict_error"] == "`compute` method was provided with a query with no positive target."
        torch.testing.assert_close(res["mrr"], stock.compute(), rtol=1e-6, atol=0)
        assert res["strict_synced"] is False  # left unsynced and usable
