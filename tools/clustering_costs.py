"""Host time and kernel launches of the clustering metrics' ``forward``, stock against ``patch_all()``.

::

    python tools/clustering_costs.py                 # 32 / 1000 / 10000 samples (5 / 10 / 50 clusters)
    python tools/clustering_costs.py 32:4 100000:100  # samples:clusters
    python tools/clustering_costs.py --quick 40:3     # one call per side: a smoke test, no timing worth reading

Per class and size: the host time of one ``forward`` on a new metric (one thread, best of 5 rounds; CPU tensors, so
the patched side runs as a CPU user's does), as a ratio to stock's, and whether both sides return the same value (to
the bit, or within the documented relative 1e-5 for the metrics whose sums run in another order). The launches (aten
ops that launch a kernel on CUDA, :mod:`torchmetrics_syncfree.tools.launches`) are counted once, on the census's
inputs (batch 32, 5 clusters), with the patched side's device path forced. AdjustedMutualInfoScore is timed up to 1000
samples (stock's expected mutual information is a Python loop). Prints a markdown table; exits 1 where values
differ beyond the documented rounding.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from typing import Any

import torch
import torchmetrics.clustering as clustering

import torchmetrics_syncfree
from torchmetrics_syncfree import _instrumentation
from torchmetrics_syncfree.tools import census
from torchmetrics_syncfree.tools.launches import count_launches

#: every clustering class but ClusterAccuracy (a linear assignment on the host: not covered)
NAMES = tuple(sorted(name for name in clustering.__all__ if name != "ClusterAccuracy"))
INTRINSIC = ("CalinskiHarabaszScore", "DaviesBouldinScore", "DunnIndex")
SUMMED = ("AdjustedMutualInfoScore", *INTRINSIC)
SIZES = ((32, 5), (1000, 10), (10000, 50))


def _inputs(name: str, samples: int, clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(samples + clusters)
    if name in INTRINSIC:  # clusters around centres apart (without them the intrinsic scores are ill-conditioned)
        labels = torch.randint(0, clusters, (samples,), generator=gen)
        centres = 5 * torch.randn(clusters, 8, generator=gen)
        return centres[labels] + torch.randn(samples, 8, generator=gen), labels
    return torch.randint(0, clusters, (samples,), generator=gen), torch.randint(0, clusters, (samples,), generator=gen)


def _best_time(name: str, inputs: tuple[torch.Tensor, torch.Tensor], quick: bool) -> tuple[float, torch.Tensor]:
    def forward() -> torch.Tensor:
        return getattr(clustering, name)()(*inputs)

    value = forward()
    reps = 1 if quick else max(1, 20000 // inputs[0].shape[0])
    best = float("inf")
    for _ in range(1 if quick else 5):
        start = time.perf_counter()
        for _ in range(reps):
            forward()
        best = min(best, (time.perf_counter() - start) / reps)
    return best, value


def _launches(name: str, patched: bool) -> int:
    spec = census.spec_for(name, getattr(clustering, name))
    with torchmetrics_syncfree.patched() if patched else contextlib.nullcontext():
        _instrumentation.force_device_path(patched)
        try:
            metric = getattr(clustering, name)()
            args, kwargs = census.make_inputs(spec.inputs, metric, torch.device("cpu"))
            metric(*args, **kwargs)
            return count_launches(metric, *args, **kwargs)[0]
        finally:
            _instrumentation.force_device_path(False)


def _agreement(name: str, clusters: int, value: torch.Tensor, expected: torch.Tensor) -> str:
    """An empty string where the values agree; else why not (the one documented deviation, or a difference)."""
    if name == "DaviesBouldinScore" and clusters > 25:
        return " (stock's value is noise above 25 clusters: docs/clustering.md)"
    if name in SUMMED:
        same = bool(torch.allclose(value, expected, rtol=1e-5, atol=5e-5))
    else:
        same = bool(torch.equal(value, expected)) and value.dtype == expected.dtype
    return "" if same else " (values differ)"


def measure(sizes: tuple[tuple[int, int], ...] = SIZES, quick: bool = False) -> list[dict[str, Any]]:
    """One row per class: launches (stock, patched) and per size the time ratio and how the values agree."""
    torch.set_num_threads(1)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # stock's sparse-invariant warning
        for name in NAMES:
            row: dict[str, Any] = {"name": name, "launches": (_launches(name, False), _launches(name, True))}
            for samples, clusters in sizes:
                if name == "AdjustedMutualInfoScore" and samples > 1000:
                    continue
                inputs = _inputs(name, samples, clusters)
                stock_time, expected = _best_time(name, inputs, quick)
                with torchmetrics_syncfree.patched():
                    patched_time, value = _best_time(name, inputs, quick)
                row[f"{samples}:{clusters}"] = (patched_time / stock_time, _agreement(name, clusters, value, expected))
            rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    sizes = tuple(tuple(int(part) for part in arg.split(":")) for arg in argv if arg != "--quick") or SIZES
    rows = measure(sizes, quick)  # type: ignore[arg-type]
    columns = [f"{samples}:{clusters}" for samples, clusters in sizes]
    print("| class | launches forward (stock -> patched) | " + " | ".join(columns) + " |")
    print("| --- | --- |" + " ---: |" * len(columns))
    agree = True
    for row in rows:
        cells = []
        for column in columns:
            if column not in row:
                cells.append("-")
                continue
            ratio, agreement = row[column]
            agree &= "differ" not in agreement
            cells.append(f"{ratio:.2f}{agreement}")
        stock_launches, patched_launches = row["launches"]
        print(f"| {row['name']} | {stock_launches} -> {patched_launches} | " + " | ".join(cells) + " |")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
