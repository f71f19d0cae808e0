"""DDP worlds for the tests: each rank runs scenario functions in fresh process groups; every wait is bounded.

A scenario is ``(backend, function)``: ``function(rank, world_size)`` runs in every rank inside a process group of
``backend`` (``"gloo"``, or ``"cuda:gloo"``: on this CPU-only machine a group with a CUDA backend only, so that
collectives on CPU tensors fail as under NCCL) and returns what the rank saw; the group is destroyed afterwards. The
functions must be module-level (the ranks import them by name). Collectives time out after
:data:`TIMEOUT`; a world that is not done after :data:`WORLD_TIMEOUT_S` is killed and the test fails with the stacks
of its ranks.

In tree mode (``tests/_series_tree.py``) the ranks install it themselves before anything is patched, so
``patch_all()`` gives them the patched tree's functions.

"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests import _series_tree

TIMEOUT = timedelta(seconds=45)
WORLD_TIMEOUT_S = 150.0
Scenario = tuple[str, Callable[[int, int], dict[str, Any]]]


def _context() -> Any:
    """Where the platform has it, a fork server that has imported torch and torchmetrics: each rank forks from it
    instead of starting a Python that imports them again (half of a world's time on the 2-core VM, more with the
    CUDA builds of torch). The server never runs tensor code, so its forks start without thread pools to inherit."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchmetrics"])
    return ctx


def _rank_main(scenarios: list[Scenario], rank: int, world_size: int, tmp: str, environ: dict[str, str]) -> None:
    """Run ``scenarios`` one after the other, each in a fresh process group (destroyed and re-initialised).

    ``environ`` is the test's environment when it started the world: the fork server's is the one it started with.
    """
    os.environ.clear()
    os.environ.update(environ)
    out = Path(tmp) / f"rank{rank}.pt"
    faulthandler.dump_traceback_later(WORLD_TIMEOUT_S - 10, exit=True, file=sys.stderr)
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    results: dict[str, Any] = {"tree_mode": None}
    try:
        results["tree_mode"] = _series_tree.install_from_env()  # before anything is patched
        for index, (backend, fn) in enumerate(scenarios):
            init = f"file://{tmp}/store{index}"
            dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size, timeout=TIMEOUT)
            new_group, barrier, all_gather = dist.new_group, dist.barrier, dist.all_gather  # a scenario may spy on them
            try:
                results[f"{fn.__name__}@{backend}"] = fn(rank, world_size)
            finally:
                dist.new_group, dist.barrier, dist.all_gather = new_group, barrier, all_gather
                # every rank done with its collectives before any tears its groups down: torch 2.5's
                # destroy_process_group hung now and then (1 run in 5 on 2 ranks) without this barrier (on a gloo
                # group of its own: the default group may have no CPU backend)
                dist.barrier(group=dist.new_group(backend="gloo"))
                dist.destroy_process_group()
        torch.save({"result": results}, out)
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out)
        raise


def run_world(scenarios: list[Scenario], world_size: int, tmp_path: Path) -> list[dict[str, Any]]:
    """Run ``scenarios`` on ``world_size`` new processes; each rank's results by ``"<function name>@<backend>"``."""
    ctx = _context()
    procs = [
        ctx.Process(target=_rank_main, args=(scenarios, rank, world_size, str(tmp_path), dict(os.environ)), daemon=True)
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + WORLD_TIMEOUT_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for rank in hung:
        procs[rank].kill()
        procs[rank].join(10)
    outcomes = []
    for rank in range(world_size):
        path = tmp_path / f"rank{rank}.pt"
        outcomes.append(torch.load(path, weights_only=False) if path.exists() else {"error": "no result written"})
    errors = {rank: o["error"] for rank, o in enumerate(outcomes) if "error" in o}
    if hung or errors:
        pytest.fail(
            f"{[fn.__name__ for _, fn in scenarios]} on {world_size} ranks: hung ranks {hung}, errors:\n"
            + "\n".join(f"--- rank {rank}:\n{err}" for rank, err in errors.items())
        )
    in_tree_mode = _series_tree.in_tree_mode()
    assert [o["result"].pop("tree_mode") is not None for o in outcomes] == [in_tree_mode] * world_size
    return [o["result"] for o in outcomes]
