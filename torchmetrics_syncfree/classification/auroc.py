"""Sync-free ``compute`` of ``torchmetrics.classification.auroc``: AUROC of every task, binned and unbinned.

The update is the curve's (:mod:`~torchmetrics_syncfree.classification.precision_recall_curve`). Stock's compute
reads the device on the host in several places; each becomes fixed-shape tensor work:

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``thresholds=None``: ``_binary_clf_curve``           every column sorted once, counts at the end of each tie
(``torch.where`` on score differences: a curve       group (:func:`_ranked_counts`): stock's curve with repeated
of data-dependent length), one per class in a        points, for all classes in one batch of tensor ops
Python loop
``if fps[-1] <= 0`` / ``if tps[-1] <= 0`` (zero      ``torch.where``; the warnings are deferred warnings of the
rates and a warning)                                 metric (one per class, as stock)
macro/weighted: ``if isnan(res).any()`` (warning),   a NaN-ignoring mean / weights zeroed for NaN classes; the
``res[~isnan(res)].mean()``                          warning deferred
weighted, unbinned: ``torch.bincount(target)``       a fixed-shape count of each class
``max_fpr``: ``fpr.sum() == 0``,                     both results computed, stock's selected with ``torch.where``;
``tensor(max_fpr, device=...)``,                     ``torch.full``; the points past ``max_fpr`` become copies of
``tpr[:stop]`` (a data-dependent slice)              the interpolated point (zero-width trapezoids)
==================================================  ===========================================================

One implementation on every device. The values equal stock's up to the order of floating-point sums (a few ulp; the
repeated points add exact zeros). Where reads are free (CPU tensors, eager) the warnings come at once, from
``compute``; elsewhere at the metric's next eager point (the next update, ``compute()`` or ``reset()``), once per
offending ``compute``. Deviation (documented, tested): for float64 or half scores, stock's
value takes the scores' dtype when a class has no negatives or no positives (its zero rates are ``zeros_like`` the
thresholds); here it is always float32, as in every other case.

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree.classification.precision_recall_curve import (
    _ASCENDING,
    NO_NEGATIVES,
    NO_POSITIVES,
    _average_ignoring_nan,
    _class_counts,
    _constants,
    _file_warning,
    _kept_entries,
    _list_state,
    _ranked_counts,
)
from torchmetrics_syncfree.classification.stat_scores import _safe_divide

_MODULE = "torchmetrics.classification.auroc"


def _rates(metric: Any, scores: Tensor, positive: Tensor, weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Stock's unbinned ``_binary_roc_compute`` of every column, ``(N + 1, G)``: ``(fpr, tpr)`` from (0, 0) upward.

    A column without negatives (positives) gets zero false (true) positive rates and stock's warning, once per column.
    """
    tps, fps = _ranked_counts(scores, positive, weight)
    no_negatives, no_positives = fps[-1] <= 0, tps[-1] <= 0
    _file_warning(metric, NO_NEGATIVES, _number_of(no_negatives))
    _file_warning(metric, NO_POSITIVES, _number_of(no_positives))
    # stock's zero rates of a column without negatives (positives): its counts are all 0, and 0 / 0 is the only NaN
    return torch.nan_to_num_(fps / fps[-1], nan=0.0), torch.nan_to_num_(tps / tps[-1], nan=0.0)


def _number_of(flags: Tensor) -> Tensor:
    """The number of set ``flags`` (one per column), 0-dim; one column's flag is that already (a view)."""
    return flags.view(()) if flags.numel() == 1 else flags.sum()


def _area(fpr: Tensor, tpr: Tensor) -> Tensor:
    """Stock's ``_auc_compute_without_check(fpr, tpr, 1.0)`` of every column: the trapezoidal rule.

    (Stock's ``* 1.0`` leaves every value as it is, NaN and signed zeros included: one launch less.)
    """
    return torch.trapz(tpr, fpr, dim=0)


