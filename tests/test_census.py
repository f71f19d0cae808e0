"""The census (``audit --all``): every exported class has a specification, the record is current, the README's
coverage table is the record's, and the summary counts what it says."""

from __future__ import annotations

import json
import operator
import sys
from pathlib import Path

import pytest
from lightning_utilities.core.imports import compare_version

from tests import _series_tree
from tests._probing import stock_counts_of_torch_2_13
from torchmetrics_syncfree.__main__ import main
from torchmetrics_syncfree.tools import census

TM_190 = compare_version("torchmetrics", operator.eq, "1.9.0")
#: tree mode: the patched functions are the series' (tests/_series_tree.py), their reads in its files, not the layer's
TREE_MODE = _series_tree.in_tree_mode()
#: where the patched MeanMetric's compute waits for its checks' counters
METRIC_MODULE = "torchmetrics/metric.py:" if TREE_MODE else "torchmetrics_syncfree/metric.py:"
ROOT = Path(__file__).resolve().parent.parent
tm190 = pytest.mark.skipif(not TM_190, reason="the record and the README table describe torchmetrics 1.9.0")

sys.path.insert(0, str(ROOT / "tools"))
import coverage_table  # noqa: E402

# a class of each kind of finding: clean stock and patched, stock syncs fixed by the patch, syncs the patch leaves
# (stock's code), the wrappers' waits on the counters, a compute that reads the checks once
LIVE = ("MeanMetric", "MulticlassAccuracy", "BinaryEER", "PearsonCorrCoef", "MinMaxMetric", "Running", "CramersV")


def test_every_exported_class_has_a_specification_or_a_reason():
    classes = census.exported_classes()
    assert "MeanMetric" in classes and "Metric" not in classes
    assert not any(name.startswith("_") for name in classes), "deprecated aliases are counted under their own name"
    for name, cls in classes.items():
        spec = census.spec_for(name, cls)
        assert spec.skip or spec.spec or spec.build, name


@tm190
def test_the_record_lists_every_class_of_torchmetrics_1_9_0():
    record = census.load_record(ROOT)
    assert record["torchmetrics"] == "1.9.0"
    assert [row["name"] for row in record["rows"]] == list(census.exported_classes())
    assert len(record["rows"]) == 218


@tm190
def test_the_readme_coverage_table_is_generated_from_the_record():
    text = (ROOT / "README.md").read_text()
    block = census.readme_block(census.load_record(ROOT))
    assert block in text, "README.md's coverage table is stale: run python tools/coverage_table.py --update"
    assert coverage_table.check() == 0


@stock_counts_of_torch_2_13
@tm190
@pytest.mark.parametrize("name", LIVE)
def test_the_record_matches_a_live_census(name):
    """The record is what the census measures now (a subset: the whole census takes minutes on 2 cores)."""
    [row] = census.census([name])
    recorded = next(r for r in census.load_record(ROOT)["rows"] if r["name"] == name)
    live = coverage_table.record_payload(census.to_payload([row]))["rows"][0]
    assert live["counts"] == recorded["counts"], "stale record: run python tools/coverage_table.py --update"
    assert _located(live["reasons"]) == _located(recorded["reasons"])


def _located(reasons: dict) -> dict:
    """The recorded reasons of a row; in tree mode without their locations, which name the layer's files."""
    if not TREE_MODE:
        return reasons
    return {
        side: {call: [{k: v for k, v in r.items() if k != "at"} for r in found] for call, found in calls.items()}
        for side, calls in reasons.items()
    }


def _entry(name: str, family: str, stock: tuple[int, int, int], patched: tuple[int, int, int], waits: bool = False):
    calls = census.CALLS
    reasons = {call: [] for call in calls}
    if patched[2]:
        kind = "host wait" if waits else "device-to-host read"
        reasons["compute"] = [{"count": patched[2], "kind": kind, "op": "Tensor.tolist", "at": "x.py:1"}]
    return {
        "name": name,
        "family": family,
        "spec": f"{name}()",
        "skipped": "",
        "errors": {},
        "counts": {"stock": dict(zip(calls, stock)), "patched": dict(zip(calls, patched))},
        "reasons": {"patched": reasons},
    }


