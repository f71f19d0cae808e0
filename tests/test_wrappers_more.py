"""BootStrapper and MultioutputWrapper: sync-free updates and forwards on the device path, stock's values
where reads are free (seeded BootStrapper runs to the bit), the device path's resampling pinned by its distribution,
MultioutputWrapper's values on both paths and its one documented read with ``remove_nans``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.aggregation import CatMetric, SumMetric
from torchmetrics.classification import BinaryAccuracy
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError, PearsonCorrCoef
from torchmetrics.wrappers import BootStrapper, MultioutputWrapper

from tests._classification_cases import assert_identical
from tests._probing import graph_breaks
from tests.test_wrapper_checks import DELAYS, _device_path
from torchmetrics_syncfree import SyncProbe, _instrumentation, patched
from torchmetrics_syncfree.tools.launches import count_launches


def _regression(seed: int, n: int = 24) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=gen), torch.rand(n, generator=gen)


def _flat(value: Any) -> list[Tensor]:
    return list(value.values()) if isinstance(value, dict) else [value]


# --------------------------------------------------------------------------------------------------------------------
# BootStrapper


def _bootstrap_run(make: Callable[[], Metric], seed: int = 0) -> list[Tensor]:
    torch.manual_seed(seed)  # stock and the patched CPU path draw from the global generator
    metric, out = make(), []
    for i in range(3):
        out += _flat(metric(*_regression(i)))
        metric.update(*_regression(i + 10))
    out += _flat(metric.compute())
    return out


BOOTSTRAPS: dict[str, Callable[[], Metric]] = {
    "poisson": lambda: BootStrapper(MeanSquaredError(), num_bootstraps=4, quantile=0.9, raw=True),
    "multinomial": lambda: BootStrapper(MeanSquaredError(), num_bootstraps=4, sampling_strategy="multinomial"),
}


@pytest.mark.parametrize("strategy", list(BOOTSTRAPS))
def test_bootstrapper_cpu_path_is_stocks_to_the_bit(strategy: str) -> None:
    """Where reads are free the update is stock's: seeded runs give stock's values, dtypes and shapes."""
    stock = _bootstrap_run(BOOTSTRAPS[strategy])
    with patched():
        ours = _bootstrap_run(BOOTSTRAPS[strategy])
    assert_identical(stock, ours, strategy)


@DELAYS
@pytest.mark.parametrize("strategy", list(BOOTSTRAPS))
def test_bootstrapper_update_forward_and_compute_are_sync_free(strategy: str, delay: int | None) -> None:
    make = BOOTSTRAPS[strategy]
    with _device_path(delay):
        metric = make()
        metric.update(*_regression(0))
        with SyncProbe() as probe:
            for i in range(1, 3):
                metric.update(*_regression(i))
                metric(*_regression(i + 10))
        assert probe.events == [], probe.summary()
        with SyncProbe() as probe:
            metric.compute()
        assert probe.events == [], probe.summary()
    if strategy == "poisson":  # stock's Poisson draw reads its rate (the probe sees it: the zeros mean something); its
        # multinomial draw is CPU work whose copy to a GPU a CPU probe cannot see
        stock = make()
        with SyncProbe() as probe:
            stock.update(*_regression(0))
        assert probe.count > 0


@pytest.mark.parametrize("strategy", list(BOOTSTRAPS))
def test_bootstrapper_device_path_draws_size_samples_uniformly(strategy: str) -> None:
    """Documented resampling of the device path: every bootstrap gets exactly ``size`` rows, drawn uniformly with
    replacement (stock's multinomial; for "poisson", stock's distribution given its size): each row's count over
    many bootstraps has mean 1 and the multinomial's variance ``1 - 1/size``."""
    size, bootstraps = 8, 400
    with _device_path(0):
        torch.manual_seed(0)
        metric = BootStrapper(CatMetric(), num_bootstraps=bootstraps, sampling_strategy=strategy)
        metric.update(torch.arange(size, dtype=torch.float32))
        drawn = torch.stack([m.compute() for m in metric.metrics])  # CatMetric: the rows each bootstrap got
    assert drawn.shape == (bootstraps, size)
    counts = torch.stack([torch.bincount(row.long(), minlength=size) for row in drawn]).double()
    assert counts.sum(1).eq(size).all()
    assert counts.mean().item() == pytest.approx(1.0)
    assert counts.mean(0).sub(1).abs().max().item() < 0.2  # each row: mean 1 (400 draws of a Binomial(8, 1/8))
    assert counts.var().item() == pytest.approx(1 - 1 / size, abs=0.1)


