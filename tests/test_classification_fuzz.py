"""Hypothesis fuzz of the classification families beyond the stat scores: random shapes, class counts, score kinds
(labels, probabilities, logits, ties), ``ignore_index`` and thresholds; the patched update on the simulated device
path (or the CPU path) against stock on CPU. Integer states must be identical; float values identical too, except
HingeLoss sums with ``ignore_index`` on the device path (documented summation order, ``rtol=1e-6``)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torchmetrics
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def _inputs(draw: Any, task: str, scores: bool = True) -> dict[str, Any]:
    """A task's batch: ``(N, C[, T])`` scores or labels and targets, with an optional ``ignore_index``."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n, classes = draw(st.integers(1, 40)), draw(st.integers(2, 7))
    extra = draw(st.sampled_from([(), (3,)]))
    ignore_index = draw(st.sampled_from([None, -1, *([1] if task == "multiclass" else [])]))
    kind = draw(st.sampled_from(["probabilities", "logits", "ties"] + ([] if scores else ["labels"])))
    if task == "multiclass":
        target = torch.randint(0, classes, (n, *extra), generator=gen)
        logits = torch.randn((n, classes, *extra), generator=gen) * 3
        preds = {"probabilities": logits.softmax(1), "logits": logits, "ties": (logits.softmax(1) * 4).round() / 4}
        preds["labels"] = logits.argmax(1)
    else:
        shape = (n, *extra) if task == "binary" else (n, classes, *extra)
        target = torch.randint(0, 2, shape, generator=gen)
        logits = torch.randn(shape, generator=gen) * 3
        preds = {"probabilities": logits.sigmoid(), "logits": logits, "ties": (logits.sigmoid() * 4).round() / 4}
        preds["labels"] = (logits > 0).long()
    if ignore_index is not None:
        target = target.masked_fill(torch.rand(target.shape, generator=gen) < draw(st.floats(0, 1)), ignore_index)
    return {"preds": preds[kind], "target": target, "classes": classes, "ignore_index": ignore_index}


def _run(make: Any, batches: list[dict[str, Any]], state: str | None, path: str | None) -> list[Tensor]:
    """Stock (``path=None``) or patched on ``path``: forward of every batch, then compute (and the state)."""
    patching = contextlib.nullcontext() if path is None else torchmetrics_syncfree.patched()
    with patching:
        metric = make()  # outside the probe: made on the host (a list of thresholds becomes a tensor)
        with SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
            out = [metric(batch["preds"], batch["target"]) for batch in batches]
            out.append(metric.compute())
        if state is not None:
            out.append(getattr(metric, state).clone())
    assert probe is None or probe.count == 0, probe.events
    return [t for value in out for t in (value if isinstance(value, (tuple, list)) else [value])]


def _assert_same(stock: list[Tensor], patched: list[Tensor], rtol: float = 0.0) -> None:
    assert len(stock) == len(patched)
    for s, p in zip(stock, patched):
        assert (s.dtype, s.shape) == (p.dtype, p.shape)
        torch.testing.assert_close(p, s, rtol=rtol, atol=0, equal_nan=True)


@FUZZ
@given(
    task=st.sampled_from(["binary", "multiclass", "multilabel"]),
    data=st.data(),
    normalize=st.sampled_from([None, "true", "all"]),
    path=st.sampled_from(["cpu", "device"]),
)
def test_confusion_matrix(task: str, data: Any, normalize: str | None, path: str) -> None:
    first = data.draw(_inputs(task, scores=False))
    batches = [first, *[data.draw(_inputs(task, scores=False)) for _ in range(data.draw(st.integers(0, 2)))]]
    batches = [b for b in batches if b["classes"] == first["classes"] and b["ignore_index"] == first["ignore_index"]]
    size = {"multiclass": {"num_classes": first["classes"]}, "multilabel": {"num_labels": first["classes"]}}.get(task)

    def make() -> Any:
        return torchmetrics.ConfusionMatrix(
            task=task, normalize=normalize, ignore_index=first["ignore_index"], **(size or {})
        )

    _assert_same(_run(make, batches, "confmat", None), _run(make, batches, "confmat", path))


