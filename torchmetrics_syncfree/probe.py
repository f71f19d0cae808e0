"""The sync probe: count the host-device synchronizations a piece of code would cause on a GPU.

On CPU tensors nothing ever synchronizes, so a CPU test cannot see a stall directly. The probe watches for the
operations that *would* synchronize if the same code ran on CUDA tensors, and reports each one with the source line
that issued it:

``device-to-host read``
    A device value turned into a Python value: ``.item()``, ``bool(t)``, ``if t:``, ``int(t)``, ``float(t)``,
    ``torch.equal``, ``.tolist()``, ``.numpy()``.
``data-dependent shape``
    An op whose output shape depends on tensor data, so the host must wait for the result: boolean-mask indexing
    and assignment, ``nonzero``, ``torch.where(cond)``, ``masked_select``, ``unique``, ``bincount``,
    ``repeat_interleave`` without ``output_size``.
``host-to-device copy``
    A tensor built from Python data (``torch.tensor(0.5)``, ``torch.as_tensor([1, 2])``, ``new_tensor``): on a GPU
    this copies from pageable host memory. ``torch.full(shape, value)`` passes the value as a kernel argument and
    is not reported.
``host wait``
    torchmetrics_syncfree itself blocked on a pending asynchronous check (only ever in ``compute()``).

With ``device="cuda"`` the same API counts the real synchronizations reported by
:func:`torch.cuda.set_sync_debug_mode`.

While a CPU probe is active, torchmetrics_syncfree's own asynchronous checks take the path they take on CUDA
(flag copied to a host buffer, read later when it is known to be ready) instead of the immediate check they use on
CPU, so what the probe counts is what a GPU run would do.

Example:
    >>> import torch
    >>> from torchmetrics_syncfree import SyncProbe
    >>> x = torch.tensor([1.0, float("nan")])
    >>> with SyncProbe() as probe:
    ...     if torch.isnan(x).any():
    ...         pass
    >>> probe.count
    1
    >>> probe.events[0].kind
    'device-to-host read'

"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import ContextDecorator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from torchmetrics_syncfree import _instrumentation

D2H_READ = "device-to-host read"
DATA_DEPENDENT_SHAPE = "data-dependent shape"
H2D_COPY = "host-to-device copy"
HOST_WAIT = "host wait"
CUDA_SYNC = "cuda sync"

_aten = torch.ops.aten
_D2H_OPS = {_aten._local_scalar_dense.default, _aten.equal.default, _aten.is_nonzero.default}
_SHAPE_OPS = {
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.unique_dim_consecutive.default,
    _aten.bincount.default,
    _aten.argwhere.default,
}
_INDEX_OPS = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_REPEAT_INTERLEAVE_OPS = {_aten.repeat_interleave.Tensor, _aten.repeat_interleave.self_Tensor}
_FACTORIES_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}
_HOST_CONVERSIONS = {torch.Tensor.tolist, torch.Tensor.numpy}
#: torch functions whose host reads run on CPU tensors only: ``quantile`` checks that ``q`` is in [0, 1] with a read
#: (``aten.equal`` before torch 2.6 or so) where the input is on the CPU, and skips the check on accelerators
_CPU_ONLY_READS = {torch.quantile, torch.nanquantile, torch.Tensor.quantile, torch.Tensor.nanquantile}

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_PACKAGE_DIR = os.path.dirname(_THIS_FILE) + os.sep
_LIBRARY_DIRS: tuple[str, ...] = (_PACKAGE_DIR,)
try:  # frames inside TorchMetrics are library frames for the "caller" column
    import torchmetrics as _tm

    _LIBRARY_DIRS += (os.path.dirname(_tm.__file__) + os.sep,)
except ImportError:  # pragma: no cover - torchmetrics is a hard dependency
    pass
_STDLIB_FILES = {os.path.abspath(__import__("contextlib").__file__), os.path.abspath(__import__("functools").__file__)}

_state = threading.local()
_count_lock = threading.Lock()


@dataclass(frozen=True)
class SyncEvent:
    """One would-be synchronization.

    Attributes:
        kind: one of ``device-to-host read``, ``data-dependent shape``, ``host-to-device copy``, ``host wait``,
            ``cuda sync``.
        op: the operation, e.g. ``aten._local_scalar_dense`` or ``torch.as_tensor``.
        location: ``file:line`` of the innermost frame outside PyTorch, i.e. the line that issued the op.
        caller: ``file:line`` of the innermost frame outside PyTorch, TorchMetrics and this package: the user's
            line that led to it (equal to ``location`` when the op is in user code).
        source: the source text of ``location``.
        library: ``file:line`` of the innermost frame inside TorchMetrics or this package (``""`` when none is on
            the stack): the library line responsible, where ``location`` may be a helper of another package (NumPy,
            SciPy, ``lightning_utilities``) that the library called.

    """

    kind: str
    op: str
    location: str
    caller: str
    source: str = ""
    library: str = ""

    def __str__(self) -> str:
        where = self.location if self.caller == self.location else f"{self.location} (called from {self.caller})"
        text = f"{self.kind}: {self.op} at {where}"
        return f"{text}\n    {self.source}" if self.source else text


def _frames(start: FrameType | None) -> Iterator[FrameType]:
    frame = start
    while frame is not None:
        yield frame
        frame = frame.f_back


def _is_internal(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename == _THIS_FILE or filename in _STDLIB_FILES


def _attribute(frame: FrameType | None, skip: tuple[str, ...] = ()) -> tuple[str, str, str, str]:
    """(location, caller, source line, innermost library frame) for the stack above ``frame``, past ``skip`` files."""
    import linecache

    location = caller = "<unknown>"
    source = library = ""
    for f in _frames(frame):
        filename = os.path.abspath(f.f_code.co_filename)
        if _is_internal(filename) or filename in skip:
            continue
        where = f"{filename}:{f.f_lineno}"
        if not source:
            location, source = where, linecache.getline(filename, f.f_lineno).strip() or " "
        if filename.startswith(_LIBRARY_DIRS):
            library = library or where
        elif caller == "<unknown>":
            caller = where
        if library and caller != "<unknown>":
            break
    if caller == "<unknown>":
        caller = location
    return location, caller, source.strip(), library


#: CPU probes active in any thread; simulating_device() answers without thread-local lookups while it is 0
_cpu_probes_entered = 0


def _active_probes() -> list[SyncProbe]:
    probes = getattr(_state, "probes", None)
    if probes is None:
        probes = _state.probes = []
    return probes


def simulating_device() -> bool:
    """True while a CPU probe is active in this thread: asynchronous checks then follow their CUDA path."""
    if not _cpu_probes_entered:  # the hot path of every patched update outside tests: one global read
        return False
    return any(p.device_type == "cpu" for p in _active_probes()) and not getattr(_state, "quiet", 0)


class _Quiet:
    """The context of :func:`quiet`: a class, not a generator (it runs in every host copy of the check counters)."""

    def __enter__(self) -> None:
        _state.quiet = getattr(_state, "quiet", 0) + 1

    def __exit__(self, *exc_info: object) -> None:
        _state.quiet -= 1


_QUIET = _Quiet()


def quiet() -> _Quiet:
    """Do not count what happens inside: for reads of host-side buffers that cannot synchronize on a GPU."""
    return _QUIET


class _Hooks:
    """What the library tells the CPU probes (installed in ``_instrumentation`` while any is entered)."""

    def simulating_device(self) -> bool:
        return simulating_device()

    def quiet(self) -> _Quiet:
        return _QUIET

    def report_host_wait(self, op: str, skip: tuple[str, ...]) -> None:
        report(HOST_WAIT, op, skip=(*skip, _INSTRUMENTATION_FILE))  # the wait is the caller's, not the hook's


_HOOKS = _Hooks()
_INSTRUMENTATION_FILE = os.path.abspath(_instrumentation.__file__)


def report(kind: str, op: str, probes: list[SyncProbe] | None = None, skip: tuple[str, ...] = ()) -> None:
    """Record an event on ``probes`` (default: every active CPU probe, e.g. for this package's own host waits).

    ``skip``: absolute paths of files whose frames the event is not attributed to (this package's machinery that
    reads on behalf of its caller: the wait is the caller's, e.g. a ``reset()`` or ``compute()``).
    """
    if getattr(_state, "quiet", 0):
        return
    if probes is None:
        probes = [p for p in _active_probes() if p.device_type == "cpu"]
    if not probes:
        return
    location, caller, source, library = _attribute(sys._getframe(1), skip)
    event = SyncEvent(kind, op, location, caller, source, library)
    for probe in probes:
        probe.events.append(event)


def _has_bool_index(indices: Any) -> bool:
    return any(isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) for index in indices or ())


class _DispatchWatcher(TorchDispatchMode):
    # nested probes each push a watcher, and every watcher sees each op once: report to the own probe only
    def __init__(self, probe: SyncProbe) -> None:
        super().__init__()
        self.probe = [probe]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        kind = None
        if func in _D2H_OPS:
            kind = D2H_READ
        elif (
            func in _SHAPE_OPS
            or (func in _INDEX_OPS and len(args) > 1 and _has_bool_index(args[1]))
            or (func in _REPEAT_INTERLEAVE_OPS and kwargs.get("output_size") is None)
        ):
            kind = DATA_DEPENDENT_SHAPE
        if kind is not None:
            report(kind, f"aten.{func.__name__}", self.probe)
        return func(*args, **kwargs)


class _FunctionWatcher(TorchFunctionMode):
    def __init__(self, probe: SyncProbe) -> None:
        super().__init__()
        self.probe = [probe]

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _FACTORIES_FROM_DATA:
            data = args[1] if func is torch.Tensor.new_tensor else (args[0] if args else kwargs.get("data"))
            if not isinstance(data, torch.Tensor):
                report(H2D_COPY, _function_name(func), self.probe)
        elif func in _HOST_CONVERSIONS:
            report(D2H_READ, _function_name(func), self.probe)
        elif func in _CPU_ONLY_READS:
            with quiet():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _function_name(func: Any) -> str:
    name = getattr(func, "__name__", repr(func))
    return f"Tensor.{name}" if getattr(torch.Tensor, name, None) is func else f"torch.{name}"


class SyncProbe(ContextDecorator):
    """Count would-be host-device synchronizations of the code run inside the ``with`` block.

    Args:
        device: ``"cpu"`` (default) watches CPU code for operations that would synchronize on a GPU;
            ``"cuda"`` counts the real synchronizations through :func:`torch.cuda.set_sync_debug_mode`.

    Attributes:
        events: the :class:`SyncEvent` list, in order.

    Example:
        >>> import torch
        >>> from torchmetrics.aggregation import MeanMetric
        >>> from torchmetrics_syncfree import SyncProbe, patched
        >>> loss = torch.tensor(0.25)
        >>> metric = MeanMetric()
        >>> with SyncProbe() as stock:
        ...     metric.update(loss)
        >>> stock.count > 0
        True
        >>> with patched(), SyncProbe() as probe:
        ...     metric.update(loss)
        >>> probe.count
        0

    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device_type = torch.device(device).type
        if self.device_type not in ("cpu", "cuda"):
            raise ValueError(f"SyncProbe counts syncs for 'cpu' (simulated) or 'cuda', got {device!r}")
        self.events: list[SyncEvent] = []
        self._modes: list[Any] = []
        self._warnings: Any = None
        self._previous_debug_mode = 0

    @property
    def count(self) -> int:
        """Number of events recorded."""
        return len(self.events)

    def counts(self) -> dict[str, int]:
        """Events per kind."""
        return dict(Counter(event.kind for event in self.events))

    def __enter__(self) -> SyncProbe:
        if self.device_type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("SyncProbe(device='cuda') needs CUDA; use the default CPU probe instead")
            self._warnings = warnings.catch_warnings(record=True)
            self._records = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.synchronize()
            self._previous_debug_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._modes = [_FunctionWatcher(self), _DispatchWatcher(self)]
            for mode in self._modes:
                mode.__enter__()
        _active_probes().append(self)
        self._count_cpu_probe(+1)
        return self

    def _count_cpu_probe(self, change: int) -> None:
        global _cpu_probes_entered
        if self.device_type == "cpu":
            with _count_lock:
                _cpu_probes_entered += change
                _instrumentation.install_probe(_HOOKS if _cpu_probes_entered else None)

    def __exit__(self, *exc: Any) -> None:
        _active_probes().remove(self)
        self._count_cpu_probe(-1)
        if self.device_type == "cuda":
            torch.cuda.set_sync_debug_mode(self._previous_debug_mode)
            for record in self._records:
                if "synchroniz" in str(record.message):
                    filename = os.path.abspath(record.filename)
                    where = f"{filename}:{record.lineno}"
                    self.events.append(SyncEvent(CUDA_SYNC, str(record.message).split("\n")[0], where, where))
                else:  # not ours: hand it back to the warnings machinery
                    warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)
            self._warnings.__exit__(*exc)
        else:
            for mode in reversed(self._modes):
                mode.__exit__(*exc)
            self._modes = []

    def summary(self) -> str:
        """A readable report: the count per kind, then every event with its source line."""
        if not self.events:
            return "no would-be syncs"
        head = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts().items()))
        return f"{self.count} would-be syncs ({head}):\n" + "\n".join(f"  {event}" for event in self.events)

    def assert_no_syncs(self) -> None:
        """Raise :class:`AssertionError` listing the events if any were recorded."""
        if self.events:
            raise AssertionError(self.summary())
