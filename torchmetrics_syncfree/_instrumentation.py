"""The library's one test seam: a device simulated on CPU tensors, and a sync probe's hooks.

Outside tests :data:`hooks` is ``None`` and every question below is one global read. Tests install what they need
through the functions here, never through module globals of the library's hot path:

- :func:`force_device_path` (the pytest option ``--syncfree-device-path``, the environment variable
  :data:`DEVICE_PATH_ENV_VAR`): CPU tensors take the device path, what a GPU run does, seen on the CPU;
- :func:`simulated_copy_delay` and :func:`copy_interval`: the timing of the check counters' host copy there;
- a CPU :class:`~torchmetrics_syncfree.probe.SyncProbe` (:func:`install_probe`): it simulates a GPU while entered,
  keeps the library's reads of host memory (a constant made once, the host copy of the counters) out of its count
  (:func:`quiet`), and records where a GPU's host would wait (:func:`report_host_wait`). The library never imports
  the probe.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

#: Set to ``1`` to take the device path on CPU tensors too (as :func:`force_device_path`).
DEVICE_PATH_ENV_VAR = "TORCHMETRICS_SYNCFREE_DEVICE_PATH"


class ProbeHooks(Protocol):
    """What an entered CPU probe answers and records."""

    def simulating_device(self) -> bool:
        """Whether this thread simulates a GPU now: reads cost what they would there."""

    def quiet(self) -> AbstractContextManager[None]:
        """A context whose reads of host memory are not counted (they never synchronize on a GPU)."""

    def report_host_wait(self, op: str, skip: tuple[str, ...]) -> None:
        """Record that the host waits for the device here (``skip``: files not to attribute the wait to)."""


class Hooks:
    """What tests installed: the simulated device's switches and the entered CPU probes' hooks.

    ``device_path``: every CPU tensor takes the device path; ``copy_delay``: on a simulated device, the sweeps after
    which a launched host copy of the counters has arrived (``None``: never, until ``compute()`` waits for it);
    ``copy_interval``: sweeps from one host copy to the next (``None``: the library's own); ``probe``: the hooks of
    the entered CPU probes.
    """

    def __init__(self) -> None:
        self.device_path = False
        self.copy_delay: int | None = 0
        self.copy_interval: int | None = None
        self.probe: ProbeHooks | None = None

    def is_inert(self) -> bool:
        return not self.device_path and self.copy_delay == 0 and self.copy_interval is None and self.probe is None

    def simulating_device(self) -> bool:
        probe = self.probe
        return self.device_path or (probe is not None and probe.simulating_device())


#: what tests installed, ``None`` where nothing is (outside tests)
hooks: Hooks | None = None
_settings = Hooks()
_NOTHING_WATCHES = nullcontext()


def _apply() -> None:
    global hooks
    hooks = None if _settings.is_inert() else _settings


def install_probe(probe: ProbeHooks | None) -> None:
    """Install the entered CPU probes' hooks (``None``: no probe is entered)."""
    _settings.probe = probe
    _apply()


def force_device_path(enabled: bool) -> None:
    """Take the device path (counters, reports at eager points) for CPU tensors too; for tests of the GPU path."""
    _settings.device_path = enabled
    _apply()


def device_path_forced() -> bool:
    """Whether :func:`force_device_path` (or :data:`DEVICE_PATH_ENV_VAR`) is in effect."""
    return _settings.device_path


@contextmanager
def _switched(name: str, value: int | None) -> Iterator[None]:
    """The simulation's setting ``name`` at ``value`` inside, its previous value after."""
    previous = getattr(_settings, name)
    setattr(_settings, name, value)
    _apply()
    try:
        yield
    finally:
        setattr(_settings, name, previous)
        _apply()


def simulated_copy_delay(sweeps: int | None) -> AbstractContextManager[None]:
    """On a simulated device, let the host copy of the counters arrive ``sweeps`` sweeps after it was launched.

    ``0`` (the default) is a device that has always finished by the end of the update; ``1`` a GPU that is one step
    behind the host; ``None`` one that never finishes before ``compute()`` waits for it. For tests of the timing.
    """
    return _switched("copy_delay", sweeps)


def copy_interval(sweeps: int) -> AbstractContextManager[None]:
    """Start a host copy of the counters every ``sweeps`` sweeps instead of the library's interval.

    ``1``: every sweep whose previous copy has arrived. For tests of the timing.
    """
    if sweeps < 1:
        raise ValueError(f"Expected a positive number of sweeps, got {sweeps}")
    return _switched("copy_interval", sweeps)


def simulating_device() -> bool:
    """Whether CPU tensors take the device path in this thread now (forced, or a CPU probe entered)."""
    installed = hooks
    return installed is not None and installed.simulating_device()


def quiet() -> AbstractContextManager[None]:
    """Reads of host memory inside are not a probe's events (a shared null context where no probe watches)."""
    installed = hooks
    probe = None if installed is None else installed.probe
    return _NOTHING_WATCHES if probe is None else probe.quiet()


def report_host_wait(op: str, skip: tuple[str, ...] = ()) -> None:
    """Tell an entered CPU probe that the host waits for the device here, as it would on a GPU."""
    installed = hooks
    probe = None if installed is None else installed.probe
    if probe is not None:
        probe.report_host_wait(op, skip)


force_device_path(os.environ.get(DEVICE_PATH_ENV_VAR, "") not in ("", "0"))
