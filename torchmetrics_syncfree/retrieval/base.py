"""Sync-free ``torchmetrics.retrieval.base``: the update and compute of every ``RetrievalMetric``.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``_check_retrieval_inputs``: ``target.max() > 1      one device flag per update (binary metrics), filed as a
or target.min() < 0`` (two reads)                    deferred check: stock's ``ValueError`` at once on CPU, at
                                                     the next eager point on the device path; the invalid
                                                     batch's targets are stored as ``-1``, which every compute
                                                     leaves out
``ignore_index``: ``indexes[target != ii]`` (a       the ignored entries stay in the list states (targets still
boolean mask), then ``if not indexes.numel()``       ``ignore_index``) and every compute leaves them out; a batch
                                                     whose entries are all ignored is a deferred ``ValueError``
``compute``: ``torch.sort(indexes)``,                one fixed-shape pass (RetrievalMRR, HitRate, Precision,
``_flexible_bincount`` (``torch.unique``) +          Recall, MAP, NormalizedDCG, RPrecision, AUROC; FallOut in
``.tolist()``, a Python loop over the queries        :mod:`.fall_out`): a stable sort by (query, score
with ``if not target.sum()`` and ``torch.split``     descending), query starts by comparison and ``cumsum``, the
per query, the per-query ``_metric``                 rank of each document among its query's kept documents by
                                                     ``cumsum``, per-query sums by ``scatter_add_`` into buffers
                                                     of the fixed size N (documents in the state); the per-query
                                                     values, ``empty_target_action`` and the aggregation by masks
``aggregation``: ``"mean"``/``"median"``/            masked sum / count, masked ``amin``/``amax``, the lower
``"min"``/``"max"`` over the stacked values          middle of the sorted masked values (``gather``); a callable
                                                     keeps stock's compute
``empty_target_action="error"``: ``raise`` in        a deferred ``ValueError`` filed by ``compute`` and read at
the loop                                             its end (the one read of the compute: it is an eager point)
==================================================  ===========================================================

The update and compute are one implementation on every device; where host reads are free (CPU) the update's checks are
read at once (stock's errors where stock raised them). Metrics without a fixed-shape form keep stock's ``compute``
after the sync-free update (on the list states without the entries the update keeps for it to leave out): subclasses
that override ``_metric``, and any callable ``aggregation``. RetrievalPrecisionRecallCurve and
RetrievalRecallAtFixedPrecision have their own update and compute, patched in :mod:`.precision_recall_curve` with the
helpers of this module.

Deviations from stock (documented in ``docs/retrieval.md``, tested in ``tests/test_retrieval.py``):

* the list states hold the entries of ``ignore_index`` and (where the check is not read at once) of invalid
  batches (targets ``-1``), which every compute leaves out; ``indexes``/``preds``/``target`` of the state are
  therefore longer than stock's with ``ignore_index``;
* tied scores: stock ranks the documents of a query with ``torch.topk``/``torch.argsort`` (not stable: their order
  among tied scores depends on the backend and the size); here tied documents rank in the order they were added (a
  stable sort). Values differ only where tied documents of different relevance straddle a cut-off
  (``top_k``, the first relevant document, R of R-precision); NormalizedDCG averages over ties and is unaffected;
* the float sums (the mean over queries, MAP's mean over hits, NormalizedDCG's gains, AUROC's trapezoids) run in
  another order than stock's: equal up to float32 rounding (``rtol=1e-6`` in the tests).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_MODULE = "torchmetrics.retrieval.base"

#: torchmetrics 1.7 made MRR, MAP, Precision and Recall count a relevant document only where its score is positive
_SCORES_MUST_BE_POSITIVE = compare_version("torchmetrics", operator.ge, "1.7.0")

EMPTY = _deferred.Check(
    "retrieval.empty",
    "`indexes`, `preds` and `target` must be non-empty and non-scalar tensors",
    ValueError,
)
NOT_BINARY = _deferred.Check("retrieval.not-binary", "`target` must contain `binary` values", ValueError)
NO_POSITIVE = _deferred.Check(
    "retrieval.no-positive", "`compute` method was provided with a query with no positive target.", ValueError
)
NO_NEGATIVE = _deferred.Check(
    "retrieval.no-negative", "`compute` method was provided with a query with no negative target.", ValueError
)
#: one fixed slot per check, the same for every retrieval metric (equal states in ``MetricCollection`` groups)
KINDS = (EMPTY, NOT_BINARY, NO_POSITIVE, NO_NEGATIVE)

#: the target an invalid batch is stored with where its check is not read at once: never valid for a binary metric,
#: left out
_INVALID_TARGET = -1


def _refresh_kinds(self: Any) -> None:
    """Give a metric made before the patch its counters (a tuple comparison per update otherwise)."""
    _deferred.keep_kinds(self, KINDS, size=len(KINDS))


@replaces(
    f"{_MODULE}.RetrievalMetric.__init__",
    params=("self", "empty_target_action", "ignore_index", "aggregation", "kwargs"),
)
def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's ``__init__``, plus the counters of the retrieval checks."""
    stock(f"{_MODULE}.RetrievalMetric.__init__")(self, *args, **kwargs)
    _deferred.add_checks(self, KINDS, size=len(KINDS))


