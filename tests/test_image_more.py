"""Image metrics beyond PSNR: MultiScaleStructuralSimilarityIndexMeasure, StructuralSimilarityIndexMeasure (without
a ``data_range``, or with ``gaussian_kernel=False``), PeakSignalNoiseRatioWithBlockedEffect,
VisualInformationFidelity, RelativeAverageSpectralError and SpatialCorrelationCoefficient. Stock's values, dtypes and
shapes to the bit on both patched paths, stock's errors, a sync-free update/forward/compute on the device path (with
the check counters' copy in flight and arrived; stock seen syncing), and updates that trace without a graph break."""

from __future__ import annotations

import contextlib
import copy
import operator
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.functional import image as functional
from torchmetrics.image import (
    MultiScaleStructuralSimilarityIndexMeasure,
    PeakSignalNoiseRatioWithBlockedEffect,
    RelativeAverageSpectralError,
    SpatialCorrelationCoefficient,
    StructuralSimilarityIndexMeasure,
    VisualInformationFidelity,
)

import torchmetrics_syncfree
from tests import _series_tree
from tests._classification_cases import PATHS, assert_identical, parity
from tests._probing import assert_sync_free_life, stock_counts_of_torch_2_13, syncs_are_errors
from tests.conftest import cuda
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.image import made_on_device
from torchmetrics_syncfree.image.scc import _filter_on

#: 1.6 and 1.7: PSNRB takes no ``data_range`` (the targets' range, and ``if data_range > 2`` in compute), VIF no
#: ``reduction``
_OLD_PSNRB = compare_version("torchmetrics", operator.lt, "1.8.0")
_VIF_REDUCTION = compare_version("torchmetrics", operator.ge, "1.8.0")


def _images(shape: tuple[int, ...], seed: int, n: int = 2, scale: float = 1.0, dtype: Any = torch.float32) -> list:
    """``n`` batches of (preds, target); the last one's preds hold a constant block and its first target is constant
    (zero variances: the masked writes' cases)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        preds, target = (torch.rand(shape, generator=gen) * scale for _ in range(2))
        if i == n - 1:
            preds[..., : shape[-2] // 2, : shape[-1] // 2] = 0.5 * scale
            target[0] = 0.25 * scale  # a constant image: zero variances
        out.append((preds.to(dtype), target.to(dtype)))
    return out


def _psnrb(**config: Any) -> PeakSignalNoiseRatioWithBlockedEffect:
    if _OLD_PSNRB:
        config.pop("data_range")
    return PeakSignalNoiseRatioWithBlockedEffect(**config)


def _cases() -> dict[str, tuple[Callable[[], Any], list]]:
    ms_ssim = MultiScaleStructuralSimilarityIndexMeasure
    vif_none = {"reduction": "none"} if _VIF_REDUCTION else {}
    return {
        "ms-ssim": (
            lambda: ms_ssim(kernel_size=3, betas=(0.5, 0.5), reduction="sum", data_range=(0.1, 0.9)),
            _images((2, 1, 16, 16), 0),
        ),
        "ms-ssim-3": (
            lambda: ms_ssim(kernel_size=3, sigma=0.5, betas=(0.2, 0.3, 0.5), normalize="simple", reduction="none"),
            _images((2, 2, 16, 18), 1, n=1, dtype=torch.float64),
        ),
        "ssim": (lambda: StructuralSimilarityIndexMeasure(), _images((2, 2, 12, 12), 2)),
        "ssim-uniform": (
            lambda: StructuralSimilarityIndexMeasure(gaussian_kernel=False, kernel_size=(3, 5), reduction="none"),
            _images((2, 1, 12, 12), 15, n=1, dtype=torch.float64),
        ),
        "ssim-3d": (
            lambda: StructuralSimilarityIndexMeasure(gaussian_kernel=False, kernel_size=3, data_range=1.0),
            _images((1, 1, 6, 7, 8), 16, n=1),
        ),
        "ms-ssim-uniform": (
            lambda: ms_ssim(gaussian_kernel=False, kernel_size=3, betas=(0.3, 0.3, 0.4)),
            _images((2, 1, 16, 16), 17, n=1),
        ),
        "psnrb": (lambda: _psnrb(data_range=1.0), _images((2, 1, 13, 18), 3)),
        "psnrb-255": (lambda: _psnrb(data_range=(0.0, 255.0), block_size=3), _images((2, 1, 10, 7), 4, scale=255)),
        "psnrb-64": (lambda: _psnrb(data_range=2.0, block_size=4), _images((1, 1, 9, 9), 5, dtype=torch.float64)),
        "psnrb-2": (lambda: _psnrb(data_range=1.0, block_size=2), _images((2, 1, 5, 6), 6)),
        "psnrb-one-border": (lambda: _psnrb(data_range=1.0, block_size=8), _images((2, 1, 9, 10), 7)),
        "vif": (lambda: VisualInformationFidelity(), _images((2, 1, 41, 41), 8)),
        "vif-none": (lambda: VisualInformationFidelity(sigma_n_sq=0.5, **vif_none), _images((2, 2, 42, 41), 9, n=1)),
        "rase": (lambda: RelativeAverageSpectralError(window_size=4), _images((2, 2, 12, 12), 10)),
        "rase-64": (lambda: RelativeAverageSpectralError(), _images((2, 1, 16, 16), 11, n=1, dtype=torch.float64)),
        "scc": (lambda: SpatialCorrelationCoefficient(), _images((2, 2, 12, 12), 12)),
        "scc-gray": (
            lambda: SpatialCorrelationCoefficient(high_pass_filter=torch.tensor([[0, 1, 0], [1, -4, 1], [0, 1, 0]])),
            [(p[:, 0], t[:, 0]) for p, t in _images((2, 1, 10, 11), 13, n=1)],
        ),
        "scc-w3": (lambda: SpatialCorrelationCoefficient(window_size=3), _images((1, 1, 8, 8), 14, dtype=torch.half)),
    }


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes, to the bit on both paths."""
    cases = _cases()
    if path == "cpu":  # the replacements hand CPU tensors to stock's functions: one case per metric shows it
        cases = {name: cases[name] for name in ("ms-ssim", "ssim", "psnrb", "psnrb-64", "vif", "rase", "scc")}
    if _OLD_PSNRB:
        # 1.6, 1.7: float64 images give a float64 range state; stock's ``if data_range > 2`` returns float32 (the
        # states' dtype) under 2 and float64 over it, the patched compute float64 both ways on every path (documented)
        parity({"psnrb-64": cases.pop("psnrb-64")}, path=path, documented=lambda value: value.to(torch.float64))
    parity(cases, path=path)


