"""Patched vs stock classification metrics: identical forward() and compute() values, and invalid inputs rejected."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torchmetrics
from torch import Tensor

import torchmetrics_syncfree
from tests._classification_cases import (
    ABSENT,
    DEVICES,
    METRICS,
    NUM_CLASSES,
    PATHS,
    Case,
    assert_identical,
    batches,
    config_id,
    configs,
    make_metric,
    parity,
    pending_checks,
)
from torchmetrics_syncfree import SyncProbe, _instrumentation


def _default_case(config: tuple) -> Case:
    name, task, average, ignore_index = config
    data = batches(task, ignore_index, seed=sum(map(ord, config_id(config))))
    return (lambda: make_metric(name, task, average, ignore_index)), data


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", METRICS)
def test_parity_default_arguments(name: str, path: str, device: str) -> None:
    """Every task x average x ignore_index of one metric (including all-ignored batches and zero division)."""
    if device == "cuda" and path == "device":
        pytest.skip("on CUDA the device path is the only path")
    parity({config_id(config): _default_case(config) for config in configs((name,))}, device, path)


def test_parity_data_has_zero_division() -> None:
    """The batches leave classes ABSENT.. unused, so per-class scores divide 0 by 0 (a test that can fail)."""
    metric = make_metric("Precision", "multiclass", "none")
    for preds, target in batches("multiclass", None, seed=0):
        metric.update(preds, target)
    tp, fp = metric.tp, metric.fp
    assert (tp[ABSENT:] + fp[ABSENT:] == 0).all() and (tp[:ABSENT] + fp[:ABSENT] > 0).all()


_MULTICLASS_OTHER = (
    {"top_k": 2},
    {"top_k": 2, "ignore_index": -1},
    {"top_k": 2, "ignore_index": 1},
    {"multidim_average": "samplewise"},
    {"multidim_average": "samplewise", "ignore_index": -1},
    {"multidim_average": "samplewise", "ignore_index": 1},
    {"zero_division": 1},
)


def _multiclass_other_case(name: str, average: str, kwargs: dict) -> Case:
    samplewise = kwargs.get("multidim_average") == "samplewise"
    data = [
        (p, t) for p, t in batches("multiclass", kwargs.get("ignore_index"), seed=7) if t.ndim == 2 or not samplewise
    ]
    if kwargs.get("top_k", 1) > 1:
        data = [(p, t) for p, t in data if p.is_floating_point() and t.ndim == 1]  # 1.6 top_k>1 needs (N, C)
    return (lambda: make_metric(name, "multiclass", average, **kwargs)), data


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["Accuracy", "Precision", "F1Score", "StatScores"])
def test_parity_multiclass_other_arguments(name: str, path: str) -> None:
    """top_k=2, samplewise and zero_division=1, with and without ignore_index."""
    parity(
        {
            f"{average}-{kwargs}": _multiclass_other_case(name, average, kwargs)
            for average in ("micro", "macro", "none")
            for kwargs in _MULTICLASS_OTHER
            if not ("zero_division" in kwargs and name in ("Accuracy", "StatScores"))
        },
        path=path,
    )


@pytest.mark.parametrize("path", PATHS)
def test_parity_binary_multilabel_other_arguments(path: str) -> None:
    cases = {}
    for task in ("binary", "multilabel"):
        ndim = 2 if task == "binary" else 3
        for kwargs in ({"multidim_average": "samplewise"}, {"zero_division": 1}, {"threshold": 0.3}):
            data = [(p, t) for p, t in batches(task, -1, seed=3) if t.ndim == ndim or "multidim_average" not in kwargs]
            cases[f"{task}-{kwargs}"] = (
                (lambda task=task, kwargs=kwargs: make_metric("Recall", task, "macro", -1, **kwargs)),
                data,
            )
    parity(cases, path=path)


@pytest.mark.parametrize("path", PATHS)
def test_parity_deterministic_mode(path: str) -> None:
    """Deterministic algorithms: upstream's mesh counting, same results."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        data = batches("multiclass", -1, seed=11)
        parity({"weighted": ((lambda: make_metric("F1Score", "multiclass", "weighted", -1)), data)}, path=path)
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("ignore_index", [None, -1, 1])
def test_parity_on_devices_without_put(monkeypatch: pytest.MonkeyPatch, path: str, ignore_index: int | None) -> None:
    """XLA and MPS (no ``put_``): a validated update counts with the confusion bins, its labels read or not."""
    import torchmetrics_syncfree.classification.stat_scores as stat_scores

    monkeypatch.setattr(stat_scores, "_XLA", True)
    data = batches("multiclass", ignore_index, seed=13)
    make = lambda: make_metric("Precision", "multiclass", "macro", ignore_index)  # noqa: E731
    parity({f"macro-{ignore_index}": (make, data)}, path=path)


