"""Metrics across ``torch.inference_mode()`` / ``torch.no_grad()`` epochs, as Lightning runs them, against stock.

Lightning evaluates under ``torch.inference_mode()`` (``Trainer(inference_mode=False)``: ``torch.no_grad()``) and
trains in normal mode; a metric object lives through all of it: the sanity check, training epochs, validation epochs,
``trainer.validate`` and ``trainer.test`` afterwards. States made by a ``reset()`` inside inference mode are
inference tensors: they track no version counter and cannot be written in place outside inference mode. Stock
TorchMetrics runs these sequences (or fails them in its own way: an in-place update of an inference state outside
inference mode raises there too); the patched metric must do exactly what stock does, step by step, on both paths.

Every catalogue configuration runs every sequence stock and patched (the variants of the two core sequences are
marked ``slow``: the latest release runs them): each step's value (``forward``, ``compute``)
must be stock's to the bit (dtype, shape and device included), a step where stock raises must raise the same
exception type, and the sequence ends there for both.

One deliberate deviation: stock's metrics that add to their states in place (``MeanMetric``, ``SumMetric``, the
confusion-matrix family, ...) raise ``RuntimeError: Inplace update to inference tensor outside InferenceMode`` when
updated in normal mode after a ``reset()`` under inference mode, while those that make new tensors
(``BinaryAccuracy``, ``MaxMetric``, ...) run on. The patched metrics all run on; their values are stock's for the
same sequence with ``torch.no_grad()`` in place of ``torch.inference_mode()`` (the same arithmetic, without inference
tensors).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torchmetrics.classification import BinaryAccuracy

import torchmetrics_syncfree
from tests._probing import PATHS_WITH_FLIGHT, on_path
from torchmetrics_syncfree.tools import audit

#: every catalogue configuration through a matrix (CI's tree mode leaves it out: the layer runs it on every release)
pytestmark = pytest.mark.catalogue_matrix

#: Grad modes of Lightning's stages: training, evaluation (the default) and evaluation with ``inference_mode=False``
MODES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "train": contextlib.nullcontext,
    "inference": torch.inference_mode,
    "no_grad": torch.no_grad,
}

#: One stage: its grad mode and its calls (``forward``/``update``, then the epoch end's ``compute`` and ``reset``)
Stage = tuple[str, tuple[str, ...]]
#: the areas under the curve, task wrappers and task classes (catalogue specifications and class names)
_CURVE_AREA = re.compile(r"(Binary|Multiclass|Multilabel)?(AUROC|AveragePrecision|LogAUC)\b")
_EPOCH_END = ("compute", "reset")
#: Lightning's sequences for one metric object: validation metrics logged through ``forward`` (``self.log(name,
#: metric)``) or ``update``; ``fit`` (sanity check, then train/validation epochs), then ``validate`` and ``test``
SEQUENCES: dict[str, tuple[Stage, ...]] = {
    "fit-validate-test-forward": (
        ("inference", ("forward", "forward", *_EPOCH_END)),  # sanity check
        ("train", ("forward", "forward", *_EPOCH_END)),
        ("inference", ("forward", "forward", *_EPOCH_END)),
        ("train", ("forward", "forward", *_EPOCH_END)),
        ("inference", ("forward", "forward", *_EPOCH_END)),
        ("inference", ("forward", "forward", *_EPOCH_END)),  # trainer.validate
        ("inference", ("forward", *_EPOCH_END)),  # trainer.test
    ),
    "fit-validate-update": (
        ("inference", ("update", "update", *_EPOCH_END)),
        ("inference", ("update", "forward", *_EPOCH_END)),
        ("train", ("forward", "update", *_EPOCH_END)),
        ("inference", ("update", "update", *_EPOCH_END)),
    ),
    # a metric reset under inference mode, then updated in normal mode: stock's in-place updates raise here
    "train-after-inference-reset": (
        ("inference", ("update", "forward", *_EPOCH_END)),
        ("train", ("update", "forward", *_EPOCH_END)),
        ("inference", ("forward", *_EPOCH_END)),
    ),
    "no-grad-evaluation": (
        ("no_grad", ("forward", "forward", *_EPOCH_END)),
        ("train", ("forward", "update", *_EPOCH_END)),
        ("no_grad", ("update", "forward", *_EPOCH_END)),
        ("inference", ("forward", *_EPOCH_END)),
        ("no_grad", ("forward", *_EPOCH_END)),
    ),
}

#: the paths of the patched code: the CPU path; the GPU's, with the checks' host copy arriving at every sweep and
#: with it still in flight (a GPU a step behind)


#: what stock raises for an in-place update of a state made under inference mode, outside inference mode
STOCK_INFERENCE_STATE_ERROR = "Inplace update to inference tensor outside InferenceMode"


#: how a sequence gets its metric and each call's inputs: ``(build(), inputs(metric, seed) -> (args, kwargs))``
Subject = tuple[Callable[[], Any], Callable[[Any, int], tuple[tuple[Any, ...], dict[str, Any]]]]


def _catalogue_subject(config: audit.Config) -> Subject:
    return (
        lambda: audit.build_metric(config.spec),
        lambda metric, seed: audit.make_inputs(config.inputs, metric, torch.device("cpu"), seed=seed),
    )


def _run(subject: Subject, sequence: tuple[Stage, ...], modes: dict[str, Any] = MODES) -> list[tuple[str, Any]]:
    """Each step's outcome: ``("value", output)`` or ``("raised", exception)``; the first exception ends it."""
    build, inputs = subject
    metric = build()
    outcomes: list[tuple[str, Any]] = []
    seed = 0
    for mode, calls in sequence:
        with modes[mode]():
            for call in calls:
                seed += 1
                try:
                    if call in ("update", "forward"):
                        args, kwargs = inputs(metric, seed)
                        output = getattr(metric, call)(*args, **kwargs) if call == "update" else metric(*args, **kwargs)
                    else:
                        output = getattr(metric, call)()
                except Exception as err:  # any exception stock raises is part of the outcome
                    outcomes.append(("raised", err))
                    return outcomes
                outcomes.append(("value", _detached(output)))
    return outcomes


def _detached(output: Any) -> Any:
    if isinstance(output, Tensor):
        return output.detach().clone()
    if isinstance(output, (list, tuple)):
        return type(output)(_detached(item) for item in output)
    if isinstance(output, dict):
        return {key: _detached(item) for key, item in output.items()}
    return output


def _assert_same(patched: Any, stock: Any, where: str, bitwise: bool, tolerance: float | None = None) -> None:
    """``patched`` is ``stock``: tensors of the same dtype, shape and device, equal to the bit or (``bitwise=False``)
    within float rounding (``tolerance``: a relative and absolute one instead of ``assert_close``'s defaults)."""
    if isinstance(stock, Tensor):
        assert isinstance(patched, Tensor), where
        assert (patched.dtype, patched.shape, patched.device) == (stock.dtype, stock.shape, stock.device), where
        if bitwise:
            assert torch.equal(patched.isnan(), stock.isnan()), where
            assert torch.equal(patched.nan_to_num(), stock.nan_to_num()), f"{where}: {patched} != {stock}"
        else:
            close = {} if tolerance is None else {"rtol": tolerance, "atol": tolerance}
            torch.testing.assert_close(patched, stock, equal_nan=True, msg=lambda msg: f"{where}: {msg}", **close)
    elif isinstance(stock, (list, tuple)):
        assert type(patched) is type(stock) and len(patched) == len(stock), where
        for i, (p, s) in enumerate(zip(patched, stock)):
            _assert_same(p, s, f"{where}[{i}]", bitwise, tolerance)
    elif isinstance(stock, dict):
        assert patched.keys() == stock.keys(), where
        for key in stock:
            _assert_same(patched[key], stock[key], f"{where}[{key!r}]", bitwise, tolerance)
    else:
        assert patched == stock, where


def _steps(sequence: tuple[Stage, ...]) -> list[str]:
    return [f"{mode}.{call}" for mode, calls in sequence for call in calls]


_CONFIGS = [pytest.param(config, id=config.label) for config in audit.CATALOGUE]


#: the sequences every release runs for every catalogue configuration: Lightning's default (``forward`` logging
#: through fit, validate and test) and the reset under inference mode that stock's in-place updates fail; the variants
#: (``update`` logging, ``Trainer(inference_mode=False)``) repeat the same steps in other orders and grad modes, so
#: they run on the latest release (``slow``; ``tox -e tm19``), the tree mode of ``tox -e upstream-full`` and here with
#: ``-m slow``
CORE_SEQUENCES = ("fit-validate-test-forward", "train-after-inference-reset")


