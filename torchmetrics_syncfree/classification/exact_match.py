"""Sync-free ``torchmetrics.classification.exact_match``: MulticlassExactMatch and MultilabelExactMatch.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``validate_args``: the stat scores' validation,      the stat scores' device flag, a deferred check of the metric
called without the metric (``torch.unique`` +        (raised at once on CPU, reported at an eager point on the
``if ...:``)                                         device path, the invalid batch left out of the state)
``preds[target == ignore_index] = ignore_index``     ``masked_fill`` (multiclass)
``torch.tensor(preds.shape[0], device=...)``         ``torch.full``: no host-to-device copy
``self.correct += correct``                          ``add_``: in place, as stock
==================================================  ===========================================================

The functional ``_multiclass_exact_match_update``/``_multilabel_exact_match_update`` are replaced too (the functional
API gets the same fixed-shape counting); their results are stock's, integers, so to the bit on every path, which run
the same code (the validation reads at once where reads are free, as stock's does).

With ``validate_args=True`` a multiclass label outside ``[0, num_classes)`` is rejected (the stat scores' documented
range check; stock's check counts distinct labels and lets it through, where it never matches).

Like the samplewise stat scores, an invalid batch of a ``multidim_average="samplewise"`` metric on the device path
still appends its rows to the list state, with zero matches (its shape is known; which rows are valid is not).

"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.classification.stat_scores import _multiclass_stat_scores_format

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree._states import add_to_state_if, add_to_states
from torchmetrics_syncfree.classification.stat_scores import (
    _multiclass_stat_scores_tensor_validation,
    _validated_multilabel,
    _without_invalid,
)

_FUNCTIONAL = "torchmetrics.functional.classification.exact_match"
_MODULE = "torchmetrics.classification.exact_match"
#: a 1.7 patch release added ``ignore_index`` to the multilabel update (an ignored label counts as matched); told
#: apart by the stock function's signature, not the version (1.7.1 lacks it, 1.7.4 has it)
# (imported by name: the package attribute ``exact_match`` is the metric function, not the module)
_STOCK_MULTILABEL_UPDATE = importlib.import_module(_FUNCTIONAL)._multilabel_exact_match_update
_MULTILABEL_IGNORES = "ignore_index" in inspect.signature(_STOCK_MULTILABEL_UPDATE).parameters


@replaces(
    f"{_FUNCTIONAL}._multiclass_exact_match_update",
    params=("preds", "target", "multidim_average", "ignore_index"),
    everywhere=True,
)
def _multiclass_exact_match_update(
    preds: Tensor, target: Tensor, multidim_average: str = "global", ignore_index: int | None = None
) -> tuple[Tensor, Tensor]:
    """Stock's statistics: ``masked_fill`` for ignored entries, the total made on the device, a match by ``all``."""
    correct = _multiclass_matches(preds, target, multidim_average, ignore_index)
    return correct, torch.full((), _multiclass_total(preds, multidim_average), device=correct.device)


def _multiclass_matches(preds: Tensor, target: Tensor, multidim_average: str, ignore_index: int | None) -> Tensor:
    """The exact matches of stock's multiclass update (per sample, or summed)."""
    if ignore_index is not None:
        preds = preds.masked_fill(target == ignore_index, ignore_index)
    correct = (preds == target).all(1)  # stock's ``sum(1) == preds.shape[1]`` in one op
    return correct if multidim_average == "samplewise" else correct.sum()


def _multiclass_total(preds: Tensor, multidim_average: str) -> int:
    """Stock's total: the number of samples (global), or 1 per sample (samplewise)."""
    return preds.shape[0] if multidim_average == "global" else 1


@replaces(
    f"{_FUNCTIONAL}._multilabel_exact_match_update",
    params=("preds", "target", "num_labels", "multidim_average", *(("ignore_index",) if _MULTILABEL_IGNORES else ())),
    everywhere=True,
)
def _multilabel_exact_match_update(
    preds: Tensor,
    target: Tensor,
    num_labels: int,
    multidim_average: str = "global",
    ignore_index: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Stock's statistics, the total made on the device (older releases never pass ``ignore_index``)."""
    if ignore_index is not None:
        target = torch.where(target == -1, preds.long(), target)
    if multidim_average == "global":
        preds = torch.movedim(preds, 1, -1).reshape(-1, num_labels)
        target = torch.movedim(target, 1, -1).reshape(-1, num_labels)
    correct = (preds == target).all(1).sum(dim=-1)  # stock's ``(sum(1) == num_labels).sum(dim=-1)``
    total = torch.full((), preds.shape[0 if multidim_average == "global" else 2], device=correct.device)
    return correct, total


def _add_to_state(self: Any, invalid: Tensor | None, correct: Tensor, total: Tensor | int) -> None:
    """Stock's state update, in place for the tensor states (a captured CUDA graph replays into them)."""
    if self.multidim_average == "samplewise":
        # the total is the number of positions per sample, replaced (not summed) by every update, as stock does
        (correct,) = _without_invalid(invalid, correct)
        self.correct.append(correct)
        self.total = total
    elif isinstance(total, int):  # a number known on the host: no tensor made for it
        if invalid is None:
            add_to_states(self, ("correct", "total"), (correct, total))
        else:  # the batch enters the state only if it is valid: added times keep, in the adding ops
            keep = invalid.logical_not()
            add_to_state_if(self, "correct", correct, keep)
            add_to_state_if(self, "total", total, keep)
    else:
        correct, total = _without_invalid(invalid, correct, total)
        add_to_states(self, ("correct", "total"), (correct, total))
    _deferred.sweep(self)


_multiclass_init = replaces(
    f"{_MODULE}.MulticlassExactMatch.__init__",
    params=("self", "num_classes", "multidim_average", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.MulticlassExactMatch.__init__", __name__))
_multilabel_init = replaces(
    f"{_MODULE}.MultilabelExactMatch.__init__",
    params=("self", "num_labels", "threshold", "multidim_average", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.MultilabelExactMatch.__init__", __name__))


@replaces(f"{_MODULE}.MulticlassExactMatch.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    invalid = None
    if self.validate_args:
        invalid = _multiclass_stat_scores_tensor_validation(
            preds, target, self.num_classes, self.multidim_average, self.ignore_index, metric=self
        )
    preds, target = _multiclass_stat_scores_format(preds, target, 1)
    correct = _multiclass_matches(preds, target, self.multidim_average, self.ignore_index)
    total = _multiclass_total(preds, self.multidim_average)
    if self.multidim_average != "global":  # replaces the state: a tensor on the metric's device, as stock's
        total = torch.full((), total, device=correct.device)
    _add_to_state(self, invalid, correct, total)


@replaces(f"{_MODULE}.MultilabelExactMatch.update", params=("self", "preds", "target"), kind="metric_method")
def _multilabel_update(self: Any, preds: Tensor, target: Tensor) -> None:
    invalid, preds, target = _validated_multilabel(self, preds, target)
    ignore_index = self.ignore_index if _MULTILABEL_IGNORES else None
    correct, total = _multilabel_exact_match_update(preds, target, self.num_labels, self.multidim_average, ignore_index)
    _add_to_state(self, invalid, correct, total)
