"""The nominal metrics (areas ``cramers``, ``tschuprows``, ``pearsons_contingency``, ``theils_u``): CramersV,
TschuprowsT, PearsonsContingencyCoefficient and TheilsU.

Stock's values on both patched paths (the table's counts to the bit on both; the computes, one on every device, to
float tolerance: sums over the whole table, or over its filled rows and columns where reads are free and it is large),
with empty rows and columns, bias correction on and off, both NaN strategies; sync-free update, forward and compute
on the device path; stock's
warning as often as stock; stock's error types.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor
from torchmetrics.nominal import CramersV, PearsonsContingencyCoefficient, TheilsU, TschuprowsT

import torchmetrics_syncfree
from tests._classification_cases import PATHS, cuda, pending_checks, run_case
from tests._probing import syncs_are_errors, warning_messages
from tests.test_wrapper_checks import _device_path
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.nominal.utils import chi_squared, filled_part
from torchmetrics_syncfree.tools.launches import count_launches

NUM = 5
COPY = {"arrived": 0, "in_flight": None}
#: the metrics with ``bias_correction`` (and its warning)
CORRECTED = (CramersV, TschuprowsT)
METRICS = (*CORRECTED, PearsonsContingencyCoefficient, TheilsU)
#: stock's bias-correction warning, as it starts for either metric
UNABLE = "using bias correction"


def _configs() -> list[tuple[type, dict[str, Any]]]:
    configs = []
    for cls in METRICS:
        for nan_strategy in ("replace", "drop"):
            kwargs: dict[str, Any] = {"nan_strategy": nan_strategy}
            if nan_strategy == "replace":
                kwargs["nan_replace_value"] = 1.0
            for bias in (True, False) if cls in CORRECTED else (None,):
                configs.append((cls, kwargs if bias is None else {**kwargs, "bias_correction": bias}))
    return configs


def _label(cls: type, kwargs: dict[str, Any]) -> str:
    return f"{cls.__name__}-" + "-".join(f"{k}={v}" for k, v in kwargs.items())


def _batches(seed: int, n: int = 24) -> list[tuple[Tensor, Tensor]]:
    """Float labels with empty rows and columns (class 2 never predicted, class 3 never a target), NaN pairs, 2-d
    scores, int64 labels, fractional labels (truncated), a pred outside the classes whose index stays in the table
    (stock counts it in another cell), a batch of two associated classes (a 2 x 2 table: df 1, Yates' correction
    where bias is corrected) and a batch of one target class (one row: df 0, stock's warning)."""
    gen = torch.Generator().manual_seed(seed)
    preds = torch.randint(0, NUM, (n,), generator=gen)
    target = (preds + torch.randint(-1, 2, (n,), generator=gen)).clamp(0, NUM - 1)
    preds, target = preds.masked_fill(preds == 2, 1).float(), target.masked_fill(target == 3, 0).float()
    with_nan = preds.clone(), target.clone()
    with_nan[0][[1, 5]] = float("nan")
    with_nan[1][[5, 7]] = float("nan")
    scores = torch.rand(n, NUM, generator=gen)
    outside = preds.long().clone(), target.long().clone()
    outside[0][0], outside[1][0] = NUM, 0  # index NUM: the cell (1, 0), as stock
    return [
        (preds, target),
        with_nan,
        (scores, target.long()),
        (preds.long(), target.long()),
        (preds + 0.7, target + 0.2),
        outside,
        (preds.long() % 2, (preds.long() % 2).index_fill(0, torch.arange(4), 1)),
        (torch.arange(n).float() % NUM, torch.zeros(n)),
    ]


def _cases() -> dict[str, Any]:
    data = _batches(seed=1)
    return {_label(cls, kw): (lambda cls=cls, kw=kw: cls(num_classes=NUM, **kw), data) for cls, kw in _configs()}


def _assert_stocks_to_tolerance(stock: dict[str, list[Tensor]], patched: dict[str, list[Tensor]]) -> None:
    for label, values in stock.items():
        for i, (s, p) in enumerate(zip(values, patched[label])):
            if label.startswith("TheilsU") and s.dtype == torch.int64:  # documented deviation (test below)
                s = s.float()
            assert (p.dtype, p.shape) == (s.dtype, s.shape), f"{label} value {i}"
            torch.testing.assert_close(p, s, rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"{label} value {i}")


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute() (after forwards, after updates): stock's values, NaN where stock's are, its
    dtypes and shapes, to float tolerance on both paths (relative 1e-5, absolute 1e-6 for a value that is 0 in stock:
    the sums run over the whole table)."""
    cases = _cases()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bias-correction warning: counted below
        stock = {label: run_case(make, data, "cpu") for label, (make, data) in cases.items()}
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            patched = {label: run_case(make, data, "cpu") for label, (make, data) in cases.items()}
    _assert_stocks_to_tolerance(stock, patched)


@pytest.mark.parametrize("path", PATHS)
def test_a_large_sparse_table_has_stocks_values(path: str) -> None:
    """200 classes that a few pairs fill: where reads are free the compute takes the filled rows and columns first
    (stock's cells), on the device path the whole table; stock's values on both."""
    gen = torch.Generator().manual_seed(3)
    preds = torch.randint(0, 200, (40,), generator=gen)
    data = [(preds, (preds + torch.randint(0, 3, (40,), generator=gen)) % 200), (preds[:8], preds[:8])]
    cases = {
        _label(cls, kw): (lambda cls=cls, kw=kw: cls(num_classes=200, **kw), data)
        for cls, kw in _configs()
        if kw["nan_strategy"] == "replace"
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = {label: run_case(make, data, "cpu") for label, (make, data) in cases.items()}
        with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
            patched = {label: run_case(make, data, "cpu") for label, (make, data) in cases.items()}
            table = torch.zeros(200, 200).index_put_((torch.tensor([3, 3, 9]), torch.tensor([4, 7, 4])), torch.ones(3))
            assert filled_part(table).shape == ((2, 2) if path == "cpu" else (200, 200))
    _assert_stocks_to_tolerance(stock, patched)


@pytest.mark.parametrize("path", PATHS)
def test_theils_u_of_a_zero_entropy_is_a_float_zero(path: str) -> None:
    """Pinned deviation: stock returns ``torch.tensor(0)`` (int64) where H(X) is 0; the patched compute, the same on
    every device, a float 0."""
    preds, target = torch.zeros(6), torch.arange(6.0) % 3
    stock = TheilsU(num_classes=3)
    stock.update(preds, target)
    assert stock.compute().dtype == torch.int64
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = TheilsU(num_classes=3)
        patched.update(preds, target)
        value = patched.compute()
    assert value.dtype == torch.float32
    assert float(value) == 0.0


def test_a_table_of_one_row_has_stocks_zero_statistic() -> None:
    """Stock returns 0 where ``df == 0`` (one filled row or column) without summing; the full table's sum of terms
    is not 0 there when ``rows * cols / total`` rounds (products past 2**24 in float32): ``df`` selects the 0."""
    table = torch.zeros(3, 3)
    table[1] = torch.tensor([580620.0, 904195.0, 51040.0])
    expected = torch.outer(table.sum(1), table.sum(0)) / table.sum()
    assert ((table - expected) ** 2 / expected).nansum() != 0
    statistic, degrees, df, _ = chi_squared(table, bias_correction=True)
    assert (float(statistic), degrees.tolist(), int(df)) == (0.0, [0, 2], 0)


@pytest.mark.parametrize(
    "cls, kwargs",
    [(cls, {"bias_correction": bias}) for cls in CORRECTED for bias in (True, False)]
    + [(cls, {}) for cls in METRICS if cls not in CORRECTED],
    ids=lambda value: value.__name__ if isinstance(value, type) else "-".join(f"{k}={v}" for k, v in value.items()),
)
def test_device_compute_launches_at_most_stocks(cls: type, kwargs: dict[str, Any]) -> None:
    """The fixed-shape compute launches no more kernels than stock's, which reads the host instead (5 classes)."""
    preds, target = _batches(seed=3)[3]
    counts = {}
    for mode in ("stock", "patched"):
        with _device_path(None) if mode == "patched" else contextlib.nullcontext(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric = cls(num_classes=NUM, **kwargs)
            metric.update(preds, target)
            counts[mode] = count_launches(type(metric).compute, metric)[0]
    assert counts["patched"] <= counts["stock"], counts


@pytest.mark.parametrize("copy_state", list(COPY))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, copy_state: str) -> None:
    """0 would-be syncs in update and forward (and compute, once the check counters' copy has arrived) for every
    configuration, with the counters' copy in flight as well as arrived."""
    data = _batches(seed=2)
    counts = {}
    with warnings.catch_warnings(), _instrumentation.simulated_copy_delay(COPY[copy_state]):
        warnings.simplefilter("ignore")
        for cls, kwargs in _configs():
            metric = cls(num_classes=NUM, **kwargs)
            with SyncProbe() as probe:
                metric.update(*data[0])
                for batch in data[1:]:
                    metric(*batch)
            counts[_label(cls, kwargs), "update/forward"] = probe.count
            if copy_state == "arrived":
                with SyncProbe() as probe:
                    metric.compute()
                counts[_label(cls, kwargs), "compute"] = probe.count
    assert counts == dict.fromkeys(counts, 0)


@pytest.mark.parametrize("cls", METRICS, ids=lambda cls: cls.__name__)
def test_stock_syncs_are_seen(cls: type) -> None:
    """The probe sees stock's ``bincount`` in update: the zeros above mean something."""
    metric = cls(num_classes=NUM)
    with SyncProbe() as probe:
        metric.update(*_batches(seed=3)[0])
    assert probe.count > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cls", CORRECTED, ids=lambda cls: cls.__name__)
def test_bias_correction_warning_comes_as_often_as_stocks(path: str, cls: type) -> None:
    """Stock warns in every compute (forward's batch value included) that cannot correct the bias; the patched
    metric gives the same messages as often (on the device path at the next eager point)."""
    one_row = (torch.arange(8.0) % NUM, torch.zeros(8))
    fine = _batches(seed=4)[0]

    def run() -> None:
        metric = cls(num_classes=NUM)
        metric(*one_row)  # warns
        metric(*fine)  # the batch value is fine
        metric.compute()  # both batches: fine
        metric.reset()
        metric.update(*one_row)
        metric.compute()  # warns
        metric.reset()  # an eager point: the device path reports the compute's warning here

    expected = warning_messages(run, UNABLE)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        got = warning_messages(run, UNABLE)
    assert len(expected) == 2  # the second compute() returns the cached value
    assert got == expected


INVALID = {
    "negative target": ((torch.tensor([0, 1, 2]), torch.tensor([0, -1, 1])), RuntimeError),
    "target past the classes": ((torch.tensor([0, 1, 2]), torch.tensor([0, NUM, 1])), RuntimeError),
    "lengths": ((torch.tensor([0, 1, 2]), torch.tensor([0, 1])), RuntimeError),
    "3-d": ((torch.zeros(2, 3, 2), torch.zeros(2, 3, 2)), RuntimeError),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error_type(path: str, case: str) -> None:
    """Stock's exception type: shape errors with its message; an index outside the table with the project's message
    (stock's comes from ``bincount`` or ``reshape``), on the CPU path at once with the batch left out of the table as
    stock leaves it, on a simulated device at the update's end, with nothing left pending."""
    batch, error = INVALID[case]
    with pytest.raises(error) as stock_error:
        CramersV(num_classes=NUM).update(*batch)
    with torchmetrics_syncfree.patched():
        metric = CramersV(num_classes=NUM)
        metric.update(torch.tensor([0, 1]), torch.tensor([1, 1]))
        with SyncProbe() if path == "device" else contextlib.nullcontext(), pytest.raises(error) as patched_error:
            metric.update(*batch)
        if case in ("lengths", "3-d"):
            assert patched_error.value.args == stock_error.value.args
        else:
            assert "outside the contingency table" in str(patched_error.value)
        assert pending_checks(metric) == 0
        if path == "cpu":
            assert int(metric.confmat.sum()) == 2


def test_index_outside_the_table_is_reported_once_and_not_counted(syncfree: Any) -> None:
    """With the copy in flight the error comes at compute(); the pairs outside the table were not counted."""
    metric = PearsonsContingencyCoefficient(num_classes=NUM)
    good, bad = _batches(seed=5)[3], (torch.tensor([0, 1, 2]), torch.tensor([0, -1, NUM]))
    with _instrumentation.simulated_copy_delay(None), SyncProbe() as probe:
        metric.update(*good)
        metric.update(*bad)
    assert probe.count == 0
    with SyncProbe(), pytest.raises(RuntimeError, match="outside the contingency table"):
        metric.compute()
    assert pending_checks(metric) == 0
    assert int(metric.confmat.sum()) == len(good[0]) + 1


@pytest.mark.parametrize("cls", METRICS, ids=lambda cls: cls.__name__)
def test_deterministic_mode_counts_with_stocks_mesh(cls: type) -> None:
    """In deterministic mode stock counts with a fixed-shape mesh (indices outside the table not counted, nothing
    raised): the device path does the same."""
    data = [*_batches(seed=6)[:4], (torch.tensor([0, 1, 2]), torch.tensor([0, -1, NUM]))]
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        stock = cls(num_classes=NUM, nan_strategy="drop")
        for batch in data:
            stock.update(*batch)
        with torchmetrics_syncfree.patched():
            patched = cls(num_classes=NUM, nan_strategy="drop")
            with SyncProbe() as probe:
                for batch in data:
                    patched.update(*batch)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert probe.count == 0
    torch.testing.assert_close(patched.confmat, stock.confmat)


@pytest.mark.compile
def test_update_traces_with_fullgraph(syncfree: Any) -> None:
    """The device path's update is tensor work: ``torch.compile(fullgraph=True)`` traces it (NaN drop included)."""
    import torch._dynamo

    torch._dynamo.reset()
    metric, twin = CramersV(num_classes=NUM, nan_strategy="drop"), CramersV(num_classes=NUM, nan_strategy="drop")
    data = _batches(seed=7)[:2]
    compiled = torch.compile(metric.update, fullgraph=True, backend="aot_eager")
    for batch in data:
        compiled(*batch)
    with SyncProbe():
        for batch in data:
            twin.update(*batch)
    torch.testing.assert_close(metric.confmat, twin.confmat)


def test_life_cycle(syncfree: Any) -> None:
    """reset, deepcopy/pickle, merge_state and a metric made before the patch, on the device path (no sync in the
    updates, copies and merge; compute() and reset() may read the check counters once)."""
    data = _batches(seed=8)[:4]
    torchmetrics_syncfree.unpatch_all()
    early = TheilsU(num_classes=NUM)  # no check counters: it gets them in its first update
    torchmetrics_syncfree.patch_all()
    whole, first, second = (TheilsU(num_classes=NUM) for _ in range(3))
    with SyncProbe() as probe:
        for batch in data:
            whole.update(*batch)
            early.update(*batch)
        first.update(*data[0])
    twin = pickle.loads(pickle.dumps(copy.deepcopy(first)))  # (torch 2.0 rebuilds a tensor from Python data)
    with probe:
        for batch in data[1:]:
            second.update(*batch)
        twin.merge_state(second)
    assert probe.count == 0, probe.events
    values = [whole.compute(), early.compute(), twin.compute()]
    whole.reset()
    torch.testing.assert_close(values[1], values[0])
    torch.testing.assert_close(values[2], values[0])
    assert int(whole.confmat.sum()) == 0


@pytest.mark.cuda
@cuda
def test_cuda_parity_without_syncs() -> None:
    """On CUDA: stock's values (float tolerance) and no synchronization in update and forward (sync debug mode)."""
    device = "cuda"
    data = [(p.to(device), t.to(device)) for p, t in _batches(seed=9)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls, kwargs in _configs():
            stock = cls(num_classes=NUM, **kwargs).to(device)
            expected = [stock(*batch) for batch in data]
            with torchmetrics_syncfree.patched():
                metric = cls(num_classes=NUM, **kwargs).to(device)
                metric.update(*data[0])  # the first update's counters copy
                metric.reset()
                with syncs_are_errors():
                    got = [metric(*batch) for batch in data]
            for e, g in zip(expected, got):
                torch.testing.assert_close(g.float(), e.float(), rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("path", PATHS)
def test_collection_groups_them_as_stock(path: str) -> None:
    """A MetricCollection puts the four metrics into one compute group, as stock (the same states), with stock's
    values and each bias-correction warning with its own metric's message, as often as stock."""
    from torchmetrics import MetricCollection

    one_row, fine = (torch.arange(8.0) % NUM, torch.zeros(8)), _batches(seed=10)[0]

    def run() -> tuple[dict[int, list[str]], list[Tensor]]:
        collection = MetricCollection([cls(num_classes=NUM) for cls in METRICS])
        collection.update(*fine)  # the groups are formed in the first update
        values = list(collection(*one_row).values())
        values += list(collection.compute().values())
        collection.reset()  # an eager point: the device path reports the computes' warnings here
        return collection.compute_groups, values

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups, expected = run()
    stock_warnings = sorted(str(w.message) for w in caught if UNABLE in str(w.message))
    probe = SyncProbe() if path == "device" else contextlib.nullcontext()
    with torchmetrics_syncfree.patched(), probe, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patched_groups, got = run()
    assert len(groups) == 1
    assert {"Cramer's V", "Tschuprow's T"} <= {
        m.split(" using")[0].removeprefix("Unable to compute ") for m in stock_warnings
    }
    assert patched_groups == groups
    assert sorted(str(w.message) for w in caught if UNABLE in str(w.message)) == stock_warnings
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.float(), e.float(), rtol=1e-5, atol=1e-6, equal_nan=True)
