"""DDP sync of metric states whose device has no backend in the process group (e.g. CPU states under NCCL).

What was wrong: ``Metric.compute()`` gathers every state with ``gather_all_tensors(state, group)`` on the metric's
``process_group`` (default: WORLD). Under NCCL (or any group built for CUDA only, e.g. ``"cuda:gloo"``) a state
that lives on the CPU (an average step time, a ``compute_on_cpu=True`` list state, a metric never moved to the GPU)
fails with ``RuntimeError: No backend type associated with device type cpu`` (reported upstream, in TorchMetrics
and in Lightning).
The only stock work-arounds are ``sync_on_compute=False`` (wrong results across ranks) or moving the metric to the
GPU (a host-device sync on every update).

What replaces it: before a state is gathered, the device type of the state is looked up in the group's backends.
If the group has a backend for it, nothing changes (the stock call, on the stock group). If not, depending on the
mode (:func:`set_fallback_mode`, or the environment variable ``TORCHMETRICS_SYNCFREE_DDP_FALLBACK``):

``"gloo"`` (default)
    the state is gathered, barrier included, through a gloo group over the same ranks. The group is created on the
    first such sync, once per parent group, and cached. Creation is collective over the parent's ranks; it happens
    at the same point on every rank because every rank syncs the same metrics in the same order (call
    :func:`fallback_group` right after ``init_process_group`` to create it eagerly instead).
``"device"``
    the state is copied to the group's device (``bound_device_id``, else the current device of the group's first
    device type) for the collective, and the gathered tensors are copied back. No extra group, no extra sockets.
``"off"``
    stock behaviour (the error above).

Patched targets (identical in torchmetrics 1.6.1 to 1.9.x apart from upstream's own slicing fix in
``gather_all_tensors`` in 1.9, which this module does not touch because it calls the original):

* ``torchmetrics.utilities.distributed.gather_all_tensors`` (and its by-name import in ``torchmetrics.metric``):
  routes the state as above, then calls the original;
* ``torchmetrics.Metric._sync_dist``: routes a user's ``dist_sync_fn`` the same way, and gives a rank with no data
  in a ``compute_on_cpu=True`` list state an empty placeholder on the CPU (stock puts it on the metric's device),
  so that every rank takes the same route and no rank waits on a collective the others never enter.

"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree._compat import itemsize
from torchmetrics_syncfree._registry import replaces, stock

#: Environment variable selecting the fallback mode when :func:`set_fallback_mode` was not called.
MODE_ENV_VAR = "TORCHMETRICS_SYNCFREE_DDP_FALLBACK"
#: The fallback modes, the first being the default.
MODES = ("gloo", "device", "off")
_GATHER = "torchmetrics.utilities.distributed.gather_all_tensors"
_SYNC_DIST = "torchmetrics.metric.Metric._sync_dist"

_lock = threading.RLock()
_mode: str | None = None
# parent group -> its gloo fallback group; valid while the default group is _cache_world
_fallbacks: dict[Any, Any] = {}
_cache_world: Any = None


def set_fallback_mode(mode: str | None) -> None:
    """Choose how states whose device type has no backend in the process group are synced.

    Args:
        mode: ``"gloo"`` (a cached gloo group over the same ranks), ``"device"`` (copy to the group's device and
            back), ``"off"`` (stock behaviour: the collective raises), or ``None`` to go back to the environment
            variable :data:`MODE_ENV_VAR` (default ``"gloo"``).

    Example:
        >>> from torchmetrics_syncfree.distributed import get_fallback_mode, set_fallback_mode
        >>> set_fallback_mode("device")
        >>> get_fallback_mode()
        'device'
        >>> set_fallback_mode(None)

    """
    global _mode
    _mode = None if mode is None else _checked_mode(mode, "set_fallback_mode")


def get_fallback_mode() -> str:
    """The mode in force: the one set with :func:`set_fallback_mode`, else :data:`MODE_ENV_VAR`, else ``"gloo"``."""
    if _mode is not None:
        return _mode
    return _checked_mode(os.environ.get(MODE_ENV_VAR, "") or MODES[0], MODE_ENV_VAR)


def _checked_mode(mode: str, source: str) -> str:
    mode = mode.strip().lower()
    if mode not in MODES:
        raise ValueError(f"{source}: unknown DDP fallback mode {mode!r}; expected one of {MODES}")
    return mode


def fallback_group(group: Any | None = None) -> Any:
    """The gloo group over the ranks of ``group`` (default WORLD), created on first use and cached.

    Creating it is collective over the ranks of ``group`` (over the whole world for WORLD): every one of them must
    call this (or sync a metric that needs it) at the same point. Call it right after ``init_process_group`` (and
    after creating a subgroup, on the subgroup's ranks) to create the groups eagerly and in a known order.

    Args:
        group: the parent process group; ``None`` means WORLD.

    Returns:
        The fallback group (``group`` itself if it already has a CPU backend, or if it is not a process group whose
        backends can be read).

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.

    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fallback_group() needs an initialized process group (torch.distributed.init_process_group)")
    parent = _parent(group)
    types = _device_types(parent)
    return parent if types is None or "cpu" in types else _gloo_group(parent)


def _gloo_group(parent: Any) -> Any:
    with _lock:
        _forget_stale_groups()
        fallback = _fallbacks.get(parent)
        if fallback is None:
            fallback = _fallbacks[parent] = _new_gloo_group(parent)
        return fallback


def _world_group() -> Any:
    return dist.group.WORLD


def _parent(group: Any | None) -> Any:
    return _world_group() if group is None else group


def _forget_stale_groups() -> None:
    """Drop cached groups of an earlier ``init_process_group`` (they died with its ``destroy_process_group``)."""
    global _cache_world
    if _world_group() is not _cache_world:
        _fallbacks.clear()
        _cache_world = _world_group()


#: ``new_group(..., use_local_synchronization=True)`` (torch 2.1+): a group that only its members create
_LOCAL_SYNCHRONIZATION = "use_local_synchronization" in inspect.signature(dist.new_group).parameters


def _new_gloo_group(parent: Any) -> Any:
    """Create a gloo group over ``parent``'s ranks, with ``parent``'s timeout.

    A WORLD fallback is created by every rank (a plain ``new_group``). A subgroup's fallback is created by its
    members only (``use_local_synchronization``): the other ranks never sync through the subgroup. Torch 2.0 cannot
    create a group that way: a subgroup without a CPU backend keeps it, and its CPU states fail as stock's do.

    """
    kwargs: dict[str, Any] = {}
    timeout = _timeout(parent)
    if timeout is not None:
        kwargs["timeout"] = timeout
    if parent is _world_group():
        return dist.new_group(backend="gloo", **kwargs)
    if not _LOCAL_SYNCHRONIZATION:  # torch 2.0: only a collective of the whole world could create it; stock's failure
        return parent
    return dist.new_group(
        dist.get_process_group_ranks(parent), backend="gloo", use_local_synchronization=True, **kwargs
    )


def _timeout(group: Any) -> Any:
    for device in _devices(group) or ():
        try:
            return group._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def _devices(group: Any) -> list[torch.device] | None:
    """The device types ``group`` has a backend for; ``None`` if that cannot be read (not a ``ProcessGroup``)."""
    types = getattr(group, "_device_types", None)
    if types is not None:
        return list(types)
    if not hasattr(group, "_get_backend"):
        return None
    return [torch.device(t) for t in ("cuda", "cpu") if _has_backend(group, t)]  # torch < 2.2


def _has_backend(group: Any, device_type: str) -> bool:
    try:
        group._get_backend(torch.device(device_type))
    except RuntimeError:
        return False
    return True


def _device_types(group: Any) -> set[str] | None:
    devices = _devices(group)
    return None if devices is None else {device.type for device in devices}


def _group_device(group: Any, avoid: str) -> torch.device:
    """The device the ``"device"`` mode copies states to: the group's bound device or a current device it serves."""
    for candidate in (group, _world_group()):
        bound = getattr(candidate, "bound_device_id", None)
        if bound is not None and bound.type != avoid:
            return bound
    for device in _devices(group) or ():
        if device.type != avoid:
            module = getattr(torch, device.type, None)
            index = module.current_device() if hasattr(module, "current_device") else device.index
            return torch.device(device.type, index)
    raise RuntimeError(f"process group has no backend for a device other than {avoid}")


def _route(sync_fn: Callable[..., Any], result: Any, group: Any | None = None, **kwargs: Any) -> Any:
    """Run ``sync_fn(result, group=group)`` on a group that has a backend for ``result``'s device (see module doc)."""
    if not isinstance(result, Tensor) or not dist.is_available() or not dist.is_initialized():
        return sync_fn(result, group=group, **kwargs)
    parent = _parent(group)
    types = _device_types(parent)
    if types is None or result.device.type in types:  # None: not a ProcessGroup (e.g. NON_GROUP_MEMBER)
        return sync_fn(result, group=group, **kwargs)
    mode = get_fallback_mode()
    if mode == "gloo":
        return sync_fn(result, group=_gloo_group(parent), **kwargs)
    if mode == "device":
        gathered = sync_fn(result.to(_group_device(parent, result.device.type)), group=group, **kwargs)
        return apply_to_collection(gathered, Tensor, lambda t: t.to(result.device))
    return sync_fn(result, group=group, **kwargs)


@replaces(_GATHER, params=("result", "group"), everywhere=True)
def gather_all_tensors(result: Tensor, group: Any | None = None) -> list[Tensor]:
    """Stock ``gather_all_tensors`` on a group that has a backend for the device of ``result``.

    Args:
        result: the value to gather.
        group: the process group; ``None`` means WORLD.

    Returns:
        One tensor per rank of the group, on the device of ``result``.

    """
    return _route(stock(_GATHER), result, group)


@replaces(_SYNC_DIST, params=("self", "dist_sync_fn", "process_group"))
def _sync_dist(self: Any, dist_sync_fn: Callable | None = None, process_group: Any | None = None) -> None:
    """Stock ``Metric._sync_dist`` in one collective, or with every state routed as in :func:`gather_all_tensors`.

    With the default ``dist_sync_fn`` every state is gathered by :func:`sync_states`: one ``all_gather`` for the
    states whose shape is fixed by their declaration (two with list states), the same values as stock's. A custom
    ``dist_sync_fn``, or states it cannot pack, take stock's per-state gather, routed: the function receives the
    fallback group (or the copied state) only where the stock call would have failed.

    """
    if dist_sync_fn is None or dist_sync_fn is stock(_GATHER) or dist_sync_fn is gather_all_tensors:
        if sync_states([self], process_group or self.process_group):  # one collective (two with lists)
            return
        dist_sync_fn = gather_all_tensors
    elif dist_sync_fn is not gather_all_tensors:
        dist_sync_fn = functools.partial(_route, dist_sync_fn)
    with _empty_list_states_on_cpu(self):
        stock(_SYNC_DIST)(self, dist_sync_fn, process_group)


@contextmanager
def _empty_list_states_on_cpu(metric: Any) -> Iterator[None]:
    """For ``compute_on_cpu`` metrics, stand in an empty CPU tensor for an empty list state during the sync.

    Stock substitutes ``torch.tensor([], device=metric.device)`` for an empty concatenated list state, so with
    ``compute_on_cpu=True`` a rank that saw no data would gather on the GPU while the others gather on the CPU.

    """
    swapped: dict[str, list[Tensor]] = {}
    if getattr(metric, "compute_on_cpu", False):
        for attr, reduction in metric._reductions.items():
            value = getattr(metric, attr)
            if reduction is dim_zero_cat and isinstance(value, list) and not value:
                swapped[attr] = [torch.empty(0, dtype=metric.dtype)]
                setattr(metric, attr, swapped[attr])
    try:
        yield
    finally:
        for attr, placeholder in swapped.items():
            if getattr(metric, attr) is placeholder:  # the sync failed before replacing it
                setattr(metric, attr, [])


# --------------------------------------------------------------------------------------------------------------------
# every state of one or many metrics in one collective (two with list states)

#: dtypes by code, for the size exchange of variable-size states (the same table on every rank: same torch)
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128", "uint16", "uint32", "uint64",
)  # fmt: skip
_DTYPES = tuple(getattr(torch, name) for name in _DTYPE_NAMES if hasattr(torch, name))
#: dimensions a variable-size state may have in the size exchange (more: gathered on its own, as stock)
_MAX_NDIM = 8
#: the byte rows of the gather end on this boundary, so that every dtype can view its slice of every row
_ALIGN = 16


