"""Sync-free ``torchmetrics.image.rase``: RelativeAverageSpectralError (its ``compute``, and so its ``forward``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``relative_average_spectral_error``: the image       ``torch.zeros((), device=...)``: the same float32 zero,
count starts as ``torch.tensor(0.0, device=...)``,   made on the device
a host-to-device copy in every ``compute`` (the
metric's) and call (the functional)
==================================================  ===========================================================

The metric's ``update`` (appending the batches) and ``compute`` are stock's; ``compute`` calls the functional.
One implementation on every device, with stock's values to the bit (the same zero, the same arithmetic).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.image.rase import _rase_compute, _rase_update

from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.image.rase"


@replaces(f"{_FUNCTIONAL}.relative_average_spectral_error", params=("preds", "target", "window_size"), everywhere=True)
def relative_average_spectral_error(preds: Tensor, target: Tensor, window_size: int = 8) -> Tensor:
    """Stock's RASE; the image count starts from a zero made on the device."""
    if not isinstance(window_size, int) or window_size < 1:
        return stock(f"{_FUNCTIONAL}.relative_average_spectral_error")(preds, target, window_size)
    img_shape = target.shape[1:]
    rmse_map = torch.zeros(img_shape, dtype=target.dtype, device=target.device)
    target_sum = torch.zeros(img_shape, dtype=target.dtype, device=target.device)
    total_images = torch.zeros((), device=target.device)
    rmse_map, target_sum, total_images = _rase_update(preds, target, window_size, rmse_map, target_sum, total_images)
    return _rase_compute(rmse_map, target_sum, total_images, window_size)
