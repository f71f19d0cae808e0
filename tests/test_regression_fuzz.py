"""Hypothesis fuzz of the regression areas: random sizes (batches of one included), outputs, dtypes, value
kinds (continuous, ties, constant columns, exact zeros); the patched metric on the simulated device path (or the CPU
path) against stock on CPU: values, dtypes and shapes identical (NaN where stock's are), no sync on the device path,
and stock's exception type where stock raises."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
import torchmetrics
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float32, torch.float64, torch.half]


@st.composite
def _batch(draw: Any, outputs: int | None, dtype: torch.dtype, positive: bool = False) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = draw(st.integers(1, 24))
    shape = (n,) if outputs is None else (n, outputs)
    kind = draw(st.sampled_from(["continuous", "ties", "constant", "zeros"]))
    target = torch.randn(shape, generator=gen)
    preds = target + draw(st.sampled_from([0.0, 0.1, 1.0])) * torch.randn(shape, generator=gen)
    if kind == "ties":
        preds, target = (preds * 2).round() / 2, (target * 2).round() / 2
    elif kind == "constant":
        target = torch.full(shape, 0.5)
    elif kind == "zeros":
        preds = preds.masked_fill(torch.rand(shape, generator=gen) < 0.3, 0.0)
    if positive:  # KLDivergence's distributions
        preds, target = preds.abs(), target.abs() + 0.01
    return preds.to(dtype), target.to(dtype)


def _run(make: Any, batches: list[tuple[Tensor, Tensor]], path: str | None) -> list[Any]:
    """Stock (``path=None``) or patched on ``path``: forward of every batch, then compute; an exception's type."""
    patching = contextlib.nullcontext() if path is None else torchmetrics_syncfree.patched()
    out: list[Any] = []
    with patching, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = make()
        with SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
            for batch in [*batches, None]:
                try:
                    out.append(metric(*batch) if batch is not None else metric.compute())
                except (ValueError, RuntimeError, TypeError) as err:
                    out.append(type(err))
                    break
    raised = out and isinstance(out[-1], type)
    assert probe is None or raised or probe.count == 0, probe.events
    return out


def _assert_same(stock: list[Any], patched: list[Any]) -> None:
    assert len(stock) == len(patched)
    for s, p in zip(stock, patched):
        if isinstance(s, type):
            assert s is p
            continue
        assert (s.dtype, s.shape) == (p.dtype, p.shape)
        torch.testing.assert_close(p, s, rtol=0, atol=0, equal_nan=True)


@FUZZ
@given(
    name=st.sampled_from(["r2", "r2-adjusted", "ev", "pearson", "spearman"]),
    outputs=st.sampled_from([None, 2, 3]),
    dtype=st.sampled_from(DTYPES),
    multioutput=st.sampled_from(["raw_values", "uniform_average", "variance_weighted"]),
    data=st.data(),
    path=st.sampled_from(["cpu", "device"]),
)
def test_regression_metrics(
    name: str, outputs: int | None, dtype: torch.dtype, multioutput: str, data: Any, path: str
) -> None:
    count = data.draw(st.integers(1, 3))
    batches = [data.draw(_batch(outputs, dtype)) for _ in range(count)]
    makers = {
        "r2": lambda: torchmetrics.R2Score(multioutput=multioutput),
        "ev": lambda: torchmetrics.ExplainedVariance(multioutput=multioutput),
        "pearson": lambda: torchmetrics.PearsonCorrCoef(num_outputs=outputs or 1),
        "spearman": lambda: torchmetrics.SpearmanCorrCoef(num_outputs=outputs or 1),
    }
    adjusted = data.draw(st.integers(1, 30)) if name == "r2-adjusted" else 0
    make = makers.get(name, lambda: torchmetrics.R2Score(adjusted=adjusted))

    _assert_same(_run(make, batches, None), _run(make, batches, path))


@FUZZ
@given(
    log_prob=st.booleans(),
    reduction=st.sampled_from(["mean", "sum", "none", None]),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
    path=st.sampled_from(["cpu", "device"]),
)
def test_kl_divergence(log_prob: bool, reduction: str | None, dtype: torch.dtype, data: Any, path: str) -> None:
    batches = [data.draw(_batch(4, dtype, positive=True)) for _ in range(data.draw(st.integers(1, 3)))]
    if log_prob:
        batches = [(p.float().log_softmax(-1).to(dtype), q.float().log_softmax(-1).to(dtype)) for p, q in batches]

    def make() -> Any:
        return torchmetrics.KLDivergence(log_prob=log_prob, reduction=reduction)

    _assert_same(_run(make, batches, None), _run(make, batches, path))
