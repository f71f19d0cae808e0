"""The sync probe sees every kind of would-be sync, points at the line that caused it, and is silent otherwise."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import torchmetrics
from torchmetrics.aggregation import MeanMetric

from tests._aggregation_cases import TM_GE_1_7
from tests.conftest import cuda
from torchmetrics_syncfree.probe import D2H_READ, DATA_DEPENDENT_SHAPE, H2D_COPY, SyncProbe

X = torch.tensor([1.0, float("nan"), 3.0])
MASK = torch.isnan(X)
LABELS = torch.tensor([0, 2, 2, 1])

SYNCING = {
    "item": (D2H_READ, lambda: X[0].item()),
    "bool": (D2H_READ, lambda: bool(MASK.any())),
    "if": (D2H_READ, lambda: 1 if MASK.any() else 0),
    "int": (D2H_READ, lambda: int(LABELS.max())),
    "float": (D2H_READ, lambda: float(X[0])),
    "equal": (D2H_READ, lambda: torch.equal(X, X)),
    "tolist": (D2H_READ, lambda: LABELS.tolist()),
    "mask-index": (DATA_DEPENDENT_SHAPE, lambda: X[~MASK]),
    "mask-assign": (DATA_DEPENDENT_SHAPE, lambda: X.clone().__setitem__(MASK, torch.zeros(()))),
    "nonzero": (DATA_DEPENDENT_SHAPE, lambda: MASK.nonzero()),
    "where-1-arg": (DATA_DEPENDENT_SHAPE, lambda: torch.where(MASK)),
    "masked_select": (DATA_DEPENDENT_SHAPE, lambda: X.masked_select(MASK)),
    "unique": (DATA_DEPENDENT_SHAPE, lambda: torch.unique(LABELS)),
    "bincount": (DATA_DEPENDENT_SHAPE, lambda: torch.bincount(LABELS)),
    "repeat_interleave": (DATA_DEPENDENT_SHAPE, lambda: torch.repeat_interleave(LABELS)),
    "tensor-from-float": (H2D_COPY, lambda: torch.tensor(0.5)),
    "as_tensor-from-list": (H2D_COPY, lambda: torch.as_tensor([1, 2], dtype=torch.float32)),
    "new_tensor": (H2D_COPY, lambda: X.new_tensor([1.0])),
}

SYNC_FREE = {
    "full": lambda: torch.full((), 0.5),
    "arithmetic": lambda: (X * 2 + 1).sum(),
    "masked_fill": lambda: X.masked_fill(MASK, 0.0),
    "where-3-arg": lambda: torch.where(MASK, 0.0, X),
    "as_tensor-of-tensor": lambda: torch.as_tensor(X, dtype=torch.float64),
    "scatter_add": lambda: torch.zeros(3, dtype=torch.long).scatter_add_(
        0, LABELS[:3], torch.ones(3, dtype=torch.long)
    ),
    "repeat_interleave-sized": lambda: torch.repeat_interleave(LABELS, LABELS, output_size=5),
    "python-scalar-arg": lambda: X + 0.5,
    # torch checks q's range with a host read on CPU inputs only (older releases), never on an accelerator
    "quantile-of-a-float": lambda: torch.quantile(X, 0.3),
    "quantile-of-a-tensor": lambda: X.quantile(torch.full((2,), 0.5)),
    "nanquantile": lambda: torch.nanquantile(X, 0.3),
}


@pytest.mark.parametrize("name", sorted(SYNCING))
def test_flags_each_kind_of_sync(name):
    kind, fn = SYNCING[name]
    line = inspect.getsourcelines(fn)[1]
    with SyncProbe() as probe:
        fn()
    assert probe.count == 1, probe.summary()
    event = probe.events[0]
    assert event.kind == kind
    assert event.location == f"{os.path.abspath(__file__)}:{line}", "the event points at the line that synced"
    assert event.caller == event.location


@pytest.mark.parametrize("name", sorted(SYNC_FREE))
def test_silent_on_sync_free_code(name):
    with SyncProbe() as probe:
        SYNC_FREE[name]()
    assert probe.count == 0, probe.summary()


def test_reads_inside_a_quantile_of_synced_data_still_count():
    """Only quantile's own CPU-only check is quiet: a read made to build its argument is the caller's."""
    with SyncProbe() as probe:
        torch.quantile(X[~MASK], 0.3)
    assert [event.kind for event in probe.events] == [DATA_DEPENDENT_SHAPE]


def test_stock_mean_update_reads_two_nan_flags():
    metric, loss = MeanMetric(), torch.tensor(0.25)
    with SyncProbe() as probe:
        metric.update(loss)
    # 1.6 also copies its default weight 1.0 to the device
    expected = {D2H_READ: 2} if TM_GE_1_7 else {D2H_READ: 2, H2D_COPY: 1}
    assert probe.counts() == expected, probe.summary()
    for event in (e for e in probe.events if e.kind == D2H_READ):
        assert event.location.startswith(os.path.dirname(torchmetrics.__file__))
        assert "nans" in event.source and ".any()" in event.source
        assert event.caller.startswith(os.path.abspath(__file__))
        assert event.library == event.location, "the op is issued by a TorchMetrics line itself"


def test_events_name_the_innermost_library_frame_even_when_a_helper_issues_the_op():
    """``library``: the TorchMetrics/torchmetrics_syncfree line responsible, where the op runs in code it called."""
    from torchmetrics.functional.audio import permutation_invariant_training

    def reading_metric(preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        (preds - target).sum().item()  # a user's metric function that reads
        return -(preds - target).abs().mean(-1)

    with SyncProbe() as probe:
        X[0].item()  # user code: no library frame
        permutation_invariant_training(torch.rand(2, 2, 8), torch.rand(2, 2, 8), reading_metric, eval_func="max")
    user, *stock = probe.events
    assert user.library == ""
    helper = [event for event in stock if event.location.startswith(os.path.abspath(__file__))]
    assert helper, probe.summary()  # pit.py's own syncs aside
    for event in helper:
        assert ".item()" in event.source and event.caller == event.location
        assert event.library.startswith(os.path.dirname(torchmetrics.__file__)), event


def test_a_host_wait_is_attributed_to_the_call_that_asked_for_the_read():
    """The counters' read in ``_deferred`` waits for whoever asked: the event names compute's ``sync_context``."""
    from torchmetrics_syncfree import _deferred, _instrumentation, patched

    value = torch.tensor(0.5)
    with patched(), _instrumentation.simulated_copy_delay(None):
        metric = MeanMetric()
        metric.update(value)
        with SyncProbe() as probe:
            metric.update(value)
            metric.compute()
    [wait] = probe.events
    assert wait.kind == "host wait"
    assert wait.location == wait.library
    assert wait.location.startswith(os.path.join(os.path.dirname(_deferred.__file__), "metric.py:"))
    assert wait.caller.startswith(os.path.abspath(__file__))


def test_stock_mean_update_of_a_python_float_also_copies_to_the_device():
    metric = MeanMetric()
    with SyncProbe() as probe:
        metric.update(0.25)
    expected_copies = 1 if TM_GE_1_7 else 2
    assert probe.counts() == {H2D_COPY: expected_copies, D2H_READ: 2}, probe.summary()


def test_summary_lists_each_event_with_its_line():
    with SyncProbe() as probe:
        X[0].item()
    summary = probe.summary()
    assert "1 would-be syncs" in summary
    assert f"{os.path.basename(__file__)}:" in summary
    assert "X[0].item()" in summary
    with pytest.raises(AssertionError, match="device-to-host read"):
        probe.assert_no_syncs()


def test_nested_probes_both_count():
    with SyncProbe() as outer:
        X[0].item()
        with SyncProbe() as inner:
            X[1].item()
    assert (outer.count, inner.count) == (2, 1)


def test_rejects_unknown_devices():
    with pytest.raises(ValueError, match="cpu"):
        SyncProbe("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_probe_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="needs CUDA"), SyncProbe("cuda"):
        pass


def test_pytest_fixtures(pytester):
    pytester.makepyfile(
        """
        import torch

        def test_clean(no_syncs):
            with no_syncs():
                torch.full((), 1.0) + 1

        def test_dirty(no_syncs):
            with no_syncs():
                torch.ones(2).sum().item()

        def test_counting(sync_probe):
            with sync_probe() as probe:
                torch.ones(2).tolist()
            assert probe.count == 1
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")  # the plugin loads through its pytest11 entry point
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*device-to-host read*", "*torch.ones(2).sum().item()*"])


@cuda
@pytest.mark.cuda
def test_cuda_probe_counts_real_syncs():
    x = torch.ones(3, device="cuda")
    with SyncProbe("cuda") as probe:
        x.sum().item()
    assert probe.count >= 1
    with SyncProbe("cuda") as probe:
        torch.full((), 0.5, device="cuda") + x
    assert probe.count == 0, probe.summary()
