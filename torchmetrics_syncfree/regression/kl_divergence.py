"""Sync-free ``torchmetrics.regression.kl_divergence``: KLDivergence's update (and the functional ``kl_divergence``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``_safe_xlogy``: ``res[x == 0] = 0.0``               ``masked_fill(x == 0, 0.0)``: the same values, no boolean-
(boolean-mask write)                                 mask indexing
==================================================  ===========================================================

Replaced is the update's ``_kld_update`` (every TorchMetrics module's reference to it: the metric's update and the
functional ``kl_divergence``); where host reads are free (CPU) it is stock's. On the device path the values are
stock's to the bit (the same elementwise operations and sums). ``compute`` reads nothing (``log_prob``, every
``reduction``) and stays stock's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.regression.kl_divergence"


@replaces(f"{_FUNCTIONAL}._kld_update", params=("p", "q", "log_prob"), everywhere=True)
def _kld_update(p: Tensor, q: Tensor, log_prob: bool) -> tuple[Tensor, int]:
    """Stock's ``_kld_update`` where reads are free; otherwise the same values without a boolean-mask write."""
    if _deferred.reads_are_free(p):
        return stock(f"{_FUNCTIONAL}._kld_update")(p, q, log_prob)
    _check_same_shape(p, q)
    if p.ndim != 2 or q.ndim != 2:
        raise ValueError(f"Expected both p and q distribution to be 2D but got {p.ndim} and {q.ndim} respectively")
    total = p.shape[0]
    if log_prob:
        measures = torch.sum(p.exp() * (p - q), dim=-1)
    else:
        p = p / p.sum(dim=-1, keepdim=True)
        q = q / q.sum(dim=-1, keepdim=True)
        # stock's ``_safe_xlogy(p, p / q)``: x * log(y), 0 where x == 0
        measures = (p * torch.log(p / q)).masked_fill(p == 0, 0.0).sum(dim=-1)
    return measures, total
