"""Sync-free ``torchmetrics.classification``: Accuracy, Precision, Recall, F1Score/FBetaScore, Specificity, StatScores.

Every one of these metrics (binary, multiclass, multilabel) is a ``_AbstractStatScores``: its ``update`` is the
``*StatScores.update`` of its task and its ``compute`` reduces the four counters with ``_safe_divide`` and
``_adjust_weights_safe_divide``. Patching those shared pieces covers all of them (and the other stat-score metrics
built on the same base, e.g. HammingDistance, NegativePredictiveValue).

Where stock TorchMetrics synchronizes (see ``shared/reference/findings.md``) and what replaces it:

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``_safe_divide``: ``torch.tensor(zd).to(dev)``       ``torch.full((), zd, device=dev)``: a kernel argument
(1.6-1.8, a host-to-device copy)
``_adjust_weights_safe_divide``:                     ``masked_fill`` (same values, no data-dependent shape)
``weights[mask] = 0.0``
multiclass macro/weighted/none ``update``:           O(batch + classes): two fixed-shape ``put_`` counts into
``torch.bincount`` of ``target * C + preds`` into    ``3 * (C + 1)`` cells, hits and misses per target class and
``C**2`` cells (reads the input's max on CUDA;       predictions per class, with a sink for labels that are no
80 GB of counts at 100000 classes)                   class; tp/fp/tn/fn by difference (``_class_counts``). On
                                                     MPS and with XLA upstream's ``_bincount`` mesh path (fixed
                                                     shapes as well) is used, as upstream does
``ignore_index``: ``preds[target != ii]`` (multi-    ignored entries stay in place: masked out of the sums
class), ``target[idx] = -1`` (binary/multilabel),    (micro), weight 0 in the per-class counts (multiclass),
``target_oh[mask, :] = -1`` (top_k > 1/samplewise)   ``masked_fill`` (binary/multilabel)
``validate_args``: ``torch.unique`` + ``if ...:``    value checks computed on the device into one flag per
                                                     update, a deferred check (``_deferred.record``): raised at
                                                     once on CPU; on the device path the invalid batch is left
                                                     out and reported at an eager point
``top_k > 1`` and samplewise: one-hot encodings of   the same counting in O(entries x top_k + classes): an
preds and target, ``batch x C`` each (checks         entry predicts its target where the target is among its
min/max on the host on CPU; device assert on CUDA)   ``top_k`` scores, else its top score (stock's refined
                                                     one-hot, as labels); samplewise, each sample counted in
                                                     its own cells. XLA/MPS: one-hot by comparison with
                                                     ``arange(C)``
stock ``_update_state`` (1.7+): ``self.tp + tp``     in place (``add_``): a captured CUDA graph replays into the
                                                     metric's own tensors
``normalize_logits_if_needed`` on CPU:               the device path (``torch.where``) whenever a CPU
``if not torch.all(0 <= x <= 1)``                    ``SyncProbe`` simulates a GPU; on a real GPU stock already
                                                     takes that path and on plain CPU the read is free, so
                                                     stock's code runs there
==================================================  ===========================================================

On CPU nothing needs avoiding: reading a value is free (:func:`torchmetrics_syncfree._deferred.reads_are_free`, false
while a CPU ``SyncProbe`` simulates a GPU). The CPU path keeps the same results and checks at stock's host time or
less: multiclass labels are checked with one ``aminmax`` read at once (with score ``preds`` the counting's sink
counts the targets that are no class, read once at the update's end, before the state changes); labels checked that
way need no validity mask.

The patched ``*StatScores.update`` passes the metric to the validation functions (``metric=``, as the upstream series
does), which file the check with it and return the device flag; the update zeroes the batch's counts when it is set
and ends with :func:`torchmetrics_syncfree._deferred.sweep`. ``_create_state`` adds the check counters; ``compute()``
and ``reset()`` report through the patched ``Metric`` (:mod:`torchmetrics_syncfree.metric`). The functional API
(``multiclass_accuracy(...)``) has no metric: its validation is stock's (with its host reads), everything else is
the sync-free code above. Every patched update traces under ``torch.compile(fullgraph=True)``.

Deliberate deviations from stock (tested in ``tests/test_classification_parity.py``):

* multiclass validation checks the documented contract, every non-ignored label in ``[0, num_classes)`` (``preds``
  too when it holds labels), instead of counting distinct values: stock lets ``target=[0, 7]`` with 5 classes pass
  and, because of an operator-precedence slip, never validates ``target`` at all when ``preds`` holds scores. The
  exception type is stock's (``RuntimeError``); its message is stock's where stock would also have raised;
* with ``validate_args=False``, out-of-range multiclass labels are dropped from the per-class counts (macro,
  weighted, none, ``top_k > 1``, samplewise; stock fails in ``reshape``/``one_hot`` or silently counts them in the
  wrong cell; on CUDA ``one_hot`` hits a device assert); micro averaging counts them as misses, like stock;
* with ``top_k > 1`` and inputs of more than one position per sample (``(N, C, ...)`` scores), TorchMetrics 1.6
  fails in ``scatter_`` (its top-k refinement squeezes the inputs); the layer counts them as 1.7 and later do;
* NaN in a float multiclass target is no class label: validation rejects it like any other (stock counts it as a
  miss in micro averaging and wraps it into some cell of its confusion matrix);
* a label ``pred`` equal to an ``ignore_index`` outside the classes predicts no class: a miss of the target's class
  (fn), no class's fp. Stock ignores entries by their target only; its micro counts agree, its confusion matrix
  wraps ``target * C + preds`` into another class's cell (or fails on a negative index);
* on the device path a validation error surfaces after the offending update has returned (the batch is left out of
  the state; with ``multidim_average="samplewise"`` its rows stay in the list state with zero counts, because the
  list's length is fixed on the host), with a message that names the problem rather than the values.

"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.classification.stat_scores import (
    _binary_stat_scores_update,
    _multiclass_stat_scores_format,
    _multilabel_stat_scores_update,
    _refine_preds_oh,
)
from torchmetrics.utilities import rank_zero_warn
from torchmetrics.utilities.checks import _check_same_shape
from torchmetrics.utilities.data import _bincount, select_topk
from torchmetrics.utilities.imports import _XLA_AVAILABLE

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._compat import FOREACH_MUL_BY_TENSOR, activated
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_states, read_only

_COMPUTE = "torchmetrics.utilities.compute"
_FUNCTIONAL = "torchmetrics.functional.classification.stat_scores"
_MODULE = "torchmetrics.classification.stat_scores"
_BINARY_UPDATE = f"{_MODULE}.BinaryStatScores.update"
_MULTICLASS_UPDATE = f"{_MODULE}.MulticlassStatScores.update"
_MULTILABEL_UPDATE = f"{_MODULE}.MultilabelStatScores.update"
_ZERO_DIVISION_WARNING = "Detected zero division in _safe_divide. Setting 0/0 to 0.0"


# --------------------------------------------------------------------------------------------------------------------
# torchmetrics.utilities.compute


def _warn_zero_division() -> None:
    rank_zero_warn(_ZERO_DIVISION_WARNING)


@replaces(f"{_COMPUTE}._safe_divide", params=("num", "denom", "zero_division"), everywhere=True)
def _safe_divide(num: Tensor, denom: Tensor, zero_division: float | str = 0.0) -> Tensor:
    """Stock's ``_safe_divide`` without the host-to-device copy of ``zero_division``.

    ``"warn"`` reads whether a denominator is zero at once, as stock does (no stat-score metric passes it; the
    functional interface has no later point to report at). ``"nan"`` (and anything else that is neither a number
    nor ``"warn"``) divides plainly (``0/0 = nan``, ``x/0 = inf``), as in stock from 1.7 on.
    """
    num = num if num.is_floating_point() else num.float()
    denom = denom if denom.is_floating_point() else denom.float()
    if not isinstance(zero_division, (float, int)):
        if zero_division != "warn":
            return torch.true_divide(num, denom)
        if (denom == 0).any():
            _warn_zero_division()
        zero_division = 0.0
    fill = torch.full((), zero_division, dtype=num.dtype, device=num.device)
    return torch.where(denom != 0, num / denom, fill)


@replaces(
    f"{_COMPUTE}._adjust_weights_safe_divide",
    params=("score", "average", "multilabel", "tp", "fp", "fn", "top_k"),
    everywhere=True,
)
def _adjust_weights_safe_divide(
    score: Tensor, average: str | None, multilabel: bool, tp: Tensor, fp: Tensor, fn: Tensor, top_k: int = 1
) -> Tensor:
    """Average per-class scores; classes absent from preds and target get weight 0 (``masked_fill``, no mask write)."""
    if average is None or average == "none":
        return score
    if average == "weighted":
        weights = tp + fn
    else:
        weights = torch.ones_like(score)
        if not multilabel:
            weights = weights.masked_fill(tp + fp + fn == 0 if top_k == 1 else tp + fn == 0, 0.0)
    return _safe_divide(weights * score, weights.sum(-1, keepdim=True)).sum(-1)


_NORMALIZE_LOGITS = f"{_COMPUTE}.normalize_logits_if_needed"


@replaces(_NORMALIZE_LOGITS, params=("tensor", "normalization"), everywhere=True)
def normalize_logits_if_needed(tensor: Tensor, normalization: str | None) -> Tensor:
    """Apply sigmoid/softmax if any value is outside [0, 1] (:func:`normalize_logits_of_kept` of every entry)."""
    return normalize_logits_of_kept(tensor, normalization) if normalization else tensor


def normalize_logits_of_kept(
    tensor: Tensor, normalization: str, kept: Tensor | None = None, ignored: Tensor | None = None
) -> Tensor:
    """Apply ``normalization`` to ``tensor`` if any entry that counts is outside [0, 1]: one test for every metric.

    Stock removes the entries that do not count first (``tensor[kept]``, a data-dependent shape) and then runs
    ``normalize_logits_if_needed``; here a mask that broadcasts to ``tensor`` says which count: ``kept``, or its
    complement ``ignored`` (whichever the caller has: no negation), or neither (every entry counts).

    Stock's function is itself two tests: on a CPU it reads ``torch.all((tensor >= 0) * (tensor <= 1))`` (NaN counts
    as outside [0, 1]), on accelerators it chooses on the device with ``torch.where`` (NaN counts as inside). Both are
    kept: where reads are free the CPU test, read from one reduction (:func:`_in_unit_interval`; the activation only
    where needed); elsewhere the accelerator's.
    """
    if _deferred.reads_are_free(tensor):
        if kept is not None:
            tensor_kept = torch.where(kept, tensor, 0.5)  # the others stand in as 0.5, inside [0, 1]
        else:
            tensor_kept = tensor if ignored is None else torch.where(ignored, 0.5, tensor)
        return tensor if _in_unit_interval(tensor_kept) else activated(tensor, normalization)
    outside = (tensor < 0) | (tensor > 1)
    if kept is not None:
        outside &= kept
    elif ignored is not None:
        outside.gt_(ignored)  # outside and not ignored
    return torch.where(outside.any(), activated(tensor, normalization), tensor)


def _in_unit_interval(tensor: Tensor) -> bool:
    """Stock's CPU logits test ``torch.all((tensor >= 0) * (tensor <= 1))``, read from one ``aminmax`` (four ops less).

    ``aminmax`` propagates NaN, which then fails both comparisons as it fails stock's. Half tensors are compared in
    float32 (exact; torch 2.0 has no half ``aminmax`` on the CPU).
    """
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor.float() if tensor.dtype == torch.float16 else tensor)
    return low.item() >= 0 and high.item() <= 1


# --------------------------------------------------------------------------------------------------------------------
# validation: device flags instead of torch.unique + host checks


def _file_invalid(metric: Any, flag: Tensor, raise_at_once: Callable[[], None]) -> Tensor | None:
    """File the validation ``flag`` of ``metric``'s update (``raise_at_once``: stock's error where reads are free).

    Returns:
        The flag where it is not read, for the update to leave the batch out of the state when it is set; ``None``
        when the batch is known to be valid.

    """
    return flag if _deferred.record(metric, _deferred.INVALID_VALUES, flag, raise_at_once) else None


def _outside(values: Tensor, allowed: tuple[int, ...], ignore_index: int | None = None) -> Tensor:
    """Bool mask of the entries of ``values`` that are none of ``allowed`` (and not ``ignore_index``)."""
    mask = values != allowed[0]
    for value in allowed[1:] + (() if ignore_index is None else (ignore_index,)):
        mask &= values != value
    return mask


def _raise_not_binary(preds: Tensor, target: Tensor, ignore_index: int | None, preds_name: str) -> None:
    """Stock's error for non-{0,1} values (runs only on error: listing the values may sync)."""
    if _outside(target, (0, 1), ignore_index).any():
        raise RuntimeError(
            f"Detected the following values in `target`: {torch.unique(target)} but expected only"
            f" the following values {[0, 1] if ignore_index is None else [ignore_index]}."
        )
    raise RuntimeError(
        f"Detected the following values in `preds`: {torch.unique(preds)} but expected only"
        f" the following values [0,1] since {preds_name} is a label tensor."
    )


