"""Bit parity with stock for inputs as they come out of a model: strided views, other float dtypes.

A column of a batch (``out[:, 0]``), a transposed (column-major) tensor, a view that steps over rows, a broadcast
(stride-0, ``expand``) tensor and a view at a storage offset hold the same numbers as a contiguous tensor, but a float
reduction adds them up in an order that depends on the layout: CPU kernels vectorise over unit-stride memory and
walk other layouts element by element, and a reduction over a dense tensor follows its memory order. A patched
update that sums a contiguous copy (``masked_fill``) where stock sums the caller's view, or the reverse, gives another
float32 result in the last bits (MeanMetric 0.19384102 vs stock's 0.19384104).

Every configuration of the audit catalogue that the patch covers runs here against stock with every layout and the
float dtypes float32, float16, bfloat16 and float64 (integer inputs keep their dtype; where stock rejects a dtype the
patched metric must raise the same exception type), on the CPU path and on the device path (the GPU code path,
forced on CPU tensors): ``forward`` of one batch, ``compute``, ``update`` with another batch, ``compute``. Each output
must be stock's to the bit (``torch.equal``, NaN where stock's is, dtype, shape and device).

Documented exceptions, each with its tolerance:

* AUROC/AveragePrecision/LogAUC computes, retrieval computes, Perplexity with ``ignore_index`` (on every path): float
  sums in another order (``docs/classification.md``, ``docs/retrieval.md``, ``docs/other-metrics.md``;
  the same tolerances as those areas' own parity tests), and AUROC's float32 result where stock's is float64;
  LogAUC next to tied scores is not compared (stock's interpolation there depends on its unstable sort, and may
  raise);
* device path, HingeLoss one-vs-all with column-major scores: the scores are normalised as stock does on an
  accelerator (``torch.where(..., softmax(preds), preds)``, a row-major tensor), so the per-class sums add in the
  order stock's take on an accelerator, not on CPU (``docs/classification.md``, HingeLoss);
* MatthewsCorrCoef is always float32 (stock: int64 for a perfect or inverted matrix);
* device path, ``MeanMetric``/``SumMetric`` with ``"warn"``/``"ignore"`` on a batch that holds NaN: stock drops the
  NaN entries (a data-dependent shape) and sums the rest in another order (``docs/families.md``, deviations);
  ``CatMetric``'s ``forward`` keeps them in its batch value. Without NaN, and on the CPU path with NaN, bit parity.

Runtime: ~45 s in one process on the project's 2-core machine (~100 configurations x 28 layouts and dtypes, plus 7
NaN cases per aggregator, x 2 paths); each configuration is one test, so ``-n 2`` halves it.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._pytree import tree_map

import torchmetrics_syncfree
from tests._aggregation_cases import TM_GE_1_7
from torchmetrics_syncfree import SyncProbe, _instrumentation
from torchmetrics_syncfree.tools import audit

#: every catalogue configuration through a matrix (CI's tree mode leaves it out: the layer runs it on every release)
pytestmark = pytest.mark.catalogue_matrix

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
PATHS = ("cpu", "device")
#: batch sizes: the catalogue's, one below a CPU vector's width, and an odd one past several vectors (tails)
BATCHES = (32, 7, 97)


def _column(x: Tensor) -> Tensor:
    """``x`` as the middle column of a batch with one more dimension (``out[..., 1]``): every stride times 3."""
    base = torch.zeros(*x.shape, 3, dtype=x.dtype)
    base[..., 1] = x
    return base[..., 1]


def _stepped(x: Tensor) -> Tensor:
    """``x`` as every second row of a taller tensor (``y[::2]``)."""
    base = torch.zeros(2 * x.shape[0], *x.shape[1:], dtype=x.dtype)
    base[::2] = x
    return base[::2]


def _reversed_dims(x: Tensor) -> Tensor:
    """``x`` with its dimensions stored in reverse order (a transposed, column-major tensor): dense, not contiguous."""
    dims = tuple(reversed(range(x.ndim)))
    return x.permute(dims).contiguous().permute(dims)


def _expanded(x: Tensor) -> Tensor:
    """The first sample of ``x`` broadcast over the batch (stride 0): every sample the same."""
    return x[:1].expand_as(x)


def _offset(x: Tensor) -> Tensor:
    """``x`` one element into its storage: contiguous, at another alignment."""
    base = torch.zeros(x.numel() + 1, dtype=x.dtype)
    base[1:] = x.reshape(-1)
    return base[1:].view(x.shape)


def _reversed_column(x: Tensor) -> Tensor:
    """Neither dense nor in row-major order: a column of a column-major batch."""
    dims = tuple(reversed(range(x.ndim)))
    return _column(x.permute(dims).contiguous()).permute(dims)


#: layout -> (make, needs at least 2 dimensions)
LAYOUTS: dict[str, tuple[Callable[[Tensor], Tensor], bool]] = {
    "contiguous": (lambda x: x, False),
    "column": (_column, False),
    "stepped": (_stepped, False),
    "transposed": (_reversed_dims, True),
    "expanded": (_expanded, False),
    "offset": (_offset, False),
    "transposed-column": (_reversed_column, True),
}
#: input kinds of the aggregators: any shape is theirs, so a batch becomes (batch / 4, 4) for the 2-D layouts
_AGGREGATOR_INPUTS = ("vector", "weighted")


def _configs() -> list[audit.Config]:
    return [config for config in audit.CATALOGUE if config.covered]


def _inputs(config: audit.Config, metric: Any, case: tuple, seed: int) -> tuple[tuple, dict] | None:
    """The update arguments of ``case`` (layout, dtype, batch, with NaN), or ``None`` if the layout does not apply."""
    layout, dtype, batch, with_nan = case
    args, kwargs = audit.make_inputs(config.inputs, metric, torch.device("cpu"), seed=seed, batch=batch)
    make, needs_2d = LAYOUTS[layout]
    reshape = needs_2d and config.inputs in _AGGREGATOR_INPUTS

    def convert(x: Any, nan_every: int) -> Any:
        if not isinstance(x, Tensor):
            return x
        if x.is_floating_point():
            x = x.to(dtype)
            if with_nan:
                x = x.clone()
                x.view(-1)[seed % nan_every :: nan_every] = float("nan")
        if reshape:
            x = x.reshape(-1, 4)
        return make(x) if x.ndim >= (2 if needs_2d else 1) else x

    converted = (tuple(convert(a, 5) for a in args), {k: convert(v, 11) for k, v in kwargs.items()})
    tensors = [x for x in (*converted[0], *converted[1].values()) if isinstance(x, Tensor)]
    if needs_2d and not any(x.ndim >= 2 for x in tensors):
        return None  # nothing to transpose: the contiguous case already ran
    return converted


def _run(config: audit.Config, case: tuple) -> list[tuple[str, Any]] | None:
    """``forward``, ``compute``, ``update``, ``compute``: each output or exception type, up to the first raise."""
    metric = audit.build_metric(config.spec)
    outcomes: list[tuple[str, Any]] = []
    for seed, call in enumerate(("forward", "compute", "update", "compute")):
        try:
            if call == "compute":
                output = metric.compute()
            else:
                inputs = _inputs(config, metric, case, seed)
                if inputs is None:
                    return None
                args, kwargs = inputs
                output = metric(*args, **kwargs) if call == "forward" else metric.update(*args, **kwargs)
        except Exception as err:  # stock's exception is part of the outcome
            outcomes.append(("raised", type(err)))
            return outcomes
        outcomes.append((call, _detached(output)))
    return outcomes


def _detached(output: Any) -> Any:
    """A copy of ``output``'s tensors (lists, tuples and dicts of them too), safe from later in-place updates."""
    return tree_map(lambda x: x.detach().clone() if isinstance(x, Tensor) else x, output)


