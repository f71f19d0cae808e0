"""Sync-free ``torchmetrics.functional.clustering.rand_score``: RandScore's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        the pair confusion matrix from the squared sizes of the
sparse table                                         cells and clusters, counted in tables of one slot per sample
                                                     (:func:`~torchmetrics_syncfree.clustering.utils.pair_tables`):
                                                     no host read
``if numerator == denominator or denominator == 0``  ``torch.where``
==================================================  ===========================================================

One implementation on every device, without a host read: stock's values to the bit (exact int64 sums, the same
division); empty inputs take stock's code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import pair_confusion, pair_tables, stock_rejects

_FUNCTIONAL = "torchmetrics.functional.clustering.rand_score"


@replaces(f"{_FUNCTIONAL}.rand_score", params=("preds", "target"), everywhere=True)
def rand_score(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's Rand score without a host read."""
    if stock_rejects(preds):
        return stock(f"{_FUNCTIONAL}.rand_score")(preds, target)
    check_cluster_labels(preds, target)
    pair_matrix = pair_confusion(pair_tables(preds, target))
    numerator = pair_matrix.diagonal().sum()
    denominator = pair_matrix.sum()
    # stock's limit cases (no split, or every sample its own cluster) score 1.0
    perfect = (numerator == denominator) | (denominator == 0)
    return torch.where(perfect, torch.ones_like(numerator, dtype=torch.float32), numerator / denominator)
