"""Sync-free ``torchmetrics.regression.pearson``: PearsonCorrCoef's ``compute`` (and so ``forward``'s batch value).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``if (var_x < bound).any() or ...: rank_zero_warn``  the flag filed as a deferred warning of the metric (one
                                                     counter per dtype: the message names it)
``if valid_mask.any(): corrcoef[valid_mask] = ...``  ``torch.where`` over every output (the same elementwise
(1.7+: boolean-mask read and write)                  operations; the masked outputs divide by 1, so no NaN
                                                     gradient leaks into them)
==================================================  ===========================================================

The update reads nothing (its ``num_obs == 1`` branch is the batch's shape) and stays stock's, and so does the
aggregation of several ranks' running statistics (``_final_aggregation``: tensor arithmetic). Each release's code is
followed, told apart by feature (1.7.4 has 1.9's code, 1.7.1 not): 1.6 (warning only), 1.7.1 (NaN for near-zero
variances), 1.7.4-1.9 (statistics scaled by the largest absolute deviation; non-finite statistics masked too). The
releases before the scaling read the prior count in their update (``if num_prior.mean() > 0``): replaced too, on
every device (one implementation: stock's arithmetic, the branch known on the host or selected with ``torch.where``).

``compute`` has one implementation on every device, with stock's values to the bit; the warning comes at once where
reads are free (CPU), else at the metric's next eager point (the end of a ``forward``, the next ``compute()`` or
``reset()``), once per offending ``compute``, under DDP from rank zero only (stock's ``rank_zero_warn``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torchmetrics.functional.regression.pearson as _functional
from torch import Tensor

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_MODULE = "torchmetrics.regression.pearson"

# The releases differ by feature, not by minor version (1.7.4 has 1.9's code, 1.7.1 not): read them off the source.
_COMPUTE_SOURCE = inspect.getsource(_functional._pearson_corrcoef_compute)
#: 1.7+ sets the coefficient of near-zero variances to NaN (and says so in the warning)
_MASKS = "valid_mask" in _COMPUTE_SOURCE
#: later releases also mask (and warn about) non-finite statistics
_FINITE = "isfinite" in _COMPUTE_SOURCE
#: later releases keep the largest absolute deviations and update without reading; earlier updates read the count
_SCALED = "max_abs_dev_x" in inspect.signature(_functional._pearson_corrcoef_update).parameters

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _message(dtype: torch.dtype) -> str:
    """Stock's message (its missing spaces included) for the dtype of the scaled variances."""
    return (
        "The variance of predictions or target is close to zero. This can cause instability in Pearson correlation"
        "coefficient, leading to wrong results. Consider re-scaling the input if possible or computing using a"
        f"larger dtype (currently using {dtype})." + (" Setting the correlation coefficient to nan." if _MASKS else "")
    )


#: stock's compute-time warning, one check per dtype its message can name (in this order: the metric's counters)
KINDS = tuple(_deferred.Check(f"pearson.small-variance.{dtype}", _message(dtype), UserWarning) for dtype in _DTYPES)


def _kinds(self: Any) -> tuple[_deferred.Check, ...]:
    return KINDS


_stock_init_with_checks = _deferred.checked_init(
    f"{_MODULE}.PearsonCorrCoef.__init__", __name__, _kinds, size=len(KINDS)
)


