"""HausdorffDistance: stock's values to the bit on both patched paths (one implementation; every distance metric,
directed or not, integer and float spacing, index, one-hot and bool inputs), a sync-free update/forward on the device
path with the check counters' copy arrived and in flight (stock's hundreds of reads seen unpatched), stock's errors
(masks not binarized, a class absent from both masks, class values outside the classes) as deferred checks with the
batch left out, the documented non-square deviation, fewer launches than stock, and an update that traces with
``fullgraph=True``."""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch._dynamo
from torch import Tensor
from torchmetrics.segmentation import HausdorffDistance

import torchmetrics_syncfree
from tests import _series_tree
from tests._classification_cases import PATHS, parity, pending_checks
from tests._probing import assert_sync_free_life
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.tools.allocations import PEAK_MEASURABLE, peak_allocated_by
from torchmetrics_syncfree.tools.launches import count_launches

C = 3
#: (distance_metric, directed, spacing): every metric both ways, integer, mixed and float spacings
CONFIGS = [
    ("euclidean", False, None),
    ("euclidean", True, [2, 1]),
    ("euclidean", False, [0.7, 1.3]),
    ("chessboard", False, [1, 0.5]),
    ("chessboard", True, None),
    ("taxicab", False, [0.7, 1.3]),
    ("taxicab", True, [2, 1]),
]


def _labels(gen: torch.Generator, n: int, rows: int, cols: int) -> Tensor:
    """Index labels whose every class occurs in every sample (stock raises for a class absent from both masks)."""
    labels = torch.randint(0, C, (n, rows, cols), generator=gen)
    labels[:, 0, :C] = torch.arange(C)
    return labels


