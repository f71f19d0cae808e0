"""Deferred checks through a metric's whole life: forward, reset, copies, merging, compute groups, wrappers, DDP sync.

Each test runs on the CPU path (reads are free: a problem is reported at once inside ``update``, as stock) and on the
device path (forced on CPU tensors, as a GPU run takes it: the problem is counted in the metric's check counters and
reported at an eager point). ``delay=None`` is a GPU whose copies never arrive before ``compute()`` waits for them:
the hardest case for a pending report, and the one each test is about.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torchmetrics import MetricCollection
from torchmetrics.aggregation import BaseAggregator, CatMetric, MaxMetric, MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from torchmetrics.regression import TweedieDevianceScore
from torchmetrics.wrappers import Running

import torchmetrics_syncfree
from tests import _series_tree
from torchmetrics_syncfree import _deferred, _instrumentation

NAN = float("nan")
NAN_ERROR = "Encountered `nan` values in tensor"
t = torch.tensor


@pytest.fixture(params=["cpu-path", "device-path"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Patched TorchMetrics on the CPU path, or on the device path with copies that never arrive early."""
    with torchmetrics_syncfree.patched():
        if request.param == "cpu-path":
            yield "cpu"
            return
        _instrumentation.force_device_path(True)
        try:
            with _instrumentation.simulated_copy_delay(None):
                yield "device"
        finally:
            _instrumentation.force_device_path(False)


def _update_with_nan(metric: Any, path: str, *args: Any) -> None:
    """Feed a NaN batch: the CPU path raises at once, as stock; the device path counts it."""
    if path == "cpu":
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric.update(t([NAN, 1.0]), *args)
    else:
        metric.update(t([NAN, 1.0]), *args)
        assert int(getattr(metric, _deferred.STATE).sum()) == 1


def _raises_once(path: str, call: Any, match: str = NAN_ERROR) -> None:
    """On the device path ``call()`` raises the pending error; on the CPU path it was raised at once already."""
    if path == "device":
        with pytest.raises(RuntimeError, match=match):
            call()
    call()  # reported once: the second time there is nothing left


def test_record_reports_a_set_flag_with_the_given_error_only_where_reads_are_free(path: str) -> None:
    """``record(..., report_at_once)``: where reads are free a set flag raises the caller's error (stock's, naming the
    values); on the device path the flag is counted and the caller's error is never called."""
    metric = MulticlassAccuracy(num_classes=3)
    calls = []

    def report() -> None:
        calls.append(path)
        raise ValueError("names the values")

    assert not _deferred.record(metric, _deferred.INVALID_VALUES, t(False), report) or path == "device"
    if path == "cpu":
        with pytest.raises(ValueError, match="names the values"):
            _deferred.record(metric, _deferred.INVALID_VALUES, t(True), report)
        assert calls == ["cpu"]
    else:
        assert _deferred.record(metric, _deferred.INVALID_VALUES, t(True), report)
        assert calls == []
        assert int(getattr(metric, _deferred.STATE).sum()) == 1


# ----------------------------------------------------------------------------------------------------- forward --
@pytest.mark.parametrize(
    ("metric_cls", "kwargs"),
    [
        (MaxMetric, {}),  # full_state_update=True
        (MeanMetric, {"dist_sync_on_step": True}),  # the full-state path, chosen by dist_sync_on_step
        (MeanMetric, {}),  # the reduce-state path: stock loses the accumulated state here too
        (SumMetric, {}),
    ],
    ids=["max", "mean-dist-sync-on-step", "mean", "sum"],
)
def test_an_error_in_forward_keeps_the_accumulated_state(path: str, metric_cls: type, kwargs: dict) -> None:
    metric = metric_cls(nan_strategy="error", **kwargs)
    torch.testing.assert_close(metric(t(5.0)), t(5.0))
    if path == "cpu":
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric(t(NAN))
    else:
        metric(t(NAN))  # nothing is read inside forward; the copy has not arrived at its end
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric.compute()
    assert metric.compute() == 5.0, "the state before the bad batch is intact and the bad batch is not in it"
    assert metric._should_unsync and not metric._is_synced, "forward's settings are restored"
    torch.testing.assert_close(metric(t(3.0)), t(3.0))
    expected = {MaxMetric: 5.0, MeanMetric: 4.0, SumMetric: 8.0}[metric_cls]
    assert metric.compute() == expected


