"""Host time of the binned precision-recall-curve updates of the series' tree, against the upstream tree under it.

::

    python tools/series_curve_costs.py /work/series-master          # a checkout of `python tools/series.py checkout`
    python tools/series_curve_costs.py --series SRC --upstream SRC  # two ``src`` folders (or site-packages) instead
    python tools/series_curve_costs.py /work/series-master --quick  # one call per side: a smoke test, no timing

A series checkout holds the patched tree (its work tree) and the snapshot it applies on (tag ``upstream``, checked out
in a scratch worktree). Per case: one ``update`` of a metric on CPU tensors (one thread, best of 7 rounds), each side in
its own process, the sides interleaved (3 rounds; the best of them), as a ratio of the series' time to upstream's; and
whether both sides count the same ``confmat`` after that update. Prints a markdown table; exits 1 where the counts
differ.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _upstream import git

#: (name, metric, inputs): binary batches of 32 (ROC validates, AUROC does not), a large batch (upstream's loop over
#: the thresholds), five thresholds given as a list (sorted and unsorted), and multiclass/multilabel at the sizes users
#: keep
CASES = (
    ("BinaryROC(thresholds=100), batch 32", "BinaryROC(thresholds=100)", ("binary", 32, 0)),
    ("BinaryAUROC(thresholds=100), batch 32", "BinaryAUROC(thresholds=100)", ("binary", 32, 0)),
    ("BinaryAveragePrecision(thresholds=100), batch 32", "BinaryAveragePrecision(thresholds=100)", ("binary", 32, 0)),
    ("BinaryROC(thresholds=100), batch 4096", "BinaryROC(thresholds=100)", ("binary", 4096, 0)),
    ("BinaryROC(5 sorted thresholds), batch 32", "BinaryROC(thresholds=[0.1, 0.3, 0.5, 0.7, 0.9])", ("binary", 32, 0)),
    (
        "BinaryROC(5 unsorted thresholds), batch 32",
        "BinaryROC(thresholds=[0.9, 0.1, 0.5, 0.3, 0.7])",
        ("binary", 32, 0),
    ),
    ("MulticlassROC(5, thresholds=100), batch 32", "MulticlassROC(5, thresholds=100)", ("multiclass", 32, 5)),
    ("MulticlassAUROC(10, thresholds=100), batch 256", "MulticlassAUROC(10, thresholds=100)", ("multiclass", 256, 10)),
    (
        "MulticlassAveragePrecision(1000, thresholds=100), batch 32",
        "MulticlassAveragePrecision(1000, thresholds=100)",
        ("multiclass", 32, 1000),
    ),
    ("MultilabelROC(5, thresholds=100), batch 32", "MultilabelROC(5, thresholds=100)", ("multilabel", 32, 5)),
)


def _child(quick: bool) -> None:
    """Time every case with the ``torchmetrics`` on ``sys.path``; print ``{name: [us, checksum]}`` as JSON."""
    import torch
    import torchmetrics.classification as classification

    torch.set_num_threads(1)
    results = {}
    for name, expression, (task, batch, classes) in CASES:
        gen = torch.Generator().manual_seed(batch + classes)
        if task == "binary":
            inputs = torch.rand(batch, generator=gen), torch.randint(2, (batch,), generator=gen)
        elif task == "multiclass":
            preds = torch.randn(batch, classes, generator=gen).softmax(1)
            inputs = preds, torch.randint(classes, (batch,), generator=gen)
        else:
            inputs = torch.rand(batch, classes, generator=gen), torch.randint(2, (batch, classes), generator=gen)
        metric = eval(expression, vars(classification))  # one of the expressions above
        metric.update(*inputs)
        confmat = metric.confmat.flatten()
        checksum = int((confmat * torch.arange(1, confmat.numel() + 1)).sum())
        best = float("inf")
        for _ in range(1 if quick else 7):
            reps = 1 if quick else max(20, 20000 // batch)
            start = time.perf_counter()
            for _ in range(reps):
                metric.update(*inputs)
            best = min(best, (time.perf_counter() - start) / reps)
        results[name] = [best * 1e6, checksum]
    print(json.dumps(results))


def _run_side(src: Path, quick: bool) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", *(["--quick"] if quick else [])],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def _upstream_tree(checkout: Path) -> Iterator[Path]:
    """The checkout's tag ``upstream`` in a scratch worktree (as ``series.py`` makes its scratch trees)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "upstream"
        git("worktree", "add", "-q", "--detach", str(tree), "upstream", cwd=checkout)
        try:
            yield tree / "src"
        finally:
            git("worktree", "remove", "--force", str(tree), cwd=checkout, check=False)
            git("worktree", "prune", cwd=checkout, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("checkout", nargs="?", type=Path, help="a series checkout (tag `upstream`)")
    parser.add_argument("--series", type=Path, help="the patched tree's `src` (instead of a checkout)")
    parser.add_argument("--upstream", type=Path, help="the upstream tree's `src` (instead of a checkout)")
    parser.add_argument("--quick", action="store_true", help="one call per side and no rounds: a smoke test")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.quick)
        return 0
    if args.checkout is not None:
        series, upstream = args.checkout / "src", _upstream_tree(args.checkout)
    elif args.series is not None and args.upstream is not None:
        series, upstream = args.series, contextlib.nullcontext(args.upstream)
    else:
        parser.error("give a series checkout, or both --series and --upstream")
    best: dict[str, dict[str, list[float]]] = {"upstream": {}, "series": {}}
    with upstream as upstream_src:
        for _ in range(1 if args.quick else 3):
            for side, src in (("upstream", upstream_src), ("series", series)):
                for name, (us, checksum) in _run_side(src, args.quick).items():
                    known = best[side].get(name)
                    best[side][name] = [min(us, known[0]) if known else us, checksum]
    differ = []
    print("| case (one `update`, CPU, one thread) | upstream (us) | series (us) | ratio | same counts |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, _, _ in CASES:
        (up_us, up_sum), (our_us, our_sum) = best["upstream"][name], best["series"][name]
        same = up_sum == our_sum
        if not same:
            differ.append(name)
        print(f"| {name} | {up_us:.0f} | {our_us:.0f} | {our_us / up_us:.2f} | {'yes' if same else 'NO'} |")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