def _check_binary_values(
    metric: Any, preds: Tensor, target: Tensor, ignore_index: int | None, preds_name: str
) -> Tensor | None:
    """File one device flag for "target (and label preds) hold only 0, 1 (or ignore_index)"."""
    flag = _outside(target, (0, 1), ignore_index).any()
    if not preds.is_floating_point():
        flag = flag | _outside(preds, (0, 1)).any()
    return _file_invalid(metric, flag, functools.partial(_raise_not_binary, preds, target, ignore_index, preds_name))


@replaces(
    f"{_FUNCTIONAL}._binary_stat_scores_tensor_validation",
    params=("preds", "target", "multidim_average", "ignore_index"),
    everywhere=True,
)
def _binary_stat_scores_tensor_validation(
    preds: Tensor,
    target: Tensor,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    metric: Any = None,
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._binary_stat_scores_tensor_validation")(
            preds, target, multidim_average, ignore_index
        )
    _check_same_shape(preds, target)
    if multidim_average != "global" and preds.ndim < 2:
        raise ValueError("Expected input to be at least 2D when multidim_average is set to `samplewise`")
    return _check_binary_values(metric, preds, target, ignore_index, "`preds`")


@replaces(
    f"{_FUNCTIONAL}._multilabel_stat_scores_tensor_validation",
    params=("preds", "target", "num_labels", "multidim_average", "ignore_index"),
    everywhere=True,
)
def _multilabel_stat_scores_tensor_validation(
    preds: Tensor,
    target: Tensor,
    num_labels: int,
    multidim_average: str,
    ignore_index: int | None = None,
    metric: Any = None,
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multilabel_stat_scores_tensor_validation")(
            preds, target, num_labels, multidim_average, ignore_index
        )
    _check_same_shape(preds, target)
    if preds.shape[1] != num_labels:
        raise ValueError(
            "Expected both `target.shape[1]` and `preds.shape[1]` to be equal to the number of labels"
            f" but got {preds.shape[1]} and expected {num_labels}"
        )
    if multidim_average != "global" and preds.ndim < 3:
        raise ValueError("Expected input to be at least 3D when multidim_average is set to `samplewise`")
    return _check_binary_values(metric, preds, target, ignore_index, "preds")