class _State:
    """One distinct state to gather: what this rank sends and, once gathered, every rank's value."""

    __slots__ = ("fixed", "gathered", "is_list", "own", "stacked")

    def __init__(self, own: Tensor, fixed: bool, is_list: bool) -> None:
        self.own = own  # contiguous
        self.fixed = fixed  # shape and dtype fixed by the declaration: no exchange
        self.is_list = is_list
        self.gathered: list[Tensor] = []  # per rank, the own rank's slot is ``own`` (autograd, as stock)
        self.stacked: Tensor | None = None  # fixed states: the gathered values, stacked


def _plan(metric: Any, leader: Any | None = None) -> list[tuple[str, Any, _State]] | None:
    """``metric``'s states as ``(attr, reduction, state)``; ``None``: not coalescible.

    Decided on the host from the states and their declarations (``metric._defaults``), never from device values:
    a tensor state is fixed when its shape and dtype are its default's (then they are every rank's); a list state of
    a ``cat`` reduction and any other tensor state are variable (their sizes are exchanged). Anything else (a list
    with another reduction, non-tensor values, sparse tensors) keeps stock's per-state gather.

    ``leader``: ``(leader metric, its plan)`` when ``metric`` is declared to hold the leader's states (a compute group
    the user listed): a state declared alike (same name, reduction and default) takes the leader's, gathered once.
    Never decided by tensor identity: which states are shared objects differs between ranks (automatic compute
    groups are formed from each rank's first batch, ``copy_state`` copies them on the rank that asks).
    """
    shared = {} if leader is None else {attr: state for attr, _, state in leader[1]}
    plan = []
    for attr, reduction in metric._reductions.items():
        state = shared.get(attr) if leader is not None and _declared_alike(metric, leader[0], attr) else None
        if state is None:
            state = _new_state(metric, attr, reduction, getattr(metric, attr))
            if state is None:
                return None
        plan.append((attr, reduction, state))
    return plan


