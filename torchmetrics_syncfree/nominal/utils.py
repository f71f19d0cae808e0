"""What the sync-free nominal metrics share, as upstream's ``torchmetrics.functional.nominal.utils``.

CramersV, TschuprowsT, PearsonsContingencyCoefficient and TheilsU keep one ``(C, C)`` contingency table
(``confmat``, rows: target, columns: preds) and compute their statistic from its non-empty rows and columns.

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
``nan_strategy="drop"``: ``preds[~nan_rows]``        the pairs with a NaN weigh 0 in the count (no boolean mask)
(a data-dependent shape)
``bincount(target * C + preds)`` (reads the          ``put_(accumulate=True)`` into ``C**2`` cells plus a sink
input's max on CUDA); a negative index or one        cell for indices outside the table (upstream's mesh
past ``C**2`` raises ``RuntimeError``                ``_bincount`` in deterministic mode, on MPS and with XLA,
                                                     as stock); the sink's count is a deferred ``RuntimeError``
                                                     of the metric (:data:`OUTSIDE_TABLE`)
``confmat[confmat.sum(1) != 0]`` and the same for    every cell kept; the terms of the empty rows' and columns'
columns (boolean masks)                              cells are ``0 / 0``, skipped by ``nansum``; their numbers are
                                                     device counts
``df = r * k - r - k + 1``; ``if df == 0``,          ``(r - 1) * (k - 1)`` on the device; Yates' half count and
``if df == 1 and bias_correction``                   the zero statistic selected by multiplying with ``df``'s flags
==================================================  ===========================================================

The values equal stock's to float tolerance: a sum over the whole table, whose dropped cells add exact zeros, may
round differently from stock's sum over the smaller table (relative 1e-6 in float32); every other operation is
stock's, on the same values.

One compute on every device. Where reads are free (a CPU tensor, eager) and the table is large, it first takes the
filled rows and columns, as stock does: the statistic then visits the cells stock's visits (the fixed-shape one over
all ``C**2`` cells is 5x stock's time for a 1000-class table that 32 pairs fill); a small table is taken whole, which
is cheaper than the selection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.nominal.utils import _drop_empty_rows_and_cols
from torchmetrics.utilities.data import _bincount

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree.classification.stat_scores import _mesh_counting, _put_counts

#: stock's ``bincount`` (or the ``reshape`` after it) fails on an index outside the table: on the device path the
#: pairs are not counted and this error comes at the metric's next eager point
OUTSIDE_TABLE = _deferred.Check(
    "nominal.outside-table",
    "Detected pairs of `preds` and `target` whose index `target * num_classes + preds` falls outside the"
    " contingency table (labels outside [0, num_classes)): those pairs were not counted.",
    RuntimeError,
)
#: torch.bincount's error for an index that is not 1-d (stock's counting; raised before anything is read)
_NOT_1D = "bincount only supports 1-d non-negative integral inputs."
#: the classes from which a compute where reads are free takes the filled rows and columns first (below, the
#: selection costs more than the empty cells it saves: ``benchmarks/test_paired.py``'s nominal computes)
_SELECT_FILLED_FROM = 128


def bias_correction_check(metric_name: str) -> _deferred.Check:
    """Stock's compute-time warning (``_unable_to_use_bias_correction_warning``) for ``metric_name``."""
    key = f"nominal.bias-correction.{metric_name}"
    known = _deferred._checks.get(key)
    if known is None:
        known = _deferred.Check(
            key,
            f"Unable to compute {metric_name} using bias correction. Please consider to set `bias_correction=False`.",
            UserWarning,
        )
    return known


UNABLE_CRAMERS = bias_correction_check("Cramer's V")
UNABLE_TSCHUPROWS = bias_correction_check("Tschuprow's T")
#: The checks of all four metrics, one counter each: the same states for all four, so that a ``MetricCollection``
#: groups them as it groups stock's (their only other state is ``confmat``), and each warning keeps its own slot (a
#: member of a group that reports the shared counters reports each with its own message).
KINDS = (OUTSIDE_TABLE, UNABLE_CRAMERS, UNABLE_TSCHUPROWS)


