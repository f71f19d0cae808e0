"""PeakSignalNoiseRatio: stock's values on both patched paths for every ``data_range``/``dim``/``reduction``/
``base`` (float32, float64, half and integer inputs), a sync-free update/forward/compute on the device path (stock's
``tensor(target.numel())`` and ``tensor(base)`` seen unpatched), and an update that traces without a graph break."""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import pytest
import torch
import torch._dynamo
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.functional.image import peak_signal_noise_ratio
from torchmetrics.image import PeakSignalNoiseRatio

import torchmetrics_syncfree
from tests._classification_cases import PATHS, parity
from tests._probing import CPU_HALF_MATH, assert_sync_free_life
from torchmetrics_syncfree import SyncProbe

#: 1.6 also takes ``data_range=None`` (the range of the targets seen, kept in min/max states)
_RANGE_FROM_DATA = compare_version("torchmetrics", operator.lt, "1.7.0")
CONFIGS: dict[str, dict[str, Any]] = {
    "range": {"data_range": 1.0},
    "tuple": {"data_range": (0.2, 0.8)},
    "base2": {"data_range": 1.0, "base": 2.0},
    "int-base": {"data_range": 255, "base": 10},
    "dim": {"data_range": 1.0, "dim": (1, 2, 3), "reduction": "none"},
    "dim-sum": {"data_range": (0.0, 1.0), "dim": 1, "reduction": "sum"},
    "dim-neg": {"data_range": 1.0, "dim": [-1, -2]},
    **({"from-data": {"data_range": None}} if _RANGE_FROM_DATA else {}),
}
DTYPES = (torch.float32, torch.float64, *((torch.half,) if CPU_HALF_MATH else ()), torch.int64)


def _batches(dtype: torch.dtype, seed: int, n: int = 4) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(3):
        preds, target = torch.rand(n, 3, 6, 6, generator=gen), torch.rand(n, 3, 6, 6, generator=gen)
        if dtype == torch.int64:
            preds, target = (preds * 255).long(), (target * 255).long()
        out.append((preds.to(dtype), target.to(dtype)))
    return out


def _make(config: dict[str, Any]) -> PeakSignalNoiseRatio:
    with pytest.warns(UserWarning) if "dim" not in config and "reduction" in config else contextlib.nullcontext():
        return PeakSignalNoiseRatio(**config)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parity_with_stock(path: str, dtype: torch.dtype) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes, to the bit on both paths."""
    cases = {
        name: ((lambda c=config: _make(c)), _batches(dtype, seed=i))
        for i, (name, config) in enumerate(CONFIGS.items())
        if dtype != torch.int64 or config["data_range"] is None or config["data_range"] != 1.0
    }
    parity(cases, path=path)


@pytest.mark.parametrize("path", PATHS)
def test_functional_parity(path: str) -> None:
    """The functional ``peak_signal_noise_ratio`` runs through the same helpers."""
    preds, target = _batches(torch.float32, seed=9)[0]
    configs = [{"data_range": 1.0}, {"data_range": (0.1, 0.9), "dim": (2, 3), "reduction": "none"}]
    stock = [peak_signal_noise_ratio(preds, target, **config) for config in configs]
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = [peak_signal_noise_ratio(preds, target, **config) for config in configs]
    for s, p in zip(stock, patched):
        assert (p.dtype, p.shape) == (s.dtype, s.shape)
        torch.testing.assert_close(p, s, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    data = _batches(torch.float32, seed=3)
    metric = _make(CONFIGS[name])
    assert_sync_free_life(metric, data)


@pytest.mark.parametrize("name", ["range", "dim"])
def test_stock_syncs_are_seen(name: str) -> None:
    """Stock copies the count to the device in update and the base of the logarithm in compute."""
    metric = _make(CONFIGS[name])
    data = _batches(torch.float32, seed=1)
    with SyncProbe() as update_probe:
        metric.update(*data[0])
    with SyncProbe() as compute_probe:
        metric.compute()
    assert update_probe.counts() == {"host-to-device copy": 1}, update_probe.events
    assert compute_probe.counts() == {"host-to-device copy": 1}, compute_probe.events


@pytest.mark.parametrize("path", PATHS)
def test_invalid_reduction_raises_stocks_error(path: str) -> None:
    preds, target = _batches(torch.float32, seed=2)[0]
    config = {"data_range": 1.0, "dim": 1, "reduction": "bad"}
    metric = PeakSignalNoiseRatio(**config)
    metric.update(preds, target)
    with pytest.raises(ValueError, match="Reduction parameter unknown"):
        metric.compute()
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = PeakSignalNoiseRatio(**config)
        metric.update(preds, target)
        with pytest.raises(ValueError, match="Reduction parameter unknown"):
            metric.compute()


@pytest.mark.parametrize("name", ["range", "tuple", "dim", "dim-sum"])
@pytest.mark.compile
def test_update_traces_without_a_graph_break(name: str) -> None:
    """``fullgraph=True``: a graph break fails the compile (``dim`` tuples once did, a generator in the count)."""
    torch._dynamo.reset()
    try:
        with torchmetrics_syncfree.patched():
            metric, reference = _make(CONFIGS[name]), _make(CONFIGS[name])
            preds, target = _batches(torch.float32, seed=2)[1]
            torch.compile(lambda p, t: metric.update(p, t), fullgraph=True, backend="aot_eager")(preds, target)
        reference.update(preds, target)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(metric.compute(), reference.compute())
