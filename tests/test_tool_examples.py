"""The runnable examples in the tooling's docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", ["launches", "allocations"])
def test_the_docstring_examples_hold(module: str) -> None:
    tool = importlib.import_module(f"torchmetrics_syncfree.tools.{module}")
    failed, attempted = doctest.testmod(tool, optionflags=doctest.ELLIPSIS)
    assert attempted > 0
    assert failed == 0
