"""Patched aggregation metrics give stock's results, warnings and errors; deliberate deviations are pinned here."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchmetrics.aggregation import CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric

import torchmetrics_syncfree
from tests._aggregation_cases import (
    AGGREGATORS,
    INF,
    NAN,
    STRATEGIES,
    TM_GE_1_7,
    assert_same_outcome,
    has_nan,
    run_stream,
    stock_is_wrong,
)
from tests.conftest import cuda
from torchmetrics_syncfree import _instrumentation
from torchmetrics_syncfree.probe import SyncProbe

t = torch.tensor
_g = torch.Generator().manual_seed(7)

STREAMS = {
    "python-scalars": [(0.5,), (2,), (-1.25,), (True,)],
    "0-dim": [(t(0.5),), (t(-3.0),), (t(7.25),)],
    "1-D": [(torch.rand(5, generator=_g),), (torch.rand(3, generator=_g) - 0.5,)],
    "N-D": [(torch.rand(2, 3, 4, generator=_g),), (torch.randn(2, 3, 4, generator=_g),)],
    "int-tensor": [(t([1, 2, 3]),), (t([4]),)],
    "float64-tensor": [(torch.rand(4, dtype=torch.float64, generator=_g),)],
    "empty": [(t([]),), (t([1.0, 2.0]),), (t([]),)],
    "nan-values": [(t([1.0, NAN, 3.0]),), (t([2.0, 4.0]),)],
    "nan-scalar": [(NAN,), (1.0,), (t(NAN),), (3.0,)],
    "all-nan-batch": [(t([2.0, 3.0]),), (t([NAN, NAN]),)],
    "inf-values": [(t([1.0, INF, -2.0]),), (t([-INF, 0.5]),)],
    "nan-in-N-D": [(t([[1.0, NAN], [3.0, 4.0]]),), (t([[5.0, 6.0], [7.0, 8.0]]),)],
    # stock flattens only the batches it takes NaN out of: a 0-dim batch and a 2-D one with NaN concatenate
    "0-dim-then-nan-in-N-D": [(t(1.0),), (t([[2.0, NAN], [3.0, 4.0]]),)],
    "python-ints-beyond-int64": [(2**70,), (-(2**63) - 1,), (2**64,)],
    "float16-nan": [(t([NAN, 1.5, 2.0], dtype=torch.float16),), (t([0.5], dtype=torch.float16),)],
}
WEIGHTED_STREAMS = {
    "weight-vector": [(t([1.0, 2.0, 3.0]), t([3.0, 1.0, 0.5])), (t([4.0]), t([2.0]))],
    "python-weight": [(t([1.0, 2.0]), 2.0), (t([3.0]), 0.5)],
    "0-dim-weight": [(t([1.0, 2.0, 3.0]), t(2.0)), (t([5.0]), t(1.0))],
    "broadcast-weight": [(torch.rand(2, 3, generator=_g), t([1.0, 2.0, 3.0]))],
    "nan-weights": [(t([1.0, 2.0, 3.0]), t([1.0, NAN, 2.0])), (t([4.0, 5.0]), t([1.0, 1.0]))],
    "nan-value-and-weight-vector": [(t([1.0, NAN, 3.0]), t([2.0, 2.0, 2.0]))],
    "nan-value-0-dim-weight": [(t([1.0, NAN, 3.0]), t(2.0))],
    "zero-weights": [(t([1.0, 2.0]), t([0.0, 0.0])), (t([3.0]), t([1.0]))],
    "python-scalar-both": [(0.5, 2.0), (1.5, 1.0)],
    "python-weights-beyond-int64": [(t([1.0, 2.0]), 2**64), (t([3.0]), -(2**63) - 1)],
    # a float strategy imputes in the input's dtype, before the cast: 2.5 becomes 2 in an integer value tensor
    "int-value-nan-weight": [(t([3]), t([NAN])), (t([1, 2]), t([1.0, 0.5]))],
}


def _cases():
    for cls in AGGREGATORS:
        streams = dict(STREAMS, **(WEIGHTED_STREAMS if cls is MeanMetric else {}))
        for name, stream in streams.items():
            for strategy in STRATEGIES:
                if stock_is_wrong(cls, strategy, stream):
                    continue
                yield pytest.param(cls, strategy, stream, id=f"{cls.__name__}-{strategy}-{name}")


@pytest.mark.parametrize(("metric_cls", "strategy", "stream"), list(_cases()))
@pytest.mark.parametrize("use_forward", [False, True], ids=["update", "forward"])
@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-path", "device-path"])
def test_same_results_warnings_and_errors_as_stock(metric_cls, strategy, stream, use_forward, device_path):
    stock = run_stream(metric_cls, strategy, stream, patched=False, use_forward=use_forward)
    patched = run_stream(metric_cls, strategy, stream, patched=True, use_forward=use_forward, device_path=device_path)
    # bit-equal unless stock removed NaN entries and so summed other elements in another order
    exact = not has_nan(stream) or isinstance(strategy, float) or strategy in ("disable", "error")
    if device_path and use_forward and metric_cls.full_state_update:
        # stock warns from both updates of a full-state forward; the device path once per offending forward
        stock.warnings = stock.warnings[::2]
    if device_path and use_forward and metric_cls is CatMetric and strategy in ("ignore", "warn", "error"):
        # the batch value of forward() keeps NaN entries on the device path (see test_cat_forward_keeps_nan_on_device)
        patched.values[:-1] = [_drop_nan(v) for v in patched.values[:-1]]
    assert_same_outcome(stock, patched, exact=exact, deferred=device_path)


def _drop_nan(value):
    if not isinstance(value, torch.Tensor) or not value.isnan().any():
        return value
    kept = value[~value.isnan()]
    return kept if kept.numel() else []


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize(("metric_cls", "strategy", "stream"), [c for c in _cases() if "N-D" in c.id or "nan" in c.id])
@pytest.mark.parametrize("use_forward", [False, True], ids=["update", "forward"])
def test_same_results_as_stock_on_cuda(metric_cls, strategy, stream, use_forward):
    stock = run_stream(metric_cls, strategy, stream, patched=False, use_forward=use_forward, device="cuda")
    patched = run_stream(metric_cls, strategy, stream, patched=True, use_forward=use_forward, device="cuda")
    if strategy == "error" and stock.error is not None:
        # on CUDA the error surfaces asynchronously: at the next update or compute(), never later
        assert patched.error is not None and patched.error[:2] == stock.error[:2]
        assert stock.error[2] <= patched.error[2] <= len(stream)
        return
    assert_same_outcome(stock, patched, exact=not has_nan(stream))


@cuda
@pytest.mark.cuda
def test_cpu_scalar_tensor_into_a_cuda_metric_is_used_as_a_scalar():
    step_time = torch.tensor(0.125)  # e.g. a step time measured on the host
    with torchmetrics_syncfree.patched():
        metric = MeanMetric().cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            metric.update(step_time)
            metric.update(0.375)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert metric.compute().item() == 0.25


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
def test_same_results_with_float64_default_dtype(metric_cls):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        stream = [(t([1.0, 2.0, NAN]),), (0.1,), (t(3.0),)]
        stock = run_stream(metric_cls, "ignore", stream, patched=False)
        patched = run_stream(metric_cls, "ignore", stream, patched=True)
    finally:
        torch.set_default_dtype(previous)
    assert patched.values[-1].dtype == torch.float64
    assert_same_outcome(stock, patched, exact=False)


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_inputs_are_never_written(metric_cls, strategy):
    value, weight = t([1.0, NAN, 3.0]), t([1.0, 1.0, NAN])
    kept_value, kept_weight = value.clone(), weight.clone()
    with torchmetrics_syncfree.patched(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = metric_cls(nan_strategy=strategy)
        args = (value, weight) if metric_cls is MeanMetric else (value,)
        try:
            metric.update(*args)
        except RuntimeError:
            assert strategy == "error"
    assert torch.equal(value.isnan(), kept_value.isnan())
    torch.testing.assert_close(value, kept_value, equal_nan=True)
    torch.testing.assert_close(weight, kept_weight, equal_nan=True)


# Deliberate deviations: stock is wrong in these cases, the patched metric does what the documentation says.


def test_float_strategy_with_broadcast_weight_imputes_only_the_nan_positions():
    with torchmetrics_syncfree.patched():
        metric = MeanMetric(nan_strategy=0.0)
        metric.update(t([1.0, NAN, 3.0]), t(2.0))
        # value [1, 0, 3] with weights [2, w, 2] where the NaN position gets the fill weight
        fill_weight = 1.0 if TM_GE_1_7 else 0.0
        expected = (2.0 + 0.0 + 6.0) / (4.0 + fill_weight)
        torch.testing.assert_close(metric.compute(), t(expected))
    if TM_GE_1_7:  # the documented bug: stock overwrites the broadcast weight and returns 4/3
        stock = MeanMetric(nan_strategy=0.0)
        stock.update(t([1.0, NAN, 3.0]), t(2.0))
        torch.testing.assert_close(stock.compute(), t(4.0 / 3.0))


def test_float_strategy_does_not_write_the_callers_tensor_where_stock_does():
    value = t([1.0, NAN, 3.0])
    MeanMetric(nan_strategy=5.0).update(value)
    assert value[1] == 5.0, "stock writes the fill value into the caller's tensor"
    value = t([1.0, NAN, 3.0])
    with torchmetrics_syncfree.patched():
        metric = MeanMetric(nan_strategy=5.0)
        metric.update(value)
    assert torch.isnan(value[1])
    # values [1, 5, 3]; the imputed position weighs 1 (1.7+) or the fill value (1.6)
    expected = 3.0 if TM_GE_1_7 else (1.0 + 25.0 + 3.0) / 7.0
    torch.testing.assert_close(metric.compute(), t(expected))


@pytest.mark.skipif(not TM_GE_1_7, reason='"disable" arrived in torchmetrics 1.7')
def test_disable_applies_the_weights():
    value, weight = t([1.0, 3.0]), t([3.0, 1.0])
    stock = MeanMetric(nan_strategy="disable")
    stock.update(value, weight)
    torch.testing.assert_close(stock.compute(), t(2.0), msg="stock ignores the weights")
    with torchmetrics_syncfree.patched():
        metric = MeanMetric(nan_strategy="disable")
        metric.update(value, weight)
    torch.testing.assert_close(metric.compute(), t(1.5))


# Deferred reporting: what a GPU run does, simulated by the CPU probe.


@pytest.mark.parametrize("delay", [0, 1], ids=["copy-arrives-at-once", "copy-one-step-behind"])
def test_error_on_the_device_path_leaves_the_batch_out_and_loses_nothing(delay):
    """The error surfaces at the end of the offending update, or of a later one on a GPU that lags: never before
    that update's own work is done, and the NaN batch never reaches the state."""
    batches = [t([1.0, 2.0]), t([NAN, 5.0]), t([3.0]), t([4.0])]
    raised_at = []
    with torchmetrics_syncfree.patched(), _instrumentation.simulated_copy_delay(delay):
        metric = MeanMetric(nan_strategy="error")
        with SyncProbe() as probe:
            for step, batch in enumerate(batches):
                try:
                    metric.update(batch)
                except RuntimeError as err:
                    assert "Encountered `nan` values in tensor" in str(err)
                    raised_at.append(step)
        assert probe.count == 0, probe.summary()
        assert raised_at == [1 + delay], "reported once, by the first sweep that has the copy"
        torch.testing.assert_close(metric.compute(), t((1.0 + 2.0 + 3.0 + 4.0) / 4))


