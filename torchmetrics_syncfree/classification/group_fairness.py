"""Sync-free ``torchmetrics.classification.group_fairness``: BinaryGroupStatRates and BinaryFairness.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``validate_args``: the binary stat scores'           its device flag (the stat scores' deferred check)
``torch.unique`` + ``if ...:``
``if torch.max(groups) > num_groups:``               a device flag, a deferred ``ValueError`` (``GROUPS_OUTSIDE``)
                                                     of the metric: every group in ``[0, num_groups)``; the
                                                     invalid batch left out of the state
per group: ``torch.sort`` of the groups,             one index per entry, ``group * 4 + cell`` (cell: tn, fp, fn,
``_flexible_bincount`` (``torch.unique`` +           tp from target and prediction), counted into ``4 * G``
``bincount``), ``.cpu().tolist()`` split sizes,      fixed cells plus a sink for ignored entries (``scatter_add_``;
``torch.split``, four sums per group, and            ``torch.bincount`` where reads are free), added to the four
``self.tp[group] += tp`` per group                   states in place
BinaryFairness ``demographic_parity``:               zeros on ``preds``' device
``target = torch.zeros(preds.shape)`` (CPU)
BinaryFairness ``compute``: the keys                 the rates, their ``argmin``/``argmax`` and the ratios on the
``DP_{argmin}_{argmax}``/``EO_...`` name groups      device; the keys need the group ids on the host: **one**
found in the data: 4 reads per ratio, 8 with        read (all ids in one copy) per ``compute`` and so per
``task="all"``                                       ``forward``
==================================================  ===========================================================

BinaryGroupStatRates' ``compute`` (keys ``group_0`` ... from ``num_groups``) was already free of reads. The counts are
integers: equal to stock's wherever stock counts each group in its own slot. The group check is a deferred check on
every device (read at once where reads are free). BinaryFairness' ``compute`` is the one-read form on every device
(before 2026-11-28 a CPU compute called stock's): the same ratios and keys.

Deliberate deviations from stock (tested in ``tests/test_classification_more.py``):

* each group is counted in its own slot. Stock counts the groups *present in the batch* in consecutive slots
  (``_flexible_bincount`` drops absent ones): a batch without group 0 adds group 1's counts to slot 0;
* ``validate_args`` rejects every group outside ``[0, num_groups)`` (``ValueError``). Stock checks only
  ``max(groups) > num_groups``: a group equal to ``num_groups`` fails with an ``IndexError`` after the other groups'
  states were written, a negative one is counted in another group's slot. Without ``validate_args`` such entries are
  left out;
* a group outside ``[0, num_groups)`` raises with a message that names the problem rather than the values (stock
  names the largest group), on an accelerator after the offending update has returned (the batch left out of the
  state);
* BinaryFairness with ``task="demographic_parity"`` runs on CUDA (stock's CPU zeros meet CUDA predictions).

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_states
from torchmetrics_syncfree.classification.stat_scores import (
    _binary_stat_scores_format,
    _binary_stat_scores_tensor_validation,
    _count,
    _safe_divide,
    _without_invalid,
)

_FUNCTIONAL = "torchmetrics.functional.classification.group_fairness"
_MODULE = "torchmetrics.classification.group_fairness"
_GROUPS_RULE = "The group identifiers should be ``0, 1, ..., (num_groups - 1)``."

#: ``validate_args`` found a group outside ``[0, num_groups)`` on the device path (the values are not read there)
GROUPS_OUTSIDE = _deferred.Check(
    "group-fairness.groups-outside",
    f"Detected group identifiers in `groups` outside the specified number of groups. {_GROUPS_RULE} That batch was"
    " left out of the state.",
    ValueError,
)


def _kinds(metric: Any) -> tuple[_deferred.Check, ...]:
    """The checks a validating metric reports: the binary values' and the groups'."""
    return (_deferred.INVALID_VALUES, GROUPS_OUTSIDE) if metric.validate_args else ()


@replaces(f"{_FUNCTIONAL}._groups_validation", params=("groups", "num_groups"))
def _groups_validation(groups: Tensor, num_groups: int, metric: Any = None) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the range check is a device flag (returned).

    Every group must lie in ``[0, num_groups)`` (stock checks only ``max(groups) > num_groups``, see the module
    docstring). The flag is a deferred check: read at once where reads are free (``GROUPS_OUTSIDE``'s
    ``ValueError`` before the update changes anything), at an eager point elsewhere.
    """
    if metric is None:
        return stock(f"{_FUNCTIONAL}._groups_validation")(groups, num_groups)
    flag = ((groups < 0) | (groups >= num_groups)).any()
    _deferred.record(metric, GROUPS_OUTSIDE, flag)
    if groups.dtype != torch.long:
        raise ValueError(f"Expected dtype of argument groups to be long, not {groups.dtype}.")
    return flag