#: the functional SCC's default filter, made outside the probe: the functional makes it on the host in every call
_LAPLACE = torch.tensor([[-1, -1, -1], [-1, 8, -1], [-1, -1, -1]])


def _functional_calls() -> list[Callable[[], Tensor]]:
    preds, target = _images((2, 1, 16, 16), 20, n=1)[0]
    big = _images((1, 2, 41, 41), 21, n=1)[0]
    return [
        lambda: functional.multiscale_structural_similarity_index_measure(
            preds, target, kernel_size=3, betas=(0.4, 0.6)
        ),
        lambda: functional.structural_similarity_index_measure(preds, target),
        lambda: functional.relative_average_spectral_error(preds, target, window_size=4),
        lambda: functional.spatial_correlation_coefficient(preds, target, _LAPLACE, reduction="none"),
        lambda: functional.visual_information_fidelity(*big),
    ]


@pytest.mark.parametrize("path", PATHS)
def test_functional_parity(path: str) -> None:
    """The functionals run through the same helpers (looked up at call time: RASE's is the patched function)."""
    stock = [call() for call in _functional_calls()]
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
        patched = [call() for call in _functional_calls()]
    assert_identical(stock, patched)
    assert probe is None or probe.count == 0, probe.events


@pytest.mark.parametrize("delay", [None, 0], ids=["copy-in-flight", "copy-arrived"])
def test_update_forward_and_compute_are_sync_free(syncfree: Any, delay: int | None) -> None:
    cases = _cases()
    with _instrumentation.simulated_copy_delay(delay):
        for name in (
            *("ms-ssim", "ms-ssim-3", "ms-ssim-uniform", "ssim", "ssim-3d"),
            *("psnrb", "psnrb-255", "vif", "rase", "scc", "scc-gray"),
        ):
            make, data = cases[name]
            assert_sync_free_life(make(), data)


@stock_counts_of_torch_2_13
@pytest.mark.parametrize("name", ["ms-ssim", "ssim", "psnrb", "vif", "rase", "scc"])
def test_stock_syncs_are_seen(name: str) -> None:
    """Stock copies to the device (MS-SSIM, PSNRB, VIF; RASE in compute), reads the range (SSIM without
    ``data_range``), indexes with masks (VIF, SCC)."""
    make, data = _cases()[name]
    metric = make()
    with SyncProbe() as update_probe:
        metric.update(*data[0])
    with SyncProbe() as compute_probe:
        metric.compute()
    assert (update_probe.count if name != "rase" else compute_probe.count) > 0


