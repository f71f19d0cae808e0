"""Sync-free ``compute`` of the fixed-output curve metrics: every task, binned and unbinned.

``PrecisionAtFixedRecall`` (``torchmetrics.classification.precision_fixed_recall``), ``RecallAtFixedPrecision``
(``recall_fixed_precision``), ``SensitivityAtSpecificity`` (``sensitivity_specificity``), ``SpecificityAtSensitivity``
(``specificity_sensitivity``) and ``EER`` (``eer``, torchmetrics 1.7+), binary, multiclass and multilabel. Their update
is the curve's (:mod:`~torchmetrics_syncfree.classification.precision_recall_curve`); their outputs have a fixed
shape, so the whole compute (and so ``forward``) runs without host reads:

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``thresholds=None``: ``_binary_clf_curve``           every column sorted once, counts at the end of each tie
(``torch.where`` on score differences: a curve of    group (``_ranked_counts``): stock's curve with repeated
data-dependent length), one per class in a loop      points, each with its group's counts and threshold; points
                                                     of ignored entries are left out of every reduction
``if fps[-1] <= 0`` / ``if tps[-1] <= 0``;           ``torch.where``; the warnings are deferred warnings of the
``if (target == 0).all()`` (warnings)                metric (one per class, as stock)
``max((p, r, t) for ... if r >= min_recall)``        a masked lexicographic maximum (``max`` of each key among
(Python ``max`` over tensor tuples);                 the points that tie on the keys before it); repeated points
``_lexargmax``: ``torch.where(col == col.max())``    tie on every key, so they change nothing
``if not indices.any()``, ``x[indices]``,            ``torch.where``, a masked ``argmax`` (its first maximum is
``argmax``                                           the first of stock's points: the order is stock's)
EER: ``argmin(abs(diff))``, ``fpr[idx]``             the same over the valid points, values by ``gather``
``if max_precision == 0.0`` (threshold NaN, or       ``torch.where``
``1e6`` before torchmetrics 1.8)
==================================================  ===========================================================

One implementation on every device: values and thresholds are stock's to the bit (the same elementwise operations on the
same counts); warnings come at once where reads are free (CPU tensors, eager), elsewhere at the next eager point.
Deviations (documented, tested where stated): as AUROC's, the rates of a class without positives or negatives are
float32 whatever the scores' dtype; for float64 or half scores ``RecallAtFixedPrecision`` returns the promoted dtype of
its (recall, precision, threshold) stack even where nothing qualifies (stock: the recall's and thresholds' own dtypes
then; before torchmetrics 1.8, with half scores, stock's ``1e6`` made in half precision reads ``inf``, the patched
one ``1e6``); ``_lexargmax``'s ``IndexError`` for a NaN recall among the qualifying points (``min_precision <= 0`` and a
class without positives) is not raised; where stock's unbinned curve has no entry (every one ignored: an
``IndexError``), the patched compute returns 0 and the no-threshold value (the ROC-based metrics: the curve's origin,
threshold 1; EER 0.5). Tested in ``tests/test_fixed_point_curves.py``. ``MulticlassEER`` with ``average`` (micro/macro
curves) keeps stock's compute on the list state without ignored entries.

"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor
from torchmetrics.functional.classification.precision_recall_curve import (
    _binary_precision_recall_curve_compute,
    _multiclass_precision_recall_curve_compute,
    _multilabel_precision_recall_curve_compute,
)
from torchmetrics.functional.classification.roc import (
    _binary_roc_compute,
    _multiclass_roc_compute,
    _multilabel_roc_compute,
)

from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.classification.auroc import _rates
from torchmetrics_syncfree.classification.precision_recall_curve import (
    UNDEFINED_RECALL,
    _file_warning,
    _ignored_entries_dropped,
    _list_state,
    _ranked_counts,
)

_CLASSIFICATION = "torchmetrics.classification"
#: stock's threshold where the best precision/recall is 0 (``1e6`` before torchmetrics 1.8)
_NO_THRESHOLD = float("nan") if RequirementCache("torchmetrics>=1.8.0") else 1e6
#: stock's threshold where no point reaches the minimum specificity/sensitivity (every release)
_NO_THRESHOLD_ROC = 1e6
HAS_EER = importlib.util.find_spec("torchmetrics.classification.eer") is not None


# --------------------------------------------------------------------------------------------------------------------
# the curves, ``(G, P)`` each: one row per class (binary: one row), the points in stock's order; ``valid`` says which
# points are stock's (``None``: all)


def _unbinned_columns(self: Any, task: str) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """``(scores (N, G), positives (N, G), kept (N, G) or None, labels-all-zero (G,) or ())`` of a list state."""
    preds, target = _list_state(self)
    if task == "multilabel":
        kept = None if self.ignore_index is None else target != self.ignore_index
        all_zero = ((target == 0) if kept is None else (target == 0) | ~kept).all(0)
        return preds, target == 1, kept, all_zero
    kept = None if self.ignore_index is None else target != self.ignore_index
    all_zero = ((target == 0) if kept is None else (target == 0) | ~kept).all()
    if task == "binary":
        preds, positive = preds.unsqueeze(1), (target == 1).unsqueeze(1)
    else:  # stock's curve of class i: positives ``target == i``, "no positives" ``(target == 0).all()`` (kept)
        positive = target.unsqueeze(1) == torch.arange(self.num_classes, device=target.device)
    if kept is not None:
        kept = kept.unsqueeze(1).expand_as(preds)
    return preds, positive, kept, all_zero


def _descending(scores: Tensor, kept: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The scores of every column in descending order (stock's thresholds) and whether each point's entry is kept.

    (The counts come from ``_ranked_counts``' own sort: within a tie group the points coincide, so which entry of the
    group is where changes nothing.)
    """
    ranked, order = scores.sort(dim=0, descending=True)
    return ranked, None if kept is None else kept.gather(0, order)