def _declared_alike(metric: Any, other: Any, attr: str) -> bool:
    """Whether ``attr`` is declared alike in both metrics (reduction and default): a host check of declarations."""
    if attr not in other._reductions or other._reductions[attr] is not metric._reductions[attr]:
        return False
    mine, theirs = metric._defaults.get(attr), other._defaults.get(attr)
    if isinstance(mine, Tensor) and isinstance(theirs, Tensor):
        return mine.shape == theirs.shape and mine.dtype == theirs.dtype
    return isinstance(mine, list) and isinstance(theirs, list)


def _new_state(metric: Any, attr: str, reduction: Any, value: Any) -> _State | None:
    if isinstance(value, Tensor):
        if value.layout != torch.strided or value.dtype not in _DTYPES:
            return None
        default = metric._defaults.get(attr)
        fixed = (
            reduction is not dim_zero_cat
            and isinstance(default, Tensor)
            and value.shape == default.shape
            and value.dtype == default.dtype
        )
        return _State(value.contiguous(), fixed, is_list=False)
    if reduction is not dim_zero_cat or not isinstance(value, list):
        return None
    if not all(isinstance(v, Tensor) and v.layout == torch.strided and v.dtype in _DTYPES for v in value):
        return None
    # stock's pre-concatenation, and its stand-in for a rank without data (on the CPU with compute_on_cpu, see
    # _empty_list_states_on_cpu)
    if len(value) > 1:
        own = dim_zero_cat(value)
    elif value:
        own = value[0]
    else:
        own = torch.empty(0, device="cpu" if metric.compute_on_cpu else metric.device, dtype=metric.dtype)
    return _State(own.contiguous(), fixed=False, is_list=True)