def test_stock_loses_the_state_when_forward_raises() -> None:
    """The stock bug the forward replacement fixes (reduce-state path): documented, so pinned here."""
    metric = MeanMetric(nan_strategy="error")
    metric(t(5.0))
    with pytest.raises(RuntimeError, match=NAN_ERROR):
        metric(t(NAN))
    assert metric.compute().isnan()


def test_forward_reads_nothing_and_reports_at_its_end() -> None:
    """Device path, a copy that arrives at once: forward's own reset/compute read nothing, its end reports."""
    from torchmetrics_syncfree import SyncProbe

    with torchmetrics_syncfree.patched():
        metric = MeanMetric(nan_strategy="warn")
        batch = t([NAN, 2.0])
        with SyncProbe() as probe, pytest.warns(UserWarning, match="Will be removed") as caught:
            value = metric(batch)
        assert probe.count == 0, probe.summary()
        assert len(caught) == 1
        torch.testing.assert_close(value, t(2.0))


class _SeesItsStates(SumMetric):
    """Notes, in every update, whether the check counters are among the states that forward copies and reduces
    (they are held where they are: stock's ``_defaults`` keep them)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counters_seen: list[bool] = []

    def update(self, value: Any) -> None:
        deferred = _series_tree.series_module("torchmetrics.utilities.deferred") or _deferred
        self.counters_seen.append(_deferred.STATE in self._defaults and not deferred.is_held(self))
        super().update(value)


def test_reduce_state_forward_leaves_the_counters_out_of_its_state_work(path: str) -> None:
    """Forward neither copies, resets nor reduces the counters: idle where reads are free; on the device path its one
    update of the batch counts into them in place (three launches fewer per forward than stock's state work)."""
    metric = _SeesItsStates(nan_strategy="error")
    defaults, counters = metric._defaults, getattr(metric, _deferred.STATE)
    assert metric(t(2.0)) == 2.0
    if path == "cpu":
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric(t(NAN))
    else:
        metric(t(NAN))
    assert metric.counters_seen == [False, False]
    assert metric._defaults is defaults and list(defaults) == ["sum_value", _deferred.STATE], "put back as it was"
    assert getattr(metric, _deferred.STATE) is counters, "left in place, not copied"
    if path != "cpu":
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric.compute()
    assert metric.compute() == 2.0


def test_counts_pending_before_a_cpu_forward_stay_pending() -> None:
    """Counts filed on the device path and still pending when reads become free survive a forward that leaves the
    counters out (its internal reset must not mark them as read)."""
    with torchmetrics_syncfree.patched():
        metric = SumMetric(nan_strategy="error")
        _instrumentation.force_device_path(True)
        try:
            with _instrumentation.simulated_copy_delay(None):
                metric.update(t([2.0]))
                metric.update(t([NAN, 1.0]))  # counted, not reported: the copy never arrives
        finally:
            _instrumentation.force_device_path(False)
        assert metric(t(3.0)) == 3.0  # reads are free now: the counters are left out of this forward
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric.compute()
        assert metric.compute() == 5.0


# ------------------------------------------------------------------------------------------------------- reset --
def test_reset_reports_what_is_pending_and_the_next_epoch_starts_clean(path: str) -> None:
    metric = SumMetric(nan_strategy="error")
    metric.update(t([2.0]))
    _update_with_nan(metric, path)
    if path == "device":
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric.reset()  # reported by the reset, after which the metric is reset
    else:
        metric.reset()
    metric.update(t([3.0]))  # the first batch of the next epoch is neither blamed nor dropped
    assert metric.compute() == 3.0


def test_reset_reports_pending_warnings_once(path: str) -> None:
    metric = MeanMetric(nan_strategy="warn")
    with pytest.warns(UserWarning, match="Will be removed") as caught:
        metric.update(t([NAN, 1.0]))
        metric.update(t([NAN, 3.0]))
        metric.reset()
    assert len(caught) == 2, "one warning per offending update"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(t([1.0]))
        metric.reset()


# ------------------------------------------------------------------------------------------------------ copies --
@pytest.mark.parametrize(
    "duplicate",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), lambda m: m.clone()],
    ids=["deepcopy", "pickle", "clone"],
)
def test_copies_carry_the_pending_error(path: str, duplicate: Any) -> None:
    metric = SumMetric(nan_strategy="error")
    metric.update(t([2.0]))
    _update_with_nan(metric, path)
    twin = duplicate(metric)
    _raises_once(path, twin.compute)
    _raises_once(path, metric.compute)
    assert twin.compute() == metric.compute() == 2.0


