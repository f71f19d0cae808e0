"""``MetricCollection.compute()`` under DDP: every member's states in one collective.

What was wrong: stock ``MetricCollection.compute()`` computes its members one after the other, and each member's
``compute()`` syncs its own states, one state at a time (for each: a ``barrier``, an ``all_gather`` of its shape,
host reads of the shapes, an ``all_gather`` of its data). A collection of multiclass macro Accuracy, Precision,
Recall and F1 (one compute group) plus a ``MeanMetric`` costs 52 collectives and 32 host reads per ``compute()`` on
2 ranks (67 and 42 with the check counters); members of a compute group gather the same states again; and an error
raised by one member's ``compute()`` on one rank leaves the other ranks waiting in the next member's sync.

What replaces it: before any member computes, the members that would sync through the default ``dist_sync_fn``
on the same process group are synced together by :func:`torchmetrics_syncfree.distributed.sync_states`: one
``all_gather`` for all their fixed-shape states, two with list states. Their check counters are then read once for
all of them (:func:`torchmetrics_syncfree._deferred.take_pending_many`; reported per member just before it computes,
as before), each member computes on its synced states without syncing again, and every member is restored to its own
states afterwards, as stock's ``unsync`` does, also when a ``compute()`` raises (no member stays synced, and no rank
waits in a collective the others never enter: the collectives all happened before). Members with a custom
``dist_sync_fn``, another class's sync, a cached value, ``sync_on_compute=False`` or no distributed environment
compute as stock (they sync themselves, or not).

Compute groups: the states of a group the user listed (``compute_groups=[[...], ...]``: the same groups on every
rank) are gathered once, for all its members whose states are declared alike. Automatic groups
(``compute_groups=True``) are formed from each rank's first batch, so two ranks can form different groups; their
members' states are gathered member by member, as stock gathers them, so that every rank packs the same buffer
(deduplicating by tensor identity made buffers of different sizes per rank: a gloo error, an NCCL hang).

``forward()`` (``__call__``) with ``dist_sync_on_step=True`` members: stock runs each member's ``forward`` in turn,
and each syncs its batch states inside (one collective per member with the patched ``Metric._sync_dist``). Patched,
every member still runs its own, unchanged ``forward`` (hooks, ``full_state_update`` or not, stock's accumulation),
but a member's batch ``compute()`` first runs the later members' ``forward`` up to their own batch ``compute()``;
after the last one, the batch states of all of them are gathered at once (per process group; at most
:data:`CHAIN` members per gather, since each waits a few stack frames deeper), and each then computes on its synced
batch state without syncing again. Deviation: the members' batch computes (and what they warn) run last member
first; an error raised in one member's batch compute leaves the members before it with their batch value not
computed (their accumulated state, as every member's, is the one their ``forward`` restores, the batch included)
and is raised after every rank has passed the gather, so no rank waits alone (stock: the ranks wait in the next
member's sync). Members that do not sync on step, or sync otherwise, run in their turn as stock.

Patched target (identical in torchmetrics 1.6.1 to 1.9.x): ``torchmetrics.collections.MetricCollection.
_compute_and_reduce`` (``compute`` and ``forward``).

"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch.distributed as dist

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.distributed import _sync_dist, sync_states

_TARGET = "torchmetrics.collections.MetricCollection._compute_and_reduce"


def _syncs_by_default(metric: Any, on_step: bool = False) -> bool:
    """Whether ``metric`` would sync now through stock's ``sync`` and the default ``dist_sync_fn``.

    ``on_step=False``: in its ``compute()``. ``on_step=True``: in the batch ``compute()`` of its ``forward`` (stock's
    ``Metric.forward``, whose ``dist_sync_on_step`` takes the full-state path: one ``compute()`` after the batch's
    ``update``, with ``dist_sync_on_step`` in place of ``sync_on_compute``).
    """
    from torchmetrics import Metric

    cls = type(metric)
    methods = ("sync", "unsync", "_sync_dist", "_wrap_compute") + (("forward", "_forward_full_state_update") * on_step)
    if not isinstance(metric, Metric) or any(getattr(cls, name) is not getattr(Metric, name) for name in methods):
        return False
    if metric._is_synced or metric.dist_sync_fn is not None:
        return False
    if on_step:
        if not metric.dist_sync_on_step or "compute" not in metric.__dict__:
            return False
    elif metric._computed is not None or not metric._to_sync:
        return False
    available = metric.distributed_available_fn
    return bool(callable(available) and available())


def _declared_leaders(collection: Any) -> dict[str, str]:
    """Member name -> the first member of its compute group, for groups the user listed (the same on every rank).

    Automatic groups (``compute_groups=True``) are formed from each rank's first batch and may differ between ranks:
    their states are gathered member by member (see :func:`~torchmetrics_syncfree.distributed.sync_states`).
    """
    if not isinstance(collection._enable_compute_groups, list) or not collection._groups_checked:
        return {}
    return {str(name): str(group[0]) for group in collection._groups.values() for name in group[1:]}


def _sync_together(members: list[tuple[str, Any]], leaders: dict[str, str]) -> list[Any]:
    """Sync ``members`` (``(name, metric)``), one gather per process group, as stock's ``sync``; the synced ones."""
    by_group: dict[int, tuple[Any, list[tuple[str, Any]]]] = {}
    for name, metric in members:
        by_group.setdefault(id(metric.process_group), (metric.process_group, []))[1].append((name, metric))
    synced: list[Any] = []
    for group, named in by_group.values():
        index = {name: i for i, (name, _) in enumerate(named)}
        metrics = [metric for _, metric in named]
        caches = [metric._copy_state_dict() for metric in metrics]
        lead = [index.get(leaders[name]) if name in leaders else None for name, _ in named]
        if not sync_states(metrics, group, lead):
            continue  # a state it cannot pack: these members sync themselves, as stock
        for metric, cache in zip(metrics, caches):
            metric._cache, metric._is_synced = cache, True
            synced.append(metric)
    return synced


