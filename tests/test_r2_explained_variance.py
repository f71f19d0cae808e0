"""R2Score and ExplainedVariance: stock's values on both patched paths (float32, float64, half; every
``multioutput``, ``adjusted``), sync-free update/forward/compute on the device path, stock's errors and warnings."""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from tests import _series_tree
from tests._classification_cases import PATHS, parity, pending_checks
from tests._probing import assert_sync_free_life, graph_breaks, warning_messages
from tests._regression_cases import batches, constant, explained_variance, r2
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.regression import r2 as r2_module

MULTIOUTPUT = ("raw_values", "uniform_average", "variance_weighted")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "half": torch.half}


def _cases() -> dict[str, Any]:
    cases = {}
    for name, dtype in DTYPES.items():
        for multioutput in MULTIOUTPUT:
            data = batches(seed=len(cases), outputs=3, dtype=dtype)
            cases[f"r2-{multioutput}-{name}"] = r2(multioutput=multioutput), data
            cases[f"ev-{multioutput}-{name}"] = explained_variance(multioutput=multioutput), data
            cases[f"r2-{multioutput}-constant-{name}"] = r2(multioutput=multioutput), constant(1, 2, dtype)
            ev_constant = explained_variance(multioutput=multioutput), constant(1, 2, dtype)
            cases[f"ev-{multioutput}-constant-{name}"] = ev_constant
        cases[f"r2-1d-{name}"] = r2(), batches(seed=7, dtype=dtype)
        cases[f"ev-1d-{name}"] = explained_variance(), batches(seed=7, dtype=dtype)
        # adjusted: 16 per batch; 15 regressors divide by zero in each forward, 40 exceed the batch, 5 fit
        for adjusted in (5, 15, 40):
            cases[f"r2-adjusted={adjusted}-{name}"] = r2(adjusted=adjusted), batches(seed=adjusted, dtype=dtype)
    return cases


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute() (after forwards, after updates): stock's values to the bit, its dtypes and
    shapes, on both paths."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the adjusted warnings: counted in the tests below
        parity(_cases(), path=path)


SYNC_FREE = {
    "r2": r2(multioutput="raw_values"),
    "r2-adjusted": r2(adjusted=3),
    "r2-variance-weighted": r2(multioutput="variance_weighted"),
    "ev": explained_variance(),
    "ev-raw": explained_variance(multioutput="raw_values"),
}


@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    data = batches(seed=3, outputs=2)
    metric = SYNC_FREE[name]()
    assert_sync_free_life(metric, data, updates=2)


@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_stock_syncs_are_seen(name: str) -> None:
    """The probe sees stock's reads in forward (its compute of the batch value): the zero above means something."""
    preds, target = batches(seed=3, outputs=2)[0]
    metric = SYNC_FREE[name]()
    with SyncProbe() as probe:
        metric(preds, target)
    assert probe.count > 0


@pytest.mark.parametrize("path", PATHS)
def test_too_few_samples_raise_stocks_error(path: str) -> None:
    """``num_obs < 2``: stock's ValueError from forward (a batch of one) and compute (one observation in all). On
    the device path the count is read only then: the host bound (smallest batch x updates) is below 2."""
    preds, target = torch.randn(1, 2), torch.randn(1, 2)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = torchmetrics.R2Score()
        with pytest.raises(ValueError, match="at least two samples"):
            metric(preds, target)
        fresh = torchmetrics.R2Score()
        fresh.update(preds, target)
        with pytest.raises(ValueError, match="at least two samples"):
            fresh.compute()
        fresh.update(preds, target)  # two batches of one: enough
        assert fresh.compute().shape == ()
        fresh.reset()
        fresh.update(preds, target)
        with pytest.raises(ValueError, match="at least two samples"):
            fresh.compute()


@pytest.mark.parametrize("path", PATHS)
def test_count_is_read_only_below_the_host_bound_on_every_path(path: str) -> None:
    """One implementation: where the host bound rules stock's error out, ``compute`` reads no count, on CPU too. A
    ``total`` written by hand below what the updates added (documented deviation) is therefore not checked."""
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = torchmetrics.R2Score()
        metric.update(torch.randn(4), torch.randn(4))
        metric.total = torch.ones_like(metric.total)  # stock raises: "at least two samples"
        assert torch.isfinite(metric.compute())


