"""Sync-free ``torchmetrics.classification.ranking``: the multilabel ranking metrics.

``MultilabelCoverageError``, ``MultilabelRankingAveragePrecision`` and ``MultilabelRankingLoss``.

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``validate_args``: the multilabel confusion          its device flag, a deferred check of the metric (raised at
matrix's ``torch.unique`` + ``if ...:``              once on CPU, reported at an eager point on the device path,
                                                     the invalid batch left out of the state)
``ignore_index``: ``preds[idx] = -4 * L``,           ``masked_fill`` (the same values)
``target[idx] = -4 * L``
coverage: ``offset[target == 0] = ...``              ``torch.where``: the same values, so the same sums
ranking AP: a Python loop over the samples, each     every sample at once: the labels of each row sorted once;
with ``torch.unique`` twice and boolean masks        a label's rank is ``searchsorted`` (labels scored at least as
(4 reads or data-dependent shapes per sample)        high), its rank among the relevant labels a cumulative sum
                                                     of relevance in sorted order, gathered at that rank
ranking loss: ``preds[mask]`` (samples with some     every sample computed, those without some and without all
but not all labels relevant), ``if len(preds) ==     labels relevant weigh 0; the count (the batch size, or 1
0: return 0, 1``                                     when no sample qualifies) is chosen with ``torch.where``
``compute``: ``measure / int(total.item())``         ``measure / total`` (the same value: ``total`` is a float32
(1.7+)                                               count, exact below 2**24, and its ``int`` is that count)
==================================================  ===========================================================

One implementation on every device (after the patched validation and format). The coverage error is stock's to the
bit; the ranking average
precision and ranking loss sum over every sample (and the former every label) with zeros where stock selects a subset
first: their float sums may differ from stock's in the last bits, as any change of summation order. The ranks are
integers, equal to stock's (ties: every label scored at least as high counts, as ``torch.unique`` + ``cumsum`` do).
The functional API (``multilabel_ranking_loss(...)``) has no metric: it is stock's.

"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.classification.ranking import (
    _ranking_reduce,
)

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces, stock
from torchmetrics_syncfree._states import add_to_states
from torchmetrics_syncfree.classification.confusion_matrix import _multilabel_confusion_matrix_tensor_validation
from torchmetrics_syncfree.classification.stat_scores import _cached, normalize_logits_if_needed

_FUNCTIONAL = "torchmetrics.functional.classification.ranking"
_MODULE = "torchmetrics.classification.ranking"
_CLASSES = ("MultilabelCoverageError", "MultilabelRankingAveragePrecision", "MultilabelRankingLoss")


@replaces(
    f"{_FUNCTIONAL}._multilabel_ranking_tensor_validation", params=("preds", "target", "num_labels", "ignore_index")
)
def _multilabel_ranking_tensor_validation(
    preds: Tensor, target: Tensor, num_labels: int, ignore_index: int | None = None, metric: Any = None
) -> Tensor | None:
    """Stock's checks; with the ``metric`` whose update validates, the value check is a device flag (returned)."""
    if metric is None:
        return stock(f"{_FUNCTIONAL}._multilabel_ranking_tensor_validation")(preds, target, num_labels, ignore_index)
    invalid = _multilabel_confusion_matrix_tensor_validation(preds, target, num_labels, ignore_index, metric=metric)
    if not preds.is_floating_point():
        raise ValueError(f"Expected preds tensor to be floating point, but received input with dtype {preds.dtype}")
    return invalid


def _format(preds: Tensor, target: Tensor, num_labels: int, ignore_index: int | None) -> tuple[Tensor, Tensor]:
    """Stock's ``_multilabel_confusion_matrix_format(..., should_threshold=False)`` without boolean-mask writes."""
    if preds.is_floating_point():
        preds = normalize_logits_if_needed(preds, "sigmoid")
    preds = torch.movedim(preds, 1, -1).reshape(-1, num_labels)
    target = torch.movedim(target, 1, -1).reshape(-1, num_labels)
    if ignore_index is not None:
        ignored = target == ignore_index
        preds = preds.masked_fill(ignored, -4 * num_labels)
        target = target.masked_fill(ignored, -4 * num_labels)
    return preds, target


def _constant(value: float, like: Tensor) -> Tensor:
    """A 0-dim ``value`` of ``like``'s dtype and device, made once per device.

    ``torch.where`` with a Python number launches a fill for it on every call.
    """
    return _cached(
        like.device,
        ("constant", value, like.dtype),
        lambda: torch.full((), value, dtype=like.dtype, device=like.device),
    )


