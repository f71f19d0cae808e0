"""What differs between the torch releases the layer supports, detected once at import (never by version number).

Example:
    >>> from torchmetrics_syncfree._compat import is_dynamo_compiling
    >>> is_dynamo_compiling()
    False

"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

_compiler: Any = getattr(torch, "compiler", None)  # torch 2.1+

if hasattr(_compiler, "is_dynamo_compiling") and hasattr(_compiler, "_is_compiling_flag"):
    # recent torch: ``is_compiling()`` is ``not torch.jit.is_scripting() and _is_compiling_flag``, two Python calls; the
    # layer asks both halves itself in one call each: ``is_dynamo_compiling`` (which dynamo folds to True while it
    # traces) and the flag that ``torch.export`` and compilation set. TorchScript never runs this code.
    is_dynamo_compiling = _compiler.is_dynamo_compiling
    compiling_flags: Any = _compiler
elif hasattr(_compiler, "is_compiling"):
    is_dynamo_compiling, compiling_flags = _compiler.is_compiling, SimpleNamespace(_is_compiling_flag=False)
else:  # torch 2.0
    import torch._dynamo

    is_dynamo_compiling, compiling_flags = torch._dynamo.is_compiling, SimpleNamespace(_is_compiling_flag=False)


def is_compiling() -> bool:
    """Whether ``torch.compile`` (dynamo, export) is tracing now; one Python call on recent torch."""
    return is_dynamo_compiling() or compiling_flags._is_compiling_flag


def _foreach_add_records_grad() -> bool:
    """Whether an in-place ``torch._foreach_add_`` records autograd: torch 2.0's does not (its states lose the grad)."""
    with torch.inference_mode(False), torch.enable_grad():
        states = [torch.zeros(())]
        torch._foreach_add_(states, [torch.ones((), requires_grad=True)])
    return states[0].requires_grad


#: where False, states that autograd records are added one ``add_`` each
FOREACH_ADD_RECORDS_GRAD = _foreach_add_records_grad()


def _has_cpu_half_activations() -> bool:
    """Whether torch has half-precision sigmoid and softmax on the CPU (torch 2.0 has neither)."""
    try:
        torch.zeros(1, 1, dtype=torch.half).sigmoid().softmax(dim=1)
    except RuntimeError:
        return False
    return True


_CPU_HALF_ACTIVATIONS = _has_cpu_half_activations()


def activated(x: Tensor, normalization: str) -> Tensor:
    """``x.sigmoid()`` (``"sigmoid"``) or ``x.softmax(dim=1)``, as the fixed-shape updates apply them to every batch.

    Stock applies them only to batches with values outside [0, 1]; on torch without half-precision CPU kernels they
    run in float32 there and round back (the precision the accelerators' kernels compute half inputs in).
    """
    if x.dtype is torch.half and not _CPU_HALF_ACTIVATIONS and x.is_cpu:
        return activated(x.float(), normalization).half()
    return x.sigmoid() if normalization == "sigmoid" else x.softmax(dim=1)


#: whether ``torch._foreach_mul`` takes a 0-dim tensor factor without reading it (its ``Tensor`` overload; torch 2.0
#: converts the tensor to a Python number, a host read)
FOREACH_MUL_BY_TENSOR = "Tensor" in torch.ops.aten._foreach_mul.overloads()


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (``torch.dtype.itemsize`` is torch 2.1+)."""
    return dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty((), dtype=dtype).element_size()
