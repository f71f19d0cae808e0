"""The wrapped metric's deferred checks in ``torchmetrics.wrappers``: internal resets and computes read nothing.

Wrappers reset and compute the metrics they wrap inside their own calls. Each ``reset()`` of a metric with check
counters reads them before it drops the states (``_deferred.take_pending``), and on a GPU they are never known to be
zero: a host wait inside calls that should not wait, even where nothing was wrong. Measured with the counters' host
copy in flight (``simulated_copy_delay(None)``: a GPU a step behind the host):

=============================================  ==============================  ===============================
wrapper                                         stock's internal calls          host waits per call (before)
=============================================  ==============================  ===============================
``Running`` (``RunningMean``, ``RunningSum``)   ``base_metric.reset()`` after   1 per ``update`` and ``forward``
                                                every update and forward, and
                                                after ``compute``
``MinMaxMetric.forward``                        ``Metric.forward`` of the       2 (the base's reset, then its
                                                wrapper: resets and computes    compute)
                                                the base metric
``BootStrapper.forward``                        the same, for every bootstrap   2 per bootstrap
=============================================  ==============================  ===============================

Here those calls hold the wrapped metrics (``_deferred.held``): a held metric's reset leaves its counters, and what they
count, in place, and its compute and the end of its updates read nothing. The counts travel in the wrapped metric's own
counters to the next eager point, where they are reported once each: the wrapper's ``compute()`` (which computes the
wrapped metric), a user's ``reset()`` of the wrapper, or (``MinMaxMetric``, ``BootStrapper``) an ``update`` of the
wrapper, whose end reports what has arrived. ``Running`` holds its base metric in ``update`` and ``forward`` too, so
that nothing is reported between the base's update and the wrapper's bookkeeping (a late error there would leave the
batch in the base metric's state and out of the window), and its ``compute`` resets the base metric even when the base's
compute raises a reported error: the window's states are never lost.

Values, states and stock's own errors are stock's on both paths: the code is stock's, with the holds added. Where
reads are free (CPU) no update writes the counters, and nothing changes.
"""

from __future__ import annotations

from typing import Any

from torchmetrics_syncfree import _deferred
from torchmetrics_syncfree._registry import replaces

_RUNNING = "torchmetrics.wrappers.running.Running"


def _keep_window_slot(self: Any, slot: int) -> None:
    """Stock's bookkeeping after the base metric's update: its states into the window's ``slot``, then its reset.

    Run holding the base metric: the slot never gets its counters (they stay the base metric's own, counted once), and
    its reset keeps them.
    """
    base = self.base_metric
    for key in base._defaults:
        if key != _deferred.STATE:
            setattr(self, key + f"_{slot}", getattr(base, key))
    base.reset()
    self._num_vals_seen += 1


@replaces(f"{_RUNNING}.update", params=("self", "args", "kwargs"), kind="metric_method")
def _running_update(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stock's ``update``, holding the base metric: its internal reset reads nothing."""
    slot = self._num_vals_seen % self.window
    with _deferred.held(self.base_metric):
        self.base_metric.update(*args, **kwargs)
        _keep_window_slot(self, slot)


@replaces(f"{_RUNNING}.forward", params=("self", "args", "kwargs"))
def _running_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Stock's ``forward``, holding the base metric: its forward, bookkeeping and reset read nothing."""
    slot = self._num_vals_seen % self.window
    with _deferred.held(self.base_metric):
        res = self.base_metric.forward(*args, **kwargs)
        _keep_window_slot(self, slot)
    self._computed = None
    return res


@replaces(f"{_RUNNING}.compute", params=("self",), kind="metric_method")
def _running_compute(self: Any) -> Any:
    """Stock's ``compute`` (an eager point: the base's compute reports its checks); the base's reset always runs."""
    base = self.base_metric
    for i in range(self.window):
        base._reduce_states({key: getattr(self, key + f"_{i}") for key in base._defaults})
    base._update_count = self._num_vals_seen
    try:
        return base.compute()
    finally:
        # after an error reported by the compute too: the window's reduced states must not stay in the base metric
        with _deferred.held(base):
            base.reset()


def _wrapper_forward(self: Any, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``Metric.forward`` of the wrapper (stock's ``super(WrapperMetric, self).forward``), holding ``wrapped``."""
    from torchmetrics import Metric

    with _deferred.held(*wrapped):
        return Metric.forward(self, *args, **kwargs)


@replaces("torchmetrics.wrappers.minmax.MinMaxMetric.forward", params=("self", "args", "kwargs"))
def _minmax_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Stock's ``forward`` (``Metric.forward`` of the wrapper), holding the base metric it resets and computes."""
    return _wrapper_forward(self, (self._base_metric,), args, kwargs)


@replaces("torchmetrics.wrappers.bootstrapping.BootStrapper.forward", params=("self", "args", "kwargs"))
def _bootstrapper_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Stock's ``forward`` (``Metric.forward`` of the wrapper), holding the bootstrap metrics it resets and computes."""
    return _wrapper_forward(self, tuple(self.metrics), args, kwargs)
