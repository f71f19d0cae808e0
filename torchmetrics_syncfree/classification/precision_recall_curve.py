"""Sync-free ``update`` of ``torchmetrics.classification.precision_recall_curve``: the PR-curve family.

``Binary``/``Multiclass``/``MultilabelPrecisionRecallCurve`` are the base classes of ROC, AUROC, AveragePrecision
and LogAUC (every task): they inherit its ``update``, so patching the three updates covers all of them.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``validate_args``: ``torch.unique(target)`` +        one device count per update (target values in {0, 1} or
``if ...:``                                          ``ignore_index``; multiclass labels in ``[0, C)``), filed
                                                     as a deferred check (raised at once on CPU with stock's
                                                     message, reported at an eager point on the device path, the
                                                     invalid batch left out of the state); binned, on every
                                                     device: the sink column of the count itself (binary,
                                                     multilabel, multiclass with ``ignore_index``) or
                                                     ``target // C != 0``
``ignore_index``: ``preds[target != ii]``            ignored entries stay in place and are routed to a dropped
(binary, multiclass), ``mapping[mapping >= 0]``      column of the count (binned); the logits test looks at the
(multilabel)                                         kept entries only, as stock
binned (``thresholds`` given): ``preds >=            ``torch.bucketize`` of each pred among the sorted thresholds,
thresholds`` for every threshold, counted with       its cell by one lookup in a cached table (bucket, target,
``torch.bincount`` (reads the maximum on CUDA) or    class; sink and dropped columns), one ``scatter_add_``, one
a Python loop over thresholds for large batches      ``cumsum`` (see "binned counting" below): O(N log T) work,
                                                     O(N) memory; 14-18 kernels per update (stock: 14-25 on CPU)
``self.confmat += state``                            ``add_``/``addcmul_``: in place (a captured CUDA graph
                                                     replays into it), the invalid batch left out by the same op
==================================================  ===========================================================

With ``thresholds=None`` the state is the list of (formatted) preds and targets: its update is validation and
formatting only. With ``ignore_index`` stock's binary/multiclass update removes the ignored entries with a boolean
mask (one sync per update); here they stay in the list state on every device and every compute of the family leaves
them out (:func:`_ignored_entries_dropped`, or weights of 0 in the fixed-shape AUROC/AveragePrecision; a documented
deviation of the list state: a CPU update that keeps them gives other curves than stock's in the last bit for some
logit batches, 12 of 40 for ``BinaryROC`` with 30% ignored, as the logits test and sigmoid run over the whole batch).
Multiclass ``average="micro"`` one-hot encodes the targets (stock's ``one_hot`` reads their range): here a comparison
with every class does, on every device (:func:`_micro_list_state`). ``compute()`` of the curves is
stock's on the state without ignored entries; AUROC and AveragePrecision have their own (:mod:`.auroc`,
:mod:`.average_precision`).

The counts are integers: identical to stock's for every valid input. Deliberate deviations (documented, tested):

* multiclass validation checks every non-ignored target against ``[0, num_classes)`` as the stat scores do (stock
  counts distinct values);
* with ``validate_args=False``, binary and multilabel targets other than 0 and 1 and multiclass targets outside the
  classes are left out of the binned counts (stock counts them in another threshold's or class's cells, or fails in
  ``one_hot``); in the unbinned micro state (every device) such a target is a negative of every class, as in stock's
  per-class curves (stock's ``one_hot`` fails).

"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary
from torchmetrics.functional.classification.precision_recall_curve import (
    _binary_precision_recall_curve_format,
    _multiclass_precision_recall_curve_format,
    _multilabel_precision_recall_curve_format,
)
from torchmetrics.utilities.checks import _check_same_shape
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_state_if, add_to_states
from torchmetrics_syncfree.classification.stat_scores import (
    _cached,
    _checked_sink,
    _count,
    _file_invalid,
    _mesh_counting,
    _raise_not_a_class,
    normalize_logits_if_needed,
    normalize_logits_of_kept,
)

_FUNCTIONAL = "torchmetrics.functional.classification.precision_recall_curve"
_MODULE = "torchmetrics.classification.precision_recall_curve"


#: Stock's compute-time warnings of the family, filed on the device path as deferred warnings of the metric.
NO_NEGATIVES = _deferred.Check(
    "roc.no-negatives",
    "No negative samples in targets, false positive value should be meaningless. Returning zero tensor in false"
    " positive score",
    UserWarning,
)
NO_POSITIVES = _deferred.Check(
    "roc.no-positives",
    "No positive samples in targets, true positive value should be meaningless. Returning zero tensor in true"
    " positive score",
    UserWarning,
)
UNDEFINED_RECALL = _deferred.Check(
    "precision_recall_curve.undefined-recall",
    "No positive samples found in target, recall is undefined. Setting recall to one for all thresholds.",
    UserWarning,
)
# stock's reductions of AUROC and AveragePrecision share this message (AUROC's says "average precision" too)
NAN_IN_MACRO = _deferred.Check(
    "reduce.nan-macro",
    "Average precision score for one or more classes was `nan`. Ignoring these classes in macro-average",
    UserWarning,
)
NAN_IN_WEIGHTED = _deferred.Check(
    "reduce.nan-weighted",
    "Average precision score for one or more classes was `nan`. Ignoring these classes in weighted-average",
    UserWarning,
)
# LogAUC's reduction warns with this text, ``{average}`` included (stock's message is no f-string)
LOGAUC_NAN = _deferred.Check(
    "logauc.nan",
    "LogAUC score for one or more classes/labels was `nan`. Ignoring these classes in {average}-average.",
    UserWarning,
)
#: the counters of every metric of the family, in this order (:func:`_family_kinds`)
FAMILY_KINDS = (
    _deferred.INVALID_VALUES,
    NO_NEGATIVES,
    NO_POSITIVES,
    UNDEFINED_RECALL,
    NAN_IN_MACRO,
    NAN_IN_WEIGHTED,
    LOGAUC_NAN,
)


# --------------------------------------------------------------------------------------------------------------------
# validation


def _check_scores_and_labels(preds: Tensor, target: Tensor) -> None:
    """Stock's host-only dtype checks of every task."""
    if target.is_floating_point():
        raise ValueError(
            "Expected argument `target` to be an int or long tensor with ground truth labels"
            f" but got tensor with dtype {target.dtype}"
        )
    if not preds.is_floating_point():
        raise ValueError(
            "Expected argument `preds` to be an floating tensor with probability/logit scores,"
            f" but got tensor with dtype {preds.dtype}"
        )


