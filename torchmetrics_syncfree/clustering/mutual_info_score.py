"""Sync-free ``torchmetrics.functional.clustering.mutual_info_score``: MutualInfoScore's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        the occupied cells counted from sorted pair keys
sparse table; ``torch.nonzero(contingency)``         (:func:`~torchmetrics_syncfree.clustering.utils.label_pairs`):
                                                     ONE host read per call, of the cluster and cell counts
==================================================  ===========================================================

Where host reads are free (CPU) stock's function runs: one sort fewer than counting the pairs without a read, so
cheaper there (``utils.takes_stock``). On the device path the values are stock's to the bit (the same float32
operations on the same occupied cells, summed in the same order); empty inputs take stock's code.
"""

from __future__ import annotations

from torch import Tensor
from torchmetrics.functional.clustering.utils import check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import label_pairs, mutual_info, takes_stock

_FUNCTIONAL = "torchmetrics.functional.clustering.mutual_info_score"


@replaces(f"{_FUNCTIONAL}.mutual_info_score", params=("preds", "target"), everywhere=True)
def mutual_info_score(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's mutual information with one host read."""
    if takes_stock(preds):
        return stock(f"{_FUNCTIONAL}.mutual_info_score")(preds, target)
    check_cluster_labels(preds, target)
    return mutual_info(label_pairs(preds, target))
