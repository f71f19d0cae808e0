"""The README's coverage table: regenerate it from the census of TorchMetrics 1.9.0, or check that it is current.

```bash
python tools/coverage_table.py --update   # re-run the census (~1-2 min), rewrite docs/coverage-1.9.0.json and README
python tools/coverage_table.py --check    # README block == the table generated from the record (exit 1 if not)
python tools/coverage_table.py            # print the block generated from the record
```

The census is ``python -m torchmetrics_syncfree audit --all`` (:mod:`torchmetrics_syncfree.tools.census`); the record
keeps its counts and, per patched call, the distinct remaining syncs (op and library line; the command prints their
source lines). ``--update`` needs torchmetrics 1.9.0 installed: the table describes that release. Which optional
packages are installed decides which classes are skipped, so run it in the project's dev environment (scipy and
scikit-learn, no torchvision/torch-fidelity) and say in the commit message if that changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchmetrics_syncfree.tools import census  # noqa: E402

README = ROOT / "README.md"
VERSION = "1.9.0"


def record_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of a census payload: counts, errors, and the patched calls' reasons without sources."""
    rows = []
    for row in payload["rows"]:
        reasons = {
            call: [{key: r[key] for key in ("count", "kind", "op", "at")} for r in entries]
            for call, entries in row["reasons"].get("patched", {}).items()
        }
        rows.append({**{k: v for k, v in row.items() if k != "reasons"}, "reasons": {"patched": reasons}})
    return {**payload, "rows": rows}


def dumps_record(payload: dict[str, Any]) -> str:
    """The record as JSON, one class per line (diffs show which classes changed)."""
    head = {key: value for key, value in payload.items() if key != "rows"}
    lines = [json.dumps(row, separators=(",", ":")) for row in payload["rows"]]
    body = ",\n".join(f"  {line}" for line in lines)
    return json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + body + "\n ]\n}\n"


def update() -> None:
    """Re-run the census, rewrite the record and the README block."""
    import torchmetrics

    if torchmetrics.__version__ != VERSION:
        sys.exit(f"the record describes torchmetrics {VERSION}; installed: {torchmetrics.__version__}")

    def progress(index: int, total: int, name: str) -> None:
        print(f"\r\033[Kcensus {index + 1}/{total}: {name}", end="", file=sys.stderr, flush=True)

    payload = record_payload(census.to_payload(census.census(progress=progress)))
    print(file=sys.stderr)
    (ROOT / census.RECORD).write_text(dumps_record(payload))
    README.write_text(census.replace_block(README.read_text(), census.readme_block(payload)))
    print(census.format_summary(payload))


def check() -> int:
    """Exit status 0 when the README block is the one the record generates; else 1, with how to fix it."""
    expected = census.readme_block(census.load_record(ROOT))
    text = README.read_text()
    if census.BEGIN not in text or census.END not in text:
        print(f"README.md has no {census.BEGIN} ... {census.END} block", file=sys.stderr)
        return 1
    if census.replace_block(text, expected) != text:
        print(
            "README.md's coverage table is not the record's: run python tools/coverage_table.py --update",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run ``--update``, ``--check`` or print the block."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--update", action="store_true", help="re-run the census; rewrite the record and the README")
    group.add_argument("--check", action="store_true", help="exit 1 if the README block is not the record's")
    args = parser.parse_args(argv)
    if args.update:
        update()
        return 0
    if args.check:
        return check()
    print(census.readme_block(census.load_record(ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