def _labels_outside(target: Tensor, num_values: int, ignore_index: int | None) -> Tensor:
    """0-dim flag (every device): some target is outside ``[0, num_values)`` and not ``ignore_index``.

    ``target // num_values`` is 0 exactly for the labels: two kernels (with an ``ignore_index`` outside the labels,
    four), where comparisons with both bounds take three (five).
    """
    outside = torch.div(target, num_values, rounding_mode="floor")
    if ignore_index is not None and not 0 <= ignore_index < num_values:
        outside = outside.masked_fill_(target == ignore_index, 0)
    return outside.any()


def _check_labels(
    metric: Any, target: Tensor, num_values: int, ignore_index: int | None, raise_at_once: Callable[[], None]
) -> Tensor | None:
    """The value check of ``metric``'s update: targets in ``[0, num_values)`` or ``ignore_index``.

    :func:`_labels_outside`, filed with the metric (read at once where reads are free: ``raise_at_once``, stock's
    error) and returned where it is not read (the update leaves the batch out when it is set). Bool targets hold
    labels only: ``None``.
    """
    if target.dtype == torch.bool:
        return None
    return _file_invalid(metric, _labels_outside(target, num_values, ignore_index), raise_at_once)


def _binary_host_checks(preds: Tensor, target: Tensor) -> None:
    """The host-only part of stock's binary validation: shapes and dtypes."""
    _check_same_shape(preds, target)
    _check_scores_and_labels(preds, target)


