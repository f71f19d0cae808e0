"""What the library tells a sync probe: hooks that a CPU probe installs while active, ``None`` otherwise.

A CPU :class:`~torchmetrics_syncfree.probe.SyncProbe` simulates a GPU on CPU tensors. The library then reads no check
counter at once (on a GPU the read would synchronize), keeps its own reads of host memory (a constant made once, the
host copy of the counters) out of the probe's count, and reports where a GPU's host would wait (a copy still in
flight). The library never imports the probe: the probe installs its :class:`Hooks` here while one is entered, and
outside tests each hook is one global read (:data:`hooks` is ``None``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol


class Hooks(Protocol):
    """What an installed probe answers and records."""

    def simulating_device(self) -> bool:
        """Whether this thread simulates a GPU now: reads cost what they would there."""

    def quiet(self) -> AbstractContextManager[None]:
        """A context whose reads of host memory are not counted (they never synchronize on a GPU)."""

    def report_host_wait(self, op: str, skip: tuple[str, ...]) -> None:
        """Record that the host waits for the device here (``skip``: files not to attribute the wait to)."""


#: the installed hooks (a CPU probe's while one is entered in any thread), else ``None``
hooks: Hooks | None = None
_NOTHING_WATCHES = nullcontext()


def install(new_hooks: Hooks | None) -> None:
    """Install ``new_hooks`` (``None``: no probe is active)."""
    global hooks
    hooks = new_hooks


def simulating_device() -> bool:
    """Whether a CPU probe simulates a GPU in this thread now."""
    installed = hooks
    return installed is not None and installed.simulating_device()


def quiet() -> AbstractContextManager[None]:
    """Reads of host memory inside are not a probe's events (a shared null context where no probe watches)."""
    installed = hooks
    return _NOTHING_WATCHES if installed is None else installed.quiet()


def report_host_wait(op: str, skip: tuple[str, ...] = ()) -> None:
    """Tell an active CPU probe that the host waits for the device here, as it would on a GPU."""
    installed = hooks
    if installed is not None:
        installed.report_host_wait(op, skip)
