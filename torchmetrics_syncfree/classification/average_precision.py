"""Sync-free ``compute`` of ``torchmetrics.classification.average_precision``: every task, binned and unbinned.

The update is the curve's (:mod:`~torchmetrics_syncfree.classification.precision_recall_curve`). The compute:

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``thresholds=None``: ``_binary_clf_curve``           every column sorted once, counts at the end of each tie
(a curve of data-dependent length), one per class    group (:func:`_ranked_counts`): stock's curve with repeated
in a Python loop; multilabel ``ignore_index``:       points (zero recall steps), all classes at once; ignored
``preds[~idx]``                                      entries count nothing
``if (target == 0).all()``: recall set to one and    ``torch.where``; the warning is a deferred warning of the
a warning                                            metric (one per class, as stock)
macro/weighted: ``if isnan(res).any()`` (warning),   a NaN-ignoring mean / weights zeroed for NaN classes; the
``res[~isnan(res)].mean()``                          warning deferred
weighted, unbinned: ``torch.bincount(target)``       a fixed-shape count of each class
==================================================  ===========================================================

One implementation on every device: values equal stock's up to the order of floating-point sums; warnings come at
once where reads are free (CPU tensors, eager), elsewhere at the metric's next eager point. Stock's
quirks are kept: the multiclass curve of class ``i`` tests ``(target == 0).all()`` for "no positives" (whatever
``i``), so a class absent from the data gets a NaN score (ignored by macro/weighted, with the warning) unless every
label is 0.

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.classification.average_precision import _reduce_average_precision
from torchmetrics.functional.classification.precision_recall_curve import (
    _multiclass_precision_recall_curve_compute,
    _multilabel_precision_recall_curve_compute,
)

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.classification.precision_recall_curve import (
    UNDEFINED_RECALL,
    _average_ignoring_nan,
    _class_counts,
    _file_warning,
    _kept_entries,
    _list_state,
    _ranked_counts,
)

_MODULE = "torchmetrics.classification.average_precision"


def _average_precisions(
    metric: Any, scores: Tensor, positive: Tensor, no_positives: Tensor, weight: Tensor | None = None
) -> Tensor:
    """Stock's unbinned precision-recall curve and ``-sum((r[1:] - r[:-1]) * p[:-1])`` of every column, ``(G,)``.

    ``no_positives`` (per column, or one flag for all): where stock finds no positive target, recall is one at every
    threshold, with stock's warning once per column.
    """
    tps, fps = _ranked_counts(scores, positive, weight)
    tps, fps = tps[1:], fps[1:]  # (the origin adds no recall step)
    seen = tps + fps
    # a point before any kept entry (only ignored ones above it) has no precision; its recall step is zero
    precision = torch.where(seen > 0, tps / seen, torch.zeros_like(seen))
    recall = tps / tps[-1]
    no_positives = no_positives.expand(recall.shape[1])
    _file_warning(metric, UNDEFINED_RECALL, no_positives.sum())
    recall = torch.where(no_positives, torch.ones_like(recall), recall)
    end = torch.ones_like(precision[:1])
    precision, recall = torch.cat([precision.flip(0), end]), torch.cat([recall.flip(0), torch.zeros_like(end)])
    return -torch.sum((recall[1:] - recall[:-1]) * precision[:-1], 0)


@replaces(f"{_MODULE}.BinaryAveragePrecision.compute", params=("self",), kind="metric_method")
def _binary_compute(self: Any) -> Tensor:
    """Stock's ``compute`` where binned (it reads nothing there); otherwise the same value without host reads."""
    if self.thresholds is not None:  # stock's binned compute reads nothing
        return stock(f"{_MODULE}.BinaryAveragePrecision.compute")(self)
    preds, target = _list_state(self)
    kept = _kept_entries(self, target)
    if kept is None:
        return _average_precisions(self, preds.unsqueeze(1), (target == 1).unsqueeze(1), (target == 0).all()).squeeze(0)
    no_positives = ((target == 0) | ~kept).all()  # stock's (target == 0).all() of the kept entries
    return _average_precisions(
        self, preds.unsqueeze(1), (target == 1).unsqueeze(1), no_positives, kept.unsqueeze(1)
    ).squeeze(0)


@replaces(f"{_MODULE}.MulticlassAveragePrecision.compute", params=("self",), kind="metric_method")
def _multiclass_compute(self: Any) -> Tensor:
    """Stock's ``compute``, without host reads."""
    if self.thresholds is not None:
        curve = _multiclass_precision_recall_curve_compute(self.confmat, self.num_classes, self.thresholds)
        precision, recall = curve[0], curve[1]
        res = _reduce_average_precision(precision, recall, average="none")
        weights = self.confmat[0][:, 1, :].sum(-1)
    else:
        preds, target = _list_state(self)
        kept = _kept_entries(self, target)
        classes = torch.arange(self.num_classes, device=target.device)
        # stock's curve of class i asks whether every (kept) label is 0, not whether none is i (kept as stock's)
        if kept is None:
            res = _average_precisions(self, preds, target.unsqueeze(1) == classes, (target == 0).all())
        else:
            no_positives = ((target == 0) | ~kept).all()
            weight = kept.unsqueeze(1).expand_as(preds)
            res = _average_precisions(self, preds, target.unsqueeze(1) == classes, no_positives, weight)
        weights = _class_counts(target, self.num_classes, kept)
    return _average_ignoring_nan(self, res, self.average, weights)


@replaces(f"{_MODULE}.MultilabelAveragePrecision.compute", params=("self",), kind="metric_method")
def _multilabel_compute(self: Any) -> Tensor:
    """Stock's ``compute`` where binned micro (it reads nothing there); otherwise the same value without host reads."""
    binned = self.thresholds is not None
    if binned and self.average == "micro":  # stock's binned micro compute reads nothing
        return stock(f"{_MODULE}.MultilabelAveragePrecision.compute")(self)
    if binned:
        curve = _multilabel_precision_recall_curve_compute(self.confmat, self.num_labels, self.thresholds)
        precision, recall = curve[0], curve[1]
        res = _reduce_average_precision(precision, recall, average="none")
        return _average_ignoring_nan(self, res, self.average, self.confmat[0][:, 1, :].sum(-1))
    preds, target = _list_state(self)
    kept = torch.ones_like(target, dtype=torch.bool) if self.ignore_index is None else target != self.ignore_index
    no_positives = ((target == 0) | ~kept).all(0)  # stock's (target == 0).all() of the kept entries
    if self.average == "micro":
        flat = (preds.reshape(-1, 1), (target == 1).reshape(-1, 1), no_positives.all(), kept.reshape(-1, 1))
        return _average_precisions(self, *flat).squeeze(0)
    res = _average_precisions(self, preds, target == 1, no_positives, kept)
    return _average_ignoring_nan(self, res, self.average, (target == 1).sum(dim=0).float())
