"""Sync-free ``torchmetrics.image.scc``: SpatialCorrelationCoefficient (and ``spatial_correlation_coefficient``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_scc_per_channel_compute``: masked writes          ``masked_fill``: the same values, no data-dependent shapes
``var[var < 0] = 0``, ``den[den == 0] = 1``,
``scc[idx] = 0`` (four per channel)
``_scc_update``: the high-pass filter (a CPU tensor  made on the metric's device from its values, read on the
the metric keeps, not a state) copied to the         host where the filter lives (a CPU tensor: no device
device in every update                               read): one fill plus one per other entry (the default
                                                     filter: two), no copy
==================================================  ===========================================================

One implementation on every device, with stock's values to the bit: every written value is the one stock writes, and the
filter holds the same values in the preds' dtype. The metric's ``update`` and ``compute`` are stock's; they call these
helpers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchmetrics_syncfree import _instrumentation
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.image import made_on_device

_FUNCTIONAL = "torchmetrics.functional.image.scc"


def _filter_on(hp_filter: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``hp_filter.to(dtype=dtype, device=device)`` for a CPU filter and another device: made there, not copied."""
    with _instrumentation.quiet():  # the filter's values, read where they live (the host)
        values = hp_filter.to(dtype).reshape(-1).tolist()
    return made_on_device(values, hp_filter.shape, dtype, device)


@replaces(f"{_FUNCTIONAL}._scc_update", params=("preds", "target", "hp_filter", "window_size"), everywhere=True)
def _scc_update(preds: Tensor, target: Tensor, hp_filter: Tensor, window_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Stock's checks and conversions; a CPU filter is made on the preds' device instead of copied there."""
    moves = hp_filter.device.type == "cpu" and hp_filter.ndim == 2 and preds.device.type != "cpu"
    if not moves:
        return stock(f"{_FUNCTIONAL}._scc_update")(preds, target, hp_filter, window_size)
    # stock's checks and conversions, with an empty stand-in filter already on the device (nothing to copy)
    preds, target, _ = stock(f"{_FUNCTIONAL}._scc_update")(preds, target, preds.new_empty(0), window_size)
    return preds, target, _filter_on(hp_filter, preds.dtype, preds.device)[None, None, :]


@replaces(
    f"{_FUNCTIONAL}._scc_per_channel_compute", params=("preds", "target", "hp_filter", "window_size"), everywhere=True
)
def _scc_per_channel_compute(preds: Tensor, target: Tensor, hp_filter: Tensor, window_size: int) -> Tensor:
    """Stock's per-channel coefficients; the masked writes as ``masked_fill``."""
    from torchmetrics.functional.image.scc import _hp_2d_laplacian, _local_variance_covariance

    window = torch.ones(size=(1, 1, window_size, window_size), dtype=preds.dtype, device=preds.device) / (
        window_size**2
    )
    preds_hp = _hp_2d_laplacian(preds, hp_filter)
    target_hp = _hp_2d_laplacian(target, hp_filter)
    preds_var, target_var, target_preds_cov = _local_variance_covariance(preds_hp, target_hp, window)
    preds_var = preds_var.masked_fill(preds_var < 0, 0)
    target_var = target_var.masked_fill(target_var < 0, 0)
    den = torch.sqrt(target_var) * torch.sqrt(preds_var)
    idx = den == 0
    return (target_preds_cov / den.masked_fill(idx, 1)).masked_fill(idx, 0)
