"""Sync-free ``torchmetrics.retrieval.precision_recall_curve``: the precision-recall curve, recall at precision.

RetrievalPrecisionRecallCurve and RetrievalRecallAtFixedPrecision.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``update``: ``_check_retrieval_inputs`` (``target    the update of :mod:`.base`: the value checks are deferred
.max() > 1 or target.min() < 0``, the boolean        checks (stock's ``ValueError`` at the next eager point), the
mask of ``ignore_index``, ``if not numel()``)        ignored entries and invalid batches stay in the list states
                                                     and every compute leaves them out
``compute``: ``torch.sort(indexes)``,                the ranked queries of :mod:`.base` (one stable sort by query
``_flexible_bincount`` + ``.tolist()``, a Python     and score), the relevant documents per (query, rank) by
loop over the queries (``if not                      ``scatter_add_`` into a buffer of N x ``max_k`` (N: documents
mini_target.sum()``, ``topk``, ``cumsum``)           in the state), ``cumsum`` along k, empty queries and the
                                                     aggregation by masks (as the metrics of :mod:`.base`)
``max_k=None``: ``max(split_sizes)`` (the largest    the one host read of the compute: the largest query's size
query, read from the host)                           (``max_k`` is the output's length); none with ``max_k`` set
``_retrieval_recall_at_fixed_precision``: a          ``torch.where`` over the k: the largest recall whose
Python ``max`` over (recall, k) tuples (a read       precision is at least ``min_precision``, its largest k; ``k =
per k) and ``if max_recall == 0.0``                  len(top_k)`` where that recall is 0 or none qualifies
==================================================  ===========================================================

One implementation on every device (the update's checks read at once where reads are free). A callable
``aggregation`` keeps stock's compute (on the list states without the entries the update keeps for it to leave out).

Deviations from stock (documented in ``docs/retrieval.md``, tested in ``tests/test_retrieval.py``):

* tied scores: stock ranks a query's documents with ``torch.topk`` (no defined order among ties); here tied
  documents rank in the order they were added (see :mod:`.base`);
* memory: the per-query curves are rows of an N x ``max_k`` buffer (N documents in the state, at least the number of
  queries), stock's a stack of one row per query;
* the list states hold the entries of ``ignore_index`` and of invalid batches, as in :mod:`.base`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.retrieval.base import (
    KINDS,
    NO_POSITIVE,
    _aggregate,
    _Queries,
    _refresh_kinds,
    list_states_update,
    report_empty_queries,
    stock_compute_unless_fixed_shape,
)

_MODULE = "torchmetrics.retrieval.precision_recall_curve"
_CURVE = f"{_MODULE}.RetrievalPrecisionRecallCurve"


@replaces(
    f"{_CURVE}.__init__",
    params=("self", "max_k", "adaptive_k", "empty_target_action", "ignore_index", "aggregation", "kwargs"),
)
def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's ``__init__``, plus the counters of the retrieval checks (the same as :mod:`.base`'s)."""
    stock(f"{_CURVE}.__init__")(self, *args, **kwargs)
    _deferred.add_checks(self, KINDS, size=len(KINDS))


@replaces(f"{_CURVE}.update", params=("self", "preds", "target", "indexes"), kind="metric_method")
def _update(self: Any, preds: Tensor, target: Tensor, indexes: Tensor) -> None:
    """Stock's update without a host read: its checks deferred, no boolean mask."""
    list_states_update(self, preds, target, indexes)


def _curves(self: Any, q: _Queries, max_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per query (rows of N): precision and recall at k = 1..max_k, and whether the query has no relevant document."""
    counted = q.kept & (q.rank < max_k)
    slot = q.query * max_k + q.rank.clamp(max=max_k - 1)
    relevant = torch.zeros(q.n * max_k, dtype=torch.float32, device=q.target.device)
    relevant = relevant.scatter_add_(0, slot, torch.where(counted, q.target, 0).float()).view(q.n, max_k).cumsum(1)
    k = torch.arange(1, max_k + 1, device=relevant.device)
    size = q.size.view(-1, 1)
    top_k = torch.minimum(k, size) if self.adaptive_k else k  # stock pads ``top_k`` with the query's size
    total = q.sum(q.target).view(-1, 1)
    return relevant / top_k, relevant / total, total.view(-1) == 0


@replaces(f"{_CURVE}.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The per-query curves with fixed shapes (a callable ``aggregation``: stock's compute)."""
    fixed = _curves if isinstance(self.aggregation, str) else None
    out = stock_compute_unless_fixed_shape(self, f"{_CURVE}.compute", fixed)
    if out is not None:
        return out
    _refresh_kinds(self)
    q = _Queries.of_states(self)
    # the output's length: stock's largest query when ``max_k`` is not set (the compute's one host read)
    max_k = self.max_k if self.max_k is not None else int(q.size.max())
    precision, recall, no_target = _curves(self, q, max_k)
    empty_query = q.real & no_target
    action = self.empty_target_action
    if action in ("neg", "pos"):
        fill = 1.0 if action == "pos" else 0.0
        precision = torch.where(empty_query.view(-1, 1), fill, precision)
        recall = torch.where(empty_query.view(-1, 1), fill, recall)
        counted = q.real
    else:
        counted = q.real & ~empty_query
        if action == "error":
            report_empty_queries(self, NO_POSITIVE, empty_query)
    return (
        _aggregate(precision, counted, self.aggregation).to(q.preds),
        _aggregate(recall, counted, self.aggregation).to(q.preds),
        torch.arange(1, max_k + 1, device=q.preds.device),
    )


@replaces(f"{_MODULE}._retrieval_recall_at_fixed_precision", params=("precision", "recall", "top_k", "min_precision"))
def _recall_at_fixed_precision(
    precision: Tensor, recall: Tensor, top_k: Tensor, min_precision: float
) -> tuple[Tensor, Tensor]:
    """Stock's largest qualifying recall and its k, by ``torch.where`` instead of a Python ``max``."""
    qualifies = precision >= min_precision
    best = torch.where(qualifies, recall, -torch.inf).amax()
    max_recall = torch.where(best > -torch.inf, best, 0.0).to(recall.dtype)
    # stock's ``max`` over (recall, k) tuples: among the k of the largest recall, the largest k
    best_k = torch.where(qualifies & (recall == max_recall), top_k, 0).amax()
    best_k = torch.where(max_recall == 0.0, len(top_k), best_k).to(top_k.dtype)
    return max_recall, best_k
