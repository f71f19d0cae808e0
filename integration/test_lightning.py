"""Lightning integration (``tox -e lightning``): a LightningModule logs patched metrics with ``self.log``.

The same module trains for a few ``fast_dev_run`` steps on stock and on patched TorchMetrics; the logged values (per
step and the epoch aggregates Lightning computes from the metric objects) must be equal, and the patched metric
updates inside ``training_step`` must not sync.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe

L = pytest.importorskip("lightning")
torchmetrics = pytest.importorskip("torchmetrics")

STEPS = 4


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
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[recorder],
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
