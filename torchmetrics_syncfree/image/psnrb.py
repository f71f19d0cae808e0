"""Sync-free ``torchmetrics.image.psnrb``: PeakSignalNoiseRatioWithBlockedEffect (its functional helpers).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_compute_bef``: the block borders' columns and     the same columns as strided views of the image (the
rows as CPU index tensors (``torch.tensor(range)``,  borders) and as one copy of the blocks without their last
``set(h.tolist())``), copied to the device to index  column or row (the rest): no index tensor, no copy; the
the image                                            differences, in stock's order and layout
``t = ... if d_b > d_bc else 0``: a host read        ``torch.where(d_b > d_bc, diff * t, diff * 0)``
``_psnrb_update``: ``tensor(target.numel(),          ``torch.full((), numel, device=...)``
device=...)``
``_psnrb_compute`` (1.6, 1.7): ``if data_range >     ``torch.where`` of stock's two formulas
2``
==================================================  ===========================================================

On 1.6 and 1.7 the range is a state (the targets' largest range, float64 for float64 images) and stock's result
takes the dtype of the formula it picks: under 2, the float32 states'; over 2, the range's: a dtype that depends on the
data. Here that compute gives the two formulas' common dtype (float64 there) both ways on every device, with stock's
values (documented deviation, pinned by a test).

A block size of 1, or one not smaller than the image's height and width, leaves one of stock's index lists empty:
stock fails there (``IndexError``: an empty list becomes a float tensor). Those calls go to stock's function and fail
as it does.

``_compute_bef``, ``_psnrb_update`` and ``_psnrb_compute`` have one implementation on every device.
``_compute_bef`` and ``_psnrb_update`` give stock's values to the bit: every difference is the same subtraction, the
squared differences sum over a contiguous tensor of stock's shape and order, and the ``if`` becomes a selection
between the same products (``0 * diff`` keeps stock's ``-0.0`` and NaN). The metric's ``update`` and ``compute`` are
stock's; they call these helpers.
"""

from __future__ import annotations

import math
import operator

import torch
from lightning_utilities.core.imports import compare_version
from torch import Tensor

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.image.psnr import _count

_FUNCTIONAL = "torchmetrics.functional.image.psnrb"
#: 1.6 and 1.7 choose the formula of ``_psnrb_compute`` with ``if data_range > 2``
_RANGE_BRANCH = compare_version("torchmetrics", operator.lt, "1.8.0")


def _border_sum(x: Tensor, dim: int, block_size: int) -> tuple[Tensor, Tensor]:
    """Stock's squared differences across the block borders and inside the blocks along ``dim``, summed.

    Stock gathers ``x`` at the index lists ``b = range(block_size - 1, n - 1, block_size)`` and ``bc`` (the other
    positions of ``range(n - 1)``, ascending) and at these plus one. ``b`` is a strided slice; ``bc`` is every block of
    differences without its last entry, then the tail that holds no border.
    """
    n = x.shape[dim]
    every = (slice(None),) * dim + (slice(None, None, block_size),)
    border = x.narrow(dim, block_size - 1, max(n - block_size, 0))[every]
    after = x.narrow(dim, block_size, max(n - block_size, 0))[every]
    d_b = (border - after).pow(2.0).sum()
    diff = x.narrow(dim, 0, n - 1) - x.narrow(dim, 1, n - 1)
    blocks = (n - 1) // block_size
    inner = diff.narrow(dim, 0, blocks * block_size).unflatten(dim, (blocks, block_size))
    inner = inner.narrow(dim + 1, 0, block_size - 1).flatten(dim, dim + 1)
    rest = torch.cat([inner, diff.narrow(dim, blocks * block_size, n - 1 - blocks * block_size)], dim=dim)
    return d_b, rest.pow(2.0).sum()


@replaces(f"{_FUNCTIONAL}._compute_bef", params=("x", "block_size"), everywhere=True)
def _compute_bef(x: Tensor, block_size: int = 8) -> Tensor:
    """Stock's block effect without index tensors or the host read of ``d_b > d_bc``."""
    _, channels, height, width = x.shape
    if channels > 1:
        raise ValueError(f"`psnrb` metric expects grayscale images, but got images with {channels} channels.")
    if block_size < 2 or min(height, width) <= block_size:
        # an index list without borders or without anything else: stock's empty float index fails (IndexError)
        return stock(f"{_FUNCTIONAL}._compute_bef")(x, block_size)
    d_b, d_bc = _border_sum(x, 3, block_size)
    d_b_v, d_bc_v = _border_sum(x, 2, block_size)
    d_b += d_b_v
    d_bc += d_bc_v

    n_hb = height * (width / block_size) - 1
    n_hbc = (height * (width - 1)) - n_hb
    n_vb = width * (height / block_size) - 1
    n_vbc = (width * (height - 1)) - n_vb
    d_b /= n_hb + n_vb
    d_bc /= n_hbc + n_vbc
    diff = d_b - d_bc
    return torch.where(d_b > d_bc, diff * (math.log2(block_size) / math.log2(min(height, width))), diff * 0)


@replaces(f"{_FUNCTIONAL}._psnrb_update", params=("preds", "target", "block_size"), everywhere=True)
def _psnrb_update(preds: Tensor, target: Tensor, block_size: int = 8) -> tuple[Tensor, Tensor, Tensor]:
    """Stock's statistics; the number of observations made on the device, not copied there."""
    sum_squared_error = torch.sum(torch.pow(preds - target, 2))
    return sum_squared_error, _compute_bef(preds, block_size=block_size), _count(target, target.numel())


@replaces(
    f"{_FUNCTIONAL}._psnrb_compute", params=("sum_squared_error", "bef", "num_obs", "data_range"), everywhere=True
)
def _psnrb_compute(sum_squared_error: Tensor, bef: Tensor, num_obs: Tensor, data_range: Tensor) -> Tensor:
    """Stock's formula; on 1.6 and 1.7 its ``if data_range > 2`` is a selection on the device."""
    if not _RANGE_BRANCH:
        return stock(f"{_FUNCTIONAL}._psnrb_compute")(sum_squared_error, bef, num_obs, data_range)
    sum_squared_error = sum_squared_error / num_obs + bef
    wide = 10 * torch.log10(data_range**2 / sum_squared_error)
    return torch.where(data_range > 2, wide, 10 * torch.log10(1.0 / sum_squared_error))
