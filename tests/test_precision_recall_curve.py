"""The PR-curve family's update (PrecisionRecallCurve, ROC, AUROC, AveragePrecision: every task): stock's states and
values on both patched paths, sync-free update on the device path (and forward/compute where stock's compute is), the
validation reported as stock's, compile without graph breaks."""

from __future__ import annotations

import contextlib
import copy
import pickle
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

import torchmetrics_syncfree
from tests._classification_cases import NUM_CLASSES, PATHS, Case, Combining, parity, pending_checks
from tests._probing import graph_breaks, syncs_are_errors
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.classification import precision_recall_curve

#: thresholds settings: binned with a count, an unsorted list (with a duplicate) and a tensor; and unbinned
THRESHOLDS: dict[str, Any] = {
    "5": 5,
    "list": [0.9, 0.1, 0.5, 0.5, 0.3],
    "tensor": torch.tensor([0.0, 0.25, 0.75, 1.0]),
    "None": None,
}
IGNORE = {"binary": (None, -1), "multiclass": (None, -1, 1), "multilabel": (None, -1)}
NAMES = ("PrecisionRecallCurve", "ROC", "AUROC", "AveragePrecision")


def _make(name: str, task: str, thresholds: Any, ignore_index: int | None, **kwargs: Any) -> Any:
    size = {"multiclass": {"num_classes": NUM_CLASSES}, "multilabel": {"num_labels": NUM_CLASSES}}.get(task, {})
    if isinstance(thresholds, Tensor):
        thresholds = thresholds.clone()
    return getattr(torchmetrics, name)(task=task, thresholds=thresholds, ignore_index=ignore_index, **size, **kwargs)


def _batches(task: str, ignore_index: int | None, seed: int, n: int = 16) -> list[tuple[Tensor, Tensor]]:
    """Probabilities, logits, float64 scores, extra dimensions, scores equal to thresholds, logits with a NaN score
    (logits: stock's CPU and accelerator tests for logits agree only when some score is outside [0, 1]), and (with
    ``ignore_index``) a quarter of the targets ignored."""
    gen = torch.Generator().manual_seed(seed)
    shape = {"binary": (n,), "multiclass": (n, NUM_CLASSES), "multilabel": (n, NUM_CLASSES)}[task]
    out = []
    for i in range(6):
        extra = (3,) if i == 3 else ()
        logits = torch.randn((*shape, *extra), generator=gen) * 2
        if task == "multiclass":
            preds = logits.softmax(1) if i not in (1, 5) else logits
            target = torch.randint(0, NUM_CLASSES - 1, (n, *extra), generator=gen)  # the last class never occurs
        else:
            preds = logits.sigmoid() if i not in (1, 5) else logits
            target = torch.randint(0, 2, preds.shape, generator=gen)
        if i == 2:
            preds = preds.double()
        if i == 4:
            preds = torch.round(preds * 4) / 4  # ties with the thresholds
        if i == 5 and task != "multiclass":
            preds.view(-1)[0] = torch.nan
        if ignore_index is not None:
            target = target.masked_fill(torch.rand(target.shape, generator=gen) < 0.25, ignore_index)
        out.append((preds, target))
    return out


def _cases(name: str, thresholds_keys: tuple[str, ...]) -> dict[str, Case]:
    cases = {}
    for task, ignores in IGNORE.items():
        for key in thresholds_keys:
            for ignore_index in ignores:
                label = f"{name}-{task}-thresholds={key}-ignore={ignore_index}"
                data = _batches(task, ignore_index, seed=sum(map(ord, label)))
                if key == "None" or (name != "PrecisionRecallCurve" and task != "binary"):
                    data = [(p, t) for p, t in data if not torch.isnan(p).any()]  # stock's compute reads NaN as is
                cases[label] = (lambda t=task, k=key, i=ignore_index: _make(name, t, THRESHOLDS[k], i)), data
    return cases


