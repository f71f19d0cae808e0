"""Sync-free ``compute`` of ``torchmetrics.classification.logauc``: LogAUC of every task, binned and unbinned.

Stock's LogAUC takes the ROC curve (``super().compute()``: unbinned, a curve of data-dependent length) and, per
curve, copies ``fpr_range`` to the device (``torch.tensor(fpr_range).to(...)``), inserts the two interpolated points,
finds the last point at each bound with ``torch.where(log_fpr == bound)[0][-1]`` and integrates the slice between
them: host reads and data-dependent shapes. The compute:

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``super().compute()`` (ROC)                          the fixed-shape ROC of the AUROC area (``_rates``, binned:
                                                     ``_binned_rates``), its warnings deferred
``torch.tensor(fpr_range).to(device)``               ``torch.full``
``torch.where(log_fpr == b)[0][-1]`` and             the bounds' last indices by a masked ``max``; the
``log_fpr[lower:upper + 1]``                         trapezoids outside them masked out of the sum
the NaN warning of the reduction (its message        a deferred warning of the metric
says ``{average}`` literally, as stock's)
==================================================  ===========================================================

One implementation on every device: values equal stock's up to the order of floating-point sums; the per-class
areas run in a Python loop over the classes (fixed shapes, no reads), as stock's. Deviation (documented, tested):
stock interpolates at the bounds after an *unstable* ``argsort`` of the rates (``torchmetrics.utilities.data.interp``),
so next to a vertical run of the curve (equal false positive rates) it may start from a point inside the run,
depending on the sort implementation; the patched compute interpolates along the curve (from the run's top:
``np.interp``'s order on the curve's points).

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree.classification.auroc import _binary_roc, _multiclass_roc, _multilabel_roc
from torchmetrics_syncfree.classification.precision_recall_curve import (
    LOGAUC_NAN,
    _file_warning,
)

_MODULE = "torchmetrics.classification.logauc"
_SHORT_CURVE = "At least two values on for the fpr and tpr are required to compute the log AUC. Returns 0 score."


def _interp_sorted(x: Tensor, xp: Tensor, fp: Tensor) -> Tensor:
    """Stock's ``interp`` for ``xp`` already in ascending order (its ``argsort`` is then the identity)."""
    slopes = (fp[1:] - fp[:-1]) / (xp[1:] - xp[:-1])
    indices = (torch.searchsorted(xp, x) - 1).clamp(0, slopes.numel() - 1)
    return fp[indices] + slopes[indices] * (x - xp[indices])


def _log_area(fpr: Tensor, tpr: Tensor, fpr_range: tuple[float, float]) -> Tensor:
    """Stock's ``_binary_logauc_compute`` of one curve (``fpr`` ascending), with fixed shapes."""
    if fpr.numel() < 2 or tpr.numel() < 2:  # the curve's length is known on the host
        rank_zero_warn(_SHORT_CURVE)
        return torch.zeros((), device=fpr.device)
    bounds_fpr = torch.stack([torch.full((), bound, device=fpr.device) for bound in fpr_range])
    tpr = torch.cat([tpr, _interp_sorted(bounds_fpr, fpr, tpr)]).sort().values
    log_fpr = torch.log10(torch.cat([fpr, bounds_fpr]).sort().values)
    bounds = torch.log10(bounds_fpr)
    position = torch.arange(log_fpr.numel(), device=fpr.device)
    lower = torch.where(log_fpr == bounds[0], position, -1).max()
    upper = torch.where(log_fpr == bounds[1], position, -1).max()
    # stock's trapezoids over the slice [lower, upper]; the others are masked, not made zero-width: interpolating at
    # a bound below a repeated first point gives an infinite tpr (stock's value is then -inf), and log10(0) is -inf
    segment = position[:-1]
    inside = (segment >= lower) & (segment < upper)
    trapezoids = (log_fpr[1:] - log_fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2
    area = torch.where(inside, trapezoids, torch.zeros_like(trapezoids)).sum()
    return area * 1.0 / (bounds[1] - bounds[0])


def _reduce(metric: Any, fpr: Tensor, tpr: Tensor, average: str | None) -> Tensor:
    """Stock's ``_reduce_logauc`` of the columns of ``fpr``/``tpr`` (no weights: stock passes none)."""
    # each curve's rates contiguous, in one copy: ``searchsorted`` copies a strided column itself, with a warning to
    # the user (stock's ``interp`` has no ``searchsorted``)
    rates = fpr.T.contiguous()
    scores = torch.stack([_log_area(rates[g], tpr[:, g], metric.fpr_range) for g in range(fpr.shape[1])])
    _file_warning(metric, LOGAUC_NAN, scores.isnan().any())  # stock warns before it looks at ``average``
    if average is None or average == "none":
        return scores
    if average == "macro":
        return scores.nanmean()
    raise ValueError(f"Got unknown average parameter: {average}. Please choose one of ['macro', 'weighted', 'none'].")


@replaces(f"{_MODULE}.BinaryLogAUC.compute", params=("self",), kind="metric_method")
def _binary_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    return _log_area(*_binary_roc(self), self.fpr_range)


@replaces(f"{_MODULE}.MulticlassLogAUC.compute", params=("self",), kind="metric_method")
def _multiclass_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    return _reduce(self, *_multiclass_roc(self)[:2], self.average2)


@replaces(f"{_MODULE}.MultilabelLogAUC.compute", params=("self",), kind="metric_method")
def _multilabel_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    return _reduce(self, *_multilabel_roc(self)[:2], self.average2)
