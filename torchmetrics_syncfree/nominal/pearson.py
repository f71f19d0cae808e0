"""Sync-free ``torchmetrics.nominal.pearson``: PearsonsContingencyCoefficient's update and compute (and ``forward``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
update: ``bincount`` of ``target * C + preds``,      fixed-size counting into the table plus a sink cell
``nan_strategy="drop"`` by boolean mask              (:mod:`~torchmetrics_syncfree.nominal.utils`)
compute: empty rows and columns dropped (boolean     kept: their cells' terms are ``0 / 0``, which
masks), ``if df == 0``                               ``nansum`` skips; ``df`` selects by multiplying
==================================================  ===========================================================

As :mod:`~torchmetrics_syncfree.nominal.cramers` (the same paths, tolerance and index check; this statistic has
no bias correction and no warning); the functional ``pearsons_contingency_coefficient`` stays stock's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree.nominal.utils import chi_squared, declare_patches

_MODULE = "torchmetrics.nominal.pearson"


def _compute(metric: Any, confmat: Tensor) -> Tensor:
    """Stock's ``_pearsons_contingency_coefficient_compute`` of ``confmat`` with fixed shapes."""
    chi2, _, _, total = chi_squared(confmat, bias_correction=False)
    phi_squared = chi2 / total
    return torch.sqrt(phi_squared / (1 + phi_squared)).clamp(0.0, 1.0)


declare_patches(
    __name__,
    f"{_MODULE}.PearsonsContingencyCoefficient",
    ("num_classes", "nan_strategy", "nan_replace_value"),
    _compute,
)
