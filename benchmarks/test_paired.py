"""Patched/stock host-time ratios measured as an interleaved A/B, for every catalogue configuration and call.

``test_catalogue.py`` times stock and patched as two separate benchmarks, one after the other. On a shared 2-core VM
the speed of the machine drifts between the two by more than the 5 % the targets are about (identical code paths
came out 1.04 and 1.39 in one run). Here every round of the pytest-benchmark measurement of the *patched* calls is
preceded, in its untimed ``setup``, by a block of the same calls on a stock metric, timed the same way; the ratio of
each round's pair is taken and the median over rounds is the configuration's ratio (``extra_info["ratio"]``).
Drift slower than one round (a few ms) cancels out of every pair.

Three sets of pairs:

* ``test_paired_host_time``: the audit's catalogue (batch 32, 5 classes, 4 labels), ``update``/``forward``/``compute``;
* ``test_paired_host_time_at_size``: where users are: multiclass ``Accuracy`` (micro) and ``F1Score`` (macro) at
  10, 100 and 1000 classes x batch 32, 256 and 1024 and at 100 classes x batch 4096, ``Accuracy`` at 10000 and 100000
  classes, with ``top_k=5`` at 1000 and 10000, binary at batch 1024 and multilabel at 100 labels x batch 256,
  ``update`` and ``forward``;

Every pair also records the bytes one call allocates, stock and patched (``stock_bytes``/``patched_bytes``: the new
tensors' storages, deterministic, an upper bound of the call's peak memory).
* ``test_paired_census_host_time``: the patched classes that the census measures and the audit's catalogue has not
  (``HausdorffDistance``, ``PanopticQuality``, ``ModifiedPanopticQuality``, ``MultioutputWrapper``), on the census's
  inputs, ``update`` and ``forward``;
* ``test_paired_nominal_compute_at_size``: the four nominal metrics' ``compute`` of a table of 10, 100 and 1000
  classes that 32 or 1024 pairs filled (sparse and dense tables);
* ``test_paired_report_step``: the motivating report's metric step, ``MeanMetric(loss)`` plus multiclass
  ``Accuracy``/``Precision``/``Recall``/``F1Score`` (1000 classes, ``average='macro'``) updated with the logits of a
  batch of 128 (the demo's :class:`~torchmetrics_syncfree.tools.demo.MetricSet`).

The realistic sizes run with one torch thread: with two, the OpenMP threads of a large op spin-wait for a core that
the shared 2-core VM has given to another process, and a call's host time comes out as a multiple of the scheduler's
time slice (a first run measured 8.0 ms per ``update`` at 100 classes x batch 1024, stock and patched alike, against
0.13 ms at batch 256), which hides the metric code being measured.

Both sides start every block from the same one-update state (list states, e.g. ``CatMetric``, would otherwise grow
with the rounds). In the test environments (``--benchmark-disable``) each test runs one round, as a check that every
call works in both modes and that the patched and stock states agree (but the pairs in ``_TIMED_ONLY``).

"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torchmetrics

from torchmetrics_syncfree import _instrumentation, _registry
from torchmetrics_syncfree.tools import census
from torchmetrics_syncfree.tools.allocations import allocations_of
from torchmetrics_syncfree.tools.audit import BATCH, CALLS, CATALOGUE, Config, build_metric, make_inputs
from torchmetrics_syncfree.tools.demo import MetricSet

ROUNDS = 50
#: host time per block of calls: long enough to time well, short enough that the machine does not drift within it
BLOCK_SECONDS = 4e-3
#: untimed calls before every block, for at most ``WARM_SECONDS``: after a switch of the patches (either way) the next
#: calls run slow and speed up over about ten (measured: ``MulticlassROC(average="micro")`` forward at 10 classes x
#: batch 256, +200 us on the first call, back to normal by the tenth, stock and patched alike), and that does not cancel
#: out of a pair: with one warm call the row read 1.17 in three runs, with up to 2 ms of them 1.06-1.08, with these
#: 1.03-1.04. A call longer than ``WARM_SECONDS`` gets one (the slowdown is ~1 % of it).
WARM_CALLS = 20
WARM_SECONDS = 5e-3
CLASS_COUNTS = (10, 100, 1000)
BATCH_SIZES = (32, 256, 1024)
_LARGE_CONFUSION_MATRIX = "ConfusionMatrix(task='multiclass', num_classes=10000)"
#: pairs the test environments' one-round check leaves to ``tox -e bench``: the forward of a 10000-class confusion
#: matrix copies and merges its 800 MB state, stock and patched alike (27 s of CI's 60 s benchmark check); the update
#: of the same size is still checked there
_TIMED_ONLY = {(_LARGE_CONFUSION_MATRIX, 128, "forward")}
#: (configuration, batch size) of the realistic-size pairs
SIZED: tuple[tuple[Config, int], ...] = (
    *(
        (Config(f"{name}(task='multiclass', num_classes={classes}, average={average!r})"), batch)
        for name, average in (("Accuracy", "micro"), ("F1Score", "macro"))
        for classes in CLASS_COUNTS
        for batch in BATCH_SIZES
    ),
    (Config("Accuracy(task='binary')"), 1024),
    # the defaults at a large batch
    *(
        (Config(f"{name}(task='multiclass', num_classes=100)"), 4096)
        for name in ("Accuracy", "F1Score")  # micro and macro: each metric's default average
    ),
    # where classes are many: stock counts a C x C matrix per update (0.6 s at 10000 classes on one CPU thread; at
    # 100000 classes its 80 GB do not fit: no pair), and one-hot encodes the batch twice with top_k > 1
    (Config("F1Score(task='multiclass', num_classes=10000, average='macro')"), 128),
    *((Config(f"Accuracy(task='multiclass', num_classes={classes})"), 128) for classes in (10000, 100000)),
    *(
        (Config(f"Accuracy(task='multiclass', num_classes={classes}, top_k=5, average={average!r})"), 128)
        for classes in (1000, 10000)
        for average in ("micro", "macro")
    ),
    (Config("F1Score(task='multilabel', num_labels=100, average='macro')"), 256),
    # the confusion-matrix family: its update is shared by CohenKappa, MatthewsCorrCoef and JaccardIndex
    *(
        (Config(f"{name}(task='multiclass', num_classes={classes})"), batch)
        for name in ("ConfusionMatrix", "JaccardIndex")
        for classes in (10, 1000)
        for batch in (32, 256)
    ),
    # stock counts a new C x C matrix per update (800 MB here), the patched update counts into the state
    (Config(_LARGE_CONFUSION_MATRIX), 128),
    # HingeLoss and the PR-curve family's binned update (AUROC; stock's N x C x T comparisons vs bucketize)
    *(
        (Config(spec.format(classes=classes)), batch)
        for spec in (
            "HingeLoss(task='multiclass', num_classes={classes})",
            "AUROC(task='multiclass', num_classes={classes}, thresholds=100)",
            # unbinned (the default): the CPU path computes with stock's functions, so these stay near 1
            "AUROC(task='multiclass', num_classes={classes})",
            "AveragePrecision(task='multiclass', num_classes={classes})",
            # micro-averaged unbinned curve: one-hot list state (stock's update on CPU; its compute in forward)
            "ROC(task='multiclass', num_classes={classes}, average='micro')",
        )
        for classes in (10, 1000)
        for batch in (32, 256)
    ),
    (Config("ExactMatch(task='multilabel', num_labels=100)"), 256),
    # CalibrationError with ignore_index: the kept-entries update and the fixed-shape bins on every device (stock
    # selects the kept entries with a boolean mask)
    *(
        (Config(spec), batch)
        for spec in (
            "CalibrationError(task='binary', ignore_index=-1)",
            "CalibrationError(task='multiclass', num_classes=10, ignore_index=-1)",
        )
        for batch in (32, 1024)
    ),
    # the regression metrics (compute-time syncs; KLDivergence's update) at a larger batch
    *(
        (Config(spec), 1024)
        for spec in ("R2Score()", "ExplainedVariance()", "PearsonCorrCoef()", "KLDivergence()", "SpearmanCorrCoef()")
    ),
    # a wrapper, an image, a text and a segmentation metric at batch 256
    *(
        (Config(spec), 256)
        for spec in (
            "MinMaxMetric(MeanSquaredError())",
            "PeakSignalNoiseRatio(data_range=1.0)",
            "Perplexity(ignore_index=-100)",
            "GeneralizedDiceScore(num_classes=5, input_format='index')",
        )
    ),
    # retrieval: 32 queries x 10 and x 100 documents per step (the audit's retrieval inputs)
    *(
        (Config(spec), batch)
        for spec in ("RetrievalMRR()", "RetrievalPrecision(top_k=10)", "RetrievalNormalizedDCG()", "RetrievalMAP()")
        for batch in (320, 3200)
    ),
)
REPORT_STEP = "report step: MeanMetric(loss) + Accuracy/Precision/Recall/F1Score(num_classes={}, average='macro')"
REPORT_BATCH = 128


@dataclass
class _Side:
    """One side of the A/B: the timed call, the metrics it updates and one update of all of them."""

    call: Callable[[], Any]
    metrics: list[Any]
    update: Callable[[], Any]

    def fresh(self) -> None:
        """Back to the one-update state every block starts from."""
        for metric in self.metrics:
            metric.reset()
        self.update()


def _calls(metric: Any, call: str, args: tuple, kwargs: dict) -> Callable[[], Any]:
    if call == "update":
        return lambda: metric.update(*args, **kwargs)
    if call == "forward":
        return lambda: metric(*args, **kwargs)

    def compute() -> Any:
        metric._computed = None  # the wrapper caches compute(); measure the computation itself
        return metric.compute()

    return compute


def _block_size(call: Callable[[], Any]) -> int:
    start = time.perf_counter()
    for _ in range(5):
        call()
    return max(5, min(500, int(BLOCK_SECONDS / ((time.perf_counter() - start) / 5))))


def _measure_pair(
    benchmark: Any, make_side: Callable[[], _Side], info: dict[str, Any], device_path: bool = False
) -> None:
    """Time blocks of ``make_side()``'s call patched, each right after the same block stock; record the ratios.

    ``device_path``: the patched side takes the GPU code path on its CPU tensors (checks counted in the metric's
    state, a sweep at the end of every update, fixed-shape counting), so its host cost is what it is on a GPU.
    """
    _registry.unpatch_all()
    stock = make_side()
    _registry.patch_all()
    patched = make_side()

    warm_calls = 1 if benchmark.disabled else WARM_CALLS

    def fresh(side: _Side) -> None:
        """Same one-update state for both, after untimed calls that warm what switching the patches left cold."""
        side.fresh()
        deadline = time.perf_counter() + WARM_SECONDS
        for _ in range(warm_calls):
            side.call()
            if time.perf_counter() > deadline:
                break
        side.fresh()

    _registry.unpatch_all()
    fresh(stock)
    size = 1 if benchmark.disabled else _block_size(stock.call)
    stock_rounds: list[float] = []

    def stock_block_then_patch() -> None:  # pytest-benchmark's untimed setup of each round
        _registry.unpatch_all()
        fresh(stock)
        start = time.perf_counter()
        for _ in range(size):
            stock.call()
        stock_rounds.append(time.perf_counter() - start)
        _registry.patch_all()
        with _device_path(device_path):
            fresh(patched)

    def patched_block() -> None:
        with _device_path(device_path):
            for _ in range(size):
                patched.call()

    try:
        benchmark.pedantic(patched_block, setup=stock_block_then_patch, rounds=ROUNDS, warmup_rounds=1)
    finally:
        _registry.unpatch_all()
    for stock_metric, patched_metric in zip(stock.metrics, patched.metrics):  # same calls, same state: they agree
        for name in stock_metric._defaults:  # (patched ones have their check counters too)
            torch.testing.assert_close(getattr(patched_metric, name), getattr(stock_metric, name), equal_nan=True)
    if benchmark.disabled:
        return
    # memory: the bytes of the new tensors of one call, and the most of them alive at once (both deterministic)
    stock_bytes = allocations_of(stock.call)
    _registry.patch_all()
    try:
        with _device_path(device_path):
            patched_bytes = allocations_of(patched.call)
    finally:
        _registry.unpatch_all()
    patched_rounds = benchmark.stats.stats.data
    pairs = list(zip(stock_rounds[-len(patched_rounds) :], patched_rounds))  # the warm-up round has no timing
    benchmark.group = f"paired :: {info['call']}"
    benchmark.extra_info.update(
        {
            **info,
            "mode": "paired-device-path" if device_path else "paired",
            "calls_per_round": size,
            "stock_median": statistics.median(s for s, _ in pairs) / size,
            "patched_median": statistics.median(p for _, p in pairs) / size,
            "ratio": statistics.median(p / s for s, p in pairs),
            "stock_bytes": stock_bytes.total,
            "patched_bytes": patched_bytes.total,
            "stock_peak_bytes": stock_bytes.peak,
            "patched_peak_bytes": patched_bytes.peak,
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "torchmetrics": torchmetrics.__version__,
        }
    )


@contextmanager
def _device_path(enabled: bool) -> Iterator[None]:
    previous = _instrumentation.device_path_forced()
    _instrumentation.force_device_path(enabled or previous)
    try:
        yield
    finally:
        _instrumentation.force_device_path(previous)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run the test with one intra-op torch thread (see the module docstring), then restore the setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _metric_side(config: Config, call: str, batch: int) -> Callable[[], _Side]:
    return _spec_side(
        config.spec, call, lambda metric: make_inputs(config.inputs, metric, torch.device("cpu"), batch=batch)
    )


def _spec_side(spec: str, call: str, inputs: Callable[[Any], tuple[tuple, dict]]) -> Callable[[], _Side]:
    """One side of the A/B: a metric built from ``spec``, updated with ``inputs(metric)``."""

    def make() -> _Side:
        metric = build_metric(spec)
        args, kwargs = inputs(metric)
        return _Side(_calls(metric, call, args, kwargs), [metric], lambda: metric.update(*args, **kwargs))

    return make


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("config", CATALOGUE, ids=[c.label for c in CATALOGUE])
def test_paired_host_time(benchmark: Any, config: Config, call: str) -> None:
    info = {"config": config.label, "call": call, "area": config.area, "batch": BATCH}
    _measure_pair(benchmark, _metric_side(config, call, BATCH), info)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("call", ("update", "forward"))
@pytest.mark.parametrize(("config", "batch"), SIZED, ids=[f"{c.label} batch {b}" for c, b in SIZED])
def test_paired_host_time_at_size(benchmark: Any, config: Config, batch: int, call: str) -> None:
    if benchmark.disabled and (config.spec, batch, call) in _TIMED_ONLY:
        pytest.skip("timed by `tox -e bench` only: too heavy for the one-round check")
    info = {"config": f"{config.label} batch {batch}", "call": call, "area": config.area, "batch": batch}
    _measure_pair(benchmark, _metric_side(config, call, batch), info)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("path", ["cpu", "device"])
@pytest.mark.parametrize("call", ["update", "forward"])
@pytest.mark.parametrize("classes", [10, 1000])
def test_paired_report_step(benchmark: Any, classes: int, call: str, path: str) -> None:
    """The report's metric step (target: host time <= stock's): the patched device path against stock's CPU path."""
    gen = torch.Generator().manual_seed(0)
    loss = torch.rand((), generator=gen) * 7
    logits = torch.randn(REPORT_BATCH, classes, generator=gen)
    target = torch.randint(0, classes, (REPORT_BATCH,), generator=gen)

    def make() -> _Side:
        metrics = MetricSet(classes, "macro", "cpu")
        members = [metrics.loss, *metrics.classification.values()]

        def update() -> None:
            metrics.update(loss, logits, target)

        def forward() -> None:
            metrics.loss(loss)
            for metric in metrics.classification.values():
                metric(logits, target)

        return _Side(update if call == "update" else forward, members, update)

    config = f"{REPORT_STEP.format(classes)} batch {REPORT_BATCH}" + (" (device path)" if path == "device" else "")
    info = {"config": config, "call": call, "area": "step", "batch": REPORT_BATCH}
    _measure_pair(benchmark, make, info, device_path=path == "device")


