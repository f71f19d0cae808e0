"""Would-be host-device syncs of the classification metrics, stock vs patched (CPU probe; real CUDA when present)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchmetrics_syncfree
from tests import _series_tree
from tests._classification_cases import (
    DEVICES,
    METRICS,
    TASK_AVERAGES,
    batches,
    config_id,
    configs,
    make_metric,
    pending_checks,
)
from tests._probing import stock_counts_of_torch_2_13
from torchmetrics_syncfree import SyncProbe, _instrumentation, probe


def _events(name: str, device: str) -> dict[str, list[str]]:
    """Probe every configuration of ``name``: update, forward, and compute() once the checks have been read."""
    found: dict[str, list[str]] = {}
    for config in configs((name,)):
        _, task, average, ignore_index = config
        metric = make_metric(name, task, average, ignore_index).to(device)
        data = [(p.to(device), t.to(device)) for p, t in batches(task, ignore_index, seed=1)]
        with SyncProbe(device) as update:
            for preds, target in data:
                metric.update(preds, target)
        with SyncProbe(device) as forward:
            for preds, target in data:
                metric(preds, target)
        with SyncProbe(device) as compute:
            metric.compute()
        for step, p in (("update", update), ("forward", forward), ("compute", compute)):
            if p.count:
                found[f"{config_id(config)} {step}"] = [str(event) for event in p.events]
    return found


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", METRICS)
def test_patched_update_forward_compute_are_sync_free(syncfree: Any, name: str, device: str) -> None:
    """Every task x average x ignore_index: 0 events in update, forward and compute."""
    found = _events(name, device)
    assert not found, "\n".join(f"{key}:\n  " + "\n  ".join(events) for key, events in found.items())


@pytest.mark.parametrize("name", ["Accuracy", "F1Score"])
def test_stock_syncs_are_seen(name: str) -> None:
    """The same probe run on stock TorchMetrics finds syncs in every configuration's update (the test can fail)."""
    found = _events(name, "cpu")
    updates = {key for key in found if key.endswith(" update")}
    missing = {
        config_id(config)
        for config in configs((name,))
        # stock multiclass micro validates nothing and filters nothing without ignore_index: no sync to see
        if f"{config_id(config)} update" not in updates and config[1:] != ("multiclass", "micro", None)
    }
    assert not missing


@stock_counts_of_torch_2_13
def test_stock_sync_points(sync_probe: Any) -> None:
    """The sync points the module docstring lists are real: bincount and the macro weight mask."""
    metric = make_metric("Precision", "multiclass", "macro")
    preds, target = batches("multiclass", None, seed=0)[0]
    with sync_probe() as p:
        metric(preds, target)
    ops = {event.op.rsplit(".", 1)[0] for event in p.events}
    assert {"aten.bincount", "aten.index_put_"} <= ops, p.summary()


@pytest.mark.parametrize(("delay", "waits"), [(0, []), (None, [probe.HOST_WAIT])], ids=["copy-arrived", "copy-late"])
def test_compute_after_plain_updates_waits_only_for_unread_checks(syncfree: Any, delay: Any, waits: list) -> None:
    """compute() reads the check counters only when the copies of the updates have not arrived: then one host wait."""
    metric = make_metric("F1Score", "multiclass", "macro", -1)
    preds, target = batches("multiclass", -1, seed=0)[0]
    with _instrumentation.simulated_copy_delay(delay), SyncProbe() as p:
        metric.update(preds, target)
        metric.update(preds, target)
        metric.compute()
    assert [event.kind for event in p.events] == waits, p.summary()


@pytest.mark.parametrize(("task", "average"), TASK_AVERAGES)
def test_compute_without_validation_is_sync_free(syncfree: Any, task: str, average: str) -> None:
    metric = make_metric("Recall", task, average, validate_args=False)
    preds, target = batches(task, None, seed=0)[0]
    with SyncProbe() as p:
        metric.update(preds, target)
        metric.compute()
    assert p.count == 0, p.summary()


def test_one_check_per_update(syncfree: Any) -> None:
    """Validation counts a single flag per update (label preds and target together), in the metric's counters."""
    metric = make_metric("Accuracy", "binary", "micro", -1)
    preds, target = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, -1, 3])
    with _instrumentation.simulated_copy_delay(None), SyncProbe() as p:
        metric.update(preds, target)
        assert pending_checks(metric) == 1
        metric.update(preds, target.clamp(max=1))
        assert pending_checks(metric) == 1
        metric.update(preds.clamp(max=0) + 2, target)
        assert pending_checks(metric) == 2
    assert p.count == 0, p.summary()


@pytest.mark.skipif(_series_tree.in_tree_mode(), reason="metrics made before patch_all() are the layer's")
def test_metric_created_before_patching_is_sync_free() -> None:
    metric = make_metric("Specificity", "multilabel", "weighted", -1)
    data = batches("multilabel", -1, seed=2)
    with torchmetrics_syncfree.patched(), SyncProbe() as p:
        for preds, target in data:
            metric(preds, target)
    assert p.count == 0, p.summary()


@pytest.mark.parametrize("kwargs", [{"top_k": 2}, {"multidim_average": "samplewise"}], ids=str)
@pytest.mark.parametrize("ignore_index", [None, -1, 1])
def test_multiclass_other_arguments_sync_free(syncfree: Any, kwargs: dict, ignore_index: Any) -> None:
    metric = make_metric("Precision", "multiclass", "macro", ignore_index, **kwargs)
    preds, target = batches("multiclass", ignore_index, seed=4)[0]
    if "multidim_average" in kwargs:
        preds, target = preds.unsqueeze(-1), target.unsqueeze(-1)
    with SyncProbe() as p:
        metric(preds, target)
        metric.update(preds, target)
    assert p.count == 0, p.summary()


def test_zero_division_warn_reads_at_once_as_stock(syncfree: Any) -> None:
    """``_safe_divide(..., "warn")`` (no stat-score metric passes it) warns at once, as stock does, with stock's
    value; the zero-division fill itself is no host-to-device copy."""
    from torchmetrics.utilities.compute import _safe_divide

    num, denom = torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0])
    with SyncProbe() as p, pytest.warns(UserWarning, match="Detected zero division"):
        result = _safe_divide(num, denom, "warn")
    assert [event.kind for event in p.events] == [probe.D2H_READ], p.summary()
    torch.testing.assert_close(result, torch.tensor([0.5, 0.0]))
    with SyncProbe() as p:
        _safe_divide(num, denom, 1.0)
    assert p.count == 0, p.summary()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int64, torch.float32, torch.bool])
def test_the_label_check_takes_narrow_dtypes_of_many_classes(dtype: torch.dtype) -> None:
    """The device path's range check clamps to the classes: a bound past the dtype's range must not raise."""
    from torchmetrics_syncfree.classification.stat_scores import _not_a_class

    labels = torch.tensor([0, 1, 100, 120], dtype=dtype)
    if dtype == torch.bool:
        assert torch.equal(_not_a_class(labels, 1, None), labels)  # True is no class of one
    elif dtype.is_signed:
        labels = torch.cat([labels, torch.tensor([-3], dtype=dtype)])
    wide = labels.double()  # the expectation in a dtype that holds every bound (int8 >= 200 would wrap the scalar)
    assert torch.equal(_not_a_class(labels, 200, None), (wide < 0) | (wide >= 200))
    assert torch.equal(_not_a_class(labels, 101, None), (wide < 0) | (wide >= 101))
