"""Kernel launches per call: the aten ops a metric's ``update``/``forward`` dispatches that launch a kernel on a GPU.

On a GPU every kernel launch costs the host 5-10 us, whatever the kernel does: in a launch-bound loop (small models,
high step rates, many metrics) the launches of the metrics are their cost. Counted without a GPU: every aten op that
reaches the dispatcher (below autograd, after composite ops are decomposed) is counted by a
:class:`~torch.utils._python_dispatch.TorchDispatchMode`, except those that launch nothing on CUDA:

* views and aliases (``view``, ``expand``, ``select``, ``transpose``, ``detach``, ...: the op's schema returns an
  alias of an input),
* allocations without initialisation (``empty``, ``empty_like``, ``empty_strided``, ``new_empty``) and
  ``_unsafe_view`` (a reshape of a fresh tensor),
* metadata (ops with no tensor in or out: ``sym_size``, ``is_same_size``, ...).

Everything else counts once: arithmetic, reductions, ``copy_``/``clone``/``_to_copy``, fills (``zeros``, ``full``,
``scalar_tensor``, ``ones_like``: one fill kernel each) and ``_local_scalar_dense`` (a device-to-host copy).
The same op may be one kernel on CPU and two on CUDA (a sort, a scatter with a deterministic fallback): the count is
the dispatcher's view, deterministic and equal for stock and patched code, which is what a comparison needs.

Example:
    >>> import torch
    >>> from torchmetrics_syncfree.tools.launches import LaunchCounter
    >>> x = torch.rand(8)
    >>> with LaunchCounter() as counter:
    ...     y = (x.view(2, 4) * 2).sum()
    >>> counter.count, dict(counter.ops)
    (2, {'aten.mul.Tensor': 1, 'aten.sum.default': 1})

"""

from __future__ import annotations

import collections
import functools
from typing import Any

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops (overload packets) that allocate or re-describe memory without writing it: no kernel on CUDA
NON_LAUNCHING = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_unsafe_view",
        "set_",
        "resize_",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
    }
)


@functools.cache
def launches(op: Any) -> bool:
    """Whether the aten overload ``op`` launches a kernel on CUDA (see the module docstring)."""
    if op.is_view or op._overloadpacket.__name__ in NON_LAUNCHING:
        return False
    schema = op._schema
    returns_alias = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    if returns_alias:  # a view op not flagged as one (e.g. ``detach``, ``lift_fresh``, ``alias``)
        return False
    touches_tensors = any(_is_tensor_type(a.type) for a in (*schema.arguments, *schema.returns))
    return touches_tensors or op._overloadpacket.__name__ in ("_local_scalar_dense",)


def _is_tensor_type(kind: Any) -> bool:
    return "Tensor" in str(kind)  # Tensor, Tensor?, Tensor[], Tensor(a!)


class LaunchCounter(TorchDispatchMode):
    """Count the kernel-launching aten ops dispatched while active (``count``; ``ops``: per op)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    @property
    def count(self) -> int:
        """The launches counted so far."""
        return sum(self.ops.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if launches(func):
            self.ops[str(func)] += (
                foreach_launches(args) if func._overloadpacket.__name__.startswith("_foreach_") else 1
            )
        return func(*args, **(kwargs or {}))


def _non_overlapping_and_dense(tensor: Tensor) -> bool:
    """Whether ``tensor``'s elements fill its memory without gaps or overlaps in some order of its dimensions."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def foreach_launches(args: Any) -> int:
    """Launches of a ``torch._foreach_*`` op on CUDA: one on its fast route, one per tensor of the list otherwise.

    CUDA's multi-tensor kernels take the fast route only when every tensor of the lists is non-overlapping and dense,
    all share one dtype, and the tensors at one position of each list have the same sizes and strides
    (``can_use_fast_route`` in ATen's ``ForeachUtils.h``); otherwise the op runs one kernel per tensor. A diagonal
    view, an expanded 0-dim tensor, mixed dtypes: each makes the list's length in launches.
    """
    lists = [arg for arg in args if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], Tensor)]
    if not lists:
        return 1
    first = lists[0][0]
    for tensors in lists:
        for position, tensor in enumerate(tensors):
            reference = lists[0][position]
            if (
                not _non_overlapping_and_dense(tensor)
                or tensor.dtype != first.dtype
                or tensor.shape != reference.shape
                or any(
                    size != 1 and stride != other
                    for size, stride, other in zip(tensor.shape, tensor.stride(), reference.stride())
                )
            ):
                return len(lists[0])
    return 1


def count_launches(call: Any, *args: Any, **kwargs: Any) -> tuple[int, collections.Counter[str]]:
    """Run ``call(*args, **kwargs)`` once; its launches and the ops they come from."""
    with LaunchCounter() as counter:
        call(*args, **kwargs)
    return counter.count, counter.ops