# --------------------------------------------------------------------------------------------------------------------
# update


def _checked_inputs(self: Any, indexes: Tensor, preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stock's ``_check_retrieval_inputs`` without host reads: the value checks are deferred checks of ``self``.

    Stock's host-only checks (shapes, dtypes, the size of an input without ``ignore_index``) raise at once.
    """
    if indexes.shape != preds.shape or preds.shape != target.shape:
        raise ValueError("`indexes`, `preds` and `target` must be of the same shape")
    if indexes.dtype is not torch.long:
        raise ValueError("`indexes` must be a tensor of long integers")
    ignore_index = self.ignore_index
    if ignore_index is None:
        if not indexes.numel() or not indexes.size():
            raise ValueError(EMPTY.message)
    elif not indexes.numel():
        raise ValueError(EMPTY.message)
    if target.dtype not in (torch.bool, torch.long, torch.int) and not torch.is_floating_point(target):
        raise ValueError("`target` must be a tensor of booleans, integers or floats")
    if not preds.is_floating_point():
        raise ValueError("`preds` must be a tensor of floats")
    # stock's boolean mask turns a 0-dim input into a 1-dim one: flatten does the same without reading
    indexes, preds, target = indexes.flatten(), preds.flatten(), target.flatten()
    kept = None if ignore_index is None else target != ignore_index
    if kept is not None:
        _deferred.record(self, EMPTY, ~kept.any())
    target = target.float() if target.is_floating_point() else target.long()
    if not self.allow_non_binary_target:
        bad = (target > 1) | (target < 0)
        if kept is not None:
            bad &= kept
        invalid = bad.any()
        if _deferred.record(self, NOT_BINARY, invalid):
            target = target.masked_fill(invalid, _INVALID_TARGET)
    return indexes.long(), preds.float(), target


_STOCK_UPDATE = f"{_MODULE}.RetrievalMetric.update"


@replaces(_STOCK_UPDATE, params=("self", "preds", "target", "indexes"), kind="metric_method")
def _update(self: Any, preds: Tensor, target: Tensor, indexes: Tensor) -> None:
    """Stock's update without a host read: its checks deferred, no boolean mask."""
    list_states_update(self, preds, target, indexes)


def list_states_update(self: Any, preds: Tensor, target: Tensor, indexes: Tensor) -> None:
    """The list states' update of every retrieval metric: stock's checks deferred (read at once where reads are free).

    The ignored entries stay in the states (every compute leaves them out); an invalid batch is stored with targets
    ``-1`` where its check is not read at once.
    """
    if indexes is None:
        raise ValueError("Argument `indexes` cannot be None")
    _refresh_kinds(self)
    indexes, preds, target = _checked_inputs(self, indexes, preds, target)
    self.indexes.append(indexes)
    self.preds.append(preds)
    self.target.append(target)
    _deferred.sweep(self)


# --------------------------------------------------------------------------------------------------------------------
# the entries a compute leaves out


def _kept(self: Any, target: Tensor) -> Tensor | None:
    """The entries of the state that stock's state would hold (``None``: all can be, nothing to leave out).

    The update keeps ignored entries (target ``ignore_index``) and invalid batches (target ``-1``, binary
    metrics only: a valid binary target is never negative).
    """
    kept = None
    if not self.allow_non_binary_target:
        kept = target >= 0
    if self.ignore_index is not None:
        kept = target != self.ignore_index if kept is None else kept & (target != self.ignore_index)
    return kept


def _holds_left_out_entries(self: Any) -> bool:
    """Whether the list states hold entries the update kept for the compute to leave out (reads the device).

    Looked at per stored batch, without concatenating: before stock's own compute (a callable ``aggregation``, an
    overridden ``_metric``), which reads the device anyway.
    """
    for target in self.target:
        kept = _kept(self, target)
        if kept is not None and not bool(kept.all()):
            return True
    return False


@contextmanager
def _left_out_entries_dropped(self: Any) -> Iterator[None]:
    """Stock's list states for the duration of a stock compute: the kept-for-later entries dropped by boolean mask.

    Reads the device (a data-dependent shape): used by the computes without a fixed-shape form (stock's, which read
    anyway).
    """
    if not _holds_left_out_entries(self):
        yield
        return
    target = dim_zero_cat(self.target)
    kept = _kept(self, target)
    states = self.indexes, self.preds, self.target
    self.indexes = [dim_zero_cat(self.indexes)[kept]]
    self.preds = [dim_zero_cat(self.preds)[kept]]
    self.target = [target[kept]]
    try:
        yield
    finally:
        self.indexes, self.preds, self.target = states


# --------------------------------------------------------------------------------------------------------------------
# the fixed-shape compute


class _Queries:
    """The documents of the state ranked per query, with fixed shapes (N: documents in the state).

    Sorted stably by query, then by score descending (tied scores keep the order they were added in). Every query
    gets an id in ``[0, N)``; buffers of size N hold per-query sums (ids of no query stay empty).
    """

    def __init__(self, states: list[Tensor], metric: Any) -> None:
        """Rank ``states`` (indexes, preds, target: taken out of the list, so that they are freed once ranked)."""
        indexes, preds, target = states
        states.clear()
        order = torch.sort(preds, descending=True, stable=True).indices
        order = order.gather(0, torch.sort(indexes.gather(0, order), stable=True).indices)
        self.n = indexes.numel()
        self.preds = preds.gather(0, order)
        self.target = target.gather(0, order)
        self.start = self._starts(indexes.gather(0, order))
        del indexes, preds, target, order
        kept = _kept(metric, self.target)  # the entries' own targets decide: computed after the ranking
        self.kept = torch.ones_like(self.target, dtype=torch.bool) if kept is None else kept
        self.query = self.start.cumsum(0).sub_(1)  # a bool cumsum is int64
        self.rank = self._rank(self.start, self.kept)
        self.size = self.sum(self.kept.long())
        #: query ids that are queries of stock's state (at least one document kept)
        self.real = self.size > 0

    @classmethod
    def of_states(cls, metric: Any) -> _Queries:
        """The documents of ``metric``'s ``indexes``, ``preds`` and ``target`` states, ranked."""
        return cls([dim_zero_cat(state) for state in (metric.indexes, metric.preds, metric.target)], metric)

    @staticmethod
    def _starts(keys: Tensor) -> Tensor:
        start = torch.ones_like(keys, dtype=torch.bool)
        start[1:] = keys[1:] != keys[:-1]
        return start

    @staticmethod
    def _rank(start: Tensor, kept: Tensor) -> Tensor:
        """Each entry's 0-based rank among its query's kept entries (cumulative counts minus the query's start)."""
        counted = kept.long()
        before = counted.cumsum(0).sub_(counted)  # non-decreasing: its value at the last query start is a cummax
        del counted
        return before.sub_(torch.where(start, before, 0).cummax(0).values)

    def sum(self, values: Tensor) -> Tensor:
        """Per-query sums of ``values`` (kept entries only) in a buffer of size N."""
        values = values.masked_fill(~self.kept, 0)
        return torch.zeros(self.n, dtype=values.dtype, device=values.device).scatter_add_(0, self.query, values)

    def per_entry(self, per_query: Tensor) -> Tensor:
        """The value of each entry's query."""
        return per_query.gather(0, self.query)

    def top(self, k: int | Tensor | None) -> Tensor:
        """Kept entries ranked below ``k`` (an int, per-query tensor, or ``None`` for all)."""
        if k is None:
            return self.kept
        limit = self.per_entry(k) if isinstance(k, Tensor) else k
        return self.kept & (self.rank < limit)

    def relevant(self) -> Tensor:
        """The targets that count as relevant hits: since 1.7 only where the score is positive."""
        if _SCORES_MUST_BE_POSITIVE:
            return torch.where(self.preds > 0, self.target, torch.zeros_like(self.target))
        return self.target


def _reciprocal_rank(self: Any, q: _Queries) -> Tensor:
    hit = q.top(self.top_k or None) & (q.relevant() != 0)
    never = torch.full((q.n,), q.n, dtype=torch.long, device=q.rank.device)
    first = never.scatter_reduce(0, q.query, torch.where(hit, q.rank, q.n), "amin")
    return torch.where(first < q.n, 1.0 / (first + 1.0), 0.0)


def _hit_rate(self: Any, q: _Queries) -> Tensor:
    return (q.sum(torch.where(q.top(self.top_k), q.target, 0)) > 0).float()


def _precision(self: Any, q: _Queries) -> Tensor:
    if self.top_k is None:
        k = q.size
    elif self.adaptive_k:
        k = torch.where(q.size < self.top_k, q.size, self.top_k)
    else:
        k = torch.full_like(q.size, self.top_k)
    relevant = q.sum(torch.where(q.top(k), q.relevant(), 0)).float()
    return relevant / k


def _recall(self: Any, q: _Queries) -> Tensor:
    relevant = q.sum(torch.where(q.top(self.top_k), q.relevant(), 0)).float()
    return relevant / q.sum(q.target)


def _average_precision(self: Any, q: _Queries) -> Tensor:
    hit = q.top(self.k or None) & (q.relevant() > 0)
    counted = hit.long()
    cumulative = counted.cumsum(0)
    before = cumulative - counted
    hits_so_far = cumulative - torch.where(q.start, before, 0).cummax(0).values  # within the query
    precision_at_hit = torch.where(hit, hits_so_far.float() / (q.rank + 1).float(), 0.0)
    hits = q.sum(counted)
    return torch.where(hits > 0, q.sum(precision_at_hit) / hits, 0.0)


def _discounts(q: _Queries, top_k: int | None) -> Tensor:
    """Stock's ``1 / log2(rank + 2)``, zero from ``top_k`` on."""
    discount = 1.0 / torch.log2(q.rank + 2.0)
    return discount if top_k is None else discount.masked_fill(q.rank >= top_k, 0.0)


def _normalized_dcg(self: Any, q: _Queries) -> Tensor:
    # stock's gain averages the targets over each run of tied scores (``torch.unique(-preds)``): runs are contiguous
    tie_start = q.start.clone()
    tie_start[1:] |= q.preds[1:] != q.preds[:-1]
    run = tie_start.long().cumsum(0) - 1
    target = q.target.float()
    kept = q.kept
    runs = torch.zeros(q.n, dtype=torch.float32, device=target.device)
    run_target = runs.scatter_add(0, run, target.masked_fill(~kept, 0))
    run_size = runs.scatter_add(0, run, kept.float())
    mean_target = (run_target / run_size.clamp(min=1)).gather(0, run)
    gain = q.sum(mean_target * _discounts(q, self.top_k))
    # the ideal gain: the same queries ranked by target, descending (ties do not matter there)
    ideal_order = _Queries([q.query, q.target.float(), q.target], self)  # the query ids group as the indexes do
    ideal = ideal_order.sum(ideal_order.target * _discounts(ideal_order, self.top_k))
    return torch.where(ideal == 0, 0.0, gain / torch.where(ideal == 0, 1.0, ideal))


def _r_precision(self: Any, q: _Queries) -> Tensor:
    relevant_number = q.sum(q.target)
    relevant = q.sum(torch.where(q.top(relevant_number), q.target, 0)).float()
    return relevant / relevant_number


def _tie_runs(q: _Queries) -> tuple[Tensor, Tensor]:
    """Runs of tied scores within each query (contiguous in ``q``'s order): (run start flags, run id in ``[0, N)``)."""
    run_start = q.start.clone()
    run_start[1:] |= q.preds[1:] != q.preds[:-1]
    return run_start, run_start.long().cumsum(0) - 1


def _within_query_before(q: _Queries, counted: Tensor, start: Tensor) -> Tensor:
    """Per entry: ``counted`` entries of its query before the last ``start`` at or before it (0-based cumulative)."""
    counts = counted.long()
    before = counts.cumsum(0) - counts  # non-decreasing: its value at the last start is a cummax
    return torch.where(start, before, 0).cummax(0).values - torch.where(q.start, before, 0).cummax(0).values


def _auroc(self: Any, q: _Queries) -> Tensor:
    """Stock's ``retrieval_auroc`` per query, from the ROC curve of the query's ``top_k`` documents.

    A point per run of tied scores, its trapezoids (clipped at ``max_fpr`` with McClish's correction, as
    ``binary_auroc``); ``0.0`` where the top documents are all relevant or all not.
    """
    counted = q.top(self.top_k or None)
    positive = counted & (q.target > 0)
    negative = counted & (q.target <= 0)
    positives, negatives = q.sum(positive.long()), q.sum(negative.long())
    run_start, run = _tie_runs(q)
    zeros = torch.zeros(q.n, dtype=torch.long, device=run.device)
    # per run (at its first entry): the curve's point before the run and the point at its end
    tps_before = _within_query_before(q, positive, run_start).float()
    fps_before = _within_query_before(q, negative, run_start).float()
    tps_run = zeros.scatter_add(0, run, positive.long()).gather(0, run).float()
    fps_run = zeros.scatter_add(0, run, negative.long()).gather(0, run).float()
    p = q.per_entry(positives).clamp(min=1).float()
    n = q.per_entry(negatives).clamp(min=1).float()
    tpr0, tpr1 = tps_before / p, (tps_before + tps_run) / p
    fpr0, fpr1 = fps_before / n, (fps_before + fps_run) / n
    max_fpr = self.max_fpr
    if max_fpr is None or max_fpr == 1:
        area = (fpr1 - fpr0) * (tpr0 + tpr1) / 2
    else:  # the segment that crosses max_fpr ends at its interpolated point, later segments count nothing
        width = fpr1 - fpr0
        weight = (max_fpr - fpr0) / torch.where(width > 0, width, 1.0)
        tpr_at = torch.lerp(tpr0, tpr1, weight.clamp(max=1.0))
        area = (torch.clamp(fpr1, max=max_fpr) - fpr0).clamp(min=0) * (tpr0 + tpr_at) / 2
    per_query = torch.zeros(q.n, dtype=area.dtype, device=area.device).scatter_add_(
        0, q.query, area.masked_fill(~run_start, 0)
    )
    if max_fpr is not None and max_fpr != 1:
        min_area = 0.5 * max_fpr**2
        per_query = 0.5 * (1 + (per_query - min_area) / (max_fpr - min_area))
    return torch.where((positives > 0) & (negatives > 0), per_query, 0.0)


def _fixed_shape_values() -> dict[Any, Callable[[Any, _Queries], Tensor]]:
    """The stock ``_metric`` of each metric with a fixed-shape form -> its per-query values."""
    from torchmetrics.retrieval import (
        RetrievalAUROC,
        RetrievalHitRate,
        RetrievalMAP,
        RetrievalMRR,
        RetrievalNormalizedDCG,
        RetrievalPrecision,
        RetrievalRecall,
        RetrievalRPrecision,
    )

    return {
        RetrievalMRR._metric: _reciprocal_rank,
        RetrievalHitRate._metric: _hit_rate,
        RetrievalPrecision._metric: _precision,
        RetrievalRecall._metric: _recall,
        RetrievalMAP._metric: _average_precision,
        RetrievalNormalizedDCG._metric: _normalized_dcg,
        RetrievalRPrecision._metric: _r_precision,
        RetrievalAUROC._metric: _auroc,
    }


def _aggregate(values: Tensor, counted: Tensor, aggregation: str) -> Tensor:
    """Stock's ``_retrieval_aggregate`` over the counted queries; ``0.0`` when none is counted (stock: no ``res``).

    Along dim 0: ``values`` may have more dimensions, one row per query (the curves: zeros where none is counted).
    """
    count = counted.sum()
    counted = counted.view(-1, *(1,) * (values.dim() - 1))
    if aggregation == "mean":
        out = values.masked_fill(~counted, 0).sum(0) / count.clamp(min=1)
    elif aggregation == "min":
        out = values.masked_fill(~counted, torch.inf).amin(0)
    elif aggregation == "max":
        out = values.masked_fill(~counted, -torch.inf).amax(0)
    else:  # median: torch.median's lower middle of the counted values, which sort before the uncounted +inf
        ordered = values.masked_fill(~counted, torch.inf).sort(0).values
        middle = ((count - 1).clamp(min=0) // 2).expand(1, *values.shape[1:])
        out = ordered.gather(0, middle).squeeze(0)
    return torch.where(count > 0, out, 0.0)


def report_empty_queries(self: Any, no_target: _deferred.Check, empty_query: Tensor) -> None:
    """``empty_target_action="error"``: stock's error for queries without a (non-)relevant document, raised now.

    Filed and read at once (the eager point: stock raises before it returns a value), by every rank of a synced
    compute alike (not ``record_in_compute``, whose filing is rank zero's only, for warnings); inside ``forward`` it
    is read at forward's end.
    """
    _deferred.record(self, no_target, empty_query.any())
    try:
        _deferred.report_pending(self)
    except BaseException:
        if self._is_synced:  # raised inside the sync context, which unsyncs only when compute returns
            self.unsync()
        raise


def fixed_shape_compute(
    self: Any,
    values: Callable[[Any, _Queries], Tensor],
    empty: Callable[[_Queries], Tensor],
    no_target: _deferred.Check,
) -> Tensor:
    """Stock's ``compute`` loop as one fixed-shape pass: per-query ``values``, ``empty`` queries per the action."""
    _refresh_kinds(self)
    q = _Queries.of_states(self)
    empty_query = q.real & empty(q)
    value = values(self, q).to(q.preds.dtype)
    action = self.empty_target_action
    if action in ("neg", "pos"):
        value = torch.where(empty_query, 1.0 if action == "pos" else 0.0, value)
        counted = q.real
    else:
        counted = q.real & ~empty_query
        if action == "error":
            report_empty_queries(self, no_target, empty_query)
    return _aggregate(value, counted, self.aggregation).to(q.preds)


def _no_positive(q: _Queries) -> Tensor:
    return q.sum(q.target) == 0


_VALUES: dict[Any, Callable[[Any, _Queries], Tensor]] | None = None


def values_of(self: Any) -> Callable[[Any, _Queries], Tensor] | None:
    """The fixed-shape per-query values of ``self``'s metric, or ``None`` where stock's compute stays."""
    global _VALUES
    if _VALUES is None:
        _VALUES = _fixed_shape_values()
    if not isinstance(self.aggregation, str):
        return None
    return _VALUES.get(type(self)._metric)


def stock_compute_unless_fixed_shape(self: Any, target: str, values: Callable[[Any, _Queries], Tensor] | None) -> Any:
    """Stock's compute at ``target`` (on stock's list states) where no fixed-shape form exists or nothing was added.

    Returns ``None`` where the fixed-shape form computes.
    """
    if values is not None and self.target:
        return None
    with _left_out_entries_dropped(self):
        return stock(target)(self)


@replaces(f"{_MODULE}.RetrievalMetric.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """One fixed-shape pass where the metric has one, else stock's compute."""
    values = values_of(self)
    out = stock_compute_unless_fixed_shape(self, f"{_MODULE}.RetrievalMetric.compute", values)
    if out is not None:
        return out
    return fixed_shape_compute(self, values, _no_positive, NO_POSITIVE)
