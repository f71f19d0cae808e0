"""Sync-free ``torchmetrics.classification.hinge``: BinaryHingeLoss and MulticlassHingeLoss.

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``validate_args``: the confusion matrix's            its device flag, a deferred check of the metric (raised at
``torch.unique`` + ``if ...:``                       once on CPU, reported at an eager point on the device path,
                                                     the invalid batch left out of the state)
``ignore_index``: ``preds[target != ii]``            ignored entries stay in place; their losses are zeroed
``margin[target] = preds[target]``,                  ``torch.where(target, preds, -preds)``
``margin[~target] = -preds[~target]``
crammer-singer: ``preds[target]`` and                ``gather`` of the target's score and ``masked_fill(-inf)``
``preds[~target].view(N, -1).max(1)``                of it before the row maximum
``tensor(target.shape[0], device=...)``              the count of kept entries on the device (a Python int added
                                                     in place without ``ignore_index``)
``self.measures += measures``                        ``add_``: in place, as stock
==================================================  ===========================================================

One implementation on every device (before 2026-11-28 a CPU update called stock's functions: two implementations).
The sums run over the whole batch with the ignored entries' losses set to 0: with ``ignore_index`` the float sums may
differ from stock's (which sums the kept entries only) in the last bits, as any change of the summation order does;
without it they are stock's to the bit (on the device path column-major one-vs-all probabilities are normalised into
a row-major tensor, as stock does on an accelerator, and sum in its order).

Deliberate deviations from stock:

* a crammer-singer batch whose every entry is ignored adds nothing (stock fails: ``view(0, -1)`` of an empty tensor);
* with ``validate_args=False``, a multiclass target outside ``[0, num_classes)`` is left out like an ignored entry
  (stock fails in its one-hot: an index error on CPU, a device-side assert on CUDA);
* with ``validate_args=True`` a multiclass target outside the classes is rejected by the range check the stat scores
  and confusion matrices use (stock's check counts distinct labels and lets it through to fail in the one-hot).

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_state_if, add_to_states
from torchmetrics_syncfree.classification.confusion_matrix import _binary_confusion_matrix_tensor_validation
from torchmetrics_syncfree.classification.stat_scores import (
    _multiclass_stat_scores_tensor_validation,
    _without_invalid,
    normalize_logits_if_needed,
    normalize_logits_of_kept,
)

_FUNCTIONAL = "torchmetrics.functional.classification.hinge"
_MODULE = "torchmetrics.classification.hinge"


def _raise_not_float(preds: Tensor) -> None:
    raise ValueError(
        "Expected argument `preds` to be floating tensor with probabilities/logits"
        f" but got tensor with dtype {preds.dtype}"
    )


@replaces(f"{_FUNCTIONAL}._binary_hinge_loss_tensor_validation", params=("preds", "target", "ignore_index"))
def _binary_hinge_loss_tensor_validation(
    preds: Tensor, target: Tensor, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._binary_hinge_loss_tensor_validation")(preds, target, ignore_index)
    invalid = _binary_confusion_matrix_tensor_validation(preds, target, ignore_index, metric=metric)
    if not preds.is_floating_point():
        _raise_not_float(preds)
    return invalid


@replaces(
    f"{_FUNCTIONAL}._multiclass_hinge_loss_tensor_validation",
    params=("preds", "target", "num_classes", "ignore_index"),
)
def _multiclass_hinge_loss_tensor_validation(
    preds: Tensor, target: Tensor, num_classes: int, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the label check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multiclass_hinge_loss_tensor_validation")(
            preds, target, num_classes, ignore_index
        )
    # the confusion matrix's validation is the stat scores' (called directly: one Python call less per update)
    invalid = _multiclass_stat_scores_tensor_validation(
        preds, target, num_classes, "global", ignore_index, metric=metric
    )
    if not preds.is_floating_point():
        _raise_not_float(preds)
    return invalid


def _hinge(margin: Tensor, squared: bool) -> Tensor:
    measures = torch.clamp(1 - margin, 0)
    return measures.pow(2) if squared else measures


def _binary_hinge_measures(
    preds: Tensor, target: Tensor, squared: bool, ignore_index: int | None
) -> tuple[Tensor, Tensor | int]:
    """Stock's ``_binary_confusion_matrix_format`` + ``_binary_hinge_loss_update``, with fixed shapes."""
    preds, target = preds.flatten(), target.flatten()
    kept = None if ignore_index is None else target != ignore_index
    preds = normalize_logits_of_kept(preds, "sigmoid", kept)
    measures = _hinge(torch.where(target.bool(), preds, -preds), squared)
    if kept is not None:
        measures = measures.masked_fill(~kept, 0)
    # stock's ``tensor(target.shape[0])`` after its boolean mask: counted on the device, or known on the host
    return measures.sum(dim=0), target.shape[0] if kept is None else kept.sum()


