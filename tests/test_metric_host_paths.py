"""``Metric``'s own per-call work while patched: the update wrapper, ``reset()`` and the one-update ``forward``.

These run around every ``update``/``forward`` of every metric, so their host time counts: the layer writes their flags
and states to the instance's ``__dict__`` (what ``setattr`` ends up doing after ``nn.Module.__setattr__``'s checks),
switches the grad mode only where it differs, and ``forward`` holds the accumulated states instead of cloning them
(they are never written before the reduction makes new ones). Each test pins a piece of stock behaviour that these
must keep, against stock where it can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torchmetrics import MeanMetric, Metric, MetricCollection, SumMetric
from torchmetrics.aggregation import CatMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

import torchmetrics_syncfree
from tests._probing import PATHS_WITH_FLIGHT, on_path
from torchmetrics_syncfree import SyncProbe, _deferred
from torchmetrics_syncfree.tools.launches import count_launches

PREDS = torch.tensor([[0.1, 0.7, 0.2], [0.8, 0.1, 0.1], [0.2, 0.2, 0.6], [0.3, 0.4, 0.3]])
TARGET = torch.tensor([1, 0, 1, 2])


class _InPlaceReset(SumMetric):
    """A user's metric whose ``reset`` zeroes its state in place (stock's forward copies the state first)."""

    def reset(self) -> None:
        super().reset()
        self.sum_value.zero_()  # the tensor stock's reset just made: harmless alone, fatal to a held reference


class _OwnSetattr(SumMetric):
    """A user's metric with its own ``__setattr__``: it must see every write, as under stock."""

    def __init__(self) -> None:
        self.__dict__["writes"] = []
        super().__init__()

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__.setdefault("writes", []).append(name)
        super().__setattr__(name, value)


def _run(make: Callable[[], Metric], calls: Callable[[Metric], Any]) -> Any:
    metric = make()
    return calls(metric), metric


def _stock_and_patched(
    make: Callable[[], Metric], calls: Callable[[Metric], Any], path: str = "cpu"
) -> tuple[Any, Any]:
    torchmetrics_syncfree.unpatch_all()
    stock = _run(make, calls)
    with torchmetrics_syncfree.patched(), on_path(path):
        patched = _run(make, calls)
    return stock, patched


def _forward_steps(metric: Metric) -> list[Any]:
    values = [metric(PREDS, TARGET), metric(PREDS.flip(0), TARGET)]
    return [*values, metric.compute()]


@pytest.mark.parametrize(
    "make",
    [
        lambda: MulticlassAccuracy(num_classes=3, average="macro"),
        lambda: MulticlassF1Score(num_classes=3, average=None),
    ],
    ids=["accuracy", "f1"],
)
@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_forward_values_and_states_are_stock(make: Callable[[], Metric], path: str) -> None:
    (stock_values, stock), (patched_values, patched) = _stock_and_patched(make, _forward_steps, path)
    for got, expected in zip(patched_values, stock_values):
        torch.testing.assert_close(got, expected)
    for name in stock._defaults:
        torch.testing.assert_close(getattr(patched, name), getattr(stock, name))
    assert patched._update_count == stock._update_count == 2
    assert patched._computed is not None and stock._computed is not None  # compute() cached, as stock


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_forward_leaves_the_accumulated_tensors_as_they_were(path: str) -> None:
    """The held global states are not written: a reference taken before ``forward`` keeps its values."""
    with torchmetrics_syncfree.patched(), on_path(path):
        metric = MulticlassAccuracy(num_classes=3, average="macro")
        metric.update(PREDS, TARGET)
        before = {name: getattr(metric, name) for name in ("tp", "fp", "tn", "fn")}
        values = {name: tensor.clone() for name, tensor in before.items()}
        metric(PREDS, TARGET)
        for name, tensor in before.items():
            assert getattr(metric, name) is not tensor  # the reduction made a new tensor, as stock's
            assert torch.equal(tensor, values[name])
            torch.testing.assert_close(getattr(metric, name), 2 * values[name])


def test_forward_clones_no_accumulated_state() -> None:
    """Stock clones every state before its reset; the held states save those launches (and one add per state)."""

    def launches() -> int:
        metric = MeanMetric()
        metric(torch.tensor(2.0))
        return count_launches(metric, torch.tensor(3.0))[0]

    torchmetrics_syncfree.unpatch_all()
    stock = launches()
    with torchmetrics_syncfree.patched():
        patched = launches()
    # two states: two clones fewer, and their two sums back in one multi-tensor add
    assert patched <= stock - 3


