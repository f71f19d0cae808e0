"""ConfusionMatrix and the metrics built on it (CohenKappa, MatthewsCorrCoef, JaccardIndex): stock's values on both
patched paths, sync-free update/forward (and compute where it is patched), validation, NaN warnings, compile."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from tests._classification_cases import IGNORE, NUM_CLASSES, PATHS, Case, batches, parity, pending_checks
from tests._probing import PATHS_WITH_FLIGHT, graph_breaks, on_path
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.tools.allocations import allocated_by

#: (metric, task, extra arguments): every task each metric has and the arguments that change its compute
FAMILY: list[tuple[str, str, dict[str, Any]]] = [
    *[
        ("ConfusionMatrix", task, {"normalize": n})
        for task in ("binary", "multiclass", "multilabel")
        for n in (None, "true", "pred", "all")
    ],
    *[("CohenKappa", task, {"weights": w}) for task in ("binary", "multiclass") for w in (None, "linear", "quadratic")],
    *[("MatthewsCorrCoef", task, {}) for task in ("binary", "multiclass", "multilabel")],
    ("JaccardIndex", "binary", {}),
    *[
        ("JaccardIndex", task, {"average": a})
        for task in ("multiclass", "multilabel")
        for a in ("micro", "macro", "weighted", "none")
    ],
]


def _make(name: str, task: str, extra: dict[str, Any], ignore_index: int | None, **kwargs: Any) -> Any:
    size = {"multiclass": {"num_classes": NUM_CLASSES}, "multilabel": {"num_labels": NUM_CLASSES}}.get(task, {})
    return getattr(torchmetrics, name)(task=task, ignore_index=ignore_index, **size, **extra, **kwargs)


def _label(name: str, task: str, extra: dict[str, Any], ignore_index: int | None) -> str:
    return "-".join([name, task, *map(str, extra.values()), str(ignore_index)])


def _cases(name: str) -> dict[str, Case]:
    cases = {}
    for metric, task, extra in FAMILY:
        if metric != name:
            continue
        for ignore_index in IGNORE[task]:
            label = _label(metric, task, extra, ignore_index)
            data = batches(task, ignore_index, seed=sum(map(ord, label)))
            cases[label] = (lambda t=task, e=extra, i=ignore_index: _make(name, t, e, i)), data
    return cases


@pytest.fixture(autouse=True)
def _quiet_nan_warnings() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*NaN values found in confusion matrix")
        yield


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["ConfusionMatrix", "CohenKappa", "MatthewsCorrCoef", "JaccardIndex"])
def test_parity_with_stock(name: str, path: str) -> None:
    """forward() per batch and compute(): identical values, dtypes and shapes, every task and ignore_index (stock's
    int64 shortcuts of MatthewsCorrCoef are float32: the documented deviation)."""
    parity(_cases(name), path=path, documented=_float_matthews if name == "MatthewsCorrCoef" else None)


def _float_matthews(value: Tensor) -> Tensor:
    """The patched MatthewsCorrCoef's value for stock's: always float32 (stock's shortcuts return int64)."""
    return value.float()


@pytest.mark.parametrize("path", PATHS)
def test_parity_deterministic_mode(path: str) -> None:
    """Upstream's fixed-shape mesh counting (deterministic mode) gives stock's matrices too."""
    torch.use_deterministic_algorithms(True)
    try:
        parity({k: v for k, v in _cases("ConfusionMatrix").items() if "None-" in k}, path=path)
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(("name", "task", "extra"), FAMILY, ids=[_label(*f, None) for f in FAMILY])
def test_update_and_forward_are_sync_free(syncfree: Any, name: str, task: str, extra: dict) -> None:
    """0 would-be syncs on the device path: update, then forward and compute."""
    ignore_index = IGNORE[task][-1]
    data = batches(task, ignore_index, seed=3)
    metric = _make(name, task, extra, ignore_index)
    with SyncProbe() as probe:
        for preds, target in data[:3]:
            metric.update(preds, target)
    assert probe.count == 0, probe.events
    with SyncProbe() as probe:
        for preds, target in data[3:]:
            metric(preds, target)
        metric.compute()
    assert probe.count == 0, probe.events


def test_stock_syncs_are_seen() -> None:
    """The probe sees stock's reads (so the zero above means something): validation, bincount, masks."""
    for name, task, extra in FAMILY:
        metric = _make(name, task, extra, IGNORE[task][-1])
        preds, target = batches(task, IGNORE[task][-1], seed=1)[0]
        with SyncProbe() as probe:
            metric.update(preds, target)
        assert probe.count > 0, (name, task)


INVALID = {
    "binary target": ("binary", torch.tensor([0.2, 0.7]), torch.tensor([0, 2])),
    "binary label preds": ("binary", torch.tensor([0, 3]), torch.tensor([0, 1])),
    "multiclass target": ("multiclass", torch.randn(2, NUM_CLASSES), torch.tensor([0, NUM_CLASSES + 3])),
    "multiclass negative label preds": ("multiclass", torch.tensor([0, -3]), torch.tensor([0, 1])),
    "multilabel target": ("multilabel", torch.rand(2, NUM_CLASSES), torch.full((2, NUM_CLASSES), 2)),
}


@pytest.mark.parametrize("name", ["ConfusionMatrix", "CohenKappa", "JaccardIndex"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stock_error_type_at_once_on_cpu(name: str, case: str) -> None:
    """Where stock raises, a ``RuntimeError`` too; where it does not (a negative label pred that ``target * C + preds``
    maps into another cell), the documented deviation: the patched metric raises."""
    task, preds, target = INVALID[case]
    if name == "CohenKappa" and task == "multilabel":
        pytest.skip("CohenKappa has no multilabel task")
    extra = {"average": "macro"} if name == "JaccardIndex" and task != "binary" else {}
    stock = _make(name, task, extra, None)
    if case == "multiclass negative label preds":
        stock.update(preds, target)
        assert int(stock.confmat[0].sum()) == 2  # stock: the entry of class 1 counted in class 0's row
    else:
        with pytest.raises(RuntimeError):
            stock.update(preds, target)
    with torchmetrics_syncfree.patched():
        metric = _make(name, task, extra, None)
        with pytest.raises(RuntimeError):
            metric.update(preds, target)
        assert int(metric.confmat.sum()) == 0  # raised before the state changed


@pytest.mark.parametrize("name", ["ConfusionMatrix", "CohenKappa", "JaccardIndex"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_batch_on_the_device_path_is_left_out_and_reported_once(syncfree: Any, name: str, case: str) -> None:
    """Kappa and Jaccard set ``validate_args`` after the confusion matrix's ``__init__``: they report all the same."""
    task, preds, target = INVALID[case]
    if name == "CohenKappa" and task == "multilabel":
        pytest.skip("CohenKappa has no multilabel task")
    extra = {"average": "macro"} if name == "JaccardIndex" and task != "binary" else {}
    good_preds, good_target = batches(task, None, seed=5)[0]
    metric, reference = _make(name, task, extra, None), _make(name, task, extra, None)
    reference.update(good_preds, good_target)
    with SyncProbe():
        metric.update(good_preds, good_target)
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.update(preds, target)  # reported at the end of this update: on a simulated device the copy arrived
    torch.testing.assert_close(metric.confmat, reference.confmat, rtol=0, atol=0)
    assert pending_checks(metric) == 0


def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3)
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
        metric.update(torch.tensor([0, 1]), torch.tensor([0, 7]))
        assert pending_checks(metric) == 1
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.compute()
    assert pending_checks(metric) == 0
    assert metric.compute().sum() == 2  # usable afterwards; the bad batch never entered the state


@pytest.mark.parametrize("path", PATHS)
def test_validate_args_false_drops_entries_that_are_no_cell(path: str) -> None:
    """Documented deviation: stock fails in bincount/reshape (CPU) or counts them in another label's cells."""
    cases = [
        (
            torchmetrics.ConfusionMatrix(task="binary", validate_args=False),
            torch.tensor([1, 1, 0]),
            torch.tensor([1, 2, -1]),
        ),
        (
            torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3, validate_args=False),
            torch.tensor([0, 5, 1]),
            torch.tensor([0, 1, -2]),
        ),
        (
            torchmetrics.ConfusionMatrix(task="multilabel", num_labels=2, validate_args=False),
            torch.tensor([[1, 1], [0, 1]]),
            torch.tensor([[1, 2], [0, 1]]),
        ),
    ]
    expected = [torch.tensor([[0, 0], [0, 1]]), torch.tensor([[1, 0, 0], [0, 0, 0], [0, 0, 0]]), None]
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else _nothing():
        results = []
        for metric, preds, target in cases:
            metric.update(preds, target)
            results.append(metric.compute())
    torch.testing.assert_close(results[0], expected[0])
    torch.testing.assert_close(results[1], expected[1])
    # multilabel: label 0 counts both entries; label 1 only the valid one (stock would put the 2 into a wrong cell)
    torch.testing.assert_close(results[2], torch.tensor([[[1, 0], [0, 1]], [[0, 0], [0, 1]]]))


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("path", PATHS)
def test_label_pred_equal_to_an_ignore_index_outside_the_classes_lands_in_no_cell(path: str) -> None:
    """Documented deviation: stock's ``target * C + preds`` puts it into the previous class's last cell."""
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else _nothing():
        metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3, ignore_index=-1)
        metric.update(torch.tensor([-1, 1, 2]), torch.tensor([1, 1, -1]))
        confmat = metric.compute()
    torch.testing.assert_close(confmat, torch.tensor([[0, 0, 0], [0, 1, 0], [0, 0, 0]]))


@pytest.mark.parametrize("path", PATHS)
def test_float_label_preds_outside_the_classes_land_in_no_cell_on_every_path(path: str) -> None:
    """Stock's validation checks only integer label preds; a float label outside the classes then wraps into another
    cell (``target * C + 7``: here the next row's third cell). Documented deviation, the same on every path: it lands
    in no cell, as with ``validate_args=False``."""
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else _nothing():
        metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=5)
        metric.update(torch.tensor([7.0, 1.0, 2.0]), torch.tensor([3, 1, 2]))
        confmat = metric.compute()
    torch.testing.assert_close(confmat, torch.diag(torch.tensor([0, 1, 1, 0, 0])))


def _absent_class_data() -> tuple[Tensor, Tensor]:
    return torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 0, 0])  # class 2 never occurs: its row is 0/0