def test_functional_api_parity() -> None:
    from torchmetrics.functional.classification import multiclass_f1_score, multilabel_precision

    preds, target = batches("multiclass", -1, seed=5)[1]
    stock = multiclass_f1_score(preds, target, NUM_CLASSES, average="macro", ignore_index=-1)
    with torchmetrics_syncfree.patched():
        patched = multiclass_f1_score(preds, target, NUM_CLASSES, average="macro", ignore_index=-1)
    assert_identical([stock], [patched])
    preds, target = batches("multilabel", None, seed=5)[0]
    stock = multilabel_precision(preds, target, NUM_CLASSES, average="none")
    with torchmetrics_syncfree.patched():
        patched = multilabel_precision(preds, target, NUM_CLASSES, average="none")
    assert_identical([stock], [patched])


# ---------------------------------------------------------------------------------------------------------------------
# invalid inputs

_INVALID = {
    "binary": (torch.tensor([0.2, 0.7, 0.9, 0.1]), torch.tensor([0, 1, 2, 1]), "`target`"),
    "binary-label-preds": (torch.tensor([0, 1, 3, 1]), torch.tensor([0, 1, 1, 1]), "`preds`"),
    "multilabel": (torch.rand(2, NUM_CLASSES), torch.tensor([[0, 1, 3, 0, 0, 1], [1, 0, 0, 0, 1, 1]]), "`target`"),
    "multiclass": (torch.randn(4, NUM_CLASSES), torch.tensor([0, NUM_CLASSES, 2, 1]), "`target`"),
    "multiclass-negative": (torch.randn(4, NUM_CLASSES), torch.tensor([0, -3, 2, 1]), "`target`"),
    "multiclass-label-preds": (
        torch.arange(NUM_CLASSES + 1),
        torch.zeros(NUM_CLASSES + 1, dtype=torch.long),
        "`preds`",
    ),
}


def _invalid_metric(case: str) -> Any:
    return make_metric("Accuracy", case.split("-")[0], "macro")


def _stock_error(case: str) -> BaseException:
    """What stock raises for the case (called unpatched)."""
    preds, target, _ = _INVALID[case]
    with pytest.raises(Exception) as info:
        _invalid_metric(case).update(preds, target)
    return info.value


@pytest.mark.parametrize("case", list(_INVALID))
def test_invalid_input_raises_stock_error_type(case: str) -> None:
    """CPU: at once in update(), naming the values. Device path (a CPU probe): update() reads nothing on the host; the
    count is reported at the end of the update once its copy has arrived, else by compute(); forward() at its end."""
    preds, target, names = _INVALID[case]
    expected = type(_stock_error(case))
    with torchmetrics_syncfree.patched():
        with pytest.raises(expected, match=names):
            _invalid_metric(case).update(preds, target)
        metric = _invalid_metric(case)
        with _instrumentation.simulated_copy_delay(None), SyncProbe() as probe:
            metric.update(preds, target)
        assert probe.count == 0, probe.summary()
        with pytest.raises(expected, match=names):
            metric.compute()
        with SyncProbe(), pytest.raises(expected, match=names):
            _invalid_metric(case).update(preds, target)
        with SyncProbe(), pytest.raises(expected, match=names):
            _invalid_metric(case)(preds, target)


@pytest.mark.parametrize("use_forward", [False, True], ids=["update", "forward"])
def test_invalid_batch_on_device_is_left_out_and_reported_once(syncfree: Any, use_forward: bool) -> None:
    """A GPU one step behind: the error surfaces at the end of the next call, after that call's own (valid) batch
    has been counted; the invalid batch never enters the state, and is reported once."""
    preds, target, _ = _INVALID["binary"]
    valid_target = target.clamp(max=1)
    metric = _invalid_metric("binary")
    reference = _invalid_metric("binary")
    call = metric if use_forward else metric.update
    with _instrumentation.simulated_copy_delay(1), SyncProbe():
        call(preds, target)
        with pytest.raises(RuntimeError, match="`target`"):
            call(preds, valid_target)
        call(preds, valid_target)
    assert pending_checks(metric) == 0
    reference.update(preds, valid_target)
    reference.update(preds, valid_target)
    assert_identical([metric.compute()], [reference.compute()])


def test_invalid_multiclass_message_is_stock_where_stock_raises() -> None:
    preds, target, _ = _INVALID["multiclass-label-preds"]
    stock = _stock_error("multiclass-label-preds")
    with torchmetrics_syncfree.patched(), pytest.raises(RuntimeError) as patched:
        _invalid_metric("multiclass").update(preds, target)
    assert str(patched.value) == str(stock)


