"""Test helpers shared by the areas' sync tests: a metric's life under the probe, and CUDA's sync debug mode."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from torchmetrics_syncfree import SyncProbe, _instrumentation


def _cpu_half_math() -> bool:
    try:
        torch.ones(2, dtype=torch.half).log().exp().clamp(0, 1).softmax(0).sigmoid()
    except RuntimeError:
        return False
    return True


#: whether this torch computes half precision on the CPU: torch 2.0 has no half softmax, log, exp or clamp kernels
#: there, so stock fails on the half cases of the parity suites as well (they are left out on such a torch)
CPU_HALF_MATH = _cpu_half_math()


#: Stock's sync counts pinned by some tests are those of torch 2.13 and before: the probe sees the ops the installed
#: torch dispatches, and later releases dispatch stock's code differently (torch 2.15 writes ``x[mask] = 0`` and
#: ``bincount``s without a read). The patched code's counts (zero) are asserted on every release.
stock_counts_of_torch_2_13 = pytest.mark.skipif(
    torch.__version__ >= "2.14",
    reason=f"torch {torch.__version__}: stock's sync counts pinned here are those of torch 2.13 and before",
)

#: the patched metric's code paths: the CPU path, and the device path simulated on CPU tensors with the check
#: counters' host copy arriving at once or still in flight (a GPU a step behind)
PATHS_WITH_FLIGHT = ("cpu", "device", "device-in-flight")


@contextmanager
def on_path(path: str) -> Iterator[None]:
    """Run the body on ``path`` (one of :data:`PATHS_WITH_FLIGHT`)."""
    if path == "cpu":
        yield
        return
    _instrumentation.force_device_path(True)
    try:
        with _instrumentation.simulated_copy_delay(None if path == "device-in-flight" else 0):
            yield
    finally:
        _instrumentation.force_device_path(False)


def assert_sync_free_life(metric: Any, batches: Sequence[tuple[Any, ...]], updates: int = 1) -> None:
    """``update`` with the first ``updates`` batches, ``forward`` with the rest, then ``compute``: no would-be sync."""
    with SyncProbe() as probe:
        for batch in batches[:updates]:
            metric.update(*batch)
        for batch in batches[updates:]:
            metric(*batch)
        metric.compute()
    assert probe.count == 0, probe.events


def warning_messages(run: Callable[[], Any], containing: str) -> list[str]:
    """The messages of the warnings ``run()`` emits whose text contains ``containing`` (every one, none filtered)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if containing in str(w.message)]


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


def graph_breaks(explanation: Any) -> list[str]:
    """One line per graph break of a ``torch._dynamo.explain`` result: its reason, or a placeholder.

    Some breaks count in ``graph_break_count`` without an entry in ``break_reasons`` (torch 2.13: a generator that
    Dynamo cannot trace, e.g. ``math.prod(x for x in ...)``): a test that asserted ``break_reasons == []`` passed over
    them. They are named here, so that asserting ``graph_breaks(...) == []`` sees every break.
    """
    reasons = [str(reason.reason).split("\n")[0] for reason in explanation.break_reasons]
    unnamed = explanation.graph_break_count - len(reasons)
    return reasons + ["a graph break without a reason in torch._dynamo.explain"] * max(0, unnamed)
