"""CUDA checks of the other metrics' areas (MinMaxMetric, PeakSignalNoiseRatio, Perplexity, GeneralizedDiceScore): no
real synchronization in update/forward/compute (``torch.cuda.set_sync_debug_mode("error")``), stock's values, and
stock's synchronizations seen unpatched. Run by ``tox -e gpu``; skipped without CUDA elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torchmetrics import MeanSquaredError
from torchmetrics.image import PeakSignalNoiseRatio
from torchmetrics.segmentation import GeneralizedDiceScore
from torchmetrics.text import Perplexity
from torchmetrics.wrappers import MinMaxMetric

import torchmetrics_syncfree
from tests._probing import syncs_are_errors

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)"),
]


def _inputs(name: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    if name == "minmax":
        return torch.rand(64, generator=gen), torch.rand(64, generator=gen)
    if name.startswith("psnr"):
        return torch.rand(8, 3, 16, 16, generator=gen), torch.rand(8, 3, 16, 16, generator=gen)
    if name == "perplexity":
        target = torch.randint(0, 50, (8, 12), generator=gen)
        return torch.randn(8, 12, 50, generator=gen), target.masked_fill(target < 5, -100)
    return torch.randint(0, 4, (8, 16, 16), generator=gen), torch.randint(0, 4, (8, 16, 16), generator=gen)


MAKERS: dict[str, Callable[[], Any]] = {
    "minmax": lambda: MinMaxMetric(MeanSquaredError()),
    "psnr": lambda: PeakSignalNoiseRatio(data_range=1.0),
    "psnr-dim": lambda: PeakSignalNoiseRatio(data_range=(0.0, 1.0), dim=(1, 2, 3), reduction="none"),
    "perplexity": lambda: Perplexity(ignore_index=-100),
    "generalized_dice": lambda: GeneralizedDiceScore(num_classes=4, input_format="index", per_class=True),
}


def _values(out: Any) -> list[torch.Tensor]:
    return [out[key].cpu() for key in sorted(out)] if isinstance(out, dict) else [out.cpu()]


@pytest.mark.parametrize("name", list(MAKERS))
def test_update_forward_and_compute_never_sync_and_match_stock(name: str) -> None:
    batches = [_inputs(name, seed) for seed in range(3)]
    stock = MAKERS[name]()
    expected = [v for batch in batches for v in _values(stock(*batch))] + _values(stock.compute())
    with torchmetrics_syncfree.patched():
        metric = MAKERS[name]().cuda()
        cuda_batches = [tuple(x.cuda() for x in batch) for batch in batches]
        metric.update(*cuda_batches[0])  # first update and compute outside: allocations, lazy CUDA init
        metric.compute()
        metric.reset()
        out = []
        with syncs_are_errors():
            for batch in cuda_batches:
                out.append(metric(*batch))
            out.append(metric.compute())
    got = [v for value in out for v in _values(value)]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(MAKERS))
def test_stock_syncs_on_cuda(name: str) -> None:
    """Stock synchronizes in these calls (MinMaxMetric in compute, the others in update): the test above means
    something."""
    metric = MAKERS[name]().cuda()
    batch = tuple(x.cuda() for x in _inputs(name, 0))
    metric.update(*batch)
    with pytest.raises(RuntimeError), syncs_are_errors():
        metric.update(*batch)
        metric.compute()


def test_class_value_outside_the_classes_is_reported_not_asserted() -> None:
    with torchmetrics_syncfree.patched():
        metric = MAKERS["generalized_dice"]().cuda()
        preds, target = (x.cuda() for x in _inputs("generalized_dice", 1))
        metric.update(preds, target)
        with syncs_are_errors():
            metric.update(preds.masked_fill(preds == 0, 9), target)
        with pytest.raises(RuntimeError, match="Class values must be"):
            metric.compute()
