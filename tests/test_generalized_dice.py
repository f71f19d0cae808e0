"""GeneralizedDiceScore: stock's values on both patched paths for every ``input_format``, ``weight_type``,
``per_class`` and ``include_background`` (int one-hot, float32/float64/half scores, index inputs), a sync-free
update/forward/compute on the device path (stock's boolean mask writes and ``one_hot`` reads seen unpatched), stock's
errors (class values outside the classes: a deferred check on the device path), and an update that traces without a
graph break."""

from __future__ import annotations

import contextlib
import copy
import operator
import pickle
from typing import Any

import pytest
import torch
import torch._dynamo
from lightning_utilities.core.imports import compare_version
from torch import Tensor
from torchmetrics.functional.segmentation import generalized_dice_score
from torchmetrics.segmentation import GeneralizedDiceScore

import torchmetrics_syncfree
from tests._classification_cases import PATHS, parity, pending_checks
from tests._probing import assert_sync_free_life, graph_breaks, stock_counts_of_torch_2_13
from torchmetrics_syncfree import SyncProbe, _instrumentation

C = 5
#: 1.8 added ``input_format="mixed"`` (and takes the argmax of float "one-hot" inputs)
_MIXED = compare_version("torchmetrics", operator.ge, "1.8.0")
FORMATS = ("one-hot", "index", *(("mixed",) if _MIXED else ()))
#: inputs of each format: one-hot labels, scores of each float dtype, index labels, (1.8+) scores against labels
INPUTS = {
    "one-hot": ("onehot", "float32", "float64", "half"),
    "index": ("index",),
    "mixed": ("mixed-scores", "mixed-labels"),
}
CONFIGS = [
    (input_format, inputs, weight_type, per_class, include_background)
    for input_format in FORMATS
    for inputs in INPUTS[input_format]
    for weight_type in ("square", "simple", "linear")
    for per_class in (False, True)
    for include_background in (True, False)
    if inputs in ("onehot", "index") or (weight_type == "square" and per_class)
]
#: the fast set: every weight type and setting for index inputs, every weight type for one-hot labels, one setting
#: for the others (the full product is marked slow)
FAST = [c for c in CONFIGS if c[1] == "index" or (c[3] == c[4] and (c[1] == "onehot" or c[2] == "square"))]


def _label(config: tuple[Any, ...]) -> str:
    return "-".join(map(str, config))


def _batches(inputs: str, seed: int, n: int = 3) -> list[tuple[Tensor, Tensor]]:
    """Small 6x6 images of ``C`` classes (so that some classes are absent from a sample: infinite weights), and a
    batch whose every sample lacks class 3."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        preds = torch.randint(0, C, (n, 6, 6), generator=gen)
        target = torch.randint(0, C, (n, 6, 6), generator=gen)
        if i == 3:
            target = target.masked_fill(target == 3, 0)
        scores = torch.randn(n, C, 6, 6, generator=gen)

        def onehot(labels: Tensor) -> Tensor:
            return torch.nn.functional.one_hot(labels, C).movedim(-1, 1)

        if inputs == "index":
            out.append((preds, target))
        elif inputs == "onehot":
            out.append((onehot(preds), onehot(target)))
        elif inputs == "mixed-scores":
            out.append((scores, target))
        elif inputs == "mixed-labels":
            out.append((preds, onehot(target)))
        else:  # float scores of the named dtype against one-hot labels
            out.append((scores.softmax(1).to(getattr(torch, inputs)), onehot(target)))
    return out


def _make(config: tuple[Any, ...], **kwargs: Any) -> GeneralizedDiceScore:
    input_format, _, weight_type, per_class, include_background = config
    return GeneralizedDiceScore(
        num_classes=C,
        input_format=input_format,
        weight_type=weight_type,
        per_class=per_class,
        include_background=include_background,
        **kwargs,
    )


def _parity(configs: list[tuple[Any, ...]], path: str) -> None:
    cases = {
        _label(config): ((lambda c=config: _make(c)), _batches(config[1], seed=i)) for i, config in enumerate(configs)
    }
    parity(cases, path=path)


@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock(path: str) -> None:
    """forward() per batch and compute(): stock's values, dtypes and shapes, to the bit on both paths."""
    _parity(FAST, path)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_parity_with_stock_every_setting(path: str) -> None:
    _parity(CONFIGS, path)


@pytest.mark.parametrize("path", PATHS)
def test_functional_parity(path: str) -> None:
    configs = [c for c in CONFIGS if c[1] in ("index", "float64")]
    data = {_label(c): _batches(c[1], seed=7)[3] for c in configs}

    def run() -> list[Tensor]:
        return [
            generalized_dice_score(*data[_label(c)], C, c[4], c[3], c[2], c[0])  # type: ignore[arg-type]
            for c in configs
        ]

    stock = run()
    with torchmetrics_syncfree.patched(), SyncProbe() if path == "device" else contextlib.nullcontext():
        patched = run()
    for s, p in zip(stock, patched):
        assert (p.dtype, p.shape) == (s.dtype, s.shape)
        torch.testing.assert_close(p, s, rtol=0, atol=0, equal_nan=True)


SYNC_CONFIGS = [c for c in CONFIGS if c[2] == "square" and c[3] and c[4]]


@pytest.mark.parametrize("config", SYNC_CONFIGS, ids=[_label(c) for c in SYNC_CONFIGS])
def test_update_forward_and_compute_are_sync_free(syncfree: Any, config: tuple[Any, ...]) -> None:
    data = _batches(config[1], seed=3)
    metric = _make(config)
    assert_sync_free_life(metric, data)


