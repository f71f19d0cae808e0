"""Helpers shared by the tools that work with upstream TorchMetrics snapshots and checkouts.

The snapshots (``../shared/upstream/torchmetrics-*.tar.gz``, see the README there) are test fixtures: they are
unpacked into temporary directories, never copied into this project.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_UPSTREAM = REPO.parent / "shared" / "upstream"
#: the snapshots in the order the ``upstream`` tox env tests them (the first one also gets the heavy suites)
SNAPSHOTS = ("torchmetrics-master-dab0333.tar.gz", "torchmetrics-v1.9.0.tar.gz")


def locate_snapshot(path: Path) -> Path:
    """``path`` if it is there, else the snapshot of that name beside the local checkout this one was cloned from.

    The snapshots are not in the repository: they lie in ``shared/upstream/`` beside the workplace's checkout (CI's
    clone sits there too). A clone made elsewhere (``git clone /work/main "$(mktemp -d)"``) finds them through its
    ``origin`` remote when that is a local path; otherwise ``path`` comes back unchanged (the caller reports it
    missing).
    """
    if path.is_file():
        return path
    try:
        origin = subprocess.run(
            ["git", "remote", "get-url", "origin"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return path
    candidate = Path(origin).expanduser().resolve().parent / "shared" / "upstream" / path.name
    return candidate if candidate.is_file() else path


#: committer identity for throw-away checkouts (and for ``git am`` where the checkout has none configured)
GIT_IDENTITY = ("-c", "user.name=torchmetrics-syncfree", "-c", "user.email=syncfree@localhost")


def unpack(archive: Path, dest: Path, prefixes: Sequence[str] | None = None) -> Path:
    """Unpack ``archive`` (or only its members under ``prefixes``) into ``dest``; returns the tree's root."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        if prefixes is not None:
            members = [m for m in members if m.name.startswith(tuple(prefixes))]
        tar.extractall(dest, members=members, filter="data")
    return dest / "torchmetrics"


def git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run git quietly and capture its output (stdout and stderr together)."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if check and result.returncode:
        raise subprocess.CalledProcessError(result.returncode, ["git", *args], result.stdout)
    return result


def make_checkout(tree: Path, message: str, tag: str | None = None) -> None:
    """Turn an unpacked snapshot into a git checkout with a single commit (what ``git am`` needs)."""
    git("init", "-q", cwd=tree)
    git("add", "-A", cwd=tree)
    git(*GIT_IDENTITY, "-c", "commit.gpgsign=false", "commit", "-q", "-m", message, cwd=tree)
    if tag:
        git("tag", tag, cwd=tree)


def snapshot_label(archive: Path) -> str:
    """``torchmetrics-master-dab0333.tar.gz`` -> ``master-dab0333``."""
    return archive.name.removeprefix("torchmetrics-").removesuffix(".tar.gz")
