"""CalibrationError, BinaryFairness/BinaryGroupStatRates and the multilabel ranking metrics: stock's values
on both patched paths, sync-free update/forward (and compute where its output has a fixed shape) on the device path
with the check counters' copy arrived and in flight, validation reported as stock's, compile without graph breaks."""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torchmetrics
from torch import Tensor
from torchmetrics.classification import (
    BinaryCalibrationError,
    BinaryFairness,
    BinaryGroupStatRates,
    MulticlassCalibrationError,
    MultilabelCoverageError,
    MultilabelRankingAveragePrecision,
    MultilabelRankingLoss,
)

import torchmetrics_syncfree
from tests._classification_cases import PATHS, assert_identical, parity, pending_checks
from tests._probing import graph_breaks
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.classification.group_fairness import GROUPS_OUTSIDE

LABELS = 5
GROUPS = 3
RANKING = {
    "coverage": MultilabelCoverageError,
    "ranking_ap": MultilabelRankingAveragePrecision,
    "ranking_loss": MultilabelRankingLoss,
}
#: (copy arrived, copy in flight): the check counters' host copy after each sweep, or never
COPY = {"arrived": 0, "in_flight": None}


def _ranking_batches(ignore_index: int | None, seed: int, n: int = 12) -> list[tuple[Tensor, Tensor]]:
    """Probabilities, logits, float64, ties (rounded scores), an extra dimension; rows with every label relevant
    and rows with none (stock's special cases); with ``ignore_index`` a quarter of the targets ignored."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(5):
        extra = (2,) if i == 4 else ()
        logits = torch.randn((n, LABELS, *extra), generator=gen) * 2
        preds = logits.sigmoid() if i in (0, 3) else logits
        if i == 2:
            preds = preds.double()
        if i == 3:
            preds = torch.round(preds * 3) / 3
        target = torch.randint(0, 2, preds.shape, generator=gen)
        target[0], target[1] = 1, 0
        if ignore_index is not None:
            target = target.masked_fill(torch.rand(target.shape, generator=gen) < 0.25, ignore_index)
        out.append((preds, target))
    return out


def _ranking_cases(ignores: tuple[int | None, ...] = (None, -1)) -> dict[str, Any]:
    return {
        f"{name}-ignore={ignore}": (
            (lambda c=cls, i=ignore: c(num_labels=LABELS, ignore_index=i)),
            _ranking_batches(ignore, seed=len(name) + (ignore or 0)),
        )
        for name, cls in RANKING.items()
        for ignore in ignores
    }


def _calibration_batches(task: str, ignore_index: int | None, seed: int, n: int = 16) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        shape = (n,) if task == "binary" else (n, 4)
        logits = torch.randn((*shape, 2) if i == 3 else shape, generator=gen) * 2
        if task == "binary":
            preds = logits if i == 1 else logits.sigmoid()
            target = torch.randint(0, 2, preds.shape, generator=gen)
        else:
            preds = logits if i == 1 else logits.softmax(1)
            target = torch.randint(0, 4, (n, 2) if i == 3 else (n,), generator=gen)
        if i == 2:
            preds = preds.double()
        if ignore_index is not None:
            target = target.masked_fill(torch.rand(target.shape, generator=gen) < 0.25, ignore_index)
        out.append((preds, target))
    return out


def _calibration_cases() -> dict[str, Any]:
    cases = {}
    for norm, ignore in (("l1", None), ("l1", -1), ("l2", -1), ("max", None)):
        label = f"binary-{norm}-ignore={ignore}"
        cases[label] = (
            lambda n=norm, i=ignore: BinaryCalibrationError(n_bins=7, norm=n, ignore_index=i),
            _calibration_batches("binary", ignore, seed=len(label)),
        )
    for norm in ("l1", "l2"):
        label = f"multiclass-{norm}-ignore=-1"
        cases[label] = (
            lambda n=norm: MulticlassCalibrationError(num_classes=4, n_bins=7, norm=n, ignore_index=-1),
            _calibration_batches("multiclass", -1, seed=len(label)),
        )
    return cases


@pytest.mark.parametrize("path", PATHS)
def test_ranking_and_calibration_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes. The ranking AP and loss sum every sample
    (and label) with zeros where stock selects, on every path: a float32-ulp tolerance there (documented)."""
    cases = {**_ranking_cases(), **_calibration_cases()}
    parity(cases, path=path, rtol=lambda label: 1e-6 if "ranking_" in label else 0.0)


def _fairness_batches(seed: int, n: int = 24) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Scores, logits, labels and an extra dimension; every group in every batch (see the deviation below)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        shape = (n, 2) if i == 3 else (n,)
        preds = torch.randn(shape, generator=gen) * 2
        preds = preds.sigmoid() if i == 0 else preds
        if i == 2:
            preds = (preds > 0).long()
        target = torch.randint(0, 2, shape, generator=gen)
        groups = torch.arange(n) % GROUPS
        out.append((preds, target, groups[torch.randperm(n, generator=gen)]))
    return out


