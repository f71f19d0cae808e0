"""Metric states synced over process groups without a backend for their device, in spawned worlds.

``init_process_group("cuda:gloo")`` on this CPU-only machine builds a group with a CUDA backend only: collectives on
CPU tensors fail exactly as under NCCL. Each test spawns one world (2 or 4 ranks) and runs every check in it, stock
first, then patched, then unpatched; the ranks write what they saw to files, and the assertions run here. Every wait
is bounded (`tests/_ddp_world.py`): collectives time out after :data:`_ddp_world.TIMEOUT`, a world that is not
done after :data:`_ddp_world.WORLD_TIMEOUT_S` is killed and the test fails with the stacks of its ranks.

In tree mode (``tests/_series_tree.py``) the ranks install it themselves (:func:`_rank_main`), so ``patch_all()``
gives them the patched tree's functions; the fallback's mode, group and cache are then the tree's (:class:`_Fallback`).

"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchmetrics import MetricCollection
from torchmetrics.aggregation import CatMetric, MaxMetric, MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from tests import _ddp_world, _series_tree

pytestmark = pytest.mark.ddp

NO_CPU_BACKEND = "No backend type associated with device type cpu"
NUM_CLASSES = 4
#: values per rank: uneven, and rank 2 of a 4-rank world sees no data at all
LENGTHS = (4, 7, 0, 2)
STEPS = 3


# ----------------------------------------------------------------------------------------------------- the data --
def _data(rank: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1234 + rank)
    n = LENGTHS[rank]
    return {
        "values": torch.randn(n, generator=gen),
        "weights": torch.rand(n, generator=gen),
        "preds": torch.randint(0, NUM_CLASSES, (8 + rank,), generator=gen),
        "target": torch.randint(0, NUM_CLASSES, (8 + rank,), generator=gen),
        "steps": [torch.randn(2 + rank, generator=gen) for _ in range(STEPS)],
    }


def _suite(
    ranks: list[int], group: Any | None = None, native: Any | None = None, only: str | None = None
) -> dict[str, Any]:
    """Every checked metric fed with the data of ``ranks`` (one rank under DDP, all of them for the reference).

    ``group`` is the metrics' ``process_group``; ``native`` that of the collection member that must not need the
    fallback (a gloo group over the same ranks). ``only`` runs just the metric of that name.

    """
    data = [_data(rank) for rank in ranks]
    out: dict[str, Any] = {}

    def run(name: str, metric: Any, feed: Callable[[Any, dict[str, Any]], Any]) -> None:
        if only not in (None, name):
            return
        for d in data:
            feed(metric, d)
        out[name] = metric.compute()

    run("mean", MeanMetric(process_group=group), lambda m, d: m.update(d["values"], d["weights"]))
    run("sum", SumMetric(process_group=group), lambda m, d: m.update(d["values"]))
    run("max", MaxMetric(process_group=group), lambda m, d: m.update(d["values"]))
    run("cat", CatMetric(process_group=group), lambda m, d: m.update(d["values"]))
    run("cat_cpu", CatMetric(compute_on_cpu=True, process_group=group), lambda m, d: m.update(d["values"]))
    run("acc", MulticlassAccuracy(NUM_CLASSES, process_group=group), lambda m, d: m.update(d["preds"], d["target"]))
    collection = MetricCollection(
        {
            "mean": MeanMetric(process_group=group),
            "sum_native": SumMetric(process_group=native),
            "cat_cpu": CatMetric(compute_on_cpu=True, process_group=group),
            "max": MaxMetric(process_group=group),
        }
    )
    run("collection", collection, lambda m, d: m.update(d["values"]))
    # under DDP, forward() syncs each batch; a single-process reference has no cross-rank batch (_step_reference)
    if len(ranks) == 1 and only is None:
        step = MeanMetric(dist_sync_on_step=True, process_group=group)
        out["step_forward"] = torch.stack([step(batch) for batch in data[0]["steps"]])
        out["step_compute"] = step.compute()
    return out


def _step_reference(ranks: list[int]) -> dict[str, torch.Tensor]:
    steps = [torch.cat([_data(rank)["steps"][k] for rank in ranks]).mean() for k in range(STEPS)]
    everything = torch.cat([torch.cat(_data(rank)["steps"]) for rank in ranks]).mean()
    return {"step_forward": torch.stack(steps), "step_compute": everything}


def _error(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


class _Spy:
    """Counts ``torch.distributed.new_group`` calls and records the groups ``barrier`` and ``all_gather`` run on."""

    def __init__(self) -> None:
        self.new_groups = 0
        self.collective_groups: list[Any] = []
        new_group, barrier, all_gather = dist.new_group, dist.barrier, dist.all_gather

        def counting_new_group(*args: Any, **kwargs: Any) -> Any:
            self.new_groups += 1
            return new_group(*args, **kwargs)

        def recording_barrier(*args: Any, **kwargs: Any) -> Any:
            self.collective_groups.append(kwargs.get("group", args[0] if args else None))
            return barrier(*args, **kwargs)

        def recording_all_gather(*args: Any, **kwargs: Any) -> Any:
            self.collective_groups.append(kwargs.get("group", args[2] if len(args) > 2 else None))
            return all_gather(*args, **kwargs)

        dist.new_group, dist.barrier, dist.all_gather = counting_new_group, recording_barrier, recording_all_gather


class _Fallback:
    """The fallback's mode switch, group and cache: the layer's, or in tree mode the patched tree's."""

    def __init__(self) -> None:
        from torchmetrics_syncfree import distributed as sfd

        self.layer = sfd
        self.tree = _series_tree.series_module("torchmetrics.utilities.distributed")

    def set_mode(self, mode: str | None) -> None:
        if self.tree is None:
            self.layer.set_fallback_mode(mode)
        elif mode is None:
            os.environ.pop(self.tree._DDP_FALLBACK_ENV, None)
        else:
            os.environ[self.tree._DDP_FALLBACK_ENV] = mode

    def group(self, group: Any | None = None) -> Any:
        """The group CPU states of ``group`` are gathered on (created if needed)."""
        if self.tree is None:
            return self.layer.fallback_group(group)
        if self.tree._needs_ddp_fallback(torch.empty(0), group):
            return self.tree._gloo_fallback_group(group)
        return dist.group.WORLD if group is None else group

    def cached(self) -> int:
        return len(self.layer._fallbacks if self.tree is None else self.tree._gloo_fallback_groups)


