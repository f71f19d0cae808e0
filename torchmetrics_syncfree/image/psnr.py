"""Sync-free ``torchmetrics.image.psnr``: PeakSignalNoiseRatio (and the helpers of ``peak_signal_noise_ratio``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_psnr_update``: ``tensor(target.numel(),           ``torch.full((), numel, device=...)``: a kernel argument,
device=...)``; with ``dim``: ``tensor(target.size(), no copy (the count is known on the host), expanded as
device=...)[dim_list].prod()``                       stock's
``_psnr_compute``: ``10 / torch.log(tensor(base))``  the same float32 factor, computed once per ``base`` on the
                                                     host and applied as a Python number
==================================================  ===========================================================

The metric's ``update`` and ``compute`` are stock's; they call these helpers, one implementation on every device. The
values are stock's to the bit: the counts are the same integers, and stock's CPU 0-dim factor enters a device
computation as a scalar, exactly as the Python number does. Every version's ``data_range`` (``None`` on 1.6, whose
min/max states need no host read; a number; a ``(min, max)`` tuple that clamps) goes through the same helpers. The
functional ``peak_signal_noise_ratio`` builds its ``data_range`` as a CPU tensor (no device copy) and is left as
stock's.

"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities import reduce

from torchmetrics_syncfree import _instrumentation
from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.image.psnr"


@functools.cache
def _log_factor(base: float) -> float:
    """Stock's ``10 / torch.log(tensor(base))`` (a float32 CPU value) as a Python number."""
    with _instrumentation.quiet():  # a CPU tensor that never leaves the host
        return float(10 / torch.log(torch.tensor(base)))


def _count(target: Tensor, count: int) -> Tensor:
    return torch.full((), count, dtype=torch.int64, device=target.device)


@replaces(f"{_FUNCTIONAL}._psnr_update", params=("preds", "target", "dim"), everywhere=True)
def _psnr_update(preds: Tensor, target: Tensor, dim: int | tuple[int, ...] | None = None) -> tuple[Tensor, Tensor]:
    """Stock's sums; the numbers of observations are made on the device (``torch.full``), not copied there."""
    if not preds.is_floating_point():
        preds = preds.to(torch.float32)
    if not target.is_floating_point():
        target = target.to(torch.float32)
    if dim is None:
        return torch.sum(torch.pow(preds - target, 2)), _count(target, target.numel())
    diff = preds - target
    sum_squared_error = torch.sum(diff * diff, dim=dim)
    dim_list = [dim] if isinstance(dim, int) else list(dim)
    if not dim_list:
        return sum_squared_error, _count(target, target.numel())
    # stock indexes ``tensor(target.size())`` with the dims: negative dims count from the end there too; a list, as
    # torch.compile cannot trace ``math.prod`` of a generator (fullgraph fails)
    num_obs = _count(target, math.prod([target.shape[d] for d in dim_list]))
    return sum_squared_error, num_obs.expand_as(sum_squared_error)


@replaces(
    f"{_FUNCTIONAL}._psnr_compute",
    params=("sum_squared_error", "num_obs", "data_range", "base", "reduction"),
    everywhere=True,
)
def _psnr_compute(
    sum_squared_error: Tensor,
    num_obs: Tensor,
    data_range: Tensor,
    base: float = 10.0,
    reduction: Any = "elementwise_mean",
) -> Tensor:
    """Stock's formula; the logarithm's base enters as a Python number, not a tensor made on every call."""
    if not isinstance(base, (int, float)):
        return stock(f"{_FUNCTIONAL}._psnr_compute")(sum_squared_error, num_obs, data_range, base, reduction)
    psnr_base_e = 2 * torch.log(data_range) - torch.log(sum_squared_error / num_obs)
    return reduce(psnr_base_e * _log_factor(base), reduction=reduction)