def _flat(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    return [tensor for item in value for tensor in _flat(item)]


@pytest.mark.parametrize("path", PATHS)
def test_binned_state_is_stocks(path: str) -> None:
    """The (T, ..., 2, 2) counts after every update are stock's, for every task, thresholds setting (unsorted and
    duplicate thresholds, ties, NaN scores, float64/float16) and ignore_index."""
    for task, ignores in IGNORE.items():
        for key in ("5", "list", "tensor"):
            for ignore_index in ignores:
                data = _batches(task, ignore_index, seed=len(key) + 7)
                stock = _make("PrecisionRecallCurve", task, THRESHOLDS[key], ignore_index)
                for preds, target in data:
                    stock.update(preds, target)
                with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
                    patched = _make("PrecisionRecallCurve", task, THRESHOLDS[key], ignore_index)
                    for preds, target in data:
                        patched.update(preds, target)
                torch.testing.assert_close(patched.confmat, stock.confmat, rtol=0, atol=0, msg=f"{task} {key}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("task", ["binary", "multilabel"])
def test_float_targets_without_validation_count_as_stocks_truncated_labels(path: str, task: str) -> None:
    """With ``validate_args=False`` stock counts float targets as ``target.long()`` (0.5 is a negative): so does the
    patched count (it failed on the float index)."""
    target = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 1.5])
    preds = torch.linspace(0, 1, 8)
    if task == "multilabel":
        preds, target = preds.view(4, 2), target.view(4, 2)
    size = {"num_labels": 2} if task == "multilabel" else {}
    stock = torchmetrics.classification.PrecisionRecallCurve(task=task, thresholds=5, validate_args=False, **size)
    stock.update(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
        patched = torchmetrics.classification.PrecisionRecallCurve(task=task, thresholds=5, validate_args=False, **size)
        patched.update(preds, target)
    assert torch.equal(patched.confmat, stock.confmat)
    if path == "device":  # the update reads nothing
        assert probe.count == 0, probe.events


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "name",
    # the subclasses add stock's computes to the same update (whose states test_binned_state_is_stocks checks on every
    # version): on the newest release only, to keep the older envs quick
    [NAMES[0], *(pytest.param(name, marks=pytest.mark.slow) for name in NAMES[1:])],
)
def test_parity_with_stock(name: str, path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes (curves: every tensor of the tuples)."""
    cases = _cases(name, tuple(THRESHOLDS))
    wrapped = {label: ((lambda make=make: _flattening(make())), data) for label, (make, data) in cases.items()}

    # AUROC's and AveragePrecision's computes sum in another order on every device (tests/test_curve_computes.py);
    # the unbinned update applies the sigmoid before it leaves out ignored entries (on every device), and on CPU a
    # vectorized sigmoid differs in the last bit between an element's positions (on a GPU the same element gives the
    # same value)
    def rtol(label: str) -> float:
        summed = name in ("AUROC", "AveragePrecision")
        sigmoid_first = "thresholds=None" in label and "ignore=None" not in label
        return 1e-6 if summed or sigmoid_first else 0.0

    parity(wrapped, path=path, rtol=rtol)


@pytest.mark.parametrize("path", PATHS)
def test_multiclass_micro_curves_match_stock(path: str) -> None:
    """Multiclass ``average="micro"`` flattens one-hot targets into the list state, its ignored rows kept (every
    compute leaves them out; the softmax over the whole batch may differ in the last bit). Unbinned only: stock's
    binned micro state fails to add up (its ``confmat`` is allocated per class)."""
    cases = {}
    for name in ("PrecisionRecallCurve", "ROC"):
        for key in ("None",):
            for ignore_index in IGNORE["multiclass"]:
                label = f"{name}-micro-thresholds={key}-ignore={ignore_index}"
                data = _batches("multiclass", ignore_index, seed=sum(map(ord, label)))
                if ignore_index is not None:
                    # probabilities, but scores outside [0, 1] in ignored rows: stock decides logits on the kept rows
                    preds, target = data[0]
                    data.append((preds.masked_fill((target == ignore_index).unsqueeze(1), 5.0), target))

                def make(name: str = name, key: str = key, ignore_index: int | None = ignore_index) -> Any:
                    return _flattening(_make(name, "multiclass", THRESHOLDS[key], ignore_index, average="micro"))

                cases[label] = make, data
    parity(cases, path=path, rtol=lambda label: 1e-6 if "thresholds=None" in label else 0.0)


@pytest.mark.parametrize("name", ["PrecisionRecallCurve", "ROC"])
@pytest.mark.parametrize("ignore_index", IGNORE["multiclass"])
def test_multiclass_micro_unbinned_update_is_sync_free(name: str, ignore_index: int | None) -> None:
    """Stock's micro update one-hot encodes with ``one_hot`` (2 reads of the target range) after its ``ignore_index``
    mask (2 data-dependent shapes); the device path compares with every class and keeps the ignored rows. (Binned
    micro is broken in stock itself: its ``confmat`` is allocated per class, so its compute fails.)"""
    data = _batches("multiclass", ignore_index, seed=4)
    stock = _make(name, "multiclass", None, ignore_index, average="micro")
    with SyncProbe() as stock_probe:
        stock.update(*data[0])
    assert stock_probe.count > 0  # the probe sees what this test is about
    with torchmetrics_syncfree.patched(), SyncProbe() as probe:
        metric = _make(name, "multiclass", None, ignore_index, average="micro")
        for preds, target in data:
            metric.update(preds, target)
    assert probe.count == 0, probe.events


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
@pytest.mark.parametrize("ignore_index", IGNORE["multiclass"])
def test_multiclass_micro_unbinned_update_never_syncs_on_cuda_and_matches_stock(ignore_index: int | None) -> None:
    data = _batches("multiclass", ignore_index, seed=9)
    stock = _make("ROC", "multiclass", None, ignore_index, average="micro")
    for preds, target in data:
        stock.update(preds, target)
    with torchmetrics_syncfree.patched():
        metric = _make("ROC", "multiclass", None, ignore_index, average="micro").cuda()
        with syncs_are_errors():
            for preds, target in data:
                metric.update(preds.cuda(), target.cuda())
        for value, reference in zip(_flat(metric.compute()), _flat(stock.compute())):
            torch.testing.assert_close(value.cpu(), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_multiclass_micro_update_raises_stocks_error_for_targets_that_are_not_int64(path: str) -> None:
    """Stock's ``one_hot`` takes int64 targets only (its first check: the dtype, no read); so does the device path."""
    preds, target = _batches("multiclass", None, seed=6)[0]
    with pytest.raises(RuntimeError) as stock_error:
        _make("ROC", "multiclass", None, None, average="micro").update(preds, target.int())
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = _make("ROC", "multiclass", None, None, average="micro")
        with pytest.raises(RuntimeError) as patched_error:
            metric.update(preds, target.int())
    assert str(patched_error.value) == str(stock_error.value)


@pytest.mark.parametrize("path", PATHS)
def test_unbinned_curves_keep_ignored_entries_within_the_last_bit_of_stocks(path: str) -> None:
    """Documented deviation: the unbinned update keeps the entries of ``ignore_index`` on every device (the compute
    leaves them out); with logits, the sigmoid over the whole batch may differ from stock's over the kept entries in
    the last bit (CPU vector lanes), so the curves are stock's within float32 rounding."""
    generator = torch.Generator().manual_seed(3)
    for _ in range(40):
        preds = torch.randn(50, generator=generator) * 3
        target = torch.randint(0, 2, (50,), generator=generator)
        target[torch.rand(50, generator=generator) < 0.3] = -1
        expected = torchmetrics.ROC(task="binary", ignore_index=-1)(preds, target)
        with torchmetrics_syncfree.patched():
            metric = torchmetrics.ROC(task="binary", ignore_index=-1)
            with SyncProbe() if path == "device" else contextlib.nullcontext():
                metric.update(preds, target)
            assert sum(state.numel() for state in metric.target) == 50  # the ignored entries stay
            got = metric.compute()
        for value, reference in zip(got, expected):
            assert (value.dtype, value.shape) == (reference.dtype, reference.shape)
            torch.testing.assert_close(value, reference, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("path", PATHS)
def test_multiclass_micro_labels_of_no_class_without_validation_are_negatives(path: str) -> None:
    """Documented deviation: with ``validate_args=False`` stock's ``one_hot`` fails on a target of no class; every
    device counts it as a negative of every class, as stock's per-class curves do."""
    preds = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6]])
    target = torch.tensor([0, 2, 5, -3])
    with pytest.raises(RuntimeError):
        torchmetrics.ROC(task="multiclass", num_classes=3, average="micro", validate_args=False).update(preds, target)
    negatives = (target.unsqueeze(1) == torch.arange(3)).long().flatten()  # rows 2 and 3: negatives of every class
    expected = torchmetrics.ROC(task="binary")(preds.flatten(), negatives)
    with torchmetrics_syncfree.patched():
        metric = torchmetrics.ROC(task="multiclass", num_classes=3, average="micro", validate_args=False)
        with SyncProbe() if path == "device" else contextlib.nullcontext() as probe:
            metric.update(preds, target)
        assert probe is None or probe.count == 0, probe.events
        got = metric.compute()
    for value, reference in zip(got, expected):
        torch.testing.assert_close(value, reference, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric:UserWarning")  # a loaded state counts no update
def test_multiclass_micro_state_keeps_its_ignored_rows_through_copies_and_merges(syncfree: Any) -> None:
    """The ignored rows that the device path keeps (targets ``IGNORED_ONE_HOT``: ``ignore_index=1`` is a one-hot
    value) survive ``merge_state``, pickle and ``state_dict`` round trips and are left out by every compute."""
    data = _batches("multiclass", 1, seed=8)
    stock = _make("PrecisionRecallCurve", "multiclass", None, 1, average="micro")
    for preds, target in data:
        stock.update(preds, target)
    with SyncProbe():
        first = _make("PrecisionRecallCurve", "multiclass", None, 1, average="micro")
        second = _make("PrecisionRecallCurve", "multiclass", None, 1, average="micro")
        for i, (preds, target) in enumerate(data):
            (first if i % 2 else second).update(preds, target)
        assert (dim_zero_cat(first.target) == precision_recall_curve.IGNORED_ONE_HOT).any()
        merged = pickle.loads(pickle.dumps(second))
        merged.merge_state(first)
        restored = _make("PrecisionRecallCurve", "multiclass", None, 1, average="micro")
        restored.persistent(True)
        merged.persistent(True)
        restored.load_state_dict(merged.state_dict())
        for metric in (merged, restored, copy.deepcopy(merged)):
            for value, reference in zip(_flat(metric.compute()), _flat(stock.compute())):
                torch.testing.assert_close(value, reference, rtol=1e-6, atol=0)  # (order of the batches differs)


def _flattening(metric: Any) -> Combining:
    """A metric whose forward/compute return one tensor: the curve tuples flattened (for ``parity``)."""
    return Combining(metric, lambda value: torch.cat([t.double().flatten() for t in _flat(value)]))


@pytest.mark.parametrize("task", list(IGNORE))
@pytest.mark.parametrize("key", list(THRESHOLDS))
def test_update_is_sync_free(syncfree: Any, task: str, key: str) -> None:
    """0 would-be syncs in update on the device path for every name, thresholds setting and ignore_index."""
    for name in NAMES:
        for ignore_index in IGNORE[task]:
            metric = _make(name, task, THRESHOLDS[key], ignore_index)
            data = _batches(task, ignore_index, seed=3)
            with SyncProbe() as probe:
                for preds, target in data:
                    metric.update(preds, target)
            assert probe.count == 0, (name, ignore_index, probe.events)


@pytest.mark.parametrize("task", list(IGNORE))
def test_stock_syncs_are_seen(task: str) -> None:
    metric = _make("AUROC", task, 5, -1)
    with SyncProbe() as probe:
        metric.update(*_batches(task, -1, seed=1)[0])
    assert probe.count > 0


INVALID = {
    "binary target": ("binary", torch.tensor([0.2, 0.7]), torch.tensor([0, 2]), RuntimeError),
    "binary int preds": ("binary", torch.tensor([0, 1]), torch.tensor([0, 1]), ValueError),
    "multiclass target": ("multiclass", torch.rand(2, NUM_CLASSES), torch.tensor([0, NUM_CLASSES + 3]), RuntimeError),
    "multilabel target": ("multilabel", torch.rand(2, NUM_CLASSES), torch.full((2, NUM_CLASSES), 2), RuntimeError),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["PrecisionRecallCurve", "AveragePrecision"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error_type(path: str, name: str, case: str) -> None:
    """Stock's exception type (and, on CPU, its message); on the device path the value check is reported at the end of
    the update and the binned counts leave the batch out. AveragePrecision sets ``validate_args`` after the base
    ``__init__`` (stock's BinaryAUROC never sets it: it does not validate, patched or not)."""
    task, preds, target, error = INVALID[case]
    with pytest.raises(error) as stock_error:  # multiclass: stock's check passes (2 distinct), ``one_hot`` fails
        _make(name, task, 5, None).update(preds, target)
    good_preds, good_target = _batches(task, None, seed=5)[0]
    reference = _make(name, task, 5, None)
    reference.update(good_preds, good_target)
    with torchmetrics_syncfree.patched():
        metric = _make(name, task, 5, None)
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(good_preds, good_target)
            with pytest.raises(error) as patched_error:
                metric.update(preds, target)
        if path == "cpu" and case != "multiclass target":
            assert str(patched_error.value) == str(stock_error.value)
        torch.testing.assert_close(metric.confmat, reference.confmat, rtol=0, atol=0)
        assert pending_checks(metric) == 0


def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    metric = _make("AveragePrecision", "binary", 5, None)
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]))
        metric.update(torch.tensor([0.2, 0.7]), torch.tensor([0, 2]))
        assert pending_checks(metric) == 1
        with pytest.raises(RuntimeError, match="not valid for this metric"):
            metric.compute()
    assert int(metric.confmat[0].sum()) == 2  # the bad batch never entered the state


