"""Sync-free ``torchmetrics.regression.log_cosh``: LogCoshError's update (and the functional ``log_cosh_error``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``torch.tensor(target.shape[0], device=...)``: a     the metric adds the count to its state as a number (one
host-to-device copy of the batch's count             launch, the copy's saved); the functional's count by
                                                     ``torch.full`` (one launch, as the copy)
==================================================  ===========================================================

Replaced are the metric's ``update`` and ``_log_cosh_error_update`` (every TorchMetrics module's reference to it:
the functional ``log_cosh_error``), one implementation on every device. The sum is stock's expression, so the values
are stock's to the bit. ``compute`` reads nothing (a division) and stays stock's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.regression.utils import _check_data_shape_to_num_outputs
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree._registry import replaces

_FUNCTIONAL = "torchmetrics.functional.regression.log_cosh"
_MODULE = "torchmetrics.regression.log_cosh"


def count_of(size: int, like: Tensor) -> Tensor:
    """The int64 0-dim ``size`` on ``like``'s device: stock's ``torch.tensor(size, device=...)`` without the copy."""
    return torch.full((), size, dtype=torch.int64, device=like.device)


def _sum(preds: Tensor, target: Tensor, num_outputs: int) -> Tensor:
    """Stock's checks and summed LogCosh error of ``_log_cosh_error_update``."""
    _check_same_shape(preds, target)
    _check_data_shape_to_num_outputs(preds, target, num_outputs)
    if preds.ndim != 2:  # stock's ``_unsqueeze_tensors``
        preds, target = preds.unsqueeze(1), target.unsqueeze(1)
    diff = preds - target
    return torch.log((torch.exp(diff) + torch.exp(-diff)) / 2).sum(0).squeeze()


@replaces(f"{_FUNCTIONAL}._log_cosh_error_update", params=("preds", "target", "num_outputs"), everywhere=True)
def _log_cosh_error_update(preds: Tensor, target: Tensor, num_outputs: int) -> tuple[Tensor, Tensor]:
    """Stock's ``_log_cosh_error_update``: the same values, the count filled instead of copied."""
    return _sum(preds, target, num_outputs), count_of(target.shape[0], preds)


@replaces(f"{_MODULE}.LogCoshError.update", params=("self", "preds", "target"), kind="metric_method")
def _update(self: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's update with the count added as a number (no tensor made for it)."""
    self.sum_log_cosh_error += _sum(preds, target, self.num_outputs)
    self.total += target.shape[0]
