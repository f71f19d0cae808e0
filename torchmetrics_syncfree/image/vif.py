"""Sync-free ``torchmetrics.image.vif``: VisualInformationFidelity (and the functional ``visual_information_fidelity``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``_vif_per_channel``: ``torch.tensor(1e-10,          ``torch.full((), value, dtype=..., device=...)``: the same
device=...)`` and ``torch.tensor(sigma_n_sq,         0-dim values, made on the device
device=...)``: two host-to-device copies per channel
masked writes ``g[mask] = 0``,                       ``masked_fill`` and ``torch.where`` in stock's order: the
``sigma_v_sq[mask] = sigma_preds_sq[mask]`` (three   same values, no data-dependent shapes
masks per scale, four scales)
==================================================  ===========================================================

One implementation on every device, with stock's values to the bit: every written value is the one stock writes, and the
sums run over the same tensors. 1.6 and 1.7 start the per-image sums from a one-element zero and add out of place;
adding to a zero of the batch's size gives the same values and shape. The metric's ``update`` and ``compute`` are
stock's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import conv2d
from torchmetrics.functional.image.vif import _filter

from torchmetrics_syncfree._registry import replaces

_FUNCTIONAL = "torchmetrics.functional.image.vif"


@replaces(f"{_FUNCTIONAL}._vif_per_channel", params=("preds", "target", "sigma_n_sq"), everywhere=True)
def _vif_per_channel(preds: Tensor, target: Tensor, sigma_n_sq: float) -> Tensor:
    """Stock's VIF of one channel; its constants made on the device and its masked writes as selections."""
    dtype, device = preds.dtype, preds.device
    preds, target = preds.unsqueeze(1), target.unsqueeze(1)
    eps = torch.full((), 1e-10, dtype=dtype, device=device)
    sigma_n_sq = torch.full((), sigma_n_sq, dtype=dtype, device=device)
    preds_vif = torch.zeros(preds.size(0), dtype=dtype, device=device)
    target_vif = torch.zeros(preds.size(0), dtype=dtype, device=device)

    for scale in range(4):
        n = 2.0 ** (4 - scale) + 1
        kernel = _filter(n, n / 5, dtype=dtype, device=device)[None, None, :]
        if scale > 0:
            target = conv2d(target, kernel)[:, :, ::2, ::2]
            preds = conv2d(preds, kernel)[:, :, ::2, ::2]

        mu_target = conv2d(target, kernel)
        mu_preds = conv2d(preds, kernel)
        mu_target_sq = mu_target**2
        mu_preds_sq = mu_preds**2
        mu_target_preds = mu_target * mu_preds

        sigma_target_sq = torch.clamp(conv2d(target**2, kernel) - mu_target_sq, min=0.0)
        sigma_preds_sq = torch.clamp(conv2d(preds**2, kernel) - mu_preds_sq, min=0.0)
        sigma_target_preds = conv2d(target * preds, kernel) - mu_target_preds

        g = sigma_target_preds / (sigma_target_sq + eps)
        sigma_v_sq = sigma_preds_sq - g * sigma_target_preds

        mask = sigma_target_sq < eps
        g = g.masked_fill(mask, 0)
        sigma_v_sq = torch.where(mask, sigma_preds_sq, sigma_v_sq)
        sigma_target_sq = sigma_target_sq.masked_fill(mask, 0)

        mask = sigma_preds_sq < eps
        g = g.masked_fill(mask, 0)
        sigma_v_sq = sigma_v_sq.masked_fill(mask, 0)

        mask = g < 0
        sigma_v_sq = torch.where(mask, sigma_preds_sq, sigma_v_sq)
        g = g.masked_fill(mask, 0)
        sigma_v_sq = torch.clamp(sigma_v_sq, min=eps)

        preds_vif += torch.sum(torch.log10(1.0 + (g**2.0) * sigma_target_sq / (sigma_v_sq + sigma_n_sq)), dim=[1, 2, 3])
        target_vif += torch.sum(torch.log10(1.0 + sigma_target_sq / sigma_n_sq), dim=[1, 2, 3])

    return preds_vif / target_vif
