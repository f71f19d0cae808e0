"""Sync-free ``torchmetrics.regression.r2``: R2Score's ``compute`` (and so ``forward``'s batch value).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``if num_obs < 2: raise ValueError``                 a host lower bound of the count (the smallest batch the
(``num_obs``: the ``total`` state)                   metric's updates saw times their number); the count read
                                                     only when the bound is below 2, i.e. where stock raises (or
                                                     after a merge, a sync or a compute group)
``raw_scores[cond] = 1 - rss[cond] / tss[cond]``,    ``torch.where`` (the same elementwise operations)
``raw_scores[cond_rss & ~cond_tss] = 0.0``
``adjusted``: ``if adjusted > num_obs - 1`` /        both values computed, stock's selected with ``torch.where``;
``elif adjusted == num_obs - 1`` warnings            the warnings filed as deferred warnings of the metric
update: ``self.state = self.state + value``          (no read in stock) in place where the state keeps its dtype
                                                     and shape (both paths), else stock's new tensor
==================================================  ===========================================================

``compute`` has one implementation on every device, with stock's values to the bit (the same elementwise operations
and reductions). Where reads are free (CPU) the ``adjusted`` warnings come at once, as stock's; elsewhere they come
at the metric's next eager point (the end of a ``forward``, the next ``compute()`` or ``reset()``), once per offending
``compute``, under DDP from rank zero only (stock's ``rank_zero_warn``).

Deliberate deviations, on every device: a member of a ``MetricCollection`` compute group (whose updates the group's
first member runs) keeps the bound of its own updates; if the group's later updates are empty batches, its bound can
exceed the true count (only empty batches can make that happen), and a compute with fewer than 2 observations then
returns a value instead of raising. A ``total`` state written by hand below what the updates added is not read
either. Everything else raises as stock does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.regression.r2 import _r2_score_update

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import read_only

_MODULE = "torchmetrics.regression.r2"

#: stock's warnings of ``_r2_score_compute`` with ``adjusted``, filed on the device path as deferred warnings
TOO_MANY_REGRESSORS = _deferred.Check(
    "r2.adjusted-too-many",
    "More independent regressions than data points in adjusted r2 score. Falls back to standard r2 score.",
    UserWarning,
)
DIVISION_BY_ZERO = _deferred.Check(
    "r2.adjusted-division-by-zero",
    "Division by zero in adjusted r2 score. Falls back to standard r2 score.",
    UserWarning,
)
KINDS = (TOO_MANY_REGRESSORS, DIVISION_BY_ZERO)

#: the smallest batch any update of the metric saw: a host int (0 once an update raised), ``None`` before the first
#: update, absent in a metric made before the patch (no bound)
SMALLEST_BATCH = "_syncfree_smallest_batch"


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    stock(f"{_MODULE}.R2Score.__init__")(self, *args, **kwargs)
    # only ``adjusted`` warns: without it no counters (one state less to copy, reset and reduce in every forward);
    # a metric whose ``adjusted`` is set later gets them when it first files a warning
    if self.adjusted != 0:
        _deferred.add_checks(self, KINDS, size=len(KINDS))
    self.__dict__[SMALLEST_BATCH] = None


_init = replaces(f"{_MODULE}.R2Score.__init__", params=("self", "adjusted", "multioutput", "kwargs"))(_init)
_init.__doc__ = "Stock's ``__init__``, plus the ``adjusted`` warnings' counters (if set) and the count bound."


def count_at_least(metric: Any) -> int:
    """A host lower bound of the observations in ``metric``'s ``total`` state (0 where nothing is known).

    Every update since the last reset added at least the smallest batch any update saw, and ``_update_count`` counts
    them (a reset zeroes both the state and the count); a merge, a sync or ``forward``'s reduction only add to the
    state. An update that raised (stock's wrapper counts it) sets the smallest batch to 0 for good.
    """
    smallest = metric.__dict__.get(SMALLEST_BATCH) or 0
    return smallest * metric._update_count


def add_to_state(metric: Any, name: str, value: Tensor | int) -> None:
    """Stock's ``state = state + value``, in place where that keeps the state's dtype and shape.

    In place there is no new tensor and no ``nn.Module.__setattr__`` (most of the update's host time); elsewhere
    stock's new tensor (a float64 batch promotes the state, the first multi-output batch broadcasts it, a state made
    under inference mode is read-only outside it: :func:`~torchmetrics_syncfree._states.read_only`).
    """
    state = metric.__dict__[name] if name in metric.__dict__ else getattr(metric, name)
    if (isinstance(value, int) or (value.dtype == state.dtype and value.shape == state.shape)) and not read_only(state):
        state.add_(value)
    else:
        setattr(metric, name, state + value)


@replaces(f"{_MODULE}.R2Score.update", params=("self", "preds", "target"), kind="metric_method")
def _update(self: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's update (it reads nothing), its sums added in place, keeping the smallest batch for the count bound."""
    smallest = self.__dict__.get(SMALLEST_BATCH, 0)
    self.__dict__[SMALLEST_BATCH] = 0  # an update that raises leaves no bound
    sum_squared_obs, sum_obs, rss, size = _r2_score_update(preds, target)
    add_to_state(self, "sum_squared_error", sum_squared_obs)
    add_to_state(self, "sum_error", sum_obs)
    add_to_state(self, "residual", rss)
    add_to_state(self, "total", size)
    self.__dict__[SMALLEST_BATCH] = size if smallest is None else min(smallest, size)


def _file_warning(metric: Any, kind: _deferred.Check, flag: Tensor) -> None:
    """File a warning of ``compute`` on the device path (a metric made before the patch gets its counters here)."""
    _deferred.keep_kinds(metric, KINDS, size=len(KINDS))
    _deferred.record_in_compute(metric, kind, flag)


def _raw_scores(rss: Tensor, tss: Tensor) -> Tensor:
    """Stock's per-output scores with ``torch.where`` for its boolean-mask writes (the same elementwise values)."""
    cond_rss = ~torch.isclose(rss, torch.zeros_like(rss), atol=1e-4)
    cond_tss = ~torch.isclose(tss, torch.zeros_like(tss), atol=1e-4)
    cond = cond_rss & cond_tss
    # the division only where it is kept (a denominator of 1 elsewhere: no inf/nan, so no nan gradients either)
    scores = torch.where(cond, 1 - rss / torch.where(cond, tss, torch.ones_like(tss)), torch.ones_like(rss))
    return scores.masked_fill(cond_rss & ~cond_tss, 0.0)


@replaces(f"{_MODULE}.R2Score.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's ``compute``: the same value without host reads where they are not free."""
    num_obs = self.total
    # the count is read only where the host bound cannot rule stock's error out (mostly where stock raises)
    if count_at_least(self) < 2 and int(num_obs) < 2:
        raise ValueError("Needs at least two samples to calculate r2 score.")
    rss, sum_obs = self.residual, self.sum_error
    mean_obs = sum_obs / num_obs
    tss = self.sum_squared_error - sum_obs * mean_obs
    raw_scores = _raw_scores(rss, tss)
    if self.multioutput == "raw_values":
        r2 = raw_scores
    elif self.multioutput == "uniform_average":
        r2 = torch.mean(raw_scores)
    elif self.multioutput == "variance_weighted":
        tss_sum = torch.sum(tss)
        r2 = torch.sum(tss / tss_sum * raw_scores)
    else:
        raise ValueError(
            "Argument `multioutput` must be either `raw_values`,"
            f" `uniform_average` or `variance_weighted`. Received {self.multioutput}."
        )
    adjusted = self.adjusted
    if adjusted < 0 or not isinstance(adjusted, int):
        raise ValueError("`adjusted` parameter should be an integer larger or equal to 0.")
    if adjusted == 0:
        return r2
    too_many, division = adjusted > num_obs - 1, adjusted == num_obs - 1
    _file_warning(self, TOO_MANY_REGRESSORS, too_many)
    _file_warning(self, DIVISION_BY_ZERO, division)
    falls_back = too_many | division
    denominator = torch.where(falls_back, torch.ones_like(num_obs), num_obs - adjusted - 1)
    return torch.where(falls_back, r2, 1 - (1 - r2) * (num_obs - 1) / denominator)