def _long(labels: Tensor) -> Tensor:
    return labels if labels.dtype == torch.long else labels.long()


def add_contingency(metric: Any, preds: Tensor, target: Tensor) -> None:
    """Stock's ``update`` of the four metrics on the device path: the batch's table added to ``confmat``.

    Stock's index ``target * C + preds`` (int64, its wrap-around included) decides the cell, so a pred outside the
    classes lands where stock's does; an index outside ``[0, C**2)``, where stock's ``bincount``/``reshape`` fails,
    counts in a sink cell whose count is filed as :data:`OUTSIDE_TABLE`.
    """
    num_classes = metric.num_classes
    preds = preds.argmax(1) if preds.ndim == 2 else preds
    target = target.argmax(1) if target.ndim == 2 else target
    weights = None
    if metric.nan_strategy == "replace":  # integer labels hold no NaN: stock's ``nan_to_num`` copies them unchanged
        preds = preds.nan_to_num(metric.nan_replace_value) if preds.is_floating_point() else preds
        target = target.nan_to_num(metric.nan_replace_value) if target.is_floating_point() else target
    elif preds.is_floating_point() or target.is_floating_point():  # "drop": the pairs with a NaN weigh 0
        weights = (preds.isnan() | target.isnan()).logical_not_().long()
    cells = num_classes * num_classes
    if preds.shape != target.shape:  # stock's expression: its broadcasting and its shape errors
        index = _long(target) * num_classes + _long(preds)
    else:  # the same int64 value in one op (``alpha`` multiplies ``target``)
        index = _long(preds).add(_long(target), alpha=num_classes)
    if _mesh_counting() or index.is_mps:  # stock's mesh: indices outside the table are not counted, nothing raises
        if weights is not None:
            index = index.masked_fill(weights == 0, -1)
        metric.confmat += _bincount(index.flatten(), minlength=cells).view(num_classes, num_classes)
        return
    if index.ndim != 1:
        raise RuntimeError(_NOT_1D)
    bins = _put_counts(index.clamp_(-1, cells), cells + 1, weights)  # -1 and C**2: the sink (``put_`` wraps -1)
    _deferred.keep_kinds(metric, KINDS, size=len(KINDS))  # a metric made before the patch gets its counters here
    _deferred.record(metric, OUTSIDE_TABLE, bins[cells])
    metric.confmat += bins[:cells].view(num_classes, num_classes)
    _deferred.sweep(metric)


def filled_part(confmat: Tensor) -> Tensor:
    """The table's filled rows and columns where reads are free and it is large (stock's drop); else the table.

    The statistics' values do not depend on it: an empty row's or column's cells add exact zeros to every sum.
    """
    if confmat.shape[0] < _SELECT_FILLED_FROM or not _deferred.reads_are_free(confmat):
        return confmat
    return _drop_empty_rows_and_cols(confmat)