def test_error_on_the_device_path_surfaces_at_compute_at_the_latest():
    batch, clean = t([NAN]), t([2.0])
    with torchmetrics_syncfree.patched(), _instrumentation.simulated_copy_delay(None):
        metric = SumMetric(nan_strategy="error")
        with SyncProbe() as probe:
            metric.update(batch)
            metric.update(clean)
            with pytest.raises(RuntimeError, match="Encountered `nan` values in tensor"):
                metric.compute()
            value = metric.compute()
        assert value == 2.0, "reported once; the state is intact"
    assert [event.kind for event in probe.events] == ["host wait"], "compute() is the one place that may wait"


@pytest.mark.parametrize("delay", [0, 1, None])
def test_warnings_on_the_device_path_are_never_lost(delay):
    batch = t([NAN, 1.0])
    with (
        torchmetrics_syncfree.patched(),
        pytest.warns(UserWarning) as caught,
        _instrumentation.simulated_copy_delay(delay),
    ):
        metric = MaxMetric(nan_strategy="warn")
        with SyncProbe() as probe:
            for _ in range(3):
                metric(batch)  # forward reads nothing inside; at its end what has arrived is reported
        assert probe.count == 0, probe.summary()
        assert metric.compute() == 1.0
    # one per offending forward (stock warns twice per forward of a full-state metric: it updates twice)
    assert sum("Will be removed" in str(w.message) for w in caught) == 3


