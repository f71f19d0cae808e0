"""Sync-free ``torchmetrics.regression.kl_divergence``: KLDivergence's update (and the functional ``kl_divergence``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_safe_xlogy``: ``res[x == 0] = 0.0``               ``masked_fill(x == 0, 0.0)``: the same values and gradient,
(boolean-mask write)                                 no boolean-mask indexing
==================================================  ===========================================================

Replaced is ``torchmetrics.utilities.compute._safe_xlogy`` (every TorchMetrics module's reference to it: the update's
``_kld_update``, which reads nothing else, and the Poisson deviance of TweedieDevianceScore), one implementation on
every device. The values are stock's to the bit (the same elementwise operations and sums). ``compute`` reads
nothing (``log_prob``, every ``reduction``) and stays stock's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_syncfree._registry import replaces

_COMPUTE = "torchmetrics.utilities.compute"


@replaces(f"{_COMPUTE}._safe_xlogy", params=("x", "y"), everywhere=True)
def _safe_xlogy(x: Tensor, y: Tensor) -> Tensor:
    """Stock's ``x * log(y)``, 0 where ``x == 0``, with ``masked_fill_`` instead of a boolean-mask write.

    In place on the new product, as stock's write: no tensor more than stock allocates (the product's backward needs
    its inputs, not the product).
    """
    return (x * torch.log(y)).masked_fill_(x == 0, 0.0)