@replaces(f"{_FUNCTIONAL}._binary_precision_recall_curve_tensor_validation", params=("preds", "target", "ignore_index"))
def _binary_precision_recall_curve_tensor_validation(
    preds: Tensor, target: Tensor, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return _stock_binary_validation(preds, target, ignore_index)
    _binary_host_checks(preds, target)
    return _check_labels(metric, target, 2, ignore_index, _stock_binary_report(metric, preds, target, ignore_index))


def _stock_binary_validation(preds: Tensor, target: Tensor, ignore_index: int | None) -> None:
    """Stock's binary validation, looked up when it runs, which is eagerly only.

    The lookup imports, which Dynamo refuses to trace: an update that looked it up first broke the graph of every
    binary and multilabel curve update.
    """
    stock(f"{_FUNCTIONAL}._binary_precision_recall_curve_tensor_validation")(preds, target, ignore_index)


@replaces(
    f"{_FUNCTIONAL}._multilabel_precision_recall_curve_tensor_validation",
    params=("preds", "target", "num_labels", "ignore_index"),
)
def _multilabel_precision_recall_curve_tensor_validation(
    preds: Tensor, target: Tensor, num_labels: int, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multilabel_precision_recall_curve_tensor_validation")(
            preds, target, num_labels, ignore_index
        )
    invalid = _binary_precision_recall_curve_tensor_validation(preds, target, ignore_index, metric=metric)
    _num_labels_check(preds, num_labels)
    return invalid


def _num_labels_check(preds: Tensor, num_labels: int) -> None:
    if preds.shape[1] != num_labels:
        raise ValueError(
            "Expected both `target.shape[1]` and `preds.shape[1]` to be equal to the number of labels"
            f" but got {preds.shape[1]} and expected {num_labels}"
        )


@replaces(
    f"{_FUNCTIONAL}._multiclass_precision_recall_curve_tensor_validation",
    params=("preds", "target", "num_classes", "ignore_index"),
)
def _multiclass_precision_recall_curve_tensor_validation(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's shape checks; with the ``metric`` whose update validates, the label range check (a device flag)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multiclass_precision_recall_curve_tensor_validation")(
            preds, target, num_classes, ignore_index
        )
    _multiclass_host_checks(preds, target, num_classes)
    raise_at_once = functools.partial(_raise_not_a_class, preds, target, num_classes, ignore_index)
    return _check_labels(metric, target, num_classes, ignore_index, raise_at_once)


def _multiclass_host_checks(preds: Tensor, target: Tensor, num_classes: int) -> None:
    """The host-only part of stock's multiclass validation: dimensions, dtypes and shapes."""
    if not preds.ndim == target.ndim + 1:
        raise ValueError(
            f"Expected `preds` to have one more dimension than `target` but got {preds.ndim} and {target.ndim}"
        )
    if target.is_floating_point():
        raise ValueError(
            f"Expected argument `target` to be an int or long tensor, but got tensor with dtype {target.dtype}"
        )
    if not preds.is_floating_point():
        raise ValueError(f"Expected `preds` to be a float tensor, but got {preds.dtype}")
    if preds.shape[1] != num_classes:
        raise ValueError(
            "Expected `preds.shape[1]` to be equal to the number of classes but"
            f" got {preds.shape[1]} and {num_classes}."
        )
    if preds.shape[0] != target.shape[0] or preds.shape[2:] != target.shape[1:]:
        raise ValueError(
            "Expected the shape of `preds` should be (N, C, ...) and the shape of `target` should be (N, ...)"
            f" but got {preds.shape} and {target.shape}"
        )


# --------------------------------------------------------------------------------------------------------------------
# binned counting
#
# Each score is bucketed once among the sorted thresholds (``torch.bucketize``, O(log T)) and counted in a fixed cell
# of one histogram: row r = the number of thresholds at or below it (NaN: none, as ``nan >= t`` is false), column
# (group, target). Rows T + 1 to 2T + 1 repeat the counts negated (one subtraction); one ``cumsum`` down the rows then
# gives, in row k, the entries below the k-th smallest threshold (predicted negative: tn/fn) and, in row T + 1 + k,
# all entries minus those (predicted positive: fp/tp): stock's (T, ..., 2, 2) matrices as a strided view, in
# ascending threshold order.
#
# The cell of an entry comes from one lookup in a cached table, ``table[kind, group, bucket]``: the bucket's row (the
# NaN bucket is row 0) plus the column its kind selects. The kind of a binary or multilabel entry is its target
# clamped to [-1, 2] (2 and -1: no label), of a multiclass entry whether its target is the entry's class; kinds that
# are no label select a sink column (its total is the number of invalid entries: the validation's count) and ignored
# entries a dropped column. Validation, ignore_index and counting are one lookup and one scatter.


#: the columns an entry's kind selects: the negatives' or positives' column of the entry's group, the sink column
#: (values that are no label: the validation's count) or the dropped column (ignored entries)
_NEG, _POS, _SINK, _DROP = 0, 1, -1, -2
#: binary/multilabel kinds: the target clamped to [-1, 2] (-1 indexes the last kind); ignored entries are kind 3
_LABEL_KINDS = (_NEG, _POS, _SINK)
_LABEL_KINDS_IGNORED = (_NEG, _POS, _SINK, _DROP, _SINK)
#: multiclass kinds: ``target == class``, plus the sample's kind where labels may be no class or ignored
#: (:func:`_sample_kinds`: 2 for a label of no class, 3 for an ignored one)
_CLASS_KINDS = (_NEG, _POS)
_CLASS_KINDS_CHECKED = (_NEG, _POS, _SINK, _DROP, _DROP)

#: the instance attribute that says the metric's thresholds are in ascending order (given as a count, or as an
#: ascending list): its counts need no reordering (see :func:`_curve_init`)
_ASCENDING = "_syncfree_thresholds_ascending"

# per thresholds tensor: {(dtype, negated, ascending): (version, boundaries, rank)}
_bucket_consts: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _make_boundaries(
    thresholds: Tensor, dtype: torch.dtype, negated: bool, ascending: bool
) -> tuple[Tensor, Tensor | None]:
    sorted_thresholds, order = thresholds.to(dtype).sort(stable=True)
    rank = None if ascending else order.argsort()
    if negated:  # ascending negated thresholds: a negated score's (lower) bucket counts the thresholds above the score
        return sorted_thresholds.flip(0).neg(), rank
    # a sentinel above every score in [0, 1]: only NaN passes it (the binary search sends NaN to the end)
    return torch.cat([sorted_thresholds, torch.full((1,), torch.inf, dtype=dtype, device=thresholds.device)]), rank


def _boundaries(thresholds: Tensor, dtype: torch.dtype, negated: bool, ascending: bool) -> tuple[Tensor, Tensor | None]:
    """The sorted bucket boundaries of ``thresholds`` in ``dtype`` and the rank of each threshold among them.

    The rank is ``None`` for thresholds known to be ascending. Made once per thresholds tensor (and version); anew
    while tracing or capturing (see ``stat_scores._cached``).
    """
    if _deferred.is_compiling() or (thresholds.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _make_boundaries(thresholds, dtype, negated, ascending)
    version = None if thresholds.is_inference() else thresholds._version  # (inference tensors have none)
    consts = _bucket_consts.get(thresholds)
    if consts is None:
        consts = _bucket_consts[thresholds] = {}
    cached = consts.get((dtype, negated, ascending))
    if cached is None or cached[0] != version:
        cached = consts[dtype, negated, ascending] = (version, *_make_boundaries(thresholds, dtype, negated, ascending))
    return cached[1], cached[2]


def _make_table(
    kinds: tuple[int, ...], groups: int, num_thresholds: int, negated: bool, device: torch.device
) -> Tensor:
    buckets = torch.arange(num_thresholds + (1 if negated else 2), device=device)
    # a bucket's row: negated buckets count the thresholds above the score, the others those at or below it (the last
    # one, NaN's: none)
    rows = num_thresholds - buckets if negated else buckets.remainder(num_thresholds + 1)
    group = torch.arange(groups, device=device)
    columns = torch.stack(
        [2 * group + kind if kind >= 0 else torch.full_like(group, 2 * groups - 1 - kind) for kind in kinds]
    )
    return columns.unsqueeze(-1) + rows * (2 * groups + 2)


def _table(kinds: tuple[int, ...], groups: int, num_thresholds: int, negated: bool, device: torch.device) -> Tensor:
    """``table[kind, group, bucket]``: the histogram cell of an entry (see above), made once."""
    key = ("curve cells", kinds, groups, num_thresholds, negated)
    return _cached(device, key, lambda: _make_table(kinds, groups, num_thresholds, negated, device))


def _arange(size: int, device: torch.device) -> Tensor:
    """``torch.arange(size)`` on ``device``, made once."""
    return _cached(device, ("arange", size), lambda: torch.arange(size, device=device))


def _buckets(scores: Tensor, thresholds: Tensor, negated: bool, ascending: bool) -> tuple[Tensor, Tensor | None]:
    """Each score's bucket among the sorted thresholds, compared in stock's dtype, and the thresholds' rank."""
    dtype = torch.promote_types(scores.dtype, thresholds.dtype)  # the dtype stock's ``>=`` compares in
    boundaries, rank = _boundaries(thresholds, dtype, negated, ascending)
    # contiguous: bucketize copies other layouts itself (extra dimensions: stock's format transposes)
    scores = (scores if scores.dtype == dtype else scores.to(dtype)).contiguous()
    if negated:
        return torch.bucketize(scores.neg(), boundaries), rank
    return torch.bucketize(scores, boundaries, right=True), rank


def _threshold_counts(cells: Tensor, groups: int, num_thresholds: int, rank: Tensor | None) -> tuple[Tensor, Tensor]:
    """Stock's ``(T, G, 2, 2)`` matrices from the cells of the entries (see above), and the sink column's count.

    On an accelerator the counts are int32 (a batch's are far below 2**31: half the memory of int64 in every pass,
    atomics included), their sums made in place. Where reads are free they are counted in a buffer of the thread's,
    kept for the next update: a fresh buffer of this size (megabytes at 1000 classes) costs the host page faults on
    every update; int64 there, the state's dtype, which the caller then adds without a conversion. The results are
    views of the buffer then: the caller adds them to the state at once.
    """
    block, width = num_thresholds + 1, 2 * groups + 2
    size, cells = 2 * block * width, cells.flatten()
    if _mesh_counting() or cells.is_mps:
        counts = _count(cells, size)  # upstream's fixed-shape counting there
    else:
        if _deferred.reads_are_free(cells):
            dtype = torch.long
            counts = _scratch(size, dtype).zero_()
        else:
            dtype = torch.int32 if cells.numel() < 2**31 else torch.long
            counts = torch.zeros(size, dtype=dtype, device=cells.device)
        unit = _cached(cells.device, ("unit", dtype), lambda: torch.ones(1, dtype=dtype, device=cells.device))
        counts.scatter_add_(0, cells, unit.expand(cells.shape))
    halves = counts.view(2, block, width)
    halves[1].sub_(halves[0])
    counts.view(2 * block, width).cumsum_(0)
    # confmats[threshold, group, target, pred] = counts[pred, threshold, 2 * group + target]: one strided view
    confmats = counts.as_strided((num_thresholds, groups, 2, 2), (width, 2, 1, block * width))
    if rank is not None:
        confmats = confmats[rank]  # back to the thresholds' own order
    return confmats, counts[num_thresholds * width + 2 * groups]


_thread = threading.local()


def _scratch(size: int, dtype: torch.dtype) -> Tensor:
    """A CPU buffer of ``size`` elements, this thread's, reused by the next update of the same size (uninitialised)."""
    buffers = _thread.__dict__.setdefault("curve_counts", {})
    buffer = buffers.get((size, dtype))
    if buffer is None:
        with torch.inference_mode(False):  # written in place by every update, inference mode or not
            buffer = buffers[size, dtype] = torch.empty(size, dtype=dtype)
    return buffer


def _sample_kinds(target: Tensor, num_classes: int, ignored: Tensor | None) -> Tensor:
    """Per multiclass sample: 0 for a class label, 2 for a label of no class, 3 for an ignored one.

    Once each entry's ``target == class`` is added, these are the kinds of ``_CLASS_KINDS_CHECKED``.
    """
    labels = (target if target.dtype == torch.long else target.long()).clamp(-1, num_classes)
    if ignored is not None:
        labels = labels.masked_fill_(ignored, num_classes + 1)  # (-1, outside the clamp's range: the last entry)
    ignoring, device = ignored is not None, target.device
    kinds = _cached(
        device, ("sample kinds", num_classes, ignoring), lambda: _make_sample_kinds(num_classes, ignoring, device)
    )
    return kinds[labels]


def _make_sample_kinds(num_classes: int, ignoring: bool, device: torch.device) -> Tensor:
    # 0 for the classes; 2 for the clamped labels C and -1 (the last entry), 3 for ignored ones (C + 1)
    kinds = torch.zeros(num_classes + (3 if ignoring else 1), dtype=torch.long, device=device)
    kinds[num_classes:].fill_(2)
    if ignoring:
        kinds[num_classes + 1].fill_(3)
    return kinds


def _label_counts(
    self: Any,
    scores: Tensor,
    target: Tensor,
    ignored: Tensor | None,
    negated: bool,
    metric: Any | None,
    report_at_once: Callable[[], None] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Binned counts ``(T, G, 2, 2)`` of binary/multilabel entries ``(M, G)``, whose targets are 0/1 labels.

    Targets that are no label land in the sink column; with ``metric`` (``validate_args``) its count is the
    validation's (``report_at_once``: stock's error where reads are free), and the second result says whether the
    batch may enter the state.
    """
    # as int64 where the dtype holds no -1 (uint8, bool), and floats as stock's ``target.long()`` truncates them
    labels = target.long() if target.dtype in (torch.uint8, torch.bool) or target.is_floating_point() else target
    kinds = labels.clamp(-1, 2)
    if ignored is not None:
        kinds = kinds.masked_fill_(ignored, 3)
    buckets, rank = _buckets(scores, self.thresholds, negated, self.__dict__.get(_ASCENDING, False))
    groups, num_thresholds = scores.shape[1], self.thresholds.numel()
    table = _table(
        _LABEL_KINDS if ignored is None else _LABEL_KINDS_IGNORED, groups, num_thresholds, negated, scores.device
    )
    confmats, sink = _threshold_counts(
        table[kinds, _arange(groups, scores.device), buckets], groups, num_thresholds, rank
    )
    return confmats, _checked_sink(metric, sink, report_at_once)


def _binary_counts(
    self: Any, preds: Tensor, target: Tensor, normalization: str | None, metric: Any | None
) -> tuple[Tensor, Tensor | None]:
    """Stock's binary format + binned update, ``(T, 2, 2)``, with fixed shapes (and the batch's validation)."""
    report_at_once = _stock_binary_report(metric, preds, target, self.ignore_index)
    preds, target = preds.flatten(), target.flatten()
    ignored = None if self.ignore_index is None else target == self.ignore_index
    preds = normalize_logits_of_kept(preds, normalization, ignored=ignored) if normalization else preds
    column = None if ignored is None else ignored.unsqueeze(1)
    scores, labels = preds.unsqueeze(1), target.unsqueeze(1)
    confmats, keep = _label_counts(self, scores, labels, column, not normalization, metric, report_at_once)
    return confmats.squeeze(1), keep


def _stock_binary_report(
    metric: Any | None, preds: Tensor, target: Tensor, ignore_index: int | None
) -> Callable[[], None] | None:
    """Stock's binary (and multilabel) value check of an update's inputs: it raises stock's error.

    The report of invalid targets found where reads are free; ``None`` without validation (no ``metric``).
    """
    return None if metric is None else functools.partial(_stock_binary_validation, preds, target, ignore_index)


def _multilabel_counts(self: Any, preds: Tensor, target: Tensor, metric: Any | None) -> tuple[Tensor, Tensor | None]:
    """Stock's multilabel format + binned update, ``(T, L, 2, 2)``, with fixed shapes (and the batch's validation).

    Stock decides logits over all entries, ignored ones included (it normalizes before it masks): so does this.
    """
    num_labels, report_at_once = self.num_labels, _stock_binary_report(metric, preds, target, self.ignore_index)
    preds = preds.transpose(0, 1).reshape(num_labels, -1).T
    target = target.transpose(0, 1).reshape(num_labels, -1).T
    preds = normalize_logits_if_needed(preds, "sigmoid")
    ignored = None if self.ignore_index is None else target == self.ignore_index
    return _label_counts(self, preds, target, ignored, False, metric, report_at_once)


def _multiclass_counts(
    self: Any, preds: Tensor, target: Tensor, average: str | None, metric: Any | None
) -> tuple[Tensor, Tensor | None]:
    """Stock's multiclass format + binned update (``(T, C, 2, 2)``; micro: ``(T, 2, 2)``) with fixed shapes.

    An entry's kind is ``target == class``. That is all where a batch with any label that is no class is left out
    whole (``metric``, ``validate_args``: the validation's flag is ``target // C != 0``, read at once with stock's
    error where reads are free). Otherwise (``ignore_index``, ``validate_args=False``) each sample adds its kind (2:
    no class, its entries to the sink column; 3: ignored, to the dropped column).
    """
    num_classes, device = self.num_classes, preds.device
    report_at_once = (
        None if metric is None else functools.partial(_raise_not_a_class, preds, target, num_classes, self.ignore_index)
    )
    preds = preds.transpose(0, 1).reshape(num_classes, -1).T
    target = target.flatten()
    ignored = None if self.ignore_index is None else target == self.ignore_index
    preds = normalize_logits_of_kept(preds, "softmax", ignored=None if ignored is None else ignored.unsqueeze(1))
    buckets, rank = _buckets(preds, self.thresholds, False, self.__dict__.get(_ASCENDING, False))
    # ``target == class`` as int64 in one kernel (the lookup's index)
    kinds = torch.eq(target.unsqueeze(1), _arange(num_classes, device), out=torch.empty_like(buckets))
    classes_only = ignored is None and metric is not None
    if not classes_only:
        kinds = kinds.add_(_sample_kinds(target, num_classes, ignored).unsqueeze(1))
    groups, num_thresholds = (1 if average == "micro" else num_classes), self.thresholds.numel()
    table = _table(_CLASS_KINDS if classes_only else _CLASS_KINDS_CHECKED, groups, num_thresholds, False, device)
    confmats, sink = _threshold_counts(table[kinds, _arange(groups, device), buckets], groups, num_thresholds, rank)
    if not classes_only:
        keep = _checked_sink(metric, sink, report_at_once)
    elif target.dtype == torch.bool:  # (bool labels are classes)
        keep = None
    else:
        keep = _checked_sink(metric, _labels_outside(target, num_classes, None), report_at_once)
    return (confmats.squeeze(1) if average == "micro" else confmats), keep


# --------------------------------------------------------------------------------------------------------------------
# unbinned curves with fixed shapes (compute on the device path)


def _ranked_counts(scores: Tensor, positive: Tensor, weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Stock's ``_binary_clf_curve`` of every column of ``scores`` ``(N, G)``, with fixed shapes: ``(tps, fps)``.

    Stock keeps one point per distinct score (``torch.where(preds[1:] - preds[:-1])``: a data-dependent length, read
    on the host). Here every entry keeps a point, in descending score order, holding the counts at the end of its tie
    group: the points of a tie group coincide, so the curve through all ``N`` points is stock's curve with repeated
    points, which add zero-width trapezoids and zero recall steps. The curve starts at the origin: ``(N + 1, G)`` each,
    row 0 all zero. Entries where the bool ``weight`` is false (ignored) count nothing: their points repeat the ones
    before. The counts are float in the default dtype, as stock's ``target * 1.0``.

    The end of an entry's group is found by counting (``cumsum``) the group ends up to each point and searching
    (``searchsorted``) for the first point past the groups ended before it: a dozen launches for any number of columns.
    """
    order = scores.argsort(dim=0, descending=True)
    ranked = scores.gather(0, order)
    hits = (positive if weight is None else positive & weight).gather(0, order)
    device, groups = scores.device, scores.shape[1]
    zero = _constant(0.0, torch.get_default_dtype(), device).expand(1, groups)
    tps = torch.cat([zero, hits]).cumsum(0)  # the hits among the first m entries, m = 0..N (cat makes them float)
    # stock's test for a new threshold (a difference, so that NaN and inf behave as in stock): the origin and the last
    # entry end a group too (their neighbour is NaN)
    nan = _constant("nan", ranked.dtype, device).expand(1, groups)
    padded = torch.cat([nan, ranked, nan])
    ends = (padded[1:] - padded[:-1]) != 0
    ended = ends.cumsum(0)
    last = _search_columns(ended, torch.add(ended, ends, alpha=-1))  # the first point past the groups ended before
    tps = tps.gather(0, last)
    if weight is None:
        return tps, torch.sub(last, tps)  # a point is an entry: those up to its group's end, less the hits
    seen = torch.cat([zero, weight.gather(0, order)]).cumsum(0).gather(0, last)
    return tps, seen - tps