# ----------------------------------------------------------------------------------------------- the scenarios --
def _cuda_only_world(rank: int, world_size: int) -> dict[str, Any]:
    """A world whose groups have no CPU backend, like NCCL; checks stock, patched (both modes), unpatched."""
    import torchmetrics_syncfree

    fallbacks = _Fallback()
    halves = [list(range(world_size // 2)), list(range(world_size // 2, world_size))]
    gloo_all = dist.new_group(backend="gloo")
    subgroups = [dist.new_group(ranks) for ranks in halves] if world_size == 4 else []
    gloo_subgroups = [dist.new_group(ranks, backend="gloo") for ranks in halves] if world_size == 4 else []
    spy = _Spy()
    out: dict[str, Any] = {"stock_errors": {}}
    # what this torch build says of a CUDA tensor without a GPU: a CPU-only build and a CUDA build without a driver
    # differ, and so does stock's failure on a cuda-only group here
    out["no_cuda_error"] = None if torch.cuda.is_available() else _error(lambda: torch.zeros(1, device="cuda"))
    for name in ("mean", "cat"):  # each fails on its own; one suite run would stop at the first
        out["stock_errors"][name] = _error(lambda name=name: _suite([rank], only=name))

    torchmetrics_syncfree.patch_all()
    spy.collective_groups.clear()
    out["world"] = _suite([rank], None, gloo_all)
    fallback = fallbacks.group()
    kinds = {id(fallback): "fallback", id(gloo_all): "native"}  # the collection's native member syncs on gloo_all
    out["collective_groups"] = sorted({kinds.get(id(group), "other") for group in spy.collective_groups})
    out["world_again"] = _suite([rank], None, gloo_all)
    out["fallback_cached"] = fallbacks.group() is fallback
    out["new_groups_world"] = spy.new_groups
    out["gloo"] = _suite([rank], gloo_all, gloo_all)
    out["gloo_is_own_fallback"] = fallbacks.group(gloo_all) is gloo_all
    out["new_groups_gloo"] = spy.new_groups
    if subgroups:
        out["sub"] = _suite([rank], subgroups[rank // 2], gloo_subgroups[rank // 2])
        out["new_groups_sub"] = spy.new_groups
        out["gloo_sub"] = _suite([rank], gloo_subgroups[rank // 2], gloo_subgroups[rank // 2])

    fallbacks.set_mode("off")
    out["off_error"] = _error(lambda: _suite([rank], only="mean"))
    fallbacks.set_mode("device")
    if torch.cuda.is_available():
        out["device"] = _suite([rank], None, gloo_all)
    else:  # the state is sent to the group's device, which this machine does not have
        out["device_error"] = _error(lambda: _suite([rank], only="mean"))
    fallbacks.set_mode(None)
    out["new_groups_final"] = spy.new_groups

    torchmetrics_syncfree.unpatch_all()
    out["unpatched_error"] = _error(lambda: _suite([rank], only="mean"))
    return out


def _gloo_world(rank: int, world_size: int) -> dict[str, Any]:
    """A plain gloo world: patched must be stock, with no extra group."""
    import torchmetrics_syncfree

    spy = _Spy()
    out = {"stock": _suite([rank])}
    torchmetrics_syncfree.patch_all()
    out["patched"] = _suite([rank])
    out["fallback_is_world"] = _Fallback().group() is dist.group.WORLD
    out["new_groups"] = spy.new_groups
    return out


def _reinit_world(rank: int, world_size: int) -> dict[str, Any]:
    """A new cuda-only world in processes whose earlier world had a fallback group: a new one must be made."""
    import torchmetrics_syncfree

    spy = _Spy()
    torchmetrics_syncfree.patch_all()
    out = {"patched": _suite([rank], only="mean"), "new_groups": spy.new_groups}
    out["cached"] = _Fallback().cached()  # the dead world's group is forgotten, not kept alive
    return out


SCENARIOS = {
    "cuda_only": ("cuda:gloo", _cuda_only_world),
    "gloo": ("gloo", _gloo_world),
    "reinit": ("cuda:gloo", _reinit_world),
}


def run_world(scenarios: list[str], world_size: int, tmp_path: Path) -> list[dict[str, Any]]:
    """Run the named scenarios of :data:`SCENARIOS`; each rank's results by scenario name."""
    results = _ddp_world.run_world([SCENARIOS[name] for name in scenarios], world_size, tmp_path)
    names = {f"{SCENARIOS[name][1].__name__}@{SCENARIOS[name][0]}": name for name in scenarios}
    return [{names[fn]: value for fn, value in res.items()} for res in results]


def _assert_equal_results(got: dict[str, Any], expected: dict[str, Any], exact: bool = True) -> None:
    assert got.keys() == expected.keys()
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], msg=name, **tolerance)


def _reference(ranks: list[int]) -> dict[str, Any]:
    reference = _suite(ranks)
    if len(ranks) > 1:
        reference.update(_step_reference(ranks))
    return reference


# --------------------------------------------------------------------------------------------------- the tests --
def _check_cuda_only(results: list[dict[str, Any]]) -> None:
    world_size = len(results)
    whole = _reference(list(range(world_size)))
    halves = [list(range(world_size // 2)), list(range(world_size // 2, world_size))]
    for rank, res in enumerate(results):
        # the reproduction: stock fails like under NCCL, and again after unpatching; "off" keeps stock behaviour
        # (a CPU-only torch build fails in the collective; a CUDA build on a machine without a GPU may fail before it,
        # at a CUDA call, with that build's words)
        failures = (f"RuntimeError: {NO_CPU_BACKEND}", res["no_cuda_error"])
        for failure in (*res["stock_errors"].values(), res["unpatched_error"], res["off_error"]):
            assert failure in failures
        # patched: same as on a gloo group over the same ranks, and as one process that saw every rank's data
        _assert_equal_results(res["world"], res["gloo"])
        _assert_equal_results(res["world_again"], res["gloo"])
        _assert_equal_results(res["world"], whole, exact=False)
        # one gloo group for WORLD, created on first use and then reused, and every collective went through it
        assert res["new_groups_world"] == 1
        assert res["fallback_cached"]
        assert res["collective_groups"] == ["fallback", "native"]
        assert res["gloo_is_own_fallback"]
        assert res["new_groups_gloo"] == 1  # the gloo group needed none
        if world_size == 4:  # a 2-rank subgroup: its own fallback over its ranks only
            _assert_equal_results(res["sub"], res["gloo_sub"])
            _assert_equal_results(res["sub"], _reference(halves[rank // 2]), exact=False)
            assert res["new_groups_sub"] == 2
        if "device" in res:
            _assert_equal_results(res["device"], res["gloo"])
        else:
            assert res["no_cuda_error"] is not None
            assert res["device_error"] == res["no_cuda_error"]
        assert res["new_groups_final"] == res.get("new_groups_sub", 1)  # the device mode creates no group
    for name in ("cat", "cat_cpu"):  # uneven lengths, one rank without data
        assert results[0]["world"][name].numel() == sum(LENGTHS[:world_size])


def test_two_ranks(tmp_path: Path) -> None:
    """Cuda-only world, then a plain gloo world, then a cuda-only world again, in the same two processes."""
    results = run_world(["cuda_only", "gloo", "reinit"], 2, tmp_path)
    _check_cuda_only([res["cuda_only"] for res in results])
    whole = _reference([0, 1])
    for res in results:
        # plain gloo: exactly stock, no extra group
        _assert_equal_results(res["gloo"]["patched"], res["gloo"]["stock"])
        _assert_equal_results(res["gloo"]["patched"], whole, exact=False)
        assert res["gloo"]["new_groups"] == 0
        assert res["gloo"]["fallback_is_world"]
        # after destroy_process_group() and a new world: a new fallback group, not the dead one
        _assert_equal_results(res["reinit"]["patched"], {"mean": whole["mean"]}, exact=False)
        assert res["reinit"]["new_groups"] == 1
        assert res["reinit"]["cached"] == 1


@pytest.mark.skipif(
    torch.__version__ < "2.1",
    reason=f"torch {torch.__version__}: a subgroup's members alone cannot create its gloo fallback before torch 2.1",
)
def test_four_ranks_and_subgroups(tmp_path: Path) -> None:
    results = run_world(["cuda_only"], 4, tmp_path)
    _check_cuda_only([res["cuda_only"] for res in results])
