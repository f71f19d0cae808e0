"""LogCoshError, TweedieDevianceScore, KendallRankCorrCoef, ConcordanceCorrCoef: stock's values on both
patched paths, sync-free update/forward/compute on the device path (the check counters' copy arrived and in
flight), stock's errors and warnings."""

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

import torchmetrics_syncfree
from tests import _series_tree
from tests._classification_cases import PATHS, Combining, parity, pending_checks
from tests._probing import CPU_HALF_MATH, assert_sync_free_life, graph_breaks, warning_messages
from tests._regression_cases import batches, rounded, with_small_batches
from torchmetrics_syncfree import SyncProbe, _deferred, _instrumentation

DTYPES = {"float32": torch.float32, "float64": torch.float64, **({"half": torch.half} if CPU_HALF_MATH else {})}
#: Tweedie powers: each of stock's branches (normal, Poisson, gamma, the general formula below 0, between 1 and 2,
#: above 2)
POWERS = (0.0, 1.0, 2.0, -1.0, 1.5, 3.0)
#: Kendall configurations: (variant, t_test, alternative)
KENDALL = (
    ("a", False, None),
    ("b", False, None),
    ("c", False, None),
    ("a", True, "two-sided"),
    ("b", True, "less"),
    ("c", True, "greater"),
)


def _positive(
    seed: int, outputs: int | None = None, dtype: torch.dtype = torch.float32, zeros: bool = False
) -> list[Any]:
    """Strictly positive preds and targets (every power's valid domain); ``zeros``: a batch with some zero targets
    (valid at powers 1 and 1 < p < 2; Poisson's ``_safe_xlogy`` zeros)."""
    data = [(p.exp(), t.exp()) for p, t in batches(seed, outputs)]
    if zeros:
        preds, target = data[0]
        data.append((preds, target.masked_fill(target < 0.5, 0.0)))
    return [(p.to(dtype), t.to(dtype)) for p, t in data]


def _kendall(variant: str, t_test: bool, alternative: str | None, outputs: int = 1) -> Any:
    return lambda: torchmetrics.KendallRankCorrCoef(
        variant=variant, t_test=t_test, alternative=alternative, num_outputs=outputs
    )


def _cases() -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for name, dtype in DTYPES.items():
        cases[f"log-cosh-{name}"] = torchmetrics.LogCoshError, batches(1, dtype=dtype)
        cases[f"log-cosh-3-{name}"] = (lambda: torchmetrics.LogCoshError(num_outputs=3)), batches(2, 3, dtype)
        cases[f"concordance-{name}"] = torchmetrics.ConcordanceCorrCoef, with_small_batches(batches(3, dtype=dtype))
    cases["concordance-3"] = (
        lambda: torchmetrics.ConcordanceCorrCoef(num_outputs=3),
        with_small_batches(batches(4, 3)),
    )
    for i, power in enumerate(POWERS):
        dtype = torch.float64 if i % 3 == 2 else torch.float32
        cases[f"tweedie-{power}"] = (
            lambda p=power: torchmetrics.TweedieDevianceScore(power=p),
            _positive(5 + i, dtype=dtype, zeros=power in (1.0, 1.5)),
        )
    if CPU_HALF_MATH:
        cases["tweedie-0.0-half-2d"] = torchmetrics.TweedieDevianceScore, _positive(6, 2, torch.half)
    for i, config in enumerate(KENDALL):
        outputs = 3 if i % 2 else 1
        data = rounded(7 + i, None if outputs == 1 else outputs, n=10)
        cases[f"kendall-{outputs}-{'-'.join(map(str, config))}"] = _kendall(*config, outputs=outputs), data
    cases["kendall-c-float64"] = _kendall("c", True, "two-sided", 2), rounded(13, 2, torch.float64, n=10)
    return cases