def _pr_points(self: Any, task: str) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Stock's precision-recall curve without its appended end point: ``(precision, recall, thresholds, valid)``."""
    if self.thresholds is not None:
        if task == "binary":
            precision, recall, thresholds = _binary_precision_recall_curve_compute(self.confmat, self.thresholds)
            precision, recall = precision.unsqueeze(0), recall.unsqueeze(0)
        elif task == "multiclass":
            precision, recall, thresholds = _multiclass_precision_recall_curve_compute(
                self.confmat, self.num_classes, self.thresholds
            )
        else:
            precision, recall, thresholds = _multilabel_precision_recall_curve_compute(
                self.confmat, self.num_labels, self.thresholds, self.ignore_index
            )
        size = thresholds.numel()
        return precision[:, :size], recall[:, :size], thresholds, None
    scores, positive, kept, all_zero = _unbinned_columns(self, task)
    tps, fps = _ranked_counts(scores, positive, kept)
    tps, fps = tps[1:], fps[1:]  # (stock's curve has no origin)
    precision = tps / (tps + fps)
    recall = tps / tps[-1]
    no_positives = all_zero.expand(recall.shape[1])
    _file_warning(self, UNDEFINED_RECALL, no_positives.sum())
    recall = torch.where(no_positives, torch.ones_like(recall), recall)
    ranked, valid = _descending(scores, kept)
    return precision.T, recall.T, ranked.T, None if valid is None else valid.T