@pytest.mark.parametrize("config", _CONFIGS)
@pytest.mark.parametrize(
    "sequence",
    [name if name in CORE_SEQUENCES else pytest.param(name, marks=pytest.mark.slow) for name in SEQUENCES],
)
def test_lightning_stage_sequences_match_stock(config: audit.Config, sequence: str) -> None:
    _assert_sequence_matches_stock(
        _catalogue_subject(config), SEQUENCES[sequence], bitwise_on_cpu=not _rounds_differently(config.spec)
    )


_CLUSTERS_SUMMED = ("AdjustedMutualInfoScore", "CalinskiHarabaszScore", "DaviesBouldinScore", "DunnIndex")


def _rounds_differently(spec: str) -> bool:
    """Whether the metric of ``spec`` (a class name or a catalogue specification) sums in another order than stock's
    on every device (float rounding, documented per area): the ranking AP and loss sum every sample with zeros where
    stock selects a subset; the areas under the curve (AUROC, AveragePrecision, LogAUC) sum fixed-shape curves with
    repeated points; Perplexity with ``ignore_index`` sums the ignored positions as zeros; the intrinsic clustering
    metrics sum each cluster's points in one ``index_add_`` and AdjustedMutualInfoScore its expected mutual information
    over a fixed grid; the retrieval metrics average their queries' values by one masked sum."""
    if spec.startswith(("MultilabelRankingAveragePrecision", "MultilabelRankingLoss", "Retrieval", *_CLUSTERS_SUMMED)):
        return True
    if _CURVE_AREA.match(spec):
        return True
    return spec.startswith("Perplexity") and "ignore_index=None" not in spec


def _assert_sequence_matches_stock(
    subject: Subject, stages: tuple[Stage, ...], tolerance: float | None = None, bitwise_on_cpu: bool = True
) -> None:
    """Every step of ``stages``, patched on each path, gives stock's outcome (see the module docstring).

    ``bitwise_on_cpu=False``: a class whose one implementation sums in another order than stock's (documented
    rounding deviations) is compared within ``tolerance`` on the CPU path too.
    """
    steps = _steps(stages)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # which warnings reach the user, and when, is tested per area
        stock = _run(subject, stages)
        references = {"stock": stock}
        if stock[-1][0] == "raised" and STOCK_INFERENCE_STATE_ERROR in str(stock[-1][1]):
            # the deviation (module docstring): a patched in-place update runs on; stock's own update raises as stock
            references["stock under no_grad"] = _run(subject, stages, modes={**MODES, "inference": torch.no_grad})
        with torchmetrics_syncfree.patched():
            for path in PATHS_WITH_FLIGHT:
                with on_path(path):
                    patched = _run(subject, stages)
                kinds = [kind for kind, _ in patched]
                matching = [name for name, ref in references.items() if [kind for kind, _ in ref] == kinds]
                assert matching, f"{path}: patched {patched[-1]} at {steps[len(patched) - 1]}; " + ", ".join(
                    f"{name}: {ref[-1]} at {steps[len(ref) - 1]}" for name, ref in references.items()
                )
                reference = references[matching[0]]
                for step, (kind, value), (_, expected) in zip(steps, patched, reference):
                    where = f"{path} {step} (against {matching[0]})"
                    if kind == "value":
                        # the device path's fixed-shape computes (curves, retrieval, Perplexity with ignore_index) sum
                        # in another order than stock's: bit parity there is tests/test_strided_parity.py's subject
                        bitwise = bitwise_on_cpu and path == "cpu"
                        _assert_same(value, expected, where, bitwise=bitwise, tolerance=tolerance)
                    else:
                        assert type(value) is type(expected), f"{where}: {value!r} raised, expected {expected!r}"


def test_the_sequences_cover_each_mode_transition() -> None:
    """The matrix is only as good as its sequences: every pair of grad modes follows one another somewhere."""
    transitions = set()
    for stages in SEQUENCES.values():
        modes = [mode for mode, _ in stages]
        transitions |= set(itertools.pairwise(modes))
    assert transitions >= {(a, b) for a in MODES for b in MODES if a != b}


