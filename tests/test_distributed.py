"""The distributed area in one process: mode selection, the ``"device"`` mode's copies, ``_sync_dist``'s routing.

The spawned-world tests are in ``test_ddp_fallback.py``; here the process group is faked where a world would be
needed, which lets the ``"device"`` mode be checked without a GPU.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torchmetrics.aggregation import CatMetric

import torchmetrics_syncfree
from torchmetrics_syncfree import distributed as sfd


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sfd.MODE_ENV_VAR, raising=False)
    monkeypatch.setattr(sfd, "_mode", None)


def test_targets_are_declared() -> None:
    assert {"torchmetrics.utilities.distributed.gather_all_tensors", "torchmetrics.metric.Metric._sync_dist"} <= set(
        torchmetrics_syncfree.declared_targets()
    )


def test_patch_reaches_the_metric_module_and_unpatch_restores(syncfree: list[str]) -> None:
    import torchmetrics.metric
    import torchmetrics.utilities.distributed

    original = torchmetrics_syncfree.get_original("torchmetrics.utilities.distributed.gather_all_tensors")
    assert torchmetrics.metric.gather_all_tensors is sfd.gather_all_tensors
    assert torchmetrics.utilities.distributed.gather_all_tensors is sfd.gather_all_tensors
    assert torchmetrics.metric.Metric._sync_dist is sfd._sync_dist
    torchmetrics_syncfree.unpatch_all()
    assert torchmetrics.metric.gather_all_tensors is original
    assert torchmetrics.metric.Metric._sync_dist is not sfd._sync_dist


def test_mode_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sfd.get_fallback_mode() == "gloo"
    monkeypatch.setenv(sfd.MODE_ENV_VAR, "Device")
    assert sfd.get_fallback_mode() == "device"
    sfd.set_fallback_mode("off")  # the function wins over the environment
    assert sfd.get_fallback_mode() == "off"
    sfd.set_fallback_mode(None)
    assert sfd.get_fallback_mode() == "device"
    monkeypatch.setenv(sfd.MODE_ENV_VAR, "nccl")
    with pytest.raises(ValueError, match=sfd.MODE_ENV_VAR):
        sfd.get_fallback_mode()
    with pytest.raises(ValueError, match="set_fallback_mode"):
        sfd.set_fallback_mode("gpu")


class _FakeGroup:
    """Stands for a process group with a backend for ``meta`` only (a device type this machine can allocate)."""

    _device_types = (torch.device("meta"),)
    bound_device_id = None


@pytest.fixture
def fake_world(monkeypatch: pytest.MonkeyPatch) -> _FakeGroup:
    group = _FakeGroup()
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(sfd, "_world_group", lambda: group)
    return group


def _recording_gather(calls: list[tuple[torch.Tensor, Any]]) -> Any:
    def gather(result: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        calls.append((result, group))
        # what a 2-rank gather returns on the group's device (meta has no data: the values come back as CPU zeros)
        return [torch.zeros(result.shape, dtype=result.dtype)] * 2

    return gather


def test_device_mode_copies_to_the_group_device_and_back(fake_world: _FakeGroup) -> None:
    calls: list[tuple[torch.Tensor, Any]] = []
    sfd.set_fallback_mode("device")
    out = sfd._route(_recording_gather(calls), torch.ones(3, dtype=torch.float64), None)
    ((sent, group),) = calls
    assert sent.device.type == "meta" and sent.shape == (3,) and sent.dtype == torch.float64
    assert group is None  # the collective runs on the metric's own group
    assert [t.device.type for t in out] == ["cpu", "cpu"]


def test_states_with_a_backend_are_not_touched(fake_world: _FakeGroup) -> None:
    calls: list[tuple[torch.Tensor, Any]] = []
    state = torch.ones(2, device="meta")
    for mode in sfd.MODES:
        sfd.set_fallback_mode(mode)
        sfd._route(_recording_gather(calls), state, fake_world)
    assert all(sent is state and group is fake_world for sent, group in calls)


def test_gloo_mode_uses_the_cached_group(fake_world: _FakeGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[Any] = []
    monkeypatch.setattr(sfd, "_new_gloo_group", lambda parent: created.append(parent) or object())
    monkeypatch.setattr(sfd, "_fallbacks", {})
    calls: list[tuple[torch.Tensor, Any]] = []
    for _ in range(3):
        sfd._route(_recording_gather(calls), torch.ones(2), None)
    assert created == [fake_world]
    assert len({id(group) for _, group in calls}) == 1 and calls[0][1] is sfd._fallbacks[fake_world]


def test_custom_dist_sync_fn_is_routed(syncfree: list[str], fake_world: _FakeGroup) -> None:
    calls: list[tuple[torch.Tensor, Any]] = []
    sfd.set_fallback_mode("device")
    metric = CatMetric()
    metric.update(torch.arange(3.0))
    metric._sync_dist(_recording_gather(calls))
    assert [sent.device.type for sent, _ in calls] == ["meta"] * len(metric._reductions)  # its values and checks
    assert metric.value.device.type == "cpu" and metric.value.shape == (6,)


@pytest.mark.skipif(
    torch.__version__ < "2.1",
    reason=f"torch {torch.__version__}: TorchMetrics syncs empty list states from torch 2.1 on",
)
@pytest.mark.parametrize("patch", [False, True])
def test_empty_list_state_of_compute_on_cpu_metric_is_gathered_on_cpu(patch: bool) -> None:
    """Stock puts a rank's missing data on the metric's device while the other ranks gather CPU tensors."""
    metric = CatMetric(compute_on_cpu=True)
    metric._device = torch.device("meta")  # stands for a GPU: where stock builds the placeholder
    calls: list[tuple[torch.Tensor, Any]] = []
    with torchmetrics_syncfree.patched() if patch else nullcontext():
        metric._sync_dist(_recording_gather(calls))
    assert [sent.device.type for sent, _ in calls] == ["cpu" if patch else "meta"]


def test_unknown_groups_are_passed_through(fake_world: _FakeGroup) -> None:
    """A group whose backends cannot be read (not a ProcessGroup, e.g. NON_GROUP_MEMBER) gets the stock call."""
    calls: list[tuple[torch.Tensor, Any]] = []
    state = torch.ones(2)
    for group in (object(), torch.distributed.GroupMember.NON_GROUP_MEMBER):
        sfd._route(_recording_gather(calls), state, group)
        assert calls[-1][0] is state and calls[-1][1] is group
        assert sfd.fallback_group(group) is group


def test_fallback_group_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        sfd.fallback_group()
