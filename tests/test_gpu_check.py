"""``gpu-check`` on CPU: its refusal without CUDA, and the report it writes from (fake) step results."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from torchmetrics_syncfree.__main__ import main, parser
from torchmetrics_syncfree.tools import audit, demo, gpu_check

# the GPU check's command line and report, independent of the installed release: latest release only (see tox.ini)
pytestmark = pytest.mark.slow

ENVIRONMENT = {
    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.1}],
    "driver": "550.54.15",
    "python": "3.12.3",
    "torch": "2.8.0+cu128",
    "cuda": "12.8",
    "cudnn": 91002,
    "torchmetrics": "1.9.0",
    "torchmetrics_syncfree": "0.1.0",
    "torchvision": "0.23.0",
    "lightning": "2.6.6",
    "pytest": "8.4.1",
    "hypothesis": "6.135.0",
}
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="{errors}" failures="{failed}" skipped="1" tests="{tests}" time="3.2">
</testsuite></testsuites>"""


@pytest.fixture(scope="module")
def demo_json() -> str:
    """The JSON of a real (tiny, CPU) demo run: the report must read what the demo writes."""
    config = demo.DemoConfig(steps=4, batch_size=4, log_every=2, warmup=0, probe_steps=1, chunk=2, progress=False)
    return demo.run_demo(config, stream=io.StringIO()).to_json()


@pytest.fixture(scope="module")
def audit_json() -> str:
    """The JSON of a real audit of two configurations on CPU."""
    return audit.to_json(audit.audit(["MeanMetric()", "Accuracy(task='binary')"]))


class FakeRunner:
    """Plays the three subprocesses: writes the JUnit XML and demo JSON they would write, prints the audit JSON."""

    def __init__(self, demo_json: str, audit_json: str, failed_tests: int = 0) -> None:
        self.demo_json, self.audit_json, self.failed_tests = demo_json, audit_json, failed_tests
        self.commands: list[list[str]] = []

    def __call__(self, command: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
        command = list(command)
        self.commands.append(command)
        if "pytest" in command:
            junit = Path(next(a for a in command if a.startswith("--junitxml=")).split("=", 1)[1])
            junit.write_text(JUNIT.format(errors=0, failed=self.failed_tests, tests=11 + self.failed_tests))
            code = 1 if self.failed_tests else 0
            return subprocess.CompletedProcess(command, code, "FAILED tests/test_cuda_aggregation.py::x\n", "")
        if "demo" in command:
            Path(command[command.index("--json") + 1]).write_text(self.demo_json)
            return subprocess.CompletedProcess(command, 0, "demo table\n", "")
        return subprocess.CompletedProcess(command, 0, self.audit_json, "")


@pytest.fixture
def on_a_fake_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_check, "require_cuda", lambda: None)
    monkeypatch.setattr(gpu_check, "environment", lambda: ENVIRONMENT)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text("")
    return tmp_path


def _check(report: Path, repo: Path, runner: FakeRunner) -> int:
    args = parser().parse_args(["gpu-check", "--report", str(report), "--repo", str(repo), "--demo-steps", "7"])
    return gpu_check.main(args, runner=runner)


