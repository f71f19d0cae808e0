"""MinMaxMetric: stock's values on both patched paths, a sync-free ``forward``/``compute`` (stock's ``if self.max_val
< val`` seen unpatched), stock's errors for unsuitable values, the documented dtype deviation on every path, and a
compute that traces without a graph break."""

from __future__ import annotations

import contextlib
import copy
import pickle
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import Tensor
from torchmetrics import MeanSquaredError, Metric
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import BinaryAccuracy
from torchmetrics.wrappers import MinMaxMetric

import torchmetrics_syncfree
from tests._classification_cases import PATHS, assert_identical
from tests._probing import graph_breaks
from torchmetrics_syncfree import SyncProbe, _instrumentation

KEYS = ("raw", "max", "min")


def _batches(dtype: torch.dtype, seed: int = 0, n: int = 8) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, generator=gen).to(dtype), torch.rand(n, generator=gen).to(dtype)) for _ in range(5)]


def _flat(value: dict[str, Tensor]) -> list[Tensor]:
    return [value[key].cpu() for key in KEYS]


def _run(make: Any, data: list[tuple[Tensor, ...]]) -> list[Tensor]:
    """forward() of every batch, compute() after each of a second metric's updates, then reset and again."""
    metric = make()
    out = [tensor for args in data for tensor in _flat(metric(*args))]
    out += _flat(metric.compute())
    other = make()
    for args in data:
        other.update(*args)
        out += _flat(other.compute())
    other.reset()
    other.update(*data[0])
    out += _flat(other.compute())
    return out


#: base metrics whose value is a float32, float64 or half 0-dim tensor (``Metric.compute`` squeezes one-element values)
CASES: dict[str, tuple[Any, torch.dtype]] = {
    "mse-float32": (lambda: MinMaxMetric(MeanSquaredError()), torch.float32),
    "mse-float64": (lambda: MinMaxMetric(MeanSquaredError().set_dtype(torch.float64)), torch.float64),
    "mean-half": (lambda: MinMaxMetric(MeanMetric().set_dtype(torch.half)), torch.half),
    "accuracy": (lambda: MinMaxMetric(BinaryAccuracy()), torch.float32),
}


def _update_args(name: str, data: list[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, ...]]:
    if name == "mean-half":
        return [(preds,) for preds, _ in data]
    if name == "accuracy":
        return [(preds, (target > 0.5).long()) for preds, target in data]
    return data


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """Values, dtypes and shapes of raw/max/min after forward, update and reset: stock's to the bit."""
    stock = {name: _run(make, _update_args(name, _batches(dtype))) for name, (make, dtype) in CASES.items()}
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = {name: _run(make, _update_args(name, _batches(dtype))) for name, (make, dtype) in CASES.items()}
    for name in CASES:
        assert_identical(stock[name], patched[name], name)


