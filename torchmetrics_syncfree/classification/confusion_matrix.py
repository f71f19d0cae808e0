"""Sync-free ``torchmetrics.classification.confusion_matrix``: ConfusionMatrix and the metrics built on it.

``BinaryConfusionMatrix``, ``MulticlassConfusionMatrix`` and ``MultilabelConfusionMatrix`` are the base classes of
CohenKappa, MatthewsCorrCoef and JaccardIndex (every task): they inherit its ``update``, so patching the three updates
covers all of them.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``validate_args``: ``torch.unique`` + ``if ...:``    one device flag per update, filed with the metric as a
                                                     deferred check (the stat scores' validation: raised at once
                                                     on CPU, reported at an eager point on the device path, the
                                                     invalid batch left out of the state)
``ignore_index``: ``preds[target != ii]`` (binary,   ignored entries stay in place and are routed to a dropped
multiclass), ``preds[idx] = -4 * L`` (multilabel)    cell of the count
counting: ``torch.bincount`` (reads the input's      ``scatter_add_`` into a fixed number of cells plus the dropped
max on CUDA; multilabel filters with a boolean       one (upstream's mesh ``_bincount`` in deterministic mode, on
mask first)                                          MPS and with XLA, as upstream); plain ``torch.bincount`` where
                                                     reads are free
``self.confmat += confmat``                          ``add_``: in place, as stock, so a captured CUDA graph replays
                                                     into the metric's own tensor
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

from typing import Any

import torch
from lightning_utilities.core.imports import RequirementCache
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._compat import activated
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_state_if, add_to_states
from torchmetrics_syncfree.classification.stat_scores import (
    _cached,
    _check_binary_values,
    _checked_sink,
    _confusion_bins,
    _count,
    _flat_long,
    _into_sink,
    _lean_confusion,
    _lean_counting,
    _mesh_counting,
    _multiclass_shape_checks,
    _multiclass_stat_scores_tensor_validation,
    _safe_divide,
    _scatter_counts,
    _without_invalid,
    normalize_logits_if_needed,
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
    """Stock's shape checks; with the ``metric`` whose update validates, the stat scores' label check (a flag)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multiclass_confusion_matrix_tensor_validation")(
            preds, target, num_classes, ignore_index
        )
    return _multiclass_stat_scores_tensor_validation(preds, target, num_classes, "global", ignore_index, metric=metric)


# --------------------------------------------------------------------------------------------------------------------
# counting


def _probabilities(preds: Tensor, kept: Tensor | None, normalization: str) -> Tensor:
    """Stock's ``normalize_logits_if_needed(preds[kept], normalization)`` without the boolean mask.

    Stock removes the ignored entries (``kept``: a mask that broadcasts to ``preds``) first, so only the kept ones
    decide whether ``preds`` are logits. Where reads are free stock's CPU test is used (NaN counts as outside [0, 1]),
    on the device path stock's accelerator test.
    """
    if kept is None:
        return normalize_logits_if_needed(preds, normalization)
    free = _deferred.reads_are_free(preds)
    outside = ~((preds >= 0) & (preds <= 1)) if free else (preds < 0) | (preds > 1)
    normalized = activated(preds, normalization)
    return torch.where((outside & kept).any(), normalized, preds)


def _cells(index: Tensor, dropped: Tensor | None, size: int) -> Tensor:
    """Counts of ``index`` in ``size`` cells; entries where ``dropped`` is set land in an extra cell that is cut off."""
    if dropped is None:
        return _count(index, size)
    return _count(torch.where(dropped, size, index), size + 1)[:size]


def _binary_confusion_counts(
    preds: Tensor, target: Tensor, threshold: float, ignore_index: int | None, labels_checked: bool
) -> Tensor:
    """Stock's 2x2 matrix (``bincount(target * 2 + preds)``) with fixed shapes; see the module docstring."""
    preds, target = preds.flatten(), target.flatten()
    kept = None if ignore_index is None else target != ignore_index
    if preds.is_floating_point():
        preds = _probabilities(preds, kept, "sigmoid") > threshold
    index = (target * 2 + preds).long()
    dropped = None if kept is None else ~kept
    if not labels_checked:  # values other than 0 and 1 (validate_args=False) that are no cell
        outside = (index < 0) | (index > 3)
        dropped = outside if dropped is None else dropped | outside
    return _cells(index, dropped, 4).view(2, 2)