def test_merge_state_carries_the_pending_error(path: str) -> None:
    source, target = SumMetric(nan_strategy="error"), SumMetric(nan_strategy="error")
    source.update(t([2.0]))
    _update_with_nan(source, path)
    target.update(t([1.0]))
    target.merge_state(source)
    _raises_once(path, target.compute)
    assert target.compute() == 3.0


def test_merge_state_from_a_dict_without_counters(path: str) -> None:
    """The documented form, ``merge_state({"sum_value": ...})``, needs no check counters."""
    metric = SumMetric()
    metric.update(1)
    metric.merge_state({"sum_value": t(2.0)})
    assert metric.compute() == 3.0


def test_counters_stay_out_of_state_dict_and_load_into_stock(path: str) -> None:
    metric = MulticlassAccuracy(num_classes=3)
    metric.persistent(True)
    metric.update(t([0, 1, 2]), t([0, 1, 1]))
    saved = metric.state_dict()
    assert _deferred.STATE not in saved
    assert _deferred.STATE not in metric.metric_state  # the user's view of the states is stock's
    assert _deferred.STATE in metric._defaults  # a state like the others: carried by copies, merging, sync
    torchmetrics_syncfree.unpatch_all()
    stock = MulticlassAccuracy(num_classes=3)
    stock.persistent(True)
    stock.load_state_dict(saved)  # strict: no unexpected key
    torch.testing.assert_close(stock.compute(), metric.compute())


# ---------------------------------------------------------------------------------------------- compute groups --
def _group() -> MetricCollection:
    collection = MetricCollection(
        {"acc": MulticlassAccuracy(num_classes=3), "f1": MulticlassF1Score(num_classes=3)}, compute_groups=True
    )
    collection.update(t([0, 1, 2]), t([0, 1, 1]))
    assert collection.compute_groups == {0: ["acc", "f1"]}
    return collection


def _update_group_with_invalid_labels(collection: MetricCollection, path: str) -> None:
    bad = (t([0, 1, 2]), t([0, 1, 7]))
    if path == "cpu":
        with pytest.raises(RuntimeError, match="target"):
            collection.update(*bad)
    else:
        collection.update(*bad)  # only the first member's update runs; the others share its states


def test_every_compute_group_member_reports_the_groups_error_once(path: str) -> None:
    collection = _group()
    _update_group_with_invalid_labels(collection, path)
    f1 = dict(collection.items(keep_base=True, copy_state=False))["f1"]  # shares the group's states
    _raises_once(path, f1.compute, match="not valid for this metric")
    values = collection.compute()  # reported once: nothing left for the group
    reference = MulticlassF1Score(num_classes=3)
    reference.update(t([0, 1, 2]), t([0, 1, 1]))
    torch.testing.assert_close(values["f1"], reference.compute())


def test_a_member_taken_out_of_a_compute_group_carries_the_pending_error(path: str) -> None:
    """``collection["f1"]`` copies the group's states into the member, pending checks included (like any copy)."""
    collection = _group()
    _update_group_with_invalid_labels(collection, path)
    _raises_once(path, collection["f1"].compute, match="not valid for this metric")


# ---------------------------------------------------------------------------------------------------- wrappers --
def test_running_wrapper_reports_each_offending_update_once(path: str) -> None:
    metric = Running(SumMetric(nan_strategy="warn"), window=2)
    with pytest.warns(UserWarning, match="Will be removed") as caught:
        metric.update(t([NAN, 1.0]))
        metric.update(t([2.0]))
        value = metric.compute()
        metric.compute()
    assert len(caught) == 1
    assert value == 3.0