_FAIRNESS = {
    "rates": lambda i=None: BinaryGroupStatRates(num_groups=GROUPS, ignore_index=i),
    "rates-ignore": lambda: BinaryGroupStatRates(num_groups=GROUPS, ignore_index=-1),
    "fairness-all": lambda: BinaryFairness(num_groups=GROUPS),
    "fairness-dp": lambda: BinaryFairness(num_groups=GROUPS, task="demographic_parity"),
    "fairness-eo": lambda: BinaryFairness(num_groups=GROUPS, task="equal_opportunity"),
}


def _fairness_run(label: str, data: list[tuple[Tensor, Tensor, Tensor]]) -> list[Tensor]:
    """forward() of every batch and compute(), as flat (key-checked) lists of tensors."""
    metric = _FAIRNESS[label]()
    if label.endswith("ignore"):
        data = [
            (p, t.masked_fill(torch.arange(t.shape[0]).view(-1, *[1] * (t.ndim - 1)) % 5 == 0, -1), g)
            for p, t, g in data
        ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # demographic parity's "does not require a target"
        outs = [metric(*batch) for batch in data] + [metric.compute()]
    return [torch.stack([v for _, v in sorted(out.items())]) for out in outs] + [
        torch.tensor([hash(tuple(sorted(out))) for out in outs])
    ]


@pytest.mark.parametrize("path", PATHS)
def test_group_fairness_parity_with_stock(path: str) -> None:
    """Rates and ratios, their keys (named by the groups found in the data), dtypes and shapes: stock's exactly."""
    data = _fairness_batches(seed=4)
    stock = {label: _fairness_run(label, data) for label in _FAIRNESS}
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = {label: _fairness_run(label, data) for label in _FAIRNESS}
    for label in _FAIRNESS:
        assert_identical(stock[label], patched[label], label)


def _all_metrics() -> dict[str, tuple[Any, tuple[Tensor, ...]]]:
    """One validating metric of each class with ``ignore_index``, and a batch for it."""
    preds, target, groups = _fairness_batches(seed=9)[0]
    ranking_preds, ranking_target = _ranking_batches(-1, seed=9)[1]
    return {
        "BinaryCalibrationError": (
            BinaryCalibrationError(norm="l2", ignore_index=-1),
            _calibration_batches("binary", -1, seed=9)[1],
        ),
        "MulticlassCalibrationError": (
            MulticlassCalibrationError(4, norm="l2", ignore_index=-1),
            _calibration_batches("multiclass", -1, seed=9)[1],
        ),
        "BinaryGroupStatRates": (BinaryGroupStatRates(GROUPS, ignore_index=-1), (preds, target, groups)),
        "BinaryFairness": (BinaryFairness(GROUPS, ignore_index=-1), (preds, target, groups)),
        **{cls.__name__: (cls(LABELS, ignore_index=-1), (ranking_preds, ranking_target)) for cls in RANKING.values()},
    }


#: syncs of forward and compute that the outputs need: BinaryFairness' keys name groups found in the data
NEEDED = {"BinaryFairness": {"forward": 1, "compute": 1}}


@pytest.mark.parametrize("copy_state", list(COPY))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, copy_state: str) -> None:
    """0 would-be syncs in update and forward (and compute, once the counters' copy has arrived), except the one read
    of BinaryFairness' keys; with the copy in flight as well as arrived."""
    counts = {}
    with _instrumentation.simulated_copy_delay(COPY[copy_state]):
        for name, (metric, batch) in _all_metrics().items():
            calls = {"update": lambda m=metric, b=batch: m.update(*b), "forward": lambda m=metric, b=batch: m(*b)}
            if copy_state == "arrived":
                calls["compute"] = metric.compute
            for call, run in calls.items():
                with SyncProbe() as probe:
                    run()
                counts[name, call] = probe.count
    expected = {key: NEEDED.get(key[0], {}).get(key[1], 0) for key in counts}
    assert counts == expected


@pytest.mark.parametrize("name", ["BinaryCalibrationError", "BinaryFairness", "MultilabelRankingAveragePrecision"])
def test_stock_syncs_are_seen(name: str) -> None:
    """The probe sees stock's reads (validation, groups, per-sample ``unique``): the zeros above mean something."""
    metric, batch = _all_metrics()[name]
    with SyncProbe() as probe:
        metric.update(*batch)
    assert probe.count > 0