def _multilabel_confusion_counts(
    preds: Tensor, target: Tensor, num_labels: int, threshold: float, ignore_index: int | None, labels_checked: bool
) -> Tensor:
    """Stock's ``(L, 2, 2)`` matrices (``bincount(2 * target + preds + 4 * label)``) with fixed shapes."""
    if preds.is_floating_point():
        preds = normalize_logits_if_needed(preds, "sigmoid") > threshold
    preds = torch.movedim(preds, 1, -1).reshape(-1, num_labels)
    target = torch.movedim(target, 1, -1).reshape(-1, num_labels)
    local = (2 * target + preds).long()
    dropped = None if ignore_index is None else target == ignore_index
    if not labels_checked:  # stock counts such values in another label's cells (or fails when past the last)
        outside = (local < 0) | (local > 3)
        dropped = outside if dropped is None else dropped | outside
    index = local + 4 * torch.arange(num_labels, device=local.device)
    return _cells(index.flatten(), None if dropped is None else dropped.flatten(), 4 * num_labels).view(
        num_labels, 2, 2
    )


def _lean_binary_confusion(
    preds: Tensor, target: Tensor, threshold: float, ignore_index: int | None, metric: Any | None
) -> tuple[Tensor, Tensor | None]:
    """The 2x2 matrix of scores on the device path, validation folded in (see ``_lean_confusion``).

    ``target * 2 + pred`` is a cell exactly when the target is 0 or 1: any other target lands in the sink cell, whose
    count is the validation (``keep``: the batch enters the state); ignored entries weigh 0.
    """
    preds, target = preds.flatten(), _flat_long(target)
    kept = None if ignore_index is None else target != ignore_index
    labels = _probabilities(preds, kept, "sigmoid") > threshold
    bins = _scatter_counts(_into_sink(labels.add(target, alpha=2), 4), 5, None if kept is None else kept.long())
    return bins[:4].view(2, 2), _checked_sink(metric, bins[4])


def _lean_multilabel_confusion(
    preds: Tensor, target: Tensor, num_labels: int, threshold: float, ignore_index: int | None, metric: Any | None
) -> tuple[Tensor, Tensor | None]:
    """The ``(L, 2, 2)`` matrices of scores on the device path: each label's four cells and its sink cell."""
    labels = normalize_logits_if_needed(preds, "sigmoid") > threshold
    labels = torch.movedim(labels, 1, -1).reshape(-1, num_labels)
    target = torch.movedim(target, 1, -1).reshape(-1, num_labels)
    weights = None if ignore_index is None else (target != ignore_index).long().flatten()
    local = _into_sink(labels.add(target, alpha=2), 4)
    device = local.device
    offsets = _cached(device, ("label offsets", num_labels), lambda: torch.arange(0, 5 * num_labels, 5, device=device))
    bins = _scatter_counts((local + offsets).flatten(), 5 * num_labels, weights).view(num_labels, 5)
    return bins[:, :4].view(num_labels, 2, 2), _checked_sink(metric, bins[:, 4].sum())


def _multiclass_confusion_counts(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None, labels_checked: bool
) -> Tensor:
    """Stock's ``(C, C)`` matrix, counted as the stat scores count it (:func:`_confusion_bins`)."""
    if preds.ndim == target.ndim + 1:
        preds = preds.argmax(dim=1)
    confmat, _ = _confusion_bins(preds, target, num_classes, ignore_index, labels_checked)
    return confmat[:, :num_classes] if confmat.shape[1] != num_classes else confmat


# --------------------------------------------------------------------------------------------------------------------
# the metrics


def _kinds(self: Any) -> tuple[_deferred.Check, ...]:
    """The checks this metric reports: one slot each, always both slots (compute groups need equal states)."""
    if getattr(self, "validate_args", False) or getattr(self, "normalize", None) not in (None, "none"):
        return (_deferred.INVALID_VALUES, NAN_IN_NORMALIZED)
    return ()