def _coverage_error(preds: Tensor, target: Tensor) -> tuple[Tensor, int]:
    """Stock's ``_multilabel_coverage_error_update`` with the offset chosen by ``torch.where`` (same values)."""
    offset = torch.where(target == 0, preds.min().abs() + 10, _constant(0.0, preds))
    preds_min = (preds + offset).min(dim=1)[0]
    coverage = (preds >= preds_min[:, None]).sum(dim=1).to(torch.float32)
    return coverage.sum(), coverage.numel()


def _qualifies(relevant: Tensor) -> tuple[Tensor, Tensor]:
    """Per sample: the number of relevant labels, and whether some but not all labels are relevant."""
    num_relevant = relevant.sum(dim=1)
    return num_relevant, (num_relevant > 0) & (num_relevant < relevant.shape[1])


def _ranking_average_precision(preds: Tensor, target: Tensor) -> tuple[Tensor, int]:
    """Stock's ``_multilabel_ranking_average_precision_update`` for all samples at once, with fixed shapes.

    A label's rank is the number of labels scored at least as high (stock: ``torch.unique`` + ``cumsum`` over the
    negated scores, then indexed by the inverse); its rank among the relevant labels the number of relevant ones
    among those. With the negated scores of each row sorted, the first is ``searchsorted(..., right=True)`` and the
    second the cumulative count of relevant labels in sorted order at that position.
    """
    neg_preds = -preds
    relevant = target == 1
    ordered, order = neg_preds.sort(dim=1)
    rank = torch.searchsorted(ordered, neg_preds.contiguous(), right=True).clamp_(min=1)  # >= 1: the label itself
    relevant_before = relevant.gather(1, order).long().cumsum(dim=1)
    ranking = relevant_before.gather(1, rank - 1)
    ratio = ranking.float() / rank.float()
    ratio = torch.where(relevant, ratio, _constant(0.0, ratio))
    num_relevant, qualifies = _qualifies(relevant)
    score = torch.where(qualifies, ratio.sum(dim=1) / num_relevant, _constant(1.0, ratio))
    return score.sum(), preds.shape[0]


def _ranking_loss(preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Stock's ``_multilabel_ranking_loss_update`` on every sample, those that do not qualify weighing 0."""
    num_preds, num_labels = preds.shape
    relevant = target == 1
    num_relevant, qualifies = _qualifies(relevant)
    inverse = preds.argsort(dim=1).argsort(dim=1)
    per_label_loss = ((num_labels - inverse) * relevant).to(torch.float32)
    correction = 0.5 * num_relevant * (num_relevant + 1)
    denom = num_relevant * (num_labels - num_relevant)
    loss = (per_label_loss.sum(dim=1) - correction) / denom
    loss = torch.where(qualifies, loss, _constant(0.0, loss))
    # stock counts every sample, or 1 when none qualifies (its early return): 1 + (N - 1) * any
    return loss.sum(), qualifies.any().mul(num_preds - 1).add_(1)


_MEASURES = {
    "MultilabelCoverageError": _coverage_error,
    "MultilabelRankingAveragePrecision": _ranking_average_precision,
    "MultilabelRankingLoss": _ranking_loss,
}


def _update(self: Any, preds: Tensor, target: Tensor, name: str) -> None:
    invalid = None
    if self.validate_args:
        invalid = _multilabel_ranking_tensor_validation(preds, target, self.num_labels, self.ignore_index, metric=self)
    preds, target = _format(preds, target, self.num_labels, self.ignore_index)
    measure, total = _MEASURES[name](preds, target)
    if invalid is not None:
        if not isinstance(total, Tensor):
            total = torch.full((), total, dtype=self.total.dtype, device=measure.device)
        measure, total = measure.masked_fill(invalid, 0), total.masked_fill(invalid, 0)
    add_to_states(self, ("measure", "total"), (measure, total))
    _deferred.sweep(self)


def _compute(self: Any, name: str) -> Tensor:
    return _ranking_reduce(self.measure, self.total)


def _declare(name: str) -> None:
    """Declare the ``__init__`` (check counters), ``update`` and ``compute`` of the ranking metric ``name``."""
    replaces(f"{_MODULE}.{name}.__init__", params=("self", "num_labels", "ignore_index", "validate_args", "kwargs"))(
        _deferred.checked_init(f"{_MODULE}.{name}.__init__", __name__)
    )

    def update(self: Any, preds: Tensor, target: Tensor) -> None:
        _update(self, preds, target, name)

    def compute(self: Any) -> Tensor:
        return _compute(self, name)

    for function, method in ((update, "update"), (compute, "compute")):
        function.__name__ = function.__qualname__ = f"_{method}_{name}"
        function.__doc__ = f"{name}.{method} without host reads on the device path (see the module docstring)."
        replaces(
            f"{_MODULE}.{name}.{method}",
            params=("self",) + (("preds", "target") if method == "update" else ()),
            kind="metric_method",
        )(function)


for _name in _CLASSES:
    _declare(_name)
