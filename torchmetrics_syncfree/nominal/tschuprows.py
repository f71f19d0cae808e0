"""Sync-free ``torchmetrics.nominal.tschuprows``: TschuprowsT's update and compute (and so ``forward``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
update: ``bincount`` of ``target * C + preds``,      fixed-size counting into the table plus a sink cell
``nan_strategy="drop"`` by boolean mask              (:mod:`~torchmetrics_syncfree.nominal.utils`)
compute: empty rows and columns dropped (boolean     kept: their cells' terms are ``0 / 0``, which
masks), ``if df == ...``                             ``nansum`` skips; ``df`` selects by multiplying
``torch.tensor(num_rows, device=...)``, the same     the device counts of non-empty rows and columns (int64, as
for columns and ``0.0`` (host-to-device copies)      stock's tensors); ``clamp_min(0.0)``
``if min(rows, cols) == 1: warn; return nan``        NaN put in with ``masked_fill``; stock's warning filed as
                                                     a deferred warning of the metric (one per such compute)
==================================================  ===========================================================

As :mod:`~torchmetrics_syncfree.nominal.cramers` (the same paths, tolerance, deferred warning and index check);
the functional ``tschuprows_t`` stays stock's.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from torchmetrics_syncfree.nominal.utils import UNABLE_TSCHUPROWS, corrected_statistic, declare_patches

_MODULE = "torchmetrics.nominal.tschuprows"


def _compute(metric: Any, confmat: Tensor) -> Tensor:
    """Stock's ``_tschuprows_t_compute`` of ``confmat`` with fixed shapes, its warning filed with the metric."""
    return corrected_statistic(metric, confmat, UNABLE_TSCHUPROWS, lambda degrees: degrees.prod().sqrt())


declare_patches(
    __name__,
    f"{_MODULE}.TschuprowsT",
    ("num_classes", "bias_correction", "nan_strategy", "nan_replace_value"),
    _compute,
)
