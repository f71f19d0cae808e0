"""KLDivergence and SpearmanCorrCoef: stock's values on both patched paths (float32, float64, half; ``log_prob``,
every ``reduction``; ties, several outputs), sync-free update/forward/compute on the device path."""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics

import torchmetrics_syncfree
from tests._classification_cases import PATHS, parity
from tests._probing import CPU_HALF_MATH, assert_sync_free_life, graph_breaks, stock_counts_of_torch_2_13
from tests._regression_cases import batches
from torchmetrics_syncfree import SyncProbe
from torchmetrics_syncfree.regression.spearman import rank_data

DTYPES = {"float32": torch.float32, "float64": torch.float64, **({"half": torch.half} if CPU_HALF_MATH else {})}
REDUCTIONS = ("mean", "sum", "none", None)


def _distributions(seed: int, log_prob: bool, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Probabilities (some exactly 0: stock's ``_safe_xlogy`` branch) or log-probabilities."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(3):
        p, q = torch.rand(6, 4, generator=gen), torch.rand(6, 4, generator=gen)
        if i == 1:
            p[0, 1] = 0
            p[2, :2] = 0
        if log_prob:
            p, q = p.log_softmax(-1), q.log_softmax(-1)
        out.append((p.to(dtype), q.to(dtype)))
    return out


def _ties(seed: int, outputs: int | None, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Continuous batches and batches of few distinct values (tie groups of every size)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (20,) if outputs is None else (20, outputs)
    data = [(p, t) for p, t in batches(seed, outputs, n=20)[:2]]
    data.append((torch.randint(0, 4, shape, generator=gen).float(), torch.randint(0, 3, shape, generator=gen).float()))
    return [(p.to(dtype), t.to(dtype)) for p, t in data]


def _cases() -> dict[str, Any]:
    cases = {}
    for name, dtype in DTYPES.items():
        for log_prob in (False, True):
            for reduction in REDUCTIONS:
                cases[f"kl-{log_prob}-{reduction}-{name}"] = (
                    lambda lp=log_prob, r=reduction: torchmetrics.KLDivergence(log_prob=lp, reduction=r),
                    _distributions(len(cases), log_prob, dtype),
                )
        for outputs in (None, 3):
            cases[f"spearman-{outputs}-{name}"] = (
                lambda o=outputs: torchmetrics.SpearmanCorrCoef(num_outputs=o or 1),
                _ties(len(cases), outputs, dtype),
            )
    return cases


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute() (after forwards, after updates): stock's values to the bit, dtypes, shapes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SpearmanCorrCoef's memory warning at construction
        parity(_cases(), path=path)


SYNC_FREE = {
    "kl": lambda: torchmetrics.KLDivergence(),
    "kl-none": lambda: torchmetrics.KLDivergence(reduction="none"),
    "kl-log-prob": lambda: torchmetrics.KLDivergence(log_prob=True, reduction="sum"),
    "spearman": lambda: torchmetrics.SpearmanCorrCoef(),
    "spearman-3": lambda: torchmetrics.SpearmanCorrCoef(num_outputs=3),
}


def _data(name: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if name.startswith("kl"):
        return _distributions(3, "log-prob" in name, torch.float32)
    return _ties(3, 3 if name.endswith("3") else None, torch.float32)


@pytest.mark.filterwarnings("ignore:Metric `SpearmanCorrcoef` will save")
@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    data = _data(name)
    metric = SYNC_FREE[name]()
    assert_sync_free_life(metric, data)


@stock_counts_of_torch_2_13
@pytest.mark.filterwarnings("ignore:Metric `SpearmanCorrcoef` will save")
@pytest.mark.parametrize("name", ["kl", "kl-none", "spearman", "spearman-3"])
def test_stock_syncs_are_seen(name: str) -> None:
    """The probe sees stock's reads (KL's boolean-mask write in update; Spearman's unique in forward's compute)."""
    data = _data(name)
    metric = SYNC_FREE[name]()
    with SyncProbe() as probe:
        metric(*data[1])
    assert probe.count > 0


def test_ranks_equal_stocks_for_random_ties() -> None:
    """A seeded sweep: random sizes, tie structures and dtypes; the device-path ranks equal stock's ``_rank_data``."""
    from torchmetrics.functional.regression.spearman import _rank_data

    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 300, (), generator=gen))
        distinct = int(torch.randint(1, n + 1, (), generator=gen))
        data = torch.randint(0, distinct, (n,), generator=gen).float() / 3 - 5
        for dtype in (torch.float32, torch.float64):
            expected = _rank_data(data.to(dtype))
            got = rank_data(data.to(dtype))
            assert got.dtype == expected.dtype
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_ranks_equal_stocks_for_nan_and_infinite_values() -> None:
    """Every NaN is its own tie group after the finite values and the infinities, as stock's sort and unique have it."""
    from torchmetrics.functional.regression.spearman import _rank_data

    nan, inf = float("nan"), float("inf")
    for values in ([nan, 1.0, nan, 2.0], [inf, nan, 1.0, inf, nan, -inf, 1.0], [nan], [2.0]):
        data = torch.tensor(values)
        torch.testing.assert_close(rank_data(data), _rank_data(data), rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_invalid_inputs_raise_stocks_errors(path: str) -> None:
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        with pytest.raises(ValueError, match="to be 2D"):
            torchmetrics.KLDivergence().update(torch.rand(4), torch.rand(4))
        with pytest.raises(RuntimeError, match="same shape"):
            torchmetrics.KLDivergence().update(torch.rand(4, 2), torch.rand(4, 3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spearman = torchmetrics.SpearmanCorrCoef()
        with pytest.raises(TypeError, match="floating point"):
            spearman.update(torch.tensor([1, 2]), torch.tensor([1, 2]))
        with pytest.raises(ValueError, match="No samples to concatenate"):
            spearman.compute()


@pytest.mark.filterwarnings("ignore:Metric `SpearmanCorrcoef` will save")
def test_copies_and_merges_compute_as_stock(syncfree: Any) -> None:
    data = _ties(5, None, torch.float32)
    metric = torchmetrics.SpearmanCorrCoef()
    for preds, target in data:
        metric.update(preds, target)
    expected = torch.tensor(float(metric.compute()))
    other = pickle.loads(pickle.dumps(copy.deepcopy(metric)))
    with SyncProbe() as probe:
        other._computed = None
        value = other.compute()
    assert probe.count == 0
    torch.testing.assert_close(value, expected, rtol=0, atol=0)


@pytest.mark.compile
def test_kl_update_and_spearman_compute_trace_without_a_graph_break() -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kl = torchmetrics.KLDivergence()
        p, q = _distributions(1, False, torch.float32)[1]
        explanation = torch._dynamo.explain(lambda a, b: kl.update(a, b))(p, q)
        assert graph_breaks(explanation) == []
        preds = _ties(1, 3, torch.float32)[2][0]
        explanation = torch._dynamo.explain(lambda a: rank_data(a.T))(preds)
        assert graph_breaks(explanation) == []
    torch._dynamo.reset()
