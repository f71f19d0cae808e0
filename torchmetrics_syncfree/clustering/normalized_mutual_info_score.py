"""Sync-free ``torchmetrics.functional.clustering.normalized_mutual_info_score``: NormalizedMutualInfoScore.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
contingency and two entropies by ``torch.unique``,   one count of both clusterings
``bincount``, ``nonzero``, boolean masks             (:func:`~torchmetrics_syncfree.clustering.utils.label_pairs`):
                                                     ONE host read per call
``if torch.allclose(mutual_info, 0)``,               ``torch.where``; the mean of the two entropies without the
``is_nonnegative`` check of the generalized mean     check, which entropies cannot fail
==================================================  ===========================================================

One implementation on every device (on a CPU 0.75-0.95x stock's time, 32 to 10000 samples: both entropies come from
the one count). The values are stock's to the bit (the same float32 operations on the same values); empty inputs take
stock's code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.clustering.utils import _validate_average_method_arg, check_cluster_labels

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.clustering.utils import (
    entropy_of_counts,
    label_pairs,
    mutual_info,
    power_mean,
    stock_rejects,
)

_FUNCTIONAL = "torchmetrics.functional.clustering.normalized_mutual_info_score"


@replaces(f"{_FUNCTIONAL}.normalized_mutual_info_score", params=("preds", "target", "average_method"), everywhere=True)
def normalized_mutual_info_score(preds: Tensor, target: Tensor, average_method: str = "arithmetic") -> Tensor:
    """Stock's normalized mutual information with one host read."""
    if stock_rejects(preds):
        return stock(f"{_FUNCTIONAL}.normalized_mutual_info_score")(preds, target, average_method)
    check_cluster_labels(preds, target)
    _validate_average_method_arg(average_method)
    pairs = label_pairs(preds, target)
    mi = mutual_info(pairs)
    entropies = torch.stack([entropy_of_counts(pairs.preds_counts), entropy_of_counts(pairs.target_counts)])
    # stock: ``torch.allclose(mutual_info, torch.tensor(0.0), atol=torch.finfo().eps)`` returns it unchanged
    return torch.where(mi.abs() <= torch.finfo().eps, mi, mi / power_mean(entropies, average_method))