def _bytes(tensor: Tensor) -> Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


def _layout(dtypes: list[torch.dtype], nbytes: list[int]) -> tuple[list[int], int]:
    """Byte offsets of pieces packed widest dtype first (each offset is then aligned to its dtype), and the row size."""
    offsets = [0] * len(dtypes)
    offset = 0
    for index in sorted(range(len(dtypes)), key=lambda i: -itemsize(dtypes[i])):
        offsets[index] = offset
        offset += nbytes[index]
    return offsets, offset + (-offset % _ALIGN)


def _pack(pieces: list[Tensor], offsets: list[int], size: int, device: torch.device) -> Tensor:
    """One uint8 row of ``size`` bytes holding the bytes of ``pieces`` at ``offsets`` (one copy kernel)."""
    order = sorted(range(len(pieces)), key=lambda i: offsets[i])
    parts, end = [], 0
    for index in order:
        parts.append(_bytes(pieces[index]))
        end = offsets[index] + parts[-1].numel()
    if end < size:
        parts.append(torch.zeros(size - end, dtype=torch.uint8, device=device))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8, device=device)


def _all_gather_rows(row: Tensor, group: Any) -> Tensor:
    """``[world, len(row)]``: every rank's row, in one ``all_gather`` on ``group`` (with the backend fallback)."""
    parent = _parent(group)
    types = _device_types(parent)
    if types is not None and row.device.type not in types:
        mode = get_fallback_mode()
        if mode == "gloo":
            group = _gloo_group(parent)
        elif mode == "device":
            return _all_gather_rows(row.to(_group_device(parent, row.device.type)), group).to(row.device)
    out = torch.empty((dist.get_world_size(group), row.numel()), dtype=torch.uint8, device=row.device)
    dist.all_gather(list(out.unbind(0)), row, group=group)
    return out


