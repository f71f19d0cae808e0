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
``x[~nans]`` (``"ignore"``/``"warn"``)         NaN entries are kept but neutralised, on every device: weight 0
                                               for means, 0 for sums (``nansum``), -inf/+inf for max/min;
                                               ``CatMetric`` drops them in ``compute()``
``x[nans] = v`` (float strategy)               imputed into a new tensor with the input's strides: the caller's
                                               tensors are never written
============================================  ================================================================

Bit parity for any input layout: a float sum adds in an order that depends on the strides of what it reduces (CPU
kernels vectorise over unit-stride memory and walk other layouts element by element; over a dense tensor they follow
its memory order). Each sum here runs over what stock's runs over, laid out as stock's: the caller's view for
``SumMetric`` and for weights (``nansum`` where NaN may need leaving out, or a copy with the caller's strides), a dense
tensor in the value's dimension order for ``MeanMetric``'s ``value * weight``. Values of float16, bfloat16 and float64
are cast to the metric's dtype where stock casts them. A batch without NaN therefore gives stock's bits on both paths
(``tests/test_strided_parity.py``); one with NaN under ``"warn"``/``"ignore"`` adds its kept entries in another
order than stock's compacted tensor (stock's shape depends on the data: no sync-free update can reproduce it), the
same order on a CPU as on a GPU.

Deliberate deviations from stock, each a stock bug (tested in ``tests/test_aggregation_parity.py``):

* float ``nan_strategy`` no longer writes into the caller's value and weight tensors; with a broadcast weight
  (e.g. a 0-dim weight tensor) only the NaN positions get the fill weight, instead of every position;
* ``nan_strategy="disable"`` applies the given weights (stock 1.7+ silently replaces them with ones);
* on torchmetrics 1.6, ``MeanMetric.update(value, weight=None)`` means unit weights, as in later releases;
* ``MeanMetric``/``SumMetric`` with ``"warn"``/``"ignore"`` and a batch that holds NaN: the kept entries are added
  in the input's order (NaN entries add +0), not in the order of stock's compacted copy: equal up to float rounding
  (1e-6 in the tests), not to the bit, and the same bits on every device.

How the checks of ``"warn"``/``"error"`` reach the user: see :mod:`torchmetrics_syncfree._deferred`. Where reads are
free (CPU) at once, as stock; on the device path (CUDA, ``torch.compile``) the NaN count is a metric state reported at
the end of a later eager update or forward, by ``compute()`` or by ``reset()``. The update that contained NaN
contributes nothing to the state with ``"error"`` (stock raises before updating); a ``CatMetric`` keeps that batch in
its list state and leaves it out of ``compute()``.

"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred, _instrumentation
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_states, read_only

_MODULE = "torchmetrics.aggregation"
#: torchmetrics 1.6 gave NaN positions the fill value as weight too; 1.7 changed that to 1.
_FILL_WEIGHT_IS_ONE = compare_version("torchmetrics", operator.ge, "1.7.0")
_NAN_MESSAGE = "Encountered `nan` values in tensor"
#: what ``nan_strategy="error"`` and ``"warn"`` report, per offending update
NAN_ERROR = _deferred.Check("aggregation.nan-error", _NAN_MESSAGE, RuntimeError)
NAN_WARNING = _deferred.Check("aggregation.nan-warning", f"{_NAN_MESSAGE}. Will be removed.", UserWarning)
_REPORTED_NAN = {"error": NAN_ERROR, "warn": NAN_WARNING}


