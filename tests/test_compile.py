"""Patched updates under ``torch.compile``: no graph break, a compiled training step, reports at eager points.

While ``torch.compile`` traces, the patched code takes the device path on every device (no host reads): checks are
counted in the metric's check counters and reported by ``compute()``/``reset()`` once the step is back in eager code.
``patch_all()`` also sets ``torch._dynamo.config.allow_unspec_int_on_nn_module``, so that ``Metric``'s update counter
(an int attribute of the module) does not recompile the step on every call (a known upstream problem).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

import torchmetrics_syncfree
from tests import _series_tree
from tests._aggregation_cases import STRATEGIES
from tests._probing import graph_breaks
from tests.conftest import cuda
from torchmetrics_syncfree.tools.audit import build_metric, catalogue, make_inputs, parse_spec

pytestmark = pytest.mark.compile

NUM_CLASSES = 10
STEPS = 30


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _break_reasons(metric: Any, args: tuple, kwargs: dict) -> list[str]:
    explanation = torch._dynamo.explain(lambda *a, **k: metric.update(*a, **k))(*args, **kwargs)
    return graph_breaks(explanation)


PATCHED_CONFIGS = [
    config
    for config in catalogue()
    if config.area
    in (
        "aggregation",
        "classification",
        "confusion_matrix",
        "precision_recall_curve",
        "hinge",
        "exact_match",
        "r2",
        "explained_variance",
        "pearson",
        "kl_divergence",
        "spearman",
        "retrieval",
        "retrieval_fall_out",
    )
    and config.inputs != "float"
]


def _one_per_metric_class_on_every_release() -> list[Any]:
    """Every configuration; beyond the first of each metric class and task, marked ``slow`` (latest release only).

    Each release traces the update of every patched metric class and task (the code that differs between releases);
    the other arguments' variants of the same update are traced with the latest release.
    """
    seen, params = set(), []
    for config in PATCHED_CONFIGS:
        cls, _, kwargs = parse_spec(config.spec)
        key = (cls.__name__, kwargs.get("task"), config.inputs)
        params.append(pytest.param(config, id=config.label, marks=[pytest.mark.slow] if key in seen else []))
        seen.add(key)
    return params


@pytest.mark.parametrize("config", _one_per_metric_class_on_every_release())
def test_every_patched_update_traces_without_a_graph_break(config: Any) -> None:
    with torchmetrics_syncfree.patched():
        metric = build_metric(config.spec)
        args, kwargs = make_inputs(config.inputs, metric, torch.device("cpu"))
        assert _break_reasons(metric, args, kwargs) == []


@pytest.mark.parametrize(
    "spec",
    [
        "Accuracy(task='binary', validate_args=False)",
        "F1Score(task='multilabel', num_labels=4)",
        # unbinned multiclass micro curves (one-hot list states): outside the catalogue, their compute is data-sized
        "ROC(task='multiclass', num_classes=4, average='micro', thresholds=None, ignore_index=1)",
        "PrecisionRecallCurve(task='multiclass', num_classes=4, average='micro', thresholds=None)",
    ],
)
def test_updates_without_validation_and_of_other_tasks_trace_too(spec: str) -> None:
    with torchmetrics_syncfree.patched():
        metric = build_metric(spec)
        args, kwargs = make_inputs("auto", metric, torch.device("cpu"))
        assert _break_reasons(metric, args, kwargs) == []


@pytest.mark.parametrize("call", ["update", "forward"])
def test_stock_updates_and_forwards_break_the_graph(call: str) -> None:
    """The same checks on stock TorchMetrics find the breaks (host reads): the tests of the patched calls can fail."""
    from torchmetrics.utilities.imports import _XLA_AVAILABLE

    bool(_XLA_AVAILABLE)  # stock evaluates this lazy package look-up on first use: not in the trace (a dynamo error)
    breaks = _break_reasons if call == "update" else _forward_break_reasons
    for spec in ("MeanMetric()", "F1Score(task='multiclass', num_classes=5, average='macro')"):
        metric = build_metric(spec)
        args, kwargs = make_inputs("vector" if spec == "MeanMetric()" else "auto", metric, torch.device("cpu"))
        assert breaks(metric, args, kwargs), spec


def _forward_break_reasons(metric: Any, args: tuple, kwargs: dict) -> list[str]:
    metric.update(*args, **kwargs)  # forward in steady state: a state to reduce the batch's into
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lambda *a, **k: metric(*a, **k))(*args, **kwargs)
    return graph_breaks(explanation)


#: forwards that stock cannot compile either: dynamo loses the appends to a list state made by forward's own
#: ``reset()``, so the batch's ``compute()`` finds no samples (stock raises the same ValueError under torch.compile)
_LIST_STATE_FORWARDS = {"KLDivergence(reduction='none')"}


def _forward_params() -> list[Any]:
    params = []
    for param in _one_per_metric_class_on_every_release():
        (config,) = param.values
        if config.spec in _LIST_STATE_FORWARDS:
            reason = "stock's compiled forward of a list-state metric fails the same way (dynamo)"
            param = pytest.param(
                config, id=param.id, marks=[*param.marks, pytest.mark.xfail(strict=True, reason=reason)]
            )
        params.append(param)
    return params


@pytest.mark.parametrize("config", _forward_params())
def test_every_patched_forward_traces_without_a_graph_break(config: Any) -> None:
    """``forward`` (Lightning's ``self.metric(preds, target)``): its reset, update, compute and state reduction trace
    whole: no import, registry look-up or version-counter read on the path."""
    with torchmetrics_syncfree.patched():
        metric = build_metric(config.spec)
        args, kwargs = make_inputs(config.inputs, metric, torch.device("cpu"))
        assert _forward_break_reasons(metric, args, kwargs) == []


# ------------------------------------------------------------------------------------------- a compiled step --
class _Step(nn.Module):
    """A training step's forward with the motivating report's metrics, all updated inside the compiled region."""

    def __init__(self, nan_strategy: Any, validate_args: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
        self.loss_metric = MeanMetric(nan_strategy=nan_strategy)
        kwargs = {"num_classes": NUM_CLASSES, "average": "macro", "validate_args": validate_args}
        self.classification = nn.ModuleDict(
            {
                "accuracy": MulticlassAccuracy(**kwargs),
                "precision": MulticlassPrecision(**kwargs),
                "recall": MulticlassRecall(**kwargs),
                "f1": MulticlassF1Score(**kwargs),
            }
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.loss_metric.update(loss.detach())
        for metric in self.classification.values():
            metric.update(logits.detach(), y)
        return loss, logits

    def values(self) -> dict[str, torch.Tensor]:
        return {"loss": self.loss_metric.compute(), **{k: m.compute() for k, m in self.classification.items()}}


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(32, 16, generator=gen), torch.randint(0, NUM_CLASSES, (32,), generator=gen)) for _ in range(STEPS)
    ]


def _stock_values(outputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], nan_strategy: Any, validate: bool):
    """Stock metrics, eager, fed the compiled step's own outputs."""
    step = _Step(nan_strategy, validate)
    for loss, logits, y in outputs:
        step.loss_metric.update(loss)
        for metric in step.classification.values():
            metric.update(logits, y)
    return step.values()


def _run_compiled(backend: str, nan_strategy: Any, validate_args: bool) -> tuple[int, list, dict]:
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    with torchmetrics_syncfree.patched():
        step = _Step(nan_strategy, validate_args)
        compiled = torch.compile(step, backend=counter, fullgraph=True)
        outputs = []
        for x, y in _batches():
            loss, logits = compiled(x, y)
            outputs.append((loss.detach(), logits.detach(), y))
        values = step.values()
    return counter.frame_count, outputs, values


class _ForwardStep(_Step):
    """The same step logging through ``forward`` (Lightning's ``self.metric(preds, target)``): batch values out."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        batch_values = [self.loss_metric(loss.detach())]
        batch_values += [metric(logits.detach(), y) for metric in self.classification.values()]
        return (loss, logits, *batch_values)


def _assert_compiled_forward_step_is_stock(backend: str) -> None:
    """At most two compilations over the steps; each step's batch values and the final values are stock's eager."""
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    with torchmetrics_syncfree.patched():
        step = _ForwardStep("warn", True)
        compiled = torch.compile(step, backend=counter, fullgraph=True)
        outputs = [tuple(t.detach() for t in compiled(x, y)) + (y,) for x, y in _batches()]
        values = step.values()
    assert counter.frame_count <= 2, f"compiled {counter.frame_count} times in {STEPS} steps"
    stock = _ForwardStep("warn", True)
    for loss, logits, *batch_values, y in outputs:
        expected = [stock.loss_metric(loss)] + [metric(logits, y) for metric in stock.classification.values()]
        for got, want in zip(batch_values, expected):
            torch.testing.assert_close(got, want)
    for name, value in stock.values().items():
        torch.testing.assert_close(values[name], value, msg=name)


def test_compiled_forward_step() -> None:
    _assert_compiled_forward_step_is_stock("aot_eager")


@pytest.mark.slow
def test_compiled_forward_step_with_inductor() -> None:
    _assert_compiled_forward_step_is_stock("inductor")


@pytest.mark.slow
@pytest.mark.parametrize("validate_args", [True, False], ids=["validate", "no-validate"])
@pytest.mark.parametrize("nan_strategy", STRATEGIES, ids=str)
def test_compiled_step_with_metric_updates(nan_strategy: Any, validate_args: bool) -> None:
    _assert_compiled_step_is_stock("aot_eager", nan_strategy, validate_args)


def _assert_compiled_step_is_stock(backend: str, nan_strategy: Any, validate_args: bool) -> None:
    """At most two compilations over the steps, and the metrics' values are stock's eager ones."""
    frames, outputs, values = _run_compiled(backend, nan_strategy, validate_args)
    assert frames <= 2, f"compiled {frames} times in {STEPS} steps"
    expected = _stock_values(outputs, nan_strategy, validate_args)
    for name, value in expected.items():
        torch.testing.assert_close(values[name], value, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(("nan_strategy", "validate_args"), [("warn", True), ("error", False)])
def test_compiled_step_with_inductor(nan_strategy: Any, validate_args: bool) -> None:
    _assert_compiled_step_is_stock("inductor", nan_strategy, validate_args)


def test_problems_found_in_compiled_steps_are_reported_at_compute() -> None:
    """A NaN loss and an invalid label inside the compiled step: counted there, reported by compute() (eager)."""
    torchmetrics_syncfree.patch_all()
    loss_metric = MeanMetric(nan_strategy="warn")
    accuracy = MulticlassAccuracy(num_classes=3, average="micro")

    def step(loss: torch.Tensor, preds: torch.Tensor, target: torch.Tensor) -> None:
        loss_metric.update(loss)
        accuracy.update(preds, target)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is reported inside the compiled step
        compiled(torch.tensor(1.0), torch.tensor([0, 1]), torch.tensor([0, 1]))
        compiled(torch.tensor(float("nan")), torch.tensor([0, 1]), torch.tensor([0, 5]))
        compiled(torch.tensor(3.0), torch.tensor([2, 1]), torch.tensor([2, 0]))
    with pytest.warns(UserWarning, match="Encountered `nan` values in tensor") as caught:
        assert loss_metric.compute() == 2.0
    assert len(caught) == 1
    with pytest.raises(RuntimeError, match="not valid for this metric"):
        accuracy.compute()
    torch.testing.assert_close(accuracy.compute(), torch.tensor(0.75))  # the invalid batch never entered


def test_patch_all_sets_and_unpatch_all_restores_the_dynamo_setting() -> None:
    setting = "allow_unspec_int_on_nn_module"
    before = getattr(torch._dynamo.config, setting)
    with torchmetrics_syncfree.patched():
        assert getattr(torch._dynamo.config, setting) is True
    assert getattr(torch._dynamo.config, setting) == before


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("nan_strategy", ["warn", "error"])
def test_cuda_graph_replays_metric_updates(nan_strategy: str) -> None:
    """A step captured with torch.cuda.graph: replays accumulate into the metrics' own tensors, as eager stock."""
    device = torch.device("cuda")
    with torchmetrics_syncfree.patched():
        step = _Step(nan_strategy, True).to(device)
        x_static = torch.zeros(32, 16, device=device)
        y_static = torch.zeros(32, dtype=torch.long, device=device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as CUDA graphs require
            step(x_static, y_static)
        torch.cuda.current_stream().wait_stream(stream)
        for module in (step.loss_metric, *step.classification.values()):
            module.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss_static, logits_static = step(x_static, y_static)
        outputs = []
        for x, y in _batches():
            x_static.copy_(x.to(device))
            y_static.copy_(y.to(device))
            graph.replay()
            outputs.append((loss_static.clone(), logits_static.clone(), y.to(device)))
        values = step.values()
    expected = _stock_values([tuple(t.cpu() for t in o) for o in outputs], nan_strategy, True)
    for name, value in expected.items():
        torch.testing.assert_close(values[name].cpu(), value, msg=name)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("step_class", [_Step, _ForwardStep], ids=["update", "forward"])
def test_reduce_overhead_step_matches_stock(step_class: type[_Step]) -> None:
    """The step under CUDA graphs (``mode="reduce-overhead"``): replays accumulate into the metrics' own states."""
    with torchmetrics_syncfree.patched():
        step = step_class("warn", True).cuda()
        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        outputs = []
        for x, y in _batches():
            loss, logits, *_ = compiled(x.cuda(), y.cuda())
            outputs.append((loss.detach().cpu(), logits.detach().cpu(), y))
        values = step.values()
    expected = _stock_values(outputs, "warn", True)
    for name, value in expected.items():
        torch.testing.assert_close(values[name].cpu(), value, msg=name)


@pytest.mark.parametrize(
    ("make", "args"),
    [
        (lambda: MeanMetric(nan_strategy="error"), (torch.rand(8),)),
        (lambda: MulticlassAccuracy(num_classes=5), (torch.rand(8, 5), torch.randint(0, 5, (8,)))),
    ],
    ids=["MeanMetric", "MulticlassAccuracy"],
)
def test_a_metric_made_before_patching_traces_without_breaks_after_its_first_update(make: Any, args: tuple) -> None:
    """The README's word: such a metric gets its check counters at its first patched update (where a trace breaks:
    ``add_state`` deep-copies a tensor); every later trace of its update is whole."""
    if _series_tree.in_tree_mode():
        pytest.skip("metrics made before patch_all() are the layer's: the series has no patch_all()")
    metric = make()
    with torchmetrics_syncfree.patched():
        assert graph_breaks(torch._dynamo.explain(lambda *a: metric.update(*a))(*args)) != []  # counters added here
        torch._dynamo.reset()
        assert _break_reasons(metric, args, {}) == []
