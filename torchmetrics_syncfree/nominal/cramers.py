"""Sync-free ``torchmetrics.nominal.cramers``: CramersV's update and compute (and so ``forward``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
update: ``bincount`` of ``target * C + preds``,      fixed-size counting into the table plus a sink cell
``nan_strategy="drop"`` by boolean mask              (:mod:`~torchmetrics_syncfree.nominal.utils`)
compute: empty rows and columns dropped (boolean     kept: their cells' terms are ``0 / 0``, which
masks), ``if df == ...``                             ``nansum`` skips; ``df`` selects by multiplying
``torch.tensor(0.0, device=...)`` in the bias        ``clamp_min(0.0)``: no host-to-device copy
correction
``if min(rows, cols) == 1: warn; return nan``        NaN put in with ``masked_fill``; stock's warning filed as
                                                     a deferred warning of the metric (one per such compute)
==================================================  ===========================================================

Replaced are the metric's ``__init__`` (its check counters), ``update`` (the fixed-shape count on every device; where
host reads are free its index check raises at once) and ``compute`` (the fixed-shape statistic on every device, of the
filled rows and columns of a large table where host reads are free). The values are stock's to float tolerance (see
:mod:`~torchmetrics_syncfree.nominal.utils`), NaN where stock's are; the warning comes at once where host reads are
free, on the device path at the metric's next eager point (the end of a ``forward``, the next ``compute()`` or
``reset()``). Pairs whose index ``target * C + preds`` leaves the table (stock: ``RuntimeError`` from ``bincount`` or
``reshape``, and the batch is not counted) raise a ``RuntimeError`` with the project's message (``OUTSIDE_TABLE``):
where reads are free at once, the batch not counted; on the device path at the next eager point, the batch's other pairs
counted. The functional ``cramers_v`` finds its number of classes with ``unique`` and stays stock's.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from torchmetrics_syncfree.nominal.utils import UNABLE_CRAMERS, corrected_statistic, declare_patches

_MODULE = "torchmetrics.nominal.cramers"


def _compute(metric: Any, confmat: Tensor) -> Tensor:
    """Stock's ``_cramers_v_compute`` of ``confmat`` with fixed shapes, its warning filed with the metric."""
    return corrected_statistic(metric, confmat, UNABLE_CRAMERS, lambda degrees: degrees.amin())


declare_patches(
    __name__,
    f"{_MODULE}.CramersV",
    ("num_classes", "bias_correction", "nan_strategy", "nan_replace_value"),
    _compute,
)
