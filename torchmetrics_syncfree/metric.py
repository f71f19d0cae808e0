"""The life of a metric's deferred checks in ``torchmetrics.Metric``: forward, reset, compute's sync, merging.

The checks of the patched metrics are counters in a metric state (:mod:`torchmetrics_syncfree._deferred`), so most of
what ``Metric`` does to states carries them unchanged. What ``Metric`` itself needs to do differently:

============================================  ================================================================
``Metric``                                     with deferred checks
============================================  ================================================================
``sync_context`` (every ``compute()``)         reports the pending checks once the states are synced (all ranks
                                               see the same sum, so all raise or none); an error leaves the
                                               metric unsynced and usable
``reset()``                                    reports what is pending before dropping the states, instead of
                                               dropping it (or blaming the first batch of the next epoch)
``_forward_full_state_update``,                read nothing inside ``forward`` (its internal ``reset`` and
``_forward_reduce_state_update``               ``compute`` are not the user's), report what has arrived at the
                                               end; an error raised inside leaves the accumulated state as it
                                               was before the call (stock loses it on the reduce-state path);
                                               where reads are free no update writes the counters, and forward
                                               leaves them out of its state copy, reset and reduction
``merge_state``                                a dict of states without the counters (written by hand, or from a
                                               metric made before the patch) merges as "nothing pending"; a
                                               metric merges with its counters
``metric_state``                               the user's view of the states leaves the counters out (code that
                                               walks the states sees stock's)
``persistent``                                 the counters stay out of ``state_dict()`` whatever the mode, so
                                               checkpoints load into stock TorchMetrics
============================================  ================================================================

Compiled steps: ``Metric.update``'s wrapper counts updates in ``self._update_count``, an int attribute of an
``nn.Module``, which ``torch.compile`` treats as a constant: every update recompiles the step until the recompile
limit (a known upstream problem). While patched, ``torch._dynamo.config.allow_unspec_int_on_nn_module`` is set, so
that such ints become dynamic after one recompile (a step compiles twice, then never again); :func:`unpatch_all` puts
the previous value back. A torch without the setting (older releases) is patched without it.

"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torchmetrics.metric import Metric
from torchmetrics.utilities.data import dim_zero_cat, dim_zero_sum

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import declares_setting, replaces, stock

_METRIC = "torchmetrics.metric.Metric"

# torch 2.6 introduced the setting; older releases recompile a compiled step until the recompile limit (README: support
# matrix), and patch_all() leaves the setting out there
declares_setting("torch._dynamo.config.allow_unspec_int_on_nn_module", True, area="metric", optional=True)


@replaces(
    f"{_METRIC}.sync_context",
    params=("self", "dist_sync_fn", "process_group", "should_sync", "should_unsync", "distributed_available"),
)
@contextmanager
def sync_context(
    self: Any,
    dist_sync_fn: Callable | None = None,
    process_group: Any | None = None,
    should_sync: bool = True,
    should_unsync: bool = True,
    distributed_available: Callable | None = None,
) -> Generator:
    """Stock's ``sync_context``; in between sync and compute, the pending checks are reported."""
    self.sync(
        dist_sync_fn=dist_sync_fn,
        process_group=process_group,
        should_sync=should_sync,
        distributed_available=distributed_available,
    )
    if _deferred.STATE in self._defaults:  # else no counters: nothing to report
        try:
            _deferred.report_pending(self)
        except BaseException:
            self.unsync(should_unsync=self._is_synced and should_unsync)
            raise

    yield

    self.unsync(should_unsync=self._is_synced and should_unsync)