def test_cpu_reports_immediately_like_stock():
    with torchmetrics_syncfree.patched():
        metric = MinMetric(nan_strategy="error")
        with pytest.raises(RuntimeError, match="Encountered `nan` values in tensor"):
            metric.update(t([NAN]))
        with pytest.warns(UserWarning, match="Will be removed"):
            MinMetric(nan_strategy="warn").update(t([NAN]))


@pytest.mark.parametrize("strategy", ["ignore", "warn"])
def test_cat_forward_keeps_nan_on_device_and_reads_nothing_on_clean_data(strategy):
    """Deviation: dropping NaN entries from forward()'s batch value would read the device on every forward (its
    size depends on the data). On the device path forward() returns the batch as given; compute() drops them."""
    clean, dirty = t([1.0, 2.0]), t([3.0, NAN])
    with torchmetrics_syncfree.patched(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = CatMetric(nan_strategy=strategy)
        with SyncProbe() as probe:
            clean_value = metric(clean)
            dirty_value = metric(dirty)
        assert probe.count == 0, probe.summary()
        torch.testing.assert_close(clean_value, clean)
        torch.testing.assert_close(dirty_value, dirty, equal_nan=True)
        torch.testing.assert_close(metric.compute(), t([1.0, 2.0, 3.0]))
        cpu = CatMetric(nan_strategy=strategy)  # where reads are free, stock's batch value
        torch.testing.assert_close(cpu(dirty), t(3.0))  # a one-element value is squeezed, as stock does


def test_cat_metric_keeps_nan_in_state_and_drops_it_in_compute():
    with torchmetrics_syncfree.patched():
        metric = CatMetric(nan_strategy="ignore")
        metric.update(t([1.0, NAN]))
        metric.update(t([2.0]))
        assert torch.isnan(metric.value[0][1])
        torch.testing.assert_close(metric.compute(), t([1.0, 2.0]))


# Bad input gets what stock gives.


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
def test_invalid_nan_strategy_is_the_same_value_error(metric_cls):
    with pytest.raises(ValueError) as stock:
        metric_cls(nan_strategy="sometimes")
    with torchmetrics_syncfree.patched(), pytest.raises(ValueError) as patched:
        metric_cls(nan_strategy="sometimes")
    assert str(patched.value) == str(stock.value)


def test_weights_that_do_not_broadcast_name_the_shapes():
    stock = run_stream(MeanMetric, "warn", [(t([1.0, 2.0, 3.0]), t([1.0, 2.0]))], patched=False)
    patched = run_stream(MeanMetric, "warn", [(t([1.0, 2.0, 3.0]), t([1.0, 2.0]))], patched=True)
    assert patched.error == stock.error
    assert "3" in patched.error[1] and "2" in patched.error[1]


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
@pytest.mark.parametrize("bad", ["abc", None, ["a", "b"], object()], ids=["str", "None", "str-list", "object"])
def test_non_numeric_values_raise_the_same_exception_type(metric_cls, bad):
    def raised(patched: bool) -> type:
        context = torchmetrics_syncfree.patched() if patched else warnings.catch_warnings()
        with context:
            try:
                metric_cls().update(bad)
            except Exception as err:
                return type(err)
        return type(None)

    assert raised(patched=True) is raised(patched=False) is not type(None)


# Property-based: random update streams give stock's compute() and never write their inputs.

_values = st.lists(
    st.one_of(st.floats(-1e3, 1e3, width=32), st.just(NAN), st.just(INF), st.just(-INF)), min_size=0, max_size=6
)
_weights = st.lists(st.one_of(st.floats(0, 10, width=32), st.just(NAN)), min_size=1, max_size=1)


@st.composite
def _update_streams(draw):
    metric_cls = draw(st.sampled_from(AGGREGATORS))
    strategy = draw(st.sampled_from(STRATEGIES))
    stream = []
    for values in draw(st.lists(_values, min_size=1, max_size=5)):
        value = t(values, dtype=torch.float32)
        if metric_cls is MeanMetric and draw(st.booleans()):
            weight = t(
                draw(st.lists(st.floats(0, 10, width=32) | st.just(NAN), min_size=len(values), max_size=len(values)))
            )
            stream.append((value, weight))
        else:
            stream.append((value,))
    return metric_cls, strategy, stream


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_update_streams())
def test_random_update_streams_match_stock(case):
    metric_cls, strategy, stream = case
    if stock_is_wrong(metric_cls, strategy, stream):
        return
    originals = [tuple(a.clone() for a in args) for args in stream]
    patched = run_stream(metric_cls, strategy, stream, patched=True)
    stock = run_stream(metric_cls, strategy, stream, patched=False)
    assert_same_outcome(stock, patched, exact=False)
    for args, kept in zip(stream, originals):
        for a, b in zip(args, kept):
            torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