def _not_a_class(labels: Tensor, num_classes: int, ignore_index: int | None) -> Tensor:
    """Bool mask of labels outside ``[0, num_classes)`` that are not ``ignore_index`` (NaN in a float target too).

    A label is a class exactly when clamping it to the classes leaves it as it is (NaN: ``NaN != NaN``): two ops.
    A dtype that cannot hold ``num_classes - 1`` (int8 labels of 200 classes) or that clamp does not take (bool) is
    compared as int64 instead (the clamp's bound would not fit in it).
    """
    if labels.is_floating_point() or (labels.dtype != torch.bool and num_classes - 1 <= torch.iinfo(labels.dtype).max):
        mask = labels.clamp(0, num_classes - 1) != labels
    else:  # bool labels, or a dtype too narrow for the bound: compared as int64
        mask = (labels < 0) | (labels.long() >= num_classes)
    return mask if ignore_index is None else mask & (labels != ignore_index)


def _raise_not_a_class(preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None) -> None:
    """Stock's message where stock would have raised too (too many distinct values), else one naming the values."""
    check_value = num_classes if ignore_index is None else num_classes + 1
    labels = ((target, "target"),) + (() if preds.is_floating_point() else ((preds, "preds"),))
    for values, name in labels:
        if not _not_a_class(values, num_classes, ignore_index).any():
            continue
        found = torch.unique(values)
        if len(found) > check_value:
            raise RuntimeError(
                f"Detected more unique values in `{name}` than expected. Expected only {check_value} but found"
                f" {len(found)} in `{name}`. Found values: {found}."
            )
        allowed = f"[0, {num_classes - 1}]" + ("" if ignore_index is None else f" or the ignore_index {ignore_index}")
        raise RuntimeError(
            f"Detected the following values in `{name}`: {found} but expected only class labels in {allowed}."
        )
    raise RuntimeError(  # the tensors were changed in place after the update: name the problem anyway
        f"Detected values outside [0, {num_classes - 1}] in `target` or `preds` (ignore_index={ignore_index})."
    )


@replaces(
    f"{_FUNCTIONAL}._multiclass_stat_scores_tensor_validation",
    params=("preds", "target", "num_classes", "multidim_average", "ignore_index"),
    everywhere=True,
)
def _multiclass_stat_scores_tensor_validation(
    preds: Tensor,
    target: Tensor,
    num_classes: int | None,
    multidim_average: str = "global",
    ignore_index: int | None = None,
    metric: Any = None,
) -> Tensor | None:
    """Stock's shape checks (host-only), plus the value check.

    With the ``metric`` whose update validates, labels outside ``[0, num_classes)`` are one device flag (returned).
    """
    if metric is None or num_classes is None:
        return stock(f"{_FUNCTIONAL}._multiclass_stat_scores_tensor_validation")(
            preds, target, num_classes, multidim_average, ignore_index
        )
    _multiclass_shape_checks(preds, target, num_classes, multidim_average)
    flag = _not_a_class(target, num_classes, ignore_index).any()
    if not preds.is_floating_point():
        flag = flag | _not_a_class(preds, num_classes, ignore_index).any()
    return _file_invalid(metric, flag, functools.partial(_raise_not_a_class, preds, target, num_classes, ignore_index))


def _multiclass_shape_checks(preds: Tensor, target: Tensor, num_classes: int, multidim_average: str) -> None:
    """The host-only part of stock's multiclass validation: shapes and dimensions."""
    if preds.ndim == target.ndim + 1:
        if not preds.is_floating_point():
            raise ValueError("If `preds` have one dimension more than `target`, `preds` should be a float tensor.")
        if preds.shape[1] != num_classes:
            raise ValueError(
                "If `preds` have one dimension more than `target`, `preds.shape[1]` should be"
                " equal to number of classes."
            )
        if preds.shape[2:] != target.shape[1:]:
            raise ValueError(
                "If `preds` have one dimension more than `target`, the shape of `preds` should be"
                " (N, C, ...), and the shape of `target` should be (N, ...)."
            )
        if multidim_average != "global" and preds.ndim < 3:
            raise ValueError(
                "If `preds` have one dimension more than `target`, the shape of `preds` should be"
                " at least 3D when multidim_average is set to `samplewise`"
            )
    elif preds.ndim == target.ndim:
        if preds.shape != target.shape:
            raise ValueError(
                "The `preds` and `target` should have the same shape,"
                f" got `preds` with shape={preds.shape} and `target` with shape={target.shape}."
            )
        if multidim_average != "global" and preds.ndim < 2:
            raise ValueError(
                "When `preds` and `target` have the same shape, the shape of `preds` should be"
                " at least 2D when multidim_average is set to `samplewise`"
            )
    else:
        raise ValueError(
            "Either `preds` and `target` both should have the (same) shape (N, ...), or `target` should be (N, ...)"
            " and `preds` should be (N, C, ...)."
        )


# --------------------------------------------------------------------------------------------------------------------
# formatting and counting


def _ignored_to_minus_one(target: Tensor, ignore_index: int | None) -> Tensor:
    """Stock's ``target[target == ignore_index] = -1`` on a copy, without a boolean-mask write."""
    return target if ignore_index is None else target.masked_fill(target == ignore_index, -1)


def _threshold(preds: Tensor, threshold: float) -> Tensor:
    return normalize_logits_if_needed(preds, "sigmoid") > threshold if preds.is_floating_point() else preds


@replaces(
    f"{_FUNCTIONAL}._binary_stat_scores_format",
    params=("preds", "target", "threshold", "ignore_index"),
    everywhere=True,
)
def _binary_stat_scores_format(
    preds: Tensor, target: Tensor, threshold: float = 0.5, ignore_index: int | None = None
) -> tuple[Tensor, Tensor]:
    preds = _threshold(preds, threshold)
    return preds.reshape(preds.shape[0], -1), _ignored_to_minus_one(target.reshape(target.shape[0], -1), ignore_index)


@replaces(
    f"{_FUNCTIONAL}._multilabel_stat_scores_format",
    params=("preds", "target", "num_labels", "threshold", "ignore_index"),
    everywhere=True,
)
def _multilabel_stat_scores_format(
    preds: Tensor, target: Tensor, num_labels: int, threshold: float = 0.5, ignore_index: int | None = None
) -> tuple[Tensor, Tensor]:
    preds = _threshold(preds, threshold)
    preds = preds.reshape(*preds.shape[:2], -1)
    return preds, _ignored_to_minus_one(target.reshape(*target.shape[:2], -1), ignore_index)


def _one_hot(labels: Tensor, num_classes: int) -> Tensor:
    """``torch.nn.functional.one_hot`` without its host-side range check (out-of-range labels give a zero row)."""
    return (labels.unsqueeze(-1) == torch.arange(num_classes, device=labels.device)).long()


#: read once: a ``RequirementCache`` looks up package metadata when asked, which ``torch.compile`` cannot trace
_XLA = bool(_XLA_AVAILABLE)


def _mesh_counting() -> bool:
    """Where upstream's ``_bincount`` counts with a fixed-shape mesh instead of ``torch.bincount`` (besides MPS)."""
    return torch.are_deterministic_algorithms_enabled() or _XLA


def _count(index: Tensor, size: int) -> Tensor:
    """``torch.bincount(index, minlength=size)`` for ``0 <= index < size``, with a fixed output shape."""
    if _mesh_counting() or index.is_mps:
        return _bincount(index, minlength=size)  # upstream's fixed-shape fallback for these cases
    if _deferred.reads_are_free(index):  # CPU bincount reads the maximum for free: one op, 1 us less than the scatter
        return torch.bincount(index, minlength=size)
    return torch.zeros(size, dtype=torch.long, device=index.device).scatter_add_(0, index, torch.ones_like(index))


def _confusion_bins(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None, labels_checked: bool = False
) -> tuple[Tensor, Tensor | None]:
    """The confusion matrix (rows: target, columns: preds) counted into fixed cells, and the number of entries counted.

    Counted into ``C**2`` cells plus one dropped cell that takes ignored entries and labels outside the classes. With
    ``labels_checked`` every label not equal to ``ignore_index`` is known to be a class, so only ignored entries need
    routing to the dropped cell (none without ``ignore_index``; the count is then ``preds.numel()``, returned as
    ``None``).

    An ``ignore_index`` outside the classes adds a column: a label pred equal to it predicts no class, a miss of the
    target's class that no class predicted: stock's ``target * C + preds`` wraps it into another cell.
    """
    preds, target = _flat_long(preds), _flat_long(target)
    ignored_pred_column = ignore_index is not None and not 0 <= ignore_index < num_classes
    width = num_classes + 1 if ignored_pred_column else num_classes
    cells = num_classes * width
    if labels_checked and ignore_index is None:
        bins, counted = _count(preds.add(target, alpha=width), cells), None
    else:
        if labels_checked:
            dropped = target == ignore_index
        elif ignored_pred_column:  # labels outside the classes (validate_args=False), except no-class preds
            dropped = _not_a_class(target, num_classes, None) | _not_a_class(preds, num_classes, ignore_index)
        else:
            dropped = (torch.minimum(target, preds) < 0) | (torch.maximum(target, preds) >= num_classes)
            if ignore_index is not None:  # one of the classes
                dropped |= target == ignore_index
        if ignored_pred_column:
            preds = preds.masked_fill(preds == ignore_index, num_classes)
        index = preds.add(target, alpha=width)  # target * width + preds in one op
        bins = _count(torch.where(dropped, cells, index), cells + 1)[:cells]
        counted = bins.sum()
    return bins.view(num_classes, width), counted


