"""Sync-free ``torchmetrics.aggregation``: MeanMetric, SumMetric, MaxMetric, MinMetric, CatMetric.

Where stock TorchMetrics synchronizes (see ``shared/reference/findings.md``) and what replaces it:

============================================  ================================================================
stock                                          sync-free
============================================  ================================================================
``torch.as_tensor(0.25, device=dev)``          ``torch.full((), 0.25, device=dev)``: a kernel argument, no copy
default weight ``ones_like(value)`` (1.7+) or  no weight tensor at all: unit weights are summed as ``numel``
``as_tensor(1.0)`` (1.6)
``if nans.any() or nans_weight.any():``        a deferred check (``_deferred.record``): read at once on CPU;
                                               on the device path a counter in the metric's state, reported at
                                               an eager point (end of a later update, ``compute()``, ``reset()``)
``x[~nans]`` (``"ignore"``/``"warn"``)         NaN entries are kept but neutralised: weight 0 for means, 0 for
                                               sums, -inf/+inf for max/min; ``CatMetric`` drops them in
                                               ``compute()``
``x[nans] = v`` (float strategy)               ``masked_fill`` into a new tensor: the caller's tensors are
                                               never written
============================================  ================================================================

Deliberate deviations from stock, each a stock bug (tested in ``tests/test_aggregation_parity.py``):

* float ``nan_strategy`` no longer writes into the caller's value and weight tensors; with a broadcast weight
  (e.g. a 0-dim weight tensor) only the NaN positions get the fill weight, instead of every position;
* ``nan_strategy="disable"`` applies the given weights (stock 1.7+ silently replaces them with ones);
* on torchmetrics 1.6, ``MeanMetric.update(value, weight=None)`` means unit weights, as in later releases.

How the checks of ``"warn"``/``"error"`` reach the user: see :mod:`torchmetrics_syncfree._deferred`. Where reads are
free (CPU) at once, as stock; on the device path (CUDA, ``torch.compile``) the NaN count is a metric state reported at
the end of a later eager update or forward, by ``compute()`` or by ``reset()``. The update that contained NaN
contributes nothing to the state with ``"error"`` (stock raises before updating); a ``CatMetric`` keeps that batch in
its list state and leaves it out of ``compute()``.

"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_states, read_only

_MODULE = "torchmetrics.aggregation"
#: torchmetrics 1.6 gave NaN positions the fill value as weight too; 1.7 (PR #2943) changed that to 1.
_FILL_WEIGHT_IS_ONE = compare_version("torchmetrics", operator.ge, "1.7.0")
_NAN_MESSAGE = "Encountered `nan` values in tensor"
#: what ``nan_strategy="error"`` and ``"warn"`` report, per offending update
NAN_ERROR = _deferred.Check("aggregation.nan-error", _NAN_MESSAGE, RuntimeError)
NAN_WARNING = _deferred.Check("aggregation.nan-warning", f"{_NAN_MESSAGE}. Will be removed.", UserWarning)
_REPORTED_NAN = {"error": NAN_ERROR, "warn": NAN_WARNING}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _to_metric_tensor(metric: Any, x: float | Tensor | Any) -> Tensor:
    """Stock's ``torch.as_tensor(x, dtype=metric.dtype, device=metric.device)`` without copying Python numbers.

    Tensors are used where they are (a 0-dim CPU tensor acts as a scalar in CUDA arithmetic, no copy); Python numbers
    become a fill kernel's argument. Other Python data (lists, arrays) has to be copied and goes to ``as_tensor``,
    which also raises stock's errors for non-numeric input.

    """
    if isinstance(x, Tensor):
        return x
    if isinstance(x, int) and not _INT64_MIN <= x <= _INT64_MAX:
        x = float(x)  # a fill takes only what int64 holds; stock's as_tensor makes such an int a float, as here
    if isinstance(x, (int, float)):
        return torch.full((), x, dtype=metric.dtype, device=metric.device)
    return torch.as_tensor(x, dtype=metric.dtype, device=metric.device)


def _nan_mask(metric: Any, value: Tensor, weight: Tensor | None = None) -> Tensor | None:
    """Entries of ``value`` that the metric's ``nan_strategy`` leaves out (or imputes), computed on the device.

    Returns ``None`` when no entry needs leaving out: for ``"disable"``, and where the check was read at once (CPU)
    and found no NaN. For ``"error"`` the whole batch is masked when it contains a NaN, because stock never lets such
    a batch reach the state. Errors and warnings are raised through :mod:`_deferred`.

    """
    strategy = metric.nan_strategy
    if strategy == "disable":
        return None
    nans = torch.isnan(value)
    if weight is not None:
        nans = nans | torch.isnan(weight)
    if strategy == "error":
        any_nan = nans.any()
        return any_nan.expand(nans.shape) if _deferred.record(metric, NAN_ERROR, any_nan) else None
    if strategy == "warn" and not _deferred.record(metric, NAN_WARNING, nans.any()):
        return None
    return nans


def _as_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def _impute_value(metric: Any) -> float | None:
    strategy = metric.nan_strategy
    return strategy if isinstance(strategy, float) else None


def _impute(x: Tensor, mask: Tensor, fill: float) -> Tensor:
    """``x`` with the masked entries set to ``fill``, in ``x``'s own dtype, as stock's ``x[mask] = fill`` does.

    Stock imputes before the cast to the metric's dtype, so the fill is what the input's dtype makes of it: 0.1 is
    0.0999756 in float16, 1e5 is ``inf`` there, 2.5 is 2 in an integer tensor. ``masked_fill`` would raise for a fill
    the dtype cannot hold; a cast of a 0-dim tensor saturates as the indexed write does.
    """
    work_dtype = torch.promote_types(x.dtype, torch.float32)
    return x.masked_fill(mask, torch.full((), fill, dtype=work_dtype, device=x.device).to(x.dtype))


def _cast_and_neutralise(metric: Any, value: Tensor, neutral: float) -> Tensor:
    """``value`` in the metric's dtype with the entries masked by the NaN strategy imputed or set to ``neutral``."""
    mask = _nan_mask(metric, value)
    fill = _impute_value(metric)
    if mask is not None and fill is not None:
        value, mask = _impute(value, mask, fill), None
    value = _as_dtype(value, metric.dtype)
    return value if mask is None else value.masked_fill(mask, neutral)


