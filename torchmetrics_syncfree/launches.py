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
    >>> from torchmetrics_syncfree.launches import LaunchCounter
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
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count_launches(call: Any, *args: Any, **kwargs: Any) -> tuple[int, collections.Counter[str]]:
    """Run ``call(*args, **kwargs)`` once; its launches and the ops they come from."""
    with LaunchCounter() as counter:
        call(*args, **kwargs)
    return counter.count, counter.ops