#: small constants per (device, key): expanded unit weights and label offsets of the counting scatters, made once
#: instead of a fill kernel per update
_constants: dict[tuple[torch.device, Any], Tensor] = {}


def _cached(device: torch.device, key: Any, make: Callable[[], Tensor]) -> Tensor:
    """The constant ``make()``, made once per device and ``key``.

    Made anew where none may be kept: while dynamo traces (the compiled graph makes its own) or while a CUDA graph is
    captured (a tensor made then belongs to the graph's memory pool; one made before is used as it is).
    """
    if _deferred.is_compiling():
        return make()
    found = _constants.get((device, key))
    if found is None:
        found = make()
        # ``Tensor.is_cuda``, not ``device.type``: this runs every update, and the latter costs four times as much
        if not (found.is_cuda and torch.cuda.is_current_stream_capturing()):
            _constants[device, key] = found
    return found


def _unit_weights(index: Tensor) -> Tensor:
    """Ones shaped as ``index`` (int64): a view of a cached 1-element tensor (no kernel launch once cached)."""
    device = index.device
    # ``expand_as``: half the host time of ``expand(index.shape)`` (no ``torch.Size`` made), and this runs every update
    return _cached(device, "unit", lambda: torch.ones(1, dtype=torch.long, device=device)).expand_as(index)


def _clamped_to_sinks(target: Tensor, num_classes: int) -> Tensor:
    """``target`` with every label below the classes made -1 and every one above made ``num_classes``.

    ``target * C + pred`` must leave the cells ``[0, C**2)`` exactly for a target that is no class; a huge int64
    target would wrap around instead (``4 * 2**62 == 0`` in int64) and count as class 0.
    """
    return target.clamp(-1, num_classes)


def _put_counts(index: Tensor, size: int, weights: Tensor | None) -> Tensor:
    """Counts of ``index`` (int64, in ``[-1, size)``) in ``size`` cells, weighted (``None``: unit weights).

    -1 counts in the last cell (``put_`` wraps it).

    One kernel on CUDA (an atomic add per entry, as ``scatter_add_``); not taken in deterministic mode, where
    ``put_`` sorts (the callers count with upstream's mesh there).
    """
    weights = _unit_weights(index) if weights is None else weights
    return torch.zeros(size, dtype=torch.long, device=index.device).put_(index, weights, accumulate=True)


def _count_into_state(metric: Any, name: str, index: Tensor, weights: Tensor | None) -> None:
    """``metric.<name>``'s flat cells ``index`` (int64, all in bounds) += ``weights`` (int64; ``None``: ones).

    One ``put_`` into the state itself: nothing the size of the state is allocated per update (a ``C x C`` confusion
    matrix at 10000 classes is 800 MB), and a captured CUDA graph replays into the metric's own tensor. A state that
    is read-only (:func:`~torchmetrics_syncfree._states.read_only`) is replaced by the out-of-place ``put``. Where
    upstream counts with its fixed-shape mesh (:func:`_mesh_counting`, MPS) the mesh counts and the counts are added.
    """
    state = getattr(metric, name)
    if _mesh_counting() or index.is_mps:
        if weights is not None:  # entries that weigh 0 go to an extra cell, cut off
            index = torch.where(weights.bool(), index, state.numel())
        add_to_states(metric, (name,), (_bincount(index, minlength=state.numel() + 1)[:-1].view(state.shape),))
        return
    weights = _unit_weights(index) if weights is None else weights
    if read_only(state):
        setattr(metric, name, state.put(index, weights, accumulate=True))
    else:
        state.put_(index, weights, accumulate=True)


def _checked_sink(
    metric: Any | None, invalid: Tensor, report_at_once: Callable[[], None] | None = None
) -> Tensor | None:
    """With ``metric`` (``validate_args``): file the count of invalid entries and return ``keep``.

    The count is an error's: any positive count raises once at the next eager point (where reads are free: at once,
    by ``report_at_once`` where given: stock's error). ``keep`` (a 0-dim bool: no invalid entry) leaves the batch out
    of the state.
    """
    if metric is None:
        return None
    _deferred.record(metric, _deferred.INVALID_VALUES, invalid, report_at_once)
    return invalid.eq(0)


