"""Wrappers' internal resets and computes of the metrics they wrap read no check counters: no host wait
inside ``Running``'s update/forward or the ``MinMaxMetric``/``BootStrapper`` forwards, with the counters' host copy
in flight or arrived; every warning and error still reaches the user once, and values are stock's."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torchmetrics import Metric
from torchmetrics.aggregation import MeanMetric, RunningMean, RunningSum
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.wrappers import BootStrapper, MinMaxMetric, Running

from tests import _series_tree
from tests._classification_cases import assert_identical
from torchmetrics_syncfree import SyncProbe, _deferred, _instrumentation, patched, registered_areas
from torchmetrics_syncfree.probe import HOST_WAIT

DELAYS = pytest.mark.parametrize("delay", [0, None], ids=["copy-arrived", "copy-in-flight"])


def _labels(seed: int, bad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    preds = torch.rand(16, 5, generator=gen).softmax(-1)
    return preds, torch.full((16,), 7) if bad else torch.randint(0, 5, (16,), generator=gen)


def _values(seed: int, nan: bool = False) -> tuple[torch.Tensor]:
    x = torch.rand(16, generator=torch.Generator().manual_seed(seed))
    return (torch.where(torch.arange(16) == 3, float("nan"), x) if nan else x,)


WRAPPERS: dict[str, tuple[Callable[[], Metric], Callable[..., tuple[torch.Tensor, ...]]]] = {
    "minmax-accuracy": (lambda: MinMaxMetric(MulticlassAccuracy(5)), _labels),
    "running-mean": (lambda: Running(MeanMetric(), window=3), _values),
    "running-accuracy": (lambda: Running(MulticlassAccuracy(5), window=2), _labels),
    "RunningMean": (lambda: RunningMean(window=3), _values),
    "RunningSum": (lambda: RunningSum(window=2), _values),
    "bootstrapper": (lambda: BootStrapper(MulticlassAccuracy(5), num_bootstraps=3), _labels),
}


def _device_path(delay: int | None, areas: list[str] | None = None) -> Any:
    """Patched (``areas``: only those), the device path forced, the counters' copy arriving after ``delay`` sweeps
    (``None``: never)."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(patched(areas=areas) if areas else patched())
    stack.enter_context(_instrumentation.simulated_copy_delay(delay))
    _instrumentation.force_device_path(True)
    stack.callback(_instrumentation.force_device_path, False)
    return stack


@DELAYS
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_update_and_forward_never_wait_for_the_checks(name: str, delay: int | None) -> None:
    make, inputs = WRAPPERS[name]
    with _device_path(delay):
        metric = make()
        metric.update(*inputs(0))
        with SyncProbe() as probe:
            for seed in range(1, 4):
                metric.update(*inputs(seed))
                metric(*inputs(seed + 10))
        assert [e for e in probe.events if e.kind == HOST_WAIT] == []
        assert probe.events == []  # BootStrapper: its samples drawn on the device (area bootstrapping)
        with SyncProbe() as probe:
            metric.update(*inputs(5))
            metric.compute()
        waits = [e for e in probe.events if e.kind == HOST_WAIT]
        # compute() reads each wrapped metric's checks at most once (the bootstrap copies each have their own)
        assert len(waits) <= (3 if name == "bootstrapper" else 1), waits


def test_the_waits_were_the_wrapped_metrics_resets(syncfree: Any) -> None:
    """Stock's ``Running.update`` run by hand: its ``base_metric.reset()`` waits when the copy is in flight."""
    with _instrumentation.simulated_copy_delay(None):
        metric = Running(MeanMetric(), window=3)
        with SyncProbe() as probe:
            metric.base_metric.update(*_values(1))
            metric.base_metric.reset()
    assert [e.kind for e in probe.events] == [HOST_WAIT]


def _run(make: Callable[[], Metric], inputs: Callable[..., tuple[torch.Tensor, ...]]) -> list[Any]:
    torch.manual_seed(0)  # BootStrapper draws its samples from the global generator
    metric, out = make(), []
    for seed in range(4):
        out.append(metric(*inputs(seed)))
        metric.update(*inputs(seed + 10))
        out.append(metric.compute())
    metric.reset()
    metric.update(*inputs(20))
    out.append(metric.compute())
    return [value for item in out for value in (item.values() if isinstance(item, dict) else [item])]