@pytest.mark.parametrize("fill", [0.1, 1e5], ids=["rounded-in-float16", "overflows-float16"])
@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-path", "device-path"])
def test_float_strategy_imputes_in_the_input_dtype_as_stock(metric_cls, fill, device_path):
    """Stock writes the fill into the input before casting it: 0.1 is 0.0999756 in float16, 1e5 is inf there."""
    stream = [(t([NAN, 1.0], dtype=torch.float16),)]
    if stock_is_wrong(metric_cls, fill, stream):
        pytest.skip("1.6 imputes the fill weight into every entry of its broadcast default weight (a deviation)")
    stock = run_stream(metric_cls, fill, stream, patched=False)
    patched = run_stream(metric_cls, fill, stream, patched=True, device_path=device_path)
    assert_same_outcome(stock, patched, exact=True)


def _fill_overflow_run(metric_cls: type, patched: bool, delay: int | None) -> tuple[list[str], object]:
    """Three half-precision batches, the second with NaN, a fill of 1e5: each error's text, then the value."""
    batches = [t([1.0, 2.0], dtype=torch.float16), t([NAN, 4.0], dtype=torch.float16), t([3.0], dtype=torch.float16)]
    errors = []
    context = torchmetrics_syncfree.patched() if patched else contextlib.nullcontext()
    with (
        context,
        _instrumentation.simulated_copy_delay(delay),
        SyncProbe() if delay != "cpu" else contextlib.nullcontext(),
    ):
        metric = metric_cls(nan_strategy=1e5)
        for batch in batches:
            try:
                metric.update(batch.clone())
            except RuntimeError as err:
                errors.append(str(err))
        for _ in range(2):  # the second compute() after an error reported by the first
            try:
                return errors, metric.compute()
            except RuntimeError as err:
                errors.append(str(err))
    raise AssertionError("compute() raised twice")


