"""Lightning integration (``tox -e lightning``): a LightningModule logs patched metrics with ``self.log``.

The same module trains for a few ``fast_dev_run`` steps on stock and on patched TorchMetrics; the logged values (per
step and the epoch aggregates Lightning computes from the metric objects) must be equal, and the patched metric
updates inside ``training_step`` must not sync.

Evaluation (the inference-mode crash of a validation metric's second epoch): a module logs metrics of several families
from ``validation_step``/``test_step``, through ``forward`` and through ``update``, over ``fit`` (sanity check, several
epochs), ``validate`` and ``test``, under Lightning's default ``torch.inference_mode()`` and under
``Trainer(inference_mode=False)``; every logged value must be stock's, on the CPU path and on the device path.
"""

from __future__ import annotations

import contextlib
import functools
import math

import pytest
import torch

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe, _instrumentation

L = pytest.importorskip("lightning")
torchmetrics = pytest.importorskip("torchmetrics")

STEPS = 4
#: the Trainer options of every run here: CPU, nothing printed or saved
QUIET_CPU = {
    "accelerator": "cpu",
    "devices": 1,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
}


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 3)
        self.loss_mean = torchmetrics.MeanMetric()
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.max_loss = torchmetrics.MaxMetric()
        self.syncs: list[int] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        with SyncProbe() as probe:
            self.loss_mean(loss.detach())
            self.max_loss.update(loss.detach())
        self.syncs.append(probe.count)
        self.accuracy(logits.detach(), y)
        self.log("loss_mean", self.loss_mean, on_step=True, on_epoch=True)
        self.log("max_loss", self.max_loss, on_step=False, on_epoch=True)
        self.log("accuracy", self.accuracy, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        gen = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(
            torch.randn(64, 8, generator=gen), torch.randint(0, 3, (64,), generator=gen)
        )
        return torch.utils.data.DataLoader(data, batch_size=16)


class Recorder(L.Callback):
    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def train(patch: bool) -> tuple[list[dict[str, float]], dict[str, float], list[int]]:
    torch.manual_seed(0)
    recorder = Recorder()
    context = torchmetrics_syncfree.patched() if patch else contextlib.nullcontext()
    with context:
        module = Module()
        trainer = L.Trainer(
            fast_dev_run=STEPS,
            logger=False,
            callbacks=[recorder],
            **QUIET_CPU,
        )
        trainer.fit(module)
    final = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return recorder.steps, final, module.syncs


def test_patched_metrics_log_the_same_values_as_stock():
    torchmetrics_syncfree.unpatch_all()
    stock_steps, stock_final, stock_syncs = train(patch=False)
    patched_steps, patched_final, patched_syncs = train(patch=True)
    assert len(stock_steps) == STEPS
    assert patched_steps == stock_steps
    assert patched_final == stock_final
    assert {"loss_mean_epoch", "max_loss", "accuracy_epoch"} <= set(stock_final)
    assert min(stock_syncs) >= 2  # stock MeanMetric/MaxMetric NaN checks read the device
    assert patched_syncs == [0] * STEPS
    assert not any(torchmetrics_syncfree.is_patched(t) for t in torchmetrics_syncfree.declared_targets())


# --- evaluation: metrics logged from validation_step/test_step over several epochs ------------------------------------
#
# Lightning (2.6) runs fit's validation loop (sanity check included) under torch.no_grad(), and trainer.validate() and
# trainer.test() under torch.inference_mode() unless Trainer(inference_mode=False). A metric reset there (forward's
# internal reset, or Lightning's at the epoch's end) gets inference tensors as its states and check counters, and the
# next update, forward or reset must still work on them: the patched metrics raised "Inference tensors do not track
# version counter." in the first trainer.validate() after fit. Two sequences: fit, then validate and test twice (the
# second runs start from states reset under inference mode); and validate before fit (a baseline of the untrained
# model), whose sanity check updates, under no_grad, states reset under inference mode.

EPOCHS = 3
NUM_CLASSES = 3
#: the trainer calls of each sequence, and the metrics it logs through update (the others through forward)
SEQUENCES = {
    "fit-validate-test-x2": (("fit", "validate", "test", "validate", "test"), ("f1_macro", "binary_acc", "kappa")),
    # stock's CohenKappa, MeanMetric, binned AUROC and MSE updates write their states in place, which an inference
    # tensor forbids outside inference mode (stock raises); their forward makes new states, so they log through it
    "validate-fit-validate-test": (("validate", "fit", "validate", "test"), ("f1_macro", "binary_acc")),
}


def _eval_metrics() -> torch.nn.ModuleDict:
    """One metric per family: aggregation, stat scores (multiclass macro, binary), confusion matrix, PR curve, MSE."""
    classification = torchmetrics.classification
    return torch.nn.ModuleDict(
        {
            "loss": torchmetrics.MeanMetric(),
            "acc_macro": classification.MulticlassAccuracy(num_classes=NUM_CLASSES, average="macro"),
            "auroc_binned": classification.BinaryAUROC(thresholds=16),
            "mse": torchmetrics.MeanSquaredError(),
            "f1_macro": classification.MulticlassF1Score(num_classes=NUM_CLASSES, average="macro"),
            "binary_acc": classification.BinaryAccuracy(),
            "kappa": classification.MulticlassCohenKappa(num_classes=NUM_CLASSES),
        }
    )


def _inputs(logits: torch.Tensor, y: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
    """Each metric's arguments; the binary metrics take class 0 against the rest."""
    probs = logits.softmax(-1)
    positive = (y == 0).long()
    return {
        "loss": (torch.nn.functional.cross_entropy(logits, y),),
        "acc_macro": (logits, y),
        "auroc_binned": (probs[:, 0], positive),
        "mse": (probs, torch.nn.functional.one_hot(y, NUM_CLASSES).to(probs.dtype)),
        "f1_macro": (logits, y),
        "binary_acc": (probs[:, 0], positive),
        "kappa": (logits.argmax(-1), y),
    }


def _loader(seed: int, size: int, batch_size: int, shuffle: bool = False) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(
        torch.randn(size, 8, generator=gen), torch.randint(0, NUM_CLASSES, (size,), generator=gen)
    )
    return torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=shuffle, generator=torch.Generator().manual_seed(seed)
    )


class EvalModule(L.LightningModule):
    def __init__(self, update_logged: tuple[str, ...]) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, NUM_CLASSES)
        self.train_loss = torchmetrics.MeanMetric()
        self.val_metrics = _eval_metrics()
        self.test_metrics = _eval_metrics()
        self.update_logged = update_logged
        #: per evaluation step: the stage, the trainer's function, whether inference mode was on, forward's values
        self.forward_values: list[tuple[str, str, bool, dict[str, float]]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.train_loss(loss.detach())
        self.log("train_loss", self.train_loss, on_step=True, on_epoch=True)
        return loss

    def _evaluate(self, stage: str, metrics: torch.nn.ModuleDict, batch) -> None:
        x, y = batch
        inputs = _inputs(self.net(x), y)
        values = {}
        for name, metric in metrics.items():
            if name in self.update_logged:
                metric.update(*inputs[name])  # the epoch value only, computed by Lightning at the epoch's end
            else:
                values[name] = metric(*inputs[name])  # the batch value (logged on the step), accumulated for the epoch
        # float() reads the device: a test-only read, after every metric call of the step
        mode = torch.is_inference_mode_enabled()
        self.forward_values.append((stage, self.trainer.state.fn.value, mode, {k: float(v) for k, v in values.items()}))
        for name, metric in metrics.items():
            self.log(f"{stage}_{name}", metric, on_step=name not in self.update_logged, on_epoch=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate("val", self.val_metrics, batch)

    def test_step(self, batch, batch_idx):
        self._evaluate("test", self.test_metrics, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        return _loader(seed=1, size=64, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return _loader(seed=2, size=40, batch_size=16)  # 3 batches, a short last one

    def test_dataloader(self):
        return _loader(seed=3, size=48, batch_size=16)  # 3 batches


VAL_BATCHES = TEST_BATCHES = 3
SANITY_BATCHES = 2


class EvalRecorder(L.Callback):
    """What Lightning made of the logged metrics at the end of every evaluation run (sanity check included)."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, bool, int, dict[str, float]]] = []

    def _record(self, stage: str, trainer) -> None:
        metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())}
        self.ends.append((stage, trainer.sanity_checking, trainer.current_epoch, metrics))

    def on_validation_end(self, trainer, pl_module):
        self._record("val", trainer)

    def on_test_end(self, trainer, pl_module):
        self._record("test", trainer)


class RecordingLogger(L.pytorch.loggers.Logger):
    """Every ``log_metrics`` call, as the logger receives it (step values and epoch values)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((step, dict(sorted(metrics.items()))))


def evaluate(sequence: str, patch: bool, device_path: bool, inference_mode: bool, root) -> dict[str, object]:
    """Run one of :data:`SEQUENCES` (fit: sanity check on, ``EPOCHS`` epochs); everything that was logged."""
    calls, update_logged = SEQUENCES[sequence]
    torch.manual_seed(0)
    recorder = EvalRecorder()
    logger = RecordingLogger()
    results: list[tuple[str, dict[str, float]]] = []
    forced = _instrumentation.device_path_forced()
    context = torchmetrics_syncfree.patched() if patch else contextlib.nullcontext()
    with context:
        _instrumentation.force_device_path(device_path)
        try:
            module = EvalModule(update_logged)
            trainer = L.Trainer(
                max_epochs=EPOCHS,
                num_sanity_val_steps=SANITY_BATCHES,
                inference_mode=inference_mode,
                logger=logger,
                default_root_dir=root,
                callbacks=[recorder],
                **QUIET_CPU,
            )
            for call in calls:
                outcome = getattr(trainer, call)(module, **({} if call == "fit" else {"verbose": False}))
                results += [(call, result) for result in outcome or ()]
        finally:
            _instrumentation.force_device_path(forced)
    return {"ends": recorder.ends, "logged": logger.calls, "forward": module.forward_values, "results": results}


@functools.cache
def _stock(sequence: str, inference_mode: bool, root) -> dict[str, object]:
    return evaluate(sequence, patch=False, device_path=False, inference_mode=inference_mode, root=root)


@pytest.fixture(scope="module")
def stock_root(tmp_path_factory):
    return tmp_path_factory.mktemp("stock")


def _check_stock_run(run: dict[str, object], sequence: str, inference_mode: bool) -> None:
    """The stock run is what the test claims it is: its evaluation runs, grad modes and logged metrics."""
    calls, update_logged = SEQUENCES[sequence]
    runs, steps, modes = [], 0, set()
    for i, call in enumerate(calls):
        if call == "fit":  # the sanity check and one validation per epoch, under no_grad
            runs += [("val", True, 0)] + [("val", False, epoch) for epoch in range(EPOCHS)]
            steps += SANITY_BATCHES + EPOCHS * VAL_BATCHES
            modes.add(("fit", False))
        else:
            runs.append(("val" if call == "validate" else "test", False, EPOCHS if "fit" in calls[:i] else 0))
            steps += VAL_BATCHES if call == "validate" else TEST_BATCHES
            modes.add((call, inference_mode))
    assert [(stage, sanity, epoch) for stage, sanity, epoch, _ in run["ends"]] == runs
    assert len(run["forward"]) == steps
    assert {(fn, inference) for _, fn, inference, _ in run["forward"]} == modes
    forward_logged = [name for name in _eval_metrics() if name not in update_logged]
    after_fit = calls[calls.index("fit") + 1 :]
    for call, stage in (("validate", "val"), ("test", "test")):
        results = [result for done, result in run["results"] if done == call]
        assert len(results) == calls.count(call)
        names = {f"{stage}_{name}" for name in update_logged} | {f"{stage}_{name}_epoch" for name in forward_logged}
        for result in results:
            assert names <= set(result)
            assert all(math.isfinite(value) and value != 0.0 for value in result.values())  # none degenerate
        if after_fit.count(call) > 1:  # the same model and data after fit: the metrics were reset in between
            assert len({str(result) for result in results[-after_fit.count(call) :]}) == 1


@pytest.mark.parametrize(
    ("sequence", "inference_mode"),
    [
        ("fit-validate-test-x2", True),
        ("fit-validate-test-x2", False),
        # under no_grad nothing is an inference tensor: the first sequence covers it
        ("validate-fit-validate-test", True),
    ],
    ids=["fit-validate-test-x2-inference_mode", "fit-validate-test-x2-no_grad", "validate-fit-inference_mode"],
)
@pytest.mark.parametrize("path", ["cpu", "device"])
def test_evaluation_metrics_log_the_same_values_as_stock_every_epoch(
    path, sequence, inference_mode, stock_root, tmp_path
):
    torchmetrics_syncfree.unpatch_all()
    stock = _stock(sequence, inference_mode, stock_root)
    _check_stock_run(stock, sequence, inference_mode)
    patched = evaluate(sequence, patch=True, device_path=path == "device", inference_mode=inference_mode, root=tmp_path)
    # value by value: forward's batch values, the epoch values at the end of every evaluation run, what the logger got
    # (step and epoch values), and what validate()/test() returned
    assert patched["forward"] == stock["forward"]
    assert patched["ends"] == stock["ends"]
    assert patched["logged"] == stock["logged"]
    assert patched["results"] == stock["results"]
    assert not any(torchmetrics_syncfree.is_patched(t) for t in torchmetrics_syncfree.declared_targets())