@replaces(f"{_METRIC}._wrap_update", params=("self", "update"))
def _wrap_update(self: Any, update: Callable) -> Callable:
    """Stock's update wrapper, at a third of its host time (it runs around every ``update``, ``forward`` included).

    Stock's wrapper sets two plain attributes through ``nn.Module.__setattr__`` (about a microsecond each, for checks
    that only parameters, buffers and submodules need) and enters ``torch.set_grad_enabled`` on every call. This one
    writes the instance's ``__dict__`` (what ``setattr`` ends up doing for these values) and changes the grad mode only
    where it differs from the metric's. A class that defines its own ``__setattr__`` keeps stock's wrapper.
    """
    if not _plain_setattr(self):
        return stock(f"{_METRIC}._wrap_update")(self, update)

    @functools.wraps(update)
    def wrapped_func(*args: Any, **kwargs: Any) -> None:
        flags = self.__dict__
        flags["_computed"] = None
        flags["_update_count"] += 1
        enable_grad = flags["_enable_grad"]
        grad_enabled = torch.is_grad_enabled()
        try:
            if grad_enabled == enable_grad:
                update(*args, **kwargs)
            elif _deferred.is_compiling():
                with torch.set_grad_enabled(enable_grad):
                    update(*args, **kwargs)
            else:
                # the grad mode switched by hand: ``torch.set_grad_enabled``'s object and context protocol cost a
                # microsecond of every update in a training loop (grad on, metric updates without grad)
                torch._C._set_grad_enabled(enable_grad)
                try:
                    update(*args, **kwargs)
                finally:
                    torch._C._set_grad_enabled(grad_enabled)
        except RuntimeError as err:
            if "Expected all tensors to be on" in str(err):
                raise RuntimeError(
                    "Encountered different devices in metric calculation (see stacktrace for details)."
                    " This could be due to the metric class not being on the same device as input."
                    f" Instead of `metric={self.__class__.__name__}(...)` try to do"
                    f" `metric={self.__class__.__name__}(...).to(device)` where"
                    " device corresponds to the device of the input."
                ) from err
            raise
        if flags["compute_on_cpu"]:
            self._move_list_states_to_cpu()

    return wrapped_func


@replaces(f"{_METRIC}.reset", params=("self",))
def reset(self: Any) -> None:
    """Stock's ``reset``, after taking what the checks have pending; reported once the states are reset."""
    if _deferred.STATE not in self._defaults:  # no counters: stock's reset
        _reset_states(self)
        return
    if _deferred.is_held(self):
        # a wrapper's or forward's internal reset: the counters keep what they hold for the next eager point
        _reset_states(self, keep=_deferred.STATE)
        return
    pending = _deferred.take_pending(self)
    _reset_states(self)
    _deferred.mark_zero(self.__dict__[_deferred.STATE])
    _deferred.report_counts(self, pending)


#: ``Metric.__setattr__`` (stock's: the layer does not patch it)
_METRIC_SETATTR = Metric.__setattr__


def _plain_setattr(metric: Any) -> bool:
    """Whether ``setattr`` on ``metric`` is ``Metric``'s: for a plain value or a state tensor, a write of ``__dict__``.

    ``Metric.__setattr__`` refuses a few constants and hands the rest to ``nn.Module.__setattr__``, whose checks (for
    parameters, buffers and submodules) cost about a microsecond per write and end in ``object.__setattr__`` for the
    flags and state tensors of a metric. Writing the instance's ``__dict__`` skips those checks, not their outcome.
    """
    return type(metric).__setattr__ is _METRIC_SETATTR


class _Setattr:
    """A mapping-like writer of a metric's attributes through its own ``__setattr__`` (see :func:`_flags_of`)."""

    __slots__ = ("metric",)

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def __setitem__(self, name: str, value: Any) -> None:
        setattr(self.metric, name, value)


def _flags_of(metric: Any) -> Any:
    """Where ``forward`` writes a metric's flags: its ``__dict__``, or through the class's own ``__setattr__``."""
    return metric.__dict__ if _plain_setattr(metric) else _Setattr(metric)


def _write(metric: Any, flags: dict[str, Any], name: str, value: Any) -> None:
    """``setattr(metric, name, value)`` for a state of a :func:`_plain_setattr` metric, as a write of ``flags``."""
    if name in flags:
        flags[name] = value
    else:  # not an instance attribute (e.g. a user's state registered as a buffer): ``nn.Module`` decides
        setattr(metric, name, value)


def _reset_states(self: Any, keep: str | None = None) -> None:
    """Stock's ``Metric.reset`` (the same in 1.6.1-1.9), writing ``__dict__`` where ``setattr`` would do just that.

    Every ``forward`` resets its metric, so this is host time of every step: stock's ``setattr`` of five flags and
    every state went through ``nn.Module.__setattr__``'s checks, and each state's ``detach().to(device)`` was a
    dispatch that returns its input. ``keep``: a state left as it is (the counters of a held metric).
    """
    if not _plain_setattr(self):
        kept = getattr(self, keep) if keep is not None else None
        stock(f"{_METRIC}.reset")(self)
        if keep is not None:
            setattr(self, keep, kept)
        return
    flags = self.__dict__
    flags["_update_count"] = 0
    flags["_forward_cache"] = None
    flags["_computed"] = None
    for attr, default in self._defaults.items():
        if attr == keep:
            continue
        current = getattr(self, attr)
        if isinstance(default, Tensor):
            fresh = (default.detach() if default.requires_grad else default).clone()
            _write(self, flags, attr, fresh if fresh.device == current.device else fresh.to(current.device))
        else:
            current.clear()
    flags["_cache"] = None
    flags["_is_synced"] = False


