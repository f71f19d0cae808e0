"""Input checks kept as metric state: counted on the device, reported at eager points, never read inside an update.

Stock TorchMetrics validates inputs with ``if flag.any(): raise/warn``, which reads a device value on the host: a
synchronization on every ``update``. Here every metric that checks its inputs owns a small integer state,
``_deferred_checks``, with one counter per kind of check (:class:`Check`); the kinds, the reader of the counters' host
copy and the wrappers' holds are the metric's :class:`DeferredChecks`. An update that finds a problem adds the 0-dim
flag to its counter in place (:func:`record`): pure tensor work on the metric's own tensor, so it traces under
``torch.compile(fullgraph=True)`` and replays in a CUDA graph. Because the counters are a metric state
(``dist_reduce_fx="sum"``, not persistent), everything TorchMetrics does to a metric carries them without special
cases: ``reset()``, ``deepcopy``/``pickle``/``clone()``, ``merge_state``, ``forward()``'s cache and restore, the
shared states of ``MetricCollection`` compute groups, the states of wrappers, and DDP's sync (all ranks see the sum,
so all ranks report alike).

When the counters are read:

* where reads are free (:func:`reads_are_free`: a CPU tensor, eager, no CPU probe simulating a GPU) the flag is read
  at once inside :func:`record`, before the update changes anything: stock's behaviour and timing. The counters stay
  zero;
* on the device path the counters are read only at eager points: at the end of an eager ``update``/``forward``
  (:func:`sweep`: on CUDA through one pinned host buffer and one event per metric, never a host wait, so a problem
  is reported a step or two later; in a simulated device run at once), by ``compute()`` (:func:`report_pending`,
  called once the states are synced: the one read that may wait) and by ``reset()`` (:func:`take_pending`, before
  the states are dropped). Inside ``forward()`` (which resets and computes internally) and while tracing with
  ``torch.compile`` nothing is read.

Reporting consumes the counts it reports (in place, so copies that share the tensor see it), so every offending
update is reported once: a warning per offending update, an error once. Under DDP with ``sync_on_compute`` the
sweep stays quiet and ``compute()`` reports the synced counts, so either every rank raises or none does.

While a CPU :class:`~torchmetrics_syncfree.probe.SyncProbe` is active, or with
:func:`~torchmetrics_syncfree._instrumentation.force_device_path` (the pytest option ``--syncfree-device-path``), CPU
tensors take the device path: what a GPU run does, seen on the CPU. The switches of that simulation are the test seam
in :mod:`torchmetrics_syncfree._instrumentation`, read through its one ``hooks`` global.

"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from torchmetrics_syncfree import _compat, _instrumentation
from torchmetrics_syncfree._registry import stock
from torchmetrics_syncfree._states import read_only

#: The metric state holding one counter per kind of check.
STATE = "_deferred_checks"
#: The instance attribute holding the metric's :class:`DeferredChecks` (the kinds, the reader, the holds).
CHECKS = "_deferred_check_owner"
_THIS_FILE = (os.path.abspath(__file__),)
#: Sweeps from one host copy of a metric's counters to the next: a copy is two kernel launches (a device snapshot and
#: its asynchronous host copy) plus an event, where the sweeps between launch nothing. A problem is reported at most
#: this many updates (plus the copy's own delay) after it happened, or at the next ``compute()``/``reset()``; the
#: first update of a metric, and the first after each ``compute()``/``reset()``, is copied at once.
COPY_INTERVAL = 8


class Check:
    """A kind of problem an update can find: stock's message and its exception or warning class.

    Checks are module-level constants, compared by identity and pickled by reference (their ``key``), so that a
    pickled metric reports through the same checks.

    Example:
        >>> import warnings
        >>> from torchmetrics_syncfree._deferred import Check
        >>> BAD_BATCH = Check("example.bad-batch", "two bad batches", UserWarning)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     BAD_BATCH.report(2)
        >>> len(caught)
        2

    """

    __slots__ = ("category", "is_error", "key", "message")

    def __init__(self, key: str, message: str, category: type[Exception] | type[Warning]) -> None:
        self.key = key
        self.message = message
        self.category = category
        #: whether the check raises (once) rather than warns (once per offending update)
        self.is_error = not issubclass(category, Warning)
        _checks[key] = self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _check, (self.key,)

    def __repr__(self) -> str:
        return f"Check({self.key!r})"

    def report(self, count: int) -> None:
        """Report ``count`` offending updates: one warning each, or one error for all of them."""
        if self.is_error:
            raise self.category(self.message)
        for _ in range(count):
            rank_zero_warn(self.message, self.category)


_checks: dict[str, Check] = {}


def _check(key: str) -> Check:
    return _checks[key]


#: The check of input validation (``validate_args``) on the device path: the values of an update are not valid for
#: the metric. Where reads are free the metric raises at once, naming the values, instead.
INVALID_VALUES = Check(
    "invalid-values",
    "Detected values in `preds` or `target` of an update that are not valid for this metric (labels outside"
    " [0, num_classes) or the ignore_index; values other than 0 and 1 where binary labels are expected); that batch"
    " was left out of the state.",
    RuntimeError,
)


class DeferredChecks:
    """What a metric's deferred checks are besides their counters (a metric state), owned by the metric.

    ``kinds``: the kind of check of each counter; ``reader``: the asynchronous read of the counters' host copy
    (:class:`_Reader`, made at the first sweep on the device path); ``holds``: how many wrappers (or ``forward``) hold
    the metric now (:func:`held`). A copy or a pickle of the metric gets a new object with the same kinds only: never
    the reader's buffers and event (a copy reads its counters through its own), never a hold (a copy made inside a
    hold is not held).
    """

    def __init__(self, kinds: Sequence[Check] = ()) -> None:
        self.kinds: tuple[Check, ...] = tuple(kinds)
        self.reader: _Reader | None = None
        self.holds = 0

    def __reduce__(self) -> tuple[Any, tuple[tuple[Check, ...]]]:
        # ``copy.copy``, ``copy.deepcopy`` and ``pickle`` all rebuild from this: the kinds (checks pickle by key, so
        # a deep copy keeps the same objects), a new reader and no hold
        return DeferredChecks, (self.kinds,)

    def __repr__(self) -> str:
        return f"DeferredChecks({self.kinds!r}, holds={self.holds})"


def _checks_of(metric: Any) -> DeferredChecks:
    """The :class:`DeferredChecks` of ``metric``, made (without kinds) for a metric that has none yet."""
    checks = metric.__dict__.get(CHECKS)
    if checks is None:
        checks = DeferredChecks()
        object.__setattr__(metric, CHECKS, checks)
    return checks


_is_dynamo_compiling, _compiling_flags = _compat.is_dynamo_compiling, _compat.compiling_flags
is_compiling = _compat.is_compiling


def reads_are_free(tensor: Tensor) -> bool:
    """Whether reading ``tensor`` on the host costs nothing right now.

    True for a CPU tensor in eager code, unless tests simulate a GPU (``_instrumentation``: a CPU probe, the forced
    device path). Code that avoids host reads for the GPU's sake may take stock's (or a cheaper) host-reading path when
    this is true; while ``torch.compile`` traces it is false on every device, so traced code never reads.
    """
    # the hooks read inline: outside tests none are installed, and this runs several times per update
    hooks = _instrumentation.hooks
    return (
        tensor.is_cpu
        and not (hooks is not None and hooks.simulating_device())
        and not _is_dynamo_compiling()
        and not _compiling_flags._is_compiling_flag
    )


def inside_forward(metric: Any) -> bool:
    """True while ``Metric.forward`` runs: it clears ``_should_unsync`` for its internal reset, update and compute."""
    return not metric.__dict__.get("_should_unsync", True)  # an instance attribute: no attribute lookup chain


# --------------------------------------------------------------------------------------------------------------------
# the state


def add_checks(metric: Any, kinds: Sequence[Check], size: int = 1) -> None:
    """Give ``metric`` its check counters: ``size`` zeros, reported as ``kinds`` (empty: nothing is ever read).

    The counters are a metric state (summed across ranks, not persistent), so that every operation on the metric's
    states carries them. Their number does not depend on ``kinds``: metrics that differ only in which checks they
    run keep the same states (e.g. for ``MetricCollection`` compute groups).
    """
    metric.add_state(STATE, torch.zeros(size, dtype=torch.int32), dist_reduce_fx="sum", persistent=False)
    _checks_of(metric).kinds = tuple(kinds)
    mark_zero(metric.__dict__[STATE])


def validation_kinds(metric: Any) -> tuple[Check, ...]:
    """The check of ``validate_args``: reported when the metric validates, nothing otherwise."""
    return (INVALID_VALUES,) if metric.validate_args else ()


def checked_init(
    target: str, module: str, kinds: Callable[[Any], tuple[Check, ...]] = validation_kinds, size: int = 1
) -> Callable[..., None]:
    """A replacement of the ``__init__`` at the patch target ``target``: stock's, then the metric's check counters.

    ``module`` is the declaring area's module (the registry finds a replacement's area by its ``__module__``);
    ``kinds(metric)`` are the checks it reports, counted in ``size`` counters.
    """

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        stock(target)(self, *args, **kwargs)
        add_checks(self, kinds(self), size=size)

    __init__.__module__ = module
    __init__.__doc__ = "Stock's ``__init__``, plus the counters of the metric's checks."
    return __init__


def kinds_of(metric: Any) -> tuple[Check, ...]:
    """The kinds of check whose counters ``metric`` reports (empty for a metric without checks)."""
    checks = metric.__dict__.get(CHECKS)
    return () if checks is None else checks.kinds


def counters_of(metric: Any) -> Tensor | None:
    """The check counters of ``metric``, or ``None`` for a metric that has none."""
    return metric.__dict__.get(STATE)


def keep_kinds(metric: Any, kinds: tuple[Check, ...], size: int = 1) -> None:
    """Report ``kinds`` from now on (a tuple comparison when they are unchanged: cheap enough for every update).

    For metrics whose checks depend on attributes set after the base ``__init__`` added the counters (CohenKappa,
    AUROC, ... set ``validate_args`` afterwards); a metric made before the patch gets its ``size`` counters here.
    """
    if kinds_of(metric) == kinds:
        return
    if counters_of(metric) is None:
        add_checks(metric, kinds, size)
        counters = counters_of(metric).to(metric.device)
        setattr(metric, STATE, counters)
        mark_zero(counters)
    _checks_of(metric).kinds = kinds


def _ensure_counters(metric: Any, kind: Check) -> Tensor:
    """The counters of ``metric`` with ``kind`` among its kinds; added for a metric made before the patch."""
    counters = counters_of(metric)
    if counters is None:
        add_checks(metric, (kind,))
        counters = counters_of(metric).to(metric.device)
        setattr(metric, STATE, counters)
        mark_zero(counters)
    elif all(known is not kind for known in kinds_of(metric)):
        if counters.numel() != 1:
            raise ValueError(f"{type(metric).__name__} has no counter for the check {kind.message!r}")
        _checks_of(metric).kinds = (kind,)  # the metric's setting changed since it was made
    return _writable(metric, counters)


def _writable(metric: Any, counters: Tensor) -> Tensor:
    """``counters``, or, where they cannot be written in place now, a normal copy installed in their place.

    A ``reset()`` or ``forward()`` under ``torch.inference_mode()`` (Lightning's evaluation) makes the states, the
    counters among them, inference tensors, which no in-place op may write outside inference mode. Stock's own states
    fail there or not as stock's code decides; the counters are ours and must never be the reason a metric fails.
    Never while tracing (:func:`~torchmetrics_syncfree._states.read_only`).
    """
    if not read_only(counters):
        return counters
    counters = counters.clone()  # outside inference mode, a copy of an inference tensor is a normal tensor
    setattr(metric, STATE, counters)
    return counters


def record(metric: Any, kind: Check, flag: Tensor, report_at_once: Callable[[], None] | None = None) -> bool:
    """File the 0-dim bool ``flag`` ("this update has the problem ``kind``") for ``metric``.

    Where reads are free the flag is read at once and, if set, reported at once (an error raises before the update
    changes anything): by ``report_at_once`` where given (stock's error, which names the values it found: they are
    read only then), else as ``kind``. On the device path it is added to the metric's counter in place and reported
    later. ``flag`` may also be a 0-dim integer count (a ``compute`` that finds the problem in several classes warns
    once per class, as stock).

    Returns:
        ``False`` when the flag is known to be clear, ``True`` when it is set or not read: callers use this to skip
        the masking that only matters when it is set.

    """
    if reads_are_free(flag):
        count = int(flag)
        if count:
            if report_at_once is None:
                kind.report(count)
            else:
                report_at_once()
            return True
        return False
    attributes = metric.__dict__
    counters, checks = attributes.get(STATE), attributes.get(CHECKS)
    if counters is not None and checks is not None and checks.kinds == (kind,) and not read_only(counters):
        counters.add_(flag)  # the common case, once per update: one counter, no slot to index
        return True
    counters = _ensure_counters(metric, kind)
    counters[_slot(metric, kind)].add_(flag)
    return True


def record_in_compute(
    metric: Any, kind: Check, count: Tensor, report_at_once: Callable[[], None] | None = None
) -> None:
    """File ``count`` (0-dim) problems of ``kind`` that ``compute()`` found: :func:`record`, kept past its end.

    While the states are synced (``compute()`` under DDP) the counters are the synced copy, which ``unsync()`` drops:
    the count goes to the rank's own counters, which it restores. Under ``torch.distributed`` only rank zero files
    it: stock reports with ``rank_zero_warn``, and the next sync sums the ranks' counters.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank():
        return
    cache = metric.__dict__.get("_cache")
    if getattr(metric, "_is_synced", False) and cache and STATE in cache and not reads_are_free(count):
        _ensure_counters(metric, kind)
        if read_only(cache[STATE]):
            cache[STATE] = cache[STATE].clone()  # as ``_writable``: restored by ``unsync()``, written here
        cache[STATE][_slot(metric, kind)].add_(count)
        return
    record(metric, kind, count, report_at_once)


def _slot(metric: Any, kind: Check) -> int:
    for slot, known in enumerate(kinds_of(metric)):
        if known is kind:
            return slot
    raise ValueError(f"{type(metric).__name__} does not report {kind!r}")


# counters known to be all zero at a version: id(counters) -> (weak reference, version). Only CPU counters are
# entered: a CUDA graph replay can write CUDA counters without bumping their version.
_zero: dict[int, tuple[weakref.ref, int]] = {}


def mark_zero(counters: Tensor) -> None:
    """Remember that ``counters`` are all zero now, so that an eager point need not read them.

    CPU only, and not for an inference tensor (made under ``torch.inference_mode()``): it has no version counter
    to tell a later write, so such counters are read at the next eager point, as CUDA counters always are.
    """
    if _is_dynamo_compiling():  # eager bookkeeping: a traced reset (inside a compiled forward) marks nothing
        return
    if counters.is_cpu and not counters.is_inference():
        key = id(counters)
        entry = _zero.get(key)
        if entry is not None and entry[0]() is counters:  # known (at an older version): its reference serves on
            _zero[key] = (entry[0], counters._version)
        else:
            _zero[key] = (weakref.ref(counters, lambda _, key=key: _zero.pop(key, None)), counters._version)


def _surely_zero(counters: Tensor) -> bool:
    entry = _zero.get(id(counters))
    return entry is not None and entry[0]() is counters and entry[1] == counters._version


def is_held(metric: Any) -> bool:
    """Whether a wrapper holds ``metric`` now (:func:`held`): counted in its :class:`DeferredChecks`."""
    checks = metric.__dict__.get(CHECKS)
    return checks is not None and checks.holds > 0


def hold(metric: Any) -> None:
    """Hold ``metric`` until :func:`release` (:func:`held` is the context manager; this pair serves ``forward``)."""
    _checks_of(metric).holds += 1


def release(metric: Any) -> None:
    """End one :func:`hold` of ``metric``."""
    metric.__dict__[CHECKS].holds -= 1


@contextmanager
def held(*metrics: Any) -> Iterator[None]:
    """A wrapper's internal calls of the metrics it wraps: their pending counts travel on to the next eager point.

    Wrappers reset and compute the metrics they wrap as part of their own ``update``/``forward`` (``Running`` after
    every update, ``MinMaxMetric`` and ``BootStrapper`` inside ``forward``). A ``reset()`` reads the counters before it
    drops the states (:func:`take_pending`): on a GPU, where they are never known to be zero, a host wait inside every
    such call. While held (:func:`is_held`), a metric is in quiet time (:func:`_quiet_time`): its ``reset()`` resets
    every state but the counters, which keep what they hold, its ``compute()`` reports nothing and the end of its
    update (:func:`sweep`) reads nothing. The counts stay in the metric's own counters, each once, until an eager point
    reads them: the wrapper's ``compute()`` (the wrapped metric's compute), a user's ``reset()``, or an update outside
    the hold. Holds nest. ``forward`` holds a metric too, around its own state work (:func:`forward_holds_counters`).
    """
    holding = [metric for metric in metrics if STATE in metric.__dict__]
    for metric in holding:
        hold(metric)
    try:
        yield
    finally:
        for metric in holding:
            release(metric)


def forward_holds_counters(metric: Any) -> tuple[bool, bool]:
    """Whether ``forward`` holds the check counters (:func:`hold`) out of its state copy, reset and reduction.

    Its one update of the batch is the update whose problems they count, so the counters stay where they are: written
    in place by that update (and by the batch's ``compute``, which files its warnings), and read by the sweep at the
    end. Stock's state work would copy, reset and sum them back (three kernel launches per ``forward`` on a GPU) for
    the same result. Where reads are free :func:`record` never writes them (idle counters): they keep, in place,
    whatever they held before (pending counts stay pending). Not held: the counters of a metric that syncs its states
    in ``forward`` (``dist_sync_on_step``: the sync's copy of the states must restore them), and while
    ``torch.compile`` traces (the traced forward keeps stock's state work).

    Returns:
        ``(hold, idle)``: whether to hold them, and whether they are idle, so that ``forward`` need not sweep.

    """
    counters = metric.__dict__.get(STATE)
    if counters is None or metric.dist_sync_on_step:
        return False, False
    idle = reads_are_free(counters)
    if not idle and is_compiling():
        return False, False
    return True, idle


def filed_by_compute(metric: Any) -> Callable[[dict[str, Any]], None]:
    """Before ``forward``'s batch ``compute``: a function that adds what that compute files to the cached counters.

    A full-state ``forward`` restores the states cached from before the batch after it, which would drop what the
    batch's compute filed on the device path.
    """
    counters = counters_of(metric)
    if counters is None or not kinds_of(metric) or reads_are_free(counters):
        return lambda cache: None  # where reads are free a compute reports what it finds at once: nothing is filed
    before = counters.clone()

    def add(cache: dict[str, Any]) -> None:
        after = counters_of(metric)
        if STATE in cache and after is not None and after.shape == before.shape:
            cache[STATE] = cache[STATE] + (after - before)

    return add


# --------------------------------------------------------------------------------------------------------------------
# reading at eager points


class _Reader:
    """The asynchronous read of one metric's counters: a device snapshot, its host copy and the event that says when.

    On CUDA the host copy is pinned memory written with ``non_blocking=True`` and the event is recorded on the
    counters' device; on a simulated device the copy is ready at once. Held by the metric's :class:`DeferredChecks`,
    which copies and pickles of the metric do not carry: a copy reports its counters through a reader of its own.
    """

    def __init__(self, counters: Tensor) -> None:
        self.device_index = counters.get_device()  # -1 on CPU; an int: compared at every sweep, cheaper than a device
        # normal tensors, even when made under inference mode: the reader copies into them in every mode
        with torch.inference_mode(False):
            self.snapshot = torch.zeros(counters.shape, dtype=counters.dtype, device=counters.device)
            self.host = torch.zeros(counters.shape, dtype=counters.dtype, pin_memory=counters.is_cuda)
        self.event: Any = torch.cuda.Event() if counters.is_cuda else None
        self.in_flight = False
        self.age = 0  # sweeps since the launch (for a simulated device's copy delay)
        self.rest = 0  # sweeps still to pass before the next launch (see ``COPY_INTERVAL``)

    def launch(self, counters: Tensor) -> None:
        self.snapshot.copy_(counters)
        if self.event is None:
            # the simulated pinned copy: on a GPU this is an asynchronous copy, not a read
            with _instrumentation.quiet():
                self.host.copy_(self.snapshot)
        else:
            self.host.copy_(self.snapshot, non_blocking=True)
            self.event.record(torch.cuda.current_stream(counters.device))
        self.in_flight = True
        self.age = 0

    def ready(self) -> bool:
        if self.event is None:
            hooks = _instrumentation.hooks
            delay = 0 if hooks is None else hooks.copy_delay
            return delay is not None and self.age >= delay
        return self.event.query()

    def take(self, counters: Tensor) -> list[int]:
        """The snapshot's counts (the host copy has arrived), consumed from ``counters`` in place."""
        self.in_flight = False
        with _instrumentation.quiet():  # the host copy: reading it never synchronizes
            counts = self.host.tolist()
        if any(counts):
            counters.sub_(self.snapshot)
        # after a report the next sweep copies again: a problem seen once tends to come back, and a user who has just
        # been told of one (an error caught, the metric fed again) hears of the next at the next update, not up to
        # ``COPY_INTERVAL`` updates later; clean copies, the common case, keep the interval
        hooks = _instrumentation.hooks
        interval = COPY_INTERVAL if hooks is None or hooks.copy_interval is None else hooks.copy_interval
        self.rest = 0 if any(counts) else interval - 1
        return counts


def _reader(metric: Any, counters: Tensor, create: bool = True) -> _Reader | None:
    """The reader of ``metric``'s ``counters`` (a new one where the counters moved to another device)."""
    checks = _checks_of(metric)
    reader = checks.reader
    if reader is not None and reader.device_index == counters.get_device():
        return reader
    if not create:
        return None
    checks.reader = reader = _Reader(counters)
    return reader


def _report(kinds: Sequence[Check], counts: Sequence[int]) -> None:
    """Warnings first, then the first error: an error never hides a warning."""
    pending = [(kind, count) for kind, count in zip(kinds, counts) if count]
    for kind, count in pending:
        if not kind.is_error:
            kind.report(count)
    for kind, count in pending:
        if kind.is_error:
            kind.report(count)  # raises: the first error is the one reported


def _quiet_time(metric: Any) -> bool:
    """Whether nothing may be read now: inside ``forward``, while tracing, or held by a wrapper (:func:`held`)."""
    return inside_forward(metric) or is_compiling() or is_held(metric)


def sweep(metric: Any) -> None:
    """The end of an eager ``update``/``forward`` on the device path: report what has arrived, never wait.

    Reads the host copy of the counters once its event has completed, reports and consumes those counts, then starts
    the next copy. Under DDP with ``sync_on_compute`` it does nothing: ``compute()`` reports the synced counts, so
    that no rank raises alone.
    """
    attributes = metric.__dict__
    counters = attributes.get(STATE)
    if counters is None or reads_are_free(counters):  # first: the common case, at the end of every CPU update
        return
    checks = attributes.get(CHECKS)
    if checks is None or not checks.kinds or _quiet_time(metric):
        return
    known = reader = checks.reader
    if reader is not None:
        if reader.in_flight:
            # the common case on a GPU a step behind: the copy is still on its way, and there is nothing else to do
            reader.age += 1
            if not reader.ready():
                return
        elif reader.rest > 0 and counters.get_device() == reader.device_index:
            reader.rest -= 1  # the common case between copies (``COPY_INTERVAL``): nothing to take, nothing to launch
            return
    if _reports_at_sync(metric):
        return
    counters = _writable(metric, counters)  # the reader consumes what it reports from them in place
    reader = _reader(metric, counters)
    counts: list[int] = []
    if reader.in_flight:
        if reader is not known:  # not aged above: a new reader (another device)
            reader.age += 1
        if reader.ready():
            counts = reader.take(counters)
    if not reader.in_flight and reader.rest > 0:
        reader.rest -= 1  # most sweeps launch nothing (``COPY_INTERVAL``)
    elif not reader.in_flight:
        reader.launch(counters)
        if not any(counts) and reader.ready():  # a simulated device: the copy has arrived already
            counts = reader.take(counters)
            mark_zero(counters)  # launched and taken with nothing in between: all of it was consumed
    _report(checks.kinds, counts)


def _reports_at_sync(metric: Any) -> bool:
    """Whether ``compute()`` syncs this metric's states across a process group (without calling user functions)."""
    return bool(
        getattr(metric, "sync_on_compute", False)
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    )


def take_pending(metric: Any) -> list[int] | None:
    """Read and consume every count of ``metric`` (an eager point: may wait on a GPU); ``None`` if nothing is there.

    The counters are zeroed in place (a state shared with other metrics, or with a wrapper's copy of the state, sees
    that too); when the states are synced, the rank's own counters (restored by ``unsync``) are zeroed as well.
    """
    counters = metric.__dict__.get(STATE)
    if counters is None:
        return None
    # quiet time before ``_surely_zero``: traced, its read of the tensor's version would break the graph
    if not kinds_of(metric) or _quiet_time(metric) or _surely_zero(counters):
        return None
    if not reads_are_free(counters) and _instrumentation.simulating_device():
        # on a GPU this read waits for the queued work; the wait is attributed to whoever asked for the read
        _instrumentation.report_host_wait("Tensor.tolist", skip=_THIS_FILE)
    with _instrumentation.quiet():
        counts = counters.tolist()
    return _consume(metric, counters, counts)


def _consume(metric: Any, counters: Tensor, counts: list[int]) -> list[int] | None:
    """Consume ``counts``, just read from ``metric``'s ``counters``; what :func:`take_pending` returns."""
    reader = _reader(metric, counters, create=False)
    if reader is not None:
        reader.in_flight = False  # what its copy would report is read now
        reader.rest = 0  # and the next sweep copies again: the first update after an eager point is checked soon
    if not any(counts):
        mark_zero(counters)
        return None
    counters = _writable(metric, counters)
    counters.zero_()
    mark_zero(counters)
    if metric._is_synced and metric._cache and STATE in metric._cache:
        # the rank's own counts, restored by unsync(): reported with the synced sum
        own = metric._cache[STATE]
        metric._cache[STATE] = torch.zeros_like(own) if read_only(own) else own.zero_()
    return counts


def take_pending_many(metrics: Sequence[Any]) -> list[list[int] | None]:
    """:func:`take_pending` of every metric in ``metrics`` (synced ones: their counts are every rank's), one read.

    The counters of all of them are read together (one read per device: on a GPU the one host wait of a
    ``MetricCollection.compute()``), then consumed as :func:`take_pending` consumes them. Metrics whose counters
    ``compute()`` would not read (none, idle ones left out, known to be zero, quiet time) are ``None``.
    """
    taken: list[list[int] | None] = [None] * len(metrics)
    to_read: dict[torch.device, list[tuple[int, Tensor]]] = {}
    for index, metric in enumerate(metrics):
        counters = metric.__dict__.get(STATE)
        if STATE not in metric._defaults or counters is None or not kinds_of(metric):
            continue
        if _quiet_time(metric) or _surely_zero(counters):
            continue
        to_read.setdefault(counters.device, []).append((index, counters))
    for entries in to_read.values():
        if not reads_are_free(entries[0][1]) and _instrumentation.simulating_device():  # as take_pending
            _instrumentation.report_host_wait("Tensor.tolist", skip=_THIS_FILE)
        with _instrumentation.quiet():
            flat = torch.cat([counters.reshape(-1) for _, counters in entries]).tolist()
        start = 0
        for index, counters in entries:
            counts, start = flat[start : start + counters.numel()], start + counters.numel()
            taken[index] = _consume(metrics[index], counters, counts)
    return taken


def report_counts(metric: Any, counts: Sequence[int] | None) -> None:
    """Report counts taken by :func:`take_pending` (warnings first, then the first error)."""
    if counts:
        _report(kinds_of(metric), counts)


def report_pending(metric: Any) -> None:
    """What ``compute()`` does once the states are synced: report every pending count (may wait on a GPU)."""
    report_counts(metric, take_pending(metric))