@replaces(
    f"{_MODULE}.BaseAggregator.__init__",
    params=("self", "fn", "default_value", "nan_strategy", "state_name", "kwargs"),
)
def _aggregator_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's ``__init__``, plus the counter of the NaN check (reported as the ``nan_strategy`` says)."""
    stock(f"{_MODULE}.BaseAggregator.__init__")(self, *args, **kwargs)
    reported = _REPORTED_NAN.get(self.nan_strategy) if isinstance(self.nan_strategy, str) else None
    _deferred.add_checks(self, () if reported is None else (reported,))


def _uses_stock_nan_check(metric: Any) -> bool:
    """A subclass that overrides ``_cast_and_nan_check_input`` gets its override, through the stock ``update``."""
    return type(metric)._cast_and_nan_check_input is not _cast_and_nan_check_input


@replaces(f"{_MODULE}.BaseAggregator._cast_and_nan_check_input", params=("self", "x", "weight"))
def _cast_and_nan_check_input(
    self: Any, x: float | Tensor, weight: float | Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Stock's contract for subclasses that call this helper from their own ``update``.

    The built-in aggregators no longer use it. ``"disable"`` and float strategies are sync-free here.
    ``"warn"``/``"ignore"`` must return tensors without the NaN entries, a data-dependent shape, and ``"error"`` must
    keep NaN out of a state whose update this module does not know, so they keep stock's checks (one sync) for such
    subclasses.

    """
    if self.nan_strategy in ("warn", "ignore", "error"):
        return stock(f"{_MODULE}.BaseAggregator._cast_and_nan_check_input")(
            self, _to_metric_tensor(self, x), None if weight is None else _to_metric_tensor(self, weight)
        )
    x = _to_metric_tensor(self, x)
    weight = torch.ones_like(x) if weight is None else _to_metric_tensor(self, weight)
    mask = _nan_mask(self, x, weight)
    fill = _impute_value(self)
    if mask is not None and fill is not None:
        x = _impute(x, mask, fill)
        weight = _impute(weight, mask, 1.0 if _FILL_WEIGHT_IS_ONE else fill)
    return x.to(self.dtype), weight.to(self.dtype)


def _stock_update(metric: Any, qualname: str, *args: Any) -> None:
    stock(f"{_MODULE}.{qualname}")(metric, *args)


@replaces(f"{_MODULE}.MeanMetric.update", params=("self", "value", "weight"), kind="metric_method")
def _mean_update(self: Any, value: float | Tensor, weight: float | Tensor | None = None) -> None:
    if _uses_stock_nan_check(self):
        return _stock_update(self, "MeanMetric.update", value, weight)
    _mean_fold(self, value, weight)
    _deferred.sweep(self)
    return None


def _mean_fold(self: Any, value: float | Tensor, weight: float | Tensor | None) -> None:
    value = _to_metric_tensor(self, value)
    if weight is not None:
        weight = torch.broadcast_to(_to_metric_tensor(self, weight), value.shape)
    if value.numel() == 0:
        return
    mask = _nan_mask(self, value, weight)
    fill = _impute_value(self)
    if mask is not None and fill is not None:  # before the casts, as stock (see _impute)
        value = _impute(value, mask, fill)
        if weight is not None or not _FILL_WEIGHT_IS_ONE:
            unit = torch.ones_like(value, dtype=self.dtype)  # stock 1.6's default weight: 1.0 in the metric's dtype
            weight = _impute(unit if weight is None else weight, mask, 1.0 if _FILL_WEIGHT_IS_ONE else fill)
        mask = None
    value = _as_dtype(value, self.dtype)
    if weight is not None:
        weight = _as_dtype(weight, self.dtype)
    # the states are updated in place (no attribute assignment): the same tensors, without nn.Module.__setattr__,
    # and what a CUDA graph replays
    if weight is None:
        if mask is None:
            add_to_states(self, _MEAN_STATES, (value.sum(), value.numel()))
        else:
            add_to_states(
                self,
                _MEAN_STATES,
                (value.masked_fill(mask, 0.0).sum(), mask.logical_not().sum(dtype=self.weight.dtype)),
            )
        return
    if mask is not None:
        # both factors masked, not their product: a NaN weight must not reach the gradient of the value (0 * NaN)
        value = value.masked_fill(mask, 0.0)
        weight = weight.masked_fill(mask, 0.0)
    add_to_states(self, _MEAN_STATES, ((value * weight).sum(), weight.sum()))


_MEAN_STATES = ("mean_value", "weight")


def _update_single(
    metric: Any, qualname: str, value: float | Tensor, neutral: float, fold: Callable[[Tensor], None]
) -> None:
    """The common body of Sum/Max/Min/Cat ``update``: cast, check, neutralise NaN entries, fold into the state."""
    if _uses_stock_nan_check(metric):
        return _stock_update(metric, qualname, value)
    value = _to_metric_tensor(metric, value)
    if value.numel():
        fold(_cast_and_neutralise(metric, value, neutral))
    _deferred.sweep(metric)
    return None


@replaces(f"{_MODULE}.SumMetric.update", params=("self", "value"), kind="metric_method")
def _sum_update(self: Any, value: float | Tensor) -> None:
    _update_single(self, "SumMetric.update", value, 0.0, lambda v: add_to_states(self, ("sum_value",), (v.sum(),)))


def _fold_extreme(metric: Any, name: str, extreme: Callable[[Tensor, Tensor], Tensor], batch: Tensor) -> None:
    """``state = extreme(state, batch)``, in place unless autograd records it (``forward`` with ``_enable_grad``).

    In place, the state tensor that a CUDA graph captured is the one that holds the result after every replay;
    autograd needs the old state kept for the backward pass of ``extreme``; a state made under inference mode cannot
    be written outside it (:func:`~torchmetrics_syncfree._states.read_only`).
    """
    state = getattr(metric, name)
    if torch.is_grad_enabled() or read_only(state):
        setattr(metric, name, extreme(state, batch))
    else:
        state.copy_(extreme(state, batch))


@replaces(f"{_MODULE}.MaxMetric.update", params=("self", "value"), kind="metric_method")
def _max_update(self: Any, value: float | Tensor) -> None:
    _update_single(
        self, "MaxMetric.update", value, float("-inf"), lambda v: _fold_extreme(self, "max_value", torch.max, v.max())
    )


@replaces(f"{_MODULE}.MinMetric.update", params=("self", "value"), kind="metric_method")
def _min_update(self: Any, value: float | Tensor) -> None:
    _update_single(
        self, "MinMetric.update", value, float("inf"), lambda v: _fold_extreme(self, "min_value", torch.min, v.min())
    )


@replaces(f"{_MODULE}.CatMetric.update", params=("self", "value"), kind="metric_method")
def _cat_update(self: Any, value: float | Tensor) -> None:
    # "warn"/"ignore"/"error" append the batch as it is (NaN is the neutral element here); compute() drops NaN entries
    _update_single(self, "CatMetric.update", value, float("nan"), self.value.append)


def _without_nan(batches: list[Tensor], has_nan: list[bool], whole_batches: bool) -> list[Tensor]:
    """Stock's list state: batches with NaN lose those entries (flattened) or, for ``"error"``, are left out."""
    kept = []
    for batch, nan in zip(batches, has_nan):
        if nan:
            if whole_batches:
                continue
            batch = batch[~torch.isnan(batch)]
        if batch.numel():
            kept.append(batch)
    return kept


def _concatenated(values: Tensor | list[Tensor]) -> Tensor:
    """Stock's result: the list state concatenated; a tensor state (synced) as it is."""
    return dim_zero_cat(values) if isinstance(values, list) else values


@replaces(f"{_MODULE}.CatMetric.compute", params=("self",), kind="metric_method")
def _cat_compute(self: Any) -> Tensor | list:
    """Stock's concatenation; NaN entries kept by the updates are dropped here (a read: the size depends on them).

    Inside ``forward`` on the device path the batch is returned as it is, NaN entries included: dropping them would
    read the device on every ``forward`` (see the module docstring).
    """
    values = self.value
    if isinstance(values, list) and not values:
        return values
    batches = [values] if isinstance(values, Tensor) else values
    if self.nan_strategy not in ("warn", "ignore", "error") or (
        _deferred.inside_forward(self) and not _deferred.reads_are_free(batches[0])
    ):
        return _concatenated(values)
    # one read per compute() (its result's size depends on the data anyway); per batch, because stock flattened
    # the batches it took NaN out of, and only those: a 0-dim batch and a 2-D one with NaN concatenate in stock
    has_nan = torch.stack([torch.isnan(batch).any() for batch in batches]).tolist()
    if not any(has_nan):
        return _concatenated(values)
    kept = _without_nan(batches, has_nan, whole_batches=self.nan_strategy == "error")
    if kept:
        return dim_zero_cat(kept)
    return values[:0].flatten() if isinstance(values, Tensor) else []