def test_host_bound_needs_no_read_and_is_a_lower_bound(syncfree: Any) -> None:
    """The bound is the smallest batch times the updates since the reset; an update that raised, a metric made
    before the patch or merged/synced states only make it smaller than the count (never larger)."""
    metric = torchmetrics.R2Score()
    for size in (4, 1, 3):
        metric.update(torch.randn(size), torch.randn(size))
    assert _count_at_least(metric) == 3 <= int(metric.total) == 8
    with pytest.raises(RuntimeError):
        metric.update(torch.randn(3), torch.randn(4))
    assert _count_at_least(metric) == 0
    twin = copy.deepcopy(pickle.loads(pickle.dumps(torchmetrics.R2Score())))
    twin.update(torch.randn(2), torch.randn(2))
    assert _count_at_least(twin) == 2
    twin.reset()
    assert _count_at_least(twin) == 0
    with SyncProbe() as probe:
        twin.update(torch.randn(5), torch.randn(5))
        twin(torch.randn(6), torch.randn(6))  # forward: its batch alone has the bound 2 x 1 (the smallest batch ever)
        twin.compute()
    assert probe.count == 0
    assert _count_at_least(twin) == 2 * 2 <= int(twin.total) == 11


def _count_at_least(metric: Any) -> int:
    """The host bound of the patch in use: the layer's, or in tree mode the series' (its own attribute)."""
    series = _series_tree.series_module("torchmetrics.regression.r2")
    return series._count_at_least(metric) if series is not None else r2_module.count_at_least(metric)


def _warnings_of(run: Any) -> list[str]:
    return warning_messages(run, "adjusted r2")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("adjusted", [15, 40, 63])
def test_adjusted_warnings_come_once_each(path: str, adjusted: int) -> None:
    """Stock warns in every compute (forward's included) whose count makes ``adjusted`` fall back (batches of 16, 64
    in all: 63 regressors divide by zero in the final compute too); the patched metric gives the same warnings, once
    each (on the device path at the next eager point: forward's end, compute, reset)."""
    data = batches(seed=2)

    def run() -> None:
        metric = torchmetrics.R2Score(adjusted=adjusted)
        for preds, target in data:
            metric(preds, target)
        metric.compute()
        metric.reset()

    expected = _warnings_of(run)
    assert len(expected) == len(data) + (adjusted == 63)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        got = _warnings_of(run)
    assert sorted(got) == sorted(expected)


def test_adjusted_warning_of_compute_is_reported_at_the_next_eager_point(syncfree: Any) -> None:
    metric = torchmetrics.R2Score(adjusted=40)
    for preds, target in batches(seed=2)[:2]:
        metric.update(preds, target)
    with SyncProbe():
        assert _warnings_of(metric.compute) == []
        assert pending_checks(metric) == 1
        twin = copy.deepcopy(metric)
        assert len(_warnings_of(twin.reset)) == 1  # a copy carries the pending warning
        assert len(_warnings_of(metric.reset)) == 1
    assert pending_checks(metric) == 0


@pytest.mark.compile
def test_update_traces_without_a_graph_break() -> None:
    torch._dynamo.reset()
    preds, target = batches(seed=2, outputs=2)[0]
    with torchmetrics_syncfree.patched():
        for make in (r2(adjusted=1, multioutput="variance_weighted"), explained_variance()):
            metric = make()
            explanation = torch._dynamo.explain(lambda p, t, m=metric: m.update(p, t))(preds, target)
            assert graph_breaks(explanation) == []
    torch._dynamo.reset()


@pytest.mark.parametrize("path", PATHS)
def test_collection_merge_and_copies_match_stock(path: str) -> None:
    """MetricCollection (a compute group of two R2Scores), merge_state, deepcopy and pickle: stock's values."""
    data = batches(seed=11, outputs=2)

    def run() -> list[Tensor]:
        collection = torchmetrics.MetricCollection(
            {"a": torchmetrics.R2Score(), "b": torchmetrics.R2Score(multioutput="raw_values")},
        )
        first, second = torchmetrics.R2Score(), torchmetrics.ExplainedVariance()
        out = []
        for preds, target in data:
            out += list(collection(preds, target).values())
            first.update(preds, target)
            second.update(preds, target)
        out += list(collection.compute().values())
        merged = copy.deepcopy(first)
        merged.merge_state(pickle.loads(pickle.dumps(first)))
        return [*out, merged.compute(), copy.deepcopy(second).compute()]

    expected = run()
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        got = run()
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_counters_only_with_adjusted_and_added_when_adjusted_is_set_later(syncfree: Any) -> None:
    """R2Score without ``adjusted`` carries no check counters (one state less in every forward); one whose
    ``adjusted`` is set after construction gets them when its compute first files a warning."""
    assert getattr(torchmetrics.R2Score(), "_deferred_checks", None) is None
    assert getattr(torchmetrics.R2Score(adjusted=1), "_deferred_checks", None) is not None
    metric = torchmetrics.R2Score()
    metric.adjusted = 40
    for preds, target in batches(seed=2)[:2]:
        metric.update(preds, target)
    with SyncProbe() as probe:
        metric.compute()
    assert probe.count == 0
    assert pending_checks(metric) == 1
    assert len(_warnings_of(metric.reset)) == 1