def test_bootstrapper_device_path_is_seeded_and_never_skips() -> None:
    """The same seed, the same draws (from the device's generator); a batch of one row is never skipped (stock's
    Poisson skips a bootstrap with probability exp(-1) there)."""
    runs = []
    for _ in range(2):
        with _device_path(0):
            runs.append(_bootstrap_run(BOOTSTRAPS["poisson"], seed=5))
    assert_identical(runs[0], runs[1], "seeded")
    with _device_path(0):
        metric = BootStrapper(SumMetric(), num_bootstraps=20)
        metric.update(torch.ones(1))
        assert [float(m.compute()) for m in metric.metrics] == [1.0] * 20


def test_bootstrapper_launches_no_more_than_stock() -> None:
    """One draw for every bootstrap instead of a CPU draw and a copy per bootstrap."""

    def launches() -> int:
        metric = BootStrapper(MeanSquaredError(), num_bootstraps=10)
        metric.update(*_regression(0))
        return count_launches(metric.update, *_regression(1))[0]

    _instrumentation.force_device_path(True)
    try:
        stock = launches()
        with patched():
            ours = launches()
    finally:
        _instrumentation.force_device_path(False)
    assert ours <= stock, (ours, stock)


@pytest.mark.compile
def test_bootstrapper_update_traces_without_a_graph_break() -> None:
    torch._dynamo.reset()
    with _device_path(0):
        metric = BootStrapper(MeanSquaredError(), num_bootstraps=3)
        explanation = torch._dynamo.explain(metric.update)(*_regression(0))
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


# --------------------------------------------------------------------------------------------------------------------
# MultioutputWrapper


def _outputs(seed: int, nan: bool, n: int = 20) -> tuple[Tensor, Tensor]:
    """preds and target of 3 outputs; with ``nan``, NaN rows in some outputs only (one output keeps every row)."""
    gen = torch.Generator().manual_seed(seed)
    preds, target = torch.rand(n, 3, generator=gen), torch.rand(n, 3, generator=gen)
    if nan:
        preds[seed % n, 0] = float("nan")
        target[(seed + 3) % n, 0] = float("nan")
        target[(seed + 5) % n, 2] = float("nan")
    return preds, target


def _labels(seed: int, nan: bool = False, n: int = 20) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n, 2), generator=gen), torch.randint(0, 2, (n, 2), generator=gen)


MULTIOUTPUT: dict[str, tuple[Callable[[], Metric], Callable[..., tuple[Tensor, Tensor]], int]] = {
    # name: (make, inputs, host reads per update/forward on the device path)
    "mse-remove-nans": (lambda: MultioutputWrapper(MeanSquaredError(), num_outputs=3), _outputs, 0),
    # states that are not sums: remove_nans reads the kept rows' numbers
    "pearson-remove-nans": (lambda: MultioutputWrapper(PearsonCorrCoef(), num_outputs=3), _outputs, 1),
    "mae-keep-nans": (lambda: MultioutputWrapper(MeanAbsoluteError(), num_outputs=3, remove_nans=False), _outputs, 0),
    "mse-output-dim-0": (
        lambda: MultioutputWrapper(MeanSquaredError(), num_outputs=3, output_dim=0),
        lambda seed, nan: tuple(x.T.contiguous() for x in _outputs(seed, False)),
        0,
    ),
    "accuracy-int-labels": (lambda: MultioutputWrapper(BinaryAccuracy(), num_outputs=2), _labels, 0),
}


def _multioutput_run(make: Callable[[], Metric], inputs: Callable[..., tuple[Tensor, Tensor]]) -> list[Tensor]:
    metric, out = make(), []
    for seed in range(3):
        out.append(metric(*inputs(seed, True)))
        metric.update(*inputs(seed + 10, seed % 2 == 0))
        out.append(metric.compute())
    metric.reset()
    metric.update(*inputs(20, False))
    out.append(metric.compute())
    return out


@pytest.mark.parametrize("path", ["cpu", "device"])
def test_multioutput_values_are_stocks(path: str) -> None:
    """Both paths: stock's values, dtypes and shapes; to the bit where reads are free and where the device path
    removes the NaN rows (after its one read); up to float32 rounding where it neutralises them in sum states (the
    filler row's contribution taken off again)."""
    for name, (make, inputs, reads) in MULTIOUTPUT.items():
        stock = _multioutput_run(make, inputs)
        with _device_path(0) if path == "device" else patched():
            ours = _multioutput_run(make, inputs)
        neutralised = path == "device" and reads == 0 and "remove-nans" in name
        assert_identical(stock, ours, name, rtol=1e-6 if neutralised else 0.0)


