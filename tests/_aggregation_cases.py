"""Shared cases for the aggregation tests: strategies per torchmetrics version, and a stock-vs-patched runner."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning_utilities.core.imports import compare_version
from torchmetrics.aggregation import CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric

import torchmetrics_syncfree
from torchmetrics_syncfree.probe import SyncProbe

TM_GE_1_7 = compare_version("torchmetrics", operator.ge, "1.7.0")
AGGREGATORS = (MeanMetric, SumMetric, MaxMetric, MinMetric, CatMetric)
#: every nan_strategy the installed torchmetrics accepts ("disable" arrived in 1.7)
STRATEGIES: tuple[Any, ...] = ("error", "warn", "ignore", 0.0, 2.5) + (("disable",) if TM_GE_1_7 else ())
NAN = float("nan")
INF = float("inf")


@dataclass
class Outcome:
    """What a stream of updates produced: per-step forward values or the final compute(), warnings, errors."""

    values: list[Any] = field(default_factory=list)
    error: tuple[type, str, int] | None = None
    warnings: list[str] = field(default_factory=list)


def clone_args(args: Sequence[Any], device: str = "cpu") -> tuple[Any, ...]:
    return tuple(a.to(device, copy=True) if isinstance(a, torch.Tensor) else a for a in args)


def run_stream(
    metric_cls: type,
    strategy: Any,
    stream: Sequence[Sequence[Any]],
    patched: bool,
    use_forward: bool = False,
    device: str = "cpu",
    device_path: bool = False,
) -> Outcome:
    """Feed ``stream`` (a list of update argument tuples) to a fresh metric, stock or patched.

    ``device_path=True`` runs inside a CPU :class:`SyncProbe`, so the patched code takes its CUDA path (asynchronous
    checks, neutralised entries) instead of the immediate checks it uses on CPU.
    """
    outcome = Outcome()
    context = torchmetrics_syncfree.patched() if patched else _nothing()
    simulation = SyncProbe() if device_path else _nothing()
    with context, simulation, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric = metric_cls(nan_strategy=strategy).to(device)
        step = 0
        try:
            for step, args in enumerate(stream):  # noqa: B007 - step is read in the except clause
                inputs = clone_args(args, device)
                result = metric(*inputs) if use_forward else metric.update(*inputs)
                if use_forward:
                    outcome.values.append(result)
            step = len(stream)
            outcome.values.append(metric.compute())
        except (RuntimeError, ValueError, TypeError) as err:
            outcome.error = (type(err), str(err), step)
    outcome.warnings = [str(w.message) for w in caught if "nan" in str(w.message)]
    return outcome


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def has_nan(stream: Sequence[Sequence[Any]]) -> bool:
    return any(
        (torch.isnan(torch.as_tensor(a, dtype=torch.float64)).any().item() if not isinstance(a, str) else False)
        for args in stream
        for a in args
        if a is not None
    )


def stock_is_wrong(metric_cls: type, strategy: Any, stream: Sequence[Sequence[Any]]) -> bool:
    """Cases where we deliberately differ from stock (documented in torchmetrics_syncfree.aggregation)."""
    if metric_cls is not MeanMetric:
        return False
    weighted = [args for args in stream if len(args) > 1 and args[1] is not None]
    if strategy == "disable" and weighted:
        return True  # stock 1.7+ ignores the weights under "disable"
    if isinstance(strategy, float) and has_nan(stream):
        for args in stream:
            value = torch.as_tensor(args[0])
            weight = args[1] if len(args) > 1 else (None if TM_GE_1_7 else 1.0)
            if weight is None:
                continue
            if torch.as_tensor(weight).numel() < value.numel():
                return True  # stock imputes into a broadcast weight view: every weight becomes the fill weight
    return False


def assert_same_outcome(stock: Outcome, patched: Outcome, exact: bool, deferred: bool = False) -> None:
    """Equal values, warnings and errors; ``deferred`` errors may surface later, but by ``compute()`` at the latest."""
    assert (patched.error is None) == (stock.error is None), (stock.error, patched.error)
    if stock.error is not None:
        assert patched.error[0] is stock.error[0]
        assert patched.error[1] == stock.error[1]
        if deferred:
            assert stock.error[2] <= patched.error[2], "raised before the update that had the NaN"
        else:
            assert patched.error[2] == stock.error[2], "raised at a different update"
        return
    assert patched.warnings == stock.warnings
    assert len(patched.values) == len(stock.values)
    for got, want in zip(patched.values, stock.values):
        assert_same_value(got, want, exact)


def assert_same_value(got: Any, want: Any, exact: bool) -> None:
    if isinstance(want, list):  # CatMetric.compute() of an empty state returns its (empty) list state
        assert got == want
        return
    assert isinstance(got, torch.Tensor)
    assert (got.dtype, got.shape, got.device) == (want.dtype, want.shape, want.device)
    tolerance = 0.0 if exact else 1e-6
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, equal_nan=True)
