"""Sync-free ``torchmetrics.functional.clustering.adjusted_rand_score``: AdjustedRandScore's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        the pair confusion matrix from the squared sizes of the
sparse table                                         cells and clusters, counted in tables of one slot per sample
                                                     (:func:`~torchmetrics_syncfree.clustering.utils.pair_tables`):
                                                     no host read
``if fn == 0 and fp == 0``                           ``torch.where``
==================================================  ===========================================================

One implementation on every device, without a host read: stock's values to the bit (exact int64 sums, the same
arithmetic); empty inputs take stock's code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import pair_confusion, pair_tables, stock_rejects

_FUNCTIONAL = "torchmetrics.functional.clustering.adjusted_rand_score"


@replaces(f"{_FUNCTIONAL}.adjusted_rand_score", params=("preds", "target"), everywhere=True)
def adjusted_rand_score(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's adjusted Rand score without a host read."""
    if stock_rejects(preds):
        return stock(f"{_FUNCTIONAL}.adjusted_rand_score")(preds, target)
    check_cluster_labels(preds, target)
    (tn, fp), (fn, tp) = pair_confusion(pair_tables(preds, target))
    score = 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))
    return torch.where((fn == 0) & (fp == 0), torch.ones_like(tn, dtype=torch.float32), score)