@DELAYS
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_values_are_stocks(name: str, delay: int | None) -> None:
    make, inputs = WRAPPERS[name]
    stock = _run(make, inputs)
    # the device path's BootStrapper draws its samples on the device (other draws than stock's, compared in
    # tests/test_wrappers_more.py): the holds are compared here with stock's draws
    areas = [area for area in registered_areas() if area != "bootstrapping"] if name == "bootstrapper" else None
    with _device_path(delay, areas):
        patched_values = _run(make, inputs)
    assert_identical(stock, patched_values, name)


@DELAYS
def test_running_warnings_reach_the_user_once_each(delay: int | None) -> None:
    """Stock warns once per update with a NaN; the held base metric reports them at the wrapper's compute, once."""

    def run() -> tuple[list[str], list[str]]:
        metric = Running(MeanMetric(nan_strategy="warn"), window=3)
        with warnings.catch_warnings(record=True) as during:
            warnings.simplefilter("always")
            metric.update(*_values(0, nan=True))
            metric(*_values(1, nan=True))
            metric.update(*_values(2))
        with warnings.catch_warnings(record=True) as at_compute:
            warnings.simplefilter("always")
            metric.compute()
            metric.compute()
            metric.reset()
        return [str(w.message) for w in during], [str(w.message) for w in at_compute]

    stock_during, stock_after = run()
    assert len(stock_during) == 2 and stock_after == []
    with _device_path(delay):
        during, after = run()
    assert during == []  # inside the wrapper's calls nothing is read
    assert after == stock_during  # every warning once, at the wrapper's compute


@DELAYS
def test_an_error_found_inside_a_minmax_forward_is_raised_once_and_costs_no_data(delay: int | None) -> None:
    with _device_path(delay):
        metric = MinMaxMetric(MulticlassAccuracy(5))
        metric(*_labels(0, bad=True))  # not read inside forward
        # reported by the end of the next update (its own work done) once the copy has arrived, else by compute
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.update(*_labels(1))
            metric.compute()
        value = metric.compute()["raw"]  # once: the metric is usable, its state kept
    expected = MulticlassAccuracy(5)
    expected.update(*_labels(1))
    assert torch.equal(value, expected.compute())


@DELAYS
def test_an_error_in_running_compute_keeps_the_window(delay: int | None) -> None:
    """The compute that raises a reported error still resets the base metric: the next update and compute are
    those of the window, not of the window's reduced states added again."""
    with _device_path(delay):
        metric = Running(MulticlassAccuracy(5, average="micro"), window=2)
        metric.update(*_labels(0, bad=True))
        metric.update(*_labels(1))
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.compute()
        metric.update(*_labels(2))
        value = metric.compute()
    expected = MulticlassAccuracy(5, average="micro")
    expected.update(*_labels(1))
    expected.update(*_labels(2))
    assert torch.equal(value, expected.compute())


def test_a_hold_is_explicit_nests_and_stays_with_the_metric_it_holds() -> None:
    """``_deferred.held`` marks the metric itself (stock's ``_defaults`` stay as they are); holds nest, and a copy made
    inside a hold is a metric of its own, not held; a held reset keeps the counters' pending counts."""
    holds = _series_tree.series_module("torchmetrics.utilities.deferred") or _deferred  # the form under test
    with patched(), SyncProbe(), _instrumentation.simulated_copy_delay(None):
        metric = MulticlassAccuracy(num_classes=5)
        metric.update(*_labels(0, bad=True))
        defaults, pending = metric._defaults, int(getattr(metric, _deferred.STATE).sum())
        assert pending > 0
        with holds.held(metric):
            assert metric._defaults is defaults
            assert _deferred.STATE in metric._defaults
            with holds.held(metric):
                assert holds.is_held(metric)
            assert holds.is_held(metric)
            assert not holds.is_held(copy.deepcopy(metric))
            metric.reset()  # held: nothing read, the pending count kept
            assert int(getattr(metric, _deferred.STATE).sum()) == pending
        assert not holds.is_held(metric)
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.reset()
