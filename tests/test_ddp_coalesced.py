"""Metric states synced in one collective, in spawned gloo and ``cuda:gloo`` worlds of 2 and 4 ranks.

Every rank computes the same metrics three ways in each world: stock (``unpatch_all()``), patched on the CPU path and
patched on the device path (``force_device_path``), and records the synced states, the computed values, the
collectives (``torch.distributed`` functions wrapped and counted) and the host reads (a CPU ``SyncProbe``, which
also makes the CPU path take the device path for the checks). The assertions run here: the same states and values
as stock, bit for bit (dtype included), on every rank, for every reduction (sum, mean, max, min, a callable,
``None``, ``cat`` of a tensor state and of list states of uneven and zero length); one collective per ``compute()``
for fixed-shape states, two with list states; no host read in the sync of fixed-shape states.

In the ``cuda:gloo`` world (no CPU backend, as under NCCL) stock cannot sync the CPU states at all; the stock values
there come from the same metrics on a gloo group over the same ranks, and the patched sync runs through the gloo
fallback (one collective, on the fallback group). One world per rank count runs every scenario (~10 s each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchmetrics import Metric, MetricCollection
from torchmetrics.aggregation import CatMetric, MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

from tests import _ddp_world, _series_tree

pytestmark = pytest.mark.ddp

NUM_CLASSES = 5
#: list values per rank: uneven, and rank 2 of a 4-rank world has none
LENGTHS = (3, 6, 0, 2)
_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_reduce", "broadcast", "barrier", "all_gather_object")
_CHECKS = "_deferred_checks"


def _prod(x: torch.Tensor) -> torch.Tensor:
    return x.prod(dim=0)


class _EveryReduction(Metric):
    """One state per reduction kind and dtype, and two list states (float32 and int64)."""

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros(3), dist_reduce_fx="sum")
        self.add_state("average", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="mean")
        self.add_state("largest", torch.zeros(2, dtype=torch.int64), dist_reduce_fx="max")
        self.add_state("smallest", torch.zeros(2, 2, dtype=torch.float16), dist_reduce_fx="min")
        self.add_state("product", torch.ones(2, dtype=torch.float64), dist_reduce_fx=_prod)
        self.add_state("stacked", torch.zeros(2, dtype=torch.int32), dist_reduce_fx=None)
        self.add_state("flags", torch.zeros(3, dtype=torch.bool), dist_reduce_fx="sum")
        self.add_state("rows", torch.zeros(2), dist_reduce_fx="cat")
        self.add_state("values", [], dist_reduce_fx="cat")
        self.add_state("labels", [], dist_reduce_fx="cat")

    def update(self, x: torch.Tensor, labels: torch.Tensor) -> None:
        self.total += x[:3].sum() if x.numel() else 0
        self.average += x.double().sum()
        self.largest = torch.maximum(self.largest, labels[:2]) if labels.numel() >= 2 else self.largest
        self.smallest = torch.minimum(self.smallest, x.half().sum().expand(2, 2))
        self.product *= 1.0 + x.double().mean().nan_to_num()
        self.stacked += labels.numel()
        self.flags |= x.numel() > 2
        self.rows += x.sum()
        self.values.append(x)
        self.labels.append(labels)

    def compute(self) -> dict[str, Any]:
        return {"total": self.total, "values": torch.cat(self.values) if isinstance(self.values, list) else self.values}


class _Fixed(Metric):
    """Fixed-shape states only (no lists)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros(3), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("peak", torch.tensor(-1.0, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, x: torch.Tensor) -> None:
        self.total += x.sum()
        self.count += x.numel()
        self.peak = torch.maximum(self.peak, x.double().max()) if x.numel() else self.peak

    def compute(self) -> torch.Tensor:
        return self.total / self.count


class _FailsOnRankZero(_Fixed):
    def compute(self) -> torch.Tensor:
        if dist.get_rank() == 0:
            raise RuntimeError("compute failed on rank 0")
        return super().compute()


def _data(rank: int, step: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * rank + step)
    n = LENGTHS[rank]
    return {
        "x": torch.randn(n, generator=gen),
        "labels": torch.randint(0, 9, (n,), generator=gen),
        "preds": torch.randint(0, NUM_CLASSES, (16,), generator=gen),
        "target": torch.randint(0, NUM_CLASSES, (16,), generator=gen),
    }


class _Count:
    """Counts the calls of the ``torch.distributed`` collectives (and the groups they ran on) while active."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.sizes: list[int] = []  # bytes sent by each all_gather

    @contextmanager
    def active(self) -> Iterator[_Count]:
        originals = {name: getattr(dist, name) for name in _COLLECTIVES}

        def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls.append((name, kwargs.get("group")))
                if name == "all_gather" and len(args) > 1 and isinstance(args[1], torch.Tensor):
                    self.sizes.append(args[1].numel() * args[1].element_size())
                return fn(*args, **kwargs)

            return counted

        for name, fn in originals.items():
            setattr(dist, name, wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)


def _states(metric: Metric) -> dict[str, Any]:
    return {
        attr: (value.clone() if isinstance(value, torch.Tensor) else [v.clone() for v in value])
        for attr, value in ((a, getattr(metric, a)) for a in metric._defaults)
        if attr != _CHECKS
    }


def _measure(make: Callable[[], Any], feed: Callable[[Any], None], device_path: bool) -> dict[str, Any]:
    """Build, update, then ``compute()`` once under the counters; for a metric also its synced states."""
    from torchmetrics_syncfree import SyncProbe, _instrumentation

    _instrumentation.force_device_path(device_path)
    try:
        metric = make()
        feed(metric)
        out: dict[str, Any] = {}
        if isinstance(metric, Metric):
            metric.sync()
            out["synced"] = _states(metric)
            metric.unsync()
        before = {name: _states(m) for name, m in _members(metric)}
        count = _Count()
        with count.active(), SyncProbe() as probe:
            out["value"] = metric.compute()
        out["collectives"] = [name for name, _ in count.calls]
        out["groups"] = [id(group) for _, group in count.calls]  # groups cannot leave the rank
        out["reads"] = probe.counts().get("device-to-host read", 0)
        out["waits"] = probe.counts().get("host wait", 0)
        out["unsynced"] = all(not m._is_synced for _, m in _members(metric))
        out["restored"] = all(_equal(_states(m), before[name]) for name, m in _members(metric))
        return out
    finally:
        _instrumentation.force_device_path(False)


def _members(metric: Any) -> list[tuple[str, Metric]]:
    if isinstance(metric, MetricCollection):
        return list(metric.items(keep_base=True, copy_state=False))
    return [("", metric)]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _report_metrics(group: Any) -> MetricCollection:
    kwargs = {"num_classes": NUM_CLASSES, "average": "macro", "process_group": group}
    return MetricCollection(
        {
            "acc": MulticlassAccuracy(**kwargs),
            "prec": MulticlassPrecision(**kwargs),
            "rec": MulticlassRecall(**kwargs),
            "f1": MulticlassF1Score(**kwargs),
            "loss": MeanMetric(process_group=group),
        },
        compute_groups=True,
    )


def _cases(rank: int, group: Any) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    def feed_classes(metric: Any) -> None:
        for step in range(3):
            d = _data(rank, step)
            metric.update(d["preds"], d["target"])

    def feed_every(metric: Any) -> None:
        for step in range(2):
            d = _data(rank, step)
            metric.update(d["x"], d["labels"])

    def feed_x(metric: Any) -> None:
        for step in range(2):
            metric.update(_data(rank, step)["x"])

    def lists() -> MetricCollection:
        return MetricCollection(
            {"cat": CatMetric(process_group=group), "mean": MeanMetric(process_group=group)}, compute_groups=False
        )

    return {
        "report_metrics": (lambda: _report_metrics(group), feed_classes),
        "accuracy": (lambda: MulticlassAccuracy(NUM_CLASSES, process_group=group), feed_classes),
        "every_reduction": (lambda: _EveryReduction(process_group=group), feed_every),
        "fixed": (lambda: _Fixed(process_group=group), feed_x),
        "list_collection": (lists, feed_x),
    }


def _run_cases(rank: int, group: Any, stock_group: Any) -> dict[str, Any]:
    import torchmetrics_syncfree

    out: dict[str, Any] = {}
    torchmetrics_syncfree.unpatch_all()
    for name, (make, feed) in _cases(rank, stock_group).items():
        out[f"stock/{name}"] = _measure(make, feed, device_path=False)
    torchmetrics_syncfree.patch_all()
    try:
        for path in ("cpu", "device"):
            for name, (make, feed) in _cases(rank, group).items():
                out[f"{path}/{name}"] = _measure(make, feed, device_path=path == "device")
        out.update(_special(rank, group))
    finally:
        torchmetrics_syncfree.unpatch_all()
    return out


def _special(rank: int, group: Any) -> dict[str, Any]:
    """Patched only: members that keep their own sync, an error in one member's compute, a NaN error on one rank."""
    out: dict[str, Any] = {}
    calls: list[int] = []

    def custom(result: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        calls.append(1)
        return [result] * dist.get_world_size(group)

    collection = MetricCollection(
        {
            "shared": SumMetric(process_group=group),
            "custom": SumMetric(dist_sync_fn=custom, process_group=group),
            "local": SumMetric(sync_on_compute=False, process_group=group),
        },
        compute_groups=False,
    )
    collection.update(torch.tensor(float(rank + 1)))
    count = _Count()
    with count.active():
        out["kept"] = collection.compute()
    out["kept_collectives"] = [name for name, _ in count.calls]
    out["custom_calls"] = len(calls)

    failing = MetricCollection(
        {"first": _Fixed(process_group=group), "fails": _FailsOnRankZero(process_group=group)}, compute_groups=False
    )
    failing.update(torch.arange(3.0) + rank)
    before = {name: _states(m) for name, m in _members(failing)}
    try:
        failing.compute()
        out["failing_error"] = None
    except RuntimeError as err:
        out["failing_error"] = str(err)
    out["failing_unsynced"] = all(not m._is_synced for _, m in _members(failing))
    out["failing_restored"] = all(_equal(_states(m), before[name]) for name, m in _members(failing))
    failing.update(torch.ones(1))  # still usable: a later compute syncs again (no rank waits alone)
    try:
        out["failing_again"] = failing["first"].compute()
    except RuntimeError as err:
        out["failing_again"] = str(err)

    # a rank that never updated gathers stock's stand-in (an empty tensor of the metric's float dtype) for its int64
    # list: stock's gather of tensors of different dtypes aborts the process (gloo: "Received data size doesn't match
    # expected size"); here every rank's tensor keeps its dtype and the cat promotes, as one process would
    idle = _EveryReduction(process_group=group)
    if rank != 1:
        idle.update(_data(rank)["x"], _data(rank)["labels"])
    idle.sync()
    out["idle_labels"] = idle.labels
    idle.unsync()

    from torchmetrics_syncfree import _instrumentation

    _instrumentation.force_device_path(True)
    try:
        nan_error = MetricCollection(
            {"mean": MeanMetric(nan_strategy="error", process_group=group), "acc": _report_metrics(group)["acc"]}
        )
        value = torch.tensor(float("nan") if rank == 1 else 1.0)
        nan_error["mean"].update(value)
        nan_error["acc"].update(_data(rank)["preds"], _data(rank)["target"])
        try:
            nan_error.compute()
            out["nan_error"] = None
        except RuntimeError as err:
            out["nan_error"] = type(err).__name__
        out["nan_unsynced"] = all(not m._is_synced for _, m in _members(nan_error))
    finally:
        _instrumentation.force_device_path(False)
    return out


def _gloo(rank: int, world_size: int) -> dict[str, Any]:
    return _run_cases(rank, None, None)


def _cuda_only(rank: int, world_size: int) -> dict[str, Any]:
    """No CPU backend: the patched sync goes through the gloo fallback; stock's values from a gloo group."""
    from torchmetrics_syncfree import distributed as sfd

    gloo_all = dist.new_group(backend="gloo")
    out = _run_cases(rank, None, gloo_all)
    tree = _series_tree.series_module("torchmetrics.utilities.distributed")  # tree mode: the series' fallback
    fallback = sfd.fallback_group() if tree is None else tree._gloo_fallback_group(None)
    out["fallback_groups_only"] = all(
        group == id(fallback)
        for key, res in out.items()
        if key.startswith(("cpu/", "device/"))
        for group in res["groups"]
    )
    return out


SCENARIOS = [("gloo", _gloo), ("cuda:gloo", _cuda_only)]


def _check(results: list[dict[str, Any]]) -> None:
    for backend_fn in ("_gloo@gloo", "_cuda_only@cuda:gloo"):
        per_rank = [res[backend_fn] for res in results]
        for rank, res in enumerate(per_rank):
            for name in _cases(0, None):
                stock = res[f"stock/{name}"]
                for path in ("cpu", "device"):
                    got = res[f"{path}/{name}"]
                    where = f"{backend_fn} rank {rank} {path} {name}"
                    assert _equal(got["value"], stock["value"]), where
                    if "synced" in stock:
                        assert _equal(got["synced"], stock["synced"]), where
                    assert got["unsynced"] and got["restored"], where
                    assert got["reads"] == 0 or name.startswith(("every", "list")), (where, got["reads"])
            # the target: one collective per compute() for fixed-shape states, two with list states
            for path in ("cpu", "device"):
                assert res[f"{path}/report_metrics"]["collectives"] == ["all_gather"], path
                assert res[f"{path}/accuracy"]["collectives"] == ["all_gather"]
                assert res[f"{path}/fixed"]["collectives"] == ["all_gather"]
                assert res[f"{path}/every_reduction"]["collectives"] == ["all_gather"] * 2
                assert res[f"{path}/every_reduction"]["reads"] == 1  # the size exchange
                assert res[f"{path}/list_collection"]["collectives"] == ["all_gather"] * 2
            assert res["device/report_metrics"]["waits"] == 1  # the members' check counters, read once
            assert res["stock/report_metrics"]["reads"] > 0 and len(res["stock/report_metrics"]["collectives"]) > 5
            if backend_fn.startswith("_cuda"):
                assert res["fallback_groups_only"]
            # members with their own sync keep it; an error leaves every member unsynced and usable
            world = len(per_rank)
            assert res["kept"]["shared"] == world * (world + 1) / 2
            assert res["kept"]["custom"] == world * (rank + 1) and res["custom_calls"] == 2  # value and checks
            assert res["kept"]["local"] == rank + 1
            assert res["kept_collectives"].count("all_gather") == 1  # the custom one gathers nothing here
            assert res["failing_error"] == ("compute failed on rank 0" if rank == 0 else None)
            assert res["failing_unsynced"] and res["failing_restored"]
            assert isinstance(res["failing_again"], torch.Tensor)
            assert res["nan_error"] == "RuntimeError" and res["nan_unsynced"]  # every rank raises, none waits alone
            expected = torch.cat([_data(r)["labels"] for r in range(world) if r != 1]).float()
            assert _equal(res["idle_labels"], expected)
        # every rank holds the same synced states
        for name in _cases(0, None):
            for path in ("cpu", "device"):
                if "synced" in per_rank[0][f"{path}/{name}"]:
                    assert all(
                        _equal(r[f"{path}/{name}"]["synced"], per_rank[0][f"{path}/{name}"]["synced"]) for r in per_rank
                    )


@pytest.mark.skipif(
    torch.__version__ < "2.1",
    reason=f"torch {torch.__version__}: gloo gathers no bool tensors: stock cannot sync the bool state compared here",
)
@pytest.mark.parametrize("world_size", [2, 4])
def test_one_collective(tmp_path: Path, world_size: int) -> None:
    _check(_ddp_world.run_world(SCENARIOS, world_size, tmp_path))


# --------------------------------------------------------------------------------------------------------------------
# forward() with dist_sync_on_step, and compute groups that differ between ranks (2 ranks, gloo)

FORWARD_STEPS = 3


class _FullState(_Fixed):
    """Fixed-shape states, ``full_state_update=True`` (stock's forward updates twice)."""

    full_state_update = True


def _on_step_cases(group: Any) -> dict[str, Callable[[], MetricCollection]]:
    on_step = {"dist_sync_on_step": True, "process_group": group}
    classes = {"num_classes": NUM_CLASSES, "average": "macro", **on_step}

    def fixed() -> MetricCollection:
        return MetricCollection(
            {
                "acc": MulticlassAccuracy(**classes),
                "f1": MulticlassF1Score(**classes),
                "mean": MeanMetric(**on_step),
                "full": _FullState(**on_step),
                "plain": SumMetric(process_group=group),  # no sync on step
            },
            compute_groups=True,
        )

    def lists() -> MetricCollection:
        return MetricCollection(
            {"cat": CatMetric(**on_step), "mean": MeanMetric(**on_step), "fixed": _Fixed(**on_step)},
            compute_groups=False,
        )

    def repeated() -> MetricCollection:  # one object under two names runs twice, in turn, as stock
        twice = _FullState(**on_step)
        return MetricCollection({"once": _Fixed(**on_step), "a": twice, "b": twice}, compute_groups=False)

    return {"fixed": fixed, "lists": lists, "repeated": repeated}


def _on_step_inputs(rank: int, step: int) -> dict[str, torch.Tensor]:
    d = _data(rank, step)
    return {"preds": d["preds"], "target": d["target"], "value": d["x"], "x": d["x"]}


def _forward_steps(make: Callable[[], MetricCollection], rank: int, device_path: bool) -> dict[str, Any]:
    """An ``update`` (forms the compute groups), then forward steps counted; the members' states after each."""
    from torchmetrics_syncfree import SyncProbe, _instrumentation

    _instrumentation.force_device_path(device_path)
    try:
        collection = make()
        collection.update(**_on_step_inputs(rank, 9))
        out: dict[str, Any] = {"values": [], "states": [], "collectives": [], "reads": [], "unsynced": True}
        for step in range(FORWARD_STEPS):
            count = _Count()
            with count.active(), SyncProbe() as probe:
                out["values"].append(collection(**_on_step_inputs(rank, step)))
            out["collectives"].append([name for name, _ in count.calls])
            out["reads"].append(probe.counts().get("device-to-host read", 0))
            out["states"].append({name: _states(m) for name, m in _members(collection)})
            members = _members(collection)
            out["unsynced"] &= all(not m._is_synced and m._to_sync == m.sync_on_compute for _, m in members)
        out["compute"] = collection.compute()
        return out
    finally:
        _instrumentation.force_device_path(False)


def _rank_groups(rank: int, group: Any, user_groups: bool, copy_on_rank0: bool) -> dict[str, Any]:
    """Two binary accuracies; automatic groups differ between ranks: rank 0's first batch has no score in [0.5, 0.7)."""
    from torchmetrics.classification import BinaryAccuracy, BinaryF1Score

    collection = MetricCollection(
        {
            "lo": BinaryAccuracy(threshold=0.5, process_group=group),
            "hi": BinaryAccuracy(threshold=0.7, process_group=group),
            "f1": BinaryF1Score(threshold=0.5, process_group=group),
        },
        compute_groups=[["lo", "f1"]] if user_groups else True,
    )
    first = torch.tensor([0.1, 0.9, 0.2, 0.8]) if rank == 0 else torch.tensor([0.6, 0.9, 0.2, 0.65])
    collection.update(first, torch.tensor([1, 1, 1, 0]))  # rank 1: `tp` differs (1.6.1 compares only it)
    collection.update(torch.tensor([0.55, 0.3, 0.75, 0.62]), torch.tensor([1, 0, 1, 1]))
    if copy_on_rank0 and rank == 0:
        _ = collection["lo"]  # copies the group's states, on this rank only
    count = _Count()
    with count.active():
        value = collection.compute()
    groups = {i: list(g) for i, g in collection.compute_groups.items()}
    return {"value": value, "groups": groups, "collectives": [n for n, _ in count.calls], "bytes": sum(count.sizes)}


def _on_step(rank: int, world_size: int) -> dict[str, Any]:
    import torchmetrics_syncfree

    out: dict[str, Any] = {}
    torchmetrics_syncfree.unpatch_all()
    for name, make in _on_step_cases(None).items():
        out[f"stock/{name}"] = _forward_steps(make, rank, device_path=False)
    for user in (False, True):
        out[f"stock/groups/{user}"] = _rank_groups(rank, None, user, copy_on_rank0=user)
    torchmetrics_syncfree.patch_all()
    try:
        for path in ("cpu", "device"):
            for name, make in _on_step_cases(None).items():
                out[f"{path}/{name}"] = _forward_steps(make, rank, device_path=path == "device")
        for user in (False, True):
            out[f"patched/groups/{user}"] = _rank_groups(rank, None, user, copy_on_rank0=user)
        out["patched/groups/none"] = _rank_groups(rank, None, False, copy_on_rank0=False)
        out.update(_forward_error(rank))
    finally:
        torchmetrics_syncfree.unpatch_all()
    return out


def _forward_error(rank: int) -> dict[str, Any]:
    """A member's batch compute fails on rank 0: no rank waits, every member unsynced with its accumulated state."""
    on_step = {"dist_sync_on_step": True}
    failing = MetricCollection(
        {"first": _Fixed(**on_step), "fails": _FailsOnRankZero(**on_step), "last": _Fixed(**on_step)},
        compute_groups=False,
    )
    x = torch.arange(3.0) + rank
    out: dict[str, Any] = {}
    try:
        failing(x)
        out["forward_error"] = None
    except RuntimeError as err:
        out["forward_error"] = str(err)
    out["forward_error_unsynced"] = all(not m._is_synced for _, m in _members(failing))
    out["forward_error_states"] = {name: _states(m) for name, m in _members(failing)}
    out["forward_error_again"] = failing["first"].compute()  # every rank syncs again: nobody was left waiting
    return out


def _check_on_step(per_rank: list[dict[str, Any]]) -> None:
    world = len(per_rank)
    for rank, res in enumerate(per_rank):
        for name in ("fixed", "lists", "repeated"):
            stock = res[f"stock/{name}"]
            for path in ("cpu", "device"):
                got, where = res[f"{path}/{name}"], f"rank {rank} {path} {name}"
                assert _equal(got["values"], stock["values"]), where
                assert _equal(got["states"], stock["states"]), where  # accumulated as stock, step by step
                assert _equal(got["compute"], stock["compute"]), where
                assert got["unsynced"], where
                # one gather per forward step for all members (two with list states), none of stock's barriers
                gathers = {"fixed": 1, "lists": 2, "repeated": 3}[name]  # repeated: the twice-named one syncs alone
                assert got["collectives"] == [["all_gather"] * gathers] * FORWARD_STEPS, where
                assert got["reads"] == [1 if name == "lists" else 0] * FORWARD_STEPS, where  # lists: the sizes
            assert all(len(c) > 4 for c in stock["collectives"]) and all(r > 0 for r in stock["reads"])
        # automatic groups differ between ranks: stock's values, one gather, no hang; listed groups gathered once
        auto, listed = res["patched/groups/False"], res["patched/groups/True"]
        assert _equal(auto["value"], res["stock/groups/False"]["value"])
        assert _equal(listed["value"], res["stock/groups/True"]["value"])
        assert auto["collectives"] == listed["collectives"] == ["all_gather"]
        assert listed["bytes"] < auto["bytes"] == res["patched/groups/none"]["bytes"]
        # a member failing on one rank in forward
        assert res["forward_error"] == ("compute failed on rank 0" if rank == 0 else None)
        assert res["forward_error_unsynced"]
        for member, states in res["forward_error_states"].items():
            assert states["total"].tolist() == [(torch.arange(3.0) + rank).sum().item()] * 3, member
        assert isinstance(res["forward_error_again"], torch.Tensor)
    assert per_rank[0]["stock/groups/False"]["groups"] != per_rank[1]["stock/groups/False"]["groups"]
    assert world == 2


def test_forward_on_step_and_rank_dependent_groups(tmp_path: Path) -> None:
    """``forward`` with ``dist_sync_on_step``: one gather per step; automatic compute groups that differ by rank."""
    _check_on_step([res["_on_step@gloo"] for res in _ddp_world.run_world([("gloo", _on_step)], 2, tmp_path)])
