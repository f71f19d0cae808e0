"""PearsonCorrCoef: stock's values on both patched paths (float32, float64, half; one and several outputs; the
near-zero-variance NaNs), sync-free update/forward/compute on the device path, stock's warning once per compute."""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
from typing import Any
from unittest import mock

import pytest
import torch
import torch._dynamo

import torchmetrics_syncfree
from tests._classification_cases import PATHS, parity, pending_checks
from tests._probing import graph_breaks, warning_messages
from tests._regression_cases import batches, constant, pearson, with_small_batches
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.regression import pearson as pearson_module

DTYPES = {"float32": torch.float32, "float64": torch.float64, "half": torch.half}


def _cases() -> dict[str, Any]:
    cases = {}
    for name, dtype in DTYPES.items():
        cases[f"1d-{name}"] = pearson(), with_small_batches(batches(seed=1, dtype=dtype))
        cases[f"3-outputs-{name}"] = pearson(num_outputs=3), with_small_batches(batches(seed=2, outputs=3, dtype=dtype))
        cases[f"constant-{name}"] = pearson(num_outputs=2), constant(3, 2, dtype)
    return cases


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute() (after forwards, after updates): stock's values to the bit (NaN where
    stock's are), its dtypes and shapes, on both paths."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the variance warning: counted below
        parity(_cases(), path=path)


@pytest.mark.skipif(pearson_module._SCALED, reason="this release's update reads nothing: stock's runs")
def test_early_release_update_reads_no_count_on_cpu(syncfree: Any) -> None:
    """1.6/1.7.1: stock's update reads ``num_prior.mean() > 0``; the patched one, one implementation on every device,
    knows the branch on the host (first update, earlier batches) or selects it on the device, with stock's values."""
    data = with_small_batches(batches(seed=4, outputs=3))
    reference = pearson(num_outputs=3)()
    torchmetrics_syncfree.unpatch_all()
    for preds, target in data:
        reference.update(preds, target)
    torchmetrics_syncfree.patch_all()
    metric = pearson(num_outputs=3)()
    with mock.patch.object(torch.Tensor, "__bool__", side_effect=AssertionError("a read of the count")):
        for preds, target in data:
            metric.update(preds, target)
    for state in ("mean_x", "mean_y", "var_x", "var_y", "corr_xy", "n_total"):
        assert torch.equal(getattr(metric, state), getattr(reference, state)), state


@pytest.mark.parametrize("outputs", [1, 3])
def test_update_forward_and_compute_are_sync_free(syncfree: Any, outputs: int) -> None:
    data = with_small_batches(batches(seed=3, outputs=None if outputs == 1 else outputs))
    metric = pearson(num_outputs=outputs)()
    with SyncProbe() as probe, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for preds, target in data[:2]:
            metric.update(preds, target)
        for preds, target in data[2:]:
            metric(preds, target)
        metric.compute()
    assert probe.count == 0, probe.events


def test_stock_syncs_are_seen() -> None:
    """The probe sees stock's reads in forward (its compute of the batch value): the zero above means something."""
    preds, target = batches(seed=3)[0]
    metric = pearson()()
    with SyncProbe() as probe:
        metric(preds, target)
    assert probe.count > 0


def _variance_warnings(run: Any) -> list[str]:
    return warning_messages(run, "variance of predictions")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_variance_warning_comes_once_per_compute_naming_the_dtype(path: str, dtype: str) -> None:
    """Stock warns in every compute (forward's batch value included) with a near-zero variance, naming the dtype
    (bfloat16 for half on CPU); the patched metric gives the same messages, once each (on the device path at the next
    eager point: forward's end, compute, reset)."""
    data = with_small_batches(batches(seed=4, outputs=2, dtype=DTYPES[dtype]))

    def run() -> None:
        metric = pearson(num_outputs=2)()
        for preds, target in data:
            metric(preds, target)
        metric.compute()
        metric.update(*data[-1])
        metric.compute()
        metric.reset()

    expected = _variance_warnings(run)
    assert len(expected) >= 2  # the batch of one and the constant batch
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        got = _variance_warnings(run)
    assert sorted(got) == sorted(expected)


def test_warning_of_compute_is_reported_at_the_next_eager_point(syncfree: Any) -> None:
    metric = pearson()()
    preds, target = batches(seed=5)[0]
    metric.update(preds, torch.zeros_like(target))
    with SyncProbe():
        assert _variance_warnings(metric.compute) == []
        assert pending_checks(metric) == 1
        twin = pickle.loads(pickle.dumps(copy.deepcopy(metric)))
        assert len(_variance_warnings(twin.reset)) == 1  # a copy carries the pending warning
        assert len(_variance_warnings(metric.reset)) == 1
    assert pending_checks(metric) == 0


def test_several_ranks_states_aggregate_as_stock() -> None:
    """The stacked states of several ranks (``dist_reduce_fx=None``): stock's ``_final_aggregation``, then the
    sync-free coefficient; stock's values on the device path."""
    data = batches(seed=6, outputs=2)

    def run() -> torch.Tensor:
        ranks = [pearson(num_outputs=2)() for _ in range(2)]
        for i, (preds, target) in enumerate(data):
            ranks[i % 2].update(preds, target)
        merged = ranks[0]
        for name in merged._defaults:
            if name != "_deferred_checks":
                setattr(merged, name, torch.stack([getattr(rank, name) for rank in ranks]))
        return merged.compute()

    expected = run()
    with torchmetrics_syncfree.patched(), SyncProbe() as probe:
        got = run()
    assert probe.count == 0
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.compile
def test_compute_traces_without_a_graph_break() -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = pearson(num_outputs=2)()
        metric.update(*batches(seed=2, outputs=2)[0])
        explanation = torch._dynamo.explain(metric.compute)()
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []
