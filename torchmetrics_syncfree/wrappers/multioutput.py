"""Sync-free ``torchmetrics.wrappers.multioutput``: ``MultioutputWrapper``'s selection of each output's inputs.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``torch.index_select(..., index=torch.tensor(i,     ``tensor.narrow(output_dim, i, 1)`` copied into a new
device=self.device))``: a host-to-device copy per    contiguous tensor (``clone``): index_select's values, shape
output and per tensor argument                       and layout without an index tensor (one launch each, as
                                                     stock's ``index_select``)
``remove_nans``: ``arg[~nan_idxs]`` per output       no NaN possible (no floating-point input): nothing removed.
and tensor (a boolean mask: a data-dependent         Wrapped metrics whose states are all tensor sums (and that
shape, one read each)                                have no check counters: MeanSquaredError, MeanAbsoluteError,
                                                     R2Score, ...), where reads are not free: a fixed shape, no
                                                     read. Each NaN row is replaced by the output's first row
                                                     without NaN, and that row's own contribution (its update
                                                     alone, from the default states) times the number of NaN
                                                     rows is taken off again; inside ``forward`` too (the
                                                     wrapped metric's ``update`` is neutralised for the call).
                                                     Other wrapped metrics: the NaN rows of every output found
                                                     at once, their counts read in ONE host read per
                                                     ``update``/``forward``, then the kept rows by
                                                     ``index_select`` (a stable sort: stock's order)
==================================================  ===========================================================

The selection (narrowed copies; NaN rows found for every output, then read once) is one implementation on every
device. The neutralised rows are the device path's: where reads are free (CPU) the wrapper's update and forward are
stock's, on the selection here, whose one read costs a CPU nothing (host time per update of ``MultioutputWrapper(
MeanSquaredError(), 3)``, batch 32, paired: 0.82x stock's, 1.00x with NaN rows; forward 0.65x). Values, shapes and
dtypes are stock's: to the bit where rows are removed after the read, up to float rounding where they are neutralised
(``kept + n * row - n * row``; ``rtol=1e-6`` in the tests). No row kept: the states stay as they were (stock's update
of an empty batch).

Costs (documented; ``tests/test_wrappers_more.py``): the neutralised ``remove_nans`` runs the wrapped metric's update a
second time on the filler row, plus a few operations per state: 114 launches per ``update`` of
``MultioutputWrapper(MeanSquaredError(), 3)`` against stock's 54 (and stock's 12 host reads, 0 here). The read path
stays for wrapped metrics whose states are not sums (lists, means, custom reductions) or that have check counters (a
second update of the filler row would file its problems twice). A wrapped metric's own compute may still read where it
needs the number of rows (R2Score's "at least two samples" check, whose host count sees the filler row).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning_utilities import apply_to_collection
from torch import Tensor
from torchmetrics.utilities.data import dim_zero_sum

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.wrappers.bootstrapping import first_tensor

_WRAPPER = "torchmetrics.wrappers.multioutput.MultioutputWrapper"
_SELECT = f"{_WRAPPER}._get_args_kwargs_by_output"


def _select(tensor: Tensor, dim: int, i: int) -> Tensor:
    """``torch.index_select(tensor, dim, torch.tensor(i))`` without an index tensor: a contiguous copy of entry i."""
    return tensor.narrow(dim, i, 1).clone(memory_format=torch.contiguous_format)


def _nan_rows(tensors: list[Tensor]) -> Tensor:
    """Stock's ``_get_nan_indices``: rows (dim 0) with a NaN in any of ``tensors``."""
    rows = torch.isnan(tensors[0].flatten(start_dim=1)).any(dim=1)
    for tensor in tensors[1:]:
        rows |= torch.isnan(tensor.flatten(start_dim=1)).any(dim=1)
    return rows


def _selected(self: Any, args: Any, kwargs: Any) -> list[tuple[Any, Any]]:
    """Each output's arguments (stock's ``index_select`` of entry ``i`` along ``output_dim``), not yet squeezed."""
    selected = []
    for i in range(len(self.metrics)):
        selected_args = apply_to_collection(args, Tensor, _select, dim=self.output_dim, i=i)
        selected_kwargs = apply_to_collection(kwargs, Tensor, _select, dim=self.output_dim, i=i)
        selected.append((selected_args, selected_kwargs))
    return selected


def _squeezed(self: Any, selected_args: Any, selected_kwargs: Any) -> tuple[Any, Any]:
    if self.squeeze_outputs:
        selected_args = [arg.squeeze(self.output_dim) for arg in selected_args]
        selected_kwargs = {k: v.squeeze(self.output_dim) for k, v in selected_kwargs.items()}
    return selected_args, selected_kwargs


@replaces(_SELECT, params=("self", "args", "kwargs"))
def _get_args_kwargs_by_output(self: Any, *args: Tensor, **kwargs: Tensor) -> list[tuple[Any, Any]]:
    """Stock's selection without index copies; with ``remove_nans`` the NaN rows of every output in one read."""
    selected = _selected(self, args, kwargs)
    if self.remove_nans:
        selected = _without_nan_rows(selected)
    return [_squeezed(self, *output) for output in selected]


# --------------------------------------------------------------------------------------------------------------------
# remove_nans without a read, for wrapped metrics whose states are sums


