"""Multiclass stat scores at the class counts users have: O(batch + classes) per update, never classes x classes.

Stock counts every macro/weighted/none update into a ``C x C`` confusion matrix (80 GB of int64 at 100000 classes);
the patched update counts hits and misses per target class and predictions per class. Allocations are deterministic
(the bytes of every new tensor an update makes), so they are asserted here; time is the benchmarks'
(``docs/measurements.md``).
"""

from __future__ import annotations

import heapq
from typing import Any

import pytest
import torch
from torchmetrics import classification

import torchmetrics_syncfree
from tests._probing import PATHS_WITH_FLIGHT, on_path
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.tools.allocations import PEAK_MEASURABLE, allocated_by, peak_allocated_by

#: every multiclass stat-score metric (each a ``MulticlassStatScores`` whose update this counts)
STAT_SCORE_METRICS = (
    "MulticlassStatScores",
    "MulticlassAccuracy",
    "MulticlassPrecision",
    "MulticlassRecall",
    "MulticlassF1Score",
    "MulticlassSpecificity",
    "MulticlassNegativePredictiveValue",
    "MulticlassHammingDistance",
)
BATCH = 128
MIB = 2**20
#: the metrics of the 100000-class allocation tests: every one on the newest release (tm19, ``slow``), the base class
#: on the others, where the counting they all share is the same code (~25 s of CPU per release saved)
STAT_SCORE_METRICS_AT_SCALE = [
    STAT_SCORE_METRICS[0],
    *(pytest.param(name, marks=pytest.mark.slow) for name in STAT_SCORE_METRICS[1:]),
]


def _make(name: str, num_classes: int, **kwargs: Any) -> Any:
    return getattr(classification, name)(num_classes=num_classes, **kwargs)


