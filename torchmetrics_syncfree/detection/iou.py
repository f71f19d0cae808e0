"""Sync-free ``torchmetrics.detection.iou`` (and its variants ``giou``, ``diou``, ``ciou``): the box IoU metrics.

IntersectionOverUnion, GeneralizedIntersectionOverUnion, DistanceIntersectionOverUnion and
CompleteIntersectionOverUnion (they need ``torchvision``; the variants inherit ``update`` and ``compute``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``iou[iou < iou_threshold] = replacement_val``       ``masked_fill_`` (the same values in place)
(boolean mask write, functional ``_iou_update``,
``_giou_update``, ``_diou_update``, ``_ciou_update``)
``iou_matrix[~label_eq] = invalid`` (update)         ``masked_fill_``
compute (and ``forward``: ``full_state_update``):    one concatenation of every matrix, the valid entries summed
``mat[mat != invalid]`` and ``if torch.any(...)``    with ``torch.where`` and divided by their count; ``NaN``
per matrix, ``if torch.isnan(score)``                (nothing valid) becomes 0 with ``torch.where``: no read
``class_metrics=True``: ``unique().tolist()`` of     one read (the classes name the result's keys: a size only
the labels (two waits), per class and matrix         the data knows): the labels copied as they are, made unique
boolean masks, ``if observed.item() == 0``           on the host; per class and matrix masked sums,
                                                     ``torch.where(observed == 0, 0, ...)``
==================================================  ===========================================================

One implementation on every device (since 2026-11-29; the CPU ran stock's functions before). The update's matrices
are stock's to the bit (the same values written in place); ``compute()`` sums the valid entries in another order than
stock's mean of the concatenated valid entries: the score may differ from stock's in the last bits (relative 1e-6 in
float32), as any change of summation order; per-class values likewise. ``compute()`` is replaced on
1.7+ only (1.6's compute differs: no predicted labels among the classes, no zero for unobserved classes; it stays
stock's, with its reads). Input validation (``_input_validator``) reads host information only and raises at once, as
stock. MeanAveragePrecision is not covered: its backends (``pycocotools``, ``faster_coco_eval``) evaluate on the host
by design (``compute()`` copies the states to NumPy); its ``update`` appends the boxes (``iou_type="segm"``: each mask
is copied to the host and RLE-encoded there, by design).

"""

from __future__ import annotations

import operator
from typing import Any

import torch
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.detection.helpers import _input_validator
from torchmetrics.utilities.data import dim_zero_cat

from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.detection"
_MODULE = "torchmetrics.detection.iou"
#: 1.7 added the predicted labels to the classes of ``class_metrics`` and 0 for unobserved classes
_COMPUTE_17 = compare_version("torchmetrics", operator.ge, "1.7.0")
_PARAMS = ("preds", "target", "iou_threshold", "replacement_val")


def _pairwise(name: str, preds: Tensor, target: Tensor, iou_threshold: float | None, replacement_val: float) -> Tensor:
    """Stock's ``_<name>_update`` with the threshold's replacement written by ``masked_fill_``."""
    if preds.ndim != 2 or preds.shape[-1] != 4:
        raise ValueError(f"Expected preds to be of shape (N, 4) but got {preds.shape}")
    if target.ndim != 2 or target.shape[-1] != 4:
        raise ValueError(f"Expected target to be of shape (N, 4) but got {target.shape}")
    from torchvision import ops

    if preds.numel() == 0:  # if no boxes are predicted
        return torch.zeros(target.shape[0], target.shape[0], device=target.device, dtype=torch.float32)
    if target.numel() == 0:  # if no boxes are true
        return torch.zeros(preds.shape[0], preds.shape[0], device=preds.device, dtype=torch.float32)
    iou = getattr(ops, name)(preds, target)
    if iou_threshold is not None:
        iou.masked_fill_(iou < iou_threshold, replacement_val)
    return iou