# ----------------------------------------------------------------------------------- classes made before patch --
class _Doubled(MeanMetric):
    """A user's subclass defined before patch_all(): its own update calls the patched one through super()."""

    def update(self, value: Any) -> None:
        super().update(value * 2)


@pytest.mark.parametrize("made", ["before", "after"])
def test_subclass_made_before_patching_reports_at_compute(made: str) -> None:
    if made == "before" and _series_tree.in_tree_mode():
        pytest.skip("metrics made before patch_all() are the layer's: the series has no patch_all()")
    metric = _Doubled(nan_strategy="error") if made == "before" else None
    with torchmetrics_syncfree.patched(), _instrumentation.simulated_copy_delay(None):
        metric = metric or _Doubled(nan_strategy="error")
        _instrumentation.force_device_path(True)
        try:
            metric.update(t([1.0]))
            metric.update(t([NAN]))
            with pytest.raises(RuntimeError, match=NAN_ERROR):
                metric.compute()
        finally:
            _instrumentation.force_device_path(False)
        assert metric.compute() == 2.0


class _WeightedSum(BaseAggregator):
    """A custom aggregator on the stock helper ``_cast_and_nan_check_input``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("sum", torch.tensor(0.0), **kwargs)

    def update(self, value: Any, weight: Any = 1.0) -> None:
        value, weight = self._cast_and_nan_check_input(value, weight)
        self.value = self.value + (value * weight).sum()

    def compute(self) -> torch.Tensor:
        return self.value


def test_custom_aggregator_on_the_stock_helper_never_keeps_nan(path: str) -> None:
    metric = _WeightedSum(nan_strategy="error")
    metric.update(t([1.0, 2.0]))
    with pytest.raises(RuntimeError, match=NAN_ERROR):  # the helper keeps stock's check: raised at once
        metric.update(t([NAN, 1.0]))
    assert metric.compute() == 3.0


# ------------------------------------------------------------------------------------------- DDP (one process) --
def _one_rank_world(metric: Any) -> Any:
    """``metric`` synced as if under DDP: every gather returns this rank's tensor alone."""
    metric.distributed_available_fn = lambda: True
    metric.dist_sync_fn = lambda tensor, group=None: [tensor]
    return metric


def test_an_error_in_synced_compute_leaves_the_metric_unsynced_and_usable(path: str) -> None:
    metric = _one_rank_world(MeanMetric(nan_strategy="error"))
    metric.update(t([2.0]))
    _update_with_nan(metric, path)
    if path == "device":
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            metric.compute()
    assert not metric._is_synced and metric._cache is None, "unsynced after the error"
    assert metric.compute() == 2.0  # no TorchMetricsUserError("already synced"); the error is not repeated
    metric.update(t([4.0]))
    assert metric.compute() == 3.0, "the next update adds to the rank's own state, not to the gathered one"


def test_cat_metric_compute_on_clean_state_reads_the_data_once_at_most(path: str) -> None:
    """``CatMetric`` keeps NaN entries in its state on the device path; a clean state is returned as it is."""
    metric = CatMetric(nan_strategy="ignore")
    metric.update(t([1.0, 2.0]))
    torch.testing.assert_close(metric.compute(), t([1.0, 2.0]))


class _ChecksWithReaderNotToTouch:
    """A metric's ``DeferredChecks`` (the layer's or the series'), failing a look at its reader (dynamo would guard on
    it, and a new reader made while tracing would belong to the graph)."""

    def __init__(self, kinds: tuple[Any, ...]) -> None:
        self.kinds, self.holds = kinds, 0

    @property
    def reader(self) -> Any:
        raise AssertionError("the readers were looked up while tracing")


