"""Sync-free ``torchmetrics.functional.clustering.fowlkes_mallows_index``: FowlkesMallowsIndex's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        sums over the occupied cells and the cluster sizes
sparse table                                         (:func:`~torchmetrics_syncfree.clustering.utils.label_pairs`):
                                                     ONE host read per call
``if torch.allclose(tk, tensor(0))`` (a CPU          ``torch.where(tk == 0, ...)`` (``tk`` is an int64 count:
tensor compared with the device's)                   ``allclose`` is equality)
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
from torchmetrics_syncfree.clustering.utils import label_pairs, takes_stock

_FUNCTIONAL = "torchmetrics.functional.clustering.fowlkes_mallows_index"


@replaces(f"{_FUNCTIONAL}.fowlkes_mallows_index", params=("preds", "target"), everywhere=True)
def fowlkes_mallows_index(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's Fowlkes-Mallows index with one host read."""
    if takes_stock(preds):
        return stock(f"{_FUNCTIONAL}.fowlkes_mallows_index")(preds, target)
    check_cluster_labels(preds, target)
    pairs = label_pairs(preds, target)
    n = preds.size(0)
    tk = torch.sum(pairs.cells**2) - n
    pk = torch.sum(pairs.preds_counts**2) - n
    qk = torch.sum(pairs.target_counts**2) - n
    return torch.where(tk == 0, torch.zeros((), device=tk.device), torch.sqrt(tk / pk) * torch.sqrt(tk / qk))
