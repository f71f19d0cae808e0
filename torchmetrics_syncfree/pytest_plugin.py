"""pytest plugin (registered as ``syncfree`` through the ``pytest11`` entry point).

Fixtures:

``sync_probe``
    The :class:`~torchmetrics_syncfree.SyncProbe` class, to count would-be syncs around any code::

        def test_step(sync_probe):
            with sync_probe() as probe:
                train_step()
            assert probe.count == 0, probe.summary()

``no_syncs``
    A context manager that fails the test, listing every event with its source line, if the block syncs::

        def test_step(no_syncs):
            with no_syncs():
                train_step()

Options:

``--syncfree-patch``
    Call :func:`torchmetrics_syncfree.patch_all` before collection, e.g. to run TorchMetrics' own test suite
    against the patched library.

``--syncfree-device-path``
    Take the device path on CPU tensors for the whole run (``_instrumentation.force_device_path``, the environment
    variable ``TORCHMETRICS_SYNCFREE_DEVICE_PATH=1`` for spawned processes): checks are counted in the metrics' check
    counters and reported at the end of each update, by ``compute()`` or by ``reset()``, as on a GPU whose copies
    arrive at once; fixed-shape counting instead of the CPU shortcuts. Without the probe's overhead. With
    ``--syncfree-patch``, e.g. to run TorchMetrics' own suites as they would run on a GPU.

``--syncfree-require-cuda``
    Refuse to run (usage error, exit code 4) when CUDA is not available, instead of letting CUDA tests skip: for GPU
    runners (``tox -e gpu``), where a silently skipped GPU suite would look green.

"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from torchmetrics_syncfree.probe import SyncProbe


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--syncfree-patch``."""
    group = parser.getgroup("syncfree")
    group.addoption(
        "--syncfree-patch",
        action="store_true",
        default=False,
        help="apply torchmetrics_syncfree.patch_all() for the whole test session",
    )
    group.addoption(
        "--syncfree-device-path",
        action="store_true",
        default=False,
        help="take the patched code's device path (as on CUDA) for CPU tensors too, for the whole session",
    )
    group.addoption(
        "--syncfree-require-cuda",
        action="store_true",
        default=False,
        help="fail (instead of skipping CUDA tests) when torch.cuda.is_available() is False",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``cuda`` marker and patch TorchMetrics if asked to."""
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")
    if config.getoption("--syncfree-require-cuda"):
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(
                f"--syncfree-require-cuda: no CUDA device is available (torch {torch.__version__},"
                f" built with CUDA {torch.version.cuda}); refusing to report the GPU suite as skipped"
            )
    if config.getoption("--syncfree-device-path"):
        import os

        from torchmetrics_syncfree import _instrumentation

        _instrumentation.force_device_path(True)
        os.environ[_instrumentation.DEVICE_PATH_ENV_VAR] = "1"  # spawned processes (DDP tests) take it too
    if config.getoption("--syncfree-patch"):
        import torchmetrics_syncfree

        patched = torchmetrics_syncfree.patch_all()
        config._syncfree_patched = patched  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    """Say in the header whether TorchMetrics is patched."""
    patched = getattr(config, "_syncfree_patched", None)
    if patched is None:
        return "torchmetrics_syncfree: not patched"
    path = "device path forced" if config.getoption("--syncfree-device-path") else "CPU path where reads are free"
    return f"torchmetrics_syncfree: patch_all() active ({len(patched)} targets, {path})"


@pytest.fixture
def sync_probe() -> type[SyncProbe]:
    """Give the :class:`SyncProbe` class to count would-be syncs around any block."""
    return SyncProbe


@pytest.fixture
def no_syncs() -> Callable[..., AbstractContextManager[SyncProbe]]:
    """Give a context manager that fails the test if its block would synchronize host and device."""

    @contextmanager
    def _no_syncs(**probe_kwargs: Any) -> Iterator[SyncProbe]:
        with SyncProbe(**probe_kwargs) as probe:
            yield probe
        probe.assert_no_syncs()

    return _no_syncs
