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
