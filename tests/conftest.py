"""Shared fixtures: every test starts and ends with stock TorchMetrics unless it patches explicitly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torchmetrics_syncfree
from torchmetrics_syncfree import _deferred

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")


@pytest.fixture(autouse=True)
def _stock_torchmetrics_around_each_test() -> Iterator[None]:
    torchmetrics_syncfree.unpatch_all()
    yield
    torchmetrics_syncfree.unpatch_all()


@pytest.fixture(autouse=True)
def _a_host_copy_per_sweep() -> Iterator[None]:
    """The suites assert which sweep reports what, written for a copy of the counters per sweep: they keep that.

    The default interval (``_deferred.COPY_INTERVAL`` sweeps between copies) has its own tests
    (``tests/test_deferred_lifecycle.py``, ``-k copy_interval``); the integration and upstream suites run with it.
    """
    with _deferred.copy_interval(1):
        yield


@pytest.fixture
def syncfree() -> Iterator[list[str]]:
    """TorchMetrics patched for the duration of the test; yields the patched targets."""
    with torchmetrics_syncfree.patched() as targets:
        yield targets


pytest_plugins = ["pytester", "tests._series_tree"]
