"""BinaryHingeLoss and MulticlassHingeLoss: stock's values on both patched paths, sync-free update/forward/compute on
the device path, validation reported as stock's, compile without graph breaks."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from tests._classification_cases import NUM_CLASSES, PATHS, Case, parity, pending_checks
from tests._probing import graph_breaks
from torchmetrics_syncfree import SyncProbe, _instrumentation

#: (task, extra arguments) for every mode of the loss
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    *[("binary", {"squared": squared}) for squared in (False, True)],
    *[
        ("multiclass", {"multiclass_mode": mode, "squared": squared})
        for mode in ("crammer-singer", "one-vs-all")
        for squared in (False, True)
    ],
]
IGNORE = {"binary": (None, -1), "multiclass": (None, -1, 1)}


def _make(task: str, extra: dict[str, Any], ignore_index: int | None = None, **kwargs: Any) -> Any:
    size = {"num_classes": NUM_CLASSES} if task == "multiclass" else {}
    return torchmetrics.HingeLoss(task=task, ignore_index=ignore_index, **size, **extra, **kwargs)


def _label(task: str, extra: dict[str, Any], ignore_index: int | None) -> str:
    return "-".join([task, *map(str, extra.values()), f"ignore={ignore_index}"])


def _batches(task: str, ignore_index: int | None, seed: int, n: int = 16) -> list[tuple[Tensor, Tensor]]:
    """Probabilities, logits, float64 logits, extra dimensions, and (with ``ignore_index``) a fully ignored batch."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if task == "binary" else (n, NUM_CLASSES)
    classes = 2 if task == "binary" else NUM_CLASSES
    out = []
    for i in range(5):
        extra = (3,) if i == 3 else ()
        logits = torch.randn((*shape, *extra), generator=gen) * 2
        if i == 0:
            preds = logits.sigmoid() if task == "binary" else logits.softmax(1)
        else:
            preds = logits.double() if i == 2 else logits
        target = torch.randint(0, classes, (n, *extra), generator=gen)
        if ignore_index is not None:
            ignored = torch.rand(target.shape, generator=gen) < (1.0 if i == 4 else 0.25)
            target = target.masked_fill(ignored, ignore_index)
        out.append((preds, target))
    return out


def _cases() -> dict[str, Case]:
    cases = {}
    for task, extra in CONFIGS:
        for ignore_index in IGNORE[task]:
            label = _label(task, extra, ignore_index)
            data = _batches(task, ignore_index, seed=sum(map(ord, label)))
            if extra.get("multiclass_mode") == "crammer-singer" and ignore_index is not None:
                data = data[:4]  # stock fails on the fully ignored batch (the deviation tested below)
            cases[label] = (lambda t=task, e=extra, i=ignore_index: _make(t, e, i)), data
    return cases


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes for every mode, ``squared`` and
    ``ignore_index``. On every device an ``ignore_index`` sums the zeroed losses of ignored entries too: the float
    sums may round differently in the last bits (documented), so those cases compare with a float32-ulp tolerance."""
    parity(_cases(), path=path, rtol=lambda label: 1e-6 if "ignore=None" not in label else 0.0)


@pytest.mark.parametrize("path", PATHS)
def test_parity_without_ignore_index_is_exact(path: str) -> None:
    """The tolerance above is for ``ignore_index`` only: every other case is stock's to the bit on both paths."""
    parity({label: case for label, case in _cases().items() if "ignore=None" in label}, path=path)


@pytest.mark.parametrize(("task", "extra"), CONFIGS, ids=[_label(*c, None) for c in CONFIGS])
def test_update_forward_and_compute_are_sync_free(syncfree: Any, task: str, extra: dict[str, Any]) -> None:
    for ignore_index in IGNORE[task]:
        data = _batches(task, ignore_index, seed=3)
        metric = _make(task, extra, ignore_index)
        with SyncProbe() as probe:
            for preds, target in data[:2]:
                metric.update(preds, target)
            for preds, target in data[2:]:
                metric(preds, target)
            metric.compute()
        assert probe.count == 0, (ignore_index, probe.events)


@pytest.mark.parametrize(("task", "extra"), CONFIGS, ids=[_label(*c, None) for c in CONFIGS])
def test_stock_syncs_are_seen(task: str, extra: dict[str, Any]) -> None:
    """The probe sees stock's reads (validation, boolean masks, ``tensor(N, device=...)``): the zero above means
    something."""
    metric = _make(task, extra, -1)
    preds, target = _batches(task, -1, seed=1)[0]
    with SyncProbe() as probe:
        metric.update(preds, target)
    assert probe.count > 0


