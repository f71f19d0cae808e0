"""Shared fixtures: every test starts and ends with stock TorchMetrics unless it patches explicitly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torchmetrics_syncfree
from torchmetrics_syncfree import _instrumentation

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")

#: The oldest torch release whose dynamo the compile guarantee is tested on (README: support matrix). Older dynamo
#: fails on the layer: torch 2.5's its own guards on the registry's ``update`` descriptor ("Guard check failed"),
#: torch 2.10's recurses into that descriptor's ``metric.__dict__`` (reading it through ``object.__getattribute__``
#: instead traces there, but breaks ``forward``'s graph on torch 2.13); 2.11 and 2.12 are not tested. Eager behaviour
#: is the same on every release.
COMPILE_TESTED_FROM = "2.13"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.__version__ >= COMPILE_TESTED_FROM:
        return
    skip = pytest.mark.skip(
        reason=f"torch {torch.__version__}: the compile guarantee holds from torch {COMPILE_TESTED_FROM} (README)"
    )
    for item in items:
        if item.get_closest_marker("compile") is not None:
            item.add_marker(skip)


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
    with _instrumentation.copy_interval(1):
        yield


@pytest.fixture
def syncfree() -> Iterator[list[str]]:
    """TorchMetrics patched for the duration of the test; yields the patched targets."""
    with torchmetrics_syncfree.patched() as targets:
        yield targets


pytest_plugins = ["pytester", "tests._series_tree"]
