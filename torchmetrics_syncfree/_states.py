"""Metric states written in place, and the one case where they cannot be: inference tensors outside inference mode.

The patched updates add to a metric's tensor states in place (``add_``), where stock TorchMetrics mostly makes new
tensors (``self.tp = self.tp + tp``): in place, the tensors a captured CUDA graph holds are the ones that hold the
result after every replay, and no new tensor is allocated per update.

States made by a ``reset()`` or ``forward()`` under ``torch.inference_mode()`` (Lightning's evaluation) are inference
tensors, which no in-place op may write outside inference mode: a validation metric reset at the end of its epoch
and then updated in a training step would raise where stock's out-of-place update runs. :func:`add_to_states` makes
new tensors there, as stock does; everywhere else it writes in place.

Example:
    >>> import torch
    >>> from torchmetrics import SumMetric
    >>> from torchmetrics_syncfree._states import add_to_states, read_only
    >>> metric = SumMetric()
    >>> with torch.inference_mode():
    ...     metric.reset()
    >>> read_only(metric.sum_value)
    True
    >>> add_to_states(metric, ("sum_value",), (torch.tensor(2.0),))
    >>> metric.sum_value, read_only(metric.sum_value)
    (tensor(2.), False)

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree._compat import FOREACH_ADD_RECORDS_GRAD
from torchmetrics_syncfree._compat import is_dynamo_compiling as _is_dynamo_compiling  # as ``reads_are_free``


def read_only(tensor: Tensor) -> bool:
    """Whether no in-place op may write ``tensor`` now: an inference tensor outside inference mode.

    Always ``False`` while dynamo traces: ``Tensor.is_inference()`` cannot be traced (a graph break), and the traced
    code keeps its in-place form.
    """
    return not _is_dynamo_compiling() and tensor.is_inference() and not torch.is_inference_mode_enabled()


def add_to_states(metric: Any, names: Sequence[str], values: Sequence[Tensor] | Tensor) -> None:
    """``metric.<name> += value`` for each state name: in place, or as new tensors where the states are read-only.

    The states of one metric are made together (by ``reset()``, ``forward()`` or the constructor), so the first one
    tells for all of them. Several tensor values are added by one ``torch._foreach_add_``: one kernel launch on CUDA
    (its multi-tensor path) where separate ``add_`` calls launch one each. ``values`` may also be one tensor whose
    rows are the values (a block computed together, e.g. by ``torch.stack``): its rows are dense and in the states'
    shapes already, so nothing is checked or reshaped per value (this runs every update).
    """
    states = [getattr(metric, name) for name in names]
    block = isinstance(values, Tensor)
    if block:
        values = values.unbind(0)
    if read_only(states[0]):
        for name, state, value in zip(names, states, values):
            setattr(metric, name, state + value)
        return
    foreach = FOREACH_ADD_RECORDS_GRAD or not torch.is_grad_enabled()
    if block and foreach:
        torch._foreach_add_(states, values)
    elif foreach and len(states) > 1 and all(isinstance(value, Tensor) for value in values):
        # one op for all of them: on CUDA one multi-tensor kernel instead of one launch per state, where the kernel's
        # fast route takes them: the values in the states' shapes (a 0-dim count into a ``(1,)`` state: a view, no
        # launch; other shapes would take the slow route, one kernel per state)
        torch._foreach_add_(
            states,
            [value if value.shape == state.shape else _shaped_as(value, state) for value, state in zip(values, states)],
        )
    else:
        for state, value in zip(states, values):
            state.add_(value)


def _shaped_as(value: Tensor, state: Tensor) -> Tensor:
    """``value`` viewed in ``state``'s shape where it has as many elements and is contiguous (else as it is)."""
    if value.numel() != state.numel() or not value.is_contiguous():
        return value
    return value.view(state.shape)


def add_to_state_if(metric: Any, name: str, value: Tensor | int, keep: Tensor) -> None:
    """``metric.<name> += value * keep`` (``keep``: a 0-dim bool, "this batch enters the state") in one op.

    In place (``addcmul_``; ``add_(keep, alpha=value)`` for a number known on the host, which then needs no tensor):
    the batch is left out by the same kernel that adds it; as a new tensor where the state is read-only
    (:func:`read_only`).
    """
    state = getattr(metric, name)
    if read_only(state):
        setattr(metric, name, state + value * keep)
    elif isinstance(value, Tensor):
        state.addcmul_(value, keep)
    else:
        state.add_(keep, alpha=value)
