"""The twelve clustering metrics: stock's values, dtypes and errors on both patched paths, update without host reads,
and at most ONE host read per compute() and forward() on the device path (the data-sized number of clusters)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torchmetrics.clustering as clustering
import torchmetrics.functional.clustering.utils as functional_utils

import torchmetrics_syncfree
from tests import _series_tree
from tests._classification_cases import PATHS, parity
from torchmetrics_syncfree import SyncProbe, _instrumentation

#: extrinsic metrics (predicted and target labels) whose device path is stock's to the bit
EXACT = (
    "AdjustedRandScore",
    "CompletenessScore",
    "FowlkesMallowsIndex",
    "HomogeneityScore",
    "MutualInfoScore",
    "NormalizedMutualInfoScore",
    "RandScore",
    "VMeasureScore",
)
#: documented float sums in another order: AMI's expected mutual information, the intrinsic metrics' cluster means
SUMMED = ("AdjustedMutualInfoScore",)
INTRINSIC = ("CalinskiHarabaszScore", "DaviesBouldinScore", "DunnIndex")
ALL = EXACT + SUMMED + INTRINSIC
RTOL = 1e-5


def _labels(seed: int, n: int, k: int, dtype: torch.dtype = torch.int64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches of predicted and target labels: sparse values (negative, gaps), a perfect match, one cluster."""
    gen = torch.Generator().manual_seed(seed)
    preds = torch.randint(0, k, (n,), generator=gen) * 7 - 3
    target = torch.randint(0, k + 1, (n,), generator=gen)
    perfect = target * 2 + 1
    return [
        (preds.to(dtype), target.to(dtype)),
        (perfect.to(dtype), target.to(dtype)),
        (torch.full((n,), 4, dtype=dtype), target.to(dtype)),
    ]


def _points(seed: int, n: int, k: int, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches of 3-d points and their cluster labels (sparse label values)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 3, generator=gen, dtype=dtype), torch.randint(0, k, (n,), generator=gen) * 5 - 4)
        for _ in range(3)
    ]


def _make(name: str, **kwargs: Any) -> Callable[[], Any]:
    return lambda: getattr(clustering, name)(**kwargs)


def _cases() -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for name in EXACT:
        cases[name] = _make(name), _labels(seed=1, n=40, k=4)
    # stock's expected mutual information is a Python loop of ~15 kernels per term: small inputs
    cases["AdjustedMutualInfoScore"] = _make("AdjustedMutualInfoScore"), _labels(seed=1, n=16, k=3)
    cases["NormalizedMutualInfoScore-geometric"] = (
        _make("NormalizedMutualInfoScore", average_method="geometric"),
        _labels(seed=2, n=30, k=3, dtype=torch.int32),
    )
    cases["AdjustedMutualInfoScore-min"] = _make("AdjustedMutualInfoScore", average_method="min"), _labels(3, 12, 2)
    cases["VMeasureScore-beta"] = _make("VMeasureScore", beta=0.5), _labels(seed=4, n=30, k=3)
    for name in INTRINSIC:
        cases[name] = _make(name), _points(seed=5, n=40, k=4)
    cases["DunnIndex-p1-float64"] = _make("DunnIndex", p=1), _points(seed=6, n=30, k=3, dtype=torch.float64)
    cases["CalinskiHarabaszScore-float64"] = _make("CalinskiHarabaszScore"), _points(7, 30, 3, torch.float64)
    return cases


def _rtol(label: str) -> float:
    return 0.0 if label.split("-")[0] in EXACT else RTOL


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch, compute() after forwards and after updates: stock's values (to the bit where the sums
    are stock's, within float32 rounding where their order changes), dtypes and shapes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stock's sparse-invariant warning
        parity(_cases(), path=path, rtol=_rtol)


