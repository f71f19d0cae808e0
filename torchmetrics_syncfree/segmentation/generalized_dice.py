"""Sync-free ``torchmetrics.segmentation.generalized_dice``: GeneralizedDiceScore.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``weights_flatten[infs] = 0``,                       ``masked_fill`` and ``torch.where`` over the whole (N, C)
``weights_flatten[infs] = w_max[infs]`` (boolean     weights, with stock's ``w_max`` (its
mask writes)                                         ``repeat(N, 1).T.flatten()`` layout kept as it is)
``one_hot(x, num_classes)`` of index inputs (and,    an equality with ``arange(num_classes)``, laid out as
1.8+, of the ``argmax`` of float inputs): reads      stock's; a value outside ``[0, num_classes)`` is a deferred
the values' minimum and maximum on the host on CPU   check of the metric (``RuntimeError``, as stock's CPU
(a device assert on CUDA)                            check), and that batch is left out of the state
``_safe_divide``: ``tensor(zero_division)``          the ``classification`` area's ``_safe_divide``
(1.6-1.8)                                            (``torch.full``)
==================================================  ===========================================================

The update is the fixed-shape one on every device: the sums and weights are computed by stock's ops on tensors of
stock's layout, stock's values to the bit; where reads are free (CPU) the class check is read at the end of the update
and raises before the state changes. CPU host time, paired, one thread: update 0.86-0.93x stock, forward 0.84-0.92x (the
audit catalogue at batch 32, index inputs at batch 256, three runs); bytes allocated per update of index inputs 1.13x
(the range check's temporary, of the input's size). Shape checks (``_check_same_shape``, 1.8+'s ``_check_mixed_shape``,
the rank check) read host information and raise at once, as stock. The input formats of each release are kept: 1.6/1.7
take ``"one-hot"`` inputs as they are (float probabilities included) and one-hot encode ``"index"`` inputs; 1.8+ format
through ``_segmentation_inputs_format`` (``"mixed"``; the ``argmax`` of float ``"one-hot"`` inputs), replaced here for
the metric's own calls (every other caller gets stock's).

Deliberate deviation from stock: a class value outside ``[0, num_classes)`` is reported with the project's message
(``CLASS_VALUES``) at the end of the update (on the device path later, by ``compute()``/``reset()``, when the
device's copy is late) instead of failing inside ``one_hot`` (on CUDA: a device-side assert, which ends the process);
the batch never enters the state. The functional
``generalized_dice_score`` has no metric to report through: its one-hot encoding is stock's (no host read on CUDA).

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.segmentation import utils as _utils
from torchmetrics.functional.segmentation.generalized_dice import _generalized_dice_compute
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock

_FUNCTIONAL = "torchmetrics.functional.segmentation.generalized_dice"
_UTILS = "torchmetrics.functional.segmentation.utils"
_MODULE = "torchmetrics.segmentation.generalized_dice"
#: 1.8 moved the input formatting to ``_segmentation_inputs_format`` (and added ``input_format="mixed"``)
_FORMATS_IN_UTILS = hasattr(_utils, "_segmentation_inputs_format")

#: a class value that ``one_hot`` rejects (stock: ``RuntimeError`` on CPU, a device assert on CUDA)
CLASS_VALUES = _deferred.Check(
    "segmentation.class-values",
    "Class values must be non-negative and smaller than num_classes: an update's `preds` or `target` holds a class"
    " value outside [0, num_classes); that batch was left out of the state.",
    RuntimeError,
)


def _one_hot(values: Tensor, num_classes: int, flags: list[Tensor] | None, in_range: bool = False) -> Tensor:
    """``one_hot(values, num_classes).movedim(-1, 1)``; with ``flags``: without host reads.

    The range check is appended to ``flags`` unless ``in_range`` (the values are known to be classes). Stock's dtype
    (int64) and memory layout (classes innermost), so that the sums over it run as stock's.
    """
    if flags is None or values.dtype != torch.int64:  # stock's (a non-int64 input fails there before any read)
        return torch.nn.functional.one_hot(values, num_classes=num_classes).movedim(-1, 1)
    if not in_range:
        flags.append(values.clamp(0, num_classes - 1).ne_(values).any())  # a class is what clamping leaves as is
    classes = torch.arange(num_classes, device=values.device)
    # the comparison written as int64 directly: a bool tensor cast afterwards costs another pass (1.6x the time)
    encoded = torch.empty(*values.shape, num_classes, dtype=torch.int64, device=values.device)
    return torch.eq(values.unsqueeze(-1), classes, out=encoded).movedim(-1, 1)


def _one_hot_logits(tensor: Tensor, num_classes: int, flags: list[Tensor] | None) -> Tensor:
    """1.8+'s ``_format_logits``: float inputs become the one-hot encoding of their ``argmax`` over the classes."""
    if torch.is_floating_point(tensor):
        # the argmax over at most ``num_classes`` scores is a class: nothing to check
        return _one_hot(tensor.argmax(dim=1), num_classes, flags, in_range=tensor.shape[1] <= num_classes)
    return tensor


if _FORMATS_IN_UTILS:

    @replaces(
        f"{_UTILS}._segmentation_inputs_format",
        params=("preds", "target", "include_background", "num_classes", "input_format"),
    )
    def _segmentation_inputs_format(
        preds: Tensor,
        target: Tensor,
        include_background: bool,
        num_classes: int | None = None,
        input_format: str = "one-hot",
        flags: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Stock's formatting; with ``flags`` (the metric's device path) its one-hot encodings read nothing."""
        if flags is None:
            return stock(f"{_UTILS}._segmentation_inputs_format")(
                preds, target, include_background, num_classes, input_format
            )
        if input_format == "mixed":
            _utils._check_mixed_shape(preds, target)
        else:
            _check_same_shape(preds, target)
        if input_format == "index":
            if num_classes is None:
                raise ValueError("Argument `num_classes` must be provided when `input_format='index'`.")
            preds, target = _one_hot(preds, num_classes, flags), _one_hot(target, num_classes, flags)
        elif input_format == "one-hot":
            if num_classes is None:
                num_classes = _utils._get_num_classes(preds)
            preds, target = _one_hot_logits(preds, num_classes, flags), _one_hot_logits(target, num_classes, flags)
        elif input_format == "mixed":
            if preds.dim() == target.dim() + 1:
                if num_classes is None:
                    num_classes = _utils._get_num_classes(preds)
                preds, target = _one_hot_logits(preds, num_classes, flags), _one_hot(target, num_classes, flags)
            elif preds.dim() + 1 == target.dim():
                if num_classes is None:
                    num_classes = _utils._get_num_classes(target)
                target, preds = _one_hot_logits(target, num_classes, flags), _one_hot(preds, num_classes, flags)
        return _checked_dimensions_without_background(preds, target, include_background)


def _checked_dimensions_without_background(
    preds: Tensor, target: Tensor, include_background: bool
) -> tuple[Tensor, Tensor]:
    """The end of stock's formatting on every release: the dimension check, then the background class dropped."""
    if preds.ndim < 3:
        raise ValueError(f"Expected both `preds` and `target` to have at least 3 dimensions, but got {preds.ndim}.")
    if not include_background:
        preds, target = _utils._ignore_background(preds, target)
    return preds, target


def _format_inputs(
    preds: Tensor,
    target: Tensor,
    num_classes: int,
    include_background: bool,
    input_format: str,
    flags: list[Tensor] | None,
) -> tuple[Tensor, Tensor]:
    """The formatting of the installed release; with ``flags``, its one-hot encodings read nothing (see above)."""
    if _FORMATS_IN_UTILS:
        return _segmentation_inputs_format(preds, target, include_background, num_classes, input_format, flags=flags)
    _check_same_shape(preds, target)  # 1.6/1.7: inside ``_generalized_dice_update``
    if input_format == "index":
        preds, target = _one_hot(preds, num_classes, flags), _one_hot(target, num_classes, flags)
    return _checked_dimensions_without_background(preds, target, include_background)