@FUZZ
@given(
    task=st.sampled_from(["binary", "multiclass", "multilabel"]),
    data=st.data(),
    thresholds=st.one_of(
        st.integers(2, 12),
        st.lists(st.floats(0, 1, width=32), min_size=1, max_size=8),
    ),
    path=st.sampled_from(["cpu", "device"]),
)
def test_binned_precision_recall_curve(task: str, data: Any, thresholds: Any, path: str) -> None:
    batch = data.draw(_inputs(task))
    if task == "multiclass" and batch["preds"].ndim > 2:
        batch["preds"] = batch["preds"][..., 0]  # stock's multiclass curves take (N, C) scores per entry
        batch["target"] = batch["target"][..., 0]
    size = {"multiclass": {"num_classes": batch["classes"]}, "multilabel": {"num_labels": batch["classes"]}}.get(task)

    def make() -> Any:
        return torchmetrics.PrecisionRecallCurve(
            task=task, thresholds=thresholds, ignore_index=batch["ignore_index"], **(size or {})
        )

    _assert_same(_run(make, [batch], "confmat", None), _run(make, [batch], "confmat", path))


@FUZZ
@given(
    task=st.sampled_from(["binary", "multiclass"]),
    data=st.data(),
    mode=st.sampled_from(["crammer-singer", "one-vs-all"]),
    squared=st.booleans(),
    path=st.sampled_from(["cpu", "device"]),
)
def test_hinge_loss(task: str, data: Any, mode: str, squared: bool, path: str) -> None:
    batch = data.draw(_inputs(task))
    if task == "multiclass" and mode == "crammer-singer" and batch["ignore_index"] is not None:
        batch["target"].view(-1)[0] = 0  # stock fails on a batch whose entries are all ignored (documented)
    extra = {"num_classes": batch["classes"], "multiclass_mode": mode} if task == "multiclass" else {}

    def make() -> Any:
        return torchmetrics.HingeLoss(task=task, squared=squared, ignore_index=batch["ignore_index"], **extra)

    # the zeroed losses of ignored entries add in, on every device
    rtol = 1e-6 if batch["ignore_index"] is not None else 0.0
    _assert_same(_run(make, [batch], None, None), _run(make, [batch], None, path), rtol=rtol)


@FUZZ
@given(
    task=st.sampled_from(["multiclass", "multilabel"]),
    data=st.data(),
    average=st.sampled_from(["global", "samplewise"]),
    path=st.sampled_from(["cpu", "device"]),
)
def test_exact_match(task: str, data: Any, average: str, path: str) -> None:
    batch = data.draw(_inputs(task, scores=False))
    if batch["target"].ndim == (1 if task == "multiclass" else 2):  # exact match needs positions per sample
        batch["target"] = batch["target"].unsqueeze(-1).expand(*batch["target"].shape, 2).contiguous()
        batch["preds"] = batch["preds"].unsqueeze(-1).expand(*batch["preds"].shape, 2).contiguous()
    size = {"num_classes": batch["classes"]} if task == "multiclass" else {"num_labels": batch["classes"]}

    def make() -> Any:
        return torchmetrics.ExactMatch(task=task, multidim_average=average, ignore_index=batch["ignore_index"], **size)

    _assert_same(_run(make, [batch], None, None), _run(make, [batch], None, path))


@FUZZ
@given(data=st.data(), name=st.sampled_from(["ROC", "PrecisionRecallCurve"]), path=st.sampled_from(["cpu", "device"]))
def test_unbinned_multiclass_micro_curve(data: Any, name: str, path: str) -> None:
    """Micro-averaged unbinned curves: a sync-free update (device path) and stock's curve. Their compute has a
    data-dependent length (it may read), so it runs outside the probe; on the device path a kept ignored entry's
    softmax may differ from stock's in the last bit (CPU's vectorized exp depends on the position)."""
    first = data.draw(_inputs("multiclass"))
    batches = [first, *[data.draw(_inputs("multiclass")) for _ in range(data.draw(st.integers(0, 2)))]]
    batches = [b for b in batches if b["classes"] == first["classes"] and b["ignore_index"] == first["ignore_index"]]
    batches = [
        {**b, "preds": b["preds"][..., 0], "target": b["target"][..., 0]} if b["target"].ndim > 1 else b
        for b in batches
    ]

    def make() -> Any:
        return getattr(torchmetrics, name)(
            task="multiclass", num_classes=first["classes"], average="micro", ignore_index=first["ignore_index"]
        )

    def run(patched: bool) -> list[Tensor] | type[Exception]:
        with torchmetrics_syncfree.patched() if patched else contextlib.nullcontext():
            metric = make()
            with SyncProbe() if patched and path == "device" else contextlib.nullcontext() as probe:
                for batch in batches:
                    metric.update(batch["preds"], batch["target"])
            assert probe is None or probe.count == 0, probe.events
            try:
                return list(metric.compute())
            except Exception as error:  # every target ignored: stock's compute fails on the empty state
                return type(error)

    stock, patched = run(False), run(True)
    if isinstance(stock, type):
        assert patched is stock
    else:
        assert isinstance(patched, list)
        _assert_same(stock, patched, rtol=1e-6 if path == "device" and first["ignore_index"] is not None else 0.0)
