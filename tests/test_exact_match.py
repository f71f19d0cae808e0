"""MulticlassExactMatch and MultilabelExactMatch: stock's values on both patched paths, sync-free update/forward/compute
on the device path, validation reported as stock's, compile without graph breaks."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from tests._classification_cases import NUM_CLASSES, PATHS, Case, parity, pending_checks
from tests._probing import assert_sync_free_life, graph_breaks
from torchmetrics_syncfree import SyncProbe, _instrumentation

#: (task, multidim_average, ignore_index)
CONFIGS = [
    (task, average, ignore_index)
    for task, ignores in (("multiclass", (None, -1, 1)), ("multilabel", (None, -1)))
    for average in ("global", "samplewise")
    for ignore_index in ignores
]


def _make(task: str, average: str, ignore_index: int | None, **kwargs: Any) -> Any:
    size = {"num_classes": NUM_CLASSES} if task == "multiclass" else {"num_labels": NUM_CLASSES}
    return torchmetrics.ExactMatch(task=task, multidim_average=average, ignore_index=ignore_index, **size, **kwargs)


def _label(task: str, average: str, ignore_index: int | None) -> str:
    return f"{task}-{average}-ignore={ignore_index}"


def _batches(task: str, ignore_index: int | None, seed: int, n: int = 8) -> list[tuple[Tensor, Tensor]]:
    """(N, ..., 4) batches (samplewise needs the extra dimension): scores, labels, and batches built to match exactly
    often (few classes), with ``ignore_index`` on about a quarter of the targets."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        if task == "multiclass":
            target = torch.randint(0, 2, (n, 4), generator=gen)
            preds: Tensor = torch.where(torch.rand(n, 4, generator=gen) < 0.9, target, 1 - target)
            if i % 2 == 0:  # scores whose argmax is those labels
                preds = torch.nn.functional.one_hot(preds, NUM_CLASSES).movedim(-1, 1).float() + 0.1 * torch.rand(
                    n, NUM_CLASSES, 4, generator=gen
                )
        else:
            target = torch.randint(0, 2, (n, NUM_CLASSES, 4), generator=gen)
            labels = torch.where(torch.rand(target.shape, generator=gen) < 0.95, target, 1 - target)
            preds = labels if i % 2 else labels * 0.6 + 0.2  # probabilities on the right side of 0.5
        if ignore_index is not None:
            target = target.masked_fill(torch.rand(target.shape, generator=gen) < 0.25, ignore_index)
        out.append((preds, target))
    return out


def _cases() -> dict[str, Case]:
    cases = {}
    for config in CONFIGS:
        label = _label(*config)
        data = _batches(config[0], config[2], seed=sum(map(ord, label)))
        cases[label] = (lambda c=config: _make(*c)), data
    return cases


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes (counts: to the bit on both paths)."""
    cases = _cases()
    stock_values = [case[0]()(*case[1][0]) for case in cases.values()]
    assert any(bool((value > 0).any()) for value in stock_values)  # the data matches exactly sometimes
    parity(cases, path=path)


@pytest.mark.parametrize("config", CONFIGS, ids=[_label(*c) for c in CONFIGS])
def test_update_forward_and_compute_are_sync_free(syncfree: Any, config: tuple) -> None:
    data = _batches(config[0], config[2], seed=3)
    metric = _make(*config)
    assert_sync_free_life(metric, data)


@pytest.mark.parametrize("config", CONFIGS, ids=[_label(*c) for c in CONFIGS])
def test_stock_syncs_are_seen(config: tuple) -> None:
    metric = _make(*config)
    with SyncProbe() as probe:
        metric.update(*_batches(config[0], config[2], seed=1)[0])
    assert probe.count > 0


@pytest.mark.parametrize("task", ["multiclass", "multilabel"])
def test_functional_counting_is_sync_free(syncfree: Any, task: str) -> None:
    """The functional updates are replaced too: without validation the functional metric no longer syncs."""
    functional = importlib.import_module("torchmetrics.functional.classification")
    preds, target = _batches(task, -1, seed=4)[0]
    size = {"num_classes": NUM_CLASSES} if task == "multiclass" else {"num_labels": NUM_CLASSES}
    call = getattr(functional, f"{task}_exact_match")
    with SyncProbe() as probe:
        patched = call(preds, target, **size, ignore_index=-1, validate_args=False)
    assert probe.count == 0, probe.events
    torchmetrics_syncfree.unpatch_all()
    torch.testing.assert_close(patched, call(preds, target, **size, ignore_index=-1, validate_args=False))


INVALID = {
    "multiclass target": ("multiclass", torch.randint(0, 2, (2, 4)), torch.tensor([[0, 1, 0, 9]] * 2)),
    "multiclass label preds": ("multiclass", torch.tensor([[0, 1, 0, -4]] * 2), torch.zeros(2, 4, dtype=torch.long)),
    "multilabel target": ("multilabel", torch.rand(2, NUM_CLASSES, 4), torch.full((2, NUM_CLASSES, 4), 2)),
}


#: the stat scores' documented deviation: stock's multiclass validation counts distinct labels (fewer than the classes
#: here) and lets a label outside the classes through; the patched validation checks the range
STOCK_LETS_THROUGH = {"multiclass target", "multiclass label preds"}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("average", ["global", "samplewise"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error_type(path: str, average: str, case: str) -> None:
    """Stock's ``RuntimeError``: at once on CPU, at the end of the update on the device path (the simulated copy
    arrives), the batch left out of a global state (samplewise: its rows count no match, documented)."""
    task, preds, target = INVALID[case]
    if case in STOCK_LETS_THROUGH:
        _make(task, average, None).update(preds, target)
    else:
        with pytest.raises(RuntimeError):
            _make(task, average, None).update(preds, target)
    good_preds, good_target = _batches(task, None, seed=5)[0]
    reference = _make(task, average, None)
    reference.update(good_preds, good_target)
    with torchmetrics_syncfree.patched():
        metric = _make(task, average, None)
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(good_preds, good_target)
            with pytest.raises(RuntimeError, match=r"not valid|Detected"):
                metric.update(preds, target)
        assert pending_checks(metric) == 0
        if average == "global" or path == "cpu":
            torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=0)
        else:
            expected = torch.cat([reference.compute(), torch.zeros(preds.shape[0])])
            torch.testing.assert_close(metric.compute(), expected, rtol=0, atol=0)


def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    metric = _make("multiclass", "global", None)
    preds, target = INVALID["multiclass target"][1:]
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(preds, torch.zeros_like(target))
        metric.update(preds, target)
        assert pending_checks(metric) == 1
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.compute()
    assert int(metric.total) == 2


@pytest.mark.parametrize(
    "config", CONFIGS[:: len(CONFIGS) // 4], ids=[_label(*c) for c in CONFIGS[:: len(CONFIGS) // 4]]
)
@pytest.mark.compile
def test_update_traces_without_a_graph_break(config: tuple) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = _make(*config)
        preds, target = _batches(config[0], config[2], seed=2)[0]
        explanation = torch._dynamo.explain(lambda p, t: metric.update(p, t))(preds, target)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []
