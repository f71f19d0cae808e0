"""Sync-free ``torchmetrics.classification.confusion_matrix``: ConfusionMatrix and the metrics built on it.

``BinaryConfusionMatrix``, ``MulticlassConfusionMatrix`` and ``MultilabelConfusionMatrix`` are the base classes of
CohenKappa, MatthewsCorrCoef and JaccardIndex (every task): they inherit its ``update``, so patching the three updates
covers all of them.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``validate_args``: ``torch.unique`` + ``if ...:``    one device flag per update from the masks the counting
                                                     needs anyway, filed with the metric as a deferred check
                                                     (the stat scores' validation: raised at once where reads
                                                     are free, reported at an eager point on the device path,
                                                     the invalid batch left out of the state)
``ignore_index``: ``preds[target != ii]`` (binary,   ignored entries stay in place and weigh 0
multiclass), ``preds[idx] = -4 * L`` (multilabel)
counting: ``torch.bincount`` into a new matrix      one ``put_`` of the entries' cells straight into the state,
(reads the input's max on CUDA; multilabel filters  invalid and ignored entries weighing 0: nothing the size of
with a boolean mask first), added to the state      the matrix is allocated per update (stock: the matrix,
                                                     32 MB at 2000 classes, 800 MB at 10000); upstream's mesh
                                                     ``_bincount`` in deterministic mode, on MPS and with XLA
``self.confmat += confmat``                          the ``put_``: in place, as stock, so a captured CUDA graph
                                                     replays into the metric's own tensor
``normalize``: ``confmat[isnan(confmat)] = 0`` and   ``masked_fill``; the warning is read at once where reads are
a warning with the count of NaN cells                free (stock's message), otherwise it is a deferred warning of
                                                     the metric (one per offending ``compute``)
Jaccard's macro weights: ``weights[mask] = 0``       ``masked_fill``
MatthewsCorrCoef: ``if tp + tn != 0 and ...``,       every branch computed, stock's selected with ``torch.where``;
``if denom == 0`` and four zero-denominator cases    always float32 (stock: int64 ``tensor(1)``/``tensor(-1)``)
==================================================  ===========================================================

The functional API (``multiclass_confusion_matrix(...)``) has no metric: its validation and counting are stock's.

Deliberate deviations from stock (tested in ``tests/test_confusion_matrix.py``):

* multiclass validation checks the documented contract, every non-ignored label in ``[0, num_classes)``, as the stat
  scores do (stock counts distinct values; a label it lets through then fails in ``bincount``/``reshape`` with a
  ``RuntimeError``, or lands in a wrong cell). The exception type is stock's;
* a float label pred outside the classes (stock's validation checks integer label preds only) lands in no cell:
  stock's ``target * C + pred`` wraps it into another cell;
* with ``validate_args=False``, labels that are no cell of the matrix (multiclass labels outside the classes, binary
  and multilabel values other than 0 and 1 whose cell index falls outside the matrix) are dropped: stock fails in
  ``bincount``/``reshape`` (CPU) or hits a device assert;
* a label pred equal to an ``ignore_index`` outside the classes predicts no class and lands in no cell (stock:
  ``target * C + preds`` puts it into another class's cell, or fails on a negative index);
* MatthewsCorrCoef's value is always float32: stock returns its shortcuts in the matrix's dtype (int64 ``tensor(1)``
  for a perfect binary matrix, ``tensor(-1)`` for an inverted one, on 1.6 ``tensor(0)`` for a zero denominator);
* on the device path the NaN warning of ``normalize`` names no count (it is not read) and comes at the next eager
  point after the ``compute`` that found the NaN.

"""

from __future__ import annotations

import functools
from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.classification.stat_scores import (
    _cached,
    _check_binary_values,
    _count_into_state,
    _file_invalid,
    _flat_long,
    _multiclass_shape_checks,
    _multiclass_stat_scores_tensor_validation,
    _raise_not_a_class,
    _safe_divide,
    normalize_logits_if_needed,
    normalize_logits_of_kept,
)

_FUNCTIONAL = "torchmetrics.functional.classification.confusion_matrix"
_MODULE = "torchmetrics.classification.confusion_matrix"
_JACCARD = "torchmetrics.functional.classification.jaccard"
_MATTHEWS = "torchmetrics.functional.classification.matthews_corrcoef"
#: torchmetrics 1.6 sums the matrix's counts in their integer dtype and converts the sums; 1.7+ converts the cells
_SUMS_BEFORE_FLOAT = not RequirementCache("torchmetrics>=1.7.0")

