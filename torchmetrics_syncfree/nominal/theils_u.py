"""Sync-free ``torchmetrics.nominal.theils_u``: TheilsU's update and compute (and so ``forward``).

==================================================  ===========================================================
stock                                                sync-free (device path)
==================================================  ===========================================================
update: ``bincount`` of ``target * C + preds``,      fixed-size counting into the table plus a sink cell
``nan_strategy="drop"`` by boolean mask              (:mod:`~torchmetrics_syncfree.nominal.utils`)
compute: empty rows and columns dropped (boolean     kept: the conditional entropy's ``nansum`` skips their
masks, twice)                                        terms as it skips the empty cells'; H(X)'s terms of empty
                                                     columns set to 0 with ``torch.where``
``if s_x == 0: return torch.tensor(0, ...)``         ``torch.where(s_x == 0, 0, u)``
==================================================  ===========================================================

As :mod:`~torchmetrics_syncfree.nominal.cramers` (the same paths, tolerance and index check). One deviation on every
device, pinned by ``tests/test_nominal.py``: where H(X) is 0 (one column filled, or an empty table) the value
is a float 0 of the table's dtype; stock returns an int64 ``tensor(0)`` there (its dtype depends on the data, which
a fixed-shape computation cannot follow without a read). The functional ``theils_u`` stays stock's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchmetrics_syncfree.nominal.utils import declare_patches

_MODULE = "torchmetrics.nominal.theils_u"


def _compute(metric: Any, confmat: Tensor) -> Tensor:
    """Stock's ``_theils_u_compute`` of ``confmat`` with fixed shapes (a float 0 where H(X) is 0: module docstring)."""
    total = confmat.sum()
    # H(X|Y): stock's terms; those of empty rows and columns are NaN (0 * log(0 / 0) or 0 * inf), skipped by ``nansum``
    p_xy = confmat / total
    p_y = confmat.sum(1) / total
    s_xy = torch.nansum((p_y.unsqueeze(1) / p_xy).log_().mul_(p_xy))  # in place: one table less alive
    # H(X) over the filled columns
    cols = confmat.sum(0)
    p_x = cols / total
    s_x = -torch.where(cols != 0, p_x * torch.log(p_x), 0).sum()
    return torch.where(s_x == 0, 0.0, (s_x - s_xy) / s_x)


declare_patches(__name__, f"{_MODULE}.TheilsU", ("num_classes", "nan_strategy", "nan_replace_value"), _compute)