@stock_counts_of_torch_2_13
@pytest.mark.parametrize("inputs", ["onehot", "index"])
def test_stock_syncs_are_seen(inputs: str) -> None:
    """Stock's boolean masks (and, for index inputs, ``one_hot``'s reads on CPU) in every update."""
    config = ("index" if inputs == "index" else "one-hot", inputs, "square", False, True)
    metric, (preds, target) = _make(config), _batches(inputs, seed=1)[0]
    with SyncProbe() as probe:
        metric.update(preds, target)
    assert probe.counts().get("data-dependent shape") == 3, probe.events  # two mask writes, one mask read
    assert probe.counts().get("device-to-host read", 0) == (4 if inputs == "index" else 0), probe.events


INVALID = {
    "class too large": (torch.tensor([[[0, 1], [2, C]]]), torch.zeros(1, 2, 2, dtype=torch.long), RuntimeError),
    "negative class": (torch.zeros(1, 2, 2, dtype=torch.long), torch.tensor([[[0, -1], [2, 1]]]), RuntimeError),
    "shapes": (torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 2, 3, dtype=torch.long), RuntimeError),
    "rank": (torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), ValueError),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_input_raises_stocks_error(path: str, case: str) -> None:
    """Stock's exception type: shape checks at once on both paths; class values at once on CPU and at the end of
    the update on the device path (the simulated copy arrives), with the batch left out of the state."""
    preds, target, error = INVALID[case]
    config = ("index", "index", "square", True, True)
    with pytest.raises(error):
        _make(config).update(preds, target)
    good = _batches("index", seed=5)[0]
    reference = _make(config)
    reference.update(*good)
    with torchmetrics_syncfree.patched():
        metric = _make(config)
        with SyncProbe() if path == "device" else contextlib.nullcontext():
            metric.update(*good)
            with pytest.raises(error):
                metric.update(preds, target)
        torch.testing.assert_close(metric.compute(), reference.compute(), rtol=0, atol=0)
        assert pending_checks(metric) == 0


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")  # the merged metric has had no update
def test_invalid_batch_is_reported_by_compute_when_the_copy_is_late(syncfree: Any) -> None:
    """The whole life of the deferred check: pending after the update, carried by copies and pickles, merged,
    reported once by compute() (and by a copy's reset()), the batch never in the state."""
    config = ("index", "index", "square", True, True)
    good = _batches("index", seed=6)[0]
    bad = (good[0].clone().index_fill_(0, torch.tensor([0]), C), good[1])
    with _instrumentation.simulated_copy_delay(None), SyncProbe():
        metric = _make(config)
        metric.update(*good)
        metric.update(*bad)
        assert pending_checks(metric) == 1
        twin, pickled = copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))
        merged = _make(config)
        merged.merge_state(metric)
        with pytest.raises(RuntimeError, match="Class values must be"):
            metric.compute()
        with pytest.raises(RuntimeError, match="Class values must be"):
            twin.reset()
        with pytest.raises(RuntimeError, match="Class values must be"):
            pickled.compute()
        with pytest.raises(RuntimeError, match="Class values must be"):
            merged.compute()
        assert pending_checks(metric) == 0
        assert float(metric.samples) == good[0].shape[0]  # the bad batch never entered the state
        metric.compute()  # reported once


@pytest.mark.parametrize("config", SYNC_CONFIGS, ids=[_label(c) for c in SYNC_CONFIGS])
@pytest.mark.compile
def test_update_traces_without_a_graph_break(config: tuple[Any, ...]) -> None:
    torch._dynamo.reset()
    with torchmetrics_syncfree.patched():
        metric = _make(config)
        preds, target = _batches(config[1], seed=2)[0]
        explanation = torch._dynamo.explain(lambda p, t: metric.update(p, t))(preds, target)
    torch._dynamo.reset()
    assert graph_breaks(explanation) == []


def _bad_rank_world(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0 feeds one batch with a class value outside the classes; every rank computes twice."""
    from torchmetrics.segmentation import GeneralizedDiceScore

    import torchmetrics_syncfree
    from torchmetrics_syncfree import _instrumentation

    torchmetrics_syncfree.patch_all()
    _instrumentation.force_device_path(True)  # what every rank of a GPU job does; the copies arrive at once here
    metric = GeneralizedDiceScore(num_classes=3, input_format="index", per_class=True)
    preds, target = torch.tensor([[[0, 1], [2, 1]]]), torch.tensor([[[0, 1], [2, 2]]])
    metric.update(preds, target)
    bad = preds.masked_fill(preds == 2, 5) if rank == 0 else preds
    out: dict[str, Any] = {}
    try:
        metric.update(bad, target)  # under DDP the sweep stays quiet: compute() reports the synced counts
        out["update_error"] = None
    except RuntimeError as err:
        out["update_error"] = str(err)
    try:
        metric.compute()
        out["compute_error"] = None
    except RuntimeError as err:
        out["compute_error"] = str(err)
    out["score"], out["samples"] = metric.compute(), metric.samples.clone()  # a collective: every rank is in it
    return out


@pytest.mark.ddp
@pytest.mark.slow  # spawns a world (tens of seconds); the counters' DDP life is tests/test_deferred_ddp.py's
def test_ranks_raise_together_under_ddp(tmp_path: Any) -> None:
    """The check counters are summed with the states: every rank raises in compute(), none in update, and the bad
    batch stays out of the synced state."""
    from tests import _ddp_world

    results = [res["_bad_rank_world@gloo"] for res in _ddp_world.run_world([("gloo", _bad_rank_world)], 2, tmp_path)]
    for rank, res in enumerate(results):
        assert res["update_error"] is None
        assert "Class values must be" in res["compute_error"]
        assert float(res["samples"]) == (1.0 if rank == 0 else 2.0)  # rank 0's bad batch never entered its state
    torch.testing.assert_close(results[0]["score"], results[1]["score"])  # the synced value, the same everywhere