def test_normalize_nan_warning_is_stocks_on_cpu(syncfree: Any) -> None:
    metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3, normalize="true")
    metric.update(*_absent_class_data())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = metric.compute()
    assert [str(w.message) for w in caught] == ["3 NaN values found in confusion matrix have been replaced with zeros."]
    assert not result.isnan().any()


@pytest.mark.parametrize("use_forward", [False, True])
def test_normalize_nan_warning_on_the_device_path_is_reported_once_at_the_next_eager_point(
    syncfree: Any, use_forward: bool
) -> None:
    metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3, normalize="true")
    data = _absent_class_data()
    with warnings.catch_warnings(record=True) as caught, SyncProbe() as probe:
        warnings.simplefilter("always")
        if use_forward:
            metric(*data)  # the batch's compute finds the NaN; forward reports at its end
        else:
            metric.update(*data)
            metric.compute()  # finds the NaN, reads nothing
            metric.update(*data)  # reports it (the simulated copy has arrived)
        metric.reset()
    messages = [str(w.message) for w in caught if "NaN values" in str(w.message)]
    assert messages == ["NaN values found in confusion matrix have been replaced with zeros."]
    assert probe.count == 0, probe.events


def test_metric_created_before_patching_reports_too() -> None:
    metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3)
    with torchmetrics_syncfree.patched(), SyncProbe():
        metric.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
        with pytest.raises(RuntimeError):
            metric.update(torch.tensor([0, 1]), torch.tensor([0, 9]))
            metric.compute()
        assert int(metric.confmat.sum()) == 2


