"""Bytes allocated per call: the new storages that the aten ops of a metric's ``update``/``forward`` return.

Deterministic (the same inputs allocate the same tensors), so tests assert it where time could only be benchmarked:
at 100000 classes stock's multiclass ``update`` allocates an 80 GB ``C x C`` count, the patched one a few MB. Every
tensor an op returns whose storage is not one of the op's inputs' counts once, with its storage's size; in-place
results and views count nothing. The total bounds the call's peak memory from above (tensors freed within the call
are still counted).

Example:
    >>> import torch
    >>> from torchmetrics_syncfree.tools.allocations import allocated_by
    >>> x = torch.zeros(1000)
    >>> allocated_by(lambda: x.add_(1).view(10, 100).sum(0))  # add_ in place, view an alias: the sum's 100 floats
    400

"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class AllocatedBytes(TorchDispatchMode):
    """The bytes of the new storages that the ops dispatched while active return.

    ``total``: all of them; ``peak``: the most of them alive at once (where :data:`PEAK_MEASURABLE`, else 0).
    """

    def __init__(self) -> None:
        super().__init__()
        self.total = self.peak = self._alive = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        seen = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                storage = t.untyped_storage()
                self.total += storage.nbytes()
                seen.add(storage.data_ptr())
                if PEAK_MEASURABLE:
                    self._alive += storage.nbytes()
                    self.peak = max(self.peak, self._alive)
                    weakref.finalize(storage, self._freed, storage.nbytes())
        return out

    def _freed(self, nbytes: int) -> None:
        self._alive -= nbytes


def allocated_by(call: Callable[[], Any]) -> int:
    """Run ``call()`` once; the bytes of the new tensors it made."""
    return allocations_of(call).total


def allocations_of(call: Callable[[], Any]) -> AllocatedBytes:
    """Run ``call()`` once; the bytes of the new tensors it made (``total``) and the most alive at once (``peak``)."""
    with AllocatedBytes() as allocated:
        call()
    return allocated


def _storages_are_preserved() -> bool:
    tensor = torch.zeros(1)
    return tensor.untyped_storage() is tensor.untyped_storage()


#: Whether a tensor's storage is one Python object for its whole life (recent torch releases), so that its release can
#: be watched; older releases make a new object per ``untyped_storage()`` call.
PEAK_MEASURABLE = _storages_are_preserved()


def peak_allocated_by(call: Callable[[], Any]) -> int:
    """Run ``call()`` once; the most bytes its new tensors held at once (needs :data:`PEAK_MEASURABLE`).

    Example:
        >>> import torch
        >>> from torchmetrics_syncfree.tools.allocations import PEAK_MEASURABLE, allocated_by, peak_allocated_by
        >>> x = torch.zeros(1000)
        >>> step = lambda: x.add(1).mul(2).sum()  # two temporaries of 4000 bytes alive at once, then a 4-byte sum
        >>> (allocated_by(step), peak_allocated_by(step) if PEAK_MEASURABLE else 8000)
        (8004, 8000)

    """
    if not PEAK_MEASURABLE:
        raise RuntimeError(f"torch {torch.__version__} makes a new storage object per call: its peak is not watchable")
    return allocations_of(call).peak