@pytest.mark.parametrize("delay", [0, None], ids=["copy-arrived", "copy-in-flight"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_compute_are_sync_free(syncfree: Any, name: str, delay: int | None) -> None:
    """No sync in update and forward, also with the check counters' host copy still in flight (a GPU a step behind:
    the forward's internal reset and compute of the base metric then must not read them); a ``compute()`` reads the
    base metric's checks at most once, and only where it validates and its copy has not arrived."""
    make, dtype = CASES[name]
    data = _update_args(name, _batches(dtype, seed=1))
    metric = make()
    with _instrumentation.simulated_copy_delay(delay):
        with SyncProbe() as probe:
            metric.update(*data[0])
            for args in data[1:]:
                metric(*args)
            metric.update(*data[0])  # after the forwards the base metric's value is cached: an update computes again
        assert probe.count == 0, probe.events
        with SyncProbe() as probe:
            metric.compute()
    waits = 1 if delay is None and name in ("accuracy", "mean-half") else 0  # the metrics that check inputs
    assert [event.kind for event in probe.events] == ["host wait"] * waits, probe.events


def test_stock_syncs_are_seen() -> None:
    """Stock reads the comparison on the host in every compute (two ``if tensor``), forward included."""
    metric = MinMaxMetric(MeanSquaredError())
    metric.update(*_batches(torch.float32)[0])
    with SyncProbe() as probe:
        metric.compute()
    assert [e.kind for e in probe.events if "wrappers/minmax.py" in e.location] == ["device-to-host read"] * 2
    with SyncProbe() as probe:
        metric(*_batches(torch.float32)[1])
    assert probe.count >= 2


class _Returns(Metric):
    """A base metric that returns a fixed value."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value
        self.add_state("seen", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, *_: Any) -> None:
        self.seen += 1

    def compute(self) -> Any:
        return self.value


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("value", "error"),
    [(torch.ones(3), RuntimeError), ("0.5", RuntimeError), (0.5, AttributeError), (3, AttributeError)],
    ids=["vector", "string", "float", "int"],
)
def test_unsuitable_values_raise_stocks_error(path: str, value: Any, error: type) -> None:
    """A tensor with several elements or a non-number: stock's RuntimeError; a Python number passes stock's check
    and then fails on ``val.device`` (AttributeError): both paths keep stock's behaviour, messages included."""
    metric = MinMaxMetric(_Returns(value))
    metric.update()
    with pytest.raises(error) as stock_error:
        metric.compute()
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = MinMaxMetric(_Returns(value))
        metric.update()
        with pytest.raises(error) as patched_error:
            metric.compute()
    assert str(patched_error.value) == str(stock_error.value)


def test_nan_values_never_win_as_in_stock(syncfree: Any) -> None:
    """NaN compares false both ways: stock keeps the bound, ``torch.where`` too."""
    with SyncProbe():
        metric = MinMaxMetric(_Returns(torch.tensor(0.25)))
        metric.update()
        metric.compute()
        metric._base_metric.value = torch.tensor(float("nan"))
        metric._base_metric._computed = None  # the base metric caches its value until the next update
        out = metric.compute()
    assert torch.isnan(out["raw"])
    assert (float(out["max"]), float(out["min"])) == (0.25, 0.25)


@pytest.mark.parametrize("path", PATHS)
def test_bounds_take_the_values_dtype(path: str) -> None:
    """Documented deviation, on every path: a float64 NaN first value leaves stock's bounds float32 (the value did not
    win); a choice made on the device cannot choose a dtype, so they are float64 (same value: -inf and inf)."""
    value = torch.tensor(float("nan"), dtype=torch.float64)
    stock = MinMaxMetric(_Returns(value))
    stock.update()
    assert stock.compute()["max"].dtype == torch.float32
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        out = MinMaxMetric(_Returns(value))
        out.update()
        result = out.compute()
    assert (result["max"].dtype, float(result["max"]), float(result["min"])) == (torch.float64, -torch.inf, torch.inf)


@pytest.mark.parametrize("duplicate", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["copy", "pickle"])
def test_copies_keep_the_bounds(syncfree: Any, duplicate: Any) -> None:
    data = _batches(torch.float32, seed=4)
    with SyncProbe():
        metric = MinMaxMetric(MeanSquaredError())
        for preds, target in data[:3]:
            metric(preds, target)
        twin = duplicate(metric)
        for preds, target in data[3:]:
            assert_identical(_flat(twin(preds, target)), _flat(metric(preds, target)))


@pytest.mark.compile
def test_compute_traces_without_a_graph_break() -> None:
    """The patched compute (the comparison and both bounds) traces whole; stock's breaks on ``if tensor``."""
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = MinMaxMetric(MeanSquaredError())
        metric.update(*_batches(torch.float32)[0])
        # the class's method, not the instance's compute wrapper: in tree mode it is the series' (``_compute`` is the
        # layer's)
        explanation = torch._dynamo.explain(lambda: MinMaxMetric.compute(metric))()
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []
