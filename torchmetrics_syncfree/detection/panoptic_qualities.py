"""Sync-free ``torchmetrics.detection.panoptic_qualities``: PanopticQuality and ModifiedPanopticQuality.

==================================================  ===========================================================
stock                                                sync-free
==================================================  ===========================================================
``_prepocess_inputs``: boolean mask writes of the    ``torch.where`` over every point; an unknown category in
stuffs' instances and the unknown categories,        ``preds`` is a deferred ``ValueError`` (stock's type; the
``if not torch.all(...)`` (unknown categories)       text cannot name the values), the batch left out
per sample: ``torch.unique(dim=0)`` of the           one batched pass with fixed shapes (points per sample):
segments and of their intersections (data-sized),    segments numbered by a stable lexicographic sort of
``.tolist()`` into dicts, a Python loop over every   ``(category, instance)`` per sample and a cumulative sum,
intersection with ``if iou > 0.5`` and the false     areas and intersections by ``scatter_add_``, the pairs'
negatives' and positives' ``if ... <= 0.5``          IoU, matches, false negatives and positives as masks,
(hundreds of reads per update)                       counted per category with ``scatter_add_``
``_panoptic_quality_compute``: ``pq[denominator      ``torch.where`` sums divided by the count (``NaN`` where no
> 0]`` (boolean masks) for the averages              category counts, as stock's mean of nothing;
                                                     where reads are free stock's compute)
==================================================  ===========================================================

The update is one implementation on every device (on a CPU 10-20x faster than stock's loops: one thread, 2 x 32 x 32
to 8 x 128 x 128 points, stock vs patched updates); where reads are free an unknown category raises at once with
stock's text, before the state changes (on an accelerator the deferred check's text, which cannot name the values).
The segments, intersections and IoUs are stock's (the same integer areas, the same int64 division); the IoUs are
summed per sample and category in stock's order (the pairs sorted as ``unique`` sorts them) and the samples in stock's
order (a cumulative sum): stock's float64 sums to the bit on CPU; on CUDA the atomic ``scatter_add_`` may add in
another order (float64 last bits). The counts are exact. On the device path the averages of ``compute()`` may differ
from stock's mean in the last bits (another summation order); where reads are free ``compute`` stays stock's for
that reason. Input validation (``_validate_inputs``: types and shapes) raises at once, as stock. The functional
``panoptic_quality``/``modified_panoptic_quality`` (no metric to report an unknown category through) stay stock's.
Memory: a few tensors of ``batch * points`` elements (stock: per sample).

"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.detection._panoptic_quality_common import _prepocess_inputs, _validate_inputs

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_COMMON = "torchmetrics.functional.detection._panoptic_quality_common"
_MODULE = "torchmetrics.detection.panoptic_qualities"

UNKNOWN_CATEGORY = _deferred.Check(
    "detection.panoptic-unknown-category",
    "Unknown categories found: an update's `preds` holds a category that is neither in `things` nor in `stuffs`"
    " (and `allow_unknown_preds_category` is False); that batch was left out of the state.",
    ValueError,
)


def _isin(values: Tensor, ids: Any) -> Tensor:
    """Whether each value is one of the (few, known) ``ids``: comparisons, no host-to-device copy."""
    found = torch.zeros_like(values, dtype=torch.bool)
    for value in sorted(ids):
        found |= values == value
    return found


def _preprocess(metric: Any, inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Stock's ``_prepocess_inputs`` with fixed shapes: (category, instance) of ``(B, P)`` and the unknown mask."""
    flat = torch.flatten(inputs.detach(), 1, -2)
    category, instance = flat[..., 0], flat[..., 1]
    stuff = _isin(category, metric.stuffs)
    known = stuff | _isin(category, metric.things)
    void_category, void_instance = metric.void_color
    instance = torch.where(stuff, 0, instance)
    instance = torch.where(known, instance, void_instance)
    category = torch.where(known, category, void_category)
    return category, instance, ~known


