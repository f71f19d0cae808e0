"""``compute()`` under DDP: collectives, host reads and wall time per ``compute()``, stock vs patched.

A real gloo world on this machine's CPU, 2 and 4 ranks: this process is rank 0 and times ``compute()``; spawned
peers mirror every round without timing. Cases (``kind``):

``collection``
    ``MetricCollection`` of multiclass macro Accuracy, Precision, Recall and F1 (one compute group) and a
    ``MeanMetric``, 5 classes, 3 updates per rank;
``metric``
    one multiclass macro ``Accuracy``;
``forward``
    the collection above with ``dist_sync_on_step=True`` on every member: one ``forward`` step (``collection(preds,
    target)``) after the 3 updates, instead of ``compute()``.

Before the timed rounds, one ``compute()`` of each case runs with the ``torch.distributed`` collectives counted and
a CPU :class:`~torchmetrics_syncfree.SyncProbe` active (the device path: what a GPU run would do), recorded in the
benchmark's ``extra_info``: ``collectives``, ``all_gather``, ``barrier``, ``host_reads`` (device-to-host reads) and
``host_waits`` (the check counters' one read). Run with
``pytest benchmarks/test_ddp_sync.py --benchmark-enable -p no:xdist`` (with benchmarks disabled, the default in
``setup.cfg``, every case runs once on 2 ranks, as a smoke test).
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
from torchmetrics import MetricCollection
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

import torchmetrics_syncfree
from torchmetrics_syncfree import SyncProbe

TIMEOUT = timedelta(seconds=60)
ROUNDS = 50
NUM_CLASSES = 5
CASES = ("stock", "patched")
KINDS = ("collection", "metric", "forward")
_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_reduce", "broadcast", "barrier")


def _setup(case: str, kind: str) -> Any:
    """Patch or unpatch, build and update; identical on every rank, not timed."""
    if case == "stock":
        torchmetrics_syncfree.unpatch_all()
    else:
        torchmetrics_syncfree.patch_all()
    on_step = {"dist_sync_on_step": kind == "forward"}
    kwargs = {"num_classes": NUM_CLASSES, "average": "macro", **on_step}
    if kind == "metric":
        metric: Any = MulticlassAccuracy(**kwargs)
    else:
        metric = MetricCollection(
            {
                "acc": MulticlassAccuracy(**kwargs),
                "prec": MulticlassPrecision(**kwargs),
                "rec": MulticlassRecall(**kwargs),
                "f1": MulticlassF1Score(**kwargs),
                "loss": MeanMetric(**on_step),
            },
            compute_groups=True,
        )
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(3):
        metric.update(torch.randint(0, NUM_CLASSES, (32,), generator=gen), torch.randint(0, NUM_CLASSES, (32,)))
    return metric


def _measured(kind: str) -> Any:
    """The call measured: ``compute()``, or for ``forward`` one step on a batch of this rank's."""
    if kind != "forward":
        return lambda metric: metric.compute()
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    batch = (torch.randint(0, NUM_CLASSES, (32,), generator=gen), torch.randint(0, NUM_CLASSES, (32,), generator=gen))
    return lambda metric: metric(*batch)


def _counted(case: str, kind: str) -> dict[str, int]:
    """One measured call (:func:`_measured`) with the collectives counted and a CPU probe active."""
    metric = _setup(case, kind)
    calls: list[str] = []
    originals = {name: getattr(dist, name) for name in _COLLECTIVES}

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return originals[name](*args, **kwargs)

        return call

    for name in _COLLECTIVES:
        setattr(dist, name, counting(name))
    try:
        with SyncProbe() as probe:
            _measured(kind)(metric)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    counts = probe.counts()
    return {
        "collectives": len(calls),
        "all_gather": calls.count("all_gather"),
        "barrier": calls.count("barrier"),
        "host_reads": counts.get("device-to-host read", 0),
        "host_waits": counts.get("host wait", 0),
    }


def _peer(rank: int, world_size: int, init: str, commands: Any) -> None:
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size, timeout=TIMEOUT)
    while True:
        command = commands.get(timeout=TIMEOUT.total_seconds())
        if command is None:
            break
        case, kind, rounds = command
        _counted(case, kind)
        for _ in range(rounds):
            _measured(kind)(_setup(case, kind))
    dist.destroy_process_group()
    torchmetrics_syncfree.unpatch_all()


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def world(request: pytest.FixtureRequest) -> Iterator[tuple[int, list[Any]]]:
    """This process as rank 0 and spawned peers; yields (world size, the peers' command queues)."""
    world_size = request.param
    config = request.config
    if world_size > 2 and config.getoption("benchmark_disable") and not config.getoption("benchmark_enable"):
        pytest.skip("the smoke run (benchmarks disabled) uses 2 ranks")
    if sys.platform == "linux":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    queues = [ctx.Queue() for _ in range(1, world_size)]
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        peers = [
            ctx.Process(target=_peer, args=(rank, world_size, init, queue), daemon=True)
            for rank, queue in zip(range(1, world_size), queues)
        ]
        for peer in peers:
            peer.start()
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=world_size, timeout=TIMEOUT)
        try:
            yield world_size, queues
        finally:
            for queue in queues:
                queue.put(None)
            for peer in peers:
                peer.join(TIMEOUT.total_seconds())
                if peer.is_alive():
                    peer.kill()
            dist.destroy_process_group()
            torchmetrics_syncfree.unpatch_all()


@pytest.mark.ddp
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_compute(benchmark: Any, world: tuple[int, list[Any]], case: str, kind: str) -> None:
    world_size, queues = world
    rounds = 1 if benchmark.disabled else ROUNDS
    for queue in queues:
        queue.put((case, kind, rounds))
    benchmark.group = f"ddp-compute-{kind}-{world_size}ranks"
    benchmark.extra_info.update(_counted(case, kind))
    benchmark.pedantic(_measured(kind), setup=lambda: ((_setup(case, kind),), {}), rounds=rounds)
    if case == "patched":  # the target: one collective, no host read in the sync
        assert benchmark.extra_info["collectives"] == 1 and benchmark.extra_info["host_reads"] == 0
