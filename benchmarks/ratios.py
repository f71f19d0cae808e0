#!/usr/bin/env python3
"""Print the patched/stock host-time ratio of every benchmark group of a saved pytest-benchmark run.

    python benchmarks/ratios.py .benchmarks/bench.json            # the table (markdown)
    python benchmarks/ratios.py .benchmarks/bench.json --check    # exit 1 if a target is missed

Two measurements per configuration and call, both from the same run:

* *sequential*: the medians of the stock and the patched benchmark of ``test_catalogue.py``, timed one after the
  other (pytest-benchmark's own statistics);
* *paired*: ``test_paired.py``'s interleaved A/B, the median over rounds of (patched block / stock block) with the
  two blocks timed back to back (rows measured only this way show the paired blocks' medians per call). On a
  shared VM whose speed drifts, this is the ratio to trust; targets are checked against it where it exists.

The memory ratio is the bytes one call allocates, patched over stock (the pairs' ``patched_bytes``/``stock_bytes``);
the peak ratio the most of those bytes alive at once (``patched_peak_bytes``/``stock_peak_bytes``; torch releases
whose storages are new Python objects per call record no peak).

Targets: aggregation: ``MeanMetric.update(loss)`` <= 0.75, every aggregator call <= 1.05; classification: every
``update`` and ``forward`` <= 1.05, also at realistic sizes (10-1000 classes, batch 32-1024: the rows whose
configuration ends in ``batch N``); the same 1.05 for the motivating report's whole metric step (area ``step``).

"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

MEAN_LOSS_UPDATE = ("MeanMetric() update(loss)", "update")
#: areas whose ``update`` and ``forward`` may cost at most 1.05x stock (``step``: the report's step, all metrics)
HOT_PATH_AREAS = ("classification", "step")


#: rows of ``test_paired.py::test_paired_device_path``: the patched GPU code path on CPU tensors vs stock on CPU
DEVICE_PATH_SUFFIX = "(device path)"


def target(row: dict[str, Any]) -> float | None:
    """The target ceiling for a row's ratio, if it has one (none for the GPU code path timed on CPU: informational)."""
    if row["config"].endswith(DEVICE_PATH_SUFFIX):
        return None
    if (row["config"], row["call"]) == MEAN_LOSS_UPDATE:
        return 0.75
    if row["area"] == "aggregation":
        return 1.05
    if row["area"] in HOT_PATH_AREAS and row["call"] in ("update", "forward"):
        return 1.05
    return None


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        if not {"config", "call", "mode"} <= set(info):
            continue  # not one of the stock/patched measurements (e.g. another benchmark module)
        row = pairs.setdefault(
            (info["config"], info["call"]),
            {"config": info["config"], "call": info["call"], "area": info.get("area", "")},
        )
        if info["mode"].startswith("paired"):
            row["paired"] = info["ratio"]
            # per-call medians of the paired blocks: shown where no sequential benchmark measured the row
            row["paired_stock"], row["paired_patched"] = info.get("stock_median"), info.get("patched_median")
            if info.get("stock_bytes"):  # the bytes one call allocates, patched over stock
                row["memory"] = info["patched_bytes"] / info["stock_bytes"]
            if info.get("stock_peak_bytes"):  # the most of them alive at once
                row["peak"] = info["patched_peak_bytes"] / info["stock_peak_bytes"]
        else:
            row[info["mode"]] = bench["stats"]["median"]
    rows = [row for row in pairs.values() if ("stock" in row and "patched" in row) or "paired" in row]
    for row in rows:
        row["ratio"] = row["patched"] / row["stock"] if "stock" in row and "patched" in row else None
        row["checked"] = row.get("paired", row["ratio"])
        row["target"] = target(row)
    return data, rows


def header(data: dict[str, Any]) -> str:
    machine = data.get("machine_info", {})
    commit = data.get("commit_info", {})
    cpu = machine.get("cpu", {}).get("brand_raw") or machine.get("processor") or "?"
    return (
        f"run {data.get('datetime', '?')} | {machine.get('python_implementation', 'Python')}"
        f" {machine.get('python_version', '?')} | {cpu}, {machine.get('cpu', {}).get('count', '?')} cores"
        f" | {machine.get('system', '?')} {machine.get('release', '')} | commit {str(commit.get('id', '?'))[:10]}"
    )


def _cell(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "" if value is None else format(scale * value, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | call | stock median (µs) | patched median (µs) | sequential ratio | paired ratio | target"
        " | memory ratio | peak ratio |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        goal = row["target"]
        verdict = "" if goal is None else f"<= {goal:.2f} {'met' if row['checked'] <= goal else 'MISSED'}"
        stock, patched = row.get("stock", row.get("paired_stock")), row.get("patched", row.get("paired_patched"))
        lines.append(
            f"| {row['config']} | {row['call']} | {_cell(stock, '.1f', 1e6)}"
            f" | {_cell(patched, '.1f', 1e6)} | {_cell(row['ratio'], '.2f')}"
            f" | {_cell(row.get('paired'), '.2f')} | {verdict} | {_cell(row.get('memory'), '.3g')}"
            f" | {_cell(row.get('peak'), '.3g')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, help="a run saved with --benchmark-json (or --benchmark-autosave)")
    parser.add_argument("--area", help="only rows of this area (aggregation, classification, regression, step)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a row misses its target")
    args = parser.parse_args(argv)
    data, rows = load(args.json)
    if args.area:
        rows = [row for row in rows if row["area"] == args.area]
    if not rows:
        print(f"{args.json}: no stock/patched pairs found", file=sys.stderr)
        return 1
    extra = data.get("benchmarks", [{}])[0].get("extra_info", {})
    versions = ", ".join(f"{k} {v}" for k, v in extra.items() if k in ("torch", "torchmetrics"))
    print(header(data) + (f" | {versions}" if versions else ""))
    print()
    print(table(rows))
    missed = [row for row in rows if row["target"] is not None and row["checked"] > row["target"]]
    with_target = [row for row in rows if row["target"] is not None]
    print(f"\n{len(with_target) - len(missed)}/{len(with_target)} targets met (paired ratio where measured)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