@contextlib.contextmanager
def _path(path: str) -> Iterator[None]:
    _instrumentation.force_device_path(path == "device")
    try:
        yield
    finally:
        _instrumentation.force_device_path(False)


#: areas whose computes sum in another order than stock's on every device (documented), and the tolerance of their
#: own parity tests
_SUMMED_RTOL = {"retrieval": 1e-6, "retrieval_fall_out": 1e-6}
#: the areas under the curve: one fixed-shape compute on every device, summing in another order than stock's; its
#: rates are float32 whatever the scores' dtype (``docs/classification.md``, deviations)
_CURVE_AREAS = ("auroc", "average_precision", "logauc")
#: Perplexity with ``ignore_index`` (``tests/test_perplexity.py``)
_PERPLEXITY_RTOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 2e-3}


def _tolerance(config: audit.Config, strategy: Any, case: tuple, path: str) -> tuple[float | None, bool]:
    """(rtol, float32 allowed for stock's float64/int64) of ``config`` in ``case`` on ``path``; (0, False): to the bit.

    ``None``: not compared (the documented deviation of LogAUC next to tied scores, where stock may also raise).
    """
    if config.spec.startswith("MatthewsCorrCoef"):
        # always float32; stock's is int64 for a perfect or inverted matrix (``docs/classification.md``, deviations)
        return 0.0, True
    if case[3] and strategy in ("warn", "ignore") and config.spec.startswith(("Mean", "Sum")):
        return 1e-5, False  # stock drops the NaN entries and sums the rest in another order (on every path)
    if config.area == "perplexity" and "ignore_index=None" not in config.spec:
        return _PERPLEXITY_RTOL[case[1]], False  # every position summed, the ignored adding 0 (on every path)
    if config.area == "logauc" and _tied_scores(config, case):
        # stock's interpolation next to a vertical run of the curve depends on its unstable sort, the patched one
        # follows the curve (docs/classification.md; tests/test_curve_computes.py compares with a stable sort)
        return None, True
    if config.area in _CURVE_AREAS:
        return 1e-6, True
    if config.area in _SUMMED_RTOL:
        return _SUMMED_RTOL[config.area], False
    if path != "device":
        return 0.0, False
    if config.area == "hinge" and "one-vs-all" in config.spec and case[0] in ("transposed", "transposed-column"):
        # the device path normalises the scores as stock does on an accelerator (``torch.where(any_logits,
        # softmax(preds), preds)``: a row-major tensor); stock on CPU keeps the caller's column-major probabilities,
        # and sums the per-class losses in that order (``docs/classification.md``, HingeLoss)
        return 1e-6, False
    return 0.0, False