#: ``normalize`` divided a row or column of zeros on the device path: the count of NaN cells is not read there
NAN_IN_NORMALIZED = _deferred.Check(
    "confusion-matrix-nan",
    "NaN values found in confusion matrix have been replaced with zeros.",
    UserWarning,
)


# --------------------------------------------------------------------------------------------------------------------
# validation


@replaces(
    f"{_FUNCTIONAL}._binary_confusion_matrix_tensor_validation",
    params=("preds", "target", "ignore_index"),
    everywhere=True,
)
def _binary_confusion_matrix_tensor_validation(
    preds: Tensor, target: Tensor, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._binary_confusion_matrix_tensor_validation")(preds, target, ignore_index)
    _check_same_shape(preds, target)
    return _check_binary_values(metric, preds, target, ignore_index, "preds")


@replaces(
    f"{_FUNCTIONAL}._multilabel_confusion_matrix_tensor_validation",
    params=("preds", "target", "num_labels", "ignore_index"),
    everywhere=True,
)
def _multilabel_confusion_matrix_tensor_validation(
    preds: Tensor, target: Tensor, num_labels: int, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multilabel_confusion_matrix_tensor_validation")(
            preds, target, num_labels, ignore_index
        )
    _check_same_shape(preds, target)
    if preds.shape[1] != num_labels:
        raise ValueError(
            "Expected both `target.shape[1]` and `preds.shape[1]` to be equal to the number of labels"
            f" but got {preds.shape[1]} and expected {num_labels}"
        )
    return _check_binary_values(metric, preds, target, ignore_index, "preds")


@replaces(
    f"{_FUNCTIONAL}._multiclass_confusion_matrix_tensor_validation",
    params=("preds", "target", "num_classes", "ignore_index"),
    everywhere=True,
)
def _multiclass_confusion_matrix_tensor_validation(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's shape checks; with a ``metric``, the stat scores' label check (a flag), as the upstream series has it.

    The patched ``MulticlassConfusionMatrix.update`` checks the labels with the clamp its counting needs
    (:func:`_multiclass_cells`); this replacement keeps the function the series changes in step with it.
    """
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multiclass_confusion_matrix_tensor_validation")(
            preds, target, num_classes, ignore_index
        )
    return _multiclass_stat_scores_tensor_validation(preds, target, num_classes, "global", ignore_index, metric=metric)


# --------------------------------------------------------------------------------------------------------------------
# counting


def _in_four_cells(
    self: Any, local: Tensor, counted: Tensor | None, invalid: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """``2 * target + pred`` kept in its four cells (binary, and each label of a multilabel update), and what counts.

    Unless validation read the values and found only 0 and 1 (or an ignore_index that is one of them), the index is
    clamped into the cells (a batch the unread flag leaves out, or ignored entries outside them); without validation
    an entry outside them counts nowhere (stock fails in ``bincount``/``reshape``; one inside them counts where stock
    counts it).
    """
    if not self.validate_args:
        cell = local.clamp(0, 3)
        inside = cell == local
        return cell, inside if counted is None else counted & inside
    if invalid is None and self.ignore_index in (None, 0, 1):  # read and valid: every entry has its cell
        return local, counted
    return local.clamp(0, 3), counted


def _cleared(mask: Tensor | None, cleared: Tensor | None) -> Tensor | None:
    """``mask & ~cleared``, either ``None`` meaning all set (``mask``) or none set (``cleared``)."""
    if cleared is None:
        return mask
    return ~cleared if mask is None else mask & ~cleared


def _count_cells(self: Any, index: Tensor, counted: Tensor | None, invalid: Tensor | None) -> None:
    """``self.confmat``'s flat cells ``index`` += 1 for each entry ``counted`` (``None``: all), then sweep.

    ``invalid`` is the validation's flag where it was not read (the device path): set, the batch weighs 0, as the
    stock validation's error leaves it out. ``index`` must be in bounds for every entry, counted or not.
    """
    if invalid is None:
        weights = None if counted is None else counted.long()
    else:
        keep = torch.pow(0, invalid)  # 1 or 0 as int64 in one op: 0 ** False == 1, 0 ** True == 0
        weights = keep.expand_as(index) if counted is None else counted * keep
    _count_into_state(self, "confmat", index, weights)
    _deferred.sweep(self)


def _binary_cells(self: Any, preds: Tensor, target: Tensor, invalid: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The cell ``2 * target + pred`` of every entry of a binary update, and which entries count.

    Ignored entries do not count; the four cells are kept by :func:`_in_four_cells`.
    """
    preds, target = preds.flatten(), _flat_long(target)
    ignore_index = self.ignore_index
    counted = None if ignore_index is None else target != ignore_index
    if preds.is_floating_point():
        preds = normalize_logits_of_kept(preds, "sigmoid", counted) > self.threshold
    return _in_four_cells(self, preds.add(target, alpha=2), counted, invalid)


def _multilabel_cells(self: Any, preds: Tensor, target: Tensor, invalid: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The cell ``4 * label + 2 * target + pred`` of every entry of a multilabel update, and which entries count.

    As :func:`_binary_cells`, per label: an entry outside its label's four cells counts nowhere (stock would count
    it in another label's cells, or fail past the last).
    """
    num_labels, ignore_index = self.num_labels, self.ignore_index
    if preds.is_floating_point():
        preds = normalize_logits_if_needed(preds, "sigmoid") > self.threshold
    preds = torch.movedim(preds, 1, -1).reshape(-1, num_labels)
    target = torch.movedim(target, 1, -1).reshape(-1, num_labels)
    counted = None if ignore_index is None else target != ignore_index
    local, counted = _in_four_cells(self, preds.add(target, alpha=2), counted, invalid)
    device = local.device
    offsets = _cached(device, ("label offsets", num_labels), lambda: torch.arange(0, 4 * num_labels, 4, device=device))
    return (local + offsets).flatten(), None if counted is None else counted.flatten()


def _multiclass_cells(self: Any, preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The cell ``target * C + pred`` of every entry of a multiclass update, which entries count, and the validation.

    Scores are argmaxed (a class). Labels are clamped into the classes: a label that clamping changes is no class.
    With ``validate_args`` a target (or label pred) that is no class and not the ignore_index is invalid: the
    stat scores' label check (:func:`_file_invalid`: raised at once where reads are free, else the returned flag
    leaves the batch out). Ignored entries do not count, nor does a label pred equal to an ignore_index outside the
    classes (it predicts no class); without validation, neither does an entry whose target or label pred is no class
    (stock's ``target * C + pred`` would land in another class's cell, or fail).
    """
    num_classes, ignore_index = self.num_classes, self.ignore_index
    scores = preds.ndim == target.ndim + 1
    if self.validate_args:
        _multiclass_shape_checks(preds, target, num_classes, "global")
    labels, flat_target = _flat_long(preds.argmax(dim=1) if scores else preds), _flat_long(target)
    rows = flat_target.clamp(0, num_classes - 1)
    target_outside = rows != flat_target
    columns = labels if scores else labels.clamp(0, num_classes - 1)
    preds_outside = None if scores else columns != labels
    kept = None if ignore_index is None else flat_target != ignore_index
    if not self.validate_args:
        return columns.add(rows, alpha=num_classes), _cleared(_cleared(kept, target_outside), preds_outside), None
    bad = target_outside if kept is None else target_outside & kept
    if preds_outside is not None and not preds.is_floating_point():  # stock checks label preds that are integers
        bad = bad | (preds_outside if ignore_index is None else preds_outside & (labels != ignore_index))
    invalid = _file_invalid(
        self, bad.any(), functools.partial(_raise_not_a_class, preds, target, num_classes, ignore_index)
    )
    # in a valid batch only ignored entries have no cell, and label preds that were not checked or that equal an
    # ignore_index outside the classes
    counted = kept
    if preds_outside is not None and (
        preds.is_floating_point() or (ignore_index is not None and not 0 <= ignore_index < num_classes)
    ):
        counted = _cleared(kept, preds_outside)
    return columns.add(rows, alpha=num_classes), counted, invalid


# --------------------------------------------------------------------------------------------------------------------
# the metrics


def _kinds(self: Any) -> tuple[_deferred.Check, ...]:
    """The checks this metric reports: one slot each, always both slots (compute groups need equal states)."""
    if getattr(self, "validate_args", False) or getattr(self, "normalize", None) not in (None, "none"):
        return (_deferred.INVALID_VALUES, NAN_IN_NORMALIZED)
    return ()


def _refresh_kinds(self: Any) -> None:
    """Keep the reported kinds in step with ``validate_args`` (a tuple comparison per update).

    CohenKappa, MatthewsCorrCoef and JaccardIndex call the confusion matrix's ``__init__`` with
    ``validate_args=False`` and set the attribute afterwards.
    """
    _deferred.keep_kinds(self, _kinds(self), size=2)


_binary_init = replaces(
    f"{_MODULE}.BinaryConfusionMatrix.__init__",
    params=("self", "threshold", "ignore_index", "normalize", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.BinaryConfusionMatrix.__init__", __name__, _kinds, size=2))
_multiclass_init = replaces(
    f"{_MODULE}.MulticlassConfusionMatrix.__init__",
    params=("self", "num_classes", "ignore_index", "normalize", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.MulticlassConfusionMatrix.__init__", __name__, _kinds, size=2))
_multilabel_init = replaces(
    f"{_MODULE}.MultilabelConfusionMatrix.__init__",
    params=("self", "num_labels", "threshold", "ignore_index", "normalize", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.MultilabelConfusionMatrix.__init__", __name__, _kinds, size=2))


@replaces(f"{_MODULE}.BinaryConfusionMatrix.update", params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    invalid = None
    if self.validate_args:
        invalid = _binary_confusion_matrix_tensor_validation(preds, target, self.ignore_index, metric=self)
    _count_cells(self, *_binary_cells(self, preds, target, invalid), invalid)


@replaces(f"{_MODULE}.MulticlassConfusionMatrix.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    index, counted, invalid = _multiclass_cells(self, preds, target)
    _count_cells(self, index, counted, invalid)


@replaces(f"{_MODULE}.MultilabelConfusionMatrix.update", params=("self", "preds", "target"), kind="metric_method")
def _multilabel_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    invalid = None
    if self.validate_args:
        invalid = _multilabel_confusion_matrix_tensor_validation(
            preds, target, self.num_labels, self.ignore_index, metric=self
        )
    _count_cells(self, *_multilabel_cells(self, preds, target, invalid), invalid)


# --------------------------------------------------------------------------------------------------------------------
# reductions (compute)


@replaces(f"{_FUNCTIONAL}._confusion_matrix_reduce", params=("confmat", "normalize"), everywhere=True)
def _confusion_matrix_reduce(confmat: Tensor, normalize: str | None = None, metric: Any = None) -> Tensor:
    """Stock's normalization with ``masked_fill`` for NaN cells.

    The NaN warning is read at once (stock's message with the count) where reads are free or without a ``metric``
    (the functional API); otherwise it is a deferred warning of ``metric``, reported at its next eager point.
    """
    allowed_normalize = ("true", "pred", "all", "none", None)
    if normalize not in allowed_normalize:
        raise ValueError(f"Argument `normalize` needs to one of the following: {allowed_normalize}")
    if normalize is None or normalize == "none":
        return confmat
    confmat = confmat if confmat.is_floating_point() else confmat.float()
    if normalize == "true":
        confmat = confmat / confmat.sum(dim=-1, keepdim=True)
    elif normalize == "pred":
        confmat = confmat / confmat.sum(dim=-2, keepdim=True)
    else:
        confmat = confmat / confmat.sum(dim=[-2, -1], keepdim=True)
    nan = torch.isnan(confmat)
    if metric is None:  # the functional interface: no metric to report through, stock's read
        _warn_nan_elements(nan)
    else:
        _refresh_kinds(metric)
        # where reads are free stock's warning at once, which counts the NaN values
        _deferred.record_in_compute(metric, NAN_IN_NORMALIZED, nan.any(), functools.partial(_warn_nan_elements, nan))
    return confmat.masked_fill(nan, 0)


def _warn_nan_elements(nan: Tensor) -> None:
    """Stock's warning of a normalized confusion matrix with NaN values (read on the host)."""
    nan_elements = int(nan.sum())
    if nan_elements:
        rank_zero_warn(f"{nan_elements} NaN values found in confusion matrix have been replaced with zeros.")


@replaces(f"{_MODULE}.BinaryConfusionMatrix.compute", params=("self",), kind="metric_method")
@replaces(f"{_MODULE}.MulticlassConfusionMatrix.compute", params=("self",), kind="metric_method")
@replaces(f"{_MODULE}.MultilabelConfusionMatrix.compute", params=("self",), kind="metric_method")
def _confusion_matrix_compute(self: Any) -> Tensor:
    """Stock's ``compute`` (the three tasks share it), with the metric that reports the NaN warning."""
    return _confusion_matrix_reduce(self.confmat, self.normalize, metric=self)


@replaces(
    f"{_JACCARD}._jaccard_index_reduce", params=("confmat", "average", "ignore_index", "zero_division"), everywhere=True
)
def _jaccard_index_reduce(
    confmat: Tensor, average: str | None, ignore_index: int | None = None, zero_division: float = 0.0
) -> Tensor:
    """Stock's reduction with ``masked_fill`` for the macro weights of classes that never occur."""
    if average != "macro" or confmat.ndim == 3:  # nothing there writes through a boolean mask
        return stock(f"{_JACCARD}._jaccard_index_reduce")(confmat, average, ignore_index, zero_division)
    confmat = confmat.float()
    ignore_index_cond = ignore_index is not None and 0 <= ignore_index < confmat.shape[0]
    num = torch.diag(confmat)
    denom = confmat.sum(0) + confmat.sum(1) - num
    jaccard = _safe_divide(num, denom, zero_division=zero_division)
    weights = torch.ones_like(jaccard)
    if ignore_index_cond:
        weights[ignore_index] = 0.0
    weights = weights.masked_fill(confmat.sum(1) + confmat.sum(0) == 0, 0.0)
    return ((weights * jaccard) / weights.sum()).sum()


def _first_match(cases: list[tuple[Tensor, Tensor]], otherwise: Tensor) -> Tensor:
    """``if c0: v0 elif c1: v1 ... else: otherwise`` on the device: a chain of ``torch.where``."""
    result = otherwise
    for condition, value in reversed(cases):
        result = torch.where(condition, value, result)
    return result


def _binary_matthews_special_cases(confmat: Tensor, numerator: Tensor, denom: Tensor) -> Tensor:
    """Stock's 2x2 branches, selected with ``torch.where`` instead of ``if``.

    Every branch (``if tp + tn != 0 and fp + fn == 0: return 1.0`` ... ``if denom == 0: ...``) is computed with
    stock's expression; the one stock takes is kept.
    """
    tn, fp, fn, tp = confmat.reshape(-1)
    eps = torch.full((), torch.finfo(torch.float32).eps, dtype=torch.float32, device=confmat.device)
    zero_denom = (tp + fp + eps) * (tp + fn + eps) * (tn + fp + eps) * (tn + fn + eps)
    zero_denom_value = _first_match(
        [
            (condition, branch_numerator / torch.sqrt(zero_denom))
            for condition, branch_numerator in (
                ((fn == 0) & (tn == 0), torch.sqrt(eps) * (tp - fp)),
                ((fp == 0) & (tn == 0), torch.sqrt(eps) * (tp - fn)),
                ((tp == 0) & (fn == 0), torch.sqrt(eps) * (tn - fp)),
                ((tp == 0) & (fp == 0), torch.sqrt(eps) * (tn - fn)),
                # unreachable in exact arithmetic (the four cases above are every way a 2x2 denominator is 0); kept
                # for float32 products that round to 0, as stock keeps them
                (tp == 0, tn - fp * fn),
                (tn == 0, tp - fp * fn),
                ((fp == 0) | (fn == 0), tp * tn),
            )
        ],
        torch.zeros_like(eps),
    )
    return _first_match(
        [
            ((tp + tn != 0) & (fp + fn == 0), torch.ones_like(eps)),
            ((tp + tn == 0) & (fp + fn != 0), -torch.ones_like(eps)),
            (denom == 0, zero_denom_value),
        ],
        numerator / torch.sqrt(denom),
    )


@replaces(f"{_MATTHEWS}._matthews_corrcoef_reduce", params=("confmat",), everywhere=True)
def _matthews_corrcoef_reduce(confmat: Tensor) -> Tensor:
    """Stock's coefficient without reading the matrix: its special cases are selected on the device.

    Deviation from stock: the result is always float32. Stock returns the matrix's dtype (int64 for the metrics)
    from its shortcuts, ``tensor(1)`` for a perfect binary matrix and ``tensor(-1)`` for an inverted one (on 1.6 also
    ``tensor(0)`` for a multiclass matrix with a zero denominator), and float32 from every other case.
    """
    confmat = confmat.sum(0) if confmat.ndim == 3 else confmat
    if _SUMS_BEFORE_FLOAT:
        tk, pk = confmat.sum(dim=-1).float(), confmat.sum(dim=-2).float()
        c, s = torch.trace(confmat).float(), confmat.sum().float()
    else:
        cells = confmat.float()
        tk, pk, c, s = cells.sum(dim=-1), cells.sum(dim=-2), torch.trace(cells), cells.sum()
    # Python's sum, as stock: its sequential float32 additions round as stock's do for large counts
    numerator = c * s - sum(tk * pk)
    denom = (s**2 - sum(pk * pk)) * (s**2 - sum(tk * tk))
    if confmat.numel() == 4:
        return _binary_matthews_special_cases(confmat, numerator, denom)
    return torch.where(denom == 0, 0.0, numerator / torch.sqrt(denom))
