"""Sync-free ``torchmetrics.regression.explained_variance``: ExplainedVariance's ``compute`` (and ``forward``'s).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``output_scores[valid_score] = 1.0 - num / den``     ``torch.where`` (the same elementwise operations)
(boolean-mask read and write),
``output_scores[num != 0 & den == 0] = 0.0``
==================================================  ===========================================================

The update reads nothing and stays stock's. ``compute`` has one implementation on every device, with stock's values to
the bit (the same elementwise operations and reductions).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree._registry import replaces

_MODULE = "torchmetrics.regression.explained_variance"


@replaces(f"{_MODULE}.ExplainedVariance.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's ``compute``: the same value without host reads."""
    num_obs = self.num_obs
    diff_avg = self.sum_error / num_obs
    numerator = self.sum_squared_error / num_obs - (diff_avg * diff_avg)
    target_avg = self.sum_target / num_obs
    denominator = self.sum_squared_target / num_obs - (target_avg * target_avg)
    nonzero_numerator = numerator != 0
    nonzero_denominator = denominator != 0
    valid_score = nonzero_numerator & nonzero_denominator
    # the division only where it is kept (a denominator of 1 elsewhere: no inf/nan, so no nan gradients either)
    safe_denominator = torch.where(valid_score, denominator, torch.ones_like(denominator))
    output_scores = torch.where(valid_score, 1.0 - numerator / safe_denominator, torch.ones_like(diff_avg))
    output_scores = output_scores.masked_fill(nonzero_numerator & ~nonzero_denominator, 0.0)
    if self.multioutput == "raw_values":
        return output_scores
    if self.multioutput == "uniform_average":
        return torch.mean(output_scores)
    denom_sum = torch.sum(denominator)
    return torch.sum(denominator / denom_sum * output_scores)
