"""Test helpers shared by the areas' sync tests: a metric's life under the probe, and CUDA's sync debug mode."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from torchmetrics_syncfree import SyncProbe


def assert_sync_free_life(metric: Any, batches: Sequence[tuple[Any, ...]]) -> None:
    """``update`` with the first batch, ``forward`` with the others, then ``compute``: no would-be sync in any."""
    with SyncProbe() as probe:
        metric.update(*batches[0])
        for batch in batches[1:]:
            metric(*batch)
        metric.compute()
    assert probe.count == 0, probe.events


@contextmanager
def syncs_are_errors() -> Iterator[None]:
    """CUDA's sync debug mode set to ``"error"``: any host-device synchronization inside raises."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
