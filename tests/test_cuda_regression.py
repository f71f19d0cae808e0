"""CUDA checks of the regression areas (run by ``tox -e gpu``, skipped without CUDA): with
``torch.cuda.set_sync_debug_mode("error")`` every synchronizing call raises, the ground truth the CPU probe stands in
for; the values equal stock's on the same GPU."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
import torch
import torchmetrics

import torchmetrics_syncfree
from tests._probing import syncs_are_errors
from tests._regression_cases import batches

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)"),
]

METRICS = {
    "r2": lambda: torchmetrics.R2Score(multioutput="raw_values"),
    "r2-adjusted": lambda: torchmetrics.R2Score(adjusted=2),
    "ev": lambda: torchmetrics.ExplainedVariance(multioutput="variance_weighted"),
    "pearson": lambda: torchmetrics.PearsonCorrCoef(num_outputs=3),
    "spearman": lambda: torchmetrics.SpearmanCorrCoef(num_outputs=3),
}


def _run(make: Any, data: list[tuple[torch.Tensor, torch.Tensor]], strict: bool) -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = make().cuda()
    data = [(p.cuda(), t.cuda()) for p, t in data]
    with syncs_are_errors() if strict else contextlib.nullcontext():
        out = [metric(p, t) for p, t in data]
        out.append(metric.compute())
    return [value.cpu() for value in out]


@pytest.mark.parametrize("name", list(METRICS))
def test_forward_and_compute_never_sync_and_equal_stock(name: str) -> None:
    data = batches(seed=1, outputs=None if name == "r2-adjusted" else 3)
    expected = _run(METRICS[name], data, strict=False)
    with torchmetrics_syncfree.patched():
        got = _run(METRICS[name], data, strict=True)
    for e, g in zip(expected, got):
        assert (e.dtype, e.shape) == (g.dtype, g.shape)
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_kl_divergence_update_never_syncs(reduction: str) -> None:
    p, q = torch.rand(16, 4, device="cuda"), torch.rand(16, 4, device="cuda")
    p[0, 1] = 0
    with torchmetrics_syncfree.patched():
        metric = torchmetrics.KLDivergence(reduction=reduction).cuda()
        with syncs_are_errors():
            metric.update(p, q)
            metric(p, q)
            metric.compute()
