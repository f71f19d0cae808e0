"""Sync-free ``torchmetrics.functional.clustering.adjusted_rand_score``: AdjustedRandScore's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        the pair confusion matrix from the occupied cells
sparse table                                         (:func:`~torchmetrics_syncfree.clustering.utils.label_pairs`):
                                                     ONE host read per call
``if fn == 0 and fp == 0``                           ``torch.where``
==================================================  ===========================================================

Where host reads are free (CPU) stock's function runs: one sort fewer than counting the pairs without a read, so
cheaper there (``utils.takes_stock``). On the device path the values are stock's to the bit (exact int64 sums, the
same arithmetic); empty inputs take stock's code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import label_pairs, pair_confusion, takes_stock

_FUNCTIONAL = "torchmetrics.functional.clustering.adjusted_rand_score"


@replaces(f"{_FUNCTIONAL}.adjusted_rand_score", params=("preds", "target"), everywhere=True)
def adjusted_rand_score(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's adjusted Rand score with one host read."""
    if takes_stock(preds):
        return stock(f"{_FUNCTIONAL}.adjusted_rand_score")(preds, target)
    check_cluster_labels(preds, target)
    (tn, fp), (fn, tp) = pair_confusion(label_pairs(preds, target))
    score = 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))
    return torch.where((fn == 0) & (fp == 0), torch.ones_like(tn, dtype=torch.float32), score)