def test_validate_args_false_drops_out_of_range_labels(syncfree: Any) -> None:
    """Deviation: stock fails in reshape (or miscounts); patched counts only the valid entries."""
    preds = torch.tensor([0, 1, 2, 2])
    target = torch.tensor([0, NUM_CLASSES + 3, 2, 1])
    metric = make_metric("StatScores", "multiclass", "none", validate_args=False)
    metric.update(preds, target)
    reference = make_metric("StatScores", "multiclass", "none")
    reference.update(preds[[0, 2, 3]], target[[0, 2, 3]])
    torch.testing.assert_close(metric.compute(), reference.compute())


def test_functional_validation_is_stock(syncfree: Any) -> None:
    """Without a metric there is no later point to report at: the functional API validates like stock, at once."""
    from torchmetrics.functional.classification import binary_accuracy, multiclass_stat_scores

    preds, target, _ = _INVALID["multiclass-label-preds"]
    with pytest.raises(RuntimeError, match="Detected more unique values in `preds`"):
        multiclass_stat_scores(preds, target, num_classes=NUM_CLASSES)
    preds, target, _ = _INVALID["binary"]
    with pytest.raises(RuntimeError, match="Detected the following values in `target`"):
        binary_accuracy(preds, target)


@pytest.mark.parametrize("ignore_index", [-1, -100, NUM_CLASSES, 255, 2])
@pytest.mark.parametrize("path", PATHS)
def test_multiclass_ignore_index_outside_the_classes_is_allowed_and_checked(path: str, ignore_index: int) -> None:
    """Ignored entries pass validation, any other non-class label is caught (the CPU path's one-aminmax shortcuts
    for -1 and num_classes, the masked check for other values), label preds included."""
    preds = torch.randn(4, NUM_CLASSES)
    valid = torch.tensor([0, ignore_index, 2, ignore_index])
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        for bad in (-2, NUM_CLASSES + 1, -101, 254):
            if bad == ignore_index or 0 <= bad < NUM_CLASSES:
                continue
            metric = make_metric("Recall", "multiclass", "macro", ignore_index)
            metric.update(preds, valid)
            metric.update(valid.clamp(0, NUM_CLASSES - 1), valid)  # label preds
            metric.compute()
            with pytest.raises(RuntimeError, match="`target`"):  # CPU path: in update; device path: in compute
                metric.update(preds, torch.tensor([0, ignore_index, 2, bad]))
                metric.compute()
            metric = make_metric("Recall", "multiclass", "macro", ignore_index)
            with pytest.raises(RuntimeError, match="`preds`"):
                metric.update(torch.tensor([0, 1, bad, 1]), valid.clamp(0, NUM_CLASSES - 1))
                metric.compute()


@pytest.mark.parametrize("deterministic", [False, True], ids=["bincount", "mesh"])
@pytest.mark.parametrize("case", ["multiclass", "multiclass-negative"])
def test_invalid_multiclass_target_with_scores_raises_before_counting(case: str, deterministic: bool) -> None:
    """CPU path: with score preds the target check is left to the bincount (free), except where upstream counts with
    a mesh, which would drop bad entries silently. Either way: stock's error type, and the state is untouched."""
    preds, target, names = _INVALID[case]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with torchmetrics_syncfree.patched():
            metric = _invalid_metric(case)
            with pytest.raises(RuntimeError, match=names):
                metric.update(preds, target)
            assert int(metric.tp.sum() + metric.fp.sum() + metric.tn.sum() + metric.fn.sum()) == 0
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("zero_division", [0.0, 1, "nan", None])
def test_safe_divide_matches_stock(zero_division: Any) -> None:
    """Every zero_division stock accepts (None: a plain division, as in stock 1.7+); "warn" is tested with the probe."""
    from torchmetrics.utilities import compute

    num, denom = torch.tensor([1.0, 0.0, 2.0, 3.0]), torch.tensor([0.0, 0.0, 4.0, 1.0])
    try:
        stock = compute._safe_divide(num, denom, zero_division)
    except (TypeError, RuntimeError):
        pytest.skip("this torchmetrics version's stock rejects it (1.6 copies zero_division with torch.tensor)")
    with torchmetrics_syncfree.patched():
        patched = compute._safe_divide(num, denom, zero_division)
    assert_identical([stock], [patched])


def _outcome(make: Callable[[], Any], preds: Tensor, target: Tensor, patched: bool, path: str = "cpu") -> Any:
    """compute() after one update, or the type of the error raised by the update or compute()."""
    patching = torchmetrics_syncfree.patched() if patched else contextlib.nullcontext()
    with patching, SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = make()
        try:
            metric.update(preds, target)
            return metric.compute()
        except (RuntimeError, ValueError) as err:
            return type(err)