@pytest.mark.parametrize("metric_cls", AGGREGATORS)
@pytest.mark.parametrize("delay", ["cpu", 0, None], ids=["cpu-path", "copy-arrived", "copy-in-flight"])
def test_a_fill_the_input_dtype_cannot_hold_fails_as_stock(metric_cls, delay):
    """Where this torch build raises writing 1e5 into float16 (most builds do), a batch with NaN raises stock's error,
    once, and never reaches the state; the batches without NaN count. On the device path the error comes at an eager
    point (the end of the update, or ``compute()`` while the copy is in flight)."""
    stock_errors, stock_value = _fill_overflow_run(metric_cls, patched=False, delay="cpu")
    errors, value = _fill_overflow_run(metric_cls, patched=True, delay=delay)
    assert errors == stock_errors
    torch.testing.assert_close(value, stock_value, rtol=0, atol=0, equal_nan=True)
    if stock_errors:  # a build that raises: the batch with NaN is not in the value
        assert len(stock_errors) == 1
        assert "without overflow" in stock_errors[0]


def test_which_dtypes_refuse_an_overflowing_fill_is_this_builds():
    from torchmetrics_syncfree.aggregation import _FILL_OVERFLOW

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.zeros(1, dtype=dtype)
        try:
            x[t([True])] = 1e39
        except RuntimeError as err:
            assert _FILL_OVERFLOW[dtype].message == str(err)
        else:
            assert dtype not in _FILL_OVERFLOW