def test_the_summary_counts_clean_calls_syncing_classes_and_skips():
    payload = {
        "torchmetrics": "1.9.0",
        "batch": 32,
        "classes": 5,
        "rows": [
            _entry("A", "fam", (2, 2, 0), (0, 0, 1), waits=True),
            _entry("B", "fam", (0, 3, 3), (0, 1, 1)),
            {**_entry("C", "fam", (0, 0, 0), (0, 0, 0)), "skipped": "takes strings, not tensors", "counts": {}},
            {**_entry("D", "other", (1, 1, 1), (0, 0, 0)), "errors": {"patched": "RuntimeError: boom"}},
        ],
    }
    stats = census.family_stats(payload)
    fam = stats["fam"]
    assert (fam.classes, fam.measured, dict(fam.skipped)) == (3, 2, {"takes strings, not tensors": 1})
    assert fam.clean["patched"] == {"update": 2, "forward": 1, "compute": 0}
    assert fam.clean["stock"] == {"update": 1, "forward": 0, "compute": 1}
    assert fam.compute_reads_checks == 1  # A's compute only waits for the checks; B's reads a value
    assert fam.syncing == {"stock": 2, "patched": 1}
    assert stats["other"].syncing["patched"] == 1, "a class that fails patched counts as syncing"
    table = census.format_markdown(payload)
    assert (
        "| fam | 3 | 2/2 (stock 1) | 1/2 (stock 0) | 0/2 (stock 1), 1 read the checks once | 1: takes strings" in table
    )
    assert "| **all** | 4 |" in table


def test_replace_block_keeps_the_rest_of_the_text():
    text = f"intro\n{census.BEGIN}\nold\n{census.END}\noutro\n"
    assert census.replace_block(text, f"{census.BEGIN}\nnew\n{census.END}") == (
        f"intro\n{census.BEGIN}\nnew\n{census.END}\noutro\n"
    )


def test_the_command_line_census_of_one_class(capsys):
    assert main(["audit", "--all", "--only", "MeanMetric", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert row["counts"]["patched"] == {"update": 0, "forward": 0, "compute": 1}  # the NaN check's one read
    [wait] = row["reasons"]["patched"]["compute"]
    assert wait["kind"] == "host wait" and wait["at"].startswith(METRIC_MODULE)
    assert row["counts"]["stock"]["update"] >= 2
    assert row["reasons"]["stock"]["update"][0]["at"].startswith("torchmetrics/aggregation.py:")
    assert main(["audit", "--all", "--only", "MeanMetric", "--markdown"]) == 0
    assert "| aggregation | 1 | 1/1 (stock 0) |" in capsys.readouterr().out
    assert main(["audit", "--all", "--only", "NoSuchMetric"]) == 2


def test_one_data_sized_read_in_the_projects_forward_is_annotated():
    """A forward whose only sync is one read in the project's code (the number of clusters) is annotated, not clean;
    stock's reads (or several) are not."""

    def entry(name: str, at: str, count: int = 1) -> dict:
        row = _entry(name, "fam", (0, 1, 1), (0, count, 0))
        row["reasons"]["patched"]["forward"] = [
            {"count": count, "kind": "device-to-host read", "op": "Tensor.tolist", "at": at}
        ]
        return row

    payload = {
        "torchmetrics": "1.9.0",
        "batch": 32,
        "classes": 5,
        "rows": [
            entry("Once", "torchmetrics_syncfree/clustering/utils.py:137"),
            entry("Stock", "torchmetrics/functional/classification/roc.py:60"),
            entry("Twice", "torchmetrics_syncfree/clustering/utils.py:137", count=2),
        ],
    }
    fam = census.family_stats(payload)["fam"]
    assert (fam.clean["patched"]["forward"], fam.forward_reads_size_once) == (0, 1)
    table = census.format_markdown(payload)
    assert "| fam | 3 | 3/3 (stock 3) | 0/3 (stock 0), 1 read a data-sized length once |" in table
