"""Sync-free ``torchmetrics.text.perplexity``: Perplexity (and the functional ``perplexity``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``torch.tensor(0, device=...)`` to replace           ``masked_fill(ignored, 0)``: no host-to-device copy
ignored targets
``probs[torch.arange(n), target]``: a CPU index      the same integer indexing with the ``arange`` made on the
copied to the device                                 device (negative targets wrap and bad ones fail as in stock)
``[mask]`` (boolean mask) and ``mask.sum()``         ignored entries' probabilities set to 1 (log 0) and summed
                                                     with the others; the count is the mask's sum (or the known
                                                     ``numel`` without ``ignore_index``)
==================================================  ===========================================================

The input checks (``_check_shape_and_type_consistency``: ranks, shapes and dtypes) read host information only and raise
at once, as stock. The update has one implementation on every device. Without ``ignore_index`` the sum is over the same
values in the same order: stock's to the bit. With ``ignore_index`` it runs over every position, the ignored ones adding
0: the float sum may differ from stock's (over the kept entries only) in the last bits (relative 1e-6 in float32), as
any change of summation order. The gradient through ignored positions is 0, as in stock.

"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.text.perplexity import _check_shape_and_type_consistency

from torchmetrics_syncfree._registry import replaces

_FUNCTIONAL = "torchmetrics.functional.text.perplexity"


@replaces(f"{_FUNCTIONAL}._perplexity_update", params=("preds", "target", "ignore_index"), everywhere=True)
def _perplexity_update(preds: Tensor, target: Tensor, ignore_index: int | None = None) -> tuple[Tensor, Tensor]:
    """Stock's statistics with fixed shapes: ignored positions add 0 instead of being selected away."""
    _check_shape_and_type_consistency(preds, target)
    probs = torch.nn.functional.softmax(preds.reshape(-1, preds.shape[-1]), dim=1)
    target = target.reshape(-1)
    positions = torch.arange(target.numel(), device=target.device)
    if ignore_index is None:
        probs = probs[positions, target]
        return -probs.log().sum(), torch.full((), target.numel(), dtype=torch.int64, device=target.device)
    kept = target != ignore_index
    probs = probs[positions, target.masked_fill(~kept, 0)]
    return -probs.masked_fill(~kept, 1).log().sum(), kept.sum()
