"""Perplexity: stock's values on both patched paths (float32, float64, half logits; with and without
``ignore_index``), a sync-free update/forward/compute on the device path (stock's boolean mask and index copy seen
unpatched), stock's input errors, gradients, and an update that traces without a graph break."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import Tensor
from torchmetrics.functional.text import perplexity
from torchmetrics.text import Perplexity

import torchmetrics_syncfree
from tests._classification_cases import PATHS, parity
from tests._probing import CPU_HALF_MATH, assert_sync_free_life, graph_breaks
from torchmetrics_syncfree import SyncProbe

VOCAB = 7
IGNORE = (None, -100, 2)
DTYPES = (torch.float32, torch.float64, *((torch.half,) if CPU_HALF_MATH else ()))


def _batches(dtype: torch.dtype, ignore_index: int | None, seed: int) -> list[tuple[Tensor, Tensor]]:
    """Random logits; with ``ignore_index``, a quarter of the positions ignored and a fully ignored batch."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        preds = (torch.randn(3, 5, VOCAB, generator=gen) * 2).to(dtype)
        target = torch.randint(0, VOCAB, (3, 5), generator=gen)
        if ignore_index is not None:
            ignored = torch.rand(target.shape, generator=gen) < (1.0 if i == 3 else 0.25)
            target = target.masked_fill(ignored, ignore_index)
        out.append((preds, target))
    return out


def _cases(dtype: torch.dtype, ignore: tuple[int | None, ...] = IGNORE) -> dict[str, Any]:
    return {
        f"ignore={ii}": ((lambda ii=ii: Perplexity(ignore_index=ii)), _batches(dtype, ii, seed=i))
        for i, ii in enumerate(ignore)
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_parity_with_stock(path: str, dtype: torch.dtype) -> None:
    """forward() per batch and compute(). With ``ignore_index`` every path sums the ignored positions' zeros
    too: the float sum may round differently in the last bits (documented), so those cases have a tolerance of a few
    ulps of their dtype."""
    rtol = {torch.float32: 1e-6, torch.float64: 1e-12, torch.half: 2e-3}[dtype]
    parity(_cases(dtype), path=path, rtol=lambda label: rtol if label != "ignore=None" else 0.0)


@pytest.mark.parametrize("path", PATHS)
def test_parity_without_ignore_index_is_exact(path: str) -> None:
    """Without ``ignore_index`` the device path sums the same values in the same order: stock's to the bit."""
    parity({f"{dtype}": _cases(dtype, ignore=(None,))["ignore=None"] for dtype in DTYPES}, path=path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("ignore_index", IGNORE)
def test_functional_and_gradients_match_stock(path: str, ignore_index: int | None) -> None:
    preds, target = _batches(torch.float64, ignore_index, seed=5)[0]
    preds.requires_grad_(True)
    stock = perplexity(preds, target, ignore_index=ignore_index)
    (stock_grad,) = torch.autograd.grad(stock, preds)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = perplexity(preds, target, ignore_index=ignore_index)
        (patched_grad,) = torch.autograd.grad(patched, preds)
    torch.testing.assert_close(patched, stock, rtol=1e-12, atol=0)
    torch.testing.assert_close(patched_grad, stock_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("ignore_index", IGNORE)
def test_update_forward_and_compute_are_sync_free(syncfree: Any, ignore_index: int | None) -> None:
    data = _batches(torch.float32, ignore_index, seed=3)
    metric = Perplexity(ignore_index=ignore_index)
    assert_sync_free_life(metric, data)


@pytest.mark.parametrize("ignore_index", IGNORE)
def test_stock_syncs_are_seen(ignore_index: int | None) -> None:
    """Stock's boolean mask ``probs[...][mask]`` (and, with ``ignore_index``, ``torch.tensor(0, device=...)``)."""
    metric = Perplexity(ignore_index=ignore_index)
    with SyncProbe() as probe:
        metric.update(*_batches(torch.float32, ignore_index, seed=1)[0])
    assert probe.counts().get("data-dependent shape") == 1, probe.events


INVALID = {
    "preds rank": (torch.randn(3, VOCAB), torch.zeros(3, dtype=torch.long), ValueError),
    "target rank": (torch.randn(3, 5, VOCAB), torch.zeros(15, dtype=torch.long), ValueError),
    "shapes": (torch.randn(3, 5, VOCAB), torch.zeros(3, 4, dtype=torch.long), ValueError),
    "int preds": (torch.zeros(3, 5, VOCAB, dtype=torch.long), torch.zeros(3, 5, dtype=torch.long), TypeError),
    "int32 target": (torch.randn(3, 5, VOCAB), torch.zeros(3, 5, dtype=torch.int32), TypeError),
    "target too large": (torch.randn(3, 5, VOCAB), torch.full((3, 5), VOCAB), IndexError),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error(path: str, case: str) -> None:
    """Stock's exception and message (the checks read host information only; an out-of-range target fails in the
    same integer indexing as stock's, on CPU; on CUDA both hit a device assert)."""
    preds, target, error = INVALID[case]
    with pytest.raises(error) as stock_error:
        Perplexity().update(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = Perplexity()
        with pytest.raises(error) as patched_error:
            metric.update(preds, target)
    assert str(patched_error.value) == str(stock_error.value)
    assert float(metric.count) == 0


@pytest.mark.parametrize("path", PATHS)
def test_negative_targets_wrap_as_in_stock(path: str) -> None:
    """A negative target that is not ``ignore_index`` picks a class from the end (Python indexing), as in stock."""
    preds, target = torch.randn(2, 3, VOCAB), torch.tensor([[-1, 0, 3], [2, -VOCAB, 1]])
    stock = perplexity(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        torch.testing.assert_close(perplexity(preds, target), stock, rtol=0, atol=0)


@pytest.mark.parametrize("ignore_index", IGNORE)
@pytest.mark.compile
def test_update_traces_without_a_graph_break(ignore_index: int | None) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = Perplexity(ignore_index=ignore_index)
        preds, target = _batches(torch.float32, ignore_index, seed=2)[0]
        explanation = torch._dynamo.explain(lambda p, t: metric.update(p, t))(preds, target)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []
