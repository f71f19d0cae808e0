"""Acceptance of the sync-free aggregation: the probe counts 0 for patched calls and > 0 for the same stock calls."""

from __future__ import annotations

import warnings

import pytest
import torch
from torchmetrics.aggregation import MeanMetric

import torchmetrics_syncfree
from tests._aggregation_cases import AGGREGATORS, NAN, STRATEGIES
from tests.conftest import cuda
from torchmetrics_syncfree.probe import SyncProbe

LOSS = torch.tensor(0.6931)
VEC = torch.rand(16, generator=torch.Generator().manual_seed(0))
NAN_VEC = torch.tensor([0.5, NAN, 1.5])

MEAN_CALLS = {
    "update(loss)": lambda m: m.update(LOSS),
    "update(0.25)": lambda m: m.update(0.25),
    "update(loss, weight=2.0)": lambda m: m.update(LOSS, weight=2.0),
    "update(vec, weight=vec)": lambda m: m.update(VEC, weight=VEC),
    "forward(loss)": lambda m: m(LOSS),
}


def _count(metric, call, repeat: int = 3) -> SyncProbe:
    with SyncProbe() as probe, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeat):
            try:
                call(metric)
            except RuntimeError as err:  # "error": reported at the end of the update, a host read of a host copy
                assert "Encountered `nan` values in tensor" in str(err)
    return probe


@pytest.mark.parametrize("call", sorted(MEAN_CALLS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mean_metric_calls_are_sync_free(call, strategy):
    stock = _count(MeanMetric(nan_strategy=strategy), MEAN_CALLS[call])
    with torchmetrics_syncfree.patched():
        patched = _count(MeanMetric(nan_strategy=strategy), MEAN_CALLS[call])
    assert patched.count == 0, patched.summary()
    if strategy != "disable":
        assert stock.count > 0, "the probe must see stock's syncs for this call"


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("vec", [VEC, NAN_VEC], ids=["clean", "with-nan"])
def test_every_aggregator_update_is_sync_free(metric_cls, strategy, vec):
    with torchmetrics_syncfree.patched():
        metric = metric_cls(nan_strategy=strategy)
        probe = _count(metric, lambda m: m.update(vec))
    assert probe.count == 0, probe.summary()


@pytest.mark.parametrize("metric_cls", [m for m in AGGREGATORS if m.__name__ != "CatMetric"])
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s not in ("error", "warn")])
def test_forward_and_compute_are_sync_free(metric_cls, strategy):
    """Without checks to report, compute() has nothing to wait for; forward() never waits."""
    with torchmetrics_syncfree.patched():
        metric = metric_cls(nan_strategy=strategy)
        probe = _count(metric, lambda m: (m(VEC), m(NAN_VEC), m.compute()))
    assert probe.count == 0, probe.summary()


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("call", sorted(MEAN_CALLS))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cuda_sync_debug_mode_error_passes(call, strategy):
    """On a GPU runner: CUDA itself confirms there is no sync."""
    global LOSS, VEC
    with torchmetrics_syncfree.patched():
        metric = MeanMetric(nan_strategy=strategy).cuda()
        loss, vec = LOSS.cuda(), VEC.cuda()
        calls = {**MEAN_CALLS, "update(loss)": lambda m: m.update(loss), "forward(loss)": lambda m: m(loss)}
        calls["update(vec, weight=vec)"] = lambda m: m.update(vec, weight=vec)
        calls["update(loss, weight=2.0)"] = lambda m: m.update(loss, weight=2.0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                calls[call](metric)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        with SyncProbe("cuda") as probe:
            calls[call](metric)
        assert probe.count == 0, probe.summary()


def test_wrappers_and_collections_of_aggregators_are_sync_free_and_equal():
    from torchmetrics import MetricCollection
    from torchmetrics.aggregation import RunningMean, SumMetric

    def run(patched: bool):
        context = torchmetrics_syncfree.patched() if patched else warnings.catch_warnings()
        with context:
            running, collection = RunningMean(window=3), MetricCollection({"m": MeanMetric(), "s": SumMetric()})
            with SyncProbe() as probe:
                for _ in range(4):
                    running.update(VEC)
                    collection.update(VEC)
                    collection(VEC)
                    running(VEC)
            return probe.count, running.compute(), collection.compute()

    stock_count, stock_running, stock_collection = run(patched=False)
    count, running, collection = run(patched=True)
    assert stock_count > 0
    assert count == 0
    torch.testing.assert_close(running, stock_running, rtol=0, atol=0)
    torch.testing.assert_close(collection, stock_collection, rtol=0, atol=0)