def _stacked(value: Any) -> torch.Tensor:
    return torch.stack(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute() (after forwards, after updates): stock's values to the bit (NaN where stock's
    are), dtypes and shapes (Kendall's ``(tau, p_value)`` pairs compared member by member)."""
    cases = {
        label: (lambda make=make: Combining(make(), _stacked), data) if label.startswith("kendall") else (make, data)
        for label, (make, data) in _cases().items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the variance warning (ConcordanceCorrCoef); Kendall's memory warning
        parity(cases, path=path)


SYNC_FREE = {
    "log-cosh": (lambda: torchmetrics.LogCoshError(num_outputs=3), batches(8, 3)),
    "tweedie-0": (torchmetrics.TweedieDevianceScore, batches(8)),
    "tweedie-1": (lambda: torchmetrics.TweedieDevianceScore(power=1.0), _positive(8, zeros=True)),
    "tweedie-1.5": (lambda: torchmetrics.TweedieDevianceScore(power=1.5), _positive(8, zeros=True)),
    "concordance": (lambda: torchmetrics.ConcordanceCorrCoef(num_outputs=3), with_small_batches(batches(8, 3))),
    "kendall-b": (_kendall("b", False, None), rounded(8)),
    "kendall-c-t-test": (_kendall("c", True, "two-sided", outputs=3), rounded(8, 3)),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_update_forward_and_compute_are_sync_free(syncfree: Any, name: str) -> None:
    """The check counters' copy arrived (a device that has finished): no would-be sync in update, forward, compute."""
    make, data = SYNC_FREE[name]
    assert_sync_free_life(make(), data)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_update_and_forward_are_sync_free_with_the_copy_in_flight(syncfree: Any, name: str) -> None:
    """A device that never catches up: update and forward still read nothing; compute() waits only for a metric with
    check counters (Tweedie's invalid values, the Pearson variance warning of ConcordanceCorrCoef), its one read."""
    make, data = SYNC_FREE[name]
    metric = make()
    with _instrumentation.simulated_copy_delay(None):
        with SyncProbe() as probe:
            metric.update(*data[0])
            for batch in data[1:]:
                metric(*batch)
        assert probe.count == 0, probe.events
        with SyncProbe() as probe:
            metric.compute()
    has_checks = bool(_deferred.kinds_of(metric))
    assert [event.kind for event in probe.events] == (["host wait"] if has_checks else [])


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(SYNC_FREE))
def test_stock_syncs_are_seen(name: str) -> None:
    """The probe sees stock's syncs (the count's host copy, Pearson's masks, unique/bincount): the zeros above mean
    something."""
    make, data = SYNC_FREE[name]
    with SyncProbe() as probe:
        make()(*data[0])
    assert probe.count > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("power", [1.0, 2.0, -1.0, 1.5, 3.0])
def test_tweedie_invalid_values_raise_stocks_error(path: str, power: float) -> None:
    """Stock's ValueError (its text, which names the power); on the device path at the update's end once the copy
    has arrived, else at compute(); the offending batch is left out of the state either way."""
    preds, target = _positive(9)[0]
    bad = (preds, -target) if power > 0 else (-preds, target)
    expected = torchmetrics.TweedieDevianceScore(power=power)
    expected.update(preds, target)
    with pytest.raises(ValueError) as stock_error:
        torchmetrics.TweedieDevianceScore(power=power).update(*bad)
    probing = SyncProbe() if path == "device" else contextlib.nullcontext()
    with torchmetrics_syncfree.patched(), probing:
        metric = torchmetrics.TweedieDevianceScore(power=power)
        metric.update(preds, target)
        with pytest.raises(ValueError) as error:
            metric.update(*bad)
        assert str(error.value) == str(stock_error.value)
        torch.testing.assert_close(metric.compute(), expected.compute(), rtol=0, atol=0)
        if path == "device":
            with _instrumentation.simulated_copy_delay(None):
                metric.update(*bad)
                assert pending_checks(metric) == 1
                with pytest.raises(ValueError, match=f"power={power}"):
                    metric.compute()
            torch.testing.assert_close(metric.compute(), expected.compute(), rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_invalid_inputs_raise_stocks_errors(path: str) -> None:
    probing = SyncProbe() if path == "device" else contextlib.nullcontext()
    with torchmetrics_syncfree.patched(), probing, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"Deviance Score is not defined for power=0\.5"):
            torchmetrics.TweedieDevianceScore(power=0.5)
        for metric in (
            torchmetrics.LogCoshError(),
            torchmetrics.TweedieDevianceScore(),
            torchmetrics.ConcordanceCorrCoef(),
            torchmetrics.KendallRankCorrCoef(),
        ):
            with pytest.raises(RuntimeError, match="same shape"):
                metric.update(torch.rand(4), torch.rand(5))
        with pytest.raises(ValueError, match="Expected both predictions and target to be either 1- or 2-dimensional"):
            torchmetrics.LogCoshError().update(torch.rand(4, 2, 2), torch.rand(4, 2, 2))
        with pytest.raises(ValueError, match="required if `t_test=True`"):
            torchmetrics.KendallRankCorrCoef(t_test=True, alternative=None)


def test_concordance_warning_comes_once_per_compute() -> None:
    """Stock's variance warning (through its Pearson coefficient), once per offending compute (forward's batch value
    and compute()), on the device path at the metric's next eager point."""
    preds, target = torch.rand(8), torch.full((8,), 0.5)

    def run() -> None:
        metric = torchmetrics.ConcordanceCorrCoef()
        metric(preds, target)
        metric.update(preds, target)
        metric.compute()
        metric.reset()

    expected = warning_messages(run, "variance of predictions")
    assert len(expected) == 2
    with torchmetrics_syncfree.patched(), SyncProbe():
        assert warning_messages(run, "variance of predictions") == expected


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_copies_compute_as_stock(syncfree: Any) -> None:
    """deepcopy/pickle of the list states (Kendall) and of the counters (Tweedie, its per-power check): the copies
    compute alike on the device path, and a copy's pending error is stock's."""
    tree_mode = _series_tree.series_module("torchmetrics.functional.regression.tweedie_deviance") is not None

    def twin_of(metric: Any) -> Any:
        if tree_mode:  # the tree's modules are loaded under an alias that pickle cannot import (not the series')
            return copy.deepcopy(metric)
        return pickle.loads(pickle.dumps(copy.deepcopy(metric)))

    for make, data in (SYNC_FREE["kendall-c-t-test"], SYNC_FREE["tweedie-1.5"]):
        metric = make()
        for preds, target in data:
            metric.update(preds, target)
        expected = metric.compute()
        twin = twin_of(metric)
        with SyncProbe():
            twin._computed = None
            got = twin.compute()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with SyncProbe(), _instrumentation.simulated_copy_delay(None):
        metric.update(-data[0][0], data[0][1])
        twin = twin_of(metric)
        with pytest.raises(ValueError, match=r"For power=1.5, 'targets' has to be strictly positive"):
            twin.compute()


@pytest.mark.compile
def test_updates_and_kendall_compute_trace_without_a_graph_break() -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        preds, target = _positive(10)[0]
        for metric in (torchmetrics.LogCoshError(), torchmetrics.TweedieDevianceScore(power=1.5)):
            explanation = torch._dynamo.explain(lambda a, b, m=metric: m.update(a, b))(preds, target)
            assert graph_breaks(explanation) == []
        kendall = _kendall("c", True, "two-sided", outputs=3)()
        kendall.update(*rounded(10, 3, n=4)[0])
        explanation = torch._dynamo.explain(kendall.compute)()
        assert graph_breaks(explanation) == []
    torch._dynamo.reset()


def test_kendall_ties_and_distinct_counts_equal_stocks_for_random_ties() -> None:
    """A seeded sweep (sizes, tie structures, outputs): the device path's tie statistics equal stock's ``_get_ties``
    (ties to the bit; ``ties_p1``/``ties_p2`` too while tie groups stay below ~250) and its distinct counts equal
    stock's ``unique``."""
    from torchmetrics.functional.regression import kendall

    from torchmetrics_syncfree.regression.kendall import _distinct, _get_ties

    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        n = int(torch.randint(1, 200, (), generator=gen))
        outputs = int(torch.randint(1, 4, (), generator=gen))
        distinct = int(torch.randint(1, n + 1, (), generator=gen))
        values = torch.randint(0, distinct, (n, outputs), generator=gen).float() / 3
        ranks = kendall._convert_sequence_to_dense_rank(values, sort=True)
        expected = kendall._get_ties(ranks)
        with SyncProbe() as probe:
            got = _get_ties(ranks)
            count = _distinct(values)
        assert probe.count == 0
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e, rtol=0, atol=0)
        unique = torch.tensor([len(column.unique()) for column in values.T], dtype=values.dtype)
        torch.testing.assert_close(count, unique, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_merged_states_compute_as_stocks() -> None:
    """merge_state of two metrics updated apart: stock's merged value on the device path, and a pending Tweedie error
    travels with the merged counters (KendallRankCorrCoef has a full-state update: stock refuses to merge it)."""

    def merged(name: str) -> torch.Tensor:
        make, data = SYNC_FREE[name]
        first, second = make(), make()
        for i, (preds, target) in enumerate(data):
            (first if i < 2 else second).update(preds, target)
        first.merge_state(second)
        return first.compute()

    names = ("tweedie-1.5", "log-cosh")
    expected = [merged(name) for name in names]
    with torchmetrics_syncfree.patched(), SyncProbe():
        got = [merged(name) for name in names]
    for value, reference in zip(got, expected):
        torch.testing.assert_close(value, reference, rtol=0, atol=0)
    make, data = SYNC_FREE["tweedie-1.5"]
    with torchmetrics_syncfree.patched(), SyncProbe(), _instrumentation.simulated_copy_delay(None):
        first, second = make(), make()
        first.update(*data[0])
        second.update(-data[0][0], data[0][1])
        first.merge_state(second)
        with pytest.raises(ValueError, match=r"For power=1.5"):
            first.compute()


@pytest.mark.parametrize("power", [0.0, 1.0, 1.5])
def test_functional_tweedie_is_stocks_and_reads_at_most_once(power: float) -> None:
    """The functional ``tweedie_deviance_score`` on the device path: stock's value; power 0 reads nothing, the others
    read their one flag (stock: up to two reads, a copy, a mask write) and raise stock's error at once."""
    from torchmetrics.functional import tweedie_deviance_score

    preds, target = _positive(11, zeros=True)[-1]
    expected = tweedie_deviance_score(preds, target, power)
    with pytest.raises(ValueError) as stock_error:
        tweedie_deviance_score(-preds, target, 1.5)
    with torchmetrics_syncfree.patched(), SyncProbe() as probe:
        got = tweedie_deviance_score(preds, target, power)
        reads = probe.count
        with pytest.raises(ValueError) as error:
            tweedie_deviance_score(-preds, target, 1.5)
    assert reads == (0 if power == 0 else 1)
    assert str(error.value) == str(stock_error.value)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
