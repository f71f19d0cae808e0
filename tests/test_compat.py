"""What differs between torch releases: the feature checks of ``_compat`` and the report's metric set on this torch.

Every torch of the README's support matrix runs this file (``torch-oldest``, ``tm*``, ``torch-newest``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import (
    BinaryAccuracy,
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

import torchmetrics_syncfree
from tests._probing import assert_sync_free_life, on_path
from torchmetrics_syncfree import SyncProbe, _compat

REPORT_CLASSES = 1000


def _report_set() -> list:
    """The metric set of the report behind the project: a loss mean and four multiclass classification metrics."""
    classes = REPORT_CLASSES
    return [
        MeanMetric(),
        MulticlassAccuracy(classes),
        MulticlassPrecision(classes),
        MulticlassRecall(classes),
        MulticlassF1Score(classes),
    ]


def _steps(metrics: list, probe: SyncProbe | None = None) -> tuple[list, list]:
    generator = torch.Generator().manual_seed(0)
    outputs = []
    for _ in range(4):
        scores = torch.rand(128, REPORT_CLASSES, generator=generator)
        target = torch.randint(REPORT_CLASSES, (128,), generator=generator)
        loss = torch.rand((), generator=generator)
        with probe if probe is not None else warnings.catch_warnings():
            outputs.append([metrics[0](loss)] + [metric(scores, target) for metric in metrics[1:]])
            metrics[0].update(loss)
            for metric in metrics[1:]:
                metric.update(scores, target)
    return outputs, [metric.compute() for metric in metrics]


@pytest.mark.parametrize("path", ["cpu", "device"])
def test_the_report_set_gives_stocks_values_without_a_sync(path: str) -> None:
    """``patch_all()`` on this torch: stock's values to the bit, and no would-be sync in ``forward``/``update``."""
    stock = _steps(_report_set())
    with torchmetrics_syncfree.patched(), on_path(path):
        probe = SyncProbe() if path == "device" else None
        patched = _steps(_report_set(), probe)
    if probe is not None:
        assert probe.events == [], probe.summary()
    torch.testing.assert_close(patched, stock, rtol=0, atol=0)


def test_half_activations_match_the_float32_ones_rounded() -> None:
    scores = torch.randn(6, 5).half()
    for normalization, reference in (("sigmoid", scores.float().sigmoid()), ("softmax", scores.float().softmax(1))):
        activated = _compat.activated(scores, normalization)
        assert activated.dtype is torch.half
        torch.testing.assert_close(activated, reference.half(), rtol=0, atol=1e-3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: MulticlassAccuracy(5, average="macro"),
        lambda: MulticlassConfusionMatrix(5),
        lambda: MulticlassAUROC(5, thresholds=10),
        lambda: BinaryAccuracy(),
    ],
    ids=["stat-scores", "confusion-matrix", "binned-auroc", "binary"],
)
def test_half_logits_are_sync_free_on_the_device_path(make: Any) -> None:
    """Logits in half precision take the activations of ``_compat`` (float32 and back where this torch has no half
    kernels on the CPU) inside a sync-free update and forward, with the values of the same logits in float32."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 5, generator=generator) * 4
    target = torch.randint(5, (16,), generator=generator)
    if isinstance(make(), BinaryAccuracy):
        logits, target = logits[:, 0], target.clamp(max=1)
    with torchmetrics_syncfree.patched(), on_path("device"):
        half, single = make(), make()
        assert_sync_free_life(half, [(logits.half(), target)] * 3)
        single.update(logits.half().float(), target)
        single(logits.half().float(), target)
        single(logits.half().float(), target)
        torch.testing.assert_close(half.compute(), single.compute(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.half, torch.float64])
def test_itemsize_is_the_element_size(dtype: torch.dtype) -> None:
    assert _compat.itemsize(dtype) == torch.empty((), dtype=dtype).element_size()


def test_the_feature_flags_describe_this_torch() -> None:
    """Each flag is what this torch does: the checks the layer chooses its code paths by."""
    states = [torch.zeros(())]
    with torch.enable_grad():
        torch._foreach_add_(states, [torch.ones((), requires_grad=True)])
    assert _compat.FOREACH_ADD_RECORDS_GRAD is states[0].requires_grad
    assert _compat.FOREACH_MUL_BY_TENSOR is ("Tensor" in torch.ops.aten._foreach_mul.overloads())
    assert _compat.is_compiling() is False


def test_a_weighted_mean_logged_through_forward_keeps_its_grad() -> None:
    """Torch 2.0's in-place multi-tensor add records no grad: the states are added one by one there."""
    value = torch.tensor([1.0, 2.0], requires_grad=True)
    with torchmetrics_syncfree.patched():
        MeanMetric()(value, torch.tensor([1.0, 3.0])).backward()
    torch.testing.assert_close(value.grad, torch.tensor([0.25, 0.75]))
