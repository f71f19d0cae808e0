"""Sync-free ``torchmetrics.image``, one area per upstream module.

:mod:`~torchmetrics_syncfree.image.psnr` (area ``psnr``), :mod:`~torchmetrics_syncfree.image.psnrb` (``psnrb``),
:mod:`~torchmetrics_syncfree.image.ssim` (``ssim``), :mod:`~torchmetrics_syncfree.image.vif` (``vif``),
:mod:`~torchmetrics_syncfree.image.rase` (``rase``) and :mod:`~torchmetrics_syncfree.image.scc` (``scc``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def made_on_device(
    values: Sequence[float | int | bool], shape: Sequence[int], dtype: torch.dtype, device: Any
) -> Tensor:
    """A small constant tensor of host ``values`` (row-major), made on ``device`` with fills instead of a host copy.

    One fill of the most frequent value, then one per entry that differs (each value converted to ``dtype`` as
    ``torch.tensor(values, dtype=dtype)`` converts it).
    """
    values = list(values)
    base = max(set(values), key=values.count) if values else 0
    out = torch.full(tuple(shape), base, dtype=dtype, device=device)
    flat = out.view(-1)
    for i, value in enumerate(values):
        if value != base:
            flat[i].fill_(value)  # one fill kernel (a setitem makes a scalar tensor and copies it)
    return out