def _tied_scores(config: audit.Config, case: tuple) -> bool:
    """Whether a class's scores in the batches of ``case`` repeat a value."""
    metric = audit.build_metric(config.spec)
    for seed in (0, 2):  # forward's and update's batches
        preds = _inputs(config, metric, case, seed)[0][0].float()
        ordered = preds.movedim(1, -1).reshape(-1, preds.shape[1]).sort(dim=0).values
        if (ordered[1:] == ordered[:-1]).any():
            return True
    return False


def _assert_same(patched: Any, stock: Any, where: str, rtol: float, float32_ok: bool, drop_nan: bool) -> None:
    if isinstance(stock, Tensor):
        assert isinstance(patched, Tensor), where
        if drop_nan and patched.isnan().any():
            patched = patched[~patched.isnan()]
            if not patched.numel():  # stock's forward of a batch without a value: the empty list state
                assert stock == [], where
                return
        if float32_ok and stock.dtype in (torch.float64, torch.int64) and patched.dtype == torch.float32:
            stock = stock.float()
        assert (patched.dtype, patched.shape, patched.device) == (stock.dtype, stock.shape, stock.device), (
            f"{where}: {patched.dtype} {tuple(patched.shape)} {patched.device}, stock {stock.dtype}"
            f" {tuple(stock.shape)} {stock.device}"
        )
        if rtol:
            torch.testing.assert_close(patched, stock, rtol=rtol, atol=0, equal_nan=True, msg=lambda m: f"{where}: {m}")
            return
        same = torch.equal(patched.isnan(), stock.isnan()) and torch.equal(patched.nan_to_num(), stock.nan_to_num())
        assert same, (
            f"{where}: {patched} != stock's {stock} (difference {(patched.double() - stock.double()).abs().max()})"
        )
    elif isinstance(stock, (list, tuple)):
        if drop_nan and isinstance(patched, Tensor) and patched.isnan().all() and stock == []:
            return  # stock dropped every entry of the batch: the empty list state
        assert type(patched) is type(stock) and len(patched) == len(stock), f"{where}: {patched!r} vs {stock!r}"
        for i, (p, s) in enumerate(zip(patched, stock)):
            _assert_same(p, s, f"{where}[{i}]", rtol, float32_ok, drop_nan)
    elif isinstance(stock, dict):
        assert patched.keys() == stock.keys(), where
        for key in stock:
            _assert_same(patched[key], stock[key], f"{where}[{key!r}]", rtol, float32_ok, drop_nan)
    else:
        assert patched == stock, f"{where}: {patched!r} != stock's {stock!r}"