def _declare(variant: str, box_fn: str) -> None:
    target = f"{_FUNCTIONAL}.{variant}._{variant}_update"

    @replaces(target, params=_PARAMS, everywhere=True)
    def update(preds: Tensor, target_boxes: Tensor, iou_threshold: float | None, replacement_val: float = 0) -> Tensor:
        return _pairwise(box_fn, preds, target_boxes, iou_threshold, replacement_val)

    update.__name__ = update.__qualname__ = f"_{variant}_update"
    update.__doc__ = f"Stock's ``_{variant}_update`` with the threshold applied by ``masked_fill_``."
    globals()[update.__name__] = update


for _variant, _box_fn in (
    ("iou", "box_iou"),
    ("giou", "generalized_box_iou"),
    ("diou", "distance_box_iou"),
    ("ciou", "complete_box_iou"),
):
    _declare(_variant, _box_fn)


@replaces(f"{_MODULE}.IntersectionOverUnion.update", params=("self", "preds", "target"), kind="metric_method")
def _update(self: Any, preds: list[dict[str, Tensor]], target: list[dict[str, Tensor]]) -> None:
    """Stock's update with the other labels' pairs marked invalid by ``masked_fill_``."""
    _input_validator(preds, target, ignore_score=True)  # host checks only: stock's errors before any indexing
    if not preds:
        stock(f"{_MODULE}.IntersectionOverUnion.update")(self, preds, target)
        return
    keeps_pred_labels = hasattr(self, "pred_labels")  # 1.7+
    for p_i, t_i in zip(preds, target):
        det_boxes = self._get_safe_item_values(p_i["boxes"])
        gt_boxes = self._get_safe_item_values(t_i["boxes"])
        self.groundtruth_labels.append(t_i["labels"])
        if keeps_pred_labels:
            self.pred_labels.append(p_i["labels"])
        iou_matrix = self._iou_update_fn(det_boxes, gt_boxes, self.iou_threshold, self._invalid_val)  # N x M
        if self.respect_labels:
            if det_boxes.numel() > 0 and gt_boxes.numel() > 0:
                label_eq = p_i["labels"].unsqueeze(1) == t_i["labels"].unsqueeze(0)  # N x M
            else:
                label_eq = torch.eye(iou_matrix.shape[0], dtype=torch.bool, device=iou_matrix.device)
            iou_matrix.masked_fill_(~label_eq, self._invalid_val)
        self.iou_matrix.append(iou_matrix)


def _valid_mean(matrices: list[Tensor], invalid: float) -> Tensor:
    """The mean of the entries that are not ``invalid`` (``NaN`` when there are none), with fixed shapes."""
    flat = torch.cat([mat.flatten() for mat in matrices])
    valid = flat != invalid
    return torch.where(valid, flat, 0).sum() / valid.sum()


if _COMPUTE_17:

    @replaces(f"{_MODULE}.IntersectionOverUnion.compute", params=("self",), kind="metric_method")
    def _compute(self: Any) -> dict:
        """Stock's results without reads (one, the classes, with ``class_metrics``)."""
        matrices = self.iou_matrix
        if isinstance(matrices, Tensor):  # after a DDP sync of one matrix per rank
            matrices = [matrices]
        if not matrices:
            return stock(f"{_MODULE}.IntersectionOverUnion.compute")(self)
        score = _valid_mean(matrices, self._invalid_val)
        results: dict[str, Tensor] = {f"{self._iou_type}": torch.where(torch.isnan(score), 0.0, score)}
        if self.class_metrics:
            all_labels = dim_zero_cat([dim_zero_cat(self.groundtruth_labels), dim_zero_cat(self.pred_labels)])
            # the one read (the classes name the keys): the labels copied as they are, made unique on the host
            classes = sorted(set(all_labels.tolist()))
            for cl in classes:
                masked_iou = torch.zeros_like(score)
                observed = torch.zeros_like(score)
                for mat, gt_lab in zip(matrices, self.groundtruth_labels):
                    if mat.shape[1] != gt_lab.shape[0]:  # stock's mask fails there: the same error
                        mat[:, gt_lab == cl]
                    kept = (mat != self._invalid_val) & (gt_lab == cl).unsqueeze(0)
                    masked_iou += torch.where(kept, mat, 0).sum()
                    observed += kept.sum()
                results[f"{self._iou_type}/cl_{cl}"] = torch.where(observed == 0, 0.0, masked_iou / observed)
        return results
