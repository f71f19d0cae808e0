"""Sync-free ``torchmetrics.regression.kendall``: KendallRankCorrCoef's ``compute`` (and so ``forward``'s value).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``torch.tensor(preds.shape[0], device=...)``: a      ``torch.full``: the same int64 0-dim count, filled on the
host-to-device copy of the count                     device
``_get_ties`` (variants b, c): per output            one fixed-size count of the dense ranks (the values of the
``_bincount`` (``len(torch.unique(x))`` for its      sorted column, ``0 .. n-1``) by ``scatter_add_`` into ``n``
length, ``bincount``) and ``n_ties[n_ties > 1]``     slots; the tie statistics summed over every slot (groups of
(boolean mask)                                       0 or 1 add 0, as stock's mask drops them)
variant c: ``torch.tensor([len(p.unique()) for p     the number of distinct values of a column: the dense rank
in preds.T])`` (one read per output)                 of its largest value plus one
``t_test``: ``Normal(torch.tensor([0.0]).to(t),      the standard normal CDF ``0.5 * (1 + erf(t / sqrt(2)))``
...).cdf(t)`` (host copies, the distribution's       (stock's formula with its loc 0 and scale 1), the NaNs put
argument checks) and ``p.where(~nan, torch.tensor    back with ``masked_fill``
(nan, device=...))``
==================================================  ===========================================================

The update reads nothing (shape checks, list appends) and stays stock's. Replaced are the functional helpers
``_get_metric_metadata``, ``_get_ties``, ``_calculate_tau`` and ``_get_p_value_for_t_value_from_dist`` (so the
functional ``kendall_rank_corrcoef`` is sync-free too), one implementation on every device. The sort and
the pair counting (``_sort_on_first_sequence``, ``_count_concordant_pairs``, ``_count_discordant_pairs``,
``_convert_sequence_to_dense_rank``) read nothing and stay stock's.

Tau (every variant) is stock's to the bit: the pair counts and ties are integers. Documented
deviations: the p-value's tie statistics (``ties_p1``, ``ties_p2``) are float32 sums as in stock, but over every
slot instead of the tie groups alone: where a tie group has more than about 250 members its terms are no longer
exact in float32 and the other summation order may change the last bits of the p-value (relative 1e-6). With NaN
values, variant c counts every NaN as a distinct value (NaN compares unequal, as in stock's own dense ranks);
stock's ``torch.unique`` may group them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.regression.log_cosh import count_of

_FUNCTIONAL = "torchmetrics.functional.regression.kendall"


@replaces(f"{_FUNCTIONAL}._get_ties", params=("x",))
def _get_ties(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stock's tie statistics of the sorted dense ranks ``x`` (``n x outputs``), counted in ``n`` fixed slots."""
    # dense ranks of a sorted column are 0 .. groups-1 < n: a bincount with n slots per output, no data-sized length
    n_ties = torch.zeros_like(x).scatter_add_(0, x, torch.ones_like(x))
    # groups of 0 or 1 add 0 to each statistic (stock drops them with ``n_ties[n_ties > 1]``)
    ties = (n_ties * (n_ties - 1) // 2).sum(0)
    ties_p1 = (n_ties * (n_ties - 1.0) * (n_ties - 2)).sum(0)
    ties_p2 = (n_ties * (n_ties - 1.0) * (2 * n_ties + 5)).sum(0)
    # stock writes each output's sums into zeros of ``x``'s dtype
    return ties.to(x.dtype), ties_p1.to(x.dtype), ties_p2.to(x.dtype)


@replaces(f"{_FUNCTIONAL}._get_metric_metadata", params=("preds", "target", "variant"))
def _get_metric_metadata(preds: Tensor, target: Tensor, variant: Any) -> tuple[Any, ...]:
    """Stock's ``_get_metric_metadata`` with the count filled instead of copied."""
    from torchmetrics.functional.regression import kendall

    preds, target = kendall._sort_on_first_sequence(preds, target)
    concordant_pairs = kendall._count_concordant_pairs(preds, target)
    discordant_pairs = kendall._count_discordant_pairs(preds, target)
    n_total = count_of(preds.shape[0], preds)
    preds_ties = target_ties = None
    preds_ties_p1 = preds_ties_p2 = target_ties_p1 = target_ties_p2 = None
    if variant != kendall._MetricVariant.A:
        preds = kendall._convert_sequence_to_dense_rank(preds)
        target = kendall._convert_sequence_to_dense_rank(target, sort=True)
        preds_ties, preds_ties_p1, preds_ties_p2 = _get_ties(preds)
        target_ties, target_ties_p1, target_ties_p2 = _get_ties(target)
    return (
        concordant_pairs,
        discordant_pairs,
        preds_ties,
        preds_ties_p1,
        preds_ties_p2,
        target_ties,
        target_ties_p1,
        target_ties_p2,
        n_total,
    )


def _distinct(x: Tensor) -> Tensor:
    """The number of distinct values of each column of ``x`` (``n x outputs``), in ``x``'s dtype, without ``unique``."""
    values = x.sort(dim=0).values
    changes = (values[1:] != values[:-1]).sum(0)
    return (changes + 1).to(x.dtype)


@replaces(
    f"{_FUNCTIONAL}._calculate_tau",
    params=(
        "preds",
        "target",
        "concordant_pairs",
        "discordant_pairs",
        "con_min_dis_pairs",
        "n_total",
        "preds_ties",
        "target_ties",
        "variant",
    ),
)
def _calculate_tau(
    preds: Tensor,
    target: Tensor,
    concordant_pairs: Tensor,
    discordant_pairs: Tensor,
    con_min_dis_pairs: Tensor,
    n_total: Tensor,
    preds_ties: Tensor | None,
    target_ties: Tensor | None,
    variant: Any,
) -> Tensor:
    """Stock's ``_calculate_tau``; variant c counts the distinct values without ``unique``."""
    from torchmetrics.functional.regression.kendall import _MetricVariant

    args = (preds, target, concordant_pairs, discordant_pairs, con_min_dis_pairs, n_total, preds_ties, target_ties)
    if variant != _MetricVariant.C:  # a and b read nothing
        return stock(f"{_FUNCTIONAL}._calculate_tau")(*args, variant)
    min_classes = torch.minimum(_distinct(preds), _distinct(target))
    return 2 * con_min_dis_pairs / ((min_classes - 1) / min_classes * n_total**2)


@replaces(f"{_FUNCTIONAL}._get_p_value_for_t_value_from_dist", params=("t_value",))
def _get_p_value_for_t_value_from_dist(t_value: Tensor) -> Tensor:
    """Stock's standard normal CDF of ``t_value`` (NaN stays NaN) without host copies or argument checks."""
    is_nan = t_value.isnan()
    # ``Normal(0, 1).cdf``: ``0.5 * (1 + erf((value - loc) * scale.reciprocal() / sqrt(2)))``; loc and scale are
    # one-element tensors of ``t_value``'s dtype, so the result has at least one dimension
    value = t_value.nan_to_num().reshape(t_value.shape or (1,))
    p_value = 0.5 * (1 + torch.erf(value / math.sqrt(2)))
    return p_value.masked_fill(is_nan.reshape(p_value.shape), float("nan"))
