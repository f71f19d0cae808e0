"""Sync-free ``torchmetrics.retrieval.fall_out``: ``RetrievalFallOut.compute``.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
its own ``compute``: the base class's loop with      the fixed-shape pass of :mod:`.base`: per-query sums of the
``if not (1 - mini_target).sum()`` (queries          non-relevant documents ranked below ``top_k`` and of all of
without a negative target)                           them by ``scatter_add_``, empty queries by masks
==================================================  ===========================================================

The update is the base class's (:mod:`.base`). One implementation on every device: the mean over queries runs in
another order than stock's (float32 rounding). Ties: see :mod:`.base`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree.retrieval.base import (
    NO_NEGATIVE,
    _Queries,
    fixed_shape_compute,
    stock_compute_unless_fixed_shape,
)

_MODULE = "torchmetrics.retrieval.fall_out"


def _fall_out(self: Any, q: _Queries) -> Tensor:
    negative = 1 - q.target
    return q.sum(negative.masked_fill(~q.top(self.top_k), 0)).float() / q.sum(negative)


def _no_negative(q: _Queries) -> Tensor:
    return q.sum(1 - q.target) == 0


@replaces(f"{_MODULE}.RetrievalFallOut.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """One fixed-shape pass (stock's compute for a callable ``aggregation`` or an overridden ``_metric``)."""
    from torchmetrics.retrieval import RetrievalFallOut

    fixed = isinstance(self.aggregation, str) and type(self)._metric is RetrievalFallOut._metric
    out = stock_compute_unless_fixed_shape(self, f"{_MODULE}.RetrievalFallOut.compute", _fall_out if fixed else None)
    if out is not None:
        return out
    return fixed_shape_compute(self, _fall_out, _no_negative, NO_NEGATIVE)
