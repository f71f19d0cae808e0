"""Benchmarks start and end on stock TorchMetrics; each one patches explicitly when it measures the patched code."""

from __future__ import annotations

import pytest

import torchmetrics_syncfree


@pytest.fixture(autouse=True)
def _stock_around_each_benchmark():
    torchmetrics_syncfree.unpatch_all()
    yield
    torchmetrics_syncfree.unpatch_all()