def _gather_states(states: list[_State], group: Any) -> None:
    """Gather ``states`` (all on one device): one collective for the fixed ones and the sizes, one for the rest."""
    device = states[0].own.device
    fixed = [s for s in states if s.fixed]
    variable = [s for s in states if not s.fixed]
    pieces = [s.own for s in fixed]
    if variable:  # the size exchange travels with the fixed states: [dtype code, ndim, sizes...] per state
        header = []
        for s in variable:
            shape = list(s.own.shape) if s.own.ndim <= _MAX_NDIM else [0] * _MAX_NDIM
            header += [_DTYPES.index(s.own.dtype), s.own.ndim, *shape, *[0] * (_MAX_NDIM - len(shape))]
        pieces.append(torch.tensor(header, dtype=torch.int64).to(device))
    offsets, size = _layout([p.dtype for p in pieces], [p.numel() * p.element_size() for p in pieces])
    with torch.no_grad():
        rows = _all_gather_rows(_pack(pieces, offsets, size, device), group)
    world = rows.shape[0]
    for s, offset in zip(fixed, offsets):
        nbytes = s.own.numel() * s.own.element_size()
        s.stacked = rows[:, offset : offset + nbytes].view(s.own.dtype).reshape(world, *s.own.shape)
    if not variable:
        return
    offset = offsets[-1]
    header = rows[:, offset : offset + 8 * (2 + _MAX_NDIM) * len(variable)].view(torch.int64)
    described = header.reshape(world, len(variable), 2 + _MAX_NDIM).tolist()  # the one read of the exchange
    _gather_variable(variable, described, group, device)


