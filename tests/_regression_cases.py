"""Cases shared by the regression tests: metrics, batches (float32, float64, half; 1-D and multi-output)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchmetrics
from torch import Tensor

Batches = list[tuple[Tensor, Tensor]]


def batches(seed: int, outputs: int | None = None, dtype: torch.dtype = torch.float32, n: int = 16) -> Batches:
    """Random batches, a batch of near-perfect predictions and one with a constant target column."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if outputs is None else (n, outputs)
    out = []
    for i in range(4):
        target = torch.randn(shape, generator=gen)
        preds = target + 0.5 * torch.randn(shape, generator=gen)
        if i == 2:
            preds = target.clone()
        if i == 3:
            target = target.clone()
            if outputs is None:
                target.fill_(0.75)
            else:
                target[:, 0] = 0.75
        out.append((preds.to(dtype), target.to(dtype)))
    return out


def constant(seed: int, outputs: int | None = None, dtype: torch.dtype = torch.float32, n: int = 8) -> Batches:
    """Batches whose every target is the same constant (stock's zero-denominator branches)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if outputs is None else (n, outputs)
    return [(torch.randn(shape, generator=gen).to(dtype), torch.full(shape, 0.5, dtype=dtype)) for _ in range(2)]


Make = Callable[[], Any]


def r2(**kwargs: Any) -> Make:
    return lambda: torchmetrics.R2Score(**kwargs)


def explained_variance(**kwargs: Any) -> Make:
    return lambda: torchmetrics.ExplainedVariance(**kwargs)


def pearson(**kwargs: Any) -> Make:
    return lambda: torchmetrics.PearsonCorrCoef(**kwargs)


def with_small_batches(data: Batches) -> Batches:
    """``data`` plus a batch of one (stock's ``num_obs == 1`` update) and a constant batch (near-zero variance)."""
    preds, target = data[0]
    return [*data, (preds[:1], target[:1]), (preds, torch.ones_like(target))]


def rounded(seed: int, outputs: int | None = None, dtype: torch.dtype = torch.float32, n: int = 16) -> Batches:
    """``batches`` rounded to a few distinct values (tie groups of every size), then a batch of all-equal preds."""
    data = [(torch.round(p * 2) / 2, torch.round(t * 2) / 2) for p, t in batches(seed, outputs, torch.float32, n)]
    data.append((torch.zeros_like(data[0][0]), data[0][1]))
    return [(p.to(dtype), t.to(dtype)) for p, t in data]
