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
> 0]`` (boolean masks) for the averages              category counts, as stock's mean of nothing)
==================================================  ===========================================================

The update is one implementation on every device (on a CPU 10-20x faster than stock's loops: one thread, 2 x 32 x 32
to 8 x 128 x 128 points, stock vs patched updates); where reads are free an unknown category raises at once with
stock's text, before the state changes (on an accelerator the deferred check's text, which cannot name the values).
The segments, intersections and IoUs are stock's (the same integer areas, the same int64 division); the IoUs are
summed per sample and category in stock's order (the pairs sorted as ``unique`` sorts them) and the samples in stock's
order (a cumulative sum): stock's float64 sums to the bit on CPU; on CUDA the atomic ``scatter_add_`` may add in
another order (float64 last bits). The counts are exact. The compute is one implementation too: its averages may
differ from stock's mean in the last bit (another summation order; 730 of 6040 random cases on a CPU, relative
1e-7 in float32). Input validation (``_validate_inputs``: types and shapes) raises at once, as stock. The functional
``panoptic_quality``/``modified_panoptic_quality`` (no metric to report an unknown category through) stay stock's.
Memory: the batch is counted in passes of at most :data:`POINTS_PER_PASS` points (one sample at least); the
temporaries alive at once are about 87 bytes per point of a pass (int64 inputs): at most about 6 MB for batches of
small images, below stock's for large ones (stock's are per sample, 96-320 bytes per point of a sample).

"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.detection._panoptic_quality_common import _prepocess_inputs, _validate_inputs

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces

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


#: Points counted in one pass. A batch of larger inputs is counted a few samples (at least one) at a time, so that the
#: update's temporaries (a few dozen tensors of the pass's points at once) stay near stock's, which counts one sample
#: at a time: in one pass, 8 x 512 x 1024 points would hold about a gigabyte.
POINTS_PER_PASS = 2**16


def _segments(category: Tensor, instance: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per point its segment, numbered over the batch in the lexicographic order of ``(sample, category, instance)``.

    Returns:
        the segment of each ``(B, P)`` point (``b * P + k``), each segment's area and category (``B * P`` slots; a
        slot without a segment has area 0).

    """
    batch, points = category.shape
    by_instance = instance.argsort(dim=1, stable=True)
    order = by_instance.gather(1, category.gather(1, by_instance).argsort(dim=1, stable=True))
    del by_instance  # (here and below: each temporary is dropped once used, so that few are alive at once)
    sorted_category, sorted_instance = category.gather(1, order), instance.gather(1, order)
    new = torch.ones_like(sorted_category, dtype=torch.bool)
    new[:, 1:] = (sorted_category[:, 1:] != sorted_category[:, :-1]) | (
        sorted_instance[:, 1:] != sorted_instance[:, :-1]
    )
    del sorted_category, sorted_instance
    offsets = torch.arange(batch, device=category.device).unsqueeze(1) * points
    numbered = new.cumsum(dim=1).sub_(1).add_(offsets)
    segment = torch.empty_like(numbered).scatter_(1, order, numbered).flatten()
    area = _sum_per(segment, None, batch * points)
    segment_category = torch.zeros(batch * points, dtype=category.dtype, device=category.device)
    segment_category.scatter_(0, segment, category.flatten())
    return segment, area, segment_category


def _continuous_ids(metric: Any, category: Tensor) -> Tensor:
    """Each category's continuous id (``-1``: not a thing nor a stuff)."""
    out = torch.full_like(category, -1, dtype=torch.int64)
    for category_id, continuous_id in metric.cat_id_to_continuous_id.items():
        out = torch.where(category == category_id, continuous_id, out)
    return out


def _sum_per(index: Tensor, keep: Tensor | None, slots: int, values: Tensor | None = None) -> Tensor:
    """``values`` summed per ``index``, in the order of the entries, only where ``keep`` if given.

    ``values`` defaults to ones: a count, int32 (a pass has far fewer than 2**31 points), half the memory of int64.
    The entries not kept go to a dropped extra slot.
    """
    if values is None:
        values = torch.ones((), dtype=torch.int32, device=index.device).expand(index.shape)
    out = torch.zeros(slots + (keep is not None), dtype=values.dtype, device=index.device)
    out.scatter_add_(0, index if keep is None else torch.where(keep, index, slots), values)
    return out[:slots]


def _side(metric: Any, inputs: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Each point's segment and whether it is void, each segment's area and category; whether a category is unknown."""
    category, instance, unknown = _preprocess(metric, inputs)
    segment, area, segment_category = _segments(category, instance)
    return segment, area, segment_category, category.flatten() == metric.void_color[0], unknown.any()


def _pass_counts(metric: Any, preds: Tensor, target: Tensor, points: int, modified: set[int]) -> tuple[Tensor, ...]:
    """IoU sums, true positives, false positives and false negatives per sample and category of a pass.

    Also whether ``preds`` holds an unknown category. Areas and counts are int32, as :func:`_sum_per` counts: the
    IoU's division casts them to float32, as it casts stock's int64 areas, so the IoUs are stock's.
    """
    pred_segment, pred_area, pred_segment_category, pred_void, unknown = _side(metric, preds)
    target_segment, target_area, target_segment_category, target_void, _ = _side(metric, target)
    slots, num_categories = pred_area.numel(), len(metric.cat_id_to_continuous_id)
    cells, void_category = preds.shape[0] * num_categories, metric.void_color[0]
    # per segment: its points on the other side's void
    pred_on_void = _sum_per(pred_segment, None, slots, target_void.int())
    void_on_target = _sum_per(target_segment, None, slots, pred_void.int())
    del pred_void, target_void
    # the intersections: unique (pred segment, target segment) pairs, in stock's (unique's) order
    pair_key = (pred_segment * slots + target_segment).sort()[0]
    del pred_segment, target_segment
    new = torch.ones_like(pair_key, dtype=torch.bool)
    new[1:] = pair_key[1:] != pair_key[:-1]
    pair = new.cumsum(0).sub_(1)
    del new
    intersection = _sum_per(pair, None, slots)
    first_key = torch.zeros_like(pair_key).scatter_(0, pair, pair_key)  # equal keys: any write is the same
    del pair, pair_key
    pred_of_pair, target_of_pair = first_key // slots, first_key % slots
    del first_key
    category = target_segment_category[target_of_pair]
    eligible = (intersection > 0) & (category != void_category) & (pred_segment_category[pred_of_pair] == category)
    union = pred_area[pred_of_pair] - pred_on_void[pred_of_pair] + target_area[target_of_pair]
    union -= void_on_target[target_of_pair] + intersection
    iou = intersection / union
    del union, intersection
    is_modified = _isin(category, modified)
    matched = eligible & ~is_modified & (iou > 0.5)
    summed = matched | (eligible & is_modified & (iou > 0))
    del eligible, is_modified
    # a pair lies in its segments' sample
    cell = (pred_of_pair // points) * num_categories + _continuous_ids(metric, category)
    del category
    iou_sum = _sum_per(cell, summed, cells, iou.double())
    del iou, summed
    true_positives = _sum_per(cell, matched, cells)
    del cell
    # unmatched segments: false negatives (targets) and false positives (preds) unless mostly void on the other side
    target_matched = _sum_per(target_of_pair, matched, slots) > 0
    pred_matched = _sum_per(pred_of_pair, matched, slots) > 0
    del matched, target_of_pair, pred_of_pair
    segment_sample = torch.arange(slots, device=pred_area.device) // points * num_categories
    target_cell = segment_sample + _continuous_ids(metric, target_segment_category)
    target_counted = (target_area > 0) & (target_segment_category != void_category)
    target_counted &= ~_isin(target_segment_category, modified) & ~target_matched
    target_counted &= void_on_target / target_area <= 0.5
    false_negatives = _sum_per(target_cell, target_counted, cells)
    del target_counted, target_matched, void_on_target
    pred_continuous = _continuous_ids(metric, pred_segment_category)
    pred_counted = (pred_area > 0) & (pred_segment_category != void_category)
    pred_counted &= ~_isin(pred_segment_category, modified) & (pred_continuous >= 0) & ~pred_matched
    pred_counted &= pred_on_void / pred_area <= 0.5
    false_positives = _sum_per(segment_sample + pred_continuous, pred_counted, cells)
    if modified:  # every target segment of a modified stuff counts as a true positive
        stuff_segments = (target_area > 0) & _isin(target_segment_category, modified)
        true_positives = true_positives + _sum_per(target_cell, stuff_segments, cells)
    counts = (iou_sum, true_positives, false_positives, false_negatives)
    return (*(per_cell.view(-1, num_categories) for per_cell in counts), unknown)


def _panoptic_update(metric: Any, preds: Tensor, target: Tensor, modified: set[int]) -> tuple[Tensor, ...]:
    """Stock's ``_panoptic_quality_update`` of a batch with fixed shapes (see the module docstring).

    Counted in passes of at most :data:`POINTS_PER_PASS` points (one sample at least): one pass where the batch fits.
    """
    batch, points = preds.shape[0], math.prod(preds.shape[1:-1])
    step = max(1, POINTS_PER_PASS // max(points, 1))
    starts = range(0, batch, step) if batch > step else (0,)
    passes = [_pass_counts(metric, preds[s : s + step], target[s : s + step], points, modified) for s in starts]
    if len(passes) == 1:
        iou_sum, true_positives, false_positives, false_negatives, unknown = passes[0]
    else:
        *tables, unknowns = zip(*passes)
        iou_sum, true_positives, false_positives, false_negatives = (torch.cat(per_pass) for per_pass in tables)
        unknown = torch.stack(unknowns).any()
    # the IoUs summed over the samples in order, as stock sums them (an empty batch: zeros, as stock's)
    iou_sum = iou_sum.cumsum(0)[-1] if batch else iou_sum.sum(0)
    true_positives, false_positives, false_negatives = (
        counts.sum(0).to(torch.int32) for counts in (true_positives, false_positives, false_negatives)
    )
    return iou_sum, true_positives, false_positives, false_negatives, unknown


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
    """Stock's qualities, the averages over the counted categories without boolean masks (on every device).

    The masked sums add the counted categories in another order than stock's ``mean(x[mask])`` (its vectorized sum
    groups them by position): the averages may differ in the last bit (730 of 6040 random cases on a CPU).
    """
    sq = torch.where(true_positives > 0.0, iou_sum / true_positives, 0.0)
    denominator = true_positives + 0.5 * false_positives + 0.5 * false_negatives
    rq = torch.where(denominator > 0.0, true_positives / denominator, 0.0)
    pq = sq * rq
    counted = denominator > 0
    count = counted.sum()

    def mean(values: Tensor) -> Tensor:
        return torch.where(counted, values, 0).sum() / count

    return pq, sq, rq, mean(pq), mean(sq), mean(rq)