def _presync(collection: Any) -> list[tuple[Any, bool]]:
    """Sync every member that would sync by default, one gather per process group; ``(member, should_unsync)``."""
    members = [(str(n), m) for n, m in collection.items(keep_base=True, copy_state=False) if _syncs_by_default(m)]
    synced: list[tuple[Any, bool]] = []
    try:
        for metric in _sync_together(members, _declared_leaders(collection)):
            synced.append((metric, metric._should_unsync))
    except BaseException:
        _restore([(m, m._should_unsync) for _, m in members if m._is_synced], completed=False)
        raise
    return synced


def _restore(synced: list[tuple[Any, bool]], completed: bool) -> None:
    """Back to the members' own states (stock's ``unsync``; after an error, every member), and their own settings."""
    for metric, should_unsync in synced:
        metric._to_sync, metric._should_unsync = True, should_unsync  # only members with ``_to_sync`` were synced
        compute = metric.__dict__.pop("_syncfree_compute", None)
        if compute is not None:
            metric.__dict__["compute"] = compute
        if metric._is_synced and (should_unsync or not completed):
            metric.unsync()


#: the most members whose ``forward`` waits in its batch ``compute()`` for one gather (each waits a few frames deeper
#: in the stack: more members take one gather per this many)
CHAIN = 32


def _waiting_compute(
    member: tuple[str, Any], compute: Any, paused: list[bool], waiting: list[tuple[str, Any]], go_on: Any
) -> Any:
    """``member``'s ``compute`` for its ``forward``: the batch compute waits for the later members (``go_on``)."""
    metric = member[1]

    def batch_compute(*args: Any, **kwargs: Any) -> Any:
        metric.__dict__["compute"] = compute
        if metric._to_sync and not metric._is_synced:  # forward's batch compute: wait for the later members
            paused.append(True)
            waiting.append(member)
            go_on(waiting)
        return compute(*args, **kwargs)

    return batch_compute