def _search_columns(sorted_columns: Tensor, values: Tensor) -> Tensor:
    """``searchsorted(..., right=True)`` of each column of ``values`` in the same column of ``sorted_columns``."""
    if sorted_columns.shape[1] == 1:  # (N, 1): its transpose is contiguous too
        return torch.searchsorted(sorted_columns.T, values.T, right=True).T
    return torch.searchsorted(sorted_columns.T.contiguous(), values.T.contiguous(), right=True).T


def _constant(value: float | str, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A 1-element tensor of ``float(value)`` (``"nan"``: NaN), made once per dtype and device."""
    return _cached(
        device, ("constant", value, dtype), lambda: torch.full((1,), float(value), dtype=dtype, device=device)
    )


def _constants(values: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``values`` (consecutive integers) as a tensor, made once per dtype and device, without a host-to-device copy."""
    key = ("constants", values, dtype)
    return _cached(device, key, lambda: torch.arange(values[0], values[-1] + 1, dtype=dtype, device=device))


def _average_ignoring_nan(metric: Any, res: Tensor, average: str | None, weights: Tensor | None) -> Tensor:
    """Stock's ``_reduce_auroc``/``_reduce_average_precision`` after ``res``, without boolean indexing.

    ``res[idx].mean()`` becomes a NaN-ignoring mean, the weighted sum zeroes the weights of NaN classes; the warning is
    a deferred warning of ``metric``. Values equal stock's up to the order of the sums.
    """
    if average is None or average == "none":
        return res
    nan = res.isnan()
    if average == "macro":
        _file_warning(metric, NAN_IN_MACRO, nan.any())
        return res.nanmean()
    if average == "weighted" and weights is not None:
        _file_warning(metric, NAN_IN_WEIGHTED, nan.any())
        weights = weights if weights.is_floating_point() else weights.float()
        weights = weights.masked_fill(nan, 0)
        total = weights.sum()
        weights = torch.where(total != 0, weights / total, torch.zeros_like(weights))
        return (res.masked_fill(nan, 0) * weights).sum()
    raise ValueError("Received an incompatible combinations of inputs to make reduction.")


def _list_state(metric: Any) -> tuple[Tensor, Tensor]:
    """Stock's unbinned state: all preds and targets so far."""
    return dim_zero_cat(metric.preds), dim_zero_cat(metric.target)


def _cells(index: Tensor, dropped: Tensor | None, size: int) -> Tensor:
    """Counts of ``index`` in ``size`` cells; entries where ``dropped`` is set land in an extra cell that is cut off."""
    if dropped is None:
        return _count(index, size)
    return _count(torch.where(dropped, size, index), size + 1)[:size]


def _class_counts(target: Tensor, num_classes: int, kept: Tensor | None = None) -> Tensor:
    """Stock's ``_bincount(target, minlength=num_classes).float()`` of valid (kept) labels, with a fixed shape."""
    dropped = (target < 0) | (target >= num_classes)
    if kept is not None:
        dropped |= ~kept
    return _cells(target, dropped, num_classes).float()


def _kept_entries(self: Any, target: Tensor) -> Tensor | None:
    """The entries of a binary/multiclass list state that are not ignored (``None``: all of them).

    (AUROC and AveragePrecision ask: their multiclass states are per class, never one-hot.)
    """
    if self.ignore_index is None:
        return None
    return target != self.ignore_index


# --------------------------------------------------------------------------------------------------------------------
# the metrics


def _family_kinds(self: Any) -> tuple[_deferred.Check, ...]:
    """The checks every metric of the family reports, one fixed slot each.

    The slots are the same for every member (curve, ROC, AUROC, AveragePrecision, LogAUC) and every setting: members
    with equal states share them in a ``MetricCollection`` compute group, where a count filed by one member's
    ``compute`` is reported by whichever member reaches an eager point first. ``validate_args=False`` only means
    that the first slot is never filed.
    """
    return FAMILY_KINDS


def _refresh_kinds(self: Any) -> None:
    """Give a metric made before the patch its counters (a tuple comparison per update otherwise)."""
    # ``!=``, not ``is not``: dynamo traces tuple equality (this runs in compiled computes), and the elements are the
    # same objects, so the comparison calls no ``__eq__``
    if _deferred.kinds_of(self) != FAMILY_KINDS:
        _deferred.keep_kinds(self, FAMILY_KINDS, size=len(FAMILY_KINDS))


def _file_warning(metric: Any, kind: _deferred.Check, count: Tensor) -> None:
    """File a warning of ``compute`` on the device path: ``count`` (0-dim) warnings at the metric's next eager point."""
    _refresh_kinds(metric)
    _deferred.record_in_compute(metric, kind, count)


def _append_to_lists(self: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's list-state update (``thresholds=None``): the formatted preds and targets appended.

    Which entries of an invalid batch are bad is not known without a read, so where the validation filed its flag
    unread the batch is appended as it is: its error is raised at the next eager point (by ``compute()`` at the
    latest, before it returns a value). Where reads are free the validation raised before this.
    """
    self.preds.append(preds)
    self.target.append(target)
    _deferred.sweep(self)


#: The target of an ignored entry in a one-hot (multiclass ``average="micro"``) list state: no one-hot target takes it
#: (they are 0 or 1), unlike ``ignore_index``, which may be either.
IGNORED_ONE_HOT = -1


def _one_hot_dtype_error() -> str | None:
    """What ``one_hot`` says of targets that are not int64, in this torch's words (``None``: it takes them)."""
    try:
        torch.nn.functional.one_hot(torch.zeros(1, dtype=torch.int32), 1)
    except RuntimeError as err:
        return str(err)
    return None


_ONE_HOT_DTYPE_ERROR = _one_hot_dtype_error()


def _micro_list_state(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None
) -> tuple[Tensor, Tensor]:
    """Stock's unbinned ``average="micro"`` format with fixed shapes: flattened scores and one-hot targets.

    Stock drops the ignored entries with a boolean mask and encodes the rest with ``one_hot``, which reads the target
    range on the host (a CUDA sync). Here the one-hot targets are a comparison with every class, and the rows of
    ignored entries stay, all their targets ``IGNORED_ONE_HOT``, left out by every compute
    (:func:`_ignored_entries_dropped`). With ``validate_args=False`` a target of no class is a negative of every class,
    as in the per-class curves (a documented deviation: stock's ``one_hot`` fails).
    """
    if target.dtype != torch.long and _ONE_HOT_DTYPE_ERROR:  # stock's ``one_hot`` raises this first (no read)
        raise RuntimeError(_ONE_HOT_DTYPE_ERROR)
    preds, target = preds.transpose(0, 1).reshape(num_classes, -1).T, target.flatten()
    one_hot = (target.unsqueeze(1) == torch.arange(num_classes, device=target.device)).long()
    kept = None if ignore_index is None else (target != ignore_index).unsqueeze(1)
    if kept is not None:
        one_hot = one_hot.masked_fill(~kept, IGNORED_ONE_HOT)
    # stock's logits test on the kept rows only (all of them without ``ignore_index``)
    return normalize_logits_of_kept(preds, "softmax", kept).flatten(), one_hot.flatten()


def _one_hot_state(self: Any) -> bool:
    """Multiclass ``average="micro"``: the list state holds one-hot targets (0/1; ignored: ``IGNORED_ONE_HOT``)."""
    # the instance dict, not ``getattr(self, "average", None)``: binary curves have no ``average``, and a failed
    # ``nn.Module`` lookup raises and catches an AttributeError (microseconds) on every compute with ``ignore_index``
    return self.__dict__.get("average") == "micro"


@contextmanager
def _ignored_entries_dropped(self: Any) -> Iterator[None]:
    """Stock's unbinned list state for the duration of a stock compute.

    Ignored entries kept by the update (binary and multiclass, unbinned, with ``ignore_index``) are dropped with stock's
    boolean mask. Only the curves whose length depends on the data use this (ROC, PrecisionRecallCurve, LogAUC
    through ROC), and AUROC/AveragePrecision where reads are free: a compute may read where its result's shape depends
    on the data.
    """
    # ``len``, not truth: after a DDP sync the list states are concatenated tensors (``not tensor`` raises)
    if self.thresholds is not None or self.ignore_index is None or len(self.preds) == 0:
        yield
        return
    preds, target = _list_state(self)
    if target.ndim != 1:  # a multilabel state: stock's own compute leaves its ignored entries out
        yield
        return
    kept = target != (IGNORED_ONE_HOT if _one_hot_state(self) else self.ignore_index)
    states = self.preds, self.target
    self.preds, self.target = [preds[kept]], [target[kept]]
    try:
        yield
    finally:
        self.preds, self.target = states


def _compute_without_ignored_entries(target: str) -> Callable[[Any], Any]:
    """A replacement of the ``compute`` at ``target``: stock's, on the list state without ignored entries."""

    def compute(self: Any) -> Any:
        with _ignored_entries_dropped(self):
            return stock(target)(self)

    compute.__module__ = __name__
    compute.__doc__ = "Stock's ``compute``, on the list state without the ignored entries the update kept."
    return compute


_binary_curve_compute, _multiclass_curve_compute, _binary_roc_compute, _multiclass_roc_compute = (
    replaces(target, params=("self",), kind="metric_method")(_compute_without_ignored_entries(target))
    for target in (
        f"{_MODULE}.BinaryPrecisionRecallCurve.compute",
        f"{_MODULE}.MulticlassPrecisionRecallCurve.compute",
        "torchmetrics.classification.roc.BinaryROC.compute",
        "torchmetrics.classification.roc.MulticlassROC.compute",
    )
)


@functools.cache
def _init_signature(target: str) -> inspect.Signature:
    return inspect.signature(stock(target))


def _given_ascending(thresholds: Any) -> bool:
    """Whether ``thresholds`` as given to the constructor are known on the host to be in ascending order.

    A count (stock's ``linspace(0, 1, n)``) or an ascending list; a tensor is not read.
    """
    if isinstance(thresholds, int):
        return True
    return isinstance(thresholds, list) and all(low <= high for low, high in itertools.pairwise(thresholds))


def _curve_init(target: str) -> Callable[..., None]:
    """A replacement of the ``__init__`` at ``target``.

    Stock's, the family's check counters (``checked_init``), and whether the thresholds were given in ascending order
    (:data:`_ASCENDING`: the binned counts need no reordering then).
    """
    init = _deferred.checked_init(target, __name__, _family_kinds, size=len(FAMILY_KINDS))

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        thresholds = _init_signature(target).bind(self, *args, **kwargs).arguments.get("thresholds")
        self.__dict__[_ASCENDING] = _given_ascending(thresholds)

    __init__.__module__ = __name__
    __init__.__doc__ = init.__doc__
    return __init__


# ``params=None``: the signatures differ between releases (1.8 added ``normalization``); the stand-ins forward them
_binary_init, _multiclass_init, _multilabel_init = (
    replaces(f"{_MODULE}.{name}PrecisionRecallCurve.__init__", params=None)(
        _curve_init(f"{_MODULE}.{name}PrecisionRecallCurve.__init__")
    )
    for name in ("Binary", "Multiclass", "Multilabel")
)


def _add_counts(self: Any, confmat: Tensor, keep: Tensor | None) -> None:
    """Add a binned update's counts (``keep``: the batch passed validation; ``None``: not validated), then sweep."""
    if keep is None:
        add_to_states(self, ("confmat",), (confmat,))
    else:
        add_to_state_if(self, "confmat", confmat, keep)
    _deferred.sweep(self)


@replaces(f"{_MODULE}.BinaryPrecisionRecallCurve.update", params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    # an argument since torchmetrics 1.8; not ``getattr(self, ..., default)``: before 1.8 that lookup fails on the
    # ``nn.Module`` (raising and catching an AttributeError, microseconds) on every update
    normalization = self.__dict__.get("normalization", "sigmoid")
    if self.thresholds is not None:  # binned: the value check is the count's sink column
        if self.validate_args:
            _binary_host_checks(preds, target)
        _add_counts(self, *_binary_counts(self, preds, target, normalization, self if self.validate_args else None))
        return
    if self.validate_args:
        _binary_precision_recall_curve_tensor_validation(preds, target, self.ignore_index, metric=self)
    if self.ignore_index is not None:  # the ignored entries stay, every compute of the family leaves them out
        preds, target = preds.flatten(), target.flatten()
        if normalization:  # ``None`` (torchmetrics 1.8+): the scores as given
            preds = normalize_logits_of_kept(preds, normalization, target != self.ignore_index)
    else:
        args = (preds, target, None, self.ignore_index) + (() if normalization == "sigmoid" else (normalization,))
        preds, target, _ = _binary_precision_recall_curve_format(*args)
    _append_to_lists(self, preds, target)


@replaces(f"{_MODULE}.MulticlassPrecisionRecallCurve.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    average = getattr(self, "average", None)
    if self.thresholds is not None:  # binned: the label check is part of the count
        checked = self if self.validate_args else None
        if checked is not None:
            _multiclass_host_checks(preds, target, self.num_classes)
        _add_counts(self, *_multiclass_counts(self, preds, target, average, checked))
        return
    if self.validate_args:
        _multiclass_precision_recall_curve_tensor_validation(
            preds, target, self.num_classes, self.ignore_index, metric=self
        )
    # stock's ``one_hot`` reads the target range, with ``ignore_index`` or without
    if average == "micro":
        preds, target = _micro_list_state(preds, target, self.num_classes, self.ignore_index)
    elif self.ignore_index is not None:
        preds, target = preds.transpose(0, 1).reshape(self.num_classes, -1).T, target.flatten()
        preds = normalize_logits_of_kept(preds, "softmax", (target != self.ignore_index).unsqueeze(1))
    else:
        preds, target, _ = _multiclass_precision_recall_curve_format(
            preds, target, self.num_classes, None, self.ignore_index, average
        )
    _append_to_lists(self, preds, target)


@replaces(f"{_MODULE}.MultilabelPrecisionRecallCurve.update", params=("self", "preds", "target"), kind="metric_method")
def _multilabel_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    if self.thresholds is not None:  # binned: the value check is the count's sink column
        checked = self if self.validate_args else None
        if checked is not None:
            _binary_host_checks(preds, target)
            _num_labels_check(preds, self.num_labels)
        _add_counts(self, *_multilabel_counts(self, preds, target, checked))
        return
    if self.validate_args:
        _multilabel_precision_recall_curve_tensor_validation(
            preds, target, self.num_labels, self.ignore_index, metric=self
        )
    preds, target, _ = _multilabel_precision_recall_curve_format(
        preds, target, self.num_labels, None, self.ignore_index
    )
    _append_to_lists(self, preds, target)
