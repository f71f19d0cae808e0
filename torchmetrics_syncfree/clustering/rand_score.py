"""Sync-free ``torchmetrics.functional.clustering.rand_score``: RandScore's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        the pair confusion matrix from the occupied cells
sparse table                                         (:func:`~torchmetrics_syncfree.clustering.utils.label_pairs`):
                                                     ONE host read per call
``if numerator == denominator or denominator == 0``  ``torch.where``
==================================================  ===========================================================

Where host reads are free (CPU) stock's function runs: one sort fewer than counting the pairs without a read, so
cheaper there (``utils.takes_stock``). On the device path the values are stock's to the bit (exact int64 sums, the
same division); empty inputs take stock's code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import label_pairs, pair_confusion, takes_stock

_FUNCTIONAL = "torchmetrics.functional.clustering.rand_score"


@replaces(f"{_FUNCTIONAL}.rand_score", params=("preds", "target"), everywhere=True)
def rand_score(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's Rand score with one host read."""
    if takes_stock(preds):
        return stock(f"{_FUNCTIONAL}.rand_score")(preds, target)
    check_cluster_labels(preds, target)
    pair_matrix = pair_confusion(label_pairs(preds, target))
    numerator = pair_matrix.diagonal().sum()
    denominator = pair_matrix.sum()
    # stock's limit cases (no split, or every sample its own cluster) score 1.0
    perfect = (numerator == denominator) | (denominator == 0)
    return torch.where(perfect, torch.ones_like(numerator, dtype=torch.float32), numerator / denominator)
