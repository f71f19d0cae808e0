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

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class AllocatedBytes(TorchDispatchMode):
    """The bytes of the new storages that the ops dispatched while active return (``total``)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        seen = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                self.total += t.untyped_storage().nbytes()
                seen.add(t.untyped_storage().data_ptr())
        return out


def allocated_by(call: Callable[[], Any]) -> int:
    """Run ``call()`` once; the bytes of the new tensors it made."""
    with AllocatedBytes() as allocated:
        call()
    return allocated.total
