"""benchmarks/ratios.py on a small hand-made pytest-benchmark JSON (no timing is measured here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ratios():
    spec = importlib.util.spec_from_file_location("ratios", ROOT / "benchmarks" / "ratios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(config, call, mode, area, median):
    info = {"config": config, "call": call, "mode": mode, "area": area, "torch": "2.13.0", "torchmetrics": "1.9.0"}
    return {"group": f"{config} :: {call}", "extra_info": info, "stats": {"median": median}}


def _write(tmp_path, benchmarks):
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps(
            {
                "machine_info": {"python_version": "3.11", "cpu": {"count": 2}},
                "commit_info": {"id": "abc"},
                "datetime": "now",
                "benchmarks": benchmarks,
            }
        )
    )
    return path


def _paired(config, call, area, ratio, medians=None, allocated=None, peak=None):
    info = {"config": config, "call": call, "mode": "paired", "area": area, "ratio": ratio}
    if medians is not None:
        info["stock_median"], info["patched_median"] = medians
    if allocated is not None:
        info["stock_bytes"], info["patched_bytes"] = allocated
    if peak is not None:
        info["stock_peak_bytes"], info["patched_peak_bytes"] = peak
    return {"group": f"paired :: {call}", "extra_info": info, "stats": {"median": 1e-3}}


def test_ratio_table_and_targets(tmp_path, capsys):
    path = _write(
        tmp_path,
        [
            _bench("MeanMetric() update(loss)", "update", "stock", "aggregation", 40e-6),
            _bench("MeanMetric() update(loss)", "update", "patched", "aggregation", 20e-6),
            _bench("SumMetric() update(loss)", "forward", "stock", "aggregation", 100e-6),
            _bench("SumMetric() update(loss)", "forward", "patched", "aggregation", 110e-6),
            _bench("Accuracy(task='binary')", "update", "stock", "classification", 50e-6),
            _bench("Accuracy(task='binary')", "update", "patched", "classification", 60e-6),
            _paired("Accuracy(task='binary')", "update", "classification", 1.03),
            _bench("Accuracy(task='binary')", "compute", "stock", "classification", 50e-6),
            _bench("Accuracy(task='binary')", "compute", "patched", "classification", 60e-6),
            _paired("R2Score()", "update", "regression", 1.5),
            _paired(
                "F1Score(num_classes=1000) batch 1024", "forward", "classification", 1.2, None, (8e6, 2e5), (4e6, 4e5)
            ),
            _paired("report step: MeanMetric(loss) + Accuracy/... batch 128", "update", "step", 1.01, (6e-3, 6.06e-3)),
            {"group": "other", "extra_info": {}, "stats": {"median": 1.0}},
        ],
    )
    ratios = _ratios()
    assert ratios.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| MeanMetric() update(loss) | update | 40.0 | 20.0 | 0.50 |  | <= 0.75 met |  |" in out
    assert "| SumMetric() update(loss) | forward | 100.0 | 110.0 | 1.10 |  | <= 1.05 MISSED |  |" in out
    # the paired ratio decides where it exists: 1.20 sequential, 1.03 paired
    assert "| Accuracy(task='binary') | update | 50.0 | 60.0 | 1.20 | 1.03 | <= 1.05 met |  |" in out
    assert "| Accuracy(task='binary') | compute | 50.0 | 60.0 | 1.20 |  |  |  |" in out  # no compute target
    assert "| R2Score() | update |  |  |  | 1.50 |  |  |" in out
    assert (
        "| F1Score(num_classes=1000) batch 1024 | forward |  |  |  | 1.20 | <= 1.05 MISSED | 0.025 | 0.1 |" in out
    )  # the bytes one call allocates, the most alive at once
    assert "| R2Score() | update |  |  |  | 1.50 |  |  |  |" in out  # no bytes measured: empty cells
    assert (
        "| report step: MeanMetric(loss) + Accuracy/... batch 128 | update | 6000.0 | 6060.0 |  | 1.01"
        " | <= 1.05 met |  |" in out
    )
    assert "3/5 targets met" in out
    assert ratios.main([str(path), "--check"]) == 1
    assert ratios.main([str(path), "--check", "--area", "classification"]) == 1
    assert ratios.main([str(path), "--check", "--area", "step"]) == 0


def test_no_pairs_is_an_error(tmp_path):
    path = _write(tmp_path, [_bench("MeanMetric() update(loss)", "update", "stock", "aggregation", 1e-6)])
    assert _ratios().main([str(path)]) == 1
