"""Offline GPU check: the CUDA tests, the ResNet-18 demo and the CUDA audit, summed up in one report file.

``python -m torchmetrics_syncfree gpu-check [--report FILE]`` is for a GPU machine without network access that
already holds torch with CUDA, torchmetrics, pytest, hypothesis and torchvision (Lightning too, for the rest of the
suite). From a checkout of this repository::

    pip install --no-deps --no-build-isolation .
    python -m torchmetrics_syncfree gpu-check --report gpu-check.md

It refuses to run without CUDA (exit status 2, nothing is measured), then runs, each in its own process:

1. the cuda-marked tests, ``pytest -p no:xdist -m cuda --syncfree-require-cuda tests``, from the checkout (they
   assert ``torch.cuda.set_sync_debug_mode("error")`` around patched updates, and CUDA parity with stock);
2. the training-loop demo with ResNet-18, ``demo --device cuda --model resnet18 --require-agreement --json ...``:
   no metrics vs stock vs patched, step time, real syncs per step, stock-patched agreement;
3. the audit of the metric catalogue on CUDA, ``audit --device cuda --json``: real syncs per call, stock vs patched.

The report (markdown, the raw data as JSON at its end) names the GPU and the torch, CUDA and torchmetrics versions.
The exit status is 0 only if every step succeeded.

"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The checkout's test command; ``-o addopts=`` drops ``--benchmark-disable`` from setup.cfg, because an offline
#: machine may lack pytest-benchmark (no test under tests/ uses it).
TEST_COMMAND = ("-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=", "-ra", "--strict-markers")
DEFAULT_REPORT = "gpu-check-report.md"
#: Longest a step may run before it is stopped and reported as failed.
STEP_TIMEOUT_S = 3600
#: How much of a failed step's output the report keeps.
OUTPUT_TAIL_CHARS = 4000


class CudaUnavailableError(RuntimeError):
    """The GPU check was started where torch sees no CUDA device."""


@dataclass
class Step:
    """One command the check ran (or could not run): its exit status, duration and the end of its output."""

    name: str
    command: list[str]
    returncode: int | None = None  # None: not run, see ``note``
    seconds: float = 0.0
    output_tail: str = ""
    note: str = ""

    @property
    def ok(self) -> bool:
        """Whether the command ran and exited with status 0."""
        return self.returncode == 0


@dataclass
class TestCounts:
    """Outcome counts of the CUDA test run, read from pytest's JUnit XML."""

    passed: int
    failed: int
    errors: int
    skipped: int


@dataclass
class GpuCheck:
    """Everything the check found: environment, each step and what it measured."""

    environment: dict[str, Any]
    tests: Step
    demo: Step
    audit: Step
    test_counts: TestCounts | None = None
    demo_data: dict[str, Any] | None = None  # the demo's --json output
    audit_data: dict[str, Any] | None = None  # the audit's --json output
    started: str = field(default_factory=lambda: datetime.datetime.now().astimezone().isoformat(timespec="seconds"))

    @property
    def steps(self) -> list[Step]:
        """The three steps in the order they run."""
        return [self.tests, self.demo, self.audit]

    @property
    def ok(self) -> bool:
        """Whether every step succeeded and the CUDA tests ran at all."""
        counts = self.test_counts
        return all(step.ok for step in self.steps) and counts is not None and counts.passed > 0


Runner = Callable[[Sequence[str], Path], subprocess.CompletedProcess]


def _run_subprocess(command: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False)


# ----------------------------------------------------------------------------------------------- environment


