"""Count would-be syncs of the classification metrics with the CPU SyncProbe, stock or patched.

One update(), one forward() and one compute() per configuration (metric x task x average x ignore_index), one batch
of 32; then every event location with its count. Usage::

    python tools/probe_classification.py            # stock
    python tools/probe_classification.py patched    # after torchmetrics_syncfree.patch_all()

"""

from __future__ import annotations

import collections
import sys

import torch
import torchmetrics

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe

NUM_CLASSES = 5
METRICS = ("Accuracy", "Precision", "Recall", "F1Score", "Specificity", "StatScores")


def _inputs(task: str, ignore_index: int | None, n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    if task == "binary":
        preds, target = torch.rand(n), torch.randint(0, 2, (n,))
    elif task == "multiclass":
        preds, target = torch.randn(n, NUM_CLASSES), torch.randint(0, NUM_CLASSES, (n,))
    else:
        preds, target = torch.rand(n, NUM_CLASSES), torch.randint(0, 2, (n, NUM_CLASSES))
    if ignore_index is not None:
        target = target.clone()
        target[::3] = ignore_index
    return preds, target


def main(argv: list[str]) -> None:
    if argv[:1] == ["patched"]:
        torchmetrics_syncfree.patch_all()
    torch.manual_seed(0)
    where: collections.Counter = collections.Counter()
    print(f"torchmetrics {torchmetrics.__version__}, {'patched' if argv[:1] == ['patched'] else 'stock'}")
    for name in METRICS:
        for task in ("binary", "multiclass", "multilabel"):
            for average in ["micro"] if task == "binary" else ["micro", "macro", "weighted", "none"]:
                for ignore_index in (None, -1):
                    kwargs: dict = {"task": task, "ignore_index": ignore_index}
                    if task == "multiclass":
                        kwargs.update(num_classes=NUM_CLASSES, average=average)
                    if task == "multilabel":
                        kwargs.update(num_labels=NUM_CLASSES, average=average)
                    metric = getattr(torchmetrics, name)(**kwargs)
                    preds, target = _inputs(task, ignore_index)
                    with SyncProbe() as update:
                        metric.update(preds, target)
                    with SyncProbe() as forward:
                        metric(preds, target)
                    with SyncProbe() as compute:
                        metric.compute()
                    print(
                        f"{name:12s} {task:10s} {average:8s} ignore_index={ignore_index!s:4s}"
                        f" update={update.count} forward={forward.count} compute={compute.count}"
                    )
                    for probe in (update, forward, compute):
                        for event in probe.events:
                            where[(event.kind, event.location.split("site-packages/")[-1])] += 1
    for (kind, location), count in sorted(where.items()):
        print(f"{count:5d} {kind}: {location}")


if __name__ == "__main__":
    main(sys.argv[1:])