def test_forward_of_list_states_launches_as_many_kernels_late_in_an_epoch_as_early() -> None:
    """Stock clones every element of a list state in every ``forward``: its cost grows with the epoch. The held list
    keeps the accumulated elements themselves (``reset()`` clears the metric's own list, not the held one)."""

    def launches_after(updates: int) -> tuple[int, bool]:
        metric = CatMetric()
        for step in range(updates):
            metric(torch.tensor([float(step)]))
        elements = list(metric.value)
        count = count_launches(metric, torch.tensor([-1.0]))[0]
        return count, all(a is b for a, b in zip(metric.value, elements))

    torchmetrics_syncfree.unpatch_all()
    (stock_early, _), (stock_late, _) = launches_after(1), launches_after(20)
    with torchmetrics_syncfree.patched():
        (early, _), (late, kept) = launches_after(1), launches_after(20)
    assert stock_late >= stock_early + 19  # a clone per element
    assert early == late <= stock_early
    assert kept, "the accumulated elements themselves, not copies"


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_forward_of_a_metric_with_its_own_reset_copies_the_states(path: str) -> None:
    (stock_values, _), (patched_values, _) = _stock_and_patched(
        _InPlaceReset, lambda m: [m(torch.tensor(2.0)), m(torch.tensor(3.0)), m.compute()], path
    )
    assert [float(v) for v in patched_values] == [float(v) for v in stock_values] == [2.0, 3.0, 5.0]


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_forward_of_list_states_is_stock(path: str) -> None:
    """``reset()`` clears a list state in place: forward holds the accumulated elements in a list of its own."""
    (stock_values, stock), (patched_values, patched) = _stock_and_patched(
        CatMetric, lambda m: [m(torch.tensor([1.0, 2.0])), m(torch.tensor([3.0])), m.compute()], path
    )
    for got, expected in zip(patched_values, stock_values):
        torch.testing.assert_close(got, expected)
    assert len(patched.value) == len(stock.value) == 2


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_forward_in_a_collection_with_compute_groups_is_stock(path: str) -> None:
    """Members of a compute group share their state tensors: a forward of one must not change the other's."""

    def make() -> MetricCollection:
        return MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes=3, average="macro"),
                "f1": MulticlassF1Score(num_classes=3, average="macro"),
            },
            compute_groups=True,
        )

    def steps(collection: Metric) -> list[Any]:
        collection.update(PREDS, TARGET)  # forms the group: the members share their states from here
        return [collection(PREDS, TARGET), collection(PREDS.flip(0), TARGET), collection.compute()]

    (stock_values, _), (patched_values, _) = _stock_and_patched(make, steps, path)
    for got, expected in zip(patched_values, stock_values):
        for key in expected:
            torch.testing.assert_close(got[key], expected[key])


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_reset_makes_new_states_on_the_states_device(path: str) -> None:
    with torchmetrics_syncfree.patched(), on_path(path):
        metric = MulticlassAccuracy(num_classes=3, average="macro")
        metric.update(PREDS, TARGET)
        held = metric.tp
        metric.reset()
        assert metric.tp is not held and int(held.sum()) > 0  # a new tensor; the old one untouched
        assert torch.equal(metric.tp, torch.zeros(3, dtype=torch.long))
        assert metric._update_count == 0 and metric._computed is None and metric._cache is None
        assert not metric._is_synced


def test_a_metric_with_its_own_setattr_sees_every_write() -> None:
    def calls(metric: Metric) -> list[str]:
        metric.__dict__["writes"] = []
        metric.update(torch.tensor(1.0))
        metric(torch.tensor(2.0))
        metric.reset()
        return list(metric.__dict__["writes"])

    (stock_writes, _), (patched_writes, _) = _stock_and_patched(_OwnSetattr, calls)
    # the same attributes, plus the check counters (a state of the patched metric's own)
    assert set(patched_writes) - {_deferred.STATE} == set(stock_writes)
    assert "_update_count" in patched_writes and "sum_value" in patched_writes


