"""Sync-free ``torchmetrics.regression.tweedie_deviance``: TweedieDevianceScore's update (and so ``forward``).

==================================================  ===========================================================
stock                                                sync-free (every device)
==================================================  ===========================================================
``torch.tensor(torch.numel(score), device=...)``:    the count added to the state as a number (and, where
a host-to-device copy of the count                   the batch is left out, taken away again by the flag)
``if torch.any(preds <= 0) or torch.any(...):        the same condition as one 0-dim flag, filed as a deferred
raise ValueError(...)`` (powers other than 0)        error of the metric (stock's type and text, which names the
                                                     power); the offending batch adds nothing to the states
``_safe_xlogy`` (power 1): ``res[x == 0] = 0.0``     ``masked_fill(x == 0, 0.0)``: the same values
==================================================  ===========================================================

Replaced are the metric's ``__init__`` (its check counter) and ``update``, and ``_tweedie_deviance_score_update`` (every
TorchMetrics module's reference to it: the functional ``tweedie_deviance_score``), one implementation on every device.
The deviance is stock's expression (``torch.zeros`` made only for the powers that use it), so the values are stock's to
the bit; a batch with invalid values raises stock's ``ValueError`` where reads are free (CPU) inside the update, before
the states change, as stock; elsewhere at the metric's next eager point (the end of the update when the device has
finished it; else a later update, ``compute()`` or ``reset()``), the batch left out of the states. ``compute`` reads
nothing and stays stock's. The functional ``tweedie_deviance_score`` has no metric to defer to: at powers other than 0
it reads its one flag and raises at once (stock: up to two reads, a boolean-mask write and a copy); at power 0 it reads
nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics.utilities.checks import _check_same_shape

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces
from torchmetrics_syncfree.regression.kl_divergence import _safe_xlogy
from torchmetrics_syncfree.regression.log_cosh import count_of

_MODULE = "torchmetrics.regression.tweedie_deviance"
_FUNCTIONAL = "torchmetrics.functional.regression.tweedie_deviance"


def _message(power: float) -> str | None:
    """Stock's error for invalid values at ``power`` (``None``: power 0 checks no values)."""
    if power == 0:
        return None
    if power == 1:
        return f"For power={power}, 'preds' has to be strictly positive and 'targets' cannot be negative."
    if power < 0:
        return f"For power={power}, 'preds' has to be strictly positive."
    if 1 < power < 2:
        return f"For power={power}, 'targets' has to be strictly positive and 'preds' cannot be negative."
    return f"For power={power}, both 'preds' and 'targets' have to be strictly positive."


class _PowerCheck(_deferred.Check):
    """The invalid-values check of one power: its message names the power, so it is made (and pickled) per power."""

    __slots__ = ("power",)

    def __reduce__(self) -> tuple[Any, tuple[float]]:
        return power_check, (self.power,)


def power_check(power: float) -> _deferred.Check:
    """The deferred ``ValueError`` of invalid values at ``power`` (made once per power, found again by its key)."""
    key = f"tweedie-deviance.invalid-values.{power!r}"
    known = _deferred._checks.get(key)
    if known is None:
        known = _PowerCheck(key, _message(power) or "", ValueError)
        known.power = power
    return known


def _kinds(self: Any) -> tuple[_deferred.Check, ...]:
    return () if self.power == 0 or 0 < self.power < 1 else (power_check(self.power),)


_stock_init_with_checks = _deferred.checked_init(f"{_MODULE}.TweedieDevianceScore.__init__", __name__, _kinds)


@replaces(f"{_MODULE}.TweedieDevianceScore.__init__", params=("self", "power", "kwargs"))
def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's ``__init__``, plus the counter of the invalid-values check."""
    _stock_init_with_checks(self, *args, **kwargs)


def _invalid(preds: Tensor, targets: Tensor, power: float) -> Tensor | None:
    """Stock's condition for its ``ValueError`` as one 0-dim flag (``None`` for power 0)."""
    if power == 0:
        return None
    if power < 0:
        return (preds <= 0).any()
    if power == 1 or 1 < power < 2:
        return ((preds <= 0) | (targets < 0)).any()
    return ((preds <= 0) | (targets <= 0)).any()


def _deviance(preds: Tensor, targets: Tensor, power: float) -> Tensor:
    """Stock's elementwise deviance of ``_tweedie_deviance_score_update`` (its value checks done by the caller)."""
    if power == 0:
        return torch.pow(targets - preds, exponent=2)
    if power == 1:  # Poisson
        return 2 * (_safe_xlogy(targets, targets / preds) + preds - targets)
    if power == 2:  # Gamma
        return 2 * (torch.log(preds / targets) + (targets / preds) - 1)
    zero_tensor = torch.zeros(preds.shape, device=preds.device)  # stock's (float32: it promotes half inputs)
    term_1 = torch.pow(torch.max(targets, zero_tensor), 2 - power) / ((1 - power) * (2 - power))
    term_2 = targets * torch.pow(preds, 1 - power) / (1 - power)
    term_3 = torch.pow(preds, 2 - power) / (2 - power)
    return 2 * (term_1 - term_2 + term_3)


def _checked(preds: Tensor, targets: Tensor, power: float) -> tuple[Tensor, Tensor | None]:
    """Stock's host checks (shapes, the power), the elementwise deviance and the invalid-values flag."""
    _check_same_shape(preds, targets)
    if 0 < power < 1:
        raise ValueError(f"Deviance Score is not defined for power={power}.")
    return _deviance(preds, targets, power), _invalid(preds, targets, power)


@replaces(f"{_FUNCTIONAL}._tweedie_deviance_score_update", params=("preds", "targets", "power"), everywhere=True)
def _tweedie_deviance_score_update(preds: Tensor, targets: Tensor, power: float = 0.0) -> tuple[Tensor, Tensor]:
    """Stock's ``_tweedie_deviance_score_update`` where reads are free; otherwise the count filled, one read at most.

    The functional ``tweedie_deviance_score`` has no metric to defer its error to: powers other than 0 read their one
    flag (stock: up to two reads, a boolean-mask write at power 1 and the count's copy); power 0 reads nothing.
    """
    deviance_score, invalid = _checked(preds, targets, power)
    if invalid is not None and bool(invalid):
        raise ValueError(_message(power))
    return torch.sum(deviance_score), count_of(torch.numel(deviance_score), preds)


@replaces(f"{_MODULE}.TweedieDevianceScore.update", params=("self", "preds", "targets"), kind="metric_method")
def _update(self: Any, preds: Tensor, targets: Tensor) -> None:
    """Stock's update where reads are free; otherwise the same states, invalid values filed instead of read."""
    power = self.power
    deviance_score, invalid = _checked(preds, targets, power)
    sum_deviance_score = torch.sum(deviance_score)
    left_out = False
    if invalid is not None:
        _deferred.keep_kinds(self, _kinds(self))  # ``power`` may have been set after ``__init__``
        left_out = _deferred.record(self, power_check(power), invalid)  # stock raised: the batch is left out
        if left_out:
            sum_deviance_score = sum_deviance_score.masked_fill(invalid, 0.0)
    self.sum_deviance_score += sum_deviance_score
    # the count as a number: no tensor made for it (stock's host-to-device copy)
    self.num_observations += torch.numel(deviance_score)
    if left_out:
        self.num_observations.add_(invalid, alpha=-torch.numel(deviance_score))
    _deferred.sweep(self)
