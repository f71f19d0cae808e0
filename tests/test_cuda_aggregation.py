"""CUDA checks of the sync-free aggregation (run by ``tox -e gpu``; skipped without CUDA elsewhere).

``torch.cuda.set_sync_debug_mode("error")`` turns every synchronizing CUDA call into an exception: it is the ground
truth the CPU probe stands in for.
"""

from __future__ import annotations

import io

import pytest
import torch
from torchmetrics.aggregation import CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric

import torchmetrics_syncfree
from tests._probing import syncs_are_errors
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.tools import audit, demo

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)"),
]

AGGREGATORS = (MeanMetric, SumMetric, MaxMetric, MinMetric, CatMetric)
STRATEGIES = ("error", "warn", "ignore", "disable", 0.0)


def _make(cls, strategy):
    try:
        return cls(nan_strategy=strategy)
    except ValueError:  # "disable" before torchmetrics 1.7
        pytest.skip(f"nan_strategy={strategy!r} does not exist in this torchmetrics release")


def test_patched_mean_update_and_forward_never_sync(syncfree):
    metric = MeanMetric().cuda()
    loss = torch.rand((), device="cuda")
    vec = torch.rand(16, device="cuda")
    metric.update(loss)  # first update outside: allocations, lazy CUDA init
    with syncs_are_errors():
        metric.update(loss)
        metric.update(0.25)
        metric.update(loss, weight=2.0)
        metric.update(vec, weight=vec)
        metric(loss)
        metric.update(torch.tensor(0.5))  # a 0-dim CPU tensor is used as a scalar, not copied
    expected = MeanMetric()
    for value, weight in ((loss, 1.0), (loss, 1.0), (0.25, 1.0), (loss, 2.0), (vec, vec), (loss, 1.0), (0.5, 1.0)):
        value = value.cpu() if isinstance(value, torch.Tensor) else value
        weight = weight.cpu() if isinstance(weight, torch.Tensor) else weight
        expected.update(value, weight)
    torch.testing.assert_close(metric.compute().cpu(), expected.compute())


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_patched_aggregator_update_never_syncs(syncfree, cls, strategy):
    metric = _make(cls, strategy).cuda()
    x = torch.rand(32, device="cuda")
    metric.update(x)
    with syncs_are_errors():
        metric.update(x)
        metric.update(x + 1)


@pytest.mark.parametrize("strategy", ["ignore", "disable", 0.0])
@pytest.mark.parametrize("cls", AGGREGATORS, ids=lambda c: c.__name__)
def test_cuda_patched_equals_cpu_stock(cls, strategy):
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(17, generator=gen) for _ in range(4)]
    batches[1][3] = float("nan")
    stock = _make(cls, strategy)
    for batch in batches:
        stock.update(batch.clone())
    with torchmetrics_syncfree.patched():
        metric = _make(cls, strategy).cuda()
        for batch in batches:
            metric.update(batch.cuda())
        value = metric.compute().cpu()
    torch.testing.assert_close(value, stock.compute(), equal_nan=True)


def test_warn_on_cuda_reaches_the_user_by_compute(syncfree):
    metric = MeanMetric(nan_strategy="warn").cuda()
    with pytest.warns(UserWarning, match="Encountered `nan` values"):
        metric.update(torch.tensor([1.0, float("nan"), 3.0], device="cuda"))
        value = metric.compute()
    assert value.item() == pytest.approx(2.0)


def test_error_on_cuda_raises_by_compute(syncfree):
    metric = MeanMetric(nan_strategy="error").cuda()
    with pytest.raises(RuntimeError, match="Encountered `nan` values"):
        metric.update(torch.tensor([1.0, float("nan")], device="cuda"))
        metric.compute()


def test_real_sync_counts_stock_vs_patched():
    [result] = audit.audit(["MeanMetric()"], inputs="loss", device="cuda")
    assert result.counts("stock")["update"] >= 1
    assert result.counts("patched")["update"] == 0
    assert result.counts("patched")["forward"] == 0


def test_probe_on_cuda_counts_stock_mean_update():
    metric = MeanMetric().cuda()
    loss = torch.rand((), device="cuda")
    metric.update(loss)
    with SyncProbe(device="cuda") as probe:
        metric.update(loss)
    assert probe.count >= 1
    assert all(event.kind == "cuda sync" for event in probe.events)


def test_demo_on_cuda_removes_the_aggregation_syncs():
    config = demo.DemoConfig(
        device="cuda", model="cnn", steps=4, batch_size=8, log_every=2, warmup=1, probe_steps=2, progress=False
    )
    report = demo.run_demo(config, stream=io.StringIO())
    stock, patched = report.result("stock"), report.result("patched")
    assert stock.syncs_per_step >= patched.syncs_per_step + 2
    assert report.agrees()  # replayed outputs agree (GPU training itself need not be bit-deterministic)