def test_copies_and_pickles_carry_the_check_kinds_but_no_reader_and_no_hold() -> None:
    """A metric owns its checks' kinds, reader and holds; a copy gets the kinds only (the reader holds pinned buffers
    and an event of the original's counters, and a copy made inside a wrapper's hold is not held)."""
    deferred = _series_tree.series_module("torchmetrics.utilities.deferred") or _deferred  # tree mode: the series'
    with torchmetrics_syncfree.patched():
        _instrumentation.force_device_path(True)
        try:
            metric = MeanMetric(nan_strategy="error")
            metric.update(t([1.0]))  # the first sweep makes the reader
            checks = metric.__dict__[deferred.CHECKS]
            assert checks.reader is not None
            with deferred.held(metric):
                copies = copy.deepcopy(metric), pickle.loads(pickle.dumps(metric)), metric.clone()
                assert deferred.is_held(metric)
            for duplicate in copies:
                owned = duplicate.__dict__[deferred.CHECKS]
                assert owned is not checks
                assert owned.kinds == checks.kinds
                assert owned.reader is None
                assert not deferred.is_held(duplicate)
                with pytest.raises(RuntimeError, match="nan"):  # a simulated copy arrives at once: the first sweep
                    duplicate.update(t([float("nan")]))  # reads the copy's own counters, through a reader of its own
                assert duplicate.__dict__[deferred.CHECKS].reader is not None
            assert not deferred.is_held(metric)
            assert metric.__dict__[deferred.CHECKS] is checks
            assert checks.reader is not None
            assert metric.compute() == 1.0
        finally:
            _instrumentation.force_device_path(False)