def _inputs(num_classes: int, scores: bool, ignore_index: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(num_classes)
    target = torch.randint(num_classes, (BATCH,), generator=generator)
    target[: BATCH // 2] = torch.randint(5, (BATCH // 2,), generator=generator)  # hits, misses and repeated classes
    if ignore_index is not None:
        target[::7] = ignore_index
    if scores:
        preds = torch.rand(BATCH, num_classes, generator=generator)
        preds[torch.arange(BATCH // 2), target[: BATCH // 2].clamp(min=0)] += 2.0  # half the batch predicted right
        return preds, target
    preds = torch.where(torch.arange(BATCH) % 3 == 0, target.clamp(min=0), torch.randint(num_classes, (BATCH,)))
    return preds, target


def _top_k_labels(preds: torch.Tensor, target: torch.Tensor, top_k: int) -> list[int]:
    """The class each entry predicts with ``top_k``, in Python: its target where the target is among its ``top_k``
    highest scores, else its highest score's class (TorchMetrics' top-k rule).
    """
    ranked = [heapq.nlargest(top_k, range(len(row)), key=row.__getitem__) for row in preds.tolist()]
    return [truth if truth in top else top[0] for top, truth in zip(ranked, target.tolist())]


def _reference_stats(
    preds: torch.Tensor | list[int], target: torch.Tensor, num_classes: int, ignore_index: int | None
) -> torch.Tensor:
    """tp/fp/tn/fn per class by counting in Python, entry by entry: independent of any tensor counting.

    ``preds``: scores (their argmax predicts), labels, or the labels of :func:`_top_k_labels`.
    """
    if not isinstance(preds, list):
        preds = (preds.argmax(1) if preds.is_floating_point() else preds).tolist()
    labels = preds
    tp, fp, fn = [0] * num_classes, [0] * num_classes, [0] * num_classes
    counted = 0
    for label, truth in zip(labels, target.tolist()):
        if truth == ignore_index:
            continue
        counted += 1
        if label == truth:
            tp[truth] += 1
        else:
            fp[label] += 1
            fn[truth] += 1
    tn = [counted - a - b - c for a, b, c in zip(tp, fp, fn)]
    return torch.tensor([tp, fp, tn, fn])


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
@pytest.mark.parametrize("scores", [True, False], ids=["scores", "labels"])
@pytest.mark.parametrize("name", STAT_SCORE_METRICS_AT_SCALE)
def test_an_update_at_100000_classes_allocates_under_10_mib(name: str, scores: bool, path: str, syncfree: Any) -> None:
    num_classes = 100_000
    metric = _make(name, num_classes, average="macro")
    preds, target = _inputs(num_classes, scores)
    with on_path(path):
        metric.update(preds, target)  # the first update makes what is made once (cached constants)
        allocated = allocated_by(lambda: metric.update(preds, target))
        if path != "cpu":  # the device path: no would-be sync in update or forward either (compute reads the checks)
            with SyncProbe() as probe:
                metric.update(preds, target)
                metric(preds, target)
            assert probe.count == 0, probe.events
    # stock's update allocates at least the C x C matrix: 80 GB here
    assert allocated < 10 * MIB, f"{allocated / MIB:.1f} MiB"


@pytest.mark.parametrize("ignore_index", [None, 3, -1])
@pytest.mark.parametrize("scores", [True, False], ids=["scores", "labels"])
def test_the_counts_at_100000_classes_are_the_entries_counted_one_by_one(
    scores: bool, ignore_index: int | None, syncfree: Any
) -> None:
    num_classes = 100_000
    preds, target = _inputs(num_classes, scores, ignore_index)
    for path in PATHS_WITH_FLIGHT:
        metric = _make("MulticlassStatScores", num_classes, average="none", ignore_index=ignore_index)
        with on_path(path):
            metric.update(preds, target)
            metric.update(preds, target)
            stats = torch.stack((metric.tp, metric.fp, metric.tn, metric.fn))
        assert torch.equal(stats, 2 * _reference_stats(preds, target, num_classes, ignore_index)), path


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
@pytest.mark.parametrize("average", ["macro", "micro"])
@pytest.mark.parametrize("name", STAT_SCORE_METRICS_AT_SCALE)
def test_a_top_5_update_at_100000_classes_allocates_under_10_mib(
    name: str, average: str, path: str, syncfree: Any
) -> None:
    """``top_k > 1``: O(batch x top_k + classes); stock one-hot encodes the batch twice (153 MB here)."""
    num_classes = 100_000
    metric = _make(name, num_classes, average=average, top_k=5)
    preds, target = _inputs(num_classes, scores=True)
    with on_path(path):
        metric.update(preds, target)
        allocated = allocated_by(lambda: metric.update(preds, target))
        if path != "cpu":
            with SyncProbe() as probe:
                metric.update(preds, target)
                metric(preds, target)
            assert probe.count == 0, probe.events
    assert allocated < 10 * MIB, f"{allocated / MIB:.1f} MiB"


def test_the_top_5_counts_at_100000_classes_are_the_entries_counted_one_by_one(syncfree: Any) -> None:
    num_classes = 100_000
    preds, target = _inputs(num_classes, scores=True)
    preds[1::4, 7] = preds[1::4].amax(1) - 1e-3  # second in those rows: a hit where the target is 7, else a miss
    target[1::8] = 7
    labels = _top_k_labels(preds, target, top_k=5)
    assert labels != preds.argmax(1).tolist()  # some targets are hits in the top 5 but not first
    for ignore_index in (None, 3, -1):
        target = target.clone()
        if ignore_index is not None:
            target[::7] = ignore_index
        expected = _reference_stats(labels, target, num_classes, ignore_index)
        for path in PATHS_WITH_FLIGHT:
            metric = _make("MulticlassStatScores", num_classes, average="none", ignore_index=ignore_index, top_k=5)
            with on_path(path):
                metric.update(preds, target)
                stats = torch.stack((metric.tp, metric.fp, metric.tn, metric.fn))
            assert torch.equal(stats, expected), (path, ignore_index)


@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_a_samplewise_update_counts_each_sample_in_a_fraction_of_stocks_memory(top_k: int, path: str) -> None:
    """``multidim_average="samplewise"``: O(entries + samples x classes), the size of its result, not of a one-hot.

    Each sample's counts are checked entry by entry; stock's values and allocations where stock runs (1.6 fails on
    samplewise ``top_k > 1``: its top-k refinement squeezes ``(N, C, ...)`` inputs, then ``scatter_`` fails).
    """
    num_classes, positions = 1000, 64
    generator = torch.Generator().manual_seed(0)
    preds = torch.rand(8, num_classes, positions, generator=generator)
    target = torch.randint(num_classes, (8, positions), generator=generator)
    target[:, ::3] = preds.argmax(1)[:, ::3]  # hits
    with torchmetrics_syncfree.patched():
        metric = _make("MulticlassRecall", num_classes, multidim_average="samplewise", top_k=top_k, average="none")
        with on_path(path):
            metric.update(preds, target)
            patched_bytes = allocated_by(lambda: metric.update(preds, target))
            if path != "cpu":
                with SyncProbe() as probe:
                    metric.update(preds, target)
                assert probe.count == 0, probe.events
                metric.tp.pop(), metric.fp.pop(), metric.tn.pop(), metric.fn.pop()  # back to the two updates compared
            states = [
                torch.stack([getattr(metric, name)[1][sample] for name in ("tp", "fp", "tn", "fn")])
                for sample in range(8)
            ]
            values = metric.compute()
    for sample, stats in enumerate(states):
        scores = preds[sample].T  # (positions, classes)
        labels = _top_k_labels(scores, target[sample], top_k)
        assert torch.equal(stats, _reference_stats(labels, target[sample], num_classes, None)), sample
    stock = _make("MulticlassRecall", num_classes, multidim_average="samplewise", top_k=top_k, average="none")
    try:
        stock.update(preds, target)
    except RuntimeError:
        assert top_k > 1
        return
    stock_bytes = allocated_by(lambda: stock.update(preds, target))
    assert torch.equal(values, stock.compute()), path
    assert patched_bytes * 8 < stock_bytes, (patched_bytes, stock_bytes)


@pytest.mark.parametrize(
    ("top_k", "scores"), [(1, True), (1, False), (3, True)], ids=["scores", "labels", "scores-top3"]
)
@pytest.mark.parametrize("average", ["macro", "weighted", "none", "micro"])
@pytest.mark.parametrize("name", STAT_SCORE_METRICS)
def test_stocks_values_at_1000_classes(name: str, scores: bool, top_k: int, average: str) -> None:
    """Where stock still runs (a 1000 x 1000 matrix, or a batch x 1000 one-hot, per update): its values, every path."""
    num_classes = 1000
    preds, target = _inputs(num_classes, scores, ignore_index=7)
    stock = _make(name, num_classes, average=average, ignore_index=7, top_k=top_k)
    stock.update(preds, target)
    expected = stock.compute()
    with torchmetrics_syncfree.patched():
        for path in PATHS_WITH_FLIGHT:
            metric = _make(name, num_classes, average=average, ignore_index=7, top_k=top_k)
            with on_path(path):
                metric.update(preds, target)
                assert torch.equal(metric.compute(), expected), path


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_an_update_at_1000_classes_allocates_a_fraction_of_stocks(path: str) -> None:
    num_classes = 1000
    preds, target = _inputs(num_classes, scores=True)
    stock = _make("MulticlassAccuracy", num_classes, average="macro")
    stock.update(preds, target)
    stock_bytes = allocated_by(lambda: stock.update(preds, target))
    with torchmetrics_syncfree.patched():
        metric = _make("MulticlassAccuracy", num_classes, average="macro")
        with on_path(path):
            metric.update(preds, target)
            patched_bytes = allocated_by(lambda: metric.update(preds, target))
    assert stock_bytes > num_classes**2 * 8  # stock's confusion matrix, int64
    assert patched_bytes * 50 < stock_bytes, (patched_bytes, stock_bytes)


@pytest.mark.skipif(not PEAK_MEASURABLE, reason=f"torch {torch.__version__}: a storage's release is not watchable")
@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
@pytest.mark.parametrize("batch", [32, 1024])
@pytest.mark.parametrize("average", ["micro", "macro"])
def test_an_update_holds_no_more_bytes_at_once_than_stocks(average: str, batch: int, path: str) -> None:
    """At 10 classes, where stock's ``C x C`` count is small, the update's peak (its new tensors alive at once: the
    labels, the counting's temporaries) stays at or below stock's, also on the device path with its checks."""
    generator = torch.Generator().manual_seed(batch)
    preds, target = torch.randn(batch, 10, generator=generator), torch.randint(10, (batch,), generator=generator)
    stock = _make("MulticlassAccuracy", 10, average=average)
    stock.update(preds, target)
    stock_peak = peak_allocated_by(lambda: stock.update(preds, target))
    with torchmetrics_syncfree.patched():
        metric = _make("MulticlassAccuracy", 10, average=average)
        with on_path(path):
            metric.update(preds, target)
            peak = peak_allocated_by(lambda: metric.update(preds, target))
    assert peak <= stock_peak, (peak, stock_peak)


def test_micro_updates_of_every_batch_length_keep_the_constants_they_share(syncfree: Any) -> None:
    """A variable-length batch (tokens) must not add a cached constant per length: the micro counts' constants are
    keyed by the class count only."""
    from torchmetrics_syncfree.classification import stat_scores

    metric = _make("MulticlassAccuracy", 10, average="micro")
    metric.update(torch.randint(10, (3,)), torch.randint(10, (3,)))
    cached = len(stat_scores._constants)
    for length in range(4, 40):
        metric.update(torch.randint(10, (length,)), torch.randint(10, (length,)))
    assert len(stat_scores._constants) == cached