def _class_counts(
    labels: Tensor,
    target: Tensor,
    num_classes: int,
    ignore_index: int | None,
    checked: bool,
    from_scores: bool,
    samplewise: bool = False,
) -> tuple[Tensor, Tensor]:
    """tp/fp/tn/fn per class as one ``(4, C)`` block, counted in O(entries + classes), and the count of bad targets.

    Two fixed-shape ``put_`` counts into one buffer of ``3 * (C + 1)`` cells: ``2 * target + hit`` (rows: target class,
    columns: miss, hit; row ``C`` is the sink of targets that are no class, clamped into it or counted back from the
    end as Python does) and the predicted labels (cell ``C``: the sink of labels that predict no class). Then
    ``tp`` is the hits, ``fn`` the misses, ``fp`` the predictions that missed, and ``tn`` what the other three leave
    of the entries counted. Nothing is ``C x C``: a ``(C, C)`` confusion matrix of 100000 classes is 80 GB.

    Args:
        labels: predicted class labels.
        target: target labels.
        num_classes: the classes ``C``.
        ignore_index: entries whose target it is weigh 0 (they are in no count).
        checked: the batch is valid, or is left out whole when it is not (validated): only ignored entries weigh 0.
            Unchecked (``validate_args=False``), an entry whose target or label is no class is in no count (a label
            equal to an ``ignore_index`` outside the classes predicts no class: a miss of its target, no class's fp).
        from_scores: ``labels`` is an argmax over the classes (or a top-k pick), a class each.
        samplewise: ``labels`` and ``target`` are ``(N, ...)``: each sample is counted in its own ``3 * (C + 1)``
            cells, and the block is ``(4, N, C)``.

    Returns:
        The ``(4, C)`` block (rows tp, fp, tn, fn) and, 0-dim (``(N,)`` samplewise), the number of entries whose
        target is no class (with ``from_scores``, where no label can equal such a target; of the entries that weigh 1).

    """
    samples = target.shape[0] if samplewise else 1
    labels, target = _flat_long(labels), _flat_long(target)
    width = num_classes + 1
    every_entry_counts = checked and ignore_index is None
    if every_entry_counts:
        weights = _unit_weights(target)
    elif checked:
        weights = (target != ignore_index).long()
    else:
        weights = _counted_entries(labels, target, num_classes, ignore_index, from_scores).long()
    block = 3 * width
    cells = torch.zeros(samples * block, dtype=torch.long, device=target.device)
    hit = labels.eq(target)
    target = _clamped_to_sinks(target, num_classes)
    predicted_labels = labels if from_scores else labels.clamp(-1, num_classes)
    if samplewise:
        # each sample's cells start at its own offset, so a label that is no class goes to its sample's sink (``C``),
        # not counted back from the end of the buffer
        offsets = torch.arange(0, samples * block, block, device=cells.device).unsqueeze(1)
        pairs = hit.add(target.remainder(width), alpha=2).view(samples, -1).add(offsets)
        cells.put_(pairs, weights, accumulate=True)
        predicted_labels = predicted_labels.remainder(width).view(samples, -1).add(offsets.add(2 * width))
        cells.put_(predicted_labels, weights, accumulate=True)
        shape: tuple[int, ...] = (samples, num_classes)
        strides: tuple[int, ...] = (block, 2)
    else:
        # each entry's cell, in [-2, 2 * C + 2), written over its clamped target (a new tensor): one temporary of the
        # batch's size fewer alive at once
        cells.narrow(0, 0, 2 * width).put_(torch.add(hit, target, alpha=2, out=target), weights, accumulate=True)
        cells.narrow(0, 2 * width, width).put_(predicted_labels, weights, accumulate=True)
        shape, strides = (num_classes,), (2,)
    # ``as_strided`` views of the buffer: a third of the host time of slicing it row by row (this runs every update)
    misses = cells.as_strided(shape, strides, 0)
    hits = cells.as_strided(shape, strides, 1)
    predicted = cells.as_strided(shape, strides[:-1] + (1,), 2 * width)
    # the entries counted: every one, or the misses and hits of the classes (ignored entries and sinks left out)
    if samplewise:
        counted: Tensor | int = cells.as_strided((samples, 2 * num_classes), (block, 1)).sum(-1, keepdim=True)
    elif every_entry_counts:
        counted = target.numel()
    else:
        counted = cells.narrow(0, 0, 2 * num_classes).sum()
    stats = torch.stack((hits, predicted - hits, torch.rsub(predicted, counted) - misses, misses))
    return stats, cells.as_strided(shape[:-1], strides[:-1], 2 * num_classes)


def _top_k_labels(preds: Tensor, target: Tensor, top_k: int) -> Tensor:
    """The label each entry of scores ``preds`` (N, C, ...) predicts with ``top_k > 1``, O(entries x top_k).

    Its target where the target is among its ``top_k`` highest scores, else its highest: stock's refined one-hot
    prediction (``_refine_preds_oh``) as labels, ties broken by the same ``topk``.
    """
    top = preds.topk(top_k, dim=1).indices
    return torch.where((top == target.unsqueeze(1)).any(1), target, top.select(1, 0))


def _counted_entries(
    labels: Tensor, target: Tensor, num_classes: int, ignore_index: int | None, from_scores: bool
) -> Tensor:
    """The int64 entries of an unvalidated update that count: target a class (not ignored), label a class or none.

    A label predicts no class when it equals an ``ignore_index`` outside the classes; any other label outside them
    leaves its entry out, as does a target outside them.
    """
    counted = target.clamp(0, num_classes - 1) == target
    ignore_is_a_class = ignore_index is not None and 0 <= ignore_index < num_classes
    if ignore_is_a_class:
        counted &= target != ignore_index
    if not from_scores:
        label_counts = labels.clamp(0, num_classes - 1) == labels
        if ignore_index is not None and not ignore_is_a_class:
            label_counts |= labels == ignore_index
        counted &= label_counts
    return counted


