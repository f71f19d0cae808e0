"""Sync-free ``update`` of ``torchmetrics.classification.precision_recall_curve``: the PR-curve family.

``Binary``/``Multiclass``/``MultilabelPrecisionRecallCurve`` are the base classes of ROC, AUROC, AveragePrecision
and LogAUC (every task): they inherit its ``update``, so patching the three updates covers all of them.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``validate_args``: ``torch.unique(target)`` +        one device flag per update (target values in {0, 1} or
``if ...:``                                          ``ignore_index``; multiclass labels in ``[0, C)``), filed
                                                     as a deferred check (raised at once on CPU with stock's
                                                     message, reported at an eager point on the device path, the
                                                     invalid batch left out of the state)
``ignore_index``: ``preds[target != ii]``            ignored entries stay in place and are routed to a dropped
(binary, multiclass), ``mapping[mapping >= 0]``      cell of the count (binned); the logits test looks at the
(multilabel)                                         kept entries only, as stock
binned (``thresholds`` given): ``preds >=            ``torch.bucketize`` of each pred among the sorted thresholds,
thresholds`` for every threshold, counted with       one count per (class, target, bucket) into fixed cells, and
``torch.bincount`` (reads the maximum on CUDA) or    the (T, ..., 2, 2) matrices from suffix sums of those
a Python loop over thresholds for large batches      counts: O(N log T) work and O(N) memory for every batch size
``self.confmat += state``                            ``add_``: in place (a captured CUDA graph replays into it)
==================================================  ===========================================================

With ``thresholds=None`` the state is the list of (formatted) preds and targets: its update is validation and
formatting only. With ``ignore_index`` stock's binary/multiclass update removes the ignored entries with a boolean
mask (one sync per update); on the device path they stay in the list state and every compute of the family leaves
them out (:func:`_keeps_ignored_entries`; a documented deviation of the list state). Multiclass ``average="micro"``
one-hot encodes the targets (stock's ``one_hot`` reads their range): on the device path a comparison with every class
does (:func:`_micro_list_state`). ``compute()`` of the curves is
stock's on the state without ignored entries; AUROC and AveragePrecision have their own (:mod:`.auroc`,
:mod:`.average_precision`).

The counts are integers: identical to stock's for every valid input. Deliberate deviations (documented, tested):

* multiclass validation checks every non-ignored target against ``[0, num_classes)`` as the stat scores do (stock
  counts distinct values);
* with ``validate_args=False``, binary and multilabel targets other than 0 and 1 and multiclass targets outside the
  classes are left out of the binned counts (stock counts them in another threshold's or class's cells, or fails in
  ``one_hot``); in the device path's unbinned micro state such a target is a negative of every class, as in stock's
  per-class curves (stock's ``one_hot`` fails).

"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.classification.precision_recall_curve import (
    _binary_precision_recall_curve_format,
    _binary_precision_recall_curve_update,
    _multiclass_precision_recall_curve_format,
    _multiclass_precision_recall_curve_update,
    _multilabel_precision_recall_curve_format,
    _multilabel_precision_recall_curve_update,
)
from torchmetrics.utilities.checks import _check_same_shape
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_states
from torchmetrics_syncfree.classification.confusion_matrix import _cells, _probabilities
from torchmetrics_syncfree.classification.stat_scores import (
    _file_invalid,
    _not_a_class,
    _outside,
    _raise_not_a_class,
    _without_invalid,
    normalize_logits_if_needed,
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


@replaces(f"{_FUNCTIONAL}._binary_precision_recall_curve_tensor_validation", params=("preds", "target", "ignore_index"))
def _binary_precision_recall_curve_tensor_validation(
    preds: Tensor, target: Tensor, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return _stock_binary_validation(preds, target, ignore_index)
    _check_same_shape(preds, target)
    _check_scores_and_labels(preds, target)
    flag = _outside(target, (0, 1), ignore_index).any()
    return _file_invalid(metric, flag, functools.partial(_stock_binary_validation, preds, target, ignore_index))


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
    if preds.shape[1] != num_labels:
        raise ValueError(
            "Expected both `target.shape[1]` and `preds.shape[1]` to be equal to the number of labels"
            f" but got {preds.shape[1]} and expected {num_labels}"
        )
    return invalid


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
    flag = _not_a_class(target, num_classes, ignore_index).any()
    return _file_invalid(metric, flag, functools.partial(_raise_not_a_class, preds, target, num_classes, ignore_index))


# --------------------------------------------------------------------------------------------------------------------
# binned counting


def _threshold_confmats(preds: Tensor, positive: Tensor, dropped: Tensor | None, thresholds: Tensor) -> Tensor:
    """Stock's multi-threshold confusion matrices, ``(T, G, 2, 2)``, of ``preds >= thresholds[t]`` against ``positive``.

    ``preds``/``positive``/``dropped``: ``(M, G)`` (G groups: classes, labels, or 1). Each pred falls in a bucket, the
    number of thresholds at or below it (NaN: none, as ``nan >= t`` is false), counted per (group, target, bucket) in
    fixed cells; the entries at or above the ``k``-th smallest threshold are the counts of the buckets past ``k``.
    """
    num_thresholds, groups = thresholds.numel(), preds.shape[1]
    dtype = torch.promote_types(preds.dtype, thresholds.dtype)  # the dtype stock's ``>=`` compares in
    order = thresholds.argsort()
    buckets = torch.bucketize(preds.to(dtype).contiguous(), thresholds[order].to(dtype), right=True)
    buckets = buckets.masked_fill(preds.isnan(), 0)
    group = torch.arange(groups, device=preds.device)
    index = (group * 2 + positive.long()) * (num_thresholds + 1) + buckets
    counts = _cells(index.flatten(), None if dropped is None else dropped.flatten(), groups * 2 * (num_thresholds + 1))
    counts = counts.view(groups, 2, num_thresholds + 1)
    totals = counts.sum(-1, keepdim=True)
    at_or_above = (totals - counts.cumsum(-1))[..., :num_thresholds]  # (G, 2, T) in sorted-threshold order
    at_or_above = at_or_above[..., order.argsort()]  # back to the thresholds' own order
    fp, tp = at_or_above[:, 0], at_or_above[:, 1]
    tn, fn = totals[:, 0] - fp, totals[:, 1] - tp
    return torch.stack([tn, fp, fn, tp], dim=-1).view(groups, num_thresholds, 2, 2).transpose(0, 1)


#: Where reads are free, a validated binned batch of at most this many (score, threshold) pairs is counted with
#: stock's functions: their few large ops beat the fixed-shape path's ~25 small ones there (10 classes x batch 32 x 100
#: thresholds: 1.27x stock's host time); above it, bucketize beats stock's comparisons (0.07-0.54x).
STOCK_COUNTING_MAX = 1 << 16


def _counts_withstock(self: Any, preds: Tensor) -> bool:
    """Whether this binned update counts with stock's format and update (identical integers, cheaper when small).

    Only where reads are free (CPU, eager) and after the validation ran (it raised at once for values stock's counting
    would misplace, which the fixed-shape path leaves out instead).
    """
    return (
        self.validate_args
        and _deferred.reads_are_free(preds)
        and preds.numel() * self.thresholds.numel() <= STOCK_COUNTING_MAX
    )


def _binary_curve_state(
    preds: Tensor, target: Tensor, thresholds: Tensor, ignore_index: int | None, normalization: str | None
) -> Tensor:
    """Stock's binary format + binned update, ``(T, 2, 2)``, with fixed shapes."""
    preds, target = preds.flatten(), target.flatten()
    kept = None if ignore_index is None else target != ignore_index
    if normalization:
        preds = _probabilities(preds, kept, normalization)
    dropped = (target != 0) & (target != 1)  # ignored entries, and (validate_args=False) values that are no label
    confmat = _threshold_confmats(preds.unsqueeze(1), (target == 1).unsqueeze(1), dropped.unsqueeze(1), thresholds)
    return confmat.squeeze(1)