def _roc_points(self: Any, task: str) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Stock's ROC: ``(fpr, tpr, thresholds, valid)``, thresholds descending from the origin's (1)."""
    if self.thresholds is not None:
        if task == "binary":
            fpr, tpr, thresholds = _binary_roc_compute(self.confmat, self.thresholds)
            return fpr.unsqueeze(0), tpr.unsqueeze(0), thresholds, None
        if task == "multiclass":
            fpr, tpr, thresholds = _multiclass_roc_compute(self.confmat, self.num_classes, self.thresholds)
        else:
            fpr, tpr, thresholds = _multilabel_roc_compute(
                self.confmat, self.num_labels, self.thresholds, self.ignore_index
            )
        return fpr, tpr, thresholds, None
    scores, positive, kept, _ = _unbinned_columns(self, task)
    fpr, tpr = _rates(self, scores, positive, kept)  # (N + 1, G) from the origin, warnings deferred
    ranked, valid = _descending(scores, kept)
    thresholds = torch.cat([torch.ones_like(ranked[:1]), ranked])
    if valid is not None:
        valid = torch.cat([torch.ones_like(valid[:1]), valid])
    return fpr.T, tpr.T, thresholds.T, None if valid is None else valid.T


# --------------------------------------------------------------------------------------------------------------------
# the reductions, along the last dimension


def _masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """The largest of ``values`` where ``mask`` (``-inf`` where none), keeping the last dimension."""
    return torch.where(mask, values, -torch.inf).amax(-1, keepdim=True)


def _lexmax(keys: tuple[Tensor, ...], mask: Tensor) -> tuple[Tensor, ...]:
    """The lexicographic maximum of the tuples ``keys`` among the points where ``mask``, one key per result."""
    best = []
    for key in keys:
        top = _masked_max(key, mask)
        mask = mask & (key == top)
        best.append(top.squeeze(-1))
    return tuple(best)


def _first(values: Tensor, index: Tensor) -> Tensor:
    """``values[..., index]`` for an index per row (``gather``: no host read)."""
    return values.expand(*index.shape[:-1], values.shape[-1]).gather(-1, index).squeeze(-1)


def _representable(value: float, dtype: torch.dtype) -> float:
    """``value`` as a tensor of ``dtype`` holds it: stock's ``1e6`` reads ``inf`` in half precision.

    ``torch.where`` with the Python number itself rounds it so on recent torch, but raises an overflow error before
    torch 2.6 or so (and ``full_like`` does on every release).
    """
    if dtype.is_floating_point and math.isfinite(value) and abs(value) > torch.finfo(dtype).max:
        return math.copysign(math.inf, value)
    return value


def _qualifying(condition: Tensor, valid: Tensor | None) -> Tensor:
    """The points that meet ``condition`` and are not ignored entries' (``valid``: ``None`` where none is)."""
    return condition if valid is None else condition & valid


def _zero_where_none_qualifies(found: Tensor, best: Tensor, best_threshold: Tensor) -> tuple[Tensor, Tensor]:
    """Stock's fallback of the fixed-recall/precision metrics: 0 where no point qualifies.

    Wherever the best value is 0 the threshold is stock's no-value threshold.
    """
    best = torch.where(found, best, torch.zeros_like(best))
    return best, torch.where(best == 0, _representable(_NO_THRESHOLD, best_threshold.dtype), best_threshold)


def _precision_at_recall(
    precision: Tensor, recall: Tensor, thresholds: Tensor, valid: Tensor | None, min_recall: float
) -> tuple[Tensor, Tensor]:
    """Stock's ``max((p, r, t) for p, r, t in zip(...) if r >= min_recall)`` of every row, and its 0/NaN fallback.

    Python's ``max`` keeps a first candidate of NaN precision (nothing compares greater; binned curves of 1.8+ have
    NaN precision above every score) and skips any later one: so does this.
    """
    thresholds = thresholds.expand_as(precision)
    mask = _qualifying(recall >= min_recall, valid)
    found = mask.any(-1)
    first = mask.int().argmax(-1, keepdim=True)
    first_nan = found & _first(precision, first).isnan()
    best_p, _, best_t = _lexmax((precision, recall, thresholds), mask & ~precision.isnan())
    best_p = torch.where(first_nan, _first(precision, first), best_p)
    best_t = torch.where(first_nan, _first(thresholds, first), best_t)
    return _zero_where_none_qualifies(found, best_p, best_t)


def _recall_at_precision(
    precision: Tensor, recall: Tensor, thresholds: Tensor, valid: Tensor | None, min_precision: float
) -> tuple[Tensor, Tensor]:
    """Stock's ``_lexargmax`` of (recall, precision, threshold) among the points of precision >= ``min_precision``.

    In the dtype of stock's ``vstack`` of the three.
    """
    dtype = torch.promote_types(torch.promote_types(recall.dtype, precision.dtype), thresholds.dtype)
    precision, recall = precision.to(dtype), recall.to(dtype)
    thresholds = thresholds.to(dtype).expand_as(precision)
    mask = _qualifying(precision >= min_precision, valid)
    found = mask.any(-1)
    best_r, _, best_t = _lexmax((recall, precision, thresholds), mask)
    return _zero_where_none_qualifies(found, best_r, best_t)