def _cases(config: audit.Config, strategy: Any) -> list[tuple]:
    """Every layout x float dtype, each at a batch size drawn with a seed of its own; NaN cases for aggregators."""
    rng = random.Random(config.label)
    cases = [(layout, dtype, rng.choice(BATCHES), False) for layout, dtype in itertools.product(LAYOUTS, FLOAT_DTYPES)]
    # torchmetrics 1.6 imputes the fill weight into every entry of its broadcast default weight (a deviation)
    documented = isinstance(strategy, float) and config.spec.startswith("Mean") and not TM_GE_1_7
    if config.inputs in _AGGREGATOR_INPUTS and not documented:
        # with NaN: stock's result is defined by the strategy (left out, imputed, raised or propagated)
        cases += [(layout, rng.choice(FLOAT_DTYPES), rng.choice(BATCHES), True) for layout in LAYOUTS]
    return [
        (layout, dtype, 4 * (batch // 4 or 1) if config.inputs in _AGGREGATOR_INPUTS else batch, nan)
        for layout, dtype, batch, nan in cases
    ]


@pytest.mark.parametrize("config", [pytest.param(c, id=c.label) for c in _configs()])
def test_strided_and_dtype_inputs_match_stock_to_the_bit(config: audit.Config) -> None:
    strategy = getattr(audit.build_metric(config.spec), "nan_strategy", None)
    cases = _cases(config, strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # which warnings reach the user is tested per area
        stock = {case: _run(config, case) for case in cases}
        failures = []
        with torchmetrics_syncfree.patched():
            for path in PATHS:
                with _path(path):
                    for case in cases:
                        if stock[case] is None:
                            continue
                        try:
                            _compare(config, strategy, case, path, _run(config, case), stock[case])
                        except AssertionError as err:
                            failures.append(f"{path} {case[0]} {case[1]} batch {case[2]}{' NaN' * case[3]}: {err}")
    assert not failures, f"{len(failures)} of {2 * len(cases)} cases differ from stock:\n" + "\n".join(failures[:8])


def _compare(config: audit.Config, strategy: Any, case: tuple, path: str, patched: list, stock: list) -> None:
    rtol, float32_ok = _tolerance(config, strategy, case, path)
    if rtol is None:  # a documented deviation where stock itself depends on its sort (it may even raise)
        return
    steps = [kind for kind, _ in stock]
    assert [kind for kind, _ in patched] == steps, f"steps {[k for k, _ in patched]}, stock {steps}"
    # the device path's CatMetric forward keeps NaN entries in its batch value (documented deviation)
    cat_keeps_nan = (
        path == "device" and config.spec.startswith("CatMetric") and case[3] and strategy in ("warn", "ignore")
    )
    for (kind, value), (_, stock_value) in zip(patched, stock):
        if kind == "raised":
            assert value is stock_value, f"raised {value.__name__}, stock {stock_value.__name__}"
        else:
            _assert_same(value, stock_value, kind, rtol, float32_ok, drop_nan=cat_keeps_nan and kind == "forward")


@pytest.mark.parametrize("config", [pytest.param(c, id=c.label) for c in _configs() if c.inputs in _AGGREGATOR_INPUTS])
def test_strided_and_dtype_updates_of_aggregators_do_not_sync(config: audit.Config) -> None:
    """The layouts' own steps (copies with the caller's strides, ``nansum``, the sums of broadcast weights) read
    nothing on the device path: every layout and dtype, with and without NaN, ``update`` and ``forward``."""
    strategy = getattr(audit.build_metric(config.spec), "nan_strategy", None)
    # a GPU whose copy of the check counters has not arrived: "error" reports at compute(), outside the probe
    with torchmetrics_syncfree.patched(), warnings.catch_warnings(), _instrumentation.simulated_copy_delay(None):
        warnings.simplefilter("ignore")
        for case in _cases(config, strategy):
            metric = audit.build_metric(config.spec)
            inputs = [_inputs(config, metric, case, seed) for seed in (0, 2)]
            if inputs[0] is None:
                continue
            with SyncProbe() as probe:
                metric(*inputs[0][0], **inputs[0][1])
                metric.update(*inputs[1][0], **inputs[1][1])
            assert probe.count == 0, f"{case}: {probe.summary()}"