def test_the_sweep_looks_up_no_reader_while_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tree mode: the series' sweep and the harness around it (``tests/_series_tree.py``); else the layer's."""
    deferred = _series_tree.series_module("torchmetrics.utilities.deferred") or _deferred
    with torchmetrics_syncfree.patched():
        _instrumentation.force_device_path(True)
        try:
            metric = MeanMetric(nan_strategy="error")
            metric.update(t([1.0]))  # counters and check kinds in place, a reader registered
            checks = _ChecksWithReaderNotToTouch(deferred.kinds_of(metric))
            monkeypatch.setitem(metric.__dict__, deferred.CHECKS, checks)
            with pytest.raises(AssertionError, match="looked up"):  # the double fails where it should
                deferred.sweep(metric)
            # the layer asks its compatibility helper, the series its import shim (``utilities.imports``)
            monkeypatch.setattr(deferred, "is_compiling", lambda: True, raising=False)
            monkeypatch.setattr(deferred, "_is_compiling", lambda: True, raising=False)
            deferred.sweep(metric)
        finally:
            _instrumentation.force_device_path(False)


# ----------------------------------------------------------------------------------------------- the copy interval


def _copies_per_sweep(updates: int, delay: int | None, batches: Any) -> tuple[int, list[int]]:
    """Host copies launched over ``updates`` device-path updates at the default interval, and where NaN batches warned.

    ``batches`` are the numbers of the updates fed a NaN; the second result lists, per warning, the update whose
    sweep warned (``updates``: the final ``compute()``).
    """
    launched = 0
    reported: list[int] = []
    # in tree mode the series' sweep launches its own reader's copies
    reader_class = (_series_tree.series_module("torchmetrics.utilities.deferred") or _deferred)._Reader
    launch = reader_class.launch

    def counting_launch(self: Any, counters: Any) -> None:
        nonlocal launched
        launched += 1
        launch(self, counters)

    with (
        _instrumentation.copy_interval(_deferred.COPY_INTERVAL),
        torchmetrics_syncfree.patched(),
        _instrumentation.simulated_copy_delay(delay),
        pytest.MonkeyPatch.context() as monkeypatch,
    ):
        monkeypatch.setattr(reader_class, "launch", counting_launch)
        _instrumentation.force_device_path(True)
        try:
            metric = MeanMetric(nan_strategy="warn")
            for step in range(updates):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    metric.update(t([NAN, 1.0]) if step in batches else t([1.0, 2.0]))
                reported += [step] * sum("Encountered `nan`" in str(w.message) for w in caught)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                metric.compute()
            reported += [updates] * sum("Encountered `nan`" in str(w.message) for w in caught)
        finally:
            _instrumentation.force_device_path(False)
    return launched, reported


@pytest.mark.parametrize("delay", [0, 1])
def test_copy_interval_launches_a_host_copy_on_one_sweep_in_eight(delay: int) -> None:
    """A copy of the counters per ``COPY_INTERVAL`` sweeps, not per sweep: 32 clean updates launch 4, not 32 (or 16)."""
    launched, reported = _copies_per_sweep(32, delay, batches=())
    assert _deferred.COPY_INTERVAL == 8
    assert launched == 4
    assert reported == []


@pytest.mark.parametrize("delay", [0, 1, None])
def test_copy_interval_reports_every_problem_once_and_soon(delay: int | None) -> None:
    """Problems are reported once each: the first update's at once, later ones within the interval, the rest by
    ``compute()``. A NaN batch with ``nan_strategy="warn"`` warns once per batch. A copy that found a problem is
    followed by another at the next sweep (see the next test)."""
    launched, reported = _copies_per_sweep(20, delay, batches=(0, 3, 18))
    if delay is None:  # the copy never arrives: compute() reports all three
        assert reported == [20, 20, 20]
        assert launched == 1
        return
    # a copy that finds a problem is followed by one at the next sweep, then the interval resumes: copies start at
    # sweeps 0 (batch 0, reported ``delay`` sweeps later), 1 + delay, 9 + delay (batch 3), 10 + 2 * delay and
    # 18 + 2 * delay (batch 18 with delay 0; with delay 1 batch 18 falls before the copy at sweep 20 that is not
    # there: compute() reports it)
    assert reported == [delay, 9 + delay, 18] if delay == 0 else [delay, 9 + delay, 20]
    assert launched == 6


def test_copy_interval_restarts_after_a_report() -> None:
    """A problem reported by a sweep is followed by a copy at the next sweep: an error caught by the caller, then the
    metric fed another bad batch, raises again at once (upstream's tests do this), not up to ``COPY_INTERVAL`` updates
    later."""
    with _instrumentation.copy_interval(8), torchmetrics_syncfree.patched():
        _instrumentation.force_device_path(True)
        try:
            metric = TweedieDevianceScore(power=1)
            for _ in range(3):
                with pytest.raises(ValueError, match="For power=1"):
                    metric.update(t([-1.0, 2.0]), t([1.0, 2.0]))
            metric.update(t([1.0, 2.0]), t([1.0, 2.0]))  # clean: the interval resumes
        finally:
            _instrumentation.force_device_path(False)
    assert metric.compute() == TweedieDevianceScore(power=1)(t([1.0, 2.0]), t([1.0, 2.0]))


def test_copy_interval_restarts_after_an_eager_point() -> None:
    """After ``compute()`` (or ``reset()``) reads the counters, the next update's sweep copies again at once."""
    with _instrumentation.copy_interval(8), torchmetrics_syncfree.patched():
        _instrumentation.force_device_path(True)
        try:
            metric = MeanMetric(nan_strategy="warn")
            metric.update(t([1.0]))  # copied at once (a new metric), then 7 quiet sweeps
            metric.update(t([1.0]))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                metric.compute()  # an eager point: reads the counters
                metric.update(t([NAN, 1.0]))  # its sweep copies at once: reported here
            assert sum("Encountered `nan`" in str(w.message) for w in caught) == 1
        finally:
            _instrumentation.force_device_path(False)


def test_copy_interval_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="positive"), _instrumentation.copy_interval(0):
        pass


# --------------------------------------------------------------------------- a fill the input's dtype cannot hold --
#: what most torch builds raise writing a fill beyond float16's range (``x[mask] = 1e5``); the 2.13 CPU wheel rounds
#: to ``inf`` instead, so these tests make the package see a build that raises
FILL_OVERFLOW = "value cannot be converted to type at::Half without overflow"
HALF = torch.float16


@pytest.fixture
def build_refuses_the_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aggregators' per-dtype record of what this build raises, as on a build whose half writes fail."""
    if _series_tree.in_tree_mode():
        pytest.skip("the per-build record of an overflowing fill is the layer's; the series' aggregation has none")
    from torchmetrics_syncfree import aggregation

    check = _deferred.Check("test.fill-overflow.float16", FILL_OVERFLOW, RuntimeError)
    monkeypatch.setattr(aggregation, "_FILL_OVERFLOW", {HALF: check})
    monkeypatch.setattr(aggregation, "_FILL_OVERFLOW_KINDS", frozenset({check}))