def _multiclass_hinge_measures(
    preds: Tensor, target: Tensor, squared: bool, mode: str, ignore_index: int | None, labels_checked: bool = False
) -> tuple[Tensor, Tensor | int]:
    """Stock's ``_multiclass_confusion_matrix_format`` + ``_multiclass_hinge_loss_update``, with fixed shapes.

    Only the entries that are neither ignored nor outside the classes count (see the module docstring);
    ``labels_checked``: the update validates, so a batch with a target outside the classes is left out whole.
    """
    preds = torch.movedim(preds, 1, -1).reshape(-1, preds.shape[1])
    target = target.flatten()
    classes = max(2, preds.shape[1])  # stock's one-hot width
    clamped = target.clamp(0, classes - 1)
    if labels_checked and ignore_index is None and preds.shape[1] == classes:
        return _validated_hinge_measures(preds, clamped, squared, mode), target.shape[0]
    kept = clamped == target  # a class of the one-hot: stock's one-hot fails on anything else
    if ignore_index is not None:
        kept &= target != ignore_index
    preds = normalize_logits_of_kept(preds, "softmax", kept.unsqueeze(1))
    onehot = target.unsqueeze(1) == torch.arange(classes, device=target.device)
    if mode == "crammer-singer":
        own = preds.gather(1, clamped.unsqueeze(1)).squeeze(1)  # any class for entries not kept: masked below
        margin = own - preds.masked_fill(onehot, -torch.inf).max(dim=1).values
        measures = _hinge(margin, squared).masked_fill(~kept, 0)
    else:
        measures = _hinge(torch.where(onehot, preds, -preds), squared).masked_fill(~kept.unsqueeze(1), 0)
    return measures.sum(dim=0), kept.sum()


def _validated_hinge_measures(preds: Tensor, target: Tensor, squared: bool, mode: str) -> Tensor:
    """The summed measures of a validated update without ``ignore_index`` (device path): every entry counts.

    A target outside the classes makes the batch invalid, and the update leaves it out whole: nothing needs masking
    per entry, the logits test runs on every entry (as stock's on a valid batch), and ``target`` (clamped to the
    classes) only places the true class: a ``scatter`` of ``-inf`` (crammer-singer) or of the true scores into the
    negated ones (one-vs-all) instead of a one-hot and a ``where``.
    """
    preds = normalize_logits_if_needed(preds, "softmax")
    index = target.unsqueeze(1)
    own = preds.gather(1, index)
    if mode == "crammer-singer":
        margin = own.squeeze(1) - preds.scatter(1, index, -torch.inf).max(dim=1).values
        return _hinge(margin, squared).sum(dim=0)
    return _hinge(preds.neg().scatter_(1, index, own), squared).sum(dim=0)


def _add_to_state(self: Any, invalid: Tensor | None, measures: Tensor, total: Tensor | int) -> None:
    if invalid is not None and not isinstance(total, Tensor):
        # a count known on the host enters as a scalar where the batch is valid: no fill of it, and no multi-tensor
        # add of a float and an int state (mixed dtypes take CUDA's slow route: one kernel each anyway)
        add_to_states(self, ("measures",), _without_invalid(invalid, measures))
        add_to_state_if(self, "total", total, invalid.logical_not())
    else:
        add_to_states(self, ("measures", "total"), _without_invalid(invalid, measures, total))
    _deferred.sweep(self)


_binary_init = replaces(
    f"{_MODULE}.BinaryHingeLoss.__init__",
    params=("self", "squared", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.BinaryHingeLoss.__init__", __name__))
_multiclass_init = replaces(
    f"{_MODULE}.MulticlassHingeLoss.__init__",
    params=("self", "num_classes", "squared", "multiclass_mode", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.MulticlassHingeLoss.__init__", __name__))


@replaces(f"{_MODULE}.BinaryHingeLoss.update", params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    invalid = None
    if self.validate_args:
        invalid = _binary_hinge_loss_tensor_validation(preds, target, self.ignore_index, metric=self)
    _add_to_state(self, invalid, *_binary_hinge_measures(preds, target, self.squared, self.ignore_index))


@replaces(f"{_MODULE}.MulticlassHingeLoss.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    invalid = None
    if self.validate_args:
        invalid = _multiclass_hinge_loss_tensor_validation(
            preds, target, self.num_classes, self.ignore_index, metric=self
        )
    measures = _multiclass_hinge_measures(
        preds, target, self.squared, self.multiclass_mode, self.ignore_index, labels_checked=self.validate_args
    )
    _add_to_state(self, invalid, *measures)