@pytest.mark.parametrize("strategy", ["ignore", "warn"])
@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-path", "device-path"])
def test_gradient_of_a_value_whose_weight_is_nan_is_stocks(strategy, device_path):
    """Stock drops the entry, so its value gets gradient 0; a masked product ``value * nan`` would give NaN. (A float
    strategy: stock writes the fill into the leaf tensor and fails; patched never writes its inputs.)"""
    grads = []
    for patched in (False, True):
        value = t([1.0, 2.0, 3.0], requires_grad=True)
        context = torchmetrics_syncfree.patched() if patched else contextlib.nullcontext()
        with context, SyncProbe() if patched and device_path else contextlib.nullcontext(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric = MeanMetric(nan_strategy=strategy)
            metric(value, t([1.0, NAN, 2.0])).backward()
        grads.append(value.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


@pytest.mark.parametrize("strategy", ["warn", "ignore"])
@pytest.mark.parametrize(
    ("metric_cls", "weighted"),
    [(SumMetric, False), (MeanMetric, False), (MeanMetric, True)],
    ids=["SumMetric", "MeanMetric-unit-weights", "MeanMetric-weights"],
)
def test_a_batch_with_nan_adds_the_same_bits_on_every_device(metric_cls, weighted, strategy):
    """One implementation: the CPU and the device path add a batch's kept entries in the same order.

    Stock compacts the kept entries into a new tensor (a data-dependent shape) and sums that; the patched update adds
    them where they are, NaN entries adding 0, on every device. Over thousands of entries the two orders differ in
    the last bits (a deviation within float rounding, ``exact=False`` in the parity tests); the paths do not.
    """
    generator = torch.Generator().manual_seed(3)
    value = torch.randn(4099, generator=generator) * 1000
    value[::7] = NAN
    args = (value, torch.rand(4099, generator=generator)) if weighted else (value,)
    cpu = run_stream(metric_cls, strategy, [args], patched=True)
    device = run_stream(metric_cls, strategy, [args], patched=True, device_path=True)
    stock = run_stream(metric_cls, strategy, [args], patched=False)
    assert torch.equal(cpu.values[-1], device.values[-1])
    torch.testing.assert_close(cpu.values[-1], stock.values[-1], rtol=1e-6, atol=0.0)
