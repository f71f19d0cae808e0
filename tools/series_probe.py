"""Count would-be syncs (``SyncProbe``) of aggregation and classification calls on a snapshot, unpatched vs patched.

Usage::

    python tools/series_probe.py [--archive ../shared/upstream/torchmetrics-master-dab0333.tar.gz]

The snapshot is unpacked twice into a temporary directory, the series is applied to one copy, and the calls run in a
subprocess in tree mode (``tests/_series_tree.py``): ``torchmetrics`` is the unpatched tree, ``patched()`` installs
the patched tree's functions. A CPU probe treats CPU tensors as device tensors (see ``torchmetrics_syncfree.probe``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from _upstream import REPO, SHARED_UPSTREAM, SNAPSHOTS, git, make_checkout, unpack


def _aggregation_calls() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """The calls of the project's aggregation sync acceptance tests (``tests/test_aggregation_syncs.py``)."""
    from torchmetrics.aggregation import MeanMetric

    from tests._aggregation_cases import AGGREGATORS, STRATEGIES
    from tests.test_aggregation_syncs import MEAN_CALLS, NAN_VEC, VEC

    calls = {}
    for strategy in STRATEGIES:
        for name, call in MEAN_CALLS.items():
            calls[f"MeanMetric({strategy!r}).{name}"] = (partial(MeanMetric, nan_strategy=strategy), call)
        for cls in AGGREGATORS:
            for label, value in (("vec", VEC), ("vec with nan", NAN_VEC)):
                calls[f"{cls.__name__}({strategy!r}).update({label})"] = (
                    partial(cls, nan_strategy=strategy),
                    lambda m, v=value: m.update(v),
                )
    return calls


def _classification_calls() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """``update`` and ``forward`` of F1Score for every task x average, with and without ``ignore_index``.

    Five batches each (probabilities, logits, labels, an extra dimension, one class only; see
    ``tests/_classification_cases.py``): F1Score is a ``*StatScores`` metric, whose update every classification metric
    of the series shares.
    """
    from tests._classification_cases import TASK_AVERAGES, batches, make_metric

    calls = {}
    for task, average in TASK_AVERAGES:
        for ignore_index in (None, -1):
            data = batches(task, ignore_index, seed=0)
            make = partial(make_metric, "F1Score", task, average, ignore_index)
            label = f"F1Score({task}, {average}, ignore_index={ignore_index})"

            def update(metric: Any, data: list = data) -> None:
                for preds, target in data:
                    metric.update(preds, target)

            def forward(metric: Any, data: list = data) -> None:
                for preds, target in data:
                    metric(preds, target)

            calls[f"{label}.update x{len(data)}"] = (make, update)
            calls[f"{label}.forward x{len(data)}"] = (make, forward)
    return calls


AREAS = {"aggregation": _aggregation_calls, "classification": _classification_calls}


def _count(patched: bool, calls: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]) -> dict[str, int]:
    from contextlib import nullcontext, suppress

    from torchmetrics_syncfree import SyncProbe
    from torchmetrics_syncfree import patched as patched_context

    counts = {}
    with patched_context() if patched else nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (make, call) in calls.items():
            metric = make()
            with SyncProbe() as probe, suppress(RuntimeError):  # stock raises at once for "error" on a NaN batch
                call(metric)
            counts[name] = probe.count
    return counts


def _inside(tree: Path) -> int:
    sys.path.insert(0, str(REPO))
    from tests import _series_tree

    _series_tree.install(tree)
    failed = 0
    summary = []
    for area, make_calls in AREAS.items():
        calls = make_calls()
        stock, patched = _count(False, calls), _count(True, calls)
        for name in stock:
            print(f"{name:60} stock {stock[name]}  patched tree {patched[name]}")
        for label, counts in (("stock (unpatched tree)", stock), ("patched tree", patched)):
            hit = sum(1 for c in counts.values() if c)
            summary.append(f"{area}, {label}: {sum(counts.values())} events in {hit} of {len(counts)} calls")
        failed |= any(patched.values())
    print("\n".join(summary))
    return int(failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=Path, default=SHARED_UPSTREAM / SNAPSHOTS[0])
    parser.add_argument("--upto", type=int, help="apply only the first N patches (to measure each patch)")
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        return _inside(args.inside)
    with tempfile.TemporaryDirectory(prefix="series-probe-") as tmp:
        stock = unpack(args.archive, Path(tmp) / "stock")
        make_checkout(stock, "upstream", tag="upstream")
        patched = Path(tmp) / "patched"
        git("worktree", "add", "-q", "-b", "syncfree", str(patched), "upstream", cwd=stock)
        import series

        chosen = Path(tmp) / "series"
        chosen.mkdir()
        for patch in series.patch_files()[: args.upto]:
            (chosen / patch.name).write_bytes(patch.read_bytes())
        series.apply(patched, chosen)
        env = dict(os.environ, PYTHONPATH=str(stock / "src"), TORCHMETRICS_SYNCFREE_FORCE="1")
        return subprocess.call([sys.executable, __file__, "--inside", str(patched)], env=env)


if __name__ == "__main__":
    sys.exit(main())
