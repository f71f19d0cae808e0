"""Sync-free ``torchmetrics.functional.clustering.fowlkes_mallows_index``: FowlkesMallowsIndex's compute (and forward).

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
contingency by ``torch.unique`` (twice) and a        the squared sizes of the cells and clusters, counted in
sparse table                                         tables of one slot per sample
                                                     (:func:`~torchmetrics_syncfree.clustering.utils.pair_tables`):
                                                     no host read
``if torch.allclose(tk, tensor(0))`` (a CPU          ``torch.where(tk == 0, ...)`` (``tk`` is an int64 count:
tensor compared with the device's)                   ``allclose`` is equality)
==================================================  ===========================================================

One implementation on every device, without a host read: stock's values to the bit (exact int64 sums, the same
arithmetic); empty inputs take stock's code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import pair_tables, squared_sums, stock_rejects

_FUNCTIONAL = "torchmetrics.functional.clustering.fowlkes_mallows_index"


@replaces(f"{_FUNCTIONAL}.fowlkes_mallows_index", params=("preds", "target"), everywhere=True)
def fowlkes_mallows_index(preds: Tensor, target: Tensor) -> Tensor:
    """Stock's Fowlkes-Mallows index without a host read."""
    if stock_rejects(preds):
        return stock(f"{_FUNCTIONAL}.fowlkes_mallows_index")(preds, target)
    check_cluster_labels(preds, target)
    tk, qk, pk = squared_sums(pair_tables(preds, target)).sub_(preds.size(0)).unbind()
    return torch.where(tk == 0, torch.zeros((), device=tk.device), torch.sqrt(tk / pk) * torch.sqrt(tk / qk))
