"""Shared fixtures: every test starts and ends with stock TorchMetrics unless it patches explicitly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torchmetrics_syncfree

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run with `tox -e gpu`)")


@pytest.fixture(autouse=True)
def _stock_torchmetrics_around_each_test() -> Iterator[None]:
    torchmetrics_syncfree.unpatch_all()
    yield
    torchmetrics_syncfree.unpatch_all()


@pytest.fixture
def syncfree() -> Iterator[list[str]]:
    """TorchMetrics patched for the duration of the test; yields the patched targets."""
    with torchmetrics_syncfree.patched() as targets:
        yield targets


pytest_plugins = ["pytester", "tests._series_tree"]