def _segments(category: Tensor, instance: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per point its segment, numbered over the batch in the lexicographic order of ``(sample, category, instance)``.

    Returns:
        the segment of each ``(B, P)`` point (``b * P + k``), each segment's area and category (``B * P`` slots; a
        slot without a segment has area 0).

    """
    batch, points = category.shape
    by_instance = instance.argsort(dim=1, stable=True)
    order = by_instance.gather(1, category.gather(1, by_instance).argsort(dim=1, stable=True))
    sorted_category, sorted_instance = category.gather(1, order), instance.gather(1, order)
    new = torch.ones_like(sorted_category, dtype=torch.bool)
    new[:, 1:] = (sorted_category[:, 1:] != sorted_category[:, :-1]) | (
        sorted_instance[:, 1:] != sorted_instance[:, :-1]
    )
    offsets = torch.arange(batch, device=category.device).unsqueeze(1) * points
    numbered = new.cumsum(dim=1) - 1 + offsets
    segment = torch.empty_like(numbered).scatter_(1, order, numbered).flatten()
    area = torch.zeros(batch * points, dtype=torch.int64, device=category.device)
    area.scatter_add_(0, segment, torch.ones_like(segment))
    segment_category = torch.zeros(batch * points, dtype=category.dtype, device=category.device)
    segment_category.scatter_(0, segment, category.flatten())
    return segment, area, segment_category


def _continuous_ids(metric: Any, category: Tensor) -> Tensor:
    """Each category's continuous id (``-1``: not a thing nor a stuff)."""
    out = torch.full_like(category, -1, dtype=torch.int64)
    for category_id, continuous_id in metric.cat_id_to_continuous_id.items():
        out = torch.where(category == category_id, continuous_id, out)
    return out


def _count(index: Tensor, keep: Tensor, values: Tensor, slots: int) -> Tensor:
    """``values`` summed per ``index`` where ``keep`` (the others into a dropped extra slot)."""
    out = torch.zeros(slots + 1, dtype=values.dtype, device=values.device)
    out.scatter_add_(0, torch.where(keep, index, slots), torch.where(keep, values, 0))
    return out[:slots]


def _panoptic_update(metric: Any, preds: Tensor, target: Tensor, modified: set[int]) -> tuple[Tensor, ...]:
    """Stock's ``_panoptic_quality_update`` of a batch with fixed shapes (see the module docstring)."""
    pred_category, pred_instance, unknown = _preprocess(metric, preds)
    target_category, target_instance, _ = _preprocess(metric, target)
    batch, points = pred_category.shape
    slots, num_categories = batch * points, len(metric.cat_id_to_continuous_id)
    void_category = metric.void_color[0]
    pred_segment, pred_area, pred_segment_category = _segments(pred_category, pred_instance)
    target_segment, target_area, target_segment_category = _segments(target_category, target_instance)
    pred_void = pred_category.flatten() == void_category
    target_void = target_category.flatten() == void_category
    # per segment: its points on the other side's void
    pred_on_void = torch.zeros_like(pred_area).scatter_add_(0, pred_segment, target_void.long())
    void_on_target = torch.zeros_like(target_area).scatter_add_(0, target_segment, pred_void.long())
    # the intersections: unique (pred segment, target segment) pairs, in stock's (unique's) order
    pair_key, _ = (pred_segment * slots + target_segment).sort()
    new = torch.ones_like(pair_key, dtype=torch.bool)
    new[1:] = pair_key[1:] != pair_key[:-1]
    pair = new.cumsum(0) - 1
    intersection = torch.zeros_like(pred_area).scatter_add_(0, pair, torch.ones_like(pair))
    first_key = torch.zeros_like(pair_key).scatter_(0, pair, pair_key)  # equal keys: any write is the same
    pred_of_pair, target_of_pair = first_key // slots, first_key % slots
    category = target_segment_category[target_of_pair]
    eligible = (intersection > 0) & (category != void_category) & (pred_segment_category[pred_of_pair] == category)
    union = (
        pred_area[pred_of_pair]
        - pred_on_void[pred_of_pair]
        + target_area[target_of_pair]
        - void_on_target[target_of_pair]
        - intersection
    )
    iou = intersection / union
    is_modified = _isin(category, modified)
    matched = eligible & ~is_modified & (iou > 0.5)
    summed = matched | (eligible & is_modified & (iou > 0))
    continuous = _continuous_ids(metric, category)
    sample = pred_of_pair // points  # a pair lies in its segments' sample
    per_sample = sample * num_categories + continuous
    cells = batch * num_categories
    iou_sum = _count(per_sample, summed, iou.double(), cells).view(batch, num_categories).cumsum(0)[-1]
    true_positives = _count(per_sample, matched, torch.ones_like(pair), cells)
    # unmatched segments: false negatives (targets) and false positives (preds) unless mostly void on the other side
    target_matched = torch.zeros_like(target_area).scatter_add_(0, target_of_pair, matched.long()) > 0
    pred_matched = torch.zeros_like(pred_area).scatter_add_(0, pred_of_pair, matched.long()) > 0
    segment_sample = torch.arange(slots, device=pair.device) // points
    target_continuous = _continuous_ids(metric, target_segment_category)
    pred_continuous = _continuous_ids(metric, pred_segment_category)
    target_counted = (target_area > 0) & (target_segment_category != void_category)
    target_counted &= ~_isin(target_segment_category, modified)
    false_negatives = _count(
        segment_sample * num_categories + target_continuous,
        target_counted & ~target_matched & (void_on_target / target_area <= 0.5),
        torch.ones_like(pair),
        cells,
    )
    pred_counted = (pred_area > 0) & (pred_segment_category != void_category)
    pred_counted &= ~_isin(pred_segment_category, modified) & (pred_continuous >= 0)
    false_positives = _count(
        segment_sample * num_categories + pred_continuous,
        pred_counted & ~pred_matched & (pred_on_void / pred_area <= 0.5),
        torch.ones_like(pair),
        cells,
    )
    if modified:  # every target segment of a modified stuff counts as a true positive
        stuff_segments = (target_area > 0) & _isin(target_segment_category, modified)
        true_positives = true_positives + _count(
            segment_sample * num_categories + target_continuous, stuff_segments, torch.ones_like(pair), cells
        )

    def total(counts: Tensor) -> Tensor:
        return counts.view(batch, num_categories).sum(0).to(torch.int32)

    return iou_sum, total(true_positives), total(false_positives), total(false_negatives), unknown.any()


