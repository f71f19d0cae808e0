"""``compute()`` latency of a CPU metric under a process group without a CPU backend, 2 ranks on CPU.

This process is rank 0 of a ``"cuda:gloo"`` world (the NCCL situation: no CPU backend) and times
``metric.compute()``; a spawned peer (rank 1) mirrors every round without timing. Cases:

``stock_gloo`` / ``patched_gloo``
    the metric's ``process_group`` is a plain gloo group over the same ranks: stock, and patched (where the patch
    only checks the group's backends): the baseline.
``fallback_first``
    the metric syncs on WORLD; the fallback cache is emptied before every round, so each ``compute()`` creates the
    gloo group (the first ``compute()`` of a run).
``fallback_later``
    the metric syncs on WORLD through the cached gloo group (every later ``compute()``).

The added latency is ``fallback_* - stock_gloo``. Run with
``pytest benchmarks/test_ddp_fallback.py --benchmark-enable -p no:xdist`` (with benchmarks disabled, the default
in ``setup.cfg``, every case runs once, as a smoke test).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchmetrics.aggregation import CatMetric, MeanMetric

import torchmetrics_syncfree
from torchmetrics_syncfree import distributed as sfd

TIMEOUT = timedelta(seconds=60)
ROUNDS = {"fallback_first": 15}
DEFAULT_ROUNDS = 100
CASES = ("stock_gloo", "patched_gloo", "fallback_first", "fallback_later")
METRICS = ("mean", "cat")


def _setup(case: str, kind: str, gloo: Any) -> Any:
    """Patch or unpatch, build and update the metric; identical on both ranks, not timed."""
    if case == "stock_gloo":
        torchmetrics_syncfree.unpatch_all()
    else:  # only this area: the aggregation patches change compute() too
        torchmetrics_syncfree.patch_all(areas=["distributed"])
    if case == "fallback_first":
        sfd._fallbacks.clear()  # the next sync on WORLD creates the gloo group again
    group = gloo if case.endswith("_gloo") else None
    if kind == "mean":
        metric = MeanMetric(process_group=group)
        metric.update(torch.rand(1))
    else:
        metric = CatMetric(process_group=group)
        metric.update(torch.rand(1000 + dist.get_rank()))  # uneven lengths: the padded gather
    return metric


def _round(case: str, kind: str, gloo: Any) -> None:
    _setup(case, kind, gloo).compute()


def _peer(rank: int, init: str, commands: Any) -> None:
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("cuda:gloo", init_method=init, rank=rank, world_size=2, timeout=TIMEOUT)
    gloo = dist.new_group(backend="gloo")
    while True:
        command = commands.get(timeout=TIMEOUT.total_seconds())
        if command is None:
            break
        case, kind, rounds = command
        for _ in range(rounds):
            _round(case, kind, gloo)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, Any]]:
    """This process as rank 0, a spawned peer as rank 1; yields (command queue, plain gloo group)."""
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    commands = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        peer = ctx.Process(target=_peer, args=(1, init, commands), daemon=True)
        peer.start()
        dist.init_process_group("cuda:gloo", init_method=init, rank=0, world_size=2, timeout=TIMEOUT)
        try:
            yield commands, dist.new_group(backend="gloo")
        finally:
            commands.put(None)
            peer.join(TIMEOUT.total_seconds())
            if peer.is_alive():
                peer.kill()
            dist.destroy_process_group()
            torchmetrics_syncfree.unpatch_all()
            sfd.set_fallback_mode(None)


@pytest.mark.ddp
@pytest.mark.parametrize("kind", METRICS)
@pytest.mark.parametrize("case", CASES)
def test_compute_latency(benchmark: Any, world: tuple[Any, Any], case: str, kind: str) -> None:
    commands, gloo = world
    rounds = 1 if benchmark.disabled else ROUNDS.get(case, DEFAULT_ROUNDS)
    commands.put((case, kind, rounds))
    benchmark.group = f"ddp-fallback-{kind}"
    benchmark.pedantic(lambda metric: metric.compute(), setup=lambda: ((_setup(case, kind, gloo),), {}), rounds=rounds)
