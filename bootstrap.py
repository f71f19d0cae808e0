#!/usr/bin/env python3
"""Set up and run this project on a fresh machine that has nothing but Python 3.10+.

    python3 bootstrap.py demo [demo options]   # the training-loop demo: stock vs patched, syncs/step and time/step
    python3 bootstrap.py test [tox options]    # the whole test suite (every tox environment of the default envlist)

Creates .bootstrap/venv with tox in it (once), then lets tox build every environment it needs: the CPU build of
torch is pinned by constraints/cpu.txt. Everything it creates is git-ignored.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".bootstrap" / "venv"
TOX = "tox>=4.20,<5"
# what the default envlist's environments hold at their peak (tm17, tm19, one upstream and one support-matrix folder
# at a time, lightning): about 11 GB; below this, pip fails deep inside an environment with "No space left on device"
SUITE_DISK_BYTES = 15 * 2**30


def _python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_tox() -> Path:
    python = _python()
    if not python.exists():
        print(f"bootstrap: creating {VENV.relative_to(ROOT)}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    probe = subprocess.run([python, "-c", "import tox"], capture_output=True)
    if probe.returncode:
        subprocess.check_call([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", TOX])
    return python


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print(__doc__)
        return 2
    free = shutil.disk_usage(ROOT).free
    if argv[0] == "test" and free < SUITE_DISK_BYTES:
        print(
            f"bootstrap: warning: {free / 2**30:.1f} GB free under {ROOT}; the whole suite's environments need about"
            f" {SUITE_DISK_BYTES / 2**30:.0f} GB",
            flush=True,
        )
    python = ensure_tox()
    command, rest = argv[0], argv[1:]
    tox_args = ["-e", "demo", "--", *rest] if command == "demo" else rest
    return subprocess.call([python, "-m", "tox", "-c", str(ROOT / "tox.ini"), *tox_args], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