@pytest.mark.parametrize("path", PATHS)
def test_errors_are_stocks(path: str) -> None:
    preds, target = _images((2, 3, 16, 16), 30)[0]
    gray = preds[:, :1]
    calls: list[tuple[type, str, Callable[[], Any]]] = [
        (ValueError, "expects grayscale images", lambda: _psnrb(data_range=1.0).update(preds, target)),
        (IndexError, "tensors used as indices", lambda: _psnrb(data_range=1.0, block_size=1).update(gray, gray)),
        (IndexError, "tensors used as indices", lambda: _psnrb(data_range=1.0, block_size=16).update(gray, gray)),
        (
            ValueError,
            "image height and width dimensions must be",
            lambda: MultiScaleStructuralSimilarityIndexMeasure(kernel_size=3).update(preds, target),
        ),
        (
            ValueError,
            "Expected `window_size` to be less",
            lambda: SpatialCorrelationCoefficient(window_size=20).update(preds, target),
        ),
        (RuntimeError, "[Kk]ernel size", lambda: VisualInformationFidelity().update(preds, target)),
    ]
    for patched in (False, True):
        with (
            torchmetrics_syncfree.patched() if patched else contextlib.nullcontext(),
            SyncProbe() if patched and path == "device" else contextlib.nullcontext(),
        ):
            for error, match, call in calls:
                with pytest.raises(error, match=match):
                    call()


def test_lifecycle(syncfree: Any) -> None:
    """reset, deepcopy and pickle of a patched metric; forward's state caching: the states stock's after each."""
    make, data = _cases()["ms-ssim"]
    metric = make()
    with SyncProbe() as probe:
        metric(*data[0])
        metric.update(*data[1])
        clone = copy.deepcopy(metric)
        metric.reset()
        metric.update(*data[1])
    assert probe.count == 0, probe.events
    restored = pickle.loads(pickle.dumps(clone))
    reference = make()
    for batch in data:
        reference.update(*batch)
    assert_identical([reference.compute()] * 2, [clone.compute(), restored.compute()])
    other = make()
    other.update(*data[1])
    assert_identical([other.compute()], [metric.compute()])


def test_filter_made_on_device() -> None:
    """SCC's high-pass filter, made with fills where it would be copied: ``.to``'s values and dtype."""
    for hp_filter in (torch.tensor([[-1, -1, -1], [-1, 8, -1], [-1, -1, -1]]), torch.randn(3, 3, dtype=torch.float64)):
        for dtype in (torch.float32, torch.float64):
            made = _filter_on(hp_filter, dtype, torch.device("cpu"))
            assert_identical([hp_filter.to(dtype)], [made])
    assert_identical(
        [torch.tensor([True, False, True])], [made_on_device([True, False, True], (3,), torch.bool, "cpu")]
    )


@pytest.mark.parametrize("name", ["psnrb", "scc", "ssim"])
@pytest.mark.compile
def test_update_traces_without_a_graph_break(name: str) -> None:
    """``fullgraph=True``: a graph break (a host read, a data-dependent shape, SSIM's builtin ``pow`` of a tensor range)
    fails the compile."""
    if name == "ssim" and _series_tree.series_module("torchmetrics.functional.image.ssim") is not None:
        # the lines of ``c1 = pow(k1 * data_range, 2)`` differ between master and v1.9.0 (a type-ignore comment), so a
        # patch that changes them applies to one of the two only: the series keeps them and its SSIM update breaks
        pytest.skip("tree mode: series 0038 keeps SSIM's builtin pow (it must apply to master and v1.9.0)")
    make, data = _cases()[name]
    torch._dynamo.reset()
    try:
        with torchmetrics_syncfree.patched():
            metric, reference = make(), make()
            torch.compile(lambda p, t: metric.update(p, t), fullgraph=True, backend="aot_eager")(*data[1])
        reference.update(*data[1])
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(metric.compute(), reference.compute())


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("name", ["ms-ssim", "ms-ssim-uniform", "ssim", "psnrb", "vif", "rase", "scc", "scc-gray"])
def test_cuda_forward_and_compute_never_sync_and_equal_stock(name: str) -> None:
    """On a GPU (``tox -e gpu``): no synchronizing call under ``set_sync_debug_mode("error")`` (SCC's CPU filter made
    on the device included, a path the CPU probe cannot take), stock's values on the same GPU."""
    make, data = _cases()[name]
    data = [(p.cuda(), t.cuda()) for p, t in data]

    def run(strict: bool) -> list[Tensor]:
        metric = make().cuda()
        with syncs_are_errors() if strict else contextlib.nullcontext():
            out = [metric(p, t) for p, t in data]
            out.append(metric.compute())
        return [value.cpu() for value in out]

    expected = run(strict=False)
    with torchmetrics_syncfree.patched():
        got = run(strict=True)
    for e, g in zip(expected, got):
        assert (e.dtype, e.shape) == (g.dtype, g.shape)
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-7, equal_nan=True)
