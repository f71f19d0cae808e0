"""Sync-free ``torchmetrics.classification.calibration_error``: BinaryCalibrationError, MulticlassCalibrationError.

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
binary ``validate_args``: the binary confusion       its device flag, a deferred check of the metric (raised at
matrix's ``torch.unique`` + ``if ...:``              once on CPU, reported at an eager point on an accelerator;
                                                     the list state takes the batch as it is, as the unbinned
                                                     PR curves' do)
``ignore_index``: ``preds[target != ii]`` (binary,   ignored entries stay in the list state (binary: their target
multiclass)                                          still ``ignore_index``; multiclass: accuracy NaN, which no
                                                     comparison gives) and weigh 0 in ``compute``; the logits test
                                                     looks at the kept entries only, as stock
``compute`` with ``norm="l2"``: ``torch.sqrt(ce)     ``torch.where(ce > 0, sqrt(ce), 0)``
if ce > 0 else torch.tensor(0)``
==================================================  ===========================================================

One implementation on every device. The binning is stock's (``bucketize`` + ``scatter_add_``); an ignored entry adds
0 to every bin, which changes no float sum: the values are stock's to the bit.

Deliberate deviations from stock:

* ``norm="l2"`` with a zero error returns a float 0 on the metric's device (stock: ``torch.tensor(0)``, int64 on the
  CPU, whatever the metric's device and dtype);
* with ``ignore_index`` the list states keep the ignored entries (see above): ``metric_state`` shows them, and a
  state of ``n`` entries holds the ignored ones too.

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.classification.calibration_error import (
    _binning_bucketize,
    _multiclass_calibration_error_tensor_validation,
)
from torchmetrics.functional.classification.confusion_matrix import _binary_confusion_matrix_format
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree.classification.hinge import _binary_hinge_loss_tensor_validation
from torchmetrics_syncfree.classification.ranking import _constant
from torchmetrics_syncfree.classification.stat_scores import normalize_logits_of_kept

_FUNCTIONAL = "torchmetrics.functional.classification.calibration_error"
_MODULE = "torchmetrics.classification.calibration_error"
_NORMS = ("l1", "l2", "max")


@replaces(f"{_FUNCTIONAL}._binary_calibration_error_tensor_validation", params=("preds", "target", "ignore_index"))
def _binary_calibration_error_tensor_validation(
    preds: Tensor, target: Tensor, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._binary_calibration_error_tensor_validation")(preds, target, ignore_index)
    # the hinge loss's checks are the same: the binary confusion matrix's, then scores (stock's message)
    return _binary_hinge_loss_tensor_validation(preds, target, ignore_index, metric=metric)


_binary_init = replaces(
    f"{_MODULE}.BinaryCalibrationError.__init__",
    params=("self", "n_bins", "norm", "ignore_index", "validate_args", "kwargs"),
)(_deferred.checked_init(f"{_MODULE}.BinaryCalibrationError.__init__", __name__))


@replaces(f"{_MODULE}.BinaryCalibrationError.update", params=("self", "preds", "target"), kind="metric_method")
def _binary_update(self: Any, preds: Tensor, target: Tensor) -> None:
    if self.validate_args:
        # an invalid batch enters the list state as it is (which entries are bad is not known on the device path);
        # its error is raised at the next eager point, by compute() at the latest
        _binary_calibration_error_tensor_validation(preds, target, self.ignore_index, metric=self)
    if self.ignore_index is not None:  # kept in the state: removing them is a data-dependent shape
        preds, target = preds.flatten(), target.flatten()
        if preds.is_floating_point():
            preds = normalize_logits_of_kept(preds, "sigmoid", target != self.ignore_index)
    else:
        preds, target = _binary_confusion_matrix_format(
            preds, target, threshold=0.0, ignore_index=self.ignore_index, convert_to_labels=False
        )
    self.confidences.append(preds)
    self.accuracies.append(target)
    _deferred.sweep(self)


@replaces(f"{_MODULE}.MulticlassCalibrationError.update", params=("self", "preds", "target"), kind="metric_method")
def _multiclass_update(self: Any, preds: Tensor, target: Tensor) -> None:
    if self.ignore_index is None:  # nothing to remove: stock's update reads nothing
        stock(f"{_MODULE}.MulticlassCalibrationError.update")(self, preds, target)
        return
    if self.validate_args:  # stock's (no value is read for score preds; label preds fail its float check)
        _multiclass_calibration_error_tensor_validation(preds, target, self.num_classes, self.ignore_index)
    preds, target = torch.movedim(preds, 1, -1).reshape(-1, preds.shape[1]), target.flatten()
    kept = target != self.ignore_index
    confidences, predictions = normalize_logits_of_kept(preds, "softmax", kept.unsqueeze(1)).max(dim=1)
    accuracies = predictions.eq(target).float()
    accuracies = torch.where(kept, accuracies, _constant(torch.nan, accuracies))
    self.confidences.append(confidences.float())
    self.accuracies.append(accuracies)


def _kept(self: Any, accuracies: Tensor) -> Tensor | None:
    """The entries of the list state that count: all (``None``) without ``ignore_index``."""
    if self.ignore_index is None:
        return None
    if accuracies.is_floating_point() and type(self).__name__.startswith("Multiclass"):
        return ~accuracies.isnan()
    return accuracies != self.ignore_index


def _weighted_bins(confidences: Tensor, accuracies: Tensor, kept: Tensor, bins: Tensor) -> tuple[Tensor, ...]:
    """Stock's ``_binning_bucketize`` of the ``kept`` entries, with fixed shapes.

    The other entries are summed into a sink bin past the last one, which is dropped (they may hold NaN accuracies and
    confidences outside [0, 1]): every bin sums stock's terms in stock's order. The count, confidence and accuracy
    sums are one ``scatter_add_`` into three rows.
    """
    dtype, size = confidences.dtype, len(bins)
    indices = (torch.bucketize(confidences, bins, right=True) - 1).clamp_(0, size - 1)
    indices = torch.where(kept, indices, size)
    values = torch.stack([torch.ones_like(confidences), confidences, accuracies.to(dtype)])
    sums = torch.zeros(3, size + 1, dtype=dtype, device=confidences.device)
    count_bin, conf_sum, acc_sum = sums.scatter_add_(1, indices.expand(3, -1), values)[:, :size].unbind()
    conf_bin = torch.nan_to_num(conf_sum / count_bin)
    acc_bin = torch.nan_to_num(acc_sum / count_bin)
    return acc_bin, conf_bin, count_bin / count_bin.sum()


def _calibration_error(confidences: Tensor, accuracies: Tensor, kept: Tensor | None, n_bins: int, norm: str) -> Tensor:
    """Stock's ``_ce_compute`` with fixed shapes (no ``debias``: the metrics never pass it)."""
    if norm not in _NORMS:
        raise ValueError(f"Argument `norm` is expected to be one of 'l1', 'l2', 'max' but got {norm}")
    bins = torch.linspace(0, 1, n_bins + 1, dtype=confidences.dtype, device=confidences.device)
    with torch.no_grad():
        if kept is None:
            acc_bin, conf_bin, prop_bin = _binning_bucketize(confidences, accuracies, bins)
        else:
            acc_bin, conf_bin, prop_bin = _weighted_bins(confidences, accuracies, kept, bins)
    if norm == "l1":
        return torch.sum(torch.abs(acc_bin - conf_bin) * prop_bin)
    if norm == "max":
        return torch.max(torch.abs(acc_bin - conf_bin))
    ce = torch.sum(torch.pow(acc_bin - conf_bin, 2) * prop_bin)
    return torch.where(ce > 0, torch.sqrt(ce), torch.zeros_like(ce))


@replaces(f"{_MODULE}.BinaryCalibrationError.compute", params=("self",), kind="metric_method")
@replaces(f"{_MODULE}.MulticlassCalibrationError.compute", params=("self",), kind="metric_method")
def _compute(self: Any) -> Tensor:
    """Stock's computation with fixed shapes, the ignored entries weighted 0."""
    confidences, accuracies = dim_zero_cat(self.confidences), dim_zero_cat(self.accuracies)
    return _calibration_error(confidences, accuracies, _kept(self, accuracies), self.n_bins, self.norm)