def _multiclass_curve_state(
    preds: Tensor, target: Tensor, num_classes: int, thresholds: Tensor, ignore_index: int | None, average: str | None
) -> Tensor:
    """Stock's multiclass format + binned update (``(T, C, 2, 2)``; micro: ``(T, 2, 2)``) with fixed shapes."""
    preds = preds.transpose(0, 1).reshape(num_classes, -1).T
    target = target.flatten()
    kept = (target >= 0) & (target < num_classes)  # (validate_args=False) labels of no class are left out
    if ignore_index is not None:
        not_ignored = target != ignore_index
        preds = _probabilities(preds, not_ignored.unsqueeze(1), "softmax")  # stock's test: the kept rows only
        kept &= not_ignored
    else:
        preds = normalize_logits_if_needed(preds, "softmax")
    positive = target.unsqueeze(1) == torch.arange(num_classes, device=target.device)
    dropped = ~kept.unsqueeze(1).expand_as(positive)
    if average == "micro":
        flat = _threshold_confmats(preds.reshape(-1, 1), positive.reshape(-1, 1), dropped.reshape(-1, 1), thresholds)
        return flat.squeeze(1)
    return _threshold_confmats(preds, positive, dropped, thresholds)


def _multilabel_curve_state(
    preds: Tensor, target: Tensor, num_labels: int, thresholds: Tensor, ignore_index: int | None
) -> Tensor:
    """Stock's multilabel format + binned update, ``(T, L, 2, 2)``, with fixed shapes.

    Stock decides logits over all entries, ignored ones included (it normalizes before it masks): so does this.
    """
    preds = preds.transpose(0, 1).reshape(num_labels, -1).T
    target = target.transpose(0, 1).reshape(num_labels, -1).T
    preds = normalize_logits_if_needed(preds, "sigmoid")
    return _threshold_confmats(preds, target == 1, (target != 0) & (target != 1), thresholds)


