"""Run TorchMetrics' own unit tests from an upstream snapshot against the *installed* torchmetrics, patched.

The snapshot (``../shared/upstream/torchmetrics-*.tar.gz``) is unpacked into a temporary directory and only its
``tests/`` tree is used: ``src/`` is never put on the path, so the tests exercise the released torchmetrics that is
installed in the environment, with ``torchmetrics_syncfree.patch_all()`` applied by the pytest plugin
(``--syncfree-patch``). Spawned worker processes (upstream's DDP tests) patch themselves through
``TORCHMETRICS_SYNCFREE_AUTOPATCH``.

Usage::

    python tools/upstream_tests.py --archive ../shared/upstream/torchmetrics-v1.9.0.tar.gz -- \
        unittests/bases/test_aggregation.py -n 2

"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _upstream import locate_snapshot, unpack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", required=True, type=Path, help="upstream snapshot tarball")
    parser.add_argument("--stock", action="store_true", help="run without patch_all() (the baseline)")
    parser.add_argument(
        "--device-path",
        action="store_true",
        help="force the patched code's device path on CPU tensors (--syncfree-device-path): the GPU code path",
    )
    parser.add_argument(
        "--process-pool",
        action="store_true",
        help="run upstream's DDP tests in its process pool (USE_PYTEST_POOL=1: fixed ports, so no xdist)",
    )
    parser.add_argument("pytest_args", nargs="*", help="test paths (relative to the tree's tests/) and pytest options")
    args = parser.parse_args(argv)
    args.archive = locate_snapshot(args.archive)
    if not args.archive.is_file():
        parser.error(f"{args.archive} not found (the snapshots live in ../shared/upstream/)")

    with tempfile.TemporaryDirectory(prefix="tm-upstream-") as tmp:
        tests = unpack(args.archive, Path(tmp), prefixes=("torchmetrics/tests/", "torchmetrics/pyproject")) / "tests"
        env = dict(os.environ)
        if args.process_pool:
            env["USE_PYTEST_POOL"] = "1"
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no", "-q", "-rfE"]
        if not args.stock:
            command.append("--syncfree-patch")
            if args.device_path:
                command.append("--syncfree-device-path")
            env["TORCHMETRICS_SYNCFREE_AUTOPATCH"] = "1"
            autopatch = str(Path(__file__).resolve().parent / "autopatch")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [autopatch, env.get("PYTHONPATH")]))
        command += args.pytest_args
        print("+", " ".join(command), f"(in {tests})", flush=True)
        return subprocess.call(command, cwd=tests, env=env)


if __name__ == "__main__":
    sys.exit(main())