def _weights_without_infs(weights: Tensor) -> Tensor:
    """Stock's replacement of infinite weights (classes absent from a sample's target), with fixed shapes.

    Stock zeroes them through a flat view, takes each class's maximum over the batch, and writes
    ``w_max.repeat(N, 1).T.flatten()`` at the flat positions of the infinities (so that position ``k`` gets class
    ``k // N``'s maximum: the transposed layout is stock's, kept for parity).
    """
    infs = torch.isinf(weights)
    zeroed = weights.masked_fill(infs, 0)
    # stock's maximum sees the zeros only through a view: a weights tensor that ``flatten`` copies keeps its infs
    w_max = torch.max(zeroed if weights.is_contiguous() else weights, 0).values
    w_max = w_max.repeat(weights.shape[0], 1).T.reshape(weights.shape)
    return torch.where(infs, w_max, zeroed)


def _dice_terms(preds: Tensor, target: Tensor, weight_type: str) -> tuple[Tensor, Tensor]:
    """Stock's numerator and denominator of formatted (one-hot) inputs, without boolean masks."""
    reduce_axis = list(range(2, target.ndim))
    intersection = torch.sum(preds * target, dim=reduce_axis)
    target_sum = torch.sum(target, dim=reduce_axis)
    pred_sum = torch.sum(preds, dim=reduce_axis)
    cardinality = target_sum + pred_sum
    if weight_type == "simple":
        weights = 1.0 / target_sum
    elif weight_type == "linear":
        weights = torch.ones_like(target_sum)
    elif weight_type == "square":
        weights = 1.0 / (target_sum**2)
    else:
        raise ValueError(
            f"Expected argument `weight_type` to be one of 'simple', 'linear', 'square', but got {weight_type}."
        )
    weights = _weights_without_infs(weights)
    return 2.0 * intersection * weights, cardinality * weights


@replaces(
    f"{_FUNCTIONAL}._generalized_dice_update",
    params=("preds", "target", "num_classes", "include_background", "weight_type", "input_format"),
    everywhere=True,
)
def _generalized_dice_update(
    preds: Tensor,
    target: Tensor,
    num_classes: int,
    include_background: bool,
    weight_type: str = "square",
    input_format: str = "one-hot",
) -> tuple[Tensor, Tensor]:
    """Stock's update with the infinite weights replaced without boolean masks."""
    # no metric to report through: stock's one-hot encodings (on CUDA they read nothing either)
    preds, target = _format_inputs(preds, target, num_classes, include_background, input_format, None)
    return _dice_terms(preds, target, weight_type)


_init = replaces(
    f"{_MODULE}.GeneralizedDiceScore.__init__",
    params=(
        "self",
        "num_classes",
        "include_background",
        "per_class",
        "weight_type",
        "input_format",
        "kwargs",
    ),
)(_deferred.checked_init(f"{_MODULE}.GeneralizedDiceScore.__init__", __name__, kinds=lambda metric: (CLASS_VALUES,)))


@replaces(f"{_MODULE}.GeneralizedDiceScore.update", params=("self", "preds", "target"), kind="metric_method")
def _update(self: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's update with fixed shapes; a batch with class values outside the classes is left out of the state.

    Where reads are free its check raises at the end of the update, before the state changes, as stock's
    ``one_hot``; on the device path it is deferred.
    """
    flags: list[Tensor] = []
    preds_oh, target_oh = _format_inputs(
        preds, target, self.num_classes, self.include_background, self.input_format, flags
    )
    numerator, denominator = _dice_terms(preds_oh, target_oh, self.weight_type)
    score = _generalized_dice_compute(numerator, denominator, self.per_class).sum(dim=0)
    invalid = None
    if flags:
        invalid = flags[0]
        for flag in flags[1:]:
            invalid = invalid | flag
    if invalid is not None and _deferred.record(self, CLASS_VALUES, invalid):  # (False: read, and clear)
        self.score += score.masked_fill(invalid, 0)
        self.samples += torch.where(invalid, 0.0, float(preds.shape[0]))
    else:
        self.score += score
        self.samples += preds.shape[0]
    _deferred.sweep(self)