@pytest.mark.parametrize("path", PATHS)
def test_labels_that_are_no_class_without_validation_are_left_out(path: str) -> None:
    """Documented deviation: with ``validate_args=False`` stock counts a binary target 2 in the next threshold's cells
    (and its multiclass ``one_hot`` fails); the patched count leaves such entries out."""
    preds, target = torch.tensor([0.2, 0.7, 0.9]), torch.tensor([0, 1, 2])
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = _make("PrecisionRecallCurve", "binary", 3, None, validate_args=False)
        metric.update(preds, target)
        reference = _make("PrecisionRecallCurve", "binary", 3, None)
        reference.update(preds[:2], target[:2])
        torch.testing.assert_close(metric.confmat, reference.confmat, rtol=0, atol=0)


@pytest.mark.parametrize("task", list(IGNORE))
@pytest.mark.compile
def test_update_traces_without_a_graph_break(task: str) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = _make("AUROC", task, 5, -1)
        preds, target = _batches(task, -1, seed=2)[0]
        explanation = torch._dynamo.explain(lambda p, t: metric.update(p, t))(preds, target)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


def test_compute_group_members_and_copies_report_the_pending_error(syncfree: Any) -> None:
    """The counters are state: a MetricCollection compute group (curve, ROC, AveragePrecision: the latter two set
    ``validate_args`` after the curve's ``__init__``) shares them, a clone carries them, ``reset()`` reports them."""
    collection = torchmetrics.MetricCollection(
        {
            "curve": _make("PrecisionRecallCurve", "binary", 5, None),
            "roc": _make("ROC", "binary", 5, None),
            "ap": _make("AveragePrecision", "binary", 5, None),
        },
        compute_groups=True,
    )
    good, bad = (torch.tensor([0.2, 0.7]), torch.tensor([0, 1])), (torch.tensor([0.2, 0.7]), torch.tensor([0, 2]))
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        collection.update(*good)
        collection.update(*bad)
        assert len(collection.compute_groups) == 1
        twin = collection["ap"].clone()
        for name in ("curve", "roc", "ap"):
            with pytest.raises(RuntimeError, match="not valid"):
                collection[name].compute()
            collection[name].reset()
        with pytest.raises(RuntimeError, match="not valid"):
            twin.reset()
        twin.update(*good)
        torch.testing.assert_close(twin.compute(), torch.tensor(1.0))


