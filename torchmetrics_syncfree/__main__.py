"""Command line: ``python -m torchmetrics_syncfree {demo,audit,gpu-check}`` (also ``torchmetrics-syncfree``).

``demo``
    the motivating report's training loop, with no metrics, stock metrics and patched metrics: steps/s,
    time/step, syncs per step and whether stock and patched agree.
``audit``
    the would-be syncs of ``update``/``forward``/``compute`` of common metric configurations or of the metrics you
    name (``--metric "Accuracy(task='binary')"``), stock vs patched, with the source line of each; ``--all``: the
    census of every metric class TorchMetrics exports (``--markdown``: the README's coverage table).
``gpu-check``
    for a GPU machine without network: the CUDA tests, the ResNet-18 demo and the CUDA audit, in one report file.

"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    from torchmetrics_syncfree.tools.demo import VARIANTS

    p = sub.add_parser("demo", help="training loop: no metrics vs stock vs patched", description=_doc("demo"))
    p.add_argument("--steps", type=int, help="timed steps per variant (default: 200)")
    p.add_argument("--batch-size", type=int, help="default: 32 for the CNN, 128 for ResNet-18")
    p.add_argument("--num-classes", type=int, help="default: 10 for the CNN, 1000 for ResNet-18")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    p.add_argument(
        "--model",
        default="auto",
        choices=("auto", "cnn", "resnet18"),
        help="default: resnet18 on CUDA when torchvision imports, else the project's small CNN",
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)"
    )
    p.add_argument(
        "--average",
        default="macro",
        choices=("micro", "macro", "weighted", "none"),
        help="average of the classification metrics (default: macro)",
    )
    p.add_argument("--log-every", type=int, default=50, help="compute/print/reset every N steps (default: 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before timing (default: 5)")
    p.add_argument("--probe-steps", type=int, default=3, help="steps over which syncs are counted (default: 3)")
    p.add_argument(
        "--chunk",
        type=int,
        default=10,
        help="the variants take turns every CHUNK steps, so background load hits them alike (default: 10)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads on --device cpu (default: 1, steadiest on a small shared machine; 0: torch's default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="do not print the metric values every --log-every steps")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plot", metavar="PNG", help="draw step time per variant into PNG (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON into FILE ('-' for stdout)")
    p.add_argument(
        "--require-agreement",
        action="store_true",
        help="exit 1 if stock and patched metrics give different values on the same inputs (and, on CPU,"
        " if the two training runs end with different values)",
    )


def _audit_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="would-be syncs per metric call, stock vs patched",
        description=_doc("audit"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="SPEC",
        help="a metric to audit, e.g. \"Accuracy(task='binary')\" (repeatable); default: the catalogue",
    )
    p.add_argument(
        "--inputs",
        default="auto",
        choices=(
            "auto",
            "vector",
            "loss",
            "float",
            "weighted",
            "binary",
            "multiclass",
            "multilabel",
            "regression",
            "multioutput",
            "distribution",
            "image",
            "text",
            "segmentation",
            "retrieval",
        ),
        help="what --metric metrics are updated with (default: chosen from the metric's family)",
    )
    p.add_argument("--catalogue", action="store_true", help="audit the catalogue as well as the --metric metrics")
    p.add_argument(
        "--all",
        action="store_true",
        help="the census: every metric class torchmetrics exports, stock vs patched (device path, the checks' host"
        " copy in flight), with the reason of every remaining sync; skipped classes with theirs",
    )
    p.add_argument(
        "--only", action="append", default=[], metavar="CLASS", help="with --all: only this class (repeatable)"
    )
    p.add_argument("--markdown", action="store_true", help="with --all: the per-family coverage table (markdown)")
    p.add_argument(
        "--launches",
        action="store_true",
        help="count kernel launches per update()/forward() instead (stock vs the patched device path, copy in"
        " flight) for the catalogue at --classes; exit 1 with --strict if a patched call is over its budget",
    )
    p.add_argument(
        "--classes", type=int, nargs="+", default=[10, 1000], help="class counts of --launches (default: 10 1000)"
    )
    p.add_argument("--device", default="cpu", help="cpu (would-be syncs) or cuda (real syncs)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--no-sources", action="store_true", help="only the table, not the source line of each sync")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if a patched update() or forward() of an audited metric still syncs",
    )


def _doc(name: str) -> str:
    import importlib

    return importlib.import_module(f"torchmetrics_syncfree.tools.{name}").__doc__.split("\n\n")[0]


def parser() -> argparse.ArgumentParser:
    """The argument parser of the command line, with its ``demo``, ``audit`` and ``gpu-check`` subcommands."""
    from torchmetrics_syncfree.tools import gpu_check

    p = argparse.ArgumentParser(
        prog="torchmetrics-syncfree", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    _audit_parser(sub)
    gpu_check.add_parser(sub)
    return p


def run_demo_command(args: argparse.Namespace) -> int:
    """Run the demo and print its report (plot, JSON if asked); exit status 1 if ``--require-agreement`` fails."""
    from torchmetrics_syncfree.tools.demo import DemoConfig, format_report, plot, run_demo

    config = DemoConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        num_classes=args.num_classes,
        device=args.device,
        model=args.model,
        variants=[v.strip() for v in args.variants.split(",") if v.strip()],
        average=args.average,
        log_every=args.log_every,
        warmup=args.warmup,
        probe_steps=args.probe_steps,
        chunk=args.chunk,
        threads=args.threads or None,
        seed=args.seed,
        quiet=args.quiet,
        progress=not args.no_progress,
    )
    report = run_demo(config)
    print(format_report(report), flush=True)
    if args.plot:
        plot(report, args.plot)
        print(f"\nstep times plotted to {args.plot}")
    if args.json:
        if args.json == "-":
            print(report.to_json())
        else:
            with open(args.json, "w") as f:
                f.write(report.to_json())
    if args.require_agreement and not report.agrees():
        print("stock and patched final metric values differ", file=sys.stderr)
        return 1
    return 0


def _with_progress(name: str, run: Callable[[Callable[[int, int, str], None]], Any]) -> Any:
    """``run(progress)``, where ``progress`` shows "name i/n: label" on a terminal's stderr (cleared at the end)."""

    def progress(index: int, total: int, label: str) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\r\033[K{name} {index + 1}/{total}: {label}")
            sys.stderr.flush()

    try:
        return run(progress)
    finally:
        if sys.stderr.isatty():
            sys.stderr.write("\r\033[K")


def run_audit_command(args: argparse.Namespace) -> int:
    """Run the audit, print tables or JSON; exit status 2 if it cannot run, 1 if ``--strict`` fails."""
    from torchmetrics_syncfree.tools import audit

    if args.launches:
        return _run_launch_audit(args)
    if args.all:
        return _run_census(args)

    try:
        results = _with_progress(
            "audit",
            lambda progress: audit.audit(
                args.metric, inputs=args.inputs, device=args.device, include_catalogue=args.catalogue, progress=progress
            ),
        )
    except (audit.SpecError, RuntimeError) as err:
        print(f"torchmetrics-syncfree audit: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(audit.to_json(results, args.device))
    elif args.no_sources:
        print(audit.format_table(results))
    else:
        print(audit.report(results, args.device))
    bad = audit.patched_syncs(results)
    if args.strict and bad:
        print(f"\n--strict: patched update()/forward() still syncs for: {'; '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def _run_census(args: argparse.Namespace) -> int:
    from torchmetrics_syncfree.tools import audit, census

    try:
        rows = _with_progress("census", lambda progress: census.census(args.only, args.device, progress))
    except (audit.SpecError, RuntimeError) as err:
        print(f"torchmetrics-syncfree audit: {err}", file=sys.stderr)
        return 2
    payload = census.to_payload(rows, args.device)
    if args.json:
        print(json.dumps(payload, indent=1))
    elif args.markdown:
        print(census.format_markdown(payload))
    else:
        print(census.format_text(payload) + "\n\n" + census.format_summary(payload))
    syncing = [row.name for row in rows if not row.skipped and row.syncs("patched")]
    if args.strict and syncing:
        print(f"\n--strict: patched update()/forward() still syncs for: {', '.join(syncing)}", file=sys.stderr)
        return 1
    return 0


def _run_launch_audit(args: argparse.Namespace) -> int:
    from torchmetrics_syncfree.tools import audit

    try:
        results = audit.launch_audit(args.classes, args.metric, include_catalogue=args.catalogue)
    except (audit.SpecError, RuntimeError) as err:
        print(f"torchmetrics-syncfree audit: {err}", file=sys.stderr)
        return 2
    if args.json:
        payload = [
            {"config": r.config.label, "classes": r.classes, "launches": r.launches, "ops": r.ops} for r in results
        ]
        print(json.dumps(payload, indent=2))
    else:
        print(audit.format_launch_table(results))
    over = [
        f"{r.config.label} ({r.classes}) {call}" for r in results for call in audit.LAUNCH_CALLS if r.over_budget(call)
    ]
    if args.strict and over:
        print(f"\n--strict: over the launch budget: {'; '.join(over)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the chosen subcommand and return its exit status."""
    args = parser().parse_args(argv)
    if args.command == "demo":
        return run_demo_command(args)
    if args.command == "gpu-check":
        from torchmetrics_syncfree.tools import gpu_check

        return gpu_check.main(args)
    return run_audit_command(args)


if __name__ == "__main__":
    sys.exit(main())