def test_expected_mutual_info_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The n_ij axis of AdjustedMutualInfoScore's grid evaluated in several chunks gives the one-chunk value."""
    from torchmetrics_syncfree.clustering import adjusted_mutual_info_score as layer

    preds, target = _labels(seed=8, n=60, k=3)[0]
    stock = clustering.AdjustedMutualInfoScore()(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe():
        whole = clustering.AdjustedMutualInfoScore()(preds, target)
        monkeypatch.setattr(layer, "_GRID", 3 * 4 * 5)  # 5 n_ij values per chunk: a dozen chunks
        chunked = clustering.AdjustedMutualInfoScore()(preds, target)
    torch.testing.assert_close(chunked, whole, rtol=RTOL, atol=0)
    torch.testing.assert_close(whole, stock, rtol=RTOL, atol=1e-7)


def _batches(name: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return _points(seed=9, n=32, k=5) if name in INTRINSIC else _labels(seed=9, n=32, k=5)


def _syncs(name: str, patched: bool, delay: int | None = 0) -> dict[str, int]:
    data = _batches(name)
    counts = {}
    patch = torchmetrics_syncfree.patched() if patched else contextlib.nullcontext()
    with patch, _instrumentation.simulated_copy_delay(delay), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = getattr(clustering, name)()
        with SyncProbe() as probe:
            metric.update(*data[0])
        counts["update"] = probe.count
        with SyncProbe() as probe:
            metric(*data[1])
        counts["forward"] = probe.count
        with SyncProbe() as probe:
            metric.compute()
        counts["compute"] = probe.count
    return counts


#: only the squared sizes of the clusters and contingency cells: counted in tables of one slot per sample, no read
READ_FREE = ("AdjustedRandScore", "FowlkesMallowsIndex", "RandScore")


@pytest.mark.parametrize("delay", [0, None], ids=["copy-arrived", "copy-in-flight"])
def test_one_read_per_compute_and_forward(delay: int | None) -> None:
    """Device path: update reads nothing, forward and compute read the host once each (the number of clusters), or
    not at all where only squared sizes are summed."""
    for name in ALL:
        reads = 0 if name in READ_FREE else 1
        assert _syncs(name, patched=True, delay=delay) == {"update": 0, "forward": reads, "compute": reads}, name


def test_stock_syncs_are_seen() -> None:
    """Stock reads many times in forward and compute (117 reads in one AdjustedMutualInfoScore call): the counts
    above mean something."""
    for name in ALL:
        counts = _syncs(name, patched=False)
        assert counts["update"] == 0 and counts["forward"] > 1 and counts["compute"] > 1, (name, counts)


def _error(name: str, first: torch.Tensor, second: torch.Tensor) -> tuple[type, str]:
    with pytest.raises(Exception) as caught:  # the type and text are compared with stock's
        getattr(clustering, name)()(first, second)
    return caught.type, str(caught.value)


BAD_INPUTS = {
    "float-labels": ("MutualInfoScore", torch.rand(8), torch.randint(0, 3, (8,))),
    "2d-labels": ("AdjustedRandScore", torch.randint(0, 3, (4, 2)), torch.randint(0, 3, (4, 2))),
    "shapes": ("AdjustedMutualInfoScore", torch.randint(0, 3, (8,)), torch.randint(0, 3, (7,))),
    "one-cluster": ("DaviesBouldinScore", torch.randn(8, 2), torch.zeros(8, dtype=torch.long)),
    "every-sample-a-cluster": ("CalinskiHarabaszScore", torch.randn(6, 2), torch.arange(6)),
    "int-data": ("CalinskiHarabaszScore", torch.randint(0, 3, (8, 2)), torch.arange(8) % 2),
    "dunn-one-cluster": ("DunnIndex", torch.randn(8, 2), torch.full((8,), 3)),
    **{
        f"empty-{name}": (name, torch.randn(0, 2), torch.zeros(0, dtype=torch.long))
        for name in ("CalinskiHarabaszScore", "DaviesBouldinScore", "DunnIndex")
    },
}


@pytest.mark.parametrize("path", PATHS)
def test_errors_are_stocks(path: str) -> None:
    """Bad input raises stock's exception type and message on both paths."""
    for label, (name, first, second) in BAD_INPUTS.items():
        expected = _error(name, first, second)
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            got = _error(name, first, second)
        assert got == expected, label


def _davies_bouldin_definition(data: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The score by its definition in float64: per cluster the largest (s_i + s_j) / d_ij over the other clusters."""
    data = data.double()
    members = [data[labels == label] for label in labels.unique()]
    centroids = torch.stack([points.mean(0) for points in members])
    spread = torch.stack([(points - centroid).norm(dim=1).mean() for points, centroid in zip(members, centroids)])
    ratios = (spread[:, None] + spread[None]) / (centroids[:, None] - centroids[None]).norm(dim=2)
    return ratios.fill_diagonal_(0).max(dim=1).values.mean()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("clusters", [3, 25, 26, 60])
def test_davies_bouldin_leaves_each_centroid_out_of_its_own_ratios(path: str, clusters: int) -> None:
    """Every number of clusters gives the definition's score. (Above 25 clusters stock's ``cdist`` takes a matrix
    product whose diagonal is rounding noise that stock divides by: its score is noise there, a documented
    deviation.)"""
    gen = torch.Generator().manual_seed(clusters)
    labels = torch.arange(2000) % clusters
    data = 5 * torch.randn(clusters, 8, generator=gen)[labels] + torch.randn(2000, 8, generator=gen)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        score = clustering.DaviesBouldinScore()(data, labels)
    torch.testing.assert_close(score.double(), _davies_bouldin_definition(data, labels), rtol=RTOL, atol=0)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (2, 2), (37, 1), (500, 40), (3000, 900), (4000, 3)])
def test_pair_counts_are_stocks_to_the_bit(n: int, k: int) -> None:
    """The read-free pair counting: stock's pair confusion matrix exactly, and the four pair-based metrics' values to
    the bit, from one cluster to nearly one sample per cluster (sparse, negative and int32 label values)."""
    import torchmetrics.functional.clustering as functional
    from torchmetrics.functional.clustering.utils import calculate_pair_cluster_confusion_matrix

    from torchmetrics_syncfree.clustering.utils import pair_confusion, pair_tables

    gen = torch.Generator().manual_seed(n + k)
    preds = (torch.randint(0, k, (n,), generator=gen) * 7 - 3).int()
    target = torch.randint(0, k, (n,), generator=gen) * 3
    functions = ("rand_score", "adjusted_rand_score", "fowlkes_mallows_index", "mutual_info_score")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [getattr(functional, name)(preds, target) for name in functions]
        matrix = calculate_pair_cluster_confusion_matrix(preds, target)
        with torchmetrics_syncfree.patched(), SyncProbe() as probe:
            got = [getattr(functional, name)(preds, target) for name in functions]
            pairs = pair_confusion(pair_tables(preds, target))
    assert torch.equal(pairs, matrix)
    assert probe.count == 1  # mutual_info_score's: the other three read nothing
    for name, value, stock_value in zip(functions, got, expected):
        assert value.dtype == stock_value.dtype, name
        assert torch.equal(value, stock_value), (name, value, stock_value)


def test_public_helpers() -> None:
    """calculate_contingency_matrix (dense, eps, sparse): stock's table with one read; calculate_entropy: stock's
    value within float32 rounding without a read."""
    preds, target = _labels(seed=10, n=40, k=4)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [
            functional_utils.calculate_contingency_matrix(preds, target),
            functional_utils.calculate_contingency_matrix(preds, target, eps=1e-16),
            functional_utils.calculate_contingency_matrix(preds, target, sparse=True).to_dense(),
        ]
        entropies = [functional_utils.calculate_entropy(x) for x in (preds, target)]
        with torchmetrics_syncfree.patched():
            with SyncProbe() as probe:
                table = functional_utils.calculate_contingency_matrix(preds, target)
            assert probe.count == 1
            with SyncProbe():
                got = [
                    table,
                    functional_utils.calculate_contingency_matrix(preds, target, eps=1e-16),
                    functional_utils.calculate_contingency_matrix(preds, target, sparse=True).to_dense(),
                ]
            with SyncProbe() as probe:
                got_entropies = [functional_utils.calculate_entropy(x) for x in (preds, target)]
            assert probe.count == 0
            with SyncProbe(), pytest.raises(ValueError, match=r"Cannot specify `eps` and return sparse tensor\."):
                functional_utils.calculate_contingency_matrix(preds, target, eps=1.0, sparse=True)
    for value, stock in zip(got, expected):
        assert value.dtype == stock.dtype
        assert torch.equal(value, stock)
    for value, stock in zip(got_entropies, entropies):
        torch.testing.assert_close(value, stock, rtol=RTOL, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
def test_cuda_one_sync_per_compute_and_forward_and_stocks_values() -> None:
    """On a GPU (the real syncs, counted by CUDA's sync debug mode): update never syncs, forward and compute once;
    the values are stock's on the same GPU (within the documented float32 rounding)."""
    for name in ALL:
        data = [(first.cuda(), second.cuda()) for first, second in _batches(name)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stock = getattr(clustering, name)().cuda()
            stock.update(*data[0])
            expected = [stock(*batch) for batch in data[1:]]
            expected.append(stock.compute())
            with torchmetrics_syncfree.patched():
                metric = getattr(clustering, name)().cuda()
                torch.cuda.synchronize()
                with SyncProbe(device="cuda") as update:
                    metric.update(*data[0])
                with SyncProbe(device="cuda") as forward:
                    got = [metric(*batch) for batch in data[1:]]
                with SyncProbe(device="cuda") as compute:
                    got.append(metric.compute())
        assert (update.count, forward.count, compute.count) == (0, len(data) - 1, 1), name
        for value, reference in zip(got, expected):
            assert value.dtype == reference.dtype, name
            torch.testing.assert_close(value, reference, rtol=_rtol(name), atol=1e-7, msg=name)


@pytest.mark.skipif(_series_tree.in_tree_mode(), reason="the tool patches with the layer's patch_all()")
def test_costs_tool_times_both_sides_and_compares_their_values() -> None:
    """``tools/clustering_costs.py`` (the table of ``docs/clustering.md``) runs, counts launches, compares values."""
    tool = Path(__file__).resolve().parents[1] / "tools" / "clustering_costs.py"
    run = subprocess.run(
        [sys.executable, str(tool), "--quick", "40:3"], capture_output=True, text=True, timeout=600, check=True
    )
    rows = run.stdout.splitlines()
    assert rows[0] == "| class | launches forward (stock -> patched) | 40:3 |"
    assert len(rows) == 2 + 12
    for row in rows[2:]:
        _, launches, ratio = (cell.strip() for cell in row.strip("|").split("|"))
        stock_launches, patched_launches = (int(side) for side in launches.split(" -> "))
        assert stock_launches > 0 and patched_launches > 0, row
        assert float(ratio) > 0, row  # a ratio only: "(values differ)" would follow it