#: the configurations whose GPU code path is timed on CPU (the checks a GPU run files and sweeps)
DEVICE_PATH = tuple(
    Config(spec, inputs)
    for spec, inputs in (
        ("MeanMetric()", "loss"),
        ("MeanMetric(nan_strategy='error')", "vector"),
        ("SumMetric(nan_strategy='warn')", "vector"),
        ("Accuracy(task='binary')", "auto"),
        ("Accuracy(task='multiclass', num_classes=10, average='micro')", "auto"),
        ("F1Score(task='multiclass', num_classes=10, average='macro')", "auto"),
        ("F1Score(task='multiclass', num_classes=1000, average='macro')", "auto"),
        ("F1Score(task='multilabel', num_labels=10, average='macro')", "auto"),
        # forward computes the batch value: the sorted fixed-shape curves against stock's per-class loop
        ("AUROC(task='binary')", "auto"),
        ("AUROC(task='multiclass', num_classes=10)", "auto"),
        ("AUROC(task='multiclass', num_classes=1000)", "auto"),
        ("AveragePrecision(task='multilabel', num_labels=10)", "auto"),
        # the micro one-hot list state by comparison with every class, against stock's mask and one_hot
        ("ROC(task='multiclass', num_classes=10, average='micro', ignore_index=-1)", "auto"),
        # regression: forward computes the batch value (R2/Pearson: torch.where; Spearman: sort-based ranks)
        ("R2Score()", "auto"),
        ("PearsonCorrCoef()", "auto"),
        ("SpearmanCorrCoef()", "auto"),
        ("KLDivergence()", "auto"),
        # the other metrics: the fixed-shape updates (and MinMaxMetric's on-device comparison in forward)
        ("MinMaxMetric(MeanSquaredError())", "auto"),
        ("PeakSignalNoiseRatio(data_range=1.0)", "auto"),
        ("Perplexity(ignore_index=-100)", "auto"),
        ("GeneralizedDiceScore(num_classes=5, input_format='index')", "auto"),
        # retrieval: forward's compute is the fixed-shape pass against stock's per-query loop (4 queries x 8 documents)
        ("RetrievalMRR()", "auto"),
        ("RetrievalNormalizedDCG()", "auto"),
        ("RetrievalMAP()", "auto"),
    )
)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("call", ("update", "forward"))
@pytest.mark.parametrize("config", DEVICE_PATH, ids=[c.label for c in DEVICE_PATH])
def test_paired_device_path(benchmark: Any, config: Config, call: str) -> None:
    """Host time of the patched GPU code path, timed on CPU, against stock on CPU (which would sync on a GPU)."""
    info = {"config": f"{config.label} (device path)", "call": call, "area": config.area, "batch": BATCH}
    _measure_pair(benchmark, _metric_side(config, call, BATCH), info, device_path=True)


