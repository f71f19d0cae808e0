"""Kernel launches per call: the counter, the audit's ``--launches`` report, and the launch budget of the device path.

The budget: over the audit catalogue at 10 and 1000 classes, the patched device path (the check counters'
host copy in flight) launches at most stock's total per call, and no configuration more than the larger of 1.25x and
stock's + 4. Counts are deterministic: the tests assert them, and fail if a configuration goes over again.
"""

from __future__ import annotations

import json

import pytest
import torch

from torchmetrics_syncfree import __main__ as cli
from torchmetrics_syncfree import _compat
from torchmetrics_syncfree.tools import audit
from torchmetrics_syncfree.tools.launches import LaunchCounter, launches

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


def test_a_foreach_op_off_cudas_fast_route_counts_a_launch_per_tensor() -> None:
    """CUDA's multi-tensor kernels need dense tensors of one dtype, matching in shape and strides at each position of
    the lists; otherwise the op runs one kernel per tensor, and the counter says so."""
    dense = [torch.zeros(4, dtype=torch.long) for _ in range(3)]
    square = torch.zeros(4, 4, dtype=torch.long)
    cases = {
        "fast route": ([torch.zeros(4, dtype=torch.long) for _ in range(3)], 1),
        "a diagonal view": ([square.diagonal(), *dense[1:]], 3),
        "mixed dtypes": ([torch.zeros(4, dtype=torch.int32), *dense[1:]], 3),
        "a 0-dim value into a (4,)-state": ([torch.zeros((), dtype=torch.long), *dense[1:]], 3),
    }
    for case, (values, expected) in cases.items():
        with LaunchCounter() as counter:
            torch._foreach_add_(dense, values)
        assert counter.count == expected, case
    if _compat.FOREACH_MUL_BY_TENSOR:  # (torch 2.0 reads a 0-dim tensor operand as a number)
        with LaunchCounter() as counter:
            torch._foreach_mul(dense, torch.tensor(2))  # a 0-dim tensor operand is no list: the fast route
        assert counter.count == 1
