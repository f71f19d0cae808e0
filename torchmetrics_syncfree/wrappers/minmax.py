"""Sync-free ``torchmetrics.wrappers.minmax``: MinMaxMetric.

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``val if self.max_val.to(val.device) < val else     ``torch.where(bound < val, val, bound)``: the comparison
self.max_val.to(val.device)`` (and ``min_val``):     stays on the device
``if tensor`` in every ``compute()`` and
``forward()``
``self.max_val.to(val.device)`` of the initial      a CPU bound on another device is rebuilt there with
CPU bound (the first ``compute()`` on a GPU)         ``torch.full`` (its value is read from host memory)
==================================================  ===========================================================

``update`` is the base metric's; ``forward`` is ``Metric.forward`` (the patched ``metric`` area), which calls this
``compute``. Stock's errors for unsuitable values are kept: ``RuntimeError`` for a tensor with more than one element,
``AttributeError`` for a Python number, whose ``device`` is read first, as in stock.

Deliberate deviation from stock (on every device, the same code): stock's new bound is *either* the value *or* the
old bound, so its dtype and shape are the value's when the value wins and the old bound's otherwise: they depend on
the data. A choice made on the device cannot pick a dtype, so the bounds take the value's dtype and shape in every
case. The two differ only when the value does not win and has another dtype or shape than the bound: before the first
``compute()`` of a value that is not a float32 0-dim tensor (the initial bounds are float32 0-dim), when that value is
NaN or equal to the initial bound (``-inf`` for the maximum, ``inf`` for the minimum); or when the base metric's value
changes dtype between computes. The values agree in every case (a float32 bound held in another dtype).

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree._registry import replaces

_MODULE = "torchmetrics.wrappers.minmax"


def _on_device_of(bound: Tensor, val: Tensor) -> Tensor:
    """``bound.to(val.device)``; a CPU bound is rebuilt on the device with ``torch.full`` (no host-to-device copy)."""
    if bound.device == val.device or not bound.is_cpu or bound.numel() != 1:
        return bound.to(val.device)
    return torch.full(bound.shape, bound.item(), dtype=bound.dtype, device=val.device)


def _new_bound(bound: Tensor, val: Tensor, wins: Tensor) -> Tensor:
    """``val`` where ``wins`` (0-dim or ``val``'s shape), else ``bound``: in ``val``'s dtype and shape."""
    return torch.where(wins, val, bound.to(val.dtype)).reshape(val.shape)


@replaces(f"{_MODULE}.MinMaxMetric.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> dict[str, Tensor]:
    """Stock's ``compute`` with the new bounds chosen by ``torch.where`` (no host read)."""
    val = self._base_metric.compute()
    if not self._is_suitable_val(val):
        raise RuntimeError(f"Returned value from base metric should be a float or scalar tensor, but got {val}.")
    max_val, min_val = _on_device_of(self.max_val, val), _on_device_of(self.min_val, val)
    self.max_val = _new_bound(max_val, val, max_val < val)
    self.min_val = _new_bound(min_val, val, min_val > val)
    return {"raw": val, "max": self.max_val, "min": self.min_val}