@pytest.mark.parametrize("grad", [True, False])
def test_update_runs_in_the_metrics_grad_mode_and_restores_the_callers(grad: bool) -> None:
    class _Probe(MeanMetric):
        full_state_update = True  # forward's two updates: the accumulation and the batch's

        def update(self, value: Tensor) -> None:
            self.__dict__.setdefault("seen", []).append(torch.is_grad_enabled())
            super().update(value)

    def calls(metric: Metric) -> list[bool]:
        with torch.set_grad_enabled(grad):
            metric.update(torch.tensor(1.0))
            assert torch.is_grad_enabled() is grad
            metric(torch.tensor(1.0, requires_grad=True))
            assert torch.is_grad_enabled() is grad
        return metric.__dict__["seen"]

    (stock_seen, _), (patched_seen, _) = _stock_and_patched(_Probe, calls)
    assert patched_seen == stock_seen == [False, False, True]  # update; forward's accumulation, then its batch


def test_update_that_raises_restores_the_grad_mode_and_translates_device_errors() -> None:
    class _Fails(SumMetric):
        def update(self, value: Tensor) -> None:
            raise RuntimeError("Expected all tensors to be on the same device, but found two devices")

    with torchmetrics_syncfree.patched():
        metric = _Fails()
        assert torch.is_grad_enabled()
        with pytest.raises(RuntimeError, match="Encountered different devices in metric calculation") as raised:
            metric.update(torch.tensor(1.0))
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert torch.is_grad_enabled()
        assert metric._update_count == 1  # counted before the call, as stock


def test_compute_on_cpu_moves_list_states_after_each_update() -> None:
    with torchmetrics_syncfree.patched():
        metric = CatMetric(compute_on_cpu=True)
        calls: list[int] = []
        metric._move_list_states_to_cpu = lambda: calls.append(1)  # type: ignore[method-assign]
        metric.update(torch.tensor([1.0]))
        metric.update(torch.tensor([2.0]))
    assert calls == [1, 1]


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
def test_forward_across_inference_mode_epochs_and_copies_is_stock(path: str) -> None:
    """Lightning's sequence: validation forwards under ``inference_mode`` (its reset makes inference tensors), training
    forwards outside it; a deepcopy and a pickle round trip midway carry the held-then-reduced states as stock's."""
    import copy
    import pickle

    def calls(metric: Metric) -> list[Any]:
        values = []
        with torch.inference_mode():
            values += [metric(PREDS, TARGET), metric.compute()]
            metric.reset()
        values += [metric(PREDS.flip(0), TARGET), metric(PREDS, TARGET)]
        values += [copy.deepcopy(metric).compute(), pickle.loads(pickle.dumps(metric)).compute()]
        with torch.inference_mode():
            values.append(metric(PREDS, TARGET))
        values.append(metric.compute())
        return values

    make = lambda: MulticlassF1Score(num_classes=3, average="macro")  # noqa: E731
    (stock_values, _), (patched_values, _) = _stock_and_patched(make, calls, path)
    for got, expected in zip(patched_values, stock_values):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("path", ["device", "device-in-flight"])
def test_report_step_with_the_new_metric_paths_does_not_sync(path: str) -> None:
    """The probe sees no would-be sync in the report's metrics' ``update`` and ``forward`` on the device path, before
    and after a user's ``reset()``; their ``compute`` reads the check counters once at most (an eager point)."""
    with torchmetrics_syncfree.patched(), on_path(path):
        metrics = [
            (MulticlassAccuracy(num_classes=3, average="macro"), (PREDS, TARGET)),
            (MulticlassF1Score(num_classes=3), (PREDS.flip(0), TARGET)),
            (MeanMetric(), (torch.tensor(1.5),)),
        ]
        for metric, batch in metrics:
            with SyncProbe() as probe:
                metric.update(*batch)
                metric(*batch)
            assert probe.count == 0, probe.events
            metric.reset()  # a user's reset: an eager point, which may read the checks
            with SyncProbe() as probe:
                metric(*batch)
                metric.update(*batch)
            assert probe.count == 0, probe.events
        for metric, _ in metrics:
            with SyncProbe() as probe:
                metric.compute()
            assert probe.count <= 1, probe.events
            # the counters' one host copy (the layer's and the series' code differ in where it is made)
            assert all((event.kind, event.op) == ("host wait", "Tensor.tolist") for event in probe.events), probe.events
