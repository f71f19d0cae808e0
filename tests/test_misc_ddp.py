"""MinMaxMetric, PeakSignalNoiseRatio, Perplexity, GeneralizedDiceScore and CramersV under DDP (2-rank gloo world).

Each rank runs the same life three times, on stock and on the patched metric on both paths (reads free, and the
device path forced): ``forward`` on two of its own batches (no sync: ``dist_sync_on_step`` is off), then ``compute``
(its states synced across the ranks: sums, the min/max bounds of MinMaxMetric, the list states of PSNR with ``dim``),
then one more update and compute after a ``reset``. Every value must be stock's, on every rank."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests import _ddp_world

pytestmark = pytest.mark.ddp


def _cases() -> dict[str, tuple[Callable[[], Any], Callable[[torch.Generator], tuple[Tensor, Tensor]]]]:
    """name -> (metric factory, batch maker); built in the rank, after ``torchmetrics`` is imported there."""
    from torchmetrics import MeanSquaredError
    from torchmetrics.image import PeakSignalNoiseRatio
    from torchmetrics.nominal import CramersV
    from torchmetrics.segmentation import GeneralizedDiceScore
    from torchmetrics.text import Perplexity
    from torchmetrics.wrappers import MinMaxMetric

    def regression(gen: torch.Generator) -> tuple[Tensor, Tensor]:
        target = torch.randn(8, generator=gen)
        return target + torch.randn(8, generator=gen), target

    def images(gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return torch.rand(2, 3, 5, 5, generator=gen), torch.rand(2, 3, 5, 5, generator=gen)

    def tokens(gen: torch.Generator) -> tuple[Tensor, Tensor]:
        target = torch.randint(0, 5, (2, 6), generator=gen)
        return torch.randn(2, 6, 5, generator=gen).softmax(-1), target.masked_fill(target == 4, -100)

    def segments(gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return torch.randint(0, 3, (2, 6, 6), generator=gen), torch.randint(0, 3, (2, 6, 6), generator=gen)

    def labels(gen: torch.Generator) -> tuple[Tensor, Tensor]:
        return torch.randint(0, 4, (12,), generator=gen), torch.randint(0, 4, (12,), generator=gen)

    return {
        "minmax": (lambda: MinMaxMetric(MeanSquaredError()), regression),
        "psnr": (lambda: PeakSignalNoiseRatio(data_range=1.0), images),
        "psnr-dim": (lambda: PeakSignalNoiseRatio(data_range=(0.0, 1.0), dim=(1, 2, 3), reduction="none"), images),
        "perplexity": (lambda: Perplexity(ignore_index=-100), tokens),
        "generalized-dice": (
            lambda: GeneralizedDiceScore(num_classes=3, input_format="index", per_class=True),
            segments,
        ),
        "cramers": (lambda: CramersV(num_classes=4), labels),
    }


def _life(metric: Any, batch: Callable[[torch.Generator], tuple[Tensor, Tensor]], rank: int) -> list[Any]:
    gen = torch.Generator().manual_seed(10 * rank)
    values = [metric(*batch(gen)), metric(*batch(gen)), metric.compute()]
    metric.reset()
    metric.update(*batch(gen))
    return [*values, metric.compute()]


def _misc_world(rank: int, world_size: int) -> dict[str, Any]:
    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    out: dict[str, Any] = {}
    for name, (make, batch) in _cases().items():
        out[f"{name} stock"] = _life(make(), batch, rank)
        with torchmetrics_syncfree.patched():
            out[f"{name} patched-cpu"] = _life(make(), batch, rank)  # reads free: checks read at once
            _instrumentation.force_device_path(True)
            try:
                out[f"{name} patched-device"] = _life(make(), batch, rank)
            finally:
                _instrumentation.force_device_path(False)
    return out


def test_values_under_ddp_are_stocks(tmp_path: Path) -> None:
    results = [res["_misc_world@gloo"] for res in _ddp_world.run_world([("gloo", _misc_world)], 2, tmp_path)]
    for rank, res in enumerate(results):
        names = sorted({key.rsplit(" ", 1)[0] for key in res})
        assert len(names) == 6, names
        for name in names:
            for path in ("cpu", "device"):
                # forward's batch values differ between the ranks; compute's are the synced ones, the same on both
                torch.testing.assert_close(
                    res[f"{name} patched-{path}"],
                    res[f"{name} stock"],
                    rtol=1e-6,
                    atol=0,
                    msg=f"{name} on rank {rank}, {path} path",
                )
    for name in {key.rsplit(" ", 1)[0] for key in results[0]}:
        for step in (2, 3):  # the computes are synced: every rank sees the same value
            torch.testing.assert_close(results[0][f"{name} stock"][step], results[1][f"{name} stock"][step])
    assert not torch.equal(results[0]["psnr stock"][0], results[1]["psnr stock"][0])  # the ranks' data differ
