"""Deferred checks under DDP, in spawned gloo and ``cuda:gloo`` worlds of 2 and 4 ranks (device path forced).

The counters are a metric state summed by the sync, and ``compute()`` reports them once the states are synced: so
when one rank saw a NaN (or an invalid label), every rank raises in ``compute()``, the metric is left unsynced, and
the next collective finds every rank in it. Before, the rank that raised stayed synced and the next ``compute()``
raised ``TorchMetricsUserError`` on it while the other ranks waited alone in the gather (a hang under NCCL; here a
timeout of the bounded wait). Every wait is bounded (``tests/_ddp_world.py``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import _ddp_world

pytestmark = pytest.mark.ddp

NAN = float("nan")


def _error(fn: Any) -> str | None:
    try:
        fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


def _bad_rank_world(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0 feeds one bad batch to each metric; every rank computes twice and updates in between."""
    from torchmetrics.aggregation import MeanMetric, SumMetric
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassAUROC,
        MulticlassConfusionMatrix,
        MulticlassHingeLoss,
    )

    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    torchmetrics_syncfree.patch_all()
    _instrumentation.force_device_path(True)  # what every rank of a GPU job does; the copies arrive at once here
    out: dict[str, Any] = {}

    mean = MeanMetric(nan_strategy="error")
    mean.update(torch.tensor([float(rank + 1)]))
    out["update_error"] = _error(lambda: mean.update(torch.tensor([NAN if rank == 0 else 1.0])))
    out["compute_error"] = _error(mean.compute)
    out["synced_after_error"] = mean._is_synced
    out["value"] = mean.compute()  # a collective: every rank must be in it
    mean.update(torch.tensor([10.0]))
    out["value_after_update"] = mean.compute()

    accuracy = MulticlassAccuracy(num_classes=3, average="micro")
    target = torch.tensor([0, 1, 7 if rank == world_size - 1 else 2])
    accuracy.update(torch.tensor([0, 1, 2]), target)
    out["accuracy_error"] = _error(accuracy.compute)
    out["accuracy"] = accuracy.compute()

    # the families with counters of their own (confusion matrix, binned curves, hinge loss): the same bad target
    scores = torch.eye(3)
    for name, metric in (
        ("confmat", MulticlassConfusionMatrix(num_classes=3)),
        ("auroc", MulticlassAUROC(num_classes=3, thresholds=5)),  # sets validate_args after the curve's __init__
        ("hinge", MulticlassHingeLoss(num_classes=3)),
    ):
        metric.update(scores, target)
        out[f"{name}_error"] = _error(metric.compute)
        out[name] = metric.compute()

    total = SumMetric(nan_strategy="warn")
    total.update(torch.tensor([1.0, NAN] if rank % 2 else [1.0]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["sum"] = total.compute()
        total.compute()
    out["warnings"] = sum("Will be removed" in str(w.message) for w in caught)
    _instrumentation.force_device_path(False)
    return out


def _check(results: list[dict[str, Any]]) -> None:
    world_size = len(results)
    clean_mean = (sum(range(1, world_size + 1)) + (world_size - 1)) / (2 * world_size - 1)
    for rank, res in enumerate(results):
        assert res["update_error"] is None, "under DDP the end of an update reports nothing: compute() does"
        assert res["compute_error"] == "RuntimeError: Encountered `nan` values in tensor", rank
        assert res["synced_after_error"] is False
        torch.testing.assert_close(res["value"], torch.tensor(clean_mean))
        expected = (sum(range(1, world_size + 1)) + (world_size - 1) + 10.0 * world_size) / (3 * world_size - 1)
        torch.testing.assert_close(res["value_after_update"], torch.tensor(expected))
        assert res["accuracy_error"].startswith("RuntimeError: Detected values in `preds` or `target`"), rank
        torch.testing.assert_close(res["accuracy"], torch.tensor(1.0))  # the bad batch was left out
        for name in ("confmat", "auroc", "hinge"):
            assert res[f"{name}_error"].startswith("RuntimeError: Detected values in `preds` or `target`"), (name, rank)
        torch.testing.assert_close(res["confmat"], torch.eye(3, dtype=torch.long) * (world_size - 1))
        torch.testing.assert_close(res["auroc"], torch.tensor(1.0))
        torch.testing.assert_close(res["hinge"], torch.tensor(0.0))
        torch.testing.assert_close(res["sum"], torch.tensor(float(world_size)))
    # one warning per offending update of the whole world, from the first compute() (ranks are all "rank zero" here:
    # the spawned processes set no RANK variable for rank_zero_warn)
    assert {res["warnings"] for res in results} == {world_size // 2}


@pytest.mark.parametrize("backend", ["gloo", "cuda:gloo"])
def test_two_ranks_raise_together_and_stay_usable(tmp_path: Path, backend: str) -> None:
    _check(
        [res[f"_bad_rank_world@{backend}"] for res in _ddp_world.run_world([(backend, _bad_rank_world)], 2, tmp_path)]
    )


def test_four_ranks_raise_together_and_stay_usable(tmp_path: Path) -> None:
    results = _ddp_world.run_world([("cuda:gloo", _bad_rank_world), ("gloo", _bad_rank_world)], 4, tmp_path)
    for backend in ("cuda:gloo", "gloo"):
        _check([res[f"_bad_rank_world@{backend}"] for res in results])


#: the data of the compute-warning world: rank r's scores and labels (class 2 never occurs on any rank)
def _warning_world_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    return torch.rand(8, 3, generator=gen).softmax(1), torch.randint(0, 2, (8,), generator=gen)


def _compute_warning_world(rank: int, world_size: int) -> dict[str, Any]:
    """Every rank updates an unbinned MulticlassAveragePrecision whose class 2 never occurs: stock's compute warns that
    a class was NaN. On the device path the warning is a count filed by ``compute()`` while the states are synced."""
    from torchmetrics.classification import MulticlassAveragePrecision

    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    torchmetrics_syncfree.patch_all()
    _instrumentation.force_device_path(True)
    metric = MulticlassAveragePrecision(num_classes=3)
    metric.update(*_warning_world_data(rank))
    out: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["value"] = metric.compute()  # files the warning (rank 0); the synced counters are dropped by unsync
        out["at_compute"] = sum("was `nan`" in str(w.message) for w in caught)
        metric._computed = None
        metric.compute()  # reports the synced counts: rank 0's one warning, on every rank
        out["at_second_compute"] = sum("was `nan`" in str(w.message) for w in caught) - out["at_compute"]
        metric.reset()
        out["total"] = sum("was `nan`" in str(w.message) for w in caught)
    _instrumentation.force_device_path(False)
    return out


def test_compute_warnings_survive_the_sync_and_come_once(tmp_path: Path) -> None:
    """A warning that compute() finds on synced states is not lost with them at unsync: it is reported by the next
    eager point, once (rank 0 files it; the spawned ranks are all "rank zero" for rank_zero_warn, so each shows it)."""
    from torchmetrics.classification import MulticlassAveragePrecision

    world_size = 2
    results = [
        res["_compute_warning_world@gloo"]
        for res in _ddp_world.run_world([("gloo", _compute_warning_world)], world_size, tmp_path)
    ]
    stock = MulticlassAveragePrecision(num_classes=3)
    for rank in range(world_size):
        stock.update(*_warning_world_data(rank))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = stock.compute()
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["value"], expected, rtol=1e-6, atol=0)
        # the second compute reports the first one's warning (synced: on every rank) and files its own, which reset()
        # reports on rank 0, the rank that filed it: rank 0 shows stock's two warnings (one per compute)
        assert (res["at_compute"], res["at_second_compute"], res["total"]) == (0, 1, 2 if rank == 0 else 1), rank