def _forward_members(collection: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every member's ``forward`` (``__call__``), as stock's loop, with the on-step syncs of the members done together.

    A member that would sync in its batch ``compute()`` (:func:`_syncs_by_default` with ``on_step``) waits there:
    its ``compute`` calls the later members' ``forward`` (each up to its own batch ``compute()``) and, after the last
    one, :func:`_sync_together` gathers all their batch states at once; then each computes on its synced states
    without syncing again, the last member first, and its ``forward`` ends as stock's (its accumulated state and
    settings restored, also when something raises). Members that do not sync on step, or sync otherwise, run in
    their turn, unchanged.
    """
    members = [(str(name), metric) for name, metric in collection.items(keep_base=True, copy_state=False)]
    repeated = {key for key, count in Counter(id(metric) for _, metric in members).items() if count > 1}
    results: dict[str, Any] = {}
    position = 0

    def forward_from(waiting: list[tuple[str, Any]]) -> None:
        nonlocal position
        while position < len(members) and len(waiting) < CHAIN:
            name, metric = members[position]
            position += 1
            if id(metric) in repeated or not _syncs_by_default(metric, on_step=True):  # (one object, two names:
                results[name] = metric(*args, **metric._filter_kwargs(**kwargs))  # its calls must not nest)
                continue
            original = metric.__dict__["compute"]
            paused: list[bool] = []
            batch_compute = _waiting_compute((name, metric), original, paused, waiting, forward_from)
            metric.__dict__["compute"] = batch_compute
            try:
                results[name] = metric(*args, **metric._filter_kwargs(**kwargs))
            finally:
                if metric.__dict__.get("compute") is batch_compute:
                    metric.__dict__["compute"] = original
            if paused:  # the members after it were forwarded (and gathered) inside its compute
                return
        if waiting:
            for metric in _sync_together(waiting, {}):  # batch states: each member's own, gathered once
                metric._to_sync = False  # synced: its batch compute does not sync again (forward restores it)

    while position < len(members):
        forward_from([])
    return {name: results[name] for name, _ in members}


def _reduced_results(collection: Any, results: dict[str, Any]) -> dict[str, Any]:
    """Stock's flattening and renaming of the members' ``results`` (stock's loop, each member returning its result)."""
    queued: dict[int, tuple[Any, Any, list[Any]]] = {}  # per member object (one may have two names): its results
    for name, metric in collection._modules.items():
        queued.setdefault(id(metric), (metric, metric.__dict__.get("compute"), []))[2].append(results[str(name)])
    for metric, _, values in queued.values():
        metric.__dict__["compute"] = lambda _v=values: _v.pop(0)  # stock's loop asks in the order of the names
    try:
        return stock(_TARGET)(collection, "compute")
    finally:
        for metric, compute, _ in queued.values():
            if compute is None:
                del metric.__dict__["compute"]
            else:
                metric.__dict__["compute"] = compute


@replaces(_TARGET, params=("self", "method_name", "args", "kwargs"))
def _compute_and_reduce(self: Any, method_name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Stock's, with the members that sync by default synced together first (see the module docstring)."""
    if method_name not in ("compute", "forward") or not (dist.is_available() and dist.is_initialized()):
        return stock(_TARGET)(self, method_name, *args, **kwargs)
    from torchmetrics import Metric

    if Metric._sync_dist is not _sync_dist:  # not the layer's sync (tree mode: the series'): each member syncs itself
        return stock(_TARGET)(self, method_name, *args, **kwargs)
    if method_name == "forward":
        if not any(_syncs_by_default(m, on_step=True) for m in self._modules.values()):  # no state refs touched
            return stock(_TARGET)(self, method_name, *args, **kwargs)
        return _reduced_results(self, _forward_members(self, args, kwargs))
    synced = _presync(self)
    if synced:
        # the members hold their own synced states now: stock's loop must not link a compute group's members to
        # the first one's (which would give them its synced states: wrong where the ranks formed other groups)
        self._state_is_copy = True
    completed = False
    try:
        counts = _deferred.take_pending_many([metric for metric, _ in synced])
        for (metric, _), taken in zip(synced, counts):
            # computes on the synced states: no sync of its own, no unsync (below), no read of its counters
            metric._to_sync, metric._should_unsync = False, False
            if taken:
                compute = metric.__dict__["_syncfree_compute"] = metric.__dict__["compute"]

                def reporting_compute(*a: Any, _m: Any = metric, _c: Any = compute, _t: Any = taken, **k: Any) -> Any:
                    _deferred.report_counts(_m, _t)
                    return _c(*a, **k)

                metric.__dict__["compute"] = reporting_compute
        result = stock(_TARGET)(self, method_name, *args, **kwargs)
        completed = True
        return result
    finally:
        _restore(synced, completed)
        if synced and completed:
            self._compute_groups_create_state_ref()  # linked again as stock's are after its members computed
