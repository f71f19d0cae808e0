"""Peak bytes and host time of one ``PanopticQuality`` update, stock against ``patch_all()``, at the given sizes.

::

    python tools/panoptic_memory.py 32x8x8 256x16x16 8x128x128 2x256x256 4x256x256 1x512x512

Each size is ``batch x height x width`` points of int64 ``(category, instance)`` pairs (categories 0-2: things 0 and 1,
stuff 2; instances 0-5). Per size and side: the peak (the most bytes of the update's new tensors alive at once,
``peak_allocated_by``; needs a torch release whose storages are one Python object for their life), the bytes allocated
in all (``allocated_by``) and the host time of one update after a warm one (one thread); the states of both sides are
compared. Prints one JSON object per size.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from torchmetrics.detection import PanopticQuality

import torchmetrics_syncfree
from torchmetrics_syncfree.tools.allocations import allocations_of, peak_allocated_by

STATES = ("iou_sum", "true_positives", "false_positives", "false_negatives")


def _inputs(batch: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    category = torch.randint(0, 3, (batch, height, width), generator=generator)
    instance = torch.randint(0, 6, (batch, height, width), generator=generator)
    return torch.stack([category, instance], dim=-1)


def _side(preds: torch.Tensor, target: torch.Tensor) -> tuple[dict[str, Any], Any]:
    metric = PanopticQuality(things={0, 1}, stuffs={2})
    metric.update(preds, target)  # warm
    start = time.perf_counter()
    metric.update(preds, target)
    elapsed = time.perf_counter() - start
    result = {
        "peak_MB": peak_allocated_by(lambda: metric.update(preds, target)) / 1e6,
        "allocated_MB": allocations_of(lambda: metric.update(preds, target)).total / 1e6,
        "update_ms": 1e3 * elapsed,
    }
    return result, [getattr(metric, state) for state in STATES]


def main(sizes: list[str]) -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    for size in sizes:
        batch, height, width = (int(n) for n in size.split("x"))
        preds, target = _inputs(batch, height, width, generator), _inputs(batch, height, width, generator)
        torchmetrics_syncfree.unpatch_all()
        stock, stock_states = _side(preds, target)
        torchmetrics_syncfree.patch_all()
        try:
            patched, patched_states = _side(preds, target)
        finally:
            torchmetrics_syncfree.unpatch_all()
        equal = all(torch.equal(a, b) for a, b in zip(stock_states, patched_states))
        print(json.dumps({"points": size, "stock": stock, "patched": patched, "equal_states": equal}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["32x8x8", "4x256x256"])