def _batches(inputs: str, seed: int, rows: int = 8, cols: int = 8, n: int = 2) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        preds, target = _labels(gen, n, rows, cols), _labels(gen, n, rows, cols)
        preds[:, rows // 2 :] = 0  # larger blobs: far edges
        if inputs != "index":
            preds, target = (torch.nn.functional.one_hot(x, C).movedim(-1, 1) for x in (preds, target))
            if inputs == "bool":
                preds, target = preds.bool(), target.bool()
        out.append((preds, target))
    return out


@contextlib.contextmanager
def _device_path() -> Any:
    _instrumentation.force_device_path(True)
    try:
        yield
    finally:
        _instrumentation.force_device_path(False)


def _make(config: tuple[Any, ...], input_format: str = "index", **kwargs: Any) -> HausdorffDistance:
    distance_metric, directed, spacing = config
    kwargs.setdefault("include_background", True)
    return HausdorffDistance(
        num_classes=C,
        distance_metric=distance_metric,
        directed=directed,
        spacing=spacing,
        input_format=input_format,
        **kwargs,
    )


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes, to the bit on both paths (the CPU path
    calls stock's update: one configuration per distance metric there)."""
    configs = CONFIGS if path == "device" else [CONFIGS[i] for i in (2, 3, 5)]
    cases = {
        f"{i}-{config}": ((lambda c=config: _make(c)), _batches("index", seed=i)) for i, config in enumerate(configs)
    }
    for inputs in ("onehot", "bool"):
        cases[inputs] = (lambda: _make(CONFIGS[0], "one-hot"), _batches(inputs, seed=9))
    cases["no background"] = (lambda: _make(CONFIGS[1], include_background=False), _batches("index", seed=11))
    parity(cases, path=path)


def test_update_and_forward_are_sync_free(syncfree: Any) -> None:
    """No would-be sync in update, forward and compute, with the counters' copy arrived and with it in flight (then
    compute() waits for it once, as every metric with deferred checks)."""
    data = _batches("onehot", seed=3)
    assert_sync_free_life(_make(CONFIGS[0], "one-hot"), data)
    metric = _make(CONFIGS[2])
    with _instrumentation.simulated_copy_delay(None), SyncProbe() as probe:
        metric.update(*_batches("index", seed=4)[0])
        metric(*_batches("index", seed=4)[1])
    assert probe.count == 0, probe.events


def test_stock_syncs_are_seen_and_launches_are_fewer() -> None:
    """Stock reads per (sample, class) image; the device path launches a fixed, small number of kernels."""
    preds, target = _batches("onehot", seed=1)[0]
    with SyncProbe() as probe:
        _make(CONFIGS[0], "one-hot").update(preds, target)
    assert probe.count >= 10 * preds.shape[0] * C, probe.counts()
    with _device_path():
        stock_launches = count_launches(_make(CONFIGS[0], "one-hot").update, preds, target)[0]
        with torchmetrics_syncfree.patched():
            metric = _make(CONFIGS[0], "one-hot")
            metric.update(preds, target)
            patched_launches = count_launches(metric.update, preds, target)[0]
    assert patched_launches < 100 < stock_launches, (patched_launches, stock_launches)


def _with_empty_class(preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Class 2 absent from both masks of the second sample."""
    return preds.masked_fill((preds == 2) & (torch.arange(2) == 1).view(-1, 1, 1), 0), target.masked_fill(
        (target == 2) & (torch.arange(2) == 1).view(-1, 1, 1), 1
    )


def _onehot(x: Tensor) -> Tensor:
    return torch.nn.functional.one_hot(x, C).movedim(-1, 1)


INVALID = {
    "not binarized": ("one-hot", lambda p, t: (_onehot(p) * 2, _onehot(t)), ValueError, "should be binarized"),
    "absent class": ("index", _with_empty_class, RuntimeError, "Expected reduction dim"),
    "class value": ("index", lambda p, t: (p.masked_fill(p == 2, C), t), RuntimeError, "Class values must be"),
    # stock's loop meets the empty class of sample 0 before the non-binary values of sample 1
    "first problem wins": (
        "one-hot",
        lambda p, t: (
            torch.cat([_onehot(p[:1]).masked_fill(torch.arange(C).view(1, C, 1, 1) == 0, 0), _onehot(p[1:]) * 2]),
            _onehot(t).masked_fill(
                (torch.arange(C).view(1, C, 1, 1) == 0) & (torch.arange(2) == 0).view(2, 1, 1, 1), 0
            ),
        ),
        RuntimeError,
        "Expected reduction dim",
    ),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error(path: str, case: str) -> None:
    """Stock's exception and text: at once on CPU, at the end of the update on the device path (the copy arrives),
    the batch left out of the state."""
    input_format, corrupt, error, text = INVALID[case]
    good = _batches("index", seed=5)[0]
    bad = corrupt(*good)
    if input_format == "one-hot":
        good = tuple(_onehot(x) for x in good)
    with pytest.raises(error, match=text):
        _make(CONFIGS[0], input_format).update(*bad)
    reference = _make(CONFIGS[0], input_format)
    reference.update(*good)
    with torchmetrics_syncfree.patched():
        metric = _make(CONFIGS[0], input_format)
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(*good)
            with pytest.raises(error, match=text):
                metric.update(*bad)
        torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=0)
        assert pending_checks(metric) == 0


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")
def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    """Pending after the update, carried by copies and pickles, reported once by compute(); never in the state."""
    good = _batches("index", seed=6)[0]
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric = _make(CONFIGS[0])
        metric.update(*good)
        metric.update(*_with_empty_class(*good))
        assert pending_checks(metric) == 1
        twin, pickled = copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))
        with pytest.raises(RuntimeError, match="Expected reduction dim"):
            metric.compute()
        with pytest.raises(RuntimeError, match="Expected reduction dim"):
            pickled.compute()
        with pytest.raises(RuntimeError, match="Expected reduction dim"):
            twin.reset()
        assert int(metric.total) == good[0].shape[0] * C
        metric.compute()  # reported once


def test_metric_made_before_the_patch_reports_each_check(syncfree: Any) -> None:
    """A metric made unpatched gets its three counters at its first device-path update: each check keeps its kind."""
    torchmetrics_syncfree.unpatch_all()
    metric = _make(CONFIGS[0])
    torchmetrics_syncfree.patch_all()
    good = _batches("index", seed=13)[0]
    with SyncProbe():
        metric.update(*good)
        with pytest.raises(RuntimeError, match="Expected reduction dim"):
            metric.update(*_with_empty_class(*good))
        with pytest.raises(RuntimeError, match="Class values must be"):
            metric.update(good[0].masked_fill(good[0] == 2, C), good[1])
    assert int(metric.total) == good[0].shape[0] * C


def _brute_force(preds: Tensor, target: Tensor, directed: bool) -> Tensor:
    """The Hausdorff distance of the edges (euclidean, unit spacing) by all pairs of edge pixels."""
    from torchmetrics_syncfree.segmentation.hausdorff_distance import _edges

    out = torch.zeros(preds.shape[:2])
    for b in range(preds.shape[0]):
        for c in range(preds.shape[1]):
            pe, te = (_edges(x[b, c].bool()).nonzero().float() for x in (preds, target))
            d = torch.cdist(pe, te)
            out[b, c] = (
                d.min(1).values.max() if directed else torch.maximum(d.min(1).values.max(), d.min(0).values.max())
            )
    return out


@pytest.mark.parametrize("path", PATHS)
def test_non_square_images_are_the_true_distance(syncfree: Any, path: str) -> None:
    """Documented deviation: stock's distance transform misplaces non-square images' distances (``i * h + j``); the
    patched update, one implementation on every device, computes the true ones."""
    preds, target = (_onehot(x) for x in _batches("index", seed=8, rows=6, cols=10)[0])
    expected = _brute_force(preds, target, directed=False)
    with SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = _make(CONFIGS[0], "one-hot")
        metric.update(preds, target)
    torch.testing.assert_close(metric.score, expected.sum())
    stock = torchmetrics_syncfree.get_original(f"{HausdorffDistance.__module__}.HausdorffDistance.update")
    stock_metric = _make(CONFIGS[0], "one-hot")
    stock(stock_metric, preds, target)
    assert not torch.equal(stock_metric.score, metric.score)


@pytest.mark.compile
def test_update_traces_with_fullgraph(syncfree: Any) -> None:
    metric = _make(CONFIGS[1])
    preds, target = _batches("index", seed=2)[0]
    with _device_path():
        torch._dynamo.reset()
        torch.compile(lambda p, t: metric.update(p, t), fullgraph=True, backend="aot_eager")(preds, target)
        torch._dynamo.reset()
    reference = _make(CONFIGS[1])
    reference.update(preds, target)
    torch.testing.assert_close(metric.score, reference.score, rtol=0, atol=0)


# ------------------------------------------------------------------ detection: the box IoU metrics (torchvision)


def _torchvision_available() -> bool:
    try:
        import torchvision.ops  # noqa: F401
    except Exception:  # missing, or a build that does not match torch
        return False
    return True


needs_torchvision = pytest.mark.skipif(not _torchvision_available(), reason="the IoU metrics need torchvision")
IOU_CLASSES = (
    "IntersectionOverUnion",
    "GeneralizedIntersectionOverUnion",
    "DistanceIntersectionOverUnion",
    "CompleteIntersectionOverUnion",
)
IOU_SETTINGS = ({}, {"iou_threshold": 0.2, "class_metrics": True}, {"respect_labels": False, "box_format": "xywh"})


def _box_batches(seed: int, images: int = 3) -> list[tuple[list[dict[str, Tensor]], list[dict[str, Tensor]]]]:
    gen = torch.Generator().manual_seed(seed)

    def boxes(n: int) -> Tensor:
        corner = torch.rand(n, 2, generator=gen) * 10
        return torch.cat([corner, corner + 1 + torch.rand(n, 2, generator=gen) * 6], dim=-1)

    def labels(n: int) -> Tensor:
        return torch.randint(0, 3, (n,), generator=gen)

    out = []
    for _ in range(2):
        preds = [
            {"boxes": boxes(4), "scores": torch.rand(4, generator=gen), "labels": labels(4)} for _ in range(images)
        ]
        target = [{"boxes": boxes(3), "labels": labels(3)} for _ in range(images)]
        out.append((preds, target))
    return out


def _iou_metric(name: str, **kwargs: Any) -> Any:
    import torchmetrics.detection

    return getattr(torchmetrics.detection, name)(**kwargs)


def _iou_run(name: str, settings: dict[str, Any], data: list[Any]) -> list[dict[str, Tensor]]:
    metric = _iou_metric(name, **settings)
    out = [metric(preds, target) for preds, target in data]
    out.append(metric.compute())
    return out


@needs_torchvision
@pytest.mark.parametrize("path", PATHS)
def test_iou_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(), every class and setting: stock's keys and dtypes; stock's values to the last
    bits on every device (one implementation: compute sums the valid entries in another order)."""
    cases = [(name, settings) for name in IOU_CLASSES for settings in IOU_SETTINGS]
    data = _box_batches(seed=1)
    stock_out = [_iou_run(name, settings, data) for name, settings in cases]
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched_out = [_iou_run(name, settings, data) for name, settings in cases]
    for case, expected, got in zip(cases, stock_out, patched_out):
        for e, g in zip(expected, got):
            assert list(g) == list(e), case
            for key in e:
                assert (g[key].dtype, g[key].shape) == (e[key].dtype, e[key].shape), (case, key)
                torch.testing.assert_close(g[key], e[key], rtol=1e-6, atol=0, msg=f"{case} {key}")


@needs_torchvision
@pytest.mark.parametrize("name", IOU_CLASSES)
def test_iou_update_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    """No would-be sync in update, forward and compute; with ``class_metrics`` compute reads the classes once."""
    (preds, target), second = _box_batches(seed=2)
    metric, per_class = _iou_metric(name, iou_threshold=0.2), _iou_metric(name, class_metrics=True)
    with SyncProbe() as probe:
        metric.update(preds, target)
        metric(*second)
        metric.compute()
        per_class.update(preds, target)
    assert probe.count == 0, probe.events
    with SyncProbe() as probe:
        per_class.compute()
    assert probe.count == 1, probe.events


@needs_torchvision
def test_iou_stock_syncs_and_launches() -> None:
    """Stock's boolean mask write per image (and the threshold's); the device path launches no more kernels."""
    preds, target = _box_batches(seed=3)[0]
    with SyncProbe() as probe:
        _iou_metric("IntersectionOverUnion", iou_threshold=0.2).update(preds, target)
    assert probe.count == 2 * len(preds), probe.events
    with _device_path():
        stock_launches = count_launches(_iou_metric("IntersectionOverUnion", iou_threshold=0.2).update, preds, target)
        with torchmetrics_syncfree.patched():
            metric = _iou_metric("IntersectionOverUnion", iou_threshold=0.2)
            patched_launches = count_launches(metric.update, preds, target)
    assert patched_launches[0] <= stock_launches[0], (patched_launches, stock_launches)


@needs_torchvision
@pytest.mark.parametrize("path", PATHS)
def test_iou_invalid_input_raises_stocks_error(path: str) -> None:
    """Stock's validation (host information only): at once, with stock's type and text, on both paths."""
    boxes, labels = torch.zeros(1, 4), torch.zeros(1, dtype=torch.long)
    cases = [
        ([{"labels": labels}], [{"boxes": boxes, "labels": labels}], "contain the `boxes` key"),
        ([{"boxes": torch.zeros(1, 3), "labels": labels}], [{"boxes": boxes, "labels": labels}], "of shape"),
    ]
    for preds, target, text in cases:
        with pytest.raises(ValueError, match=text):
            _iou_metric("IntersectionOverUnion").update(preds, target)
        probe = SyncProbe() if path == "device" else contextlib.nullcontext()
        with torchmetrics_syncfree.patched(), probe, pytest.raises(ValueError, match=text):
            _iou_metric("IntersectionOverUnion").update(preds, target)


@needs_torchvision
@pytest.mark.parametrize("path", PATHS)
def test_iou_functional_parity(path: str) -> None:
    from torchmetrics.functional.detection import complete_intersection_over_union, intersection_over_union

    preds, target = _box_batches(seed=4)[0]
    boxes = preds[0]["boxes"], target[0]["boxes"]

    def run() -> list[Tensor]:
        return [
            fn(*boxes, iou_threshold=0.2, aggregate=False)
            for fn in (intersection_over_union, complete_intersection_over_union)
        ]

    expected = run()
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
        got = run()
    assert probe is None or probe.count == 0
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


# ------------------------------------------------------------------ detection: PanopticQuality, ModifiedPanopticQuality


def _panoptic(
    gen: torch.Generator, shape: tuple[int, ...], categories: int = 3, dtype: torch.dtype = torch.long
) -> Tensor:
    """``(category, instance)`` per point: categories 0-1 things, 2 stuff, 3 (if drawn) unknown."""
    category = torch.randint(0, categories, shape, generator=gen)
    instance = torch.randint(0, 3, shape, generator=gen)
    return torch.stack([category, instance], dim=-1).to(dtype)


def _panoptic_batches(seed: int, shape: tuple[int, ...] = (3, 6, 6), unknown: bool = False, **kwargs: Any) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (_panoptic(gen, shape, 4 if unknown else 3, **kwargs), _panoptic(gen, shape, 4, **kwargs)) for _ in range(2)
    ]


def _panoptic_metric(name: str, **kwargs: Any) -> Any:
    import torchmetrics.detection

    return getattr(torchmetrics.detection, name)(things={0, 1}, stuffs={2}, **kwargs)


@pytest.mark.parametrize("path", PATHS)
def test_panoptic_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes, to the bit on both paths (unknown target
    categories as void; unknown predicted ones where allowed; images and point clouds; int32 inputs)."""
    pq, modified = "PanopticQuality", "ModifiedPanopticQuality"
    cases = {
        "pq": (lambda: _panoptic_metric(pq), _panoptic_batches(1)),
        "per class": (
            lambda: _panoptic_metric(pq, return_sq_and_rq=True, return_per_class=True),
            _panoptic_batches(2, dtype=torch.int32),
        ),
        "sq and rq": (lambda: _panoptic_metric(pq, return_sq_and_rq=True), _panoptic_batches(3, shape=(2, 40))),
        "unknown allowed": (
            lambda: _panoptic_metric(pq, allow_unknown_preds_category=True),
            _panoptic_batches(4, unknown=True),
        ),
        "modified": (lambda: _panoptic_metric(modified), _panoptic_batches(5)),
        "modified 3-d": (lambda: _panoptic_metric(modified), _panoptic_batches(6, shape=(2, 3, 4, 3))),
        "empty batch": (lambda: _panoptic_metric(pq), _panoptic_batches(13, shape=(0, 4, 4))),
    }
    parity(cases, path=path)


@pytest.mark.parametrize("path", PATHS)
def test_panoptic_compute_averages_are_stocks_within_the_last_bit(path: str) -> None:
    """Documented deviation: the compute is one implementation on every device; its averages over the counted
    categories are masked sums divided by the count, which may differ from stock's ``mean(x[mask])`` in the last bit
    (another summation order) where many categories count. Per-category values are stock's to the bit."""
    import torchmetrics.functional.detection._panoptic_quality_common as common

    generator = torch.Generator().manual_seed(0)
    for categories in (1, 3, 40, 300):
        iou_sum = torch.rand(categories, dtype=torch.float64, generator=generator) * 5
        true_positives, false_positives, false_negatives = torch.randint(0, 6, (3, categories), generator=generator)
        true_positives[::4] = 0  # categories without a match, and (some) not counted at all
        false_positives[::8] = false_negatives[::8] = 0
        states = (iou_sum, true_positives, false_positives, false_negatives)
        stock = common._panoptic_quality_compute(*states)
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            patched = common._panoptic_quality_compute(*states)
        for index, (value, expected) in enumerate(zip(patched, stock)):
            assert (value.dtype, value.shape) == (expected.dtype, expected.shape)
            # per category: the same ops; averages: another summation order, the last bit of the dtype
            rtol = 0.0 if index < 3 else {torch.float32: 1e-6, torch.float64: 1e-12}[value.dtype]
            torch.testing.assert_close(value, expected, rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("points_per_pass", [36, 80, 1])
def test_panoptic_update_in_passes_keeps_stocks_states(points_per_pass: int, path: str) -> None:
    """A batch counted a few samples at a time (one sample of 36 points per pass, two and an uneven last pass, one
    sample where a sample exceeds the pass) gives stock's states to the bit: the IoUs summed over samples in order."""
    from torchmetrics_syncfree.detection import panoptic_qualities

    batches = _panoptic_batches(14, shape=(5, 6, 6), unknown=True)
    for name, kwargs in (("PanopticQuality", {"allow_unknown_preds_category": True}), ("ModifiedPanopticQuality", {})):
        reference = _panoptic_metric(name, **kwargs)
        with torchmetrics_syncfree.patched(), _device_path() if path == "device" else contextlib.nullcontext():
            metric = _panoptic_metric(name, **kwargs)
            with mock.patch.object(panoptic_qualities, "POINTS_PER_PASS", points_per_pass):
                for preds, target in batches:
                    preds = preds if kwargs else preds.clamp(max=2)
                    reference.update(preds, target)
                    # the passes read nothing either (the probe simulates a GPU there, the copy still in flight)
                    watched = path == "device"
                    in_flight = _instrumentation.simulated_copy_delay(None) if watched else contextlib.nullcontext()
                    with in_flight, SyncProbe() if watched else contextlib.nullcontext() as probe:
                        metric.update(preds, target)
                    assert not watched or probe.count == 0, probe.events
        for state in ("iou_sum", "true_positives", "false_positives", "false_negatives"):
            assert torch.equal(getattr(metric, state), getattr(reference, state)), (name, state)


@pytest.mark.skipif(not PEAK_MEASURABLE, reason=f"torch {torch.__version__}: a storage's release is not watchable")
def test_panoptic_update_memory_is_bounded_by_a_pass() -> None:
    """The temporaries alive at once stay under 96 bytes per point of a pass (65536 points; the same one-pass update
    held 265 per point of the whole batch), and under stock's for samples of 256 x 256 points."""
    from torchmetrics_syncfree.detection.panoptic_qualities import POINTS_PER_PASS

    gen = torch.Generator().manual_seed(15)

    def peak_of(shape: tuple[int, ...]) -> tuple[int, int]:
        preds, target = _panoptic(gen, shape), _panoptic(gen, shape)
        stock_peak = peak_allocated_by(lambda: _panoptic_metric("PanopticQuality").update(preds, target))
        with torchmetrics_syncfree.patched():
            metric = _panoptic_metric("PanopticQuality")
            return peak_allocated_by(lambda: metric.update(preds, target)), stock_peak

    two_passes, _ = peak_of((8, 128, 128))
    assert two_passes < 96 * POINTS_PER_PASS, two_passes
    large_samples, stock_peak = peak_of((2, 256, 256))
    assert large_samples < 96 * POINTS_PER_PASS, large_samples
    assert large_samples < stock_peak, (large_samples, stock_peak)


def test_panoptic_update_and_forward_are_sync_free(syncfree: Any) -> None:
    """No would-be sync in update and forward (the copy arrived and in flight), nor in compute; stock reads per
    segment and intersection."""
    data = _panoptic_batches(7)
    for name in ("PanopticQuality", "ModifiedPanopticQuality"):
        assert_sync_free_life(_panoptic_metric(name), data)
        metric = _panoptic_metric(name)
        with _instrumentation.simulated_copy_delay(None), SyncProbe() as probe:
            metric.update(*data[0])
            metric(*data[1])
        assert probe.count == 0, probe.events


def test_panoptic_stock_syncs_and_launches() -> None:
    preds, target = _panoptic_batches(8)[0]
    with SyncProbe() as probe:
        _panoptic_metric("PanopticQuality").update(preds, target)
    assert probe.count > 10 * preds.shape[0], probe.counts()
    with _device_path():
        stock_launches = count_launches(_panoptic_metric("PanopticQuality").update, preds, target)[0]
        with torchmetrics_syncfree.patched():
            patched_launches = count_launches(_panoptic_metric("PanopticQuality").update, preds, target)[0]
    assert patched_launches < stock_launches, (patched_launches, stock_launches)


@pytest.mark.skipif(not PEAK_MEASURABLE, reason=f"torch {torch.__version__}: a storage's release is not watchable")
@pytest.mark.skipif(_series_tree.in_tree_mode(), reason="the tool patches with the layer's patch_all()")
def test_panoptic_memory_tool_measures_both_sides_with_equal_states() -> None:
    """``tools/panoptic_memory.py`` (the measurements of ``docs/other-metrics.md``) runs and compares the states."""
    tool = Path(__file__).resolve().parents[1] / "tools" / "panoptic_memory.py"
    run = subprocess.run(
        [sys.executable, str(tool), "2x8x8", "1x16x16"], capture_output=True, text=True, timeout=300, check=True
    )
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert [row["points"] for row in rows] == ["2x8x8", "1x16x16"]
    for row in rows:
        assert row["equal_states"], row
        for side in ("stock", "patched"):
            assert 0 < row[side]["peak_MB"] <= row[side]["allocated_MB"], row


@pytest.mark.parametrize("path", PATHS)
def test_panoptic_unknown_category_raises_stocks_error(path: str) -> None:
    """Stock's ValueError: at once on CPU, at the end of the update on the device path, the batch left out."""
    good, bad = _panoptic_batches(9)[0], _panoptic_batches(9, unknown=True)[1]
    with pytest.raises(ValueError, match="Unknown categories found") as stock_error:
        _panoptic_metric("PanopticQuality").update(*bad)
    reference = _panoptic_metric("PanopticQuality")
    reference.update(*good)
    with torchmetrics_syncfree.patched():
        metric = _panoptic_metric("PanopticQuality")
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(*good)
            with pytest.raises(ValueError, match="Unknown categories found") as patched_error:
                metric.update(*bad)
        if path == "cpu":  # where reads are free stock's text, which names the unknown points
            assert str(patched_error.value) == str(stock_error.value)
        torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=0)
        assert pending_checks(metric) == 0


@pytest.mark.parametrize("name", ["PanopticQuality", "ModifiedPanopticQuality"])
def test_panoptic_cpu_update_is_the_batched_pass(name: str) -> None:
    """One implementation: where reads are free the update is the batched pass too (stock's loops call
    ``torch.unique`` per sample; the batched pass never does), with stock's states to the bit."""
    preds, target = _panoptic_batches(12)[0]
    reference = _panoptic_metric(name)
    reference.update(preds, target)
    with torchmetrics_syncfree.patched():
        metric = _panoptic_metric(name)
        with mock.patch("torch.unique", side_effect=AssertionError("a data-dependent op")):
            metric.update(preds, target)
    for state in ("iou_sum", "true_positives", "false_positives", "false_negatives"):
        assert torch.equal(getattr(metric, state), getattr(reference, state)), state


@pytest.mark.parametrize("path", PATHS)
def test_panoptic_invalid_input_raises_stocks_error_at_once(path: str) -> None:
    preds = _panoptic_batches(11)[0][0]
    cases = [
        (preds.tolist(), preds, TypeError),
        (preds, preds[:1], ValueError),
        (preds[..., :1], preds[..., :1], ValueError),
    ]
    for bad_preds, bad_target, error in cases:
        with pytest.raises(error) as stock_error:
            _panoptic_metric("PanopticQuality").update(bad_preds, bad_target)
        probe = SyncProbe() if path == "device" else contextlib.nullcontext()
        with torchmetrics_syncfree.patched(), probe, pytest.raises(error, match=re.escape(str(stock_error.value))):
            _panoptic_metric("PanopticQuality").update(bad_preds, bad_target)


@pytest.mark.compile
def test_panoptic_update_traces_with_fullgraph(syncfree: Any) -> None:
    metric, reference = _panoptic_metric("ModifiedPanopticQuality"), _panoptic_metric("ModifiedPanopticQuality")
    preds, target = _panoptic_batches(10)[0]
    with _device_path():
        torch._dynamo.reset()
        torch.compile(lambda p, t: metric.update(p, t), fullgraph=True, backend="aot_eager")(preds, target)
        torch._dynamo.reset()
    reference.update(preds, target)
    torch.testing.assert_close(metric.iou_sum, reference.iou_sum, rtol=0, atol=0)
    assert torch.equal(metric.true_positives, reference.true_positives)


# ------------------------------------------------------------------ CUDA (tox -e gpu; skipped without CUDA)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
@pytest.mark.parametrize("name", ["HausdorffDistance", "PanopticQuality", "ModifiedPanopticQuality"])
def test_cuda_update_never_syncs_and_equals_stock(name: str) -> None:
    """With ``torch.cuda.set_sync_debug_mode("error")`` every synchronizing call raises; the states equal stock's
    on the same GPU (float64 IoU sums: atomic adds, last bits)."""
    from tests._probing import syncs_are_errors

    if name == "HausdorffDistance":
        data = [tuple(_onehot(x).cuda() for x in batch) for batch in _batches("index", seed=12)]

        def make() -> Any:
            return _make(CONFIGS[0], "one-hot").cuda()

        states = ("score", "total")
    else:
        data = [(p.cuda(), t.cuda()) for p, t in _panoptic_batches(12)]

        def make() -> Any:
            return _panoptic_metric(name).cuda()

        states = ("iou_sum", "true_positives", "false_positives", "false_negatives")
    reference = make()
    for batch in data:
        reference.update(*batch)
    with torchmetrics_syncfree.patched():
        metric = make()
        with syncs_are_errors():
            for batch in data:
                metric.update(*batch)
        for state in states:
            torch.testing.assert_close(getattr(metric, state), getattr(reference, state), rtol=1e-12, atol=0)
        torch.testing.assert_close(metric.compute(), reference.compute(), rtol=1e-6, atol=0, equal_nan=True)
