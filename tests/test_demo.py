"""The main-job demo, on a few tiny steps (no timing is asserted: the machine is shared and noisy)."""

from __future__ import annotations

import dataclasses
import io
import json
import statistics
import subprocess
import sys

import pytest
import torch

from torchmetrics_syncfree.__main__ import main
from torchmetrics_syncfree.tools import demo
from torchmetrics_syncfree.tools.audit import registered_areas

# the demo's command line and report: the same on every installed release (each area's sync counts are checked per
# release by its own tests), so run with the latest release only (the `slow` marker's meaning in tox.ini)
pytestmark = pytest.mark.slow

TINY = {"steps": 4, "batch_size": 8, "log_every": 2, "warmup": 1, "probe_steps": 2, "chunk": 3, "progress": False}


@pytest.fixture(scope="module")
def report() -> demo.DemoReport:
    return demo.run_demo(demo.DemoConfig(**TINY), stream=io.StringIO())


def test_all_three_variants_ran(report):
    assert [r.variant for r in report.results] == ["none", "stock", "patched"]
    for result in report.results:
        assert result.steps == TINY["steps"]
        assert len(result.step_ms) == TINY["steps"]
        assert result.seconds > 0


def test_stock_syncs_at_least_twice_per_step_and_patched_loses_the_aggregation_syncs(report):
    none, stock, patched = (report.result(v) for v in ("none", "stock", "patched"))
    assert none.syncs_per_step == 0
    assert stock.syncs_per_step >= 2
    assert any("torchmetrics/aggregation.py" in s["location"] for s in stock.sync_sources)
    assert not any("aggregation.py" in s["location"] for s in patched.sync_sources)
    assert patched.syncs_per_step <= stock.syncs_per_step - 2
    if "classification" in registered_areas():
        assert patched.syncs_per_step == 0, patched.sync_sources


def test_stock_and_patched_agree(report):
    agree, _ = report.agreement()
    assert agree, (report.result("stock").final_values, report.result("patched").final_values)
    assert report.replay_agreement()[0], report.replay
    assert report.agrees()
    report_with_a_difference = demo.DemoReport(
        report.config,
        report.versions,
        report.sync_counting,
        report.results,
        {"stock": {"loss": 1.0}, "patched": {"loss": 1.5}},
    )
    assert not report_with_a_difference.agrees()
    assert set(report.result("stock").final_values) == set(demo.METRIC_NAMES)


def test_table_and_json(report):
    text = demo.format_report(report)
    for word in ("steps/s", "ms/step", "syncs/step", "agree: yes", "replayed", "stock", "patched", "none"):
        assert word in text
    payload = json.loads(report.to_json())
    assert payload["agreement"]["agree"] is True
    assert payload["versions"]["torchmetrics"]


def test_stock_variant_refuses_to_run_patched(syncfree):
    with pytest.raises(RuntimeError, match="stock TorchMetrics"):
        demo.run_demo(demo.DemoConfig(**{**TINY, "variants": ["stock"]}), stream=io.StringIO())


def test_patched_variant_leaves_torchmetrics_stock(report):
    import torchmetrics_syncfree

    assert not any(torchmetrics_syncfree.is_patched(t) for t in torchmetrics_syncfree.declared_targets())


def test_cli_runs_a_subset_and_writes_json_and_plot(tmp_path, capsys):
    out = tmp_path / "demo.json"
    argv = [
        "demo",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--log-every",
        "1",
        "--warmup",
        "0",
        "--probe-steps",
        "1",
        "--variants",
        "stock,patched",
        "--no-progress",
        "--quiet",
        "--json",
        str(out),
        "--require-agreement",
    ]
    try:
        import matplotlib  # noqa: F401

        argv += ["--plot", str(tmp_path / "demo.png")]
    except ImportError:
        pass
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "stock and patched final metric values agree: yes" in text
    assert [r["variant"] for r in json.loads(out.read_text())["results"]] == ["stock", "patched"]
    if "--plot" in argv:
        assert (tmp_path / "demo.png").stat().st_size > 0


def test_bad_options():
    with pytest.raises(ValueError, match="unknown variant"):
        demo.DemoConfig(variants=["fast"]).resolve()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="sees no GPU"):
            demo.DemoConfig(device="cuda").resolve()


def test_progress_writes_plain_lines_off_a_terminal():
    stream = io.StringIO()
    progress = demo.Progress("stock", 8, stream)
    for done in range(1, 9):
        progress.update(done)
    lines = stream.getvalue().splitlines()
    assert 2 <= len(lines) <= 5
    assert lines[-1].startswith("stock    8/8 steps")


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "torchmetrics_syncfree", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "demo" in out.stdout and "audit" in out.stdout


def test_gpu_runs_fail_loudly_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--syncfree-require-cuda",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert "no CUDA device is available" in out.stderr


def test_every_variant_is_timed_per_round_in_the_same_rounds(report):
    rounds = -(-TINY["steps"] // TINY["chunk"])  # the last round is shorter
    for result in report.results:
        assert len(result.round_ms) == rounds
        assert result.rounds.rounds == rounds
        assert result.rounds.min <= result.rounds.median <= result.rounds.max
    payload = json.loads(report.to_json())
    assert set(payload["paired"]) == {"stock/none", "patched/none", "patched/stock"}
    stock, patched = report.result("stock"), report.result("patched")
    ratios = [p / s for s, p in zip(stock.round_ms, patched.round_ms)]
    assert payload["paired"]["patched/stock"]["median"] == pytest.approx(statistics.median(ratios))
    assert payload["results"][0]["summary"]["rounds"] == rounds


def test_spread_of_rounds():
    spread = demo.Spread.of([4.0, 1.0, 3.0, 2.0, 100.0])
    assert (spread.median, spread.q1, spread.q3, spread.min, spread.max, spread.rounds) == (3, 2, 4, 1, 100, 5)
    assert spread.holds(2.5) and not spread.holds(5.0)
    assert demo.Spread.of([7.0]) == demo.Spread(7.0, 7.0, 7.0, 7.0, 7.0, 1)


def _with_rounds(report: demo.DemoReport, rounds: dict[str, list[float]]) -> demo.DemoReport:
    results = [dataclasses.replace(r, round_ms=rounds[r.variant]) for r in report.results]
    return dataclasses.replace(report, results=results)


@pytest.mark.parametrize(
    ("patched_ms", "words"),
    [
        ([12.0, 12.5, 13.0, 12.2, 12.8], "patched is slower than stock beyond the spread"),
        ([8.0, 8.5, 9.0, 8.2, 8.8], "patched is faster than stock beyond the spread"),
        ([9.0, 11.0, 10.5, 9.6, 10.1], "no difference this run can resolve"),
    ],
)
def test_the_report_says_what_the_spread_allows_to_conclude(report, patched_ms, words):
    rounds = {"none": [5.0, 5.0, 5.0, 5.0, 5.0], "stock": [10.0] * 5, "patched": patched_ms}
    text = demo.format_report(_with_rounds(report, rounds))
    assert words in text
    assert "+100% (+100%..+100%)" in text, "stock vs none, per round"
    assert "5 rounds of 3 steps" in text


def test_the_cpu_report_says_what_cpu_times_mean(report):
    text = " ".join(demo.format_report(report).split())
    assert "on CPU a sync costs nothing" in text
    assert "host overhead only" in text
    assert "only --device cuda measures it" in text