def _same_outcome(got: Any, want: Any) -> bool:
    if isinstance(want, type) or isinstance(got, type):
        return got is want
    return torch.equal(got, want) or bool(torch.isnan(got).all() and torch.isnan(want).all())


_LABEL_PREDS_AT_IGNORE_INDEX = {
    "target-keeps-the-class": ([-1, 1, 2], [1, 1, 2]),
    "target-differs": ([-1, 1, 2], [0, 1, 2]),
    "both-ignored": ([-1, 1, 2], [-1, 1, 2]),
    "all-preds-ignored": ([-1, -1, -1], [0, 1, 2]),
}


@pytest.mark.parametrize("validate_args", [True, False], ids=["validated", "not-validated"])
@pytest.mark.parametrize("average", ["micro", "macro", "none"])
@pytest.mark.parametrize("case", list(_LABEL_PREDS_AT_IGNORE_INDEX))
def test_label_preds_equal_to_ignore_index_are_misses_on_both_paths(
    case: str, average: str, validate_args: bool
) -> None:
    """Stock ignores entries by their target only, so a label pred equal to an ignore_index outside the classes
    predicts no class: a miss of the target's class. Stock's micro counts it so; its confusion matrix (macro, none)
    wraps ``target * C + preds`` into another class's cell or fails on a negative index: a deviation
    (docs/classification.md). Both patched paths give the same outcome, and the micro one is stock's."""
    preds, target = (torch.tensor(labels) for labels in _LABEL_PREDS_AT_IGNORE_INDEX[case])

    def make(ignore_index: int | None = -1) -> Any:
        return make_metric("StatScores", "multiclass", average, ignore_index=ignore_index, validate_args=validate_args)

    cpu_path = _outcome(make, preds, target, patched=True, path="cpu")
    device_path = _outcome(make, preds, target, patched=True, path="device")
    assert _same_outcome(cpu_path, device_path), (cpu_path, device_path)
    if average == "micro":
        assert _same_outcome(cpu_path, _outcome(make, preds, target, patched=False))
    if average == "none":
        # the miss spelled out: with one class more for "no class", stock's counts of the real classes are ours
        kept = target != -1
        reference = torchmetrics.classification.MulticlassStatScores(NUM_CLASSES + 1, average="none")
        reference.update(preds[kept].masked_fill(preds[kept] == -1, NUM_CLASSES), target[kept])
        assert_identical([cpu_path], [reference.compute()[:NUM_CLASSES]])


@pytest.mark.parametrize("validate_args", [True, False], ids=["validated", "not-validated"])
@pytest.mark.parametrize("average", ["micro", "macro"])
def test_float_target_holding_nan_is_no_class_on_both_paths(average: str, validate_args: bool) -> None:
    """NaN is no class label: validation rejects it on both paths, as any label outside ``[0, num_classes)``
    (deviation: stock counts it as a miss in micro averaging, wraps it into some cell in its confusion matrix; the
    CPU path used to fail on ``int(nan)`` with a ValueError). Unvalidated, the paths agree, and micro is stock's."""
    preds, target = torch.tensor([0, 1, 2, 3]), torch.tensor([0.0, float("nan"), 2.0, 1.0])

    def make() -> Any:
        return make_metric("Accuracy", "multiclass", average, validate_args=validate_args)

    cpu_path = _outcome(make, preds, target, patched=True, path="cpu")
    device_path = _outcome(make, preds, target, patched=True, path="device")
    assert _same_outcome(cpu_path, device_path), (cpu_path, device_path)
    if validate_args:
        assert cpu_path is RuntimeError
    elif average == "micro":
        assert _same_outcome(cpu_path, _outcome(make, preds, target, patched=False))


@pytest.mark.parametrize("preds_kind", ["labels", "scores"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("average", ["micro", "macro"])
def test_labels_too_large_for_the_confusion_index_raise_on_both_paths(path: str, average: str, preds_kind: str) -> None:
    """Deviation: stock validates no label range; with 4 classes a target of 2**62 wraps ``target * 4 + preds`` to
    class 0 in its confusion index (macro: 0.25) or counts as a miss (micro). Both patched paths reject it, like every
    other label outside the classes (docs/classification.md), for label preds and for scores (the device path's
    lean counting: the target is clamped before it is multiplied)."""
    preds, target = torch.tensor([0, 1]), torch.tensor([0, 2**62])
    if preds_kind == "scores":
        preds = torch.nn.functional.one_hot(preds, 4).float()

    def make() -> Any:
        return torchmetrics.classification.MulticlassAccuracy(4, average=average)

    assert not isinstance(_outcome(make, preds, target, patched=False), type)  # stock returns a (wrong) value
    assert _outcome(make, preds, target, patched=True, path=path) is RuntimeError