# --------------------------------------------------------------------------------------------------------------------
# unbinned curves with fixed shapes (compute on the device path)


def _ranked_counts(scores: Tensor, positive: Tensor, weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Stock's ``_binary_clf_curve`` of every column of ``scores`` ``(N, G)``, with fixed shapes: ``(tps, fps)``.

    Stock keeps one point per distinct score (``torch.where(preds[1:] - preds[:-1])``: a data-dependent length, read
    on the host). Here every entry keeps a point, in descending score order, holding the counts at the end of its tie
    group: the points of a tie group coincide, so the curve through all ``N`` points is stock's curve with repeated
    points, which add zero-width trapezoids and zero recall steps. Entries of ``weight`` 0 (ignored) count nothing:
    their points repeat the ones before. The counts are float in the default dtype, as stock's ``target * 1.0``.
    """
    order = scores.argsort(dim=0, descending=True)
    ranked = scores.gather(0, order)
    hits = positive.gather(0, order).to(torch.get_default_dtype())
    if weight is None:
        misses = 1 - hits
    else:
        kept = weight.gather(0, order).to(hits.dtype)
        hits, misses = hits * kept, (1 - hits) * kept
    tps, fps = hits.cumsum(0), misses.cumsum(0)
    num_entries = scores.shape[0]
    # stock's test for a new threshold (a difference, so that NaN and inf behave as in stock); the last entry ends one
    group_ends = torch.cat([(ranked[1:] - ranked[:-1]) != 0, torch.ones_like(ranked[:1], dtype=torch.bool)])
    position = torch.arange(num_entries, device=scores.device).unsqueeze(1).expand_as(ranked)
    end_of_group = torch.where(group_ends, position, num_entries - 1).flip(0).cummin(0).values.flip(0)
    return tps.gather(0, end_of_group), fps.gather(0, end_of_group)


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


def _state_tensor(metric: Any) -> Tensor:
    """A tensor of the state: whether reads of it are free decides between stock's compute and the sync-free one."""
    return metric.confmat if metric.thresholds is not None else _list_state(metric)[0]


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
    """Give a metric made before the patch its counters (a tuple comparison per update otherwise: no Python call)."""
    # ``!=``, not ``is not``: dynamo traces tuple equality (this runs in compiled computes), and the elements are the
    # same objects, so the comparison calls no ``__eq__``
    if self.__dict__.get(_deferred.KINDS) != FAMILY_KINDS:
        _deferred.keep_kinds(self, FAMILY_KINDS, size=len(FAMILY_KINDS))


def _file_warning(metric: Any, kind: _deferred.Check, count: Tensor) -> None:
    """File a warning of ``compute`` on the device path: ``count`` (0-dim) warnings at the metric's next eager point."""
    _refresh_kinds(metric)
    _deferred.record_in_compute(metric, kind, count)


def _add_to_state(self: Any, invalid: Tensor | None, state: Tensor | tuple[Tensor, Tensor]) -> None:
    """Stock's state update: binned counts added in place (a batch left out when invalid), else the lists appended."""
    if isinstance(state, Tensor):
        (state,) = _without_invalid(invalid, state)
        add_to_states(self, ("confmat",), (state,))
    else:
        # stock's list states (thresholds=None): which entries of an invalid batch are bad is not known on the device
        # path, so the batch is appended as it is; its error is raised at the next eager point (by compute() at the
        # latest, before it returns a value)
        self.preds.append(state[0])
        self.target.append(state[1])
    _deferred.sweep(self)


def _keeps_ignored_entries(target: Tensor) -> bool:
    """Whether this unbinned binary/multiclass update, whose ``ignore_index`` is set, keeps its ignored entries.

    (The callers test ``self.ignore_index is not None`` first, inline: updates without it make no Python call here.)

    Stock drops them with a boolean mask (``preds[target != ignore_index]``: a data-dependent shape, read on the
    host). On the device path they stay, their targets still ``ignore_index`` (one-hot targets: ``IGNORED_ONE_HOT``,
    :func:`_micro_list_state`), and every compute of the family leaves them out (:func:`_ignored_entries_dropped`, or
    weights of 0 in the fixed-shape AUROC/AveragePrecision). Where reads are free the state is stock's.
    """
    return not _deferred.reads_are_free(target)


#: The target of an ignored entry in a one-hot (multiclass ``average="micro"``) list state built on the device path:
#: no one-hot target takes it (they are 0 or 1), unlike ``ignore_index``, which may be either.
IGNORED_ONE_HOT = -1


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
    if target.dtype != torch.long:  # stock's ``one_hot`` raises this first (a dtype check: no read)
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    preds, target = preds.transpose(0, 1).reshape(num_classes, -1).T, target.flatten()
    one_hot = (target.unsqueeze(1) == torch.arange(num_classes, device=target.device)).long()
    kept = None if ignore_index is None else (target != ignore_index).unsqueeze(1)
    if kept is not None:
        one_hot = one_hot.masked_fill(~kept, IGNORED_ONE_HOT)
    # stock's logits test on the kept rows only (all of them without ``ignore_index``)
    return _probabilities(preds, kept, "softmax").flatten(), one_hot.flatten()


def _one_hot_state(self: Any) -> bool:
    """Multiclass ``average="micro"``: the list state holds one-hot targets (0/1; ignored: ``IGNORED_ONE_HOT``)."""
    # the instance dict, not ``getattr(self, "average", None)``: binary curves have no ``average``, and a failed
    # ``nn.Module`` lookup raises and catches an AttributeError (microseconds) on every compute with ``ignore_index``
    return self.__dict__.get("average") == "micro"


@contextmanager
def _ignored_entries_dropped(self: Any) -> Iterator[None]:
    """Stock's unbinned list state for the duration of a stock compute.

    Ignored entries kept by the device path's update (:func:`_keeps_ignored_entries`) are dropped with stock's
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


def _stock_compute_where_reads_are_free(self: Any, target: str) -> Any:
    """Stock's ``compute`` at ``target`` (on the list state without ignored entries) where reads are free, else None.

    AUROC, AveragePrecision and LogAUC compute with stock's code on CPU (its numbers to the bit, its warnings at once)
    and with their fixed-shape code on the device path.
    """
    if self.thresholds is not None:  # binned counts: nothing to drop (the common case, kept to one Python call)
        return stock(target)(self) if _deferred.reads_are_free(self.confmat) else None
    if not _deferred.reads_are_free(_state_tensor(self)):
        return None
    with _ignored_entries_dropped(self):
        return stock(target)(self)


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


# ``params=None``: the signatures differ between releases (1.8 added ``normalization``); the stand-ins forward them
_binary_init = replaces(f"{_MODULE}.BinaryPrecisionRecallCurve.__init__", params=None)(
    _deferred.checked_init(
        f"{_MODULE}.BinaryPrecisionRecallCurve.__init__", __name__, _family_kinds, size=len(FAMILY_KINDS)
    )
)
_multiclass_init = replaces(f"{_MODULE}.MulticlassPrecisionRecallCurve.__init__", params=None)(
    _deferred.checked_init(
        f"{_MODULE}.MulticlassPrecisionRecallCurve.__init__", __name__, _family_kinds, size=len(FAMILY_KINDS)
    )
)
_multilabel_init = replaces(f"{_MODULE}.MultilabelPrecisionRecallCurve.__init__", params=None)(
    _deferred.checked_init(
        f"{_MODULE}.MultilabelPrecisionRecallCurve.__init__", __name__, _family_kinds, size=len(FAMILY_KINDS)
    )
)


@replaces(f"{_MODULE}.BinaryPrecisionRecallCurve.update", params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    invalid = None
    if self.validate_args:
        invalid = _binary_precision_recall_curve_tensor_validation(preds, target, self.ignore_index, metric=self)
    # an argument since torchmetrics 1.8; not ``getattr(self, ..., default)``: before 1.8 that lookup fails on the
    # ``nn.Module`` (raising and catching an AttributeError, microseconds) on every update
    normalization = self.__dict__.get("normalization", "sigmoid")
    if self.thresholds is None:
        if self.ignore_index is not None and _keeps_ignored_entries(target):
            preds, target = preds.flatten(), target.flatten()
            if normalization:  # ``None`` (torchmetrics 1.8+): the scores as given
                preds = _probabilities(preds, target != self.ignore_index, normalization)
        else:
            args = (preds, target, None, self.ignore_index) + (() if normalization == "sigmoid" else (normalization,))
            preds, target, _ = _binary_precision_recall_curve_format(*args)
        _add_to_state(self, invalid, (preds, target))
        return
    if _counts_withstock(self, preds):  # stock's format takes the thresholds (multilabel: how to drop ignored ones)
        args = (preds, target, self.thresholds, self.ignore_index)
        args += () if normalization == "sigmoid" else (normalization,)
        preds, target, _ = _binary_precision_recall_curve_format(*args)
        _add_to_state(self, invalid, _binary_precision_recall_curve_update(preds, target, self.thresholds))
        return
    _add_to_state(self, invalid, _binary_curve_state(preds, target, self.thresholds, self.ignore_index, normalization))


@replaces(f"{_MODULE}.MulticlassPrecisionRecallCurve.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    invalid = None
    if self.validate_args:
        invalid = _multiclass_precision_recall_curve_tensor_validation(
            preds, target, self.num_classes, self.ignore_index, metric=self
        )
    average = getattr(self, "average", None)
    if self.thresholds is None:
        # stock's ``one_hot`` reads the target range, with ``ignore_index`` or without
        if average == "micro" and not _deferred.reads_are_free(target):
            preds, target = _micro_list_state(preds, target, self.num_classes, self.ignore_index)
        elif self.ignore_index is not None and _keeps_ignored_entries(target):
            preds, target = preds.transpose(0, 1).reshape(self.num_classes, -1).T, target.flatten()
            preds = _probabilities(preds, (target != self.ignore_index).unsqueeze(1), "softmax")
        else:
            preds, target, _ = _multiclass_precision_recall_curve_format(
                preds, target, self.num_classes, None, self.ignore_index, average
            )
        _add_to_state(self, invalid, (preds, target))
        return
    if _counts_withstock(self, preds):
        preds, target, _ = _multiclass_precision_recall_curve_format(
            preds, target, self.num_classes, self.thresholds, self.ignore_index, average
        )
        state = _multiclass_precision_recall_curve_update(preds, target, self.num_classes, self.thresholds, average)
    else:
        state = _multiclass_curve_state(preds, target, self.num_classes, self.thresholds, self.ignore_index, average)
    _add_to_state(self, invalid, state)


@replaces(f"{_MODULE}.MultilabelPrecisionRecallCurve.update", params=("self", "preds", "target"), kind="metric_method")
def _multilabel_update(self: Any, preds: Tensor, target: Tensor) -> None:
    _refresh_kinds(self)
    invalid = None
    if self.validate_args:
        invalid = _multilabel_precision_recall_curve_tensor_validation(
            preds, target, self.num_labels, self.ignore_index, metric=self
        )
    if self.thresholds is None:
        preds, target, _ = _multilabel_precision_recall_curve_format(
            preds, target, self.num_labels, None, self.ignore_index
        )
        _add_to_state(self, invalid, (preds, target))
        return
    if _counts_withstock(self, preds):
        preds, target, _ = _multilabel_precision_recall_curve_format(
            preds, target, self.num_labels, self.thresholds, self.ignore_index
        )
        state = _multilabel_precision_recall_curve_update(preds, target, self.num_labels, self.thresholds)
    else:
        state = _multilabel_curve_state(preds, target, self.num_labels, self.thresholds, self.ignore_index)
    _add_to_state(self, invalid, state)