def _restore_after_forward(self: Any, compute_on_cpu: bool) -> None:
    """The end of stock's forward: back to the settings of a plain ``update``/``compute``.

    The flags are plain attributes of the instance (no parameter, buffer, module or constant ``Metric.__setattr__``
    guards): written to its ``__dict__``, as ``setattr`` ends up doing after ``nn.Module.__setattr__``'s checks, which
    cost about a microsecond each, six times per ``forward`` of every metric. A class with its own ``__setattr__``
    sees every write, as under stock (:func:`_flags_of`).
    """
    flags = _flags_of(self)
    flags["_is_synced"] = False
    flags["_should_unsync"] = True
    flags["_to_sync"] = self.sync_on_compute
    flags["_computed"] = None
    flags["_enable_grad"] = False
    flags["compute_on_cpu"] = compute_on_cpu
    if compute_on_cpu:
        self._move_list_states_to_cpu()


@replaces(f"{_METRIC}._forward_full_state_update", params=("self", "args", "kwargs"))
def _forward_full_state_update(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Stock's two-update forward, marked as inside ``forward`` from its start and restored if anything raises."""
    hold, idle = _deferred.forward_holds_counters(self)
    idle = hold and idle
    compute_on_cpu = self.compute_on_cpu
    update_count = self._update_count
    # forward from here on (stock clears it just before the batch update): the checks read nothing until the end
    self._should_unsync = False
    try:
        self.update(*args, **kwargs)  # global accumulation
    except BaseException:
        self._update_count = update_count  # a call that raises changes nothing
        self._should_unsync = True
        raise
    update_count = self._update_count
    self._to_sync = self.dist_sync_on_step
    self.compute_on_cpu = False
    # copied as stock: the update above may have written states that a compute group shares, and so may the group's
    # other members, whose ``forward`` a collection can run inside this one's batch compute
    cache = self._copy_state_dict()
    if idle:  # idle counters stay where they are, out of the state work
        del cache[_deferred.STATE]
        _deferred.hold(self)
    try:
        # reset, update, compute on the batch alone
        self._enable_grad = True
        self.reset()
        self.update(*args, **kwargs)
        if idle:  # reads are free: a compute reports what it finds at once, nothing is filed
            batch_value = self.compute()
        else:
            filed_by_compute = _deferred.filed_by_compute(self)
            batch_value = self.compute()
            # what the batch's compute filed (its warnings) goes on with the global state: restoring it would drop them
            filed_by_compute(cache)
    finally:
        for attr, value in cache.items():
            setattr(self, attr, value)
        self._update_count = update_count
        _restore_after_forward(self, compute_on_cpu)
        if idle:
            _deferred.release(self)
    if not idle:  # idle counters have nothing to report
        _deferred.sweep(self)
    return batch_value


def _held_states(self: Any, leave: str | None) -> dict[str, Any] | None:
    """The one-update ``forward``'s hold of the accumulated states while it computes the batch alone.

    Stock copies every state (a clone per tensor, one kernel launch each, and per tensor of a list) before its
    ``reset()``. But ``Metric.reset`` installs new tensors rather than writing the old ones and clears a list in
    place, the batch's update writes the new ones, and the reduction makes new ones: nothing in this ``forward`` writes
    the accumulated tensors, so holding them (a list's elements in a new list) is enough (a metric in a compute group
    shares them with its group, and they stay as the group sees them). ``leave``: a state not held (the check
    counters, which ``forward`` holds where they are). ``None`` (copy as stock) for a class with its own ``reset``,
    ``__setattr__``, state copy or reduction, and for a state that :func:`_reduce_held` does not reduce.
    """
    cls = type(self)
    if not (
        _plain_setattr(self)
        and cls.reset is Metric.reset
        and cls._copy_state_dict is Metric._copy_state_dict
        and cls._reduce_states is Metric._reduce_states
    ):
        return None
    reductions = self._reductions
    held: dict[str, Any] = {}
    for attr in self._defaults:
        if attr == leave:
            continue
        value = getattr(self, attr)
        if isinstance(value, Tensor):
            if reductions[attr] is not dim_zero_sum:
                return None
            held[attr] = value.detach() if value.requires_grad else value
        elif reductions[attr] in (dim_zero_cat, None):  # stock concatenates a list for either
            held[attr] = [element.detach() if element.requires_grad else element for element in value]
        else:
            return None
    return held


def _reduce_held(self: Any, global_state: dict[str, Any]) -> None:
    """Stock's ``_reduce_states`` of the states :func:`_held_states` holds, without grad.

    The sums of tensor states in one multi-tensor add (one launch on CUDA), list states concatenated as stock
    concatenates them; new tensors and lists, as stock's ``global + local``, written where ``setattr`` would write them.
    """
    flags = self.__dict__
    sums = [name for name, value in global_state.items() if isinstance(value, Tensor)]
    if sums:
        with torch.no_grad():
            totals = torch._foreach_add([global_state[name] for name in sums], [getattr(self, name) for name in sums])
        for name, total in zip(sums, totals):
            _write(self, flags, name, total)
    for name, value in global_state.items():
        if not isinstance(value, Tensor):
            _write(self, flags, name, value + getattr(self, name))


@replaces(f"{_METRIC}._forward_reduce_state_update", params=("self", "args", "kwargs"))
def _forward_reduce_state_update(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Stock's one-update forward; the global state comes back if anything raises (stock loses it)."""
    hold, idle = _deferred.forward_holds_counters(self)
    held = _held_states(self, _deferred.STATE if hold else None)
    if held is None:
        global_state, hold, idle = self._copy_state_dict(), False, False
    else:
        global_state = held
    # one function, no context manager: every Python call here is host time of every forward
    if hold:
        _deferred.hold(self)
    try:
        flags = _flags_of(self)  # plain attributes of the instance (see ``_restore_after_forward``)
        update_count = self._update_count
        compute_on_cpu = self.compute_on_cpu
        flags["_should_unsync"] = False  # before reset(), so that it knows it is forward's (stock sets it just after)
        self.reset()
        flags["_to_sync"] = self.dist_sync_on_step
        flags["compute_on_cpu"] = False
        flags["_enable_grad"] = True
        try:
            self.update(*args, **kwargs)
            batch_value = self.compute()
        except BaseException:
            for attr, value in global_state.items():
                setattr(self, attr, value)
            flags["_update_count"] = update_count
            _restore_after_forward(self, compute_on_cpu)
            raise
        flags["_update_count"] = update_count + 1
        if not hold:
            counters = _deferred.counters_of(self)
            if counters is not None and _deferred.STATE not in global_state:  # a metric made before the patch
                global_state[_deferred.STATE] = torch.zeros_like(counters)
        if held is None:
            with torch.no_grad():
                self._reduce_states(global_state)
        else:
            _reduce_held(self, global_state)
        _restore_after_forward(self, compute_on_cpu)
    finally:
        if hold:
            _deferred.release(self)
    if not idle:  # (idle counters have nothing to report)
        _deferred.sweep(self)
    return batch_value


@replaces(f"{_METRIC}.merge_state", params=("self", "incoming_state"))
def merge_state(self: Any, incoming_state: Any) -> None:
    """Stock's ``merge_state``; pending checks of the incoming metric are merged, a dict without them adds none."""
    from torchmetrics import Metric

    counters = _deferred.counters_of(self)
    if counters is not None:
        if isinstance(incoming_state, Metric) and isinstance(incoming_state, type(self)):
            incoming_counters = _deferred.counters_of(incoming_state)
            incoming_state = incoming_state.metric_state
            if incoming_counters is not None:
                incoming_state[_deferred.STATE] = incoming_counters
        if isinstance(incoming_state, dict) and _deferred.STATE not in incoming_state:
            incoming_state = {**incoming_state, _deferred.STATE: torch.zeros_like(counters)}
    stock(f"{_METRIC}.merge_state")(self, incoming_state)


def _metric_state(self: Any) -> dict[str, Any]:
    """Get the current state of the metric."""
    # stock's, without the check counters: code that walks the states (or compares them) sees stock's states
    return {attr: getattr(self, attr) for attr in self._defaults if attr != _deferred.STATE}


class _Property(property):
    """A property declared here (``replaces`` files it under this module's area)."""


metric_state = replaces(f"{_METRIC}.metric_state", params=None)(_Property(_metric_state))


@replaces(f"{_METRIC}.persistent", params=("self", "mode"))
def persistent(self: Any, mode: bool = False) -> None:
    """Stock's ``persistent``, except that the check counters never enter ``state_dict()``."""
    stock(f"{_METRIC}.persistent")(self, mode)
    if _deferred.STATE in self._persistent:
        self._persistent[_deferred.STATE] = False
