"""``MetricCollection.compute()`` under DDP: every member's states in one collective (issue 27).

What was wrong: stock ``MetricCollection.compute()`` computes its members one after the other, and each member's
``compute()`` syncs its own states, one state at a time (for each: a ``barrier``, an ``all_gather`` of its shape,
host reads of the shapes, an ``all_gather`` of its data). A collection of multiclass macro Accuracy, Precision,
Recall and F1 (one compute group) plus a ``MeanMetric`` costs 52 collectives and 32 host reads per ``compute()`` on
2 ranks (67 and 42 with the check counters); members of a compute group gather the same states again; and an error
raised by one member's ``compute()`` on one rank leaves the other ranks waiting in the next member's sync.

What replaces it: before any member computes, the members that would sync through the default ``dist_sync_fn``
on the same process group are synced together by :func:`torchmetrics_syncfree.distributed.sync_states`: one
``all_gather`` for all their fixed-shape states (states shared by a compute group once), two with list states. Their
check counters are then read once for all of them (:func:`torchmetrics_syncfree._deferred.take_pending_many`;
reported per member just before it computes, as before), each member computes on its synced states without syncing
again, and every member is restored to its own states afterwards, as stock's ``unsync`` does, also when a
``compute()`` raises (no member stays synced, and no rank waits in a collective the others never enter: the
collectives all happened before). Members with a custom ``dist_sync_fn``, another class's sync, a cached value,
``sync_on_compute=False`` or no distributed environment compute as stock (they sync themselves, or not).

Patched target (identical in torchmetrics 1.6.1 to 1.9.x): ``torchmetrics.collections.MetricCollection.
_compute_and_reduce`` (``compute``; ``forward`` is stock's: each member syncs its batch in one collective through
the patched ``Metric._sync_dist``).

"""

from __future__ import annotations

from typing import Any

import torch

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.distributed import _sync_dist, sync_states

_TARGET = "torchmetrics.collections.MetricCollection._compute_and_reduce"


def _syncs_by_default(metric: Any) -> bool:
    """Whether ``metric.compute()`` would sync now, through stock's ``sync`` and the default ``dist_sync_fn``."""
    from torchmetrics import Metric

    cls = type(metric)
    if not isinstance(metric, Metric) or any(
        getattr(cls, name) is not getattr(Metric, name) for name in ("sync", "unsync", "_sync_dist", "_wrap_compute")
    ):
        return False
    if metric._computed is not None or metric._is_synced or not metric._to_sync or metric.dist_sync_fn is not None:
        return False
    available = metric.distributed_available_fn
    return bool(callable(available) and available())


def _presync(collection: Any) -> list[tuple[Any, bool]]:
    """Sync every member that would sync by default, one gather per process group; ``(member, should_unsync)``."""
    by_group: dict[int, tuple[Any, list[Any]]] = {}
    for _, metric in collection.items(keep_base=True, copy_state=False):
        if _syncs_by_default(metric):
            by_group.setdefault(id(metric.process_group), (metric.process_group, []))[1].append(metric)
    synced: list[tuple[Any, bool]] = []
    try:
        for group, members in by_group.values():
            caches = [metric._copy_state_dict() for metric in members]
            if not sync_states(members, group):
                continue  # a state it cannot pack: these members sync themselves, as stock
            for metric, cache in zip(members, caches):
                metric._cache, metric._is_synced = cache, True
                synced.append((metric, metric._should_unsync))
    except BaseException:
        _restore(synced, completed=False)
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


@replaces(_TARGET, params=("self", "method_name", "args", "kwargs"))
def _compute_and_reduce(self: Any, method_name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Stock's, with the members that sync by default synced together first (see the module docstring)."""
    if method_name != "compute" or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return stock(_TARGET)(self, method_name, *args, **kwargs)
    from torchmetrics import Metric

    if Metric._sync_dist is not _sync_dist:  # not the layer's sync (tree mode: the series'): each member syncs itself
        return stock(_TARGET)(self, method_name, *args, **kwargs)
    synced = _presync(self)
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
