"""Sync-free ``torchmetrics.regression.spearman``: SpearmanCorrCoef's ``compute`` (and so ``forward``'s batch value).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``_rank_data``: 1.7.4+ ``torch.unique(...,            one ``sort`` per output; tie groups from the sorted values:
return_inverse, return_counts)`` + ``scatter_add``;  the group's first position by a running ``cummax``, its
1.6-1.7.1 ``_find_repeats`` (``nonzero``, boolean    last by a reversed running ``cummin``; the tie's rank, the
masks) and a Python loop over the repeated values    mean of its positions, is ``(first + last) / 2 + 1``
==================================================  ===========================================================

The update reads nothing (dtype and shape checks, list appends) and stays stock's. Where host reads are free (CPU)
``compute`` is stock's. On the device path the ranks are computed exactly (in float64) and cast to stock's rank dtype
(float32 from 1.7.4 on, the data's dtype before), so they equal stock's rounded ranks; the rest of ``compute`` is
stock's arithmetic on tensors of stock's layout, so the values are stock's to the bit.

Deliberate deviations (documented): stock 1.7.4+ sums the ranks of a tie group in int32, which overflows for ties
whose rank sum passes 2**31 (e.g. 70,000 equal values); the device path's ranks stay exact there. NaN inputs: each
NaN is its own tie group here (NaN compares unequal); stock's ``torch.unique`` may group them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_MODULE = "torchmetrics.regression.spearman"
_FUNCTIONAL = "torchmetrics.functional.regression.spearman"


def _rank_dtype(data: Tensor) -> torch.dtype:
    """Stock's rank dtype: 1.7.4+ divides int32 rank sums by int64 counts (float32); before: the data's dtype."""
    import torchmetrics.functional.regression.spearman as functional

    return data.dtype if hasattr(functional, "_find_repeats") else torch.float32


def rank_data(data: Tensor) -> Tensor:
    """Stock's ``_rank_data`` along the last dimension: 1-based ranks, ties given the mean of their ranks.

    Fixed shapes only: one sort, a running maximum and a reversed running minimum, one scatter of the ranks back.
    """
    n = data.shape[-1]
    values, order = data.sort(dim=-1)
    position = torch.arange(n, device=data.device).expand_as(values)
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[..., 1:] = values[..., 1:] != values[..., :-1]
    ends = torch.ones_like(starts)
    ends[..., :-1] = starts[..., 1:]
    first = torch.where(starts, position, 0).cummax(dim=-1).values
    last = torch.where(ends, position, n).flip(-1).cummin(dim=-1).values.flip(-1)
    ranks = ((first + last).double() / 2 + 1).to(_rank_dtype(data))
    return torch.empty_like(ranks).scatter_(-1, order, ranks)


@replaces(f"{_MODULE}.SpearmanCorrCoef.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's ``compute`` where reads are free; otherwise the same value without host reads."""
    preds = dim_zero_cat(self.preds)
    target = dim_zero_cat(self.target)
    if _deferred.reads_are_free(preds):
        return stock(f"{_MODULE}.SpearmanCorrCoef.compute")(self)
    eps = 1e-6  # stock's default of ``_spearman_corrcoef_compute``
    if preds.ndim == 1:
        preds, target = rank_data(preds), rank_data(target)
    else:  # stock ranks each output's column and stacks them: a transposed (outputs, N) tensor, the same layout
        preds, target = rank_data(preds.T), rank_data(target.T)
        preds, target = preds.T, target.T
    preds_diff = preds - preds.mean(0)
    target_diff = target - target.mean(0)
    cov = (preds_diff * target_diff).mean(0)
    preds_std = torch.sqrt((preds_diff * preds_diff).mean(0))
    target_std = torch.sqrt((target_diff * target_diff).mean(0))
    corrcoef = cov / (preds_std * target_std + eps)
    return torch.clamp(corrcoef, -1.0, 1.0)
