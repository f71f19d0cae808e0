"""The regression computes under DDP (2-rank gloo world, device path forced): stock's values from the synced states
and stock's compute-time warnings once each (R2Score's ``adjusted``, PearsonCorrCoef's variance warning)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import _ddp_world

pytestmark = pytest.mark.ddp


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    target = torch.randn(6, generator=gen)
    return target + 0.3 * torch.randn(6, generator=gen), target


def _regression_world(rank: int, world_size: int) -> dict[str, Any]:
    """Every rank updates R2Score(adjusted=11) (12 observations in all: stock divides by zero and warns) and a
    PearsonCorrCoef whose rank 0 target is constant (only rank 0's batch warns in its forward; under DDP the forward's
    end stays quiet and the next compute reports the synced count, on every rank, as every deferred check does)."""
    from torchmetrics.regression import PearsonCorrCoef, R2Score, SpearmanCorrCoef

    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    torchmetrics_syncfree.patch_all()
    _instrumentation.force_device_path(True)
    out: dict[str, Any] = {}
    preds, target = _data(rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", UserWarning)
        r2 = R2Score(adjusted=11)
        r2.update(preds, target)
        out["r2"] = r2.compute()
        r2._computed = None
        r2.compute()  # reports the first compute's warning (synced), files its own
        r2.reset()
        out["r2_warnings"] = sum("adjusted r2" in str(w.message) for w in caught)
        pearson = PearsonCorrCoef()
        pearson(preds, torch.ones_like(target) if rank == 0 else target)
        out["pearson"] = pearson.compute()
        pearson.reset()
        out["pearson_warnings"] = sum("variance of predictions" in str(w.message) for w in caught)
        spearman = SpearmanCorrCoef()
        spearman.update(preds, target)
        out["spearman"] = spearman.compute()
    _instrumentation.force_device_path(False)
    return out


def test_computes_match_stock_and_warnings_come_once(tmp_path: Path) -> None:
    from torchmetrics.regression import PearsonCorrCoef, R2Score, SpearmanCorrCoef

    world_size = 2
    results = [
        res["_regression_world@gloo"]
        for res in _ddp_world.run_world([("gloo", _regression_world)], world_size, tmp_path)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r2, pearson, spearman = R2Score(adjusted=11), PearsonCorrCoef(), SpearmanCorrCoef()
        for rank in range(world_size):
            preds, target = _data(rank)
            r2.update(preds, target)
            pearson.update(preds, torch.ones_like(target) if rank == 0 else target)
            spearman.update(preds, target)
        expected = {"r2": r2.compute(), "pearson": pearson.compute(), "spearman": spearman.compute()}
    for rank, res in enumerate(results):
        for name, value in expected.items():
            torch.testing.assert_close(res[name], value, rtol=1e-6, atol=1e-7, msg=f"{name} on rank {rank}")
        # stock warns once per compute (rank_zero_warn: the spawned ranks are each "rank zero"): 2 computes on rank
        # 0, which files them; rank 1 reports the first (synced) one only. Pearson: rank 0's batch in forward, reported
        # by the synced compute on both ranks.
        assert res["r2_warnings"] == (2 if rank == 0 else 1), rank
        assert res["pearson_warnings"] == 1, rank