INVALID = {
    "calibration target": (
        lambda: BinaryCalibrationError(),
        (torch.tensor([0.2, 0.7]), torch.tensor([0, 2])),
        RuntimeError,
    ),
    "calibration int preds": (
        lambda: BinaryCalibrationError(),
        (torch.tensor([0, 1]), torch.tensor([0, 1])),
        ValueError,
    ),
    "ranking target": (
        lambda: MultilabelRankingLoss(2),
        (torch.rand(2, 2), torch.tensor([[0, 1], [3, 1]])),
        RuntimeError,
    ),
    "ranking int preds": (
        lambda: MultilabelRankingLoss(2),
        (torch.tensor([[0, 1]]), torch.tensor([[0, 1]])),
        ValueError,
    ),
    "fairness target": (
        lambda: BinaryGroupStatRates(2),
        (torch.rand(3), torch.tensor([0, 1, 5]), torch.tensor([0, 1, 1])),
        RuntimeError,
    ),
    "fairness groups": (
        lambda: BinaryFairness(2),
        (torch.rand(3), torch.tensor([0, 1, 1]), torch.tensor([0, 1, 4])),
        ValueError,
    ),
    "fairness group dtype": (
        lambda: BinaryFairness(2),
        (torch.rand(2), torch.tensor([0, 1]), torch.tensor([0, 1.0])),
        ValueError,
    ),
}


#: documented: the groups' range check is one deferred check on every device, whose message names the problem (stock's
#: names the largest group, which the device path does not read)
OWN_MESSAGES = {"fairness groups": (GROUPS_OUTSIDE.message,)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error_type(path: str, case: str) -> None:
    """Stock's exception type: at once on CPU (stock's message, but ``OWN_MESSAGES``); on the device path host
    information (dtypes) at once, values at the end of the update (the simulated copy arrives). The metric stays
    usable."""
    make, batch, error = INVALID[case]
    with pytest.raises(error) as stock_error:
        make().update(*batch)
    with torchmetrics_syncfree.patched():
        metric = make()
        with SyncProbe() if path == "device" else contextlib.nullcontext(), pytest.raises(error) as patched_error:
            metric.update(*batch)
        if path == "cpu":
            assert patched_error.value.args == OWN_MESSAGES.get(case, stock_error.value.args)
        assert pending_checks(metric) == 0


@pytest.mark.parametrize("path", PATHS)
def test_groups_outside_the_range_are_rejected(path: str) -> None:
    """Documented deviation: every group must be in ``[0, num_groups)``. Stock checks ``max > num_groups`` only: a
    group ``num_groups`` fails later with an IndexError, a negative one is counted in another group's slot."""
    preds, target = torch.rand(4), torch.tensor([0, 1, 1, 0])
    for groups in (torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, -1, 1])):
        with torchmetrics_syncfree.patched():
            metric = BinaryGroupStatRates(2)
            with (
                SyncProbe() if path == "device" else contextlib.nullcontext(),
                pytest.raises(ValueError, match="outside"),
            ):
                metric.update(preds, target, groups)
            assert int(metric.tp.sum() + metric.fp.sum() + metric.tn.sum() + metric.fn.sum()) == 0
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        unchecked = BinaryGroupStatRates(2, validate_args=False)
        unchecked.update(preds, target, torch.tensor([0, 1, 2, -1]))  # the last two are left out
    assert int(unchecked.tp.sum() + unchecked.fp.sum() + unchecked.tn.sum() + unchecked.fn.sum()) == 2


def test_each_group_is_counted_in_its_own_slot(syncfree: Any) -> None:
    """Documented deviation: stock counts the groups present in a batch in consecutive slots, so a batch without
    group 0 adds group 1's counts to slot 0; each group keeps its own slot here (on both paths)."""
    preds, target, groups = torch.tensor([1, 1, 0]), torch.tensor([1, 0, 0]), torch.tensor([1, 1, 2])
    for probe in (contextlib.nullcontext(), SyncProbe()):
        metric = BinaryGroupStatRates(GROUPS)
        with probe:
            metric.update(preds, target, groups)
        assert metric.tp.tolist() == [0, 1, 0]
        assert metric.fp.tolist() == [0, 1, 0]
        assert metric.tn.tolist() == [0, 0, 1]


def test_invalid_batch_is_reported_later_and_left_out(syncfree: Any) -> None:
    """Device path, copy in flight: the bad batch never enters the state; compute (or a copy's reset) raises."""
    preds, target, groups = _fairness_batches(seed=2)[0]
    reference = BinaryGroupStatRates(GROUPS)
    reference.update(preds, target, groups)
    metric = BinaryGroupStatRates(GROUPS)
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric.update(preds, target, groups)
        metric.update(preds, target, groups + 1)
        assert pending_checks(metric) == 1
        twin = pickle.loads(pickle.dumps(copy.deepcopy(metric)))
        with pytest.raises(ValueError, match="outside"):
            metric.compute()
        with pytest.raises(ValueError, match="outside"):
            twin.reset()
    for state in ("tp", "fp", "tn", "fn"):
        assert torch.equal(getattr(metric, state), getattr(reference, state))


