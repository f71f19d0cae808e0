"""Sync-free ``torchmetrics.regression.concordance``: ConcordanceCorrCoef's ``compute`` (and so ``forward``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_concordance_corrcoef_compute`` calls stock's      the Pearson coefficient of the project's PearsonCorrCoef
``_pearson_corrcoef_compute``: ``if (var_x <         fix (:mod:`~torchmetrics_syncfree.regression.pearson`):
bound).any() ...: rank_zero_warn``, ``if             the warning filed as a deferred warning of the metric,
valid_mask.any(): corrcoef[valid_mask] = ...``       ``torch.where`` instead of the masks; then stock's formula
==================================================  ===========================================================

ConcordanceCorrCoef is a PearsonCorrCoef: its ``__init__`` (the warning's counters) and ``update`` are the patched
Pearson ones. Its own ``compute`` does not reach Pearson's, so it is replaced here, one implementation on every
device. The values are stock's to the bit (the same elementwise operations, stock's ``_final_aggregation`` for the
stacked states of several ranks), and the variance warning comes as for PearsonCorrCoef: at once where reads are free
(CPU), else at the metric's next eager point, once per offending ``compute``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree.regression.pearson import _coefficient, final_statistics

_MODULE = "torchmetrics.regression.concordance"


@replaces(f"{_MODULE}.ConcordanceCorrCoef.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's ``compute``: the same value without host reads."""
    mean_x, mean_y, max_x, max_y, var_x, var_y, corr_xy, nb = final_statistics(self)
    pearson = _coefficient(self, var_x, var_y, corr_xy, nb, max_x, max_y)
    # stock's ``_concordance_corrcoef_compute`` after its Pearson coefficient
    var_x = var_x / (nb - 1)
    var_y = var_y / (nb - 1)
    return 2.0 * pearson * var_x.sqrt() * var_y.sqrt() / (var_x + var_y + (mean_x - mean_y) ** 2)