def _confusion_counts(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None, labels_checked: bool = False
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """tp/fp/tn/fn per class from :func:`_confusion_bins`.

    ``tn`` is what the other three leave of the entries counted: ``counted - (tp + fp) - fn`` (stock sums the whole
    matrix for it). A pred in the no-class column is a miss of the target's class (fn), no class's fp.
    """
    confmat, counted = _confusion_bins(preds, target, num_classes, ignore_index, labels_checked)
    tp = confmat.diagonal()
    predicted = confmat[:, :num_classes].sum(0)
    fp = predicted - tp
    fn = confmat.sum(1) - tp
    return tp, fp, torch.rsub(predicted, preds.numel() if counted is None else counted) - fn, fn


def _flat_long(labels: Tensor) -> Tensor:
    """``labels.flatten().long()``, skipping the calls that would return ``labels`` itself (this runs every update)."""
    labels = labels if labels.ndim == 1 else labels.flatten()
    return labels if labels.dtype == torch.long else labels.long()


def _micro_block(preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None) -> Tensor:
    """tp/fp/tn/fn summed over the classes, as one ``(4, 1)`` block (the rows in the micro states' shape).

    Every counted entry is a hit or a miss: a miss is one fp and one fn, every other class of the entry a tn, so with
    ``tp`` hits of ``counted`` entries the block is ``counted * per_entry + signs * tp``: fp and fn ``counted - tp``,
    tn ``(C - 2) * counted + tp`` (stock's ``C * counted - (fp + fn + tp)``), a multiply and an ``addcmul``.
    Ignored entries are masked out of the sums instead of being removed.
    """
    device = target.device
    correct = preds == target
    signs = _cached(device, "micro signs", lambda: _micro_column(device, 1, -1, 1))
    # what each counted entry adds before its hit is known (0 tp, 1 fp, C - 2 tn, 1 fn): keyed by the classes only, as
    # a key per batch size would grow with every length of a variable-size batch
    per_entry = _cached(device, ("micro per entry", num_classes), lambda: _micro_column(device, 0, 1, num_classes - 2))
    if ignore_index is None:
        counted: Tensor | int = target.numel()
    else:
        kept = target != ignore_index
        correct &= kept
        counted = kept.sum()
        del kept
    hits = correct.sum()
    del correct  # the batch's flags go before the block is made: no more bytes alive at once than stock's counting
    return (per_entry * counted).addcmul_(signs, hits)


def _micro_column(device: torch.device, tp: int, fp_and_fn: int, tn: int) -> Tensor:
    """The int64 column ``(tp, fp_and_fn, tn, fp_and_fn)``, made on ``device`` by fills (no copy from the host)."""
    column = torch.full((4, 1), fp_and_fn, dtype=torch.long, device=device)
    column[0] = tp
    column[2] = tn
    return column


def _one_hot_counts(
    preds: Tensor,
    target: Tensor,
    num_classes: int,
    top_k: int,
    multidim_average: str,
    ignore_index: int | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stock's one-hot path (``top_k > 1`` or samplewise) with ``masked_fill`` for its boolean-mask writes."""
    ignore_in = ignore_index is not None and 0 <= ignore_index <= num_classes - 1
    ignore_out = ignore_index is not None and not ignore_in
    if ignore_out:
        ignored = target == ignore_index
        target = target.masked_fill(ignored, num_classes)
        if preds.ndim > target.ndim:
            preds = preds.masked_fill(ignored.unsqueeze(1), num_classes)
        else:  # label preds: one equal to ignore_index predicts no class (the dropped column), as in the matrix
            preds = preds.masked_fill(ignored | (preds == ignore_index), num_classes)
    width = num_classes + 1 if ignore_out else num_classes
    if top_k > 1:
        preds_oh = torch.movedim(select_topk(preds, topk=top_k, dim=1), 1, -1)
        preds_oh = _refine_preds_oh(preds, preds_oh, target, top_k)
    else:
        preds_oh = _one_hot(preds.long(), width)
    target_oh = _one_hot(target.long(), width)
    if ignore_in:
        target_oh = target_oh.masked_fill((target == ignore_index).unsqueeze(-1), -1)
    elif ignore_out:
        preds_oh = preds_oh[..., :-1] if top_k == 1 else preds_oh
        target_oh = target_oh[..., :-1].masked_fill((target == num_classes).unsqueeze(-1), -1)
    sum_dim = [0, 1] if multidim_average == "global" else [1]
    tp = ((target_oh == preds_oh) & (target_oh == 1)).sum(sum_dim)
    fn = ((target_oh != preds_oh) & (target_oh == 1)).sum(sum_dim)
    fp = ((target_oh != preds_oh) & (target_oh == 0)).sum(sum_dim)
    tn = ((target_oh == preds_oh) & (target_oh == 0)).sum(sum_dim)
    return tp, fp, tn, fn


@replaces(
    f"{_FUNCTIONAL}._multiclass_stat_scores_update",
    params=("preds", "target", "num_classes", "top_k", "average", "multidim_average", "ignore_index"),
    everywhere=True,
)
def _multiclass_stat_scores_update(
    preds: Tensor,
    target: Tensor,
    num_classes: int,
    top_k: int = 1,
    average: str | None = "macro",
    multidim_average: str = "global",
    ignore_index: int | None = None,
    validated: bool = False,
    labels_read: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stock's statistics with fixed-shape ops only, in O(entries x top_k + classes) (see the module docstring).

    ``validated``: the labels were just validated by the metric's update: they are all classes, or the update leaves
    the batch out whole when they are not. ``labels_read``: that validation read them (it returned no flag): they are.
    """
    samplewise = multidim_average == "samplewise"
    if top_k == 1 and average == "micro" and not samplewise:
        return _micro_block(preds, target, num_classes, ignore_index).flatten().unbind()
    if _XLA or preds.is_mps:  # no ``put_`` there: upstream's fixed-shape mesh counting, or the one-hot comparison
        if top_k == 1 and not samplewise:
            return _confusion_counts(preds, target, num_classes, ignore_index, labels_read)
        return _one_hot_counts(preds, target, num_classes, top_k, multidim_average, ignore_index)
    if top_k == 1:
        labels, from_scores = preds, False
    elif preds.ndim == target.ndim + 1 and preds.is_floating_point():
        labels, from_scores = _top_k_labels(preds, target, top_k), True
    else:  # ``top_k > 1`` over labels, which stock's validation rejects: what stock's one-hot code makes of them
        return _one_hot_counts(preds, target, num_classes, top_k, multidim_average, ignore_index)
    stats, _ = _class_counts(labels, target, num_classes, ignore_index, validated, from_scores, samplewise)
    return stats.unbind()


# --------------------------------------------------------------------------------------------------------------------
# the metrics: updates that pass themselves to the validation, leave invalid batches out, report at their end


def _without_invalid(invalid: Tensor | None, *counts: Tensor, in_place: bool = False) -> tuple[Tensor, ...]:
    """The counts of an update, all zero when its validation flag is set (the batch never enters the state).

    More than two integer counts (tp/fp/tn/fn) are multiplied by "valid" in one ``torch._foreach_mul``: two launches
    on CUDA instead of one per count (a float count may hold NaN, which only ``masked_fill`` clears). ``in_place``:
    the counts are the update's own, zeroed where they are (no second set of counts allocated).
    """
    if invalid is None:
        return counts
    if len(counts) > 2 and not counts[0].is_floating_point() and FOREACH_MUL_BY_TENSOR:
        if in_place:
            torch._foreach_mul_(counts, invalid.logical_not())
            return counts
        return tuple(torch._foreach_mul(counts, invalid.logical_not()))
    if in_place:
        return tuple(count.masked_fill_(invalid, 0) for count in counts)
    return tuple(count.masked_fill(invalid, 0) for count in counts)


@replaces(f"{_MODULE}._AbstractStatScores._update_state", params=("self", "tp", "fp", "tn", "fn"))
def _update_state(self: Any, tp: Tensor, fp: Tensor, tn: Tensor, fn: Tensor) -> None:
    """Stock's state update, in place for tensor states: the tensors a CUDA graph captured hold the result."""
    if self.multidim_average == "samplewise" or isinstance(self.tp, list):
        return stock(f"{_MODULE}._AbstractStatScores._update_state")(self, tp, fp, tn, fn)
    add_to_states(self, _STAT_STATES, (tp, fp, tn, fn))
    return None


_STAT_STATES = ("tp", "fp", "tn", "fn")


@replaces(f"{_MODULE}._AbstractStatScores._create_state", params=("self", "size", "multidim_average"))
def _create_state(self: Any, size: int, multidim_average: str = "global") -> None:
    """Stock's states, plus the counter of the validation check (reported when ``validate_args`` is set)."""
    stock(f"{_MODULE}._AbstractStatScores._create_state")(self, size, multidim_average)
    _deferred.add_checks(self, (_deferred.INVALID_VALUES,) if getattr(self, "validate_args", False) else ())


@replaces(_BINARY_UPDATE, params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    invalid = None
    if self.validate_args:
        invalid = _binary_stat_scores_tensor_validation(
            preds, target, self.multidim_average, self.ignore_index, metric=self
        )
    preds, target = _binary_stat_scores_format(preds, target, self.threshold, self.ignore_index)
    tp, fp, tn, fn = _binary_stat_scores_update(preds, target, self.multidim_average)
    self._update_state(*_without_invalid(invalid, tp, fp, tn, fn))
    _deferred.sweep(self)


@replaces(_MULTICLASS_UPDATE, params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    num_classes = self.num_classes
    if self.top_k != 1 or self.multidim_average != "global" or num_classes is None or _XLA or preds.is_mps:
        _multiclass_update_by_functional(self, preds, target)
        return
    micro = self.average == "micro"
    if not micro and preds.ndim == target.ndim + 1 and preds.is_floating_point() and not target.is_floating_point():
        # scores: the argmax is a class, so the counting's sink finds every target that is no class (the validation)
        if self.validate_args:
            _multiclass_shape_checks(preds, target, num_classes, self.multidim_average)
        stats, bad_targets = _class_counts(
            preds.argmax(dim=1), target, num_classes, self.ignore_index, self.validate_args, from_scores=True
        )
        if self.validate_args:
            raise_at_once = functools.partial(_raise_not_a_class, preds, target, num_classes, self.ignore_index)
            flag = _file_invalid(self, bad_targets, raise_at_once)
            if flag is not None:
                stats.mul_(torch.pow(0, flag))  # 0 ** 0 == 1, 0 ** n == 0: the invalid batch is left out, one op
    else:
        invalid = None
        if self.validate_args:
            invalid = _multiclass_stat_scores_tensor_validation(
                preds, target, num_classes, self.multidim_average, self.ignore_index, metric=self
            )
        preds, target = _multiclass_stat_scores_format(preds, target, 1)
        if micro:
            stats = _micro_block(preds, target, num_classes, self.ignore_index)
        else:
            stats, _ = _class_counts(
                preds, target, num_classes, self.ignore_index, self.validate_args, from_scores=False
            )
        if invalid is not None:
            stats.masked_fill_(invalid, 0)  # in place: the invalid batch is left out
    add_to_states(self, _STAT_STATES, stats)
    _deferred.sweep(self)


def _multiclass_update_by_functional(self: Any, preds: Tensor, target: Tensor) -> None:
    """``top_k > 1``, samplewise (and XLA, MPS): the patched functional counting, an invalid batch left out."""
    invalid = None
    if self.validate_args:
        invalid = _multiclass_stat_scores_tensor_validation(
            preds, target, self.num_classes, self.multidim_average, self.ignore_index, metric=self
        )
    preds, target = _multiclass_stat_scores_format(preds, target, self.top_k)
    tp, fp, tn, fn = _multiclass_stat_scores_update(
        preds,
        target,
        self.num_classes if self.num_classes is not None else 1,
        self.top_k,
        self.average,
        self.multidim_average,
        self.ignore_index,
        validated=self.validate_args,
        labels_read=self.validate_args and invalid is None,
    )
    self._update_state(*_without_invalid(invalid, tp, fp, tn, fn, in_place=True))
    _deferred.sweep(self)


def _validated_multilabel(self: Any, preds: Tensor, target: Tensor) -> tuple[Tensor | None, Tensor, Tensor]:
    """A multilabel update's validation (its device flag, or ``None``) and formatted inputs (ExactMatch's too)."""
    invalid = None
    if self.validate_args:
        invalid = _multilabel_stat_scores_tensor_validation(
            preds, target, self.num_labels, self.multidim_average, self.ignore_index, metric=self
        )
    preds, target = _multilabel_stat_scores_format(preds, target, self.num_labels, self.threshold, self.ignore_index)
    return invalid, preds, target


@replaces(_MULTILABEL_UPDATE, params=("self", "preds", "target"), kind="metric_method")
def _multilabel_update(self: Any, preds: Tensor, target: Tensor) -> None:
    invalid, preds, target = _validated_multilabel(self, preds, target)
    tp, fp, tn, fn = _multilabel_stat_scores_update(preds, target, self.multidim_average)
    self._update_state(*_without_invalid(invalid, tp, fp, tn, fn))
    _deferred.sweep(self)
