"""The breadth classes (the rest of TorchMetrics on a GPU) under DDP (2-rank gloo world): their new states and check
counters sync as stock's states do.

Each rank runs the same life on stock and on the patched metric (device path forced; the checks' host copy arrived,
and still in flight): ``forward`` on two of its own batches, ``compute`` (states synced across the ranks), then one
more update and compute after a ``reset``. Every value must be stock's, on every rank, within the areas' documented
float deviations (1e-4; each area's own tests pin its exact parity).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests import _ddp_world
from tests.test_lifecycle_modes import BREADTH_CLASSES

pytestmark = pytest.mark.ddp


def _life(name: str, rank: int) -> list[Any]:
    from torchmetrics_syncfree.tools import audit, census

    spec = census.spec_for(name, census.exported_classes()[name])
    metric = spec.build() if spec.build is not None else audit.build_metric(spec.spec)

    def batch(step: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return census.make_inputs(spec.inputs, metric, torch.device("cpu"), seed=100 * rank + step)

    args, kwargs = batch(1)
    values = [metric(*args, **kwargs)]
    args, kwargs = batch(2)
    values += [metric(*args, **kwargs), metric.compute()]
    metric.reset()
    args, kwargs = batch(3)
    metric.update(*args, **kwargs)
    return [*values, metric.compute()]


def _runnable(name: str) -> bool:
    from torchmetrics_syncfree.tools import audit, census

    classes = census.exported_classes()
    if name not in classes:
        return False
    spec = census.spec_for(name, classes[name])
    try:
        spec.build() if spec.build is not None else audit.build_metric(spec.spec)
    except (TypeError, ValueError):  # a specification of a later release
        return False
    return not spec.skip


def _breadth_world(rank: int, world_size: int) -> dict[str, Any]:
    import warnings

    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    out: dict[str, Any] = {}
    warnings.simplefilter("ignore")  # which warnings reach the user, and when, is tested per area
    for name in filter(_runnable, BREADTH_CLASSES):
        out[f"{name} stock"] = _life(name, rank)
        with torchmetrics_syncfree.patched():
            _instrumentation.force_device_path(True)
            try:
                out[f"{name} device"] = _life(name, rank)
                with _instrumentation.simulated_copy_delay(None):
                    out[f"{name} in-flight"] = _life(name, rank)
            finally:
                _instrumentation.force_device_path(False)
    return out


def test_breadth_classes_under_ddp_are_stocks(tmp_path: Path) -> None:
    results = [res["_breadth_world@gloo"] for res in _ddp_world.run_world([("gloo", _breadth_world)], 2, tmp_path)]
    names = sorted({key.rsplit(" ", 1)[0] for key in results[0]})
    assert len(names) >= 30, names
    for rank, res in enumerate(results):
        for name in names:
            for path in ("device", "in-flight"):
                torch.testing.assert_close(
                    res[f"{name} {path}"],
                    res[f"{name} stock"],
                    rtol=1e-4,
                    atol=1e-4,
                    equal_nan=True,
                    msg=lambda msg, name=name, path=path, rank=rank: f"{name} {path} on rank {rank}: {msg}",
                )
    # the computes are synced: every rank sees the same value
    for name in names:
        torch.testing.assert_close(results[0][f"{name} stock"][2], results[1][f"{name} stock"][2], equal_nan=True)
