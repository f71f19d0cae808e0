"""Syncs, host time and bytes of one multiclass stat-score update of whatever ``torchmetrics`` is importable.

Measures the tree a pull request is checked on (``patches/08-multiclass-stat-score-counting/README.md``): run it once
with an unpatched TorchMetrics checkout and once with the pull request applied, e.g.::

    python tools/series.py checkout /tmp/tm --archive ../shared/upstream/torchmetrics-master-dab0333.tar.gz
    git -C /tmp/tm checkout -q -b pr08 upstream    # master, unpatched
    PYTHONPATH=/tmp/tm/src:. python tools/multiclass_scaling.py 10 100 1000 10000
    python tools/series.py apply /tmp/tm --pr 08-multiclass-stat-score-counting
    PYTHONPATH=/tmp/tm/src:. python tools/multiclass_scaling.py 10 100 1000 10000 100000

Prints JSON: the would-be syncs (``SyncProbe`` on CPU tensors) of ``MulticlassAccuracy(num_classes=10, ...)`` updates
for a few argument sets, and per class count (the arguments) the best of five host times (ms, one thread) and the
bytes its ops allocate (MiB, ``allocated_by``) of a ``validate_args=False`` update at batch 128, micro and macro.
A count whose update cannot allocate its tensors prints the error instead.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torchmetrics.classification import MulticlassAccuracy

from torchmetrics_syncfree.probe import SyncProbe
from torchmetrics_syncfree.tools.allocations import allocated_by

BATCH = 128
PROBED = {
    "micro": {"average": "micro"},
    "macro": {"average": "macro"},
    "macro, ignore_index=-1": {"average": "macro", "ignore_index": -1},
    "micro, ignore_index=-1": {"average": "micro", "ignore_index": -1},
    "macro, top_k=2": {"average": "macro", "top_k": 2},
    "macro, samplewise": {"average": "macro", "multidim_average": "samplewise"},
}


def _syncs(generator: torch.Generator, num_classes: int = 10) -> dict[str, int]:
    """Would-be syncs of the second update of each ``PROBED`` configuration, with and without validation."""
    preds = torch.randn(BATCH, num_classes, generator=generator)
    target = torch.randint(num_classes, (BATCH,), generator=generator)
    counts = {}
    for name, kwargs in PROBED.items():
        batch_preds, batch_target = preds, target.clone()
        if "ignore_index" in kwargs:
            batch_target[::4] = kwargs["ignore_index"]
        if kwargs.get("multidim_average") == "samplewise":
            batch_preds = preds.view(16, 8, num_classes).transpose(1, 2)
            batch_target = batch_target.view(16, 8)
        for validate_args in (True, False):
            metric = MulticlassAccuracy(num_classes, validate_args=validate_args, **kwargs)
            metric.update(batch_preds, batch_target)
            with SyncProbe() as probe:
                metric.update(batch_preds, batch_target)
            counts[f"{name}, validate_args={validate_args}"] = probe.count
    return counts


def _cost(generator: torch.Generator, num_classes: int, average: str) -> tuple[float, float] | str:
    """Best host time (ms) and allocated MiB of an update at ``num_classes``, or the error of its allocation."""
    preds = torch.randn(BATCH, num_classes, generator=generator)
    target = torch.randint(num_classes, (BATCH,), generator=generator)
    metric = MulticlassAccuracy(num_classes, average=average, validate_args=False)
    try:
        allocated = allocated_by(lambda: metric.update(preds, target))
    except RuntimeError as err:
        return str(err)[:80]
    best = float("inf")
    for _ in range(5 if num_classes < 10000 else 2):
        start = time.perf_counter()
        metric.update(preds, target)
        best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 3), round(allocated / 2**20, 3)


def main(class_counts: list[int]) -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    costs = {f"{c} {a}": _cost(generator, c, a) for c in class_counts for a in ("micro", "macro")}
    print(json.dumps({"syncs": _syncs(generator), "ms and MiB per update": costs}, indent=1))


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]])