#: patched classes outside the audit's catalogue, measured on the census's inputs (its specifications, batch 32)
CENSUS_PAIRS = (
    ("segmentation", "HausdorffDistance"),
    ("detection", "PanopticQuality"),
    ("detection", "ModifiedPanopticQuality"),
    ("wrappers", "MultioutputWrapper"),
)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("call", ("update", "forward"))
@pytest.mark.parametrize(("area", "name"), CENSUS_PAIRS, ids=[name for _, name in CENSUS_PAIRS])
def test_paired_census_host_time(benchmark: Any, area: str, name: str, call: str) -> None:
    """Host time of the classes only the census measures: stock's per-sample loops against the fixed-shape updates."""
    spec = census.spec_for(name, getattr(importlib.import_module(f"torchmetrics.{area}"), name))
    make = _spec_side(spec.spec, call, lambda metric: census.make_inputs(spec.inputs, metric, torch.device("cpu")))
    info = {"config": spec.spec, "call": call, "area": Config(spec.spec).area, "batch": BATCH}
    _measure_pair(benchmark, make, info)


NOMINAL = ("CramersV", "TschuprowsT", "PearsonsContingencyCoefficient", "TheilsU")
NOMINAL_SIZES = tuple((c, n) for c in CLASS_COUNTS for n in (32, 1024))


def _label_pairs(metric: Any, pairs: int) -> tuple[tuple, dict]:
    """``pairs`` labels and labels close to them (a diagonal band of the table), the same on both sides."""
    generator = torch.Generator().manual_seed(0)
    preds = torch.randint(metric.num_classes, (pairs,), generator=generator)
    target = (preds + torch.randint(3, (pairs,), generator=generator)) % metric.num_classes
    return (preds, target), {}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(("classes", "pairs"), NOMINAL_SIZES, ids=[f"{c} classes {n} pairs" for c, n in NOMINAL_SIZES])
@pytest.mark.parametrize("name", NOMINAL)
def test_paired_nominal_compute_at_size(benchmark: Any, name: str, classes: int, pairs: int) -> None:
    """The nominal computes where the table is large and sparse (a ``forward``'s batch value) or filled."""
    spec = f"{name}(num_classes={classes})"
    make = _spec_side(spec, "compute", lambda metric: _label_pairs(metric, pairs))
    info = {"config": f"{spec} {pairs} pairs", "call": "compute", "area": Config(spec).area, "batch": pairs}
    _measure_pair(benchmark, make, info)
