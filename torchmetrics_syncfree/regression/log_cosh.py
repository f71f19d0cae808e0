"""Sync-free ``torchmetrics.regression.log_cosh``: LogCoshError's update (and the functional ``log_cosh_error``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``torch.tensor(target.shape[0], device=...)``: a     ``torch.full((), target.shape[0], ...)``: the same int64
host-to-device copy of the batch's count             0-dim count, filled on the device (one launch, as the copy)
==================================================  ===========================================================

Replaced is ``_log_cosh_error_update`` (every TorchMetrics module's reference to it: the metric's update and the
functional ``log_cosh_error``); where host reads are free (CPU) it is stock's. On the device path the sum is stock's
expression, so the values are stock's to the bit. ``compute`` reads nothing (a division) and stays stock's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.regression.utils import _check_data_shape_to_num_outputs
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.regression.log_cosh"


def count_of(size: int, like: Tensor) -> Tensor:
    """The int64 0-dim ``size`` on ``like``'s device: stock's ``torch.tensor(size, device=...)`` without the copy."""
    return torch.full((), size, dtype=torch.int64, device=like.device)


@replaces(f"{_FUNCTIONAL}._log_cosh_error_update", params=("preds", "target", "num_outputs"), everywhere=True)
def _log_cosh_error_update(preds: Tensor, target: Tensor, num_outputs: int) -> tuple[Tensor, Tensor]:
    """Stock's ``_log_cosh_error_update`` where reads are free; otherwise the same values, the count filled."""
    if _deferred.reads_are_free(preds):
        return stock(f"{_FUNCTIONAL}._log_cosh_error_update")(preds, target, num_outputs)
    _check_same_shape(preds, target)
    _check_data_shape_to_num_outputs(preds, target, num_outputs)
    if preds.ndim != 2:  # stock's ``_unsqueeze_tensors``
        preds, target = preds.unsqueeze(1), target.unsqueeze(1)
    diff = preds - target
    sum_log_cosh_error = torch.log((torch.exp(diff) + torch.exp(-diff)) / 2).sum(0).squeeze()
    return sum_log_cosh_error, count_of(target.shape[0], preds)