def test_zero_l2_calibration_error_is_a_float_on_every_path() -> None:
    """Documented deviation: stock returns ``torch.tensor(0)`` (int64, CPU) for a zero l2 error; patched, a float zero
    of the metric's dtype, where reads are free too (one implementation)."""
    preds, target = torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 1, 1])
    stock_metric = BinaryCalibrationError(norm="l2")
    stock_metric.update(preds, target)
    assert stock_metric.compute().dtype == torch.int64
    for probe in (contextlib.nullcontext(), SyncProbe()):
        with torchmetrics_syncfree.patched(), probe:
            metric = BinaryCalibrationError(norm="l2")
            metric.update(preds, target)
            value = metric.compute()
        assert value.dtype == torch.float32
        assert value == 0


@pytest.mark.parametrize("name", ["MultilabelRankingAveragePrecision", "BinaryFairness"])
@pytest.mark.compile
def test_update_traces_without_a_graph_break(name: str) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric, batch = _all_metrics()[name]
        explanation = torch._dynamo.explain(lambda *args: metric.update(*args))(*batch)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


def test_merge_state_and_reset(syncfree: Any) -> None:
    """Two metrics merged give the values of one that saw both batches; reset starts over (device path)."""
    first, second = _ranking_batches(None, seed=6)[:2]
    with SyncProbe():
        one, other, both = (MultilabelRankingLoss(LABELS) for _ in range(3))
        one.update(*first)
        other.update(*second)
        both.update(*first)
        both.update(*second)
        one.merge_state(other)
        torch.testing.assert_close(one.compute(), both.compute())
        both.reset()
        both.update(*first)
        torch.testing.assert_close(both.compute(), MultilabelRankingLoss(LABELS)(*first))


def test_functional_api_is_stocks() -> None:
    """The functional interface has no metric: its validation and values are stock's, patched or not."""
    preds, target = _ranking_batches(None, seed=7)[0]
    expected = torchmetrics.functional.classification.multilabel_ranking_loss(preds, target, LABELS)
    with torchmetrics_syncfree.patched():
        value = torchmetrics.functional.classification.multilabel_ranking_loss(preds, target, LABELS)
    torch.testing.assert_close(value, expected, rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")
@pytest.mark.parametrize("name", list(_all_metrics()))
def test_cuda_never_syncs_and_matches_stock(name: str) -> None:
    """On a GPU (``torch.cuda.set_sync_debug_mode("error")``): update and forward never synchronize, nor compute
    where its output has a fixed shape (BinaryFairness' forward and compute read its keys once: its update only);
    the values are stock's on the CPU."""
    from tests._probing import syncs_are_errors

    stock_metric, batch = _all_metrics()[name]
    keyed = name == "BinaryFairness"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [stock_metric(*batch), stock_metric.compute()]
        with torchmetrics_syncfree.patched():
            metric = _all_metrics()[name][0].cuda()
            cuda_batch = tuple(x.cuda() for x in batch)
            metric.update(*cuda_batch)  # first update and compute outside: allocations, lazy CUDA init
            metric.compute()
            metric.reset()
            with syncs_are_errors():
                got = [] if keyed else [metric(*cuda_batch), metric.compute()]
                if keyed:
                    metric.update(*cuda_batch)
            if keyed:
                got = [metric.compute()] * 2
    for e, g in zip(expected, got):
        if isinstance(e, dict):
            assert sorted(e) == sorted(g)
            e, g = torch.stack([e[k] for k in sorted(e)]), torch.stack([g[k] for k in sorted(g)])
        torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_calibration_state_keeps_the_ignored_entries_on_every_path(path: str, task: str) -> None:
    """Documented deviation: with ``ignore_index`` the list states keep every entry (stock's boolean mask has a
    data-dependent shape), on the CPU path too; ``compute`` weighs the ignored ones 0, so the value is stock's."""
    preds, target = _calibration_batches(task, -1, seed=3)[0]
    make = {
        "binary": lambda: BinaryCalibrationError(ignore_index=-1),
        "multiclass": lambda: MulticlassCalibrationError(4, ignore_index=-1),
    }[task]
    reference = make()
    reference.update(preds, target)
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        metric = make()
        metric.update(preds, target)
        value = metric.compute()
    assert (target == -1).any()
    assert torch.cat(metric.confidences).numel() == target.numel()
    assert torch.cat(reference.confidences).numel() == int((target != -1).sum())
    assert torch.equal(value, reference.compute())
