"""Sync-free ``torchmetrics.wrappers.multioutput``: ``MultioutputWrapper``'s selection of each output's inputs.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``torch.index_select(..., index=torch.tensor(i,     ``tensor.narrow(output_dim, i, 1)`` copied into a new
device=self.device))``: a host-to-device copy per    contiguous tensor (``clone``): index_select's values, shape
output and per tensor argument                       and layout without an index tensor (one launch each, as
                                                     stock's ``index_select``)
``remove_nans``: ``arg[~nan_idxs]`` per output       no NaN possible (no floating-point input): nothing to remove,
and tensor (a boolean mask: a data-dependent         no read. Otherwise the rows with a NaN of every output are
shape, one read each)                                found at once, and their counts read in ONE host read per
                                                     call (the kept rows' number is the wrapped metric's batch
                                                     size); an output without NaN rows takes its inputs as they
                                                     are, the others by ``index_select`` of the kept rows (in
                                                     order: a stable sort of the NaN flags)
==================================================  ===========================================================

``update``, ``forward`` and ``compute`` are stock's (they call this selection, then the wrapped metrics). Where reads
are free (CPU) the selection is stock's. Values, shapes and dtypes are stock's on both paths (the same rows in the
same order reach each wrapped metric).

Remaining read (documented; ``tests/test_wrappers_more.py``): with ``remove_nans=True`` (the default) and a
floating-point input, one host read per ``update``/``forward`` on the device path: the number of rows the wrapped
metric receives depends on the data, and a generic wrapped metric has no neutral row to stand in for a removed one.
``remove_nans=False``, or inputs without floating point: no read.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities import apply_to_collection
from torch import Tensor

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.wrappers.bootstrapping import first_tensor

_SELECT = "torchmetrics.wrappers.multioutput.MultioutputWrapper._get_args_kwargs_by_output"


def _select(tensor: Tensor, dim: int, i: int) -> Tensor:
    """``torch.index_select(tensor, dim, torch.tensor(i))`` without an index tensor: a contiguous copy of entry i."""
    return tensor.narrow(dim, i, 1).clone(memory_format=torch.contiguous_format)


def _nan_rows(tensors: list[Tensor]) -> Tensor:
    """Stock's ``_get_nan_indices``: rows (dim 0) with a NaN in any of ``tensors``."""
    rows = torch.zeros(len(tensors[0]), dtype=torch.bool, device=tensors[0].device)
    for tensor in tensors:
        rows |= torch.isnan(tensor.flatten(start_dim=1)).any(dim=1)
    return rows


@replaces(_SELECT, params=("self", "args", "kwargs"))
def _get_args_kwargs_by_output(self: Any, *args: Tensor, **kwargs: Tensor) -> list[tuple[Any, Any]]:
    """Stock's selection where reads are free; on the device path indices on the device, NaN rows in one read."""
    sample = first_tensor(args, kwargs)
    if sample is None or _deferred.reads_are_free(sample):
        return stock(_SELECT)(self, *args, **kwargs)
    selected = []
    for i in range(len(self.metrics)):
        selected_args = apply_to_collection(args, Tensor, _select, dim=self.output_dim, i=i)
        selected_kwargs = apply_to_collection(kwargs, Tensor, _select, dim=self.output_dim, i=i)
        selected.append((selected_args, selected_kwargs))
    if self.remove_nans:
        selected = _without_nan_rows(selected)
    out = []
    for selected_args, selected_kwargs in selected:
        if self.squeeze_outputs:
            selected_args = [arg.squeeze(self.output_dim) for arg in selected_args]
            selected_kwargs = {k: v.squeeze(self.output_dim) for k, v in selected_kwargs.items()}
        out.append((selected_args, selected_kwargs))
    return out


def _without_nan_rows(selected: list[tuple[Any, Any]]) -> list[tuple[list[Tensor], dict[str, Tensor]]]:
    """Each output's arguments without the rows where one of them has a NaN: one host read for every output."""
    rows = []
    for selected_args, selected_kwargs in selected:
        tensors = list(selected_args) + list(selected_kwargs.values())
        if not tensors:  # stock's ``_get_nan_indices`` error
            raise ValueError("Must pass at least one tensor as argument")
        rows.append(_nan_rows(tensors) if any(t.is_floating_point() or t.is_complex() for t in tensors) else None)
    flagged = [r for r in rows if r is not None]
    # the one read: how many rows each output keeps (the wrapped metrics' batch sizes)
    nan_counts = torch.stack(flagged).sum(1).tolist() if flagged else []  # every output has the batch's rows
    counts = iter(nan_counts)
    out = []
    for (selected_args, selected_kwargs), nan in zip(selected, rows):
        removed = next(counts) if nan is not None else 0
        if removed:
            kept = torch.sort(nan.to(torch.uint8), stable=True).indices[: len(nan) - removed]
            selected_args = [arg.index_select(0, kept) for arg in selected_args]
            selected_kwargs = {k: v.index_select(0, kept) for k, v in selected_kwargs.items()}
        else:  # stock's mask keeps every row: a copy of the same values
            selected_args = list(selected_args)
            selected_kwargs = dict(selected_kwargs)
        out.append((selected_args, selected_kwargs))
    return out
