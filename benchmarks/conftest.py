"""Benchmarks start and end on stock TorchMetrics; each one patches explicitly when it measures the patched code.

The C allocator is pinned for the whole run (:func:`_pin_glibc_allocator`): by default glibc moves its mmap threshold
up to the size of the largest block freed so far, so whether an 8 MB state (a 1000-class confusion matrix) comes
from fresh, page-faulting memory or from the heap depends on what the process allocated and freed before, not on
the code being timed. The same forward measured 0.62 and 3.34 times stock in two runs that way; with the thresholds
pinned, stock and patched allocate alike and the pairs agree (0.99).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

import torchmetrics_syncfree

#: glibc ``mallopt`` parameters (``malloc.h``)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's largest mmap threshold on 64-bit systems: every tensor a benchmark holds is below it
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


def _pin_glibc_allocator() -> bool:
    """Fix glibc's mmap and trim thresholds (no dynamic adjustment); ``False`` where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    mallopt = getattr(ctypes.CDLL(path), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and mallopt(_M_TRIM_THRESHOLD, 4 * _MMAP_THRESHOLD_MAX))


GLIBC_ALLOCATOR_PINNED = _pin_glibc_allocator()


def pytest_report_header() -> str:
    return f"benchmarks: glibc malloc thresholds pinned: {GLIBC_ALLOCATOR_PINNED}"


@pytest.fixture(autouse=True)
def _stock_around_each_benchmark():
    torchmetrics_syncfree.unpatch_all()
    yield
    torchmetrics_syncfree.unpatch_all()