def chi_squared(confmat: Tensor, bias_correction: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Stock's ``_compute_chi_squared`` of the table without its empty rows and columns, with fixed shapes.

    Every cell is kept: an empty row's or column's cells expect 0 and differ from it by 0, so their terms are
    ``0 / 0`` and ``nansum`` skips them, as stock's drop does. Yates' correction (stock's ``confmat += direction *
    0.5`` where ``df == 1``) moves each difference half a count towards 0, selected by multiplying with the 0.5 or 0
    that ``df`` picks.

    Returns:
        The statistic; the numbers of non-empty rows and columns less one (int64 ``(2,)``: stock's ``confmat.shape``
        after dropping, less one); their product, the degrees of freedom ``df``; the table's sum.

    """
    rows, cols = confmat.sum(1), confmat.sum(0)
    total = rows.sum()
    if rows.shape == cols.shape:  # the whole table: one count for both, a launch less
        degrees = torch.stack((rows, cols)).count_nonzero(1).sub_(1)
    else:  # a table's filled part (:func:`filled_part`)
        degrees = torch.stack((rows.count_nonzero(), cols.count_nonzero())).sub_(1)
    df = degrees.prod()
    expected = torch.outer(rows, cols).div_(total)
    diff = confmat - expected
    if bias_correction:
        diff.addcmul_(diff.sign(), (df == 1) * 0.5, value=-1)
    statistic = diff.square_().div_(expected).nansum()
    return statistic.mul_(df != 0), degrees, df, total


def bias_corrected(phi_squared: Tensor, degrees: Tensor, df: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """Stock's ``_compute_bias_corrected_values``, rows and columns at once: the corrected ``phi2``, rows and columns.

    Stock divides a Python int by a tensor, ``reciprocal() * int``: the same operations here, on device counts.
    """
    inverse = (total - 1).reciprocal()
    phi_squared_corrected = (phi_squared - inverse * df).clamp_min(0.0)
    return phi_squared_corrected, (degrees + 1) - inverse * degrees.square()


def corrected_statistic(
    metric: Any, confmat: Tensor, unable_check: _deferred.Check, denominator: Callable[[Tensor], Tensor]
) -> Tensor:
    """CramersV's and TschuprowsT's compute with fixed shapes: ``sqrt(phi2 / denominator([rows - 1, cols - 1]))``.

    With ``bias_correction``, stock's corrected values; where it cannot correct (``min(rows, cols) == 1``) stock
    warns and returns NaN: the warning (``unable_check``) is filed with the metric, NaN put in with ``masked_fill``.
    """
    chi2, degrees, df, total = chi_squared(confmat, metric.bias_correction)
    phi_squared = chi2 / total
    if not metric.bias_correction:  # int64 counts, as stock's ``confmat.shape`` (TschuprowsT: its int64 tensors)
        return torch.sqrt(phi_squared / denominator(degrees)).clamp_(0.0, 1.0)
    _deferred.keep_kinds(metric, KINDS, size=len(KINDS))
    phi_squared_corrected, corrected = bias_corrected(phi_squared, degrees, df, total)
    value = torch.sqrt(phi_squared_corrected / denominator(corrected - 1)).clamp_(0.0, 1.0)
    unable = corrected.amin() == 1
    _deferred.record_in_compute(metric, unable_check, unable)
    return value.masked_fill_(unable, float("nan"))


def declare_patches(
    module: str,
    cls: str,
    init_params: tuple[str, ...],
    statistic: Callable[[Any, Tensor], Tensor],
) -> None:
    """Declare the replacements of ``__init__``, ``update`` and ``compute`` of the class ``cls`` (a dotted path).

    They belong to the area of ``module``; the four metrics differ only in their compute and their checks.

    ``__init__``: stock's, plus the counters of :data:`KINDS`. ``update``: :func:`add_contingency` on every device
    (where reads are free, a pair outside the table raises at once). ``compute``: ``statistic(metric, table)`` of
    :func:`filled_part` of ``confmat`` on every device.
    """
    init = _deferred.checked_init(f"{cls}.__init__", module, lambda metric: KINDS, size=len(KINDS))

    def update(self: Any, preds: Tensor, target: Tensor) -> None:
        add_contingency(self, preds, target)

    def compute(self: Any) -> Tensor:
        return statistic(self, filled_part(self.confmat))

    update.__doc__ = "The batch's contingency table counted with fixed shapes into ``confmat``."
    compute.__doc__ = "The statistic with fixed shapes (of the filled rows and columns where reads are free)."
    for fn in (update, compute):
        fn.__module__ = module
        fn.__qualname__ = f"{cls.rsplit('.', 1)[1]}.{fn.__name__}"
    replaces(f"{cls}.__init__", params=("self", *init_params, "kwargs"))(init)
    replaces(f"{cls}.update", params=("self", "preds", "target"), kind="metric_method")(update)
    replaces(f"{cls}.compute", params=("self",), kind="metric_method")(compute)