@pytest.mark.parametrize("task", ["binary", "multiclass", "multilabel"])
@pytest.mark.compile
def test_update_traces_without_a_graph_break(task: str) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = _make("ConfusionMatrix", task, {}, IGNORE[task][-1])
        preds, target = batches(task, IGNORE[task][-1], seed=2)[0]
        explanation = torch._dynamo.explain(lambda p, t: metric.update(p, t))(preds, target)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


# --------------------------------------------------------------------------------------------------------------------
# the check counters through a metric's life (device path, a copy that never arrives before an eager point)


def _with_pending_error() -> Any:
    metric = torchmetrics.JaccardIndex(task="multiclass", num_classes=3)  # validate_args set after the base __init__
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
        metric.update(torch.tensor([0, 1]), torch.tensor([0, 7]))
    assert pending_checks(metric) == 1
    return metric


@pytest.mark.parametrize("duplicate", ["deepcopy", "clone", "pickle"])
def test_copies_carry_the_pending_error(syncfree: Any, duplicate: str) -> None:
    import copy
    import pickle

    metric = _with_pending_error()
    twin = {
        "deepcopy": copy.deepcopy,
        "clone": lambda m: m.clone(),
        "pickle": lambda m: pickle.loads(pickle.dumps(m)),
    }[duplicate](metric)
    with _instrumentation.simulated_copy_delay(None), SyncProbe(), pytest.raises(RuntimeError, match="not valid"):
        twin.compute()