def _group_counts(
    preds: Tensor, target: Tensor, groups: Tensor, num_groups: int, threshold: float, ignore_index: int | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stock's per-group ``(tp, fp, tn, fn)`` as four ``(num_groups,)`` counts, with fixed shapes.

    Each entry's cell is stock's: a target of 1 is a tp where the prediction is 1 (fn otherwise), a target of 0 a tn
    where it is 0 (fp otherwise); any other target (ignored: -1) and any group outside ``[0, num_groups)`` go to the
    sink cell. A sample's group applies to all its entries (stock sorts the samples by group).
    """
    preds, target = _binary_stat_scores_format(preds, target, threshold, ignore_index)
    groups = groups.reshape(groups.shape[0], -1).long()
    positive = target == 1
    # thresholded scores are bool (1 exactly where not 0); stock compares label preds with the target's value
    hit = preds if preds.dtype == torch.bool else torch.where(positive, preds == 1, preds != 0)
    cell = groups * 4 + positive * 2 + hit
    counted = (positive | (target == 0)) & (groups >= 0) & (groups < num_groups)
    index = torch.where(counted, cell, 4 * num_groups).flatten()
    tn, fp, fn, tp = _count(index, 4 * num_groups + 1)[:-1].view(num_groups, 4).unbind(1)
    return tp, fp, tn, fn


def _update(self: Any, preds: Tensor, target: Tensor, groups: Tensor) -> None:
    invalid = None
    if self.validate_args:
        invalid = _binary_stat_scores_tensor_validation(preds, target, "global", self.ignore_index, metric=self)
        outside = _groups_validation(groups, self.num_groups, metric=self)
        if outside is not None:
            invalid = outside if invalid is None else invalid | outside
    counts = _group_counts(preds, target, groups, self.num_groups, self.threshold, self.ignore_index)
    add_to_states(self, ("tp", "fp", "tn", "fn"), _without_invalid(invalid, *counts))
    _deferred.sweep(self)


_rates_init = replaces(
    f"{_MODULE}.BinaryGroupStatRates.__init__",
    params=("self", "num_groups", "threshold", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.BinaryGroupStatRates.__init__", __name__, _kinds, size=2))
_fairness_init = replaces(
    f"{_MODULE}.BinaryFairness.__init__",
    params=("self", "num_groups", "task", "threshold", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.BinaryFairness.__init__", __name__, _kinds, size=2))


@replaces(f"{_MODULE}.BinaryGroupStatRates.update", params=("self", "preds", "target", "groups"), kind="metric_method")
def _rates_update(self: Any, preds: Tensor, target: Tensor, groups: Tensor) -> None:
    _update(self, preds, target, groups)


@replaces(f"{_MODULE}.BinaryFairness.update", params=("self", "preds", "target", "groups"), kind="metric_method")
def _fairness_update(self: Any, preds: Tensor, target: Tensor, groups: Tensor) -> None:
    if self.task == "demographic_parity":
        if target is not None:
            rank_zero_warn("The task demographic_parity does not require a target.", UserWarning)
        target = torch.zeros(preds.shape, device=preds.device)
    _update(self, preds, target, groups)


def _ratios(self: Any) -> list[tuple[str, Tensor]]:
    """(key prefix, per-group rates) of the task: positivity rates (DP) and true positive rates (EO)."""
    ratios = []
    if self.task in ("demographic_parity", "all"):
        ratios.append(("DP", _safe_divide(self.tp + self.fp, self.tp + self.fp + self.tn + self.fn)))
    if self.task in ("equal_opportunity", "all"):
        ratios.append(("EO", _safe_divide(self.tp, self.tp + self.fn)))
    return ratios


@replaces(f"{_MODULE}.BinaryFairness.compute", params=("self",), kind="metric_method")
def _fairness_compute(self: Any) -> dict[str, Tensor] | None:
    """Stock's ratios with one host read on every device: the group ids that name them (all of them in one copy)."""
    ratios = _ratios(self)
    if not ratios:
        return None
    ids = torch.stack([torch.stack((rates.argmin(), rates.argmax())) for _, rates in ratios])
    values = [rates.gather(0, pair) for (_, rates), pair in zip(ratios, ids)]
    names = ids.tolist()  # the one read: the keys name groups found in the data
    return {
        f"{prefix}_{low}_{high}": _safe_divide(value[0], value[1])
        for (prefix, _), (low, high), value in zip(ratios, names, values)
    }