def _update_with_unfillable_nan(metric: Any, path: str) -> None:
    """A half batch with NaN and a fill of 1e5: the CPU path raises stock's error at once, the device path counts."""
    if path == "cpu":
        with pytest.raises(RuntimeError, match=FILL_OVERFLOW):
            metric.update(t([NAN, 4.0], dtype=HALF))
    else:
        metric.update(t([NAN, 4.0], dtype=HALF))
        assert int(getattr(metric, _deferred.STATE).sum()) == 1


@pytest.mark.usefixtures("build_refuses_the_fill")
def test_reset_after_an_unfillable_batch_starts_the_next_epoch_clean(path: str) -> None:
    metric = SumMetric(nan_strategy=1e5)
    metric.update(t([2.0], dtype=HALF))
    _update_with_unfillable_nan(metric, path)
    _raises_once(path, metric.reset, match=FILL_OVERFLOW)
    metric.update(t([NAN, 3.0], dtype=torch.float32))  # the fill fits float32: imputed, as stock
    assert metric.compute() == 3.0 + 1e5


@pytest.mark.usefixtures("build_refuses_the_fill")
@pytest.mark.parametrize(
    "duplicate",
    [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m)), lambda m: m.clone()],
    ids=["deepcopy", "pickle", "clone"],
)
@pytest.mark.parametrize("metric_cls", [SumMetric, MeanMetric, CatMetric])
def test_copies_carry_the_pending_unfillable_batch(path: str, duplicate: Any, metric_cls: type) -> None:
    """The copy reports the error once and leaves the batch out of its value (``CatMetric`` too, in ``compute()``)."""
    metric = metric_cls(nan_strategy=1e5)
    metric.update(t([2.0], dtype=HALF))
    _update_with_unfillable_nan(metric, path)
    metric.update(t([6.0], dtype=HALF))
    twin = duplicate(metric)
    _raises_once(path, twin.compute, match=FILL_OVERFLOW)
    _raises_once(path, metric.compute, match=FILL_OVERFLOW)
    expected = {SumMetric: t(8.0), MeanMetric: t(4.0), CatMetric: t([2.0, 6.0])}[metric_cls]
    torch.testing.assert_close(twin.compute(), expected)
    torch.testing.assert_close(metric.compute(), expected)


@pytest.mark.usefixtures("build_refuses_the_fill")
def test_an_unfillable_batch_in_an_inference_mode_epoch(path: str) -> None:
    """Lightning's validation loop: ``forward`` under ``torch.inference_mode()``, then ``compute()`` and ``reset()``
    outside it; the next epoch runs the same way."""
    metric = MeanMetric(nan_strategy=1e5)
    for _ in range(2):
        with torch.inference_mode():
            metric(t([2.0], dtype=HALF))
            if path == "cpu":
                with pytest.raises(RuntimeError, match=FILL_OVERFLOW):
                    metric(t([NAN, 4.0], dtype=HALF))
            else:
                metric(t([NAN, 4.0], dtype=HALF))
            metric(t([6.0], dtype=HALF))
        _raises_once(path, metric.compute, match=FILL_OVERFLOW)
        assert metric.compute() == 4.0
        metric.reset()


@pytest.mark.usefixtures("build_refuses_the_fill")
def test_a_compute_group_reports_an_unfillable_batch_once(path: str) -> None:
    collection = MetricCollection({"sum": SumMetric(nan_strategy=1e5), "other": SumMetric(nan_strategy=1e5)})
    collection.update(t([2.0], dtype=HALF))
    if path == "cpu":
        with pytest.raises(RuntimeError, match=FILL_OVERFLOW):
            collection.update(t([NAN, 4.0], dtype=HALF))
    else:
        collection.update(t([NAN, 4.0], dtype=HALF))
    _raises_once(path, collection.compute, match=FILL_OVERFLOW)
    assert collection.compute() == {"sum": t(2.0), "other": t(2.0)}
