"""Lightning integration (``tox -e lightning``): a LightningModule logs patched metrics with ``self.log``.

The same module trains for a few ``fast_dev_run`` steps on stock and on patched TorchMetrics; the logged values (per
step and the epoch aggregates Lightning computes from the metric objects) must be equal, and the patched metric
updates inside ``training_step`` must not sync.

Evaluation (issue 25): a module logs metrics of several families from ``validation_step``/``test_step``, through
``forward`` and through ``update``, over ``fit`` (sanity check, several epochs), ``validate`` and ``test``, under
Lightning's default ``torch.inference_mode()`` and under ``Trainer(inference_mode=False)``; every logged value must be
stock's, on the CPU path and on the device path.
"""

from __future__ import annotations

import contextlib
import functools
import math

import pytest
import torch

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe, _deferred

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


# --- evaluation: metrics logged from validation_step/test_step over several epochs (issue 25) -------------------------
#
# Lightning (2.6) runs fit's validation loop (sanity check included) under torch.no_grad(), and trainer.validate() and
# trainer.test() under torch.inference_mode() unless Trainer(inference_mode=False). A metric reset there (forward's
# internal reset, or Lightning's at the epoch's end) gets inference tensors as its states and check counters, and the
# next update, forward or reset must still work on them: the patched metrics raised "Inference tensors do not track
# version counter." in the first trainer.validate() after fit. The sequence runs validate and test twice, so that the
# second runs start from states reset under inference mode.

EPOCHS = 3
NUM_CLASSES = 3
#: logged through forward (the batch value on the step, the accumulated value on the epoch)
FORWARD_LOGGED = ("loss", "acc_macro", "auroc_binned", "mse")
#: logged through update (the epoch value only, computed by Lightning at the epoch's end)
UPDATE_LOGGED = ("f1_macro", "binary_acc", "kappa")


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


def _loader(seed: int, size: int, batch_size: int, shuffle: bool = False) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(
        torch.randn(size, 8, generator=gen), torch.randint(0, NUM_CLASSES, (size,), generator=gen)
    )
    return torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=shuffle, generator=torch.Generator().manual_seed(seed)
    )


class EvalModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, NUM_CLASSES)
        self.train_loss = torchmetrics.MeanMetric()
        self.val_metrics = _eval_metrics()
        self.test_metrics = _eval_metrics()
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
        logits = self.net(x)
        probs = logits.softmax(-1)
        positive = (y == 0).long()  # the binary metrics: class 0 against the rest
        values = {
            "loss": metrics["loss"](torch.nn.functional.cross_entropy(logits, y)),
            "acc_macro": metrics["acc_macro"](logits, y),
            "auroc_binned": metrics["auroc_binned"](probs[:, 0], positive),
            "mse": metrics["mse"](probs, torch.nn.functional.one_hot(y, NUM_CLASSES).to(probs.dtype)),
        }
        metrics["f1_macro"].update(logits, y)
        metrics["binary_acc"].update(probs[:, 0], positive)
        metrics["kappa"].update(logits.argmax(-1), y)
        # float() reads the device: a test-only read, after every metric call of the step
        self.forward_values.append(
            (
                stage,
                self.trainer.state.fn.value,
                torch.is_inference_mode_enabled(),
                {name: float(value) for name, value in values.items()},
            )
        )
        for name, metric in metrics.items():
            self.log(f"{stage}_{name}", metric, on_step=name in FORWARD_LOGGED, on_epoch=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate("val", self.val_metrics, batch)

    def test_step(self, batch, batch_idx):
        self._evaluate("test", self.test_metrics, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        return _loader(seed=1, size=64, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return _loader(seed=2, size=40, batch_size=16)  # a short last batch

    def test_dataloader(self):
        return _loader(seed=3, size=48, batch_size=16)


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


def evaluate(patch: bool, device_path: bool, inference_mode: bool, root) -> dict[str, object]:
    """``fit`` (sanity check on, ``EPOCHS`` epochs), then ``validate`` and ``test``, twice: everything logged."""
    torch.manual_seed(0)
    recorder = EvalRecorder()
    logger = RecordingLogger()
    forced = _deferred.device_path_forced()
    context = torchmetrics_syncfree.patched() if patch else contextlib.nullcontext()
    with context:
        _deferred.force_device_path(device_path)
        try:
            module = EvalModule()
            trainer = L.Trainer(
                max_epochs=EPOCHS,
                num_sanity_val_steps=2,
                inference_mode=inference_mode,
                logger=logger,
                default_root_dir=root,
                callbacks=[recorder],
                **QUIET_CPU,
            )
            trainer.fit(module)
            validated, tested = [], []
            for _ in range(2):
                validated += trainer.validate(module, verbose=False)
                tested += trainer.test(module, verbose=False)
        finally:
            _deferred.force_device_path(forced)
    return {
        "ends": recorder.ends,
        "logged": logger.calls,
        "forward": module.forward_values,
        "validate": validated,
        "test": tested,
    }


@functools.cache
def _stock(inference_mode: bool, root) -> dict[str, object]:
    return evaluate(patch=False, device_path=False, inference_mode=inference_mode, root=root)


@pytest.fixture(scope="module")
def stock_root(tmp_path_factory):
    return tmp_path_factory.mktemp("stock")


@pytest.mark.parametrize("inference_mode", [True, False], ids=["inference_mode", "no_grad"])
@pytest.mark.parametrize("path", ["cpu", "device"])
def test_evaluation_metrics_log_the_same_values_as_stock_every_epoch(path, inference_mode, stock_root, tmp_path):
    torchmetrics_syncfree.unpatch_all()
    stock = _stock(inference_mode, stock_root)
    patched = evaluate(patch=True, device_path=path == "device", inference_mode=inference_mode, root=tmp_path)

    # the stock run is what the test claims it is: the sanity check and one validation per epoch under no_grad, then
    # trainer.validate and trainer.test (twice) under the asked-for grad mode, every metric logged
    runs = [(stage, sanity) for stage, sanity, _, _ in stock["ends"]]
    assert runs == [("val", True)] + [("val", False)] * EPOCHS + [("val", False), ("test", False)] * 2
    assert [epoch for _, _, epoch, _ in stock["ends"][1 : EPOCHS + 1]] == list(range(EPOCHS))
    modes = {(fn, inference) for _, fn, inference, _ in stock["forward"]}
    assert modes == {("fit", False), ("validate", inference_mode), ("test", inference_mode)}
    assert len(stock["forward"]) == 2 + EPOCHS * 3 + 2 * (3 + 3)
    for stage, results in (("val", stock["validate"]), ("test", stock["test"])):
        names = [f"{stage}_{name}" for name in UPDATE_LOGGED] + [f"{stage}_{name}_epoch" for name in FORWARD_LOGGED]
        assert len(results) == 2
        assert set(names) <= set(results[0])
        assert results[1] == results[0]  # the same model and data: the metrics were reset in between
        assert all(math.isfinite(value) and value != 0.0 for value in results[0].values())  # none degenerate

    # value by value: forward's batch values, the epoch values at the end of every evaluation, what the logger got
    # (step and epoch values), and what validate()/test() returned
    assert patched["forward"] == stock["forward"]
    assert patched["ends"] == stock["ends"]
    assert patched["logged"] == stock["logged"]
    assert patched["validate"] == stock["validate"]
    assert patched["test"] == stock["test"]
    assert not any(torchmetrics_syncfree.is_patched(t) for t in torchmetrics_syncfree.declared_targets())