def _confmat_update(self: Any, invalid: Tensor | None, confmat: Tensor) -> None:
    (confmat,) = _without_invalid(invalid, confmat)
    add_to_states(self, ("confmat",), (confmat,))
    _deferred.sweep(self)


def _refresh_kinds(self: Any) -> None:
    """Keep the reported kinds in step with ``validate_args`` (a tuple comparison per update).

    CohenKappa, MatthewsCorrCoef and JaccardIndex call the confusion matrix's ``__init__`` with
    ``validate_args=False`` and set the attribute afterwards.
    """
    _deferred.keep_kinds(self, _kinds(self), size=2)


def _labels_checked(self: Any, target: Tensor) -> bool:
    """Whether this update's validation has read the labels (so the counting needs no masks for invalid ones)."""
    return self.validate_args and _deferred.reads_are_free(target)


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


def _add_counts(self: Any, confmat: Tensor, keep: Tensor | None) -> None:
    """Add a lean update's counts (``keep``: the batch passed validation; ``None``: not validated), then sweep."""
    if keep is None:
        add_to_states(self, ("confmat",), (confmat,))
    else:
        add_to_state_if(self, "confmat", confmat, keep)
    _deferred.sweep(self)


def _lean_scores(self: Any, preds: Tensor, target: Tensor) -> bool:
    """Whether a binary/multilabel update counts on the lean path: the device path, scores, validated shapes."""
    if not preds.is_floating_point() or _deferred.reads_are_free(target) or _mesh_counting() or target.is_mps:
        return False
    if self.validate_args:
        _check_same_shape(preds, target)
    return True


@replaces(f"{_MODULE}.BinaryConfusionMatrix.update", params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    if _lean_scores(self, preds, target):
        checked = self if self.validate_args else None
        _add_counts(self, *_lean_binary_confusion(preds, target, self.threshold, self.ignore_index, checked))
        return
    invalid = None
    if self.validate_args:
        invalid = _binary_confusion_matrix_tensor_validation(preds, target, self.ignore_index, metric=self)
    confmat = _binary_confusion_counts(preds, target, self.threshold, self.ignore_index, _labels_checked(self, target))
    _confmat_update(self, invalid, confmat)


@replaces(f"{_MODULE}.MulticlassConfusionMatrix.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    if _lean_counting(preds, target):
        checked = self if self.validate_args else None
        if checked is not None:
            _multiclass_shape_checks(preds, target, self.num_classes, "global")
        _add_counts(self, *_lean_confusion(preds, target, self.num_classes, self.ignore_index, checked))
        return
    invalid = None
    if self.validate_args:
        invalid = _multiclass_confusion_matrix_tensor_validation(
            preds, target, self.num_classes, self.ignore_index, metric=self
        )
    confmat = _multiclass_confusion_counts(
        preds, target, self.num_classes, self.ignore_index, _labels_checked(self, target)
    )
    _confmat_update(self, invalid, confmat)


@replaces(f"{_MODULE}.MultilabelConfusionMatrix.update", params=("self", "preds", "target"), kind="metric_method")
def _multilabel_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    if preds.ndim >= 2 and preds.shape[1] == self.num_labels and _lean_scores(self, preds, target):
        checked = self if self.validate_args else None
        _add_counts(
            self,
            *_lean_multilabel_confusion(preds, target, self.num_labels, self.threshold, self.ignore_index, checked),
        )
        return
    invalid = None
    if self.validate_args:
        invalid = _multilabel_confusion_matrix_tensor_validation(
            preds, target, self.num_labels, self.ignore_index, metric=self
        )
    confmat = _multilabel_confusion_counts(
        preds, target, self.num_labels, self.threshold, self.ignore_index, _labels_checked(self, target)
    )
    _confmat_update(self, invalid, confmat)


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
    if metric is None or _deferred.reads_are_free(confmat):
        nan_elements = int(nan.sum())
        if nan_elements:
            rank_zero_warn(f"{nan_elements} NaN values found in confusion matrix have been replaced with zeros.")
    else:
        _refresh_kinds(metric)
        _deferred.record_in_compute(metric, NAN_IN_NORMALIZED, nan.any())
    return confmat.masked_fill(nan, 0)


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
