"""Count would-be syncs (``SyncProbe``) of the aggregation calls on an upstream snapshot, unpatched vs patched tree.

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
from pathlib import Path

from _upstream import REPO, SHARED_UPSTREAM, SNAPSHOTS, git, make_checkout, unpack


def _calls() -> dict[str, tuple[type, object, object]]:
    """The calls of the project's sync acceptance tests (``tests/test_aggregation_syncs.py``)."""
    from torchmetrics.aggregation import MeanMetric

    from tests._aggregation_cases import AGGREGATORS, STRATEGIES
    from tests.test_aggregation_syncs import MEAN_CALLS, NAN_VEC, VEC

    calls = {}
    for strategy in STRATEGIES:
        for name, call in MEAN_CALLS.items():
            calls[f"MeanMetric({strategy!r}).{name}"] = (MeanMetric, strategy, call)
        for cls in AGGREGATORS:
            for label, value in (("vec", VEC), ("vec with nan", NAN_VEC)):
                calls[f"{cls.__name__}({strategy!r}).update({label})"] = (cls, strategy, lambda m, v=value: m.update(v))
    return calls


def _count(patched: bool) -> dict[str, int]:
    from contextlib import nullcontext, suppress

    from torchmetrics_syncfree import SyncProbe
    from torchmetrics_syncfree import patched as patched_context

    counts = {}
    with patched_context() if patched else nullcontext(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (cls, strategy, call) in _calls().items():
            metric = cls(nan_strategy=strategy)
            with SyncProbe() as probe, suppress(RuntimeError):  # stock raises at once for "error" on a NaN batch
                call(metric)
            counts[name] = probe.count
    return counts


def _inside(tree: Path) -> int:
    sys.path.insert(0, str(REPO))
    from tests import _series_tree

    _series_tree.install(tree)
    stock, patched = _count(patched=False), _count(patched=True)
    for name in stock:
        print(f"{name:52} stock {stock[name]}  patched tree {patched[name]}")
    for label, counts in (("stock (unpatched tree)", stock), ("patched tree", patched)):
        calls = sum(1 for c in counts.values() if c)
        print(f"{label}: {sum(counts.values())} events in {calls} of {len(counts)} calls")
    return 1 if any(patched.values()) else 0


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