def _micro_curve_world(rank: int, world_size: int) -> dict[str, Any]:
    """Every rank updates a micro-averaged ROC with ``ignore_index=1`` on the device path: its list state keeps the
    ignored rows (``IGNORED_ONE_HOT``), and ``compute`` gathers every rank's rows, then leaves those out."""
    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    torchmetrics_syncfree.patch_all()
    _instrumentation.force_device_path(True)
    metric = _make("ROC", "multiclass", None, 1, average="micro")
    for preds, target in _batches("multiclass", 1, seed=30 + rank):
        metric.update(preds, target)
    kept = bool((dim_zero_cat(metric.target) == precision_recall_curve.IGNORED_ONE_HOT).any())
    curve = metric.compute()
    _instrumentation.force_device_path(False)
    per_class = _make("ROC", "multiclass", None, 1)  # the CPU path: stock's update, the patched compute
    for preds, target in _batches("multiclass", 1, seed=30 + rank):
        per_class.update(preds, target)
    return {"kept_ignored_rows": kept, "curve": curve, "per_class_cpu": per_class.compute()}


@pytest.mark.slow  # two spawned ranks
def test_multiclass_micro_state_with_ignored_rows_syncs_across_ranks_to_stocks_curve(tmp_path: Any) -> None:
    """Also the per-class ROC with ``ignore_index`` on the CPU path: its compute found the synced state (a tensor, no
    longer a list) ambiguous as a truth value, where stock computes."""
    from tests import _ddp_world

    world_size = 2
    results = [
        res["_micro_curve_world@gloo"]
        for res in _ddp_world.run_world([("gloo", _micro_curve_world)], world_size, tmp_path)
    ]
    stock = _make("ROC", "multiclass", None, 1, average="micro")
    for rank in range(world_size):  # gathered in rank order, each rank's batches in update order
        for preds, target in _batches("multiclass", 1, seed=30 + rank):
            stock.update(preds, target)
    stock_per_class = _make("ROC", "multiclass", None, 1)
    for rank in range(world_size):
        for preds, target in _batches("multiclass", 1, seed=30 + rank):
            stock_per_class.update(preds, target)
    for res in results:
        assert res["kept_ignored_rows"]  # the device path's state, not stock's masked one
        for value, reference in zip(_flat(res["curve"]), _flat(stock.compute())):
            torch.testing.assert_close(value, reference, rtol=1e-6, atol=0)
        for value, reference in zip(_flat(res["per_class_cpu"]), _flat(stock_per_class.compute())):
            torch.testing.assert_close(value, reference, rtol=0, atol=0)


def test_multiclass_micro_curves_share_a_compute_group_with_ignored_rows_kept(syncfree: Any) -> None:
    """ROC and PrecisionRecallCurve (micro, ``ignore_index=1``) hold the same list state: one compute group on the
    device path too, each member's compute equal to stock's."""
    data = _batches("multiclass", 1, seed=9)

    def collection() -> torchmetrics.MetricCollection:
        return torchmetrics.MetricCollection(
            {name: _make(name, "multiclass", None, 1, average="micro") for name in ("ROC", "PrecisionRecallCurve")}
        )

    stock = collection()
    for preds, target in data:
        stock.update(preds, target)
    with SyncProbe() as probe:
        patched = collection()
        for preds, target in data:
            patched.update(preds, target)
        assert probe.count == 0
        assert patched.compute_groups == stock.compute_groups == {0: ["PrecisionRecallCurve", "ROC"]}
        values = patched.compute()
    for name, reference in stock.compute().items():
        for value, expected in zip(_flat(values[name]), _flat(reference)):
            torch.testing.assert_close(value, expected, rtol=1e-6, atol=0)