def _sum_states(metric: Any) -> list[str] | None:
    """The states of ``metric`` if every one is a tensor summed across batches (so rows add up), else ``None``.

    Metrics with deferred checks are left out: the filler row's own update would file its problems a second time.
    """
    if not hasattr(metric.update, "__wrapped__") or _deferred.counters_of(metric) is not None:
        return None  # not a metric's own wrapped update, or one with check counters
    states = list(metric._defaults)
    summed = all(
        isinstance(metric._defaults[key], Tensor) and metric._reductions.get(key) is dim_zero_sum for key in states
    )
    return states if states and summed else None


class _Output:
    """One output's arguments with its NaN rows replaced by its first row without NaN (a fixed shape), and that row."""

    def __init__(self, wrapper: Any, selected_args: Any, selected_kwargs: Any) -> None:
        tensors = [*selected_args, *selected_kwargs.values()]
        if not tensors:  # stock's ``_get_nan_indices`` error
            raise ValueError("Must pass at least one tensor as argument")
        self.nan = _nan_rows(tensors) if any(t.is_floating_point() or t.is_complex() for t in tensors) else None
        if self.nan is not None:
            rows = torch.arange(len(self.nan), device=self.nan.device)
            first = self.nan.to(torch.uint8).argmin().view(1)  # the first row without NaN; 0 where every row has one
            filled = torch.where(self.nan, first, rows)
            selected_args = [arg.index_select(0, filled) for arg in selected_args]
            selected_kwargs = {k: v.index_select(0, filled) for k, v in selected_kwargs.items()}
            self.row = _squeezed(
                wrapper,
                [arg.index_select(0, first) for arg in selected_args],
                {k: v.index_select(0, first) for k, v in selected_kwargs.items()},
            )
        self.args, self.kwargs = _squeezed(wrapper, selected_args, selected_kwargs)

    @contextmanager
    def neutralising(self, metric: Any, states: list[str]) -> Iterator[None]:
        """``metric.update`` (also inside its ``forward``) counts the filled rows as if the NaN rows were removed.

        The states are sums over rows: the filled batch's update adds the kept rows and ``n`` copies of the filler
        row, whose own contribution (the unwrapped update of that row alone, from the default states) times ``n`` is
        then taken off. No row kept: the states stay as they were (stock's update of an empty batch).
        """
        if self.nan is None:
            yield
            return
        wrapped = metric.update
        nan_count = self.nan.sum()
        none_kept = nan_count == len(self.nan)

        def update(*args: Any, **kwargs: Any) -> None:
            before = {key: getattr(metric, key).clone() for key in states}  # the update may add to them in place
            wrapped(*args, **kwargs)
            filled = {key: getattr(metric, key) for key in states}
            row = _contribution(metric, states, wrapped.__wrapped__, *self.row)  # unwrapped: not counted
            counts: dict[torch.dtype, Tensor] = {}
            for key in states:
                count = counts.setdefault(row[key].dtype, nan_count.to(row[key].dtype))
                kept = filled[key].addcmul(count, row[key], value=-1)
                setattr(metric, key, torch.where(none_kept, before[key], kept))

        metric.update = update
        try:
            yield
        finally:
            metric.update = wrapped


def _contribution(metric: Any, states: list[str], update: Any, args: Any, kwargs: Any) -> dict[str, Tensor]:
    """What ``update(*args, **kwargs)`` adds to each of ``metric``'s sum states (run from the default states)."""
    defaults = {key: metric._defaults[key].to(getattr(metric, key).device) for key in states}
    for key in states:
        setattr(metric, key, defaults[key].clone())
    update(*args, **kwargs)
    return {key: getattr(metric, key) - defaults[key] for key in states}


def _outputs_if_neutral(self: Any, args: Any, kwargs: Any) -> list[tuple[_Output, list[str]]] | None:
    """The device path's fixed-shape ``remove_nans``, where every wrapped metric's states are sums; else ``None``."""
    sample = first_tensor(args, kwargs)
    if not self.remove_nans or sample is None or _deferred.reads_are_free(sample):
        return None
    states = [_sum_states(metric) for metric in self.metrics]
    if any(s is None for s in states):
        return None
    return [(_Output(self, *output), s) for output, s in zip(_selected(self, args, kwargs), states)]


@replaces(f"{_WRAPPER}.update", params=("self", "args", "kwargs"), kind="metric_method")
def _update(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's update; on the device path with sum-state metrics ``remove_nans`` by neutralised rows (no read)."""
    outputs = _outputs_if_neutral(self, args, kwargs)
    if outputs is None:
        stock(f"{_WRAPPER}.update")(self, *args, **kwargs)
        return
    for metric, (output, states) in zip(self.metrics, outputs):
        with output.neutralising(metric, states):
            metric.update(*output.args, **output.kwargs)


@replaces(f"{_WRAPPER}.forward", params=("self", "args", "kwargs"))
@torch.jit.unused  # as stock's: ``torch.jit.script`` of the wrapper leaves it out
def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Stock's forward; on the device path with sum-state metrics ``remove_nans`` by neutralised rows (no read)."""
    outputs = _outputs_if_neutral(self, args, kwargs)
    if outputs is None:
        return stock(f"{_WRAPPER}.forward")(self, *args, **kwargs)
    results = []
    for metric, (output, states) in zip(self.metrics, outputs):
        with output.neutralising(metric, states):
            results.append(metric(*output.args, **output.kwargs))
    if results[0] is None:
        return None
    return torch.stack(results, 0)


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
