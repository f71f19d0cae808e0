"""Checks that run on the device and reach the user without blocking the host.

Stock TorchMetrics validates inputs with ``if flag.any(): raise/warn``, which reads a device value on the host: a
synchronization on every ``update``. Here the check stays on the device as a 0-dim bool tensor ``flag`` and
:func:`check` hands it over together with the action to take when it is set:

* on CPU the read is free, so the action runs at once, with stock's timing;
* on CUDA the flag is copied into pinned host memory with ``non_blocking=True`` and a CUDA event is recorded. The
  next ``update`` of the same metric reads every flag whose event has completed (:func:`poll`, never waits), and
  ``compute()`` called by the user reads them all (:func:`flush`, waiting for the events that are still running:
  the one place a host wait can happen). ``forward()`` only polls, so it never waits.

Actions run in submission order. An action that raises leaves the later flags queued for the next poll/flush, so
nothing is lost.

While a CPU :class:`~torchmetrics_syncfree.probe.SyncProbe` is active, CPU flags take the CUDA path (a host copy
that counts as ready at the next poll), so the probe sees what a GPU run would do.

Helpers deep inside TorchMetrics' functional code (input validation, ``_safe_divide``) have no metric argument. A
patched ``update`` runs them inside :func:`reporting_to`, which makes the metric *current* for this thread/task
(a :class:`~contextvars.ContextVar`); such helpers call :func:`check_current`, which files the check with the current
metric or, when there is none (the functional API), acts at once like stock (a host read, i.e. a sync on CUDA).

"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree import probe

# metric id -> (weak reference to the metric, queue of (host flag, CUDA event or None, action))
_pending: dict[int, tuple[weakref.ref, deque]] = {}
# the metric whose update is running in this thread/task (see reporting_to)
_current: ContextVar[Any | None] = ContextVar("torchmetrics_syncfree_current_metric", default=None)


def _queue(metric: Any, create: bool) -> deque | None:
    key = id(metric)
    entry = _pending.get(key)
    if entry is not None and entry[0]() is metric:
        return entry[1]
    if not create:
        return None
    queue: deque = deque()
    _pending[key] = (weakref.ref(metric, lambda _, key=key: _pending.pop(key, None)), queue)
    return queue


def reads_are_free(tensor: Tensor) -> bool:
    """Whether reading ``tensor`` on the host costs nothing: a CPU tensor while no CPU probe simulates a GPU.

    Code that avoids host reads for the GPU's sake may take stock's (or a cheaper) CPU path when this is true.
    """
    return tensor.is_cpu and not probe.simulating_device()


def check(metric: Any, flag: Tensor, action: Callable[[], None]) -> bool:
    """Run ``action`` if the 0-dim bool ``flag`` is set: now on CPU, asynchronously on CUDA.

    Returns:
        ``False`` when the flag is known to be clear (it was read at once), ``True`` when it was set or is not read
        yet. Callers use this to skip work that only matters when the flag is set.

    """
    if reads_are_free(flag):
        if flag:
            action()
            return True
        return False
    if flag.is_cuda:
        host = torch.empty((), dtype=torch.bool, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        event: torch.cuda.Event | None = torch.cuda.Event()
        event.record()
    else:  # a CPU probe simulates the device: the copy is ready at the next poll
        host, event = flag.detach().clone(), None
    _queue(metric, create=True).append((host, event, action))
    return True


def _drain(queue: deque, wait: bool) -> None:
    while queue:
        host, event, action = queue[0]
        if event is not None and not event.query():
            if not wait:
                return
            probe.report(probe.HOST_WAIT, "torch.cuda.Event.synchronize")
            event.synchronize()
        queue.popleft()
        with probe.quiet():  # a host buffer: reading it never synchronizes
            is_set = bool(host)
        if is_set:
            action()


def poll(metric: Any) -> None:
    """Run the actions of every check of ``metric`` that has completed; never waits."""
    if not _pending:  # nothing queued for any metric: always so on CPU, where checks are read at once
        return
    queue = _queue(metric, create=False)
    if queue:
        _drain(queue, wait=False)


def flush(metric: Any) -> None:
    """Run the actions of every pending check of ``metric``, waiting for unfinished ones."""
    queue = _queue(metric, create=False)
    if queue:
        if probe.simulating_device() and any(event is None for _, event, _ in queue):
            # on a GPU the newest checks would usually still be running when compute() is called
            probe.report(probe.HOST_WAIT, "torch.cuda.Event.synchronize")
        _drain(queue, wait=True)


def pending(metric: Any) -> int:
    """Number of checks of ``metric`` not yet read."""
    queue = _queue(metric, create=False)
    return len(queue) if queue else 0


def inside_forward(metric: Any) -> bool:
    """True while ``Metric.forward`` computes the batch value (it clears ``_should_unsync`` for exactly that call)."""
    return not getattr(metric, "_should_unsync", True)


def queued() -> bool:
    """Whether any metric has checks waiting to be read (never on CPU, where checks are read at once)."""
    return bool(_pending)


def report_pending(metric: Any) -> None:
    """What ``compute()`` does first: everything pending, except inside ``forward()`` where it must not wait."""
    if not _pending:
        return
    if inside_forward(metric):
        poll(metric)
    else:
        flush(metric)


def current() -> Any | None:
    """The metric made current by :func:`reporting_to`, or ``None`` outside a patched ``update``."""
    return _current.get()


@contextmanager
def reporting_to(metric: Any) -> Iterator[None]:
    """Make ``metric`` current for the block: :func:`check_current` files its checks with it."""
    token = _current.set(metric)
    try:
        yield
    finally:
        _current.reset(token)


def call_reporting_to(metric: Any, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` with ``metric`` current, as inside :func:`reporting_to`, without a generator per call."""
    token = _current.set(metric)
    try:
        return function(*args)
    finally:
        _current.reset(token)


def check_current(flag: Tensor, action: Callable[[], None]) -> None:
    """:func:`check` for the current metric; without one, run ``action`` at once if ``flag`` is set (stock timing).

    The fallback reads ``flag`` on the host, as stock does: the functional API has no later point to report at.
    """
    metric = _current.get()
    if metric is not None:
        check(metric, flag, action)
    elif flag:
        action()