def _declare_update(name: str, modified_stuffs: bool) -> None:
    spec = f"{_MODULE}.{name}.update"

    @replaces(spec, params=("self", "preds", "target"), kind="metric_method")
    def update(self: Any, preds: Tensor, target: Tensor) -> None:
        _validate_inputs(preds, target)  # types and shapes (host information): stock's errors at once
        iou_sum, true_positives, false_positives, false_negatives, unknown = _panoptic_update(
            self, preds, target, set(self.stuffs) if modified_stuffs else set()
        )
        if self.allow_unknown_preds_category:
            left_out = None
        else:
            # where reads are free stock's preprocessing raises its error, which names the unknown points
            at_once = functools.partial(_prepocess_inputs, self.things, self.stuffs, preds, self.void_color, False)
            _deferred.record(self, UNKNOWN_CATEGORY, unknown, at_once)
            left_out = unknown
        for state, value in (
            ("iou_sum", iou_sum),
            ("true_positives", true_positives),
            ("false_positives", false_positives),
            ("false_negatives", false_negatives),
        ):
            getattr(self, state).add_(value if left_out is None else value.masked_fill(left_out, 0))
        _deferred.sweep(self)

    update.__name__ = update.__qualname__ = f"_{name}_update"
    update.__doc__ = f"Stock's ``{name}.update`` as one batched pass with fixed shapes."
    globals()[update.__name__] = update

    init = f"{_MODULE}.{name}.__init__"
    params = ("self", "things", "stuffs", "allow_unknown_preds_category")
    if name == "PanopticQuality":
        params += ("return_sq_and_rq", "return_per_class")
    replaces(init, params=(*params, "kwargs"))(
        _deferred.checked_init(init, __name__, kinds=lambda metric: (UNKNOWN_CATEGORY,))
    )


_declare_update("PanopticQuality", modified_stuffs=False)
_declare_update("ModifiedPanopticQuality", modified_stuffs=True)


@replaces(
    f"{_COMMON}._panoptic_quality_compute",
    params=("iou_sum", "true_positives", "false_positives", "false_negatives"),
    everywhere=True,
)
def _panoptic_quality_compute(
    iou_sum: Tensor, true_positives: Tensor, false_positives: Tensor, false_negatives: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Stock's qualities; on the device path the averages over the counted categories without boolean masks."""
    if _deferred.reads_are_free(iou_sum):
        return stock(f"{_COMMON}._panoptic_quality_compute")(iou_sum, true_positives, false_positives, false_negatives)
    sq = torch.where(true_positives > 0.0, iou_sum / true_positives, 0.0)
    denominator = true_positives + 0.5 * false_positives + 0.5 * false_negatives
    rq = torch.where(denominator > 0.0, true_positives / denominator, 0.0)
    pq = sq * rq
    counted = denominator > 0
    count = counted.sum()

    def mean(values: Tensor) -> Tensor:
        return torch.where(counted, values, 0).sum() / count

    return pq, sq, rq, mean(pq), mean(sq), mean(rq)