def require_cuda() -> None:
    """Raise :class:`CudaUnavailableError`, saying which torch build is installed, unless CUDA is usable."""
    import torch

    if not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise CudaUnavailableError(
            f"gpu-check needs a CUDA GPU, but torch {torch.__version__} ({build}) sees none"
            " (torch.cuda.is_available() is False). Nothing was measured."
        )


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (no nvidia-smi)"
    out = subprocess.run(
        [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"


def environment() -> dict[str, Any]:
    """The GPUs, the driver and the versions of everything the check depends on."""
    import torch
    import torchmetrics

    from torchmetrics_syncfree import __version__

    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
        )
    return {
        "gpus": gpus,
        "driver": _driver_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "torchmetrics": torchmetrics.__version__,
        "torchmetrics_syncfree": __version__,
        **{name: _version(name) for name in ("torchvision", "lightning", "pytest", "hypothesis")},
    }


# ----------------------------------------------------------------------------------------------- steps


def _run_step(name: str, command: list[str], cwd: Path, runner: Runner) -> tuple[Step, str]:
    """Run one step; returns it and its standard output (the audit prints its JSON there)."""
    print(f"gpu-check: {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    step = Step(name, command)
    start = time.perf_counter()
    try:
        done = runner(command, cwd)
    except subprocess.TimeoutExpired:
        step.seconds = time.perf_counter() - start
        step.note = f"stopped after {STEP_TIMEOUT_S} s"
        print(f"gpu-check: {name}: {step.note}", file=sys.stderr, flush=True)
        return step, ""
    step.seconds = time.perf_counter() - start
    step.returncode = done.returncode
    step.output_tail = ((done.stdout or "") + (done.stderr or ""))[-OUTPUT_TAIL_CHARS:]
    print(f"gpu-check: {name}: exit status {done.returncode} after {step.seconds:.0f} s", file=sys.stderr, flush=True)
    return step, done.stdout or ""


def read_junit(path: Path) -> TestCounts | None:
    """Counts from pytest's ``--junitxml`` file; ``None`` if pytest did not write one (it stopped before tests)."""
    if not path.is_file():
        return None
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors", "skipped")}
    failed, errors, skipped = total["failures"], total["errors"], total["skipped"]
    return TestCounts(total["tests"] - failed - errors - skipped, failed, errors, skipped)


def _plugin_installed() -> bool:
    return any(entry.name == "syncfree" for entry in importlib.metadata.entry_points(group="pytest11"))


def run_tests(repo: Path, scratch: Path, runner: Runner) -> tuple[Step, TestCounts | None]:
    """The cuda-marked tests of the checkout at ``repo``; not run (and reported so) without tests/ or the plugin."""
    junit = scratch / "cuda-tests.xml"
    command = [sys.executable, *TEST_COMMAND, "-m", "cuda", "--syncfree-require-cuda", f"--junitxml={junit}", "tests"]
    if not (repo / "tests" / "conftest.py").is_file():
        return Step(
            "CUDA tests", command, note=f"not run: {repo} has no tests/ (run gpu-check from the checkout)"
        ), None
    if not _plugin_installed():
        note = "not run: the pytest plugin is not installed (pip install --no-deps --no-build-isolation .)"
        return Step("CUDA tests", command, note=note), None
    step, _ = _run_step("CUDA tests", command, repo, runner)
    return step, read_junit(junit)


def run_demo(repo: Path, scratch: Path, runner: Runner, steps: int | None = None) -> tuple[Step, dict | None]:
    """The ResNet-18 training-loop demo, no metrics vs stock vs patched, with its JSON results."""
    out = scratch / "demo.json"
    command = [sys.executable, "-m", "torchmetrics_syncfree", "demo", "--device", "cuda", "--model", "resnet18"]
    command += ["--require-agreement", "--no-progress", "--quiet", "--json", str(out)]
    if steps is not None:
        command += ["--steps", str(steps)]
    step, _ = _run_step("demo", command, repo, runner)
    return step, json.loads(out.read_text()) if out.is_file() else None


def run_audit(repo: Path, runner: Runner) -> tuple[Step, dict | None]:
    """The catalogue's real syncs per call on CUDA, stock vs patched."""
    command = [sys.executable, "-m", "torchmetrics_syncfree", "audit", "--device", "cuda", "--json"]
    step, stdout = _run_step("audit", command, repo, runner)
    try:
        return step, json.loads(stdout) if step.ok else None
    except json.JSONDecodeError:
        step.note = "the audit's output is not JSON"
        step.returncode = step.returncode or 1
        return step, None


def run_check(repo: Path, runner: Runner = _run_subprocess, demo_steps: int | None = None) -> GpuCheck:
    """Run the three steps (CUDA must be available) and collect what they measured."""
    require_cuda()
    env = environment()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        scratch = Path(tmp)
        tests, counts = run_tests(repo, scratch, runner)
        demo, demo_data = run_demo(repo, scratch, runner, demo_steps)
        audit, audit_data = run_audit(repo, runner)
    return GpuCheck(env, tests, demo, audit, counts, demo_data, audit_data)


# ----------------------------------------------------------------------------------------------- report


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _shown(command: list[str]) -> str:
    """The command as one types it (``python`` for the interpreter's path)."""
    return " ".join(["python", *command[1:]])


def _headline(check: GpuCheck) -> list[str]:
    """Stock vs patched in one line each: step time and syncs per step of the demo."""
    data = check.demo_data
    if data is None:
        return []
    by_variant = {result["variant"]: result for result in data["results"]}
    ratio = data.get("paired", {}).get("patched/stock")
    if ratio is None or not {"stock", "patched"} <= set(by_variant):
        return []
    stock, patched = by_variant["stock"], by_variant["patched"]
    return [
        f"Demo ({data['config']['model']}, batch {data['config']['batch_size']}): patched step time"
        f" {ratio['median']:.3f}x stock (median of {ratio['rounds']} per-round ratios, IQR"
        f" {ratio['q1']:.3f}-{ratio['q3']:.3f}); stock {stock['summary']['median']:.2f} ms/step with"
        f" {stock['syncs_per_step']:g} syncs/step, patched {patched['summary']['median']:.2f} ms/step with"
        f" {patched['syncs_per_step']:g} syncs/step.",
        "",
    ]


def _environment_lines(env: dict[str, Any]) -> list[str]:
    gpus = "; ".join(f"{g['name']} (compute capability {g['capability']}, {g['memory_gib']} GiB)" for g in env["gpus"])
    return [
        f"- GPU: {gpus or 'none'}; driver {env['driver']}",
        f"- torch {env['torch']} (CUDA {env['cuda']}, cuDNN {env['cudnn']}), Python {env['python']}",
        f"- torchmetrics {env['torchmetrics']}, torchmetrics_syncfree {env['torchmetrics_syncfree']}",
        f"- torchvision {env['torchvision']}, lightning {env['lightning']}, pytest {env['pytest']},"
        f" hypothesis {env['hypothesis']}",
    ]


def _tests_lines(check: GpuCheck) -> list[str]:
    step, counts = check.tests, check.test_counts
    lines = ["## CUDA tests", "", f"`{_shown(step.command)}` (in the checkout)", ""]
    if step.returncode is None:
        return [*lines, f"**{step.note}**"]
    if counts is None:
        return [
            *lines,
            f"**pytest stopped before running tests (exit status {step.returncode}); see its output below**",
        ]
    return [
        *lines,
        f"{counts.passed} passed, {counts.failed} failed, {counts.errors} errors, {counts.skipped} skipped"
        f" (exit status {step.returncode}, {step.seconds:.0f} s)",
    ]


def _no_results(step: Step) -> str:
    why = step.note or f"exit status {step.returncode}"
    return f"**no results ({why}; see the end of its output under Commands)**"


def _section(title: str, step: Step, data: dict[str, Any] | None, body: Callable[[dict], list[str]]) -> list[str]:
    """A report section: its title, then what ``body`` makes of the step's data, or why there is none."""
    return [f"## {title}", "", *(body(data) if data is not None else [_no_results(step)])]


def _demo_body(data: dict[str, Any]) -> list[str]:
    config = data["config"]
    lines = [
        f"{config['model']} on {config['device']}, batch {config['batch_size']}, {config['num_classes']} classes,"
        f" average={config['average']!r}, {config['steps']} timed steps per variant in interleaved rounds of"
        f" {config['chunk']}; {data['sync_counting']}",
        "",
        "| variant | ms/step (median round) | IQR of rounds | steps/s | syncs/step |",
        "|---|---:|---:|---:|---:|",
    ]
    for result in data["results"]:
        spread = result["summary"]
        lines.append(
            f"| {result['variant']} | {spread['median']:.2f} | {spread['q1']:.2f}-{spread['q3']:.2f}"
            f" | {result['steps'] / result['seconds']:.1f} | {result['syncs_per_step']:g} |"
        )
    lines.append("")
    for pair, ratio in data.get("paired", {}).items():
        lines.append(
            f"- step time {pair} per round: median {ratio['median']:.3f} (IQR {ratio['q1']:.3f}-{ratio['q3']:.3f},"
            f" {ratio['rounds']} rounds)"
        )
    for key, label in (("agreement", "training runs"), ("replay_agreement", "same outputs replayed")):
        agreement = data.get(key)
        if agreement is not None:
            verdict = "agree" if agreement["agree"] else "DIFFER"
            diff = agreement["max_abs_diff"]
            lines.append(f"- stock and patched metric values, {label}: {verdict} (max |difference| {diff:.3g})")
    return lines


def _audit_body(data: dict[str, Any]) -> list[str]:
    from torchmetrics_syncfree.tools.audit import CALLS

    results = data["results"]
    lines = [
        f"{len(results)} configurations on {data['device']}, sync-free areas: {', '.join(data['sync_free_areas'])}",
        "",
        "| call | stock syncs (sum) | patched syncs (sum) | configurations syncing stock | patched |",
        "|---|---:|---:|---:|---:|",
    ]
    for call in CALLS:
        stock = [r["counts"].get("stock", {}).get(call, 0) for r in results]
        patched = [r["counts"].get("patched", {}).get(call, 0) for r in results]
        syncing = sum(1 for n in stock if n), sum(1 for n in patched if n)
        lines.append(f"| {call} | {sum(stock)} | {sum(patched)} | {syncing[0]} | {syncing[1]} |")
    still = [
        r["config"]
        for r in results
        if r["covered_by_patch"] and any(r["counts"].get("patched", {}).get(call, 0) for call in ("update", "forward"))
    ]
    failed = [f"{r['config']} ({mode}: {error})" for r in results for mode, error in r["errors"].items()]
    lines.append("")
    lines.append(f"- patched update()/forward() that still sync in a sync-free area: {', '.join(still) or 'none'}")
    lines.append(f"- configurations that could not run: {'; '.join(failed) or 'none'}")
    return lines


def _commands_lines(check: GpuCheck) -> list[str]:
    lines = ["## Commands", "", "| step | result | exit status | seconds |", "|---|---|---:|---:|"]
    for step in check.steps:
        status = "not run" if step.returncode is None else str(step.returncode)
        lines.append(f"| {step.name} | {_verdict(step.ok)} | {status} | {step.seconds:.0f} |")
    for step in check.steps:
        if not step.ok and step.output_tail:
            lines += [
                "",
                f"<details><summary>{step.name}: end of the output</summary>",
                "",
                "```",
                step.output_tail.rstrip(),
                "```",
                "",
                "</details>",
            ]
    return lines


def format_report(check: GpuCheck) -> str:
    """The markdown report: verdict, environment, each step's results, commands, and the raw data as JSON."""
    failed = [step.name for step in check.steps if not step.ok]
    if check.test_counts is not None and check.test_counts.passed == 0 and "CUDA tests" not in failed:
        failed.insert(0, "CUDA tests (none passed)")
    lines = [
        "# torchmetrics-syncfree GPU check",
        "",
        f"Run {check.started}. Result: **{_verdict(check.ok)}**" + (f" ({', '.join(failed)})" if failed else ""),
        "",
        *_headline(check),
        *_environment_lines(check.environment),
        "",
        *_tests_lines(check),
        "",
        *_section("Training-loop demo: no metrics vs stock vs patched", check.demo, check.demo_data, _demo_body),
        "",
        *_section("CUDA audit: real syncs per call, stock vs patched", check.audit, check.audit_data, _audit_body),
        "",
        *_commands_lines(check),
        "",
        "## Raw data",
        "",
        "```json",
        json.dumps(asdict(check), indent=2, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- command line


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``gpu-check`` subcommand's options."""
    p = sub.add_parser(
        "gpu-check",
        help="offline GPU check: CUDA tests, ResNet-18 demo, CUDA audit, one report file",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--report", default=DEFAULT_REPORT, help=f"the report file to write (default: {DEFAULT_REPORT})")
    p.add_argument("--repo", default=".", help="the repository checkout whose tests/ to run (default: .)")
    p.add_argument("--demo-steps", type=int, help="timed demo steps per variant (default: the demo's)")


def main(args: argparse.Namespace, runner: Runner = _run_subprocess) -> int:
    """Run the check and write the report; exit status 2 without CUDA, 1 if a step failed, else 0."""
    try:
        check = run_check(Path(args.repo).resolve(), runner, args.demo_steps)
    except CudaUnavailableError as err:
        print(f"torchmetrics-syncfree gpu-check: FAILED: {err}", file=sys.stderr)
        return 2
    report = Path(args.report)
    report.write_text(format_report(check))
    print(f"gpu-check: {_verdict(check.ok)}; report written to {report}", file=sys.stderr)
    return 0 if check.ok else 1