INVALID = {
    "binary target": ("binary", torch.tensor([0.2, 0.7]), torch.tensor([0, 2]), RuntimeError),
    "binary int preds": ("binary", torch.tensor([0, 1]), torch.tensor([0, 1]), ValueError),
    "multiclass target": ("multiclass", torch.randn(2, NUM_CLASSES), torch.tensor([0, NUM_CLASSES + 3]), RuntimeError),
    "multiclass int preds": ("multiclass", torch.tensor([0, 1]), torch.tensor([0, 1]), ValueError),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error_type(path: str, case: str) -> None:
    """Stock's exception type: at once on CPU; on the device path the dtype check (host information) at once, the
    value check at the end of the update (the simulated copy arrives), with the batch left out of the state."""
    task, preds, target, error = INVALID[case]
    with pytest.raises(error):
        _make(task, {}).update(preds, target)
    good_preds, good_target = _batches(task, None, seed=5)[0]
    reference = _make(task, {})
    reference.update(good_preds, good_target)
    with torchmetrics_syncfree.patched():
        metric = _make(task, {})
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(good_preds, good_target)
            with pytest.raises(error):
                metric.update(preds, target)
        torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=0)
        assert pending_checks(metric) == 0


def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    metric = _make("multiclass", {})
    preds = torch.randn(2, NUM_CLASSES)
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(preds, torch.tensor([0, 1]))
        metric.update(preds, torch.tensor([0, 70]))
        assert pending_checks(metric) == 1
        twin = copy.deepcopy(metric)
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.compute()
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            twin.reset()  # a copy carries the pending report; reset reports it before dropping the state
    assert pending_checks(metric) == 0
    assert int(metric.total) == 2  # the bad batch never entered the state


def test_target_outside_the_classes_without_validation_is_left_out_on_the_device_path(syncfree: Any) -> None:
    """Documented deviation: stock's one-hot fails there (a device-side assert on CUDA); the entry is left out."""
    preds, target = torch.randn(3, NUM_CLASSES), torch.tensor([0, NUM_CLASSES, 2])
    metric, reference = _make("multiclass", {}, validate_args=False), _make("multiclass", {})
    with SyncProbe() as probe:
        metric.update(preds, target)
    assert probe.count == 0
    reference.update(preds[[0, 2]], torch.tensor([0, 2]))
    torch.testing.assert_close(metric.compute(), reference.compute())
    assert int(metric.total) == 2


@pytest.mark.parametrize(("task", "extra"), CONFIGS, ids=[_label(*c, None) for c in CONFIGS])
@pytest.mark.compile
def test_update_traces_without_a_graph_break(task: str, extra: dict[str, Any]) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = _make(task, extra, -1)
        preds, target = _batches(task, -1, seed=2)[1]
        explanation = torch._dynamo.explain(lambda p, t: metric.update(p, t))(preds, target)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


@pytest.mark.parametrize("path", PATHS)
def test_fully_ignored_crammer_singer_batch_adds_nothing(path: str) -> None:
    """Documented deviation: stock's crammer-singer update fails on a batch whose entries are all ignored
    (``view(0, -1)`` of an empty tensor); the patched one adds nothing, as a fully ignored batch does in every other
    mode."""
    preds, target = torch.randn(4, NUM_CLASSES), torch.full((4,), -1)
    with pytest.raises(RuntimeError, match="cannot reshape"):
        _make("multiclass", {}, -1).update(preds, target)
    good_preds, good_target = _batches("multiclass", None, seed=8)[0]
    reference = _make("multiclass", {}, -1)
    reference.update(good_preds, good_target)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = _make("multiclass", {}, -1)
        metric.update(good_preds, good_target)
        metric.update(preds, target)
        torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=0)
        assert int(metric.total) == good_target.numel()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["crammer-singer", "one-vs-all"])
@pytest.mark.parametrize(("ignore_index", "bad"), [(None, NUM_CLASSES), (-1, -2)])
def test_target_outside_the_classes_gets_the_validation_error(
    path: str, mode: str, ignore_index: Any, bad: int
) -> None:
    """With ``validate_args`` a multiclass target outside the classes gets the validation's error: on CPU at once,
    naming the values (the patched validation leaves the read to stock's one-hot, whose bounds check fails first: its
    error is replaced), on the device path the deferred report; the batch is left out of the state on both paths."""
    preds, target = torch.randn(4, NUM_CLASSES), torch.tensor([0, 1, bad, 2])
    message = rf"Detected the following values in `target`: .*{bad}" if path == "cpu" else "not valid for this metric"
    good_preds, good_target = _batches("multiclass", ignore_index, seed=9)[0]
    with torchmetrics_syncfree.patched():
        metric = _make("multiclass", {"multiclass_mode": mode}, ignore_index)
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(good_preds, good_target)
            before = copy.deepcopy(metric.metric_state)
            with pytest.raises(RuntimeError, match=message):
                metric.update(preds, target)
        for name, value in before.items():
            torch.testing.assert_close(getattr(metric, name), value, rtol=0, atol=0)
