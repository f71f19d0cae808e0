"""Kernel launches per call: the counter, the audit's ``--launches`` report, and the launch budget of the device path.

The budget (issue 26): over the audit catalogue at 10 and 1000 classes, the patched device path (the check counters'
host copy in flight) launches at most stock's total per call, and no configuration more than the larger of 1.25x and
stock's + 4. Counts are deterministic: the tests assert them, and fail if a configuration goes over again.
"""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import Mock

import pytest
import torch
from torchmetrics import Metric
from torchmetrics.aggregation import CatMetric, MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.regression import PearsonCorrCoef

import torchmetrics_syncfree
from torchmetrics_syncfree import __main__ as cli
from torchmetrics_syncfree import _deferred, audit
from torchmetrics_syncfree.launches import LaunchCounter, launches

CLASSES = (10, 1000)


# ----------------------------------------------------------------------------------------------- the counter


def test_views_allocations_and_metadata_launch_nothing() -> None:
    x = torch.rand(4, 6)
    with LaunchCounter() as counter:
        x.view(6, 4).t().unsqueeze(0).expand(3, 4, 6)[1, :, ::2].detach()
        torch.empty(5)
        torch.empty_like(x)
        x.reshape(24)
        x.size(0)
    assert counter.count == 0, counter.ops


def test_arithmetic_copies_and_fills_launch_one_each() -> None:
    x = torch.rand(4, 6)
    with LaunchCounter() as counter:
        y = x * 2  # 1
        y.add_(1)  # 1
        x.clone()  # 1
        x.to(torch.float64)  # 1
        torch.zeros(3)  # 1 (a fill)
        torch.full((2,), 3.0)  # 1
        float(y.sum())  # sum 1, _local_scalar_dense 1 (a device-to-host copy)
    assert counter.count == 8, counter.ops


def test_every_aten_overload_is_classified_once() -> None:
    assert launches(torch.ops.aten.add.Tensor) and not launches(torch.ops.aten.view.default)
    assert not launches(torch.ops.aten.empty.memory_format) and launches(torch.ops.aten.zeros.default)


# ----------------------------------------------------------------------------------------------- the report


def test_the_audit_reports_launches_stock_vs_patched(capsys: pytest.CaptureFixture) -> None:
    status = cli.main(["audit", "--launches", "--metric", "MulticlassConfusionMatrix(num_classes=10)", "--json"])
    assert status == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["launches"]["stock"] == {"update": 5, "forward": 9}
    assert row["launches"]["patched"]["update"] <= 9  # the budget: max(1.25 x 5, 5 + 4)
    assert row["ops"]["patched"]["update"].get("aten.put_.default") == 1  # one counting kernel, validation folded in


# ----------------------------------------------------------------------------------------------- the budget


@pytest.fixture(scope="module")
def launch_results() -> list[audit.LaunchResult]:
    return audit.launch_audit(CLASSES)


@pytest.mark.slow  # the catalogue differs between releases; the latest release holds the budget
@pytest.mark.parametrize("classes", CLASSES)
@pytest.mark.parametrize("call", audit.LAUNCH_CALLS)
def test_the_device_path_keeps_the_launch_budget(
    launch_results: list[audit.LaunchResult], call: str, classes: int
) -> None:
    rows = [r for r in launch_results if r.classes == classes]
    over = {r.config.spec: r.launches for r in rows if r.over_budget(call)}
    assert over == {}, "over the launch budget"
    stock = sum(r.launches["stock"][call] for r in rows)
    patched = sum(r.launches["patched"][call] for r in rows)
    assert patched <= stock, (stock, patched)


def _forward_steps(make: Any, inputs: list[Any]) -> tuple[list[Any], Any]:
    """``forward`` over ``inputs`` then ``compute()``: the batch values and the final value."""
    metric = make()
    values = [metric(*batch) for batch in inputs]
    return values, metric.compute()


@pytest.mark.parametrize("path", ["cpu", "device"])
@pytest.mark.parametrize(
    ("make", "inputs"),
    [
        (lambda: MeanMetric(), [(torch.tensor(1.0),), (torch.tensor([2.0, 4.0]),), (torch.tensor(3.0),)]),
        (lambda: CatMetric(), [(torch.tensor([1.0, 2.0]),), (torch.tensor(3.0),), (torch.tensor([4.0]),)]),
        (
            lambda: MulticlassAccuracy(num_classes=3, average="macro"),
            [(torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 1])), (torch.tensor([2, 2]), torch.tensor([2, 0]))],
        ),
        # the two-update forward (full_state_update): its batch part keeps the global states aside the same way
        (lambda: PearsonCorrCoef(), [(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 3.0, 2.0]))] * 3),
    ],
)
def test_forward_keeps_the_global_states_without_copying_them(make: Any, inputs: list[Any], path: str) -> None:
    """``forward`` keeps the global states aside by reference (a list state as a shallow copy): ``reset()`` replaces
    tensor states and empties lists in place. Stock clones every state: a launch per tensor state and step, and a list
    state's whole history. Same values as stock, and ``_copy_state_dict`` is never called."""
    expected = _forward_steps(make, inputs)
    with torchmetrics_syncfree.patched(), pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(Metric, "_copy_state_dict", Mock(side_effect=AssertionError("copied")))
        _deferred.force_device_path(path == "device")
        try:
            values, final = _forward_steps(make, inputs)
        finally:
            _deferred.force_device_path(False)
    for value, reference in zip([*values, final], [*expected[0], expected[1]]):
        torch.testing.assert_close(value, reference, rtol=0, atol=0)


def test_forward_copies_the_global_states_of_a_metric_with_its_own_reset() -> None:
    """A class whose ``reset()`` zeroes its states in place keeps stock's copy of the global states."""

    class InPlaceReset(SumMetric):
        def reset(self) -> None:
            self.sum_value.zero_()
            self._update_count = 0
            self._computed = None

    with torchmetrics_syncfree.patched():
        metric = InPlaceReset()
        metric(torch.tensor(1.0))
        assert metric(torch.tensor(2.0)) == 2.0
        assert metric.compute() == 3.0