def test_multioutput_neutralised_rows_where_an_output_has_no_row_left() -> None:
    """An output whose rows all have a NaN keeps its states (stock's update of an empty batch), in update and forward;
    MeanSquaredError (a float and an integer sum) and MeanAbsoluteError."""

    def run(metric: Metric, probe: Any = None) -> list[Tensor]:
        out = []
        with probe or contextlib.nullcontext():
            for seed in range(3):
                preds, target = _outputs(seed, True)
                if seed == 1:
                    preds[:, 1] = float("nan")
                out.append(metric(preds, target))
                metric.update(*_outputs(seed + 5, True))
        return [*out, metric.compute()]

    for make in (lambda: MultioutputWrapper(MeanSquaredError(), 3), lambda: MultioutputWrapper(MeanAbsoluteError(), 3)):
        stock = run(make())
        with _device_path(0):
            probe = SyncProbe()
            ours = run(make(), probe)
        assert probe.count == 0, probe.summary()
        assert_identical(stock, ours, "no row left", rtol=1e-5)


def test_multioutput_neutralised_rows_launch_at_most_2_25_times_stocks() -> None:
    """The neutralised ``remove_nans`` updates the wrapped metric twice per output (the filled batch, the filler row),
    where stock's update reads the host per output instead: 114 launches against stock's 54 (and 12 host reads) for
    three MeanSquaredError outputs on torch 2.13 (the series 120: it finds the NaN rows with upstream's
    ``_get_nan_indices``); 141 before the filled batch's update ran on the states themselves."""

    def launches() -> int:
        metric = MultioutputWrapper(MeanSquaredError(), 3)
        metric.update(*_outputs(0, True))
        return count_launches(metric.update, *_outputs(1, True))[0]

    stock = launches()
    with _device_path(None):
        ours = launches()
    assert ours <= 2.25 * stock, (ours, stock)


@DELAYS
@pytest.mark.parametrize("name", list(MULTIOUTPUT))
def test_multioutput_reads(name: str, delay: int | None) -> None:
    """No read without ``remove_nans``, without floating-point inputs, or where every wrapped metric's states are sums
    (NaN rows neutralised); otherwise exactly one per update and forward (the documented read: the kept rows'
    numbers), also where a batch has NaN rows; stock reads more."""
    make, inputs, reads = MULTIOUTPUT[name]
    with _device_path(delay):
        metric = make()
        metric.update(*inputs(0, False))
        for seed in range(1, 3):
            for call in (metric.update, metric.forward):
                with SyncProbe() as probe:
                    call(*inputs(seed, True))
                assert probe.count == reads, (call.__name__, probe.summary())
    stock = make()
    with SyncProbe() as probe:
        stock.update(*inputs(0, True))
    assert probe.count > reads


# --------------------------------------------------------------------------------------------------------------------
# CUDA (``tox -e gpu``; skipped without CUDA)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
@pytest.mark.parametrize("name", ["bootstrapper", "multioutput-keep-nans", "multioutput-int-labels"])
def test_cuda_update_and_forward_never_sync(name: str) -> None:
    """``torch.cuda.set_sync_debug_mode("error")``: the ground truth the CPU probe stands in for."""
    from tests._probing import syncs_are_errors

    makers: dict[str, tuple[Callable[[], Metric], Callable[[int], tuple[Tensor, Tensor]]]] = {
        "bootstrapper": (lambda: BootStrapper(MeanSquaredError(), num_bootstraps=4), _regression),
        "multioutput-keep-nans": (MULTIOUTPUT["mae-keep-nans"][0], lambda seed: _outputs(seed, True)),
        "multioutput-int-labels": (MULTIOUTPUT["accuracy-int-labels"][0], _labels),
    }
    make, inputs = makers[name]
    with patched():
        metric = make().cuda()
        batches = [tuple(x.cuda() for x in inputs(seed)) for seed in range(3)]
        metric.update(*batches[0])  # allocations and lazy CUDA initialisation outside
        metric.compute()
        with syncs_are_errors():
            for batch in batches:
                metric.update(*batch)
                metric(*batch)