def test_without_cuda_it_fails_loudly_and_measures_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = tmp_path / "report.md"
    assert main(["gpu-check", "--report", str(report)]) == 2
    err = capsys.readouterr().err
    assert "FAILED: gpu-check needs a CUDA GPU" in err
    assert "Nothing was measured" in err
    assert not report.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_the_command_line_refuses_without_cuda(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "torchmetrics_syncfree", "gpu-check", "--report", str(tmp_path / "r.md")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "needs a CUDA GPU" in out.stderr
    assert not (tmp_path / "r.md").exists()


def test_the_report_from_passing_steps(tmp_path, checkout, on_a_fake_gpu, demo_json, audit_json, capsys):
    runner = FakeRunner(demo_json, audit_json)
    report = tmp_path / "report.md"
    assert _check(report, checkout, runner) == 0
    assert "report written to" in capsys.readouterr().err
    text = report.read_text()
    assert "Result: **PASS**" in text
    assert "NVIDIA H100 80GB HBM3 (compute capability 9.0, 79.1 GiB); driver 550.54.15" in text
    assert "torch 2.8.0+cu128 (CUDA 12.8, cuDNN 91002)" in text
    assert "torchmetrics 1.9.0" in text
    assert "10 passed, 0 failed, 0 errors, 1 skipped (exit status 0" in text
    demo_data = json.loads(demo_json)
    for result in demo_data["results"]:
        spread = result["summary"]
        assert f"| {result['variant']} | {spread['median']:.2f} | {spread['q1']:.2f}-{spread['q3']:.2f} |" in text
    assert "step time patched/stock per round: median" in text
    ratio = demo_data["paired"]["patched/stock"]
    assert f"patched step time {ratio['median']:.3f}x stock (median of {ratio['rounds']} per-round ratios" in text
    assert "`python -m pytest -p no:xdist" in text
    assert "stock and patched metric values, same outputs replayed: agree" in text
    assert "2 configurations on cpu" in text
    stock_syncs = [r["counts"]["stock"]["update"] for r in json.loads(audit_json)["results"]]
    assert all(stock_syncs), "both configurations sync in stock update()"
    assert f"| update | {sum(stock_syncs)} | 0 | 2 | 0 |" in text
    assert "still sync in a sync-free area: none" in text
    raw = json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert raw["environment"] == ENVIRONMENT
    assert raw["test_counts"] == {"passed": 10, "failed": 0, "errors": 0, "skipped": 1}
    pytest_command, demo_command, audit_command = runner.commands
    assert pytest_command[1:3] == ["-m", "pytest"] and "--syncfree-require-cuda" in pytest_command
    assert pytest_command[-1] == "tests" and pytest_command[pytest_command.index("-m", 3) + 1] == "cuda"
    assert demo_command[3:][:5] == ["demo", "--device", "cuda", "--model", "resnet18"]
    assert demo_command[-2:] == ["--steps", "7"]
    assert audit_command[3:] == ["audit", "--device", "cuda", "--json"]


def test_failed_tests_fail_the_check_and_show_their_output(tmp_path, checkout, on_a_fake_gpu, demo_json, audit_json):
    report = tmp_path / "report.md"
    assert _check(report, checkout, FakeRunner(demo_json, audit_json, failed_tests=2)) == 1
    text = report.read_text()
    assert "Result: **FAIL** (CUDA tests)" in text
    assert "10 passed, 2 failed, 0 errors, 1 skipped (exit status 1" in text
    assert "FAILED tests/test_cuda_aggregation.py::x" in text


def test_without_tests_the_check_says_so_and_fails(tmp_path, on_a_fake_gpu, demo_json, audit_json):
    report = tmp_path / "report.md"
    runner = FakeRunner(demo_json, audit_json)
    assert _check(report, tmp_path, runner) == 1
    assert f"not run: {tmp_path} has no tests/ (run gpu-check from the checkout)" in report.read_text()
    assert [c[3] for c in runner.commands] == ["demo", "audit"], "the other steps still run"


def test_steps_without_results_are_reported(tmp_path, checkout, on_a_fake_gpu):
    def crashing(command: Sequence[str], cwd: Path) -> Any:
        return subprocess.CompletedProcess(list(command), 3, "", "Traceback: CUDA error: out of memory\n")

    report = tmp_path / "report.md"
    assert _check(report, checkout, crashing) == 1
    text = report.read_text()
    assert "pytest stopped before running tests (exit status 3)" in text
    assert text.count("**no results (exit status 3; see the end of its output under Commands)**") == 2
    assert "CUDA error: out of memory" in text


def test_read_junit(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT.format(errors=1, failed=2, tests=9))
    assert gpu_check.read_junit(path) == gpu_check.TestCounts(passed=5, failed=2, errors=1, skipped=1)
    assert gpu_check.read_junit(tmp_path / "missing.xml") is None


def test_the_command_line_lists_gpu_check():
    assert "gpu-check" in parser().format_help()
    assert parser().parse_args(["gpu-check"]).report == gpu_check.DEFAULT_REPORT


def test_without_the_installed_plugin_the_tests_are_not_run(tmp_path, checkout, on_a_fake_gpu, monkeypatch):
    monkeypatch.setattr(gpu_check, "_plugin_installed", lambda: False)
    step, counts = gpu_check.run_tests(checkout, tmp_path, runner=None)
    assert (step.returncode, counts, step.ok) == (None, None, False)
    assert "pip install --no-deps --no-build-isolation ." in step.note