def _best_where_at_least(
    value: Tensor, other: Tensor, thresholds: Tensor, valid: Tensor | None, minimum: float
) -> tuple[Tensor, Tensor]:
    """Stock's ``_sensitivity_at_specificity``/``_specificity_at_sensitivity`` of every row.

    The largest ``value`` among the points where ``other >= minimum`` (its first point, as ``argmax`` of stock's
    filtered curve) and its threshold; 0 and ``1e6`` where no point qualifies.
    """
    thresholds = thresholds.expand_as(value)
    mask = _qualifying(other >= minimum, valid)
    found = mask.any(-1)
    index = torch.where(mask, value, -torch.inf).argmax(-1, keepdim=True)
    best, best_t = _first(value, index), _first(thresholds, index)
    best = torch.where(found, best, torch.zeros_like(best))
    return best, torch.where(found, best_t, _representable(_NO_THRESHOLD_ROC, best_t.dtype))


def _eer(fpr: Tensor, tpr: Tensor, valid: Tensor | None) -> Tensor:
    """Stock's ``_binary_eer_compute`` of every row: the point of least ``|fpr - (1 - tpr)|`` (the first of them)."""
    distance = torch.abs(fpr - (1 - tpr))
    if valid is not None:
        distance = distance.masked_fill(~valid, torch.inf)
    index = distance.argmin(-1, keepdim=True)
    return (_first(fpr, index) + (1 - _first(tpr, index))) / 2


# --------------------------------------------------------------------------------------------------------------------
# the metrics


def _task_of(name: str) -> str:
    return "binary" if name.startswith("Binary") else "multiclass" if name.startswith("Multiclass") else "multilabel"


def _output(task: str, result: Any) -> Any:
    """Binary results are 0-dim (the single row's)."""
    if task != "binary":
        return result
    if isinstance(result, tuple):
        return tuple(r.squeeze(0) for r in result)
    return result.squeeze(0)


def _make_compute(target: str, task: str, reduce: Callable[[Any, str], Any]) -> Callable[[Any], Any]:
    def compute(self: Any) -> Any:
        if self.__dict__.get("average") is not None:  # averaged curves (multiclass EER): stock's
            with _ignored_entries_dropped(self):
                return stock(target)(self)
        # stock's curve is made under ``no_grad`` (``_binary_clf_curve``): no result of these metrics requires grad
        with torch.no_grad():
            return _output(task, reduce(self, task))

    compute.__module__ = __name__
    compute.__doc__ = "Stock's ``compute``, the same values without host reads."
    return compute


def _precision_at_fixed_recall(self: Any, task: str) -> tuple[Tensor, Tensor]:
    return _precision_at_recall(*_pr_points(self, task), self.min_recall)


def _recall_at_fixed_precision(self: Any, task: str) -> tuple[Tensor, Tensor]:
    return _recall_at_precision(*_pr_points(self, task), self.min_precision)


def _sensitivity_at_fixed_specificity(self: Any, task: str) -> tuple[Tensor, Tensor]:
    fpr, tpr, thresholds, valid = _roc_points(self, task)
    return _best_where_at_least(tpr, 1 - fpr, thresholds, valid, self.min_specificity)


def _specificity_at_fixed_sensitivity(self: Any, task: str) -> tuple[Tensor, Tensor]:
    fpr, tpr, thresholds, valid = _roc_points(self, task)
    return _best_where_at_least(1 - fpr, tpr, thresholds, valid, self.min_sensitivity)


def _equal_error_rate(self: Any, task: str) -> Tensor:
    fpr, tpr, _, valid = _roc_points(self, task)
    return _eer(fpr, tpr, valid)


_AREAS: list[tuple[str, str, Callable[[Any, str], Any]]] = [
    ("precision_fixed_recall", "PrecisionAtFixedRecall", _precision_at_fixed_recall),
    ("recall_fixed_precision", "RecallAtFixedPrecision", _recall_at_fixed_precision),
    ("sensitivity_specificity", "SensitivityAtSpecificity", _sensitivity_at_fixed_specificity),
    ("specificity_sensitivity", "SpecificityAtSensitivity", _specificity_at_fixed_sensitivity),
] + ([("eer", "EER", _equal_error_rate)] if HAS_EER else [])

#: the replaced computes, by target
COMPUTES: dict[str, Callable[[Any], Any]] = {}
for _module, _metric, _reduce in _AREAS:
    for _task in ("Binary", "Multiclass", "Multilabel"):
        _target = f"{_CLASSIFICATION}.{_module}.{_task}{_metric}.compute"
        COMPUTES[_target] = replaces(_target, params=("self",), kind="metric_method")(
            _make_compute(_target, _task_of(_task), _reduce)
        )
