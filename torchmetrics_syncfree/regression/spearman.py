"""Sync-free ``torchmetrics.regression.spearman``: SpearmanCorrCoef's ``compute`` (and so ``forward``'s batch value).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_rank_data``: 1.7.4+ ``torch.unique(...,            one ``sort`` per output; tie groups start where a sorted
return_inverse, return_counts)`` + ``scatter_add``;  value changes; the groups' sizes counted and summed up give
1.6-1.7.1 ``_find_repeats`` (``nonzero``, boolean    each group's first and last position; the tie's rank,
masks) and a Python loop over the repeated values    the mean of its 1-based positions, is
                                                     ``(first + end + 1) / 2``
==================================================  ===========================================================

The update reads nothing (dtype and shape checks, list appends) and stays stock's. ``compute`` has one implementation on
every device: twice each rank is an exact integer, halved in stock's rank dtype (float32 from 1.7.4 on, the data's dtype
before), so the ranks equal stock's rounded ranks; the rest of ``compute`` is stock's arithmetic on tensors of stock's
layout, so the values are stock's to the bit. preds and target are ranked in one call (the rows of one tensor), linear
after the sort, where stock reads the host (``unique``).

Deliberate deviations (documented): stock 1.7.4+ sums the ranks of a tie group in int32, which overflows for ties
whose rank sum passes 2**31 (e.g. 70,000 equal values); the ranks here stay exact there. NaN inputs: each
NaN is its own tie group here (NaN compares unequal); stock's ``torch.unique`` may group them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree._registry import replaces

_MODULE = "torchmetrics.regression.spearman"
_FUNCTIONAL = "torchmetrics.functional.regression.spearman"


def _rank_dtype(data: Tensor) -> torch.dtype:
    """Stock's rank dtype: 1.7.4+ divides int32 rank sums by int64 counts (float32); before: the data's dtype."""
    import torchmetrics.functional.regression.spearman as functional

    return data.dtype if hasattr(functional, "_find_repeats") else torch.float32


def rank_data(data: Tensor) -> Tensor:
    """Stock's ``_rank_data`` along the last dimension: 1-based ranks, ties given the mean of their ranks.

    Fixed shapes only, linear after one sort: a tie group starts where a sorted value differs from its predecessor
    (so every NaN starts its own group, as in stock's ``torch.unique``); the groups' sizes are counted into one slot
    per possible group and summed up, which gives each group's first and one-past-last positions; the tie's mean rank
    is ``(first + end + 1) / 2`` (1-based); one scatter back to the data's order. (Two binary searches of group ids
    instead took twice the host time at 1024 values; ``cummax``/``cummin`` of positions 1.6x stock's memory.)
    """
    values, order = data.sort(dim=-1)
    starts = torch.ones_like(values, dtype=torch.bool)  # where a tie group starts in sorted order
    starts[..., 1:] = values[..., 1:] != values[..., :-1]
    group = starts.cumsum(dim=-1)  # each sorted value's 1-based group
    sizes = torch.zeros((*values.shape[:-1], values.shape[-1] + 1), dtype=group.dtype, device=data.device)
    sizes.scatter_add_(-1, group, torch.ones((), dtype=group.dtype, device=data.device).expand_as(group))
    ends = sizes.cumsum_(dim=-1)  # ends[k]: one past group k's last position; ends[k - 1]: its first position
    doubled = ends.gather(-1, group)
    doubled += ends.gather(-1, group.sub_(1))
    doubled += 1  # twice the mean 1-based rank: an integer, so halving it rounds as stock's division
    rank_dtype = _rank_dtype(data)
    # in float32 the integer halved equals its exact half rounded (halving commutes with binary rounding)
    ranks = doubled / 2 if rank_dtype == torch.float32 else (doubled.double() / 2).to(rank_dtype)
    return torch.empty_like(ranks).scatter_(-1, order, ranks)


@replaces(f"{_MODULE}.SpearmanCorrCoef.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's ``compute``: the same value without host reads."""
    preds = dim_zero_cat(self.preds)
    target = dim_zero_cat(self.target)
    eps = 1e-6  # stock's default of ``_spearman_corrcoef_compute``
    # preds and target ranked in one call (rows of one tensor: half the kernels), each row a contiguous sequence
    if preds.ndim == 1:
        preds, target = rank_data(torch.stack((preds, target))).unbind(0)
    else:  # stock ranks each output's column and stacks them: a transposed (outputs, N) tensor, the same layout
        # contiguous rows: ``searchsorted`` copies (and warns about) non-contiguous sequences itself
        outputs = preds.shape[1]
        ranks = rank_data(torch.cat((preds.T, target.T)))
        preds, target = ranks[:outputs].T, ranks[outputs:].T
    preds_diff = preds - preds.mean(0)
    target_diff = target - target.mean(0)
    cov = (preds_diff * target_diff).mean(0)
    preds_std = torch.sqrt((preds_diff * preds_diff).mean(0))
    target_std = torch.sqrt((target_diff * target_diff).mean(0))
    corrcoef = cov / (preds_std * target_std + eps)
    return torch.clamp(corrcoef, -1.0, 1.0)