def test_a_metric_reset_under_inference_mode_is_used_there_again() -> None:
    """The inference_mode crash's snippet, on every path: a validation metric's second epoch under inference mode."""
    preds, target = torch.rand(16), torch.randint(0, 2, (16,))
    expected = []
    for patched in (False, True):
        with torchmetrics_syncfree.patched() if patched else contextlib.nullcontext():
            for path in PATHS_WITH_FLIGHT if patched else ("cpu",):
                with on_path(path):
                    metric = BinaryAccuracy()
                    values = []
                    for _ in range(2):
                        with torch.inference_mode():
                            metric(preds, target)
                            values.append(metric.compute())
                            metric.reset()
                    if not patched:
                        expected = values
                    assert values == expected, path


#: the breadth classes, the rest of TorchMetrics on a GPU (their census specifications and inputs): new states and
#: checks across Lightning's stages.
#: BootStrapper is left out: its resampling draws from the global generator (stock's) or on the device (documented),
#: which a sequence of stock against patched cannot pair; tests/test_wrappers_more.py pairs its seeded CPU path.
BREADTH_CLASSES = (
    *("LogCoshError", "TweedieDevianceScore", "KendallRankCorrCoef", "ConcordanceCorrCoef"),
    *("CramersV", "TschuprowsT", "PearsonsContingencyCoefficient", "TheilsU"),
    *("AdjustedMutualInfoScore", "AdjustedRandScore", "CalinskiHarabaszScore", "DaviesBouldinScore", "DunnIndex"),
    *("FowlkesMallowsIndex", "HomogeneityScore", "MutualInfoScore", "RandScore", "VMeasureScore"),
    *("BinaryCalibrationError", "MulticlassCalibrationError", "BinaryFairness", "BinaryGroupStatRates"),
    *("MultilabelCoverageError", "MultilabelRankingAveragePrecision", "MultilabelRankingLoss"),
    *("BinaryPrecisionAtFixedRecall", "MulticlassRecallAtFixedPrecision", "MultilabelSpecificityAtSensitivity"),
    *("BinaryEER", "MultiScaleStructuralSimilarityIndexMeasure", "PeakSignalNoiseRatioWithBlockedEffect"),
    *("VisualInformationFidelity", "RelativeAverageSpectralError", "SpatialCorrelationCoefficient"),
    *("HausdorffDistance", "PanopticQuality", "ModifiedPanopticQuality"),
    *("RetrievalAUROC", "RetrievalPrecisionRecallCurve", "RetrievalRecallAtFixedPrecision"),
    *("MultioutputWrapper", "Running", "MinMaxMetric"),
)


def _census_subject(name: str) -> Subject:
    from torchmetrics_syncfree.tools import census

    classes = census.exported_classes()
    if name not in classes:
        pytest.skip(f"{name} is not in this TorchMetrics release")
    spec = census.spec_for(name, classes[name])
    if spec.skip:
        pytest.skip(spec.skip)
    build = spec.build if spec.build is not None else lambda: audit.build_metric(spec.spec)
    try:
        build()
    except (TypeError, ValueError) as err:  # e.g. 1.6's PSNRWithBlockedEffect takes no ``data_range``
        pytest.skip(f"the census specification {spec.spec!r} needs a later release: {err}")
    return build, lambda metric, seed: census.make_inputs(spec.inputs, metric, torch.device("cpu"), seed=seed)


#: the classes whose stock compute takes seconds per call on the CPU (a Hausdorff distance transform, VIF's Gaussian
#: pyramid at 48 pixels): their sequences mostly repeat stock's compute, so they are marked slow (the latest release
#: runs them; every release checks their patched updates in tests/test_segmentation_detection.py, test_image_more.py)
SLOW_SEQUENCE_CLASSES = frozenset({"HausdorffDistance", "VisualInformationFidelity"})


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_SEQUENCE_CLASSES else name for name in BREADTH_CLASSES],
)
@pytest.mark.parametrize("sequence", CORE_SEQUENCES)
def test_breadth_classes_across_lightning_stages(name: str, sequence: str) -> None:
    """Stock's outcome at every step on every path; the device path within 1e-4 (the documented float deviations of
    the areas, e.g. AdjustedMutualInfoScore's 5e-5: their exact parity is each area's own test)."""
    _assert_sequence_matches_stock(
        _census_subject(name), SEQUENCES[sequence], tolerance=1e-4, bitwise_on_cpu=not _rounds_differently(name)
    )