def _fill_overflow_checks() -> dict[torch.dtype, _deferred.Check]:
    """What stock's imputation ``x[nans] = fill`` raises, per dtype, where ``fill`` is beyond the dtype's range.

    Torch builds differ: most raise ``value cannot be converted to type ... without overflow``; some round the fill to
    infinity in half precision (the CPU wheel of torch 2.13). One write of a 1-element CPU tensor per dtype tells
    which, and in this build's words.
    """
    checks = {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.zeros(1, dtype=dtype)
        try:
            with _instrumentation.quiet():
                x[torch.ones(1, dtype=torch.bool)] = 2.0 * torch.finfo(dtype).max
        except RuntimeError as err:
            checks[dtype] = _deferred.Check(f"aggregation.fill-overflow.{dtype}", str(err), RuntimeError)
    return checks


#: per input dtype, what stock raises where a float ``nan_strategy`` does not fit it (empty where nothing raises)
_FILL_OVERFLOW = _fill_overflow_checks()
_FILL_OVERFLOW_KINDS = frozenset(_FILL_OVERFLOW.values())
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

    Returns ``None`` when no entry needs leaving out: for ``"disable"``, and where the check of ``"warn"``/``"error"``
    was read at once (:func:`_deferred.record`, CPU) and found no NaN. Otherwise the mask may be clear: the sums mask
    by arithmetic, never by a data-dependent shape, so a batch adds the same bits on every device. For ``"error"`` the
    mask is the 0-dim flag "this batch holds a NaN" (it broadcasts over the batch), because stock never lets such a
    batch reach the state. Errors and warnings are raised through :mod:`_deferred`.

    """
    strategy = metric.nan_strategy
    if strategy == "disable":
        return None
    nans = torch.isnan(value)
    if weight is not None:
        nans = nans | torch.isnan(weight)
    if strategy == "error":
        any_nan = nans.any()
        return any_nan if _deferred.record(metric, NAN_ERROR, any_nan) else None
    if strategy == "warn":
        return nans if _deferred.record(metric, NAN_WARNING, nans.any()) else None
    overflow = _fill_overflow(metric, value, weight)
    if overflow is not None:  # stock's imputation raises: the batch is left out, as for "error"
        any_nan = nans.any()
        return any_nan if _deferred.record(metric, overflow, any_nan) else None
    return nans  # "ignore" and float strategies report nothing


def _fill_overflow(metric: Any, value: Tensor, weight: Tensor | None = None) -> _deferred.Check | None:
    """The error stock raises imputing a float ``nan_strategy`` that ``value``'s dtype cannot hold (``None``: none).

    TorchMetrics 1.6 also writes the fill into the weight. A metric reports one such check: where its inputs change
    dtype it keeps the first (a counter per metric, see :func:`~torchmetrics_syncfree._deferred.add_checks`).
    """
    fill = metric.nan_strategy
    if fill.__class__ is not float or not _FILL_OVERFLOW or not math.isfinite(fill):
        return None
    written = (value,) if _FILL_WEIGHT_IS_ONE or weight is None else (value, weight)
    for x in written:
        check = _FILL_OVERFLOW.get(x.dtype)
        if check is not None and abs(fill) > torch.finfo(x.dtype).max:
            return _deferred.kinds_of(metric)[0] if _reports_fill_overflow(metric) else check
    return None


def _reports_fill_overflow(metric: Any) -> bool:
    kinds = _deferred.kinds_of(metric)
    return bool(kinds) and kinds[0] in _FILL_OVERFLOW_KINDS


def _drops_batch(metric: Any, value: Tensor, weight: Tensor | None = None) -> bool:
    """Whether a batch with NaN never reaches the state: ``"error"``, or a fill stock fails to write."""
    return metric.nan_strategy == "error" or _fill_overflow(metric, value, weight) is not None


def _as_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def _impute_value(metric: Any, value: Tensor, weight: Tensor | None = None) -> float | None:
    """The float ``nan_strategy`` imputed into ``value`` (``None``: nothing is imputed, see :func:`_drops_batch`)."""
    strategy = metric.nan_strategy
    return strategy if isinstance(strategy, float) and _fill_overflow(metric, value, weight) is None else None


def _fill_of(x: Tensor, fill: float) -> Tensor:
    """``fill`` as a 0-dim tensor of ``x``'s dtype, as stock's indexed write ``x[mask] = fill`` stores it.

    Stock imputes before the cast to the metric's dtype, so the fill is what the input's dtype makes of it: 0.1 is
    0.0999756 in float16, 1e5 is ``inf`` there, 2.5 is 2 in an integer tensor. ``masked_fill`` would raise for a fill
    the dtype cannot hold; a cast of a 0-dim tensor saturates as the indexed write does.
    """
    work_dtype = torch.promote_types(x.dtype, torch.float32)
    return torch.full((), fill, dtype=work_dtype, device=x.device).to(x.dtype)


def _impute(x: Tensor, mask: Tensor, value: Tensor | float, own_nans: bool = False) -> Tensor:
    """A new tensor: ``x`` with the masked entries ``value``, with ``x``'s sizes and strides where it can.

    Stock writes into the caller's tensor (``x[mask] = fill``), so what it reduces afterwards has the caller's strides,
    and a float sum adds in an order that depends on them (CPU kernels vectorise over unit-stride memory and walk other
    layouts element by element; over a dense tensor they follow its memory order). ``masked_fill`` makes a contiguous
    result and ``torch.where`` lays its result out as its mask; where neither is ``x``'s layout the result is copied
    into a tensor with ``x``'s strides (``empty_strided`` also holds the gaps of a view such as a column). Entries
    that share memory (stride 0 of ``expand``) cannot take different values: where ``mask`` is ``x``'s own NaN
    pattern (``own_nans``; entries that share memory share NaN) the memory span of ``x`` is imputed and viewed with
    ``x``'s strides; for another mask the result is dense, and :func:`_sum_as_stock` takes ``x``'s own sum when
    nothing is masked. A tensor ``value`` goes to ``torch.where``, never to ``masked_fill`` (which reads a 0-dim value
    tensor on the host on CUDA); a number to ``masked_fill`` where ``x`` is contiguous (one op, no scalar tensor).
    """
    if isinstance(value, float) and x.is_contiguous():
        return x.masked_fill(mask, value)
    if not _aliased(x):
        filled = torch.where(mask, value, x)
        if filled.stride() == x.stride():
            return filled
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(filled)
    if not own_nans:
        return torch.where(mask, value, x)
    span = x.as_strided((1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride())),), (1,))
    return torch.where(torch.isnan(span), value, span).as_strided(x.shape, x.stride())


def _zeroed(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with the masked entries 0: dense, laid out as elementwise ops on ``x`` lay out their results.

    ``masked_fill`` (one op) where ``x`` is contiguous; else ``torch.where``, whose result follows its mask, a result
    of elementwise ops on ``x``.
    """
    return x.masked_fill(mask, 0.0) if x.is_contiguous() else torch.where(mask, 0.0, x)


def _sum_as_stock(x: Tensor, imputed: Tensor, mask: Tensor) -> Tensor:
    """The sum of ``imputed`` (``x`` through :func:`_impute`) in the order of stock's sum over ``x`` imputed in place.

    Where ``imputed`` could not keep ``x``'s layout (entries of ``x`` share memory, the mask is not theirs) and the
    mask may be clear, the batch's sum is ``x``'s own unless something is masked: one more reduction, so that a batch
    without NaN gets stock's bits.
    """
    if not _aliased(x) or imputed.stride() == x.stride():
        return imputed.sum()
    return torch.where(mask.any(), imputed.sum(), x.sum())


def _strides_by_size(x: Tensor) -> list[tuple[int, int]]:
    return sorted((stride, size) for size, stride in zip(x.shape, x.stride()) if size != 1)


def _dense(x: Tensor) -> bool:
    """Whether ``x`` fills its memory span once, without gaps (torch's "non-overlapping and dense").

    A reduction over a dense tensor adds in memory order, as over any dense result of elementwise ops on it (same
    strides), such as stock's ``value * ones_like(value)``; over a view with gaps or shared entries it takes another
    order, and ``clone()`` gives the dense layout elementwise ops would (torch's ``infer_dense_strides``).
    """
    if x.is_contiguous():
        return True
    expected = 1
    for stride, size in _strides_by_size(x):
        if stride != expected:
            return False
        expected *= size
    return True


def _aliased(x: Tensor) -> bool:
    """Whether two entries of ``x`` may share memory (stride 0 of ``expand``, overlapping ``as_strided`` views)."""
    reach = 1
    for stride, size in _strides_by_size(x):
        if stride < reach:
            return True
        reach += stride * (size - 1)
    return False


def _cast_and_neutralise(metric: Any, value: Tensor, neutral: float) -> Tensor:
    """``value`` in the metric's dtype with the entries masked by the NaN strategy imputed or set to ``neutral``.

    For Max/Min/Cat, whose results do not depend on the order of the entries (layouts do not matter here).
    """
    mask = _nan_mask(metric, value)
    fill = _impute_value(metric, value)
    if mask is not None and fill is not None:
        value, mask = torch.where(mask, _fill_of(value, fill), value), None
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
    x = _to_metric_tensor(self, x)
    weight = None if weight is None else _to_metric_tensor(self, weight)
    if self.nan_strategy in ("warn", "ignore", "error") or _fill_overflow(self, x, weight) is not None:
        return stock(f"{_MODULE}.BaseAggregator._cast_and_nan_check_input")(self, x, weight)
    weight = torch.ones_like(x) if weight is None else weight
    mask = _nan_mask(self, x, weight)
    fill = _impute_value(self, x, weight)
    if mask is not None and fill is not None:
        x = _impute(x, mask, _fill_of(x, fill))
        weight = _impute(weight, mask, _fill_of(weight, 1.0 if _FILL_WEIGHT_IS_ONE else fill))
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
    fill = _impute_value(self, value, weight)
    if weight is None and (fill is None or mask is None or _FILL_WEIGHT_IS_ONE):
        sums = _unit_weight_sums(self, value, mask, fill)
    else:
        if weight is None:  # torchmetrics 1.6: the default weight 1.0 takes the fill value where NaN is imputed
            weight = torch.ones_like(value, dtype=self.dtype)
        sums = _weighted_sums(self, value, weight, mask, fill)
    # the states are updated in place (no attribute assignment): the same tensors, without nn.Module.__setattr__,
    # and what a CUDA graph replays
    add_to_states(self, _MEAN_STATES, sums)


def _unit_weight_sums(metric: Any, value: Tensor, mask: Tensor | None, fill: float | None) -> tuple[Tensor, Any]:
    """MeanMetric's sums for unit weights, in stock's order, without a tensor of ones.

    Stock sums ``value * ones_like(value)``: a dense tensor laid out as ``value`` if that is dense, else as elementwise
    ops lay out their results (``clone()`` gives that layout). Its weight is the count of the entries it keeps.
    """
    value_ = _as_dtype(value, metric.dtype)
    if mask is None:
        return (value_ if _dense(value_) else value_.clone()).sum(), value.numel()
    if _drops_batch(metric, value):  # a batch that holds NaN never reaches the state
        total = (value_ if _dense(value_) else value_.clone()).sum()
        return total.masked_fill(mask, 0.0), mask.logical_not() * value.numel()
    if fill is not None:  # imputed before the cast (see _fill_of); an imputed entry weighs 1 (1.7+)
        return _as_dtype(torch.where(mask, _fill_of(value, fill), value), metric.dtype).sum(), value.numel()
    # NaN entries add 0 where they are; ``nansum`` adds in ``sum``'s order, without a copy
    total = value_.nansum() if _dense(value_) else _zeroed(value_, mask).sum()
    return total, mask.logical_not().sum(dtype=metric.weight.dtype)


def _weighted_sums(
    metric: Any, value: Tensor, weight: Tensor, mask: Tensor | None, fill: float | None
) -> tuple[Tensor, Tensor]:
    """MeanMetric's sums ``(value * weight).sum()`` and ``weight.sum()`` in stock's order, NaN as the strategy says.

    Stock's product is a dense tensor laid out by the value; its weight sum runs over the weight as given (a broadcast
    weight included), so a weight with masked entries keeps the weight's strides (:func:`_impute`).
    """
    if mask is None:
        value, weight = _as_dtype(value, metric.dtype), _as_dtype(weight, metric.dtype)
        return (value * weight).sum(), weight.sum()
    if _drops_batch(metric, value, weight):  # a batch that holds NaN never reaches the state
        value, weight = _as_dtype(value, metric.dtype), _as_dtype(weight, metric.dtype)
        if value.requires_grad:  # a NaN weight must not reach the value's gradient (0 * NaN)
            value = torch.where(mask, 0.0, value)
        return (value * weight).sum().masked_fill(mask, 0.0), weight.sum().masked_fill(mask, 0.0)
    if fill is not None:  # imputed before the casts (see _fill_of), where stock writes them
        imputed = _impute(weight, mask, _fill_of(weight, 1.0 if _FILL_WEIGHT_IS_ONE else fill))
        value = _as_dtype(torch.where(mask, _fill_of(value, fill), value), metric.dtype)
        weight, imputed = _as_dtype(weight, metric.dtype), _as_dtype(imputed, metric.dtype)
        return (value * imputed).sum(), _sum_as_stock(weight, imputed, mask)
    value, weight = _as_dtype(value, metric.dtype), _as_dtype(weight, metric.dtype)
    # both factors masked, not their product: a NaN weight must not reach the value's gradient (0 * NaN)
    masked = _impute(weight, mask, 0.0)
    return (_zeroed(value, mask) * masked).sum(), _sum_as_stock(weight, masked, mask)


_MEAN_STATES = ("mean_value", "weight")


def _update_single(
    metric: Any, qualname: str, value: float | Tensor, neutral: float | None, fold: Callable[[Tensor], None]
) -> None:
    """The common body of Sum/Max/Min/Cat ``update``: cast, check, neutralise NaN entries, fold into the state.

    ``neutral=None``: ``fold`` gets the batch as given and does all of that itself (SumMetric, :func:`_sum_of`).
    """
    if _uses_stock_nan_check(metric):
        return _stock_update(metric, qualname, value)
    value = _to_metric_tensor(metric, value)
    if value.numel():
        fold(value if neutral is None else _cast_and_neutralise(metric, value, neutral))
    _deferred.sweep(metric)
    return None


@replaces(f"{_MODULE}.SumMetric.update", params=("self", "value"), kind="metric_method")
def _sum_update(self: Any, value: float | Tensor) -> None:
    _update_single(
        self, "SumMetric.update", value, None, lambda v: add_to_states(self, ("sum_value",), (_sum_of(self, v),))
    )


def _sum_of(metric: Any, value: Tensor) -> Tensor:
    """SumMetric's batch total: stock's ``value.to(dtype).sum()`` over the caller's layout, NaN as the strategy says.

    A NaN entry that is left out or imputed with +0.0 adds +0.0 where it is (``nansum``: the same order as ``sum``,
    no copy), so a batch without NaN gets stock's bits on every device.
    """
    mask = _nan_mask(metric, value)
    if mask is None:
        return _as_dtype(value, metric.dtype).sum()
    fill = _impute_value(metric, value)
    if fill is not None and (fill != 0.0 or math.copysign(1.0, fill) < 0):
        return _as_dtype(_impute(value, mask, _fill_of(value, fill), own_nans=True), metric.dtype).sum()
    dropped = _drops_batch(metric, value)
    value = _as_dtype(value, metric.dtype)
    if dropped:  # a batch that holds NaN never reaches the state
        return value.sum().masked_fill(mask, 0.0)
    return value.nansum()


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
    # a batch whose fill stock failed to write was kept as NaN on the device path (its error reported): left out whole
    dropped_whole = self.nan_strategy == "error" or _reports_fill_overflow(self)
    if (self.nan_strategy not in ("warn", "ignore", "error") and not dropped_whole) or (
        _deferred.inside_forward(self) and not _deferred.reads_are_free(batches[0])
    ):
        return _concatenated(values)
    # one read per compute() (its result's size depends on the data anyway); per batch, because stock flattened
    # the batches it took NaN out of, and only those: a 0-dim batch and a 2-D one with NaN concatenate in stock
    has_nan = torch.stack([torch.isnan(batch).any() for batch in batches]).tolist()
    if not any(has_nan):
        return _concatenated(values)
    kept = _without_nan(batches, has_nan, whole_batches=dropped_whole)
    if kept:
        return dim_zero_cat(kept)
    return values[:0].flatten() if isinstance(values, Tensor) else []