@replaces(f"{_MODULE}.PearsonCorrCoef.__init__", params=("self", "num_outputs", "kwargs"))
def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's ``__init__``, plus the variance warning's counters and (early releases' update) the count bound."""
    _stock_init_with_checks(self, *args, **kwargs)
    self.__dict__["_syncfree_smallest_batch"] = None


def _coefficient(
    metric: Any,
    var_x: Tensor,
    var_y: Tensor,
    corr_xy: Tensor,
    nb: Tensor,
    max_abs_dev_x: Tensor | None,
    max_abs_dev_y: Tensor | None,
) -> Tensor:
    """Stock's ``_pearson_corrcoef_compute`` of the installed release, its warning filed instead of read."""
    var_x = var_x / (nb - 1)
    var_y = var_y / (nb - 1)
    corr_xy = corr_xy / (nb - 1)
    if var_x.dtype == torch.float16 and var_x.device == torch.device("cpu"):  # stock's: no half sqrt on CPU
        var_x = var_x.bfloat16()
        var_y = var_y.bfloat16()
    if max_abs_dev_x is not None:  # the releases that scale by the largest absolute deviation
        var_x = var_x * torch.pow(max_abs_dev_x, -2)
        var_y = var_y * torch.pow(max_abs_dev_y, -2)
        corr_xy = corr_xy / (max_abs_dev_x * max_abs_dev_y)
    bound = math.sqrt(torch.finfo(var_x.dtype).eps)
    masked = (var_x < bound) | (var_y < bound)
    warns = (var_x < bound).any() | (var_y < bound).any()
    if _FINITE:
        # stock's ``~torch.isfinite(v).any()`` negates the ``any``: it warns when no statistic is finite
        warns = warns | ~torch.isfinite(var_x).any() | ~torch.isfinite(var_y).any() | ~torch.isfinite(corr_xy).any()
        masked = masked | ~torch.isfinite(var_x) | ~torch.isfinite(var_y) | ~torch.isfinite(corr_xy)
    _deferred.keep_kinds(metric, KINDS, size=len(KINDS))  # a metric made before the patch gets its counters here
    _deferred.record_in_compute(metric, KINDS[_DTYPES.index(var_x.dtype)], warns)
    if not _MASKS:  # 1.6: the warning only
        return torch.clamp((corr_xy / (var_x * var_y).sqrt()).squeeze(), -1.0, 1.0)
    # the masked outputs divide by 1: the same values elsewhere, and no NaN gradient leaks out of them
    safe_x, safe_y = var_x.masked_fill(masked, 1), var_y.masked_fill(masked, 1)
    value = (corr_xy.masked_fill(masked, 0) / (safe_x * safe_y).sqrt()).to(corr_xy.dtype)
    # stock clamps only when some output is valid: NaN stays NaN under the clamp, so always clamping is the same
    return torch.clamp(value.masked_fill(masked, float("nan")), -1.0, 1.0).squeeze()


#: the smallest batch any update of the metric saw (see :mod:`~torchmetrics_syncfree.regression.r2`)
SMALLEST_BATCH = "_syncfree_smallest_batch"


def _early_running_update(metric: Any, preds: Tensor, target: Tensor, prior_counted: bool) -> None:
    """The early ``_pearson_corrcoef_update`` (1.6, 1.7.1), its branch ``num_prior.mean() > 0`` taken without a read.

    The branch is known on the host for a batch of one, after an earlier non-empty update (the smallest batch times
    the earlier updates), and in the first update since a reset (the count is reset's zeros; unless the states are
    persistent, i.e. may have been loaded); otherwise both branches are computed and one is selected with
    ``torch.where``, unless their means differ in dtype or shape (stock's first-update branch casts the means to the
    state's dtype and keeps ``mean(0)``'s shape), where the flag is read as stock does. The states change in place as
    stock's do.
    """
    from torchmetrics.functional.regression.utils import _check_data_shape_to_num_outputs
    from torchmetrics.utilities.checks import _check_same_shape

    _check_same_shape(preds, target)
    _check_data_shape_to_num_outputs(preds, target, metric.num_outputs)
    mean_x, mean_y, var_x, var_y, corr_xy, num_prior = (
        metric.mean_x,
        metric.mean_y,
        metric.var_x,
        metric.var_y,
        metric.corr_xy,
        metric.n_total,
    )
    num_obs = preds.shape[0]
    cond: bool | Tensor = num_obs == 1 or prior_counted
    mx_new = (num_prior * mean_x + preds.sum(0)) / (num_prior + num_obs)
    my_new = (num_prior * mean_y + target.sum(0)) / (num_prior + num_obs)
    if cond is not True:
        mx_first, my_first = preds.mean(0).to(mean_x.dtype), target.mean(0).to(mean_y.dtype)
        if metric._update_count == 1 and not any(metric._persistent.values()):
            cond = False  # the first update since the reset: the count is reset's zeros (no state was loaded)
        else:
            cond = num_prior.mean() > 0
            if (mx_new.dtype, mx_new.shape, my_new.dtype, my_new.shape) != (
                mx_first.dtype,
                mx_first.shape,
                my_first.dtype,
                my_first.shape,
            ):
                cond = bool(cond)  # the branches' means differ in dtype or shape: stock's read
        if cond is False:
            mx_new, my_new = mx_first, my_first
        elif cond is not True:
            mx_new, my_new = torch.where(cond, mx_new, mx_first), torch.where(cond, my_new, my_first)
    num_prior += num_obs
    var_x_add = ((preds - mx_new) * (preds - mean_x)).sum(0)
    var_y_add = ((target - my_new) * (target - mean_y)).sum(0)
    if cond is not True:
        first_x, first_y = preds.var(0) * (num_obs - 1), target.var(0) * (num_obs - 1)
        var_x_add = first_x if cond is False else torch.where(cond, var_x_add, first_x)
        var_y_add = first_y if cond is False else torch.where(cond, var_y_add, first_y)
    var_x += var_x_add
    var_y += var_y_add
    corr_xy += ((preds - mx_new) * (target - mean_y)).sum(0)
    metric.mean_x, metric.mean_y = mx_new, my_new
    metric.var_x, metric.var_y, metric.corr_xy, metric.n_total = var_x, var_y, corr_xy, num_prior


@replaces(f"{_MODULE}.PearsonCorrCoef.update", params=("self", "preds", "target"), kind="metric_method")
def _update(self: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's update where it reads nothing (1.7.4+); the early releases' without the read of the prior count."""
    if _SCALED:
        stock(f"{_MODULE}.PearsonCorrCoef.update")(self, preds, target)
        return
    smallest = self.__dict__.get(SMALLEST_BATCH, 0)
    self.__dict__[SMALLEST_BATCH] = 0  # an update that raises leaves no bound
    # the updates before this one (counted already by stock's wrapper) surely added an observation
    prior_counted = (smallest or 0) * (self._update_count - 1) >= 1
    _early_running_update(self, preds, target, prior_counted)
    size = preds.shape[0]
    self.__dict__[SMALLEST_BATCH] = size if smallest is None else min(smallest, size)


@replaces(f"{_MODULE}.PearsonCorrCoef.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's ``compute``: the same value without host reads."""
    _, _, max_x, max_y, var_x, var_y, corr_xy, n_total = final_statistics(self)
    return _coefficient(self, var_x, var_y, corr_xy, n_total, max_x, max_y)


def final_statistics(metric: Any) -> tuple[Tensor | None, ...]:
    """The running statistics of a PearsonCorrCoef (or ConcordanceCorrCoef) as its ``compute`` uses them.

    ``(mean_x, mean_y, max_abs_dev_x, max_abs_dev_y, var_x, var_y, corr_xy, n_total)``, the largest absolute
    deviations ``None`` before 1.7.4; the states of several ranks (synced without reduction) aggregated by stock's
    ``_final_aggregation`` (tensor arithmetic only).
    """
    scaled = _SCALED  # 1.7.4+ (a module constant: ``hasattr`` fails, a costly lookup, on the earlier releases)
    states = [metric.mean_x, metric.mean_y]
    if scaled:
        states += [metric.max_abs_dev_x, metric.max_abs_dev_y]
    states += [metric.var_x, metric.var_y, metric.corr_xy, metric.n_total]
    if (metric.num_outputs == 1 and metric.mean_x.numel() > 1) or (metric.num_outputs > 1 and metric.mean_x.ndim > 1):
        from torchmetrics.regression.pearson import _final_aggregation

        states = list(_final_aggregation(*states))
    if not scaled:
        states[2:2] = [None, None]
    return tuple(states)