def _partial_area(fpr: Tensor, tpr: Tensor, max_fpr: float, ascending: bool = True) -> Tensor:
    """Stock's McClish-corrected partial AUC up to ``max_fpr`` of one non-decreasing curve, with fixed shapes.

    Stock cuts the curve after the last point at or below ``max_fpr`` and appends the interpolated point; here the
    points past the cut are moved onto the interpolated point instead (zero-width trapezoids). Where stock returns
    the full area (no false or no true positives at all), so does this, selected on the device. (A binned curve
    whose rates all stay at or below ``max_fpr``, thresholds above 0 only, fails in stock's ``fpr[stop]``; here the
    last point stands in for the missing one.) ``ascending``: the curve is non-decreasing (unbinned, or binned with
    thresholds known to be ascending; stock's curve of other thresholds is in their order).
    """
    max_area = torch.full((), max_fpr, device=fpr.device)
    stop = torch.bucketize(max_area, fpr, right=True)
    # the points around the cut, ``[stop - 1, stop]``, indexed by a tensor (``fpr[stop]`` would read ``stop``); index -1
    # is stock's ``fpr[stop - 1]`` when no point is at or below ``max_fpr``: the last point (advanced indexing wraps)
    bracket = torch.add(stop, _constants((-1, 0), torch.long, fpr.device)).clamp_(max=fpr.numel() - 1)
    (fpr_below, fpr_above), (tpr_below, tpr_above) = fpr[bracket], tpr[bracket]
    # a bracket of equal rates (stop 0 on a flat curve, where stock's area of the cut is 0 whatever it interpolates;
    # stop past the last point, where stock fails) has an infinite or undefined weight: 0, the lower point stands in
    weight = ((max_area - fpr_below) / (fpr_above - fpr_below)).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    interp_tpr = torch.lerp(tpr_below, tpr_above, weight)
    # the points at or below ``max_fpr``: the first ``stop`` of a non-decreasing curve (no arange: it would be as long
    # as the epoch's scores)
    kept = fpr <= max_area if ascending else torch.arange(fpr.numel(), device=fpr.device) < stop
    cut_fpr = torch.cat([torch.where(kept, fpr, max_area), max_area.view(1)])
    cut_tpr = torch.cat([torch.where(kept, tpr, interp_tpr), interp_tpr.view(1)])
    partial_auc = _area(cut_fpr, cut_tpr)
    min_area = 0.5 * max_area**2
    corrected = 0.5 * (1 + (partial_auc - min_area) / (max_area - min_area))
    # stock's ``fpr.sum() == 0 or tpr.sum() == 0``: non-decreasing rates, never negative, sum to 0 exactly when the
    # last (largest) one is 0; a binned curve of thresholds not known to be ascending takes stock's test as it is
    full = torch.minimum(fpr[-1], tpr[-1]) == 0 if ascending else (fpr.sum() == 0) | (tpr.sum() == 0)
    return torch.where(full, _area(fpr, tpr), corrected)


def _binned_rates(confmat: Tensor) -> tuple[Tensor, Tensor]:
    """Stock's binned ROC of a ``(T, 2, 2)`` or ``(T, G, 2, 2)`` state, thresholds ascending: ``(fpr, tpr)``."""
    tps, fps, fns, tns = confmat[..., 1, 1], confmat[..., 0, 1], confmat[..., 1, 0], confmat[..., 0, 0]
    return _safe_divide(fps, fps + tns).flip(0), _safe_divide(tps, tps + fns).flip(0)


def _binary_roc(self: Any) -> tuple[Tensor, Tensor]:
    """The fixed-shape ROC of a binary metric's state (binned or unbinned), rates ascending: ``(fpr, tpr)``, 1-D."""
    if self.thresholds is not None:
        return _binned_rates(self.confmat)
    preds, target = _list_state(self)
    kept = _kept_entries(self, target)
    fpr, tpr = _rates(self, preds.unsqueeze(1), (target == 1).unsqueeze(1), None if kept is None else kept.unsqueeze(1))
    return fpr.squeeze(1), tpr.squeeze(1)


def _multiclass_roc(self: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The fixed-shape one-vs-rest ROC of every class, ``(points, C)`` each, and stock's weights of the classes."""
    if self.thresholds is not None:
        fpr, tpr = _binned_rates(self.confmat)
        return fpr, tpr, self.confmat[0][:, 1, :].sum(-1)  # stock's weights: the positives of each class
    preds, target = _list_state(self)
    kept = _kept_entries(self, target)
    weight = None if kept is None else kept.unsqueeze(1).expand_as(preds)
    classes = torch.arange(self.num_classes, device=target.device)
    fpr, tpr = _rates(self, preds, target.unsqueeze(1) == classes, weight)
    return fpr, tpr, _class_counts(target, self.num_classes, kept)


def _multilabel_roc(self: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The fixed-shape ROC of every label, ``(points, L)`` each, and stock's weights (the positives of each label)."""
    if self.thresholds is not None:
        fpr, tpr = _binned_rates(self.confmat)
        return fpr, tpr, self.confmat[0][:, 1, :].sum(-1)
    preds, target = _list_state(self)
    kept = None if self.ignore_index is None else target != self.ignore_index
    fpr, tpr = _rates(self, preds, target == 1, kept)
    return fpr, tpr, (target == 1).sum(dim=0).float()


@replaces(f"{_MODULE}.BinaryAUROC.compute", params=("self",), kind="metric_method")
def _binary_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    fpr, tpr = _binary_roc(self)
    if self.max_fpr is None or self.max_fpr == 1:
        return _area(fpr, tpr)
    ascending = self.thresholds is None or self.__dict__.get(_ASCENDING, False)  # (binned: the rates' order)
    return _partial_area(fpr, tpr, self.max_fpr, ascending)


@replaces(f"{_MODULE}.MulticlassAUROC.compute", params=("self",), kind="metric_method")
def _multiclass_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    fpr, tpr, weights = _multiclass_roc(self)
    return _average_ignoring_nan(self, _area(fpr, tpr), self.average, weights)


@replaces(f"{_MODULE}.MultilabelAUROC.compute", params=("self",), kind="metric_method")
def _multilabel_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    if self.average == "micro":  # stock's binary AUROC of all labels' entries together
        if self.thresholds is not None:
            return _area(*_binned_rates(self.confmat.sum(1)))
        preds, target = _list_state(self)
        kept = None if self.ignore_index is None else (target != self.ignore_index).reshape(-1, 1)
        return _area(*_rates(self, preds.reshape(-1, 1), (target == 1).reshape(-1, 1), kept)).squeeze(0)
    fpr, tpr, weights = _multilabel_roc(self)
    return _average_ignoring_nan(self, _area(fpr, tpr), self.average, weights)