def test_reset_reports_the_pending_error_and_the_next_epoch_starts_clean(syncfree: Any) -> None:
    metric = _with_pending_error()
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        with pytest.raises(RuntimeError, match="not valid"):
            metric.reset()
        metric.update(torch.tensor([2, 1]), torch.tensor([2, 1]))
        torch.testing.assert_close(metric.compute(), torch.tensor(1.0))  # only the new epoch counts: all correct
    assert int(metric.confmat.sum()) == 2


def test_every_compute_group_member_reports_the_error(syncfree: Any) -> None:
    collection = torchmetrics.MetricCollection(
        {
            "confmat": torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3),
            "jaccard": torchmetrics.JaccardIndex(task="multiclass", num_classes=3),
            "kappa": torchmetrics.CohenKappa(task="multiclass", num_classes=3),
        },
        compute_groups=True,
    )
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        collection.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
        collection.update(torch.tensor([0, 1]), torch.tensor([0, 7]))
        assert len(collection.compute_groups) == 1
        for name in ("confmat", "jaccard", "kappa"):
            with pytest.raises(RuntimeError, match="not valid"):
                collection[name].compute()
            collection[name].reset()


def test_an_error_in_forward_keeps_the_accumulated_state(syncfree: Any) -> None:
    metric = torchmetrics.ConfusionMatrix(task="multiclass", num_classes=3)
    with SyncProbe():  # the simulated copy arrives: forward reports at its end
        metric(torch.tensor([0, 1]), torch.tensor([0, 1]))
        with pytest.raises(RuntimeError, match="not valid"):
            metric(torch.tensor([0, 1]), torch.tensor([0, 7]))
        assert int(metric.compute().sum()) == 2


def _matthews_matrices() -> list[Tensor]:
    """Every branch of stock's reduction: all 2x2 matrices with cells in {0, 1, 3, 7} (perfect, inverted, each zero
    denominator case), multiclass matrices with empty rows and columns, and counts past float32's exact integers."""
    gen = torch.Generator().manual_seed(7)
    binary = [torch.tensor(cells).view(2, 2) for cells in itertools.product([0, 1, 3, 7], repeat=4)]
    sparse = [
        torch.randint(0, 4, (n, n), generator=gen) * (torch.rand(n, n, generator=gen) < 0.3)
        for n in (3, NUM_CLASSES)
        for _ in range(40)
    ]
    large = [torch.randint(0, 10**8, (n, n), generator=gen) for n in (2, 5) for _ in range(20)]
    return binary + sparse + [torch.zeros(3, 3, dtype=torch.long), torch.eye(3, dtype=torch.long)] + large