def _gather_variable(variable: list[_State], described: list[Any], group: Any, device: torch.device) -> None:
    world = len(described)
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    too_deep = [i for i, s in enumerate(variable) if any(r[i][1] > _MAX_NDIM for r in described)]
    layouts = []
    for r in range(world):
        dtypes = [_DTYPES[described[r][i][0]] for i in range(len(variable))]
        shapes = [described[r][i][2 : 2 + described[r][i][1]] for i in range(len(variable))]
        nbytes = [0 if i in too_deep else _numel(shapes[i]) * itemsize(dtypes[i]) for i in range(len(variable))]
        offsets, size = _layout(dtypes, nbytes)
        layouts.append((dtypes, shapes, nbytes, offsets, size))
    longest = max(layout[4] for layout in layouts)
    own_layout = layouts[rank]
    if longest:
        pieces = [s.own if i not in too_deep else s.own[:0].reshape(-1) for i, s in enumerate(variable)]
        row = _pack(pieces, own_layout[3], longest, device)
        with torch.no_grad():
            rows = _all_gather_rows(row, group)
    for i, s in enumerate(variable):
        if i in too_deep:  # every rank sees it: stock's padded gather for this one
            s.gathered = stock(_GATHER)(s.own, group=group)
            continue
        s.gathered = []
        for r, (dtypes, shapes, nbytes, offsets, _) in enumerate(layouts):
            if r == rank:
                s.gathered.append(s.own)
            elif nbytes[i]:
                s.gathered.append(rows[r, offsets[i] : offsets[i] + nbytes[i]].view(dtypes[i]).reshape(shapes[i]))
            else:
                s.gathered.append(torch.empty(shapes[i], dtype=dtypes[i], device=device))


def _numel(shape: list[int]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def _reduced(state: _State, reduction: Any, first_use: bool, rank: int) -> Any:
    """Stock's post-processing of one gathered state: stacked (tensor) or flattened (list), then reduced."""
    if state.is_list:
        gathered: Any = list(state.gathered)
    elif state.stacked is None:
        gathered = torch.stack(state.gathered)
    elif state.own.requires_grad:  # the own rank's slot is the state itself, as stock's (gradients flow through it)
        gathered = torch.stack([state.own if r == rank else row for r, row in enumerate(state.stacked.unbind(0))])
    else:
        stacked = state.stacked
        gathered = stacked.contiguous() if first_use else stacked.clone(memory_format=torch.contiguous_format)
    if not (callable(reduction) or reduction is None):
        raise TypeError("reduction_fn must be callable or None")
    return reduction(gathered) if reduction is not None else gathered


def sync_states(metrics: list[Any], group: Any | None, leaders: list[int | None] | None = None) -> bool:
    """Sync the states of ``metrics`` (all on ``group``) in one ``all_gather`` per device (two with list states).

    Fixed-shape states of every metric are packed, as bytes, into one buffer per device, gathered once and reduced
    locally by each state's own reduction, exactly as stock reduces them (the same stacked tensors, bit for bit).
    No shape exchange and no host read for them; variable-size states add their sizes to that gather (one read) and
    their data in a second one.

    Args:
        metrics: the metrics to sync, in the same order on every rank.
        group: their process group (``None``: WORLD).
        leaders: per metric, the index in ``metrics`` of the metric whose states it holds (a compute group the user
            listed: the same on every rank), or ``None``. Such states are gathered once. Everything else is gathered
            metric by metric, shared objects included, so that every rank packs the same buffer whatever it shares.

    Returns:
        ``False`` (nothing gathered) when a metric has a state this cannot pack (see :func:`_plan`); the caller
        then syncs as stock.

    """
    leaders = leaders or [None] * len(metrics)
    plans: list[Any] = [None] * len(metrics)
    for index in sorted(range(len(metrics)), key=lambda i: leaders[i] is not None):  # leaders first
        lead = leaders[index]
        leader = None if lead is None or plans[lead] is None else (metrics[lead], plans[lead])
        plans[index] = _plan(metrics[index], leader)
        if plans[index] is None:
            return False
    distinct = list({id(s): s for plan in plans for _, _, s in plan}.values())
    by_device: dict[torch.device, list[_State]] = {}
    for s in distinct:
        by_device.setdefault(s.own.device, []).append(s)
    for device_states in by_device.values():
        _gather_states(device_states, group)
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    used: set[int] = set()
    for metric, plan in zip(metrics, plans):
        for attr, reduction, state in plan:
            setattr(metric, attr, _reduced(state, reduction, id(state) not in used, rank))
            used.add(id(state))
    return True