@pytest.mark.parametrize("path", PATHS)
def test_matthews_reduction_gives_stocks_value_in_every_branch(path: str) -> None:
    """Stock's value for every matrix, always as float32 (the documented deviation: stock returns its int64 shortcuts
    ``tensor(1)``/``tensor(-1)``, on 1.6 also ``tensor(0)``), with no would-be sync on the device path."""
    module = importlib.import_module("torchmetrics.functional.classification.matthews_corrcoef")
    matrices = _matthews_matrices()
    stock = [module._matthews_corrcoef_reduce(confmat) for confmat in matrices]
    assert {value.dtype for value in stock} == {torch.float32, torch.int64}  # the shortcuts are among the cases
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
        patched = [module._matthews_corrcoef_reduce(confmat) for confmat in matrices]
    assert probe is None or probe.count == 0, probe.events
    for confmat, s, p in zip(matrices, stock, patched):
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, s.float(), rtol=0, atol=0, msg=lambda m, c=confmat: f"{c.tolist()}: {m}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("task", ["binary", "multilabel"])
def test_matthews_perfect_and_inverted_predictions_are_float(path: str, task: str) -> None:
    """The deviation as users meet it: stock's coefficient of perfect (inverted) predictions is ``tensor(1)``
    (``tensor(-1)``) of dtype int64, unlike every other value of the metric; the patched one is float32."""
    target = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 1]])
    if task == "binary":
        target = target[0]
    kwargs = {"num_labels": 4} if task == "multilabel" else {}
    for preds, expected in ((target, 1.0), (1 - target, -1.0)):
        stock = torchmetrics.MatthewsCorrCoef(task=task, **kwargs)(preds, target)
        assert (stock.dtype, float(stock)) == (torch.int64, expected)
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            patched = torchmetrics.MatthewsCorrCoef(task=task, **kwargs)(preds, target)
        assert (patched.dtype, float(patched)) == (torch.float32, expected)


# ----------------------------------------------------------------------------------------------- scale


@pytest.mark.parametrize("path", PATHS_WITH_FLIGHT)
@pytest.mark.parametrize(
    ("scores", "ignore_index", "validate_args"),
    [(True, None, True), (False, None, True), (True, 3, True), (False, -1, True), (False, None, False)],
)
@pytest.mark.parametrize("name", ["ConfusionMatrix", "CohenKappa", "MatthewsCorrCoef", "JaccardIndex"])
def test_a_multiclass_update_counts_into_its_state_without_a_matrix_per_update(
    name: str, scores: bool, ignore_index: int | None, validate_args: bool, path: str, syncfree: Any
) -> None:
    """Stock's update counts a fresh ``C x C`` matrix (``bincount``) and adds it to the state: at 2000 classes 32 MB
    per update, 800 MB at 10000. The patched one counts into the state itself: a few bytes per entry. Its counts are
    the entries counted one by one, on every path, ignored entries left out."""
    num_classes, batch = 2000, 256
    generator = torch.Generator().manual_seed(7)
    target = torch.randint(num_classes, (batch,), generator=generator)
    if ignore_index is not None:
        target[::5] = ignore_index
    preds = torch.randn(batch, num_classes, generator=generator) if scores else torch.randint(num_classes, (batch,))
    expected = torch.zeros(num_classes, num_classes, dtype=torch.long)
    labels = preds.argmax(1) if scores else preds
    for label, truth in zip(labels.tolist(), target.tolist()):
        if truth != ignore_index:
            expected[truth, label] += 1
    metric = getattr(torchmetrics, name)(
        task="multiclass", num_classes=num_classes, ignore_index=ignore_index, validate_args=validate_args
    )
    with on_path(path):
        metric.update(preds, target)  # the first update makes what is made once (cached constants)
        allocated = allocated_by(lambda: metric.update(preds, target))
        assert torch.equal(metric.confmat, 2 * expected)
        if path != "cpu":
            with SyncProbe() as probe:
                metric.update(preds, target)
            assert probe.count == 0, probe.events
    assert allocated < 64 * batch + 1024, allocated  # a handful of int64 per entry; the matrix is 32 MB
