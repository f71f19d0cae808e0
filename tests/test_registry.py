"""The patch registry: idempotent, thread-safe, fully reversible, version-checked, never half-applied."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import os
import pickle
import pydoc
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torchmetrics
from torchmetrics.aggregation import BaseAggregator, CatMetric, MeanMetric, SumMetric

import torchmetrics_syncfree
from torchmetrics_syncfree import _deferred, _instrumentation, _registry
from torchmetrics_syncfree.probe import SyncProbe

MEAN_UPDATE = "torchmetrics.aggregation.MeanMetric.update"
CAST_CHECK = "torchmetrics.aggregation.BaseAggregator._cast_and_nan_check_input"
SAFE_DIVIDE = "torchmetrics.utilities.compute._safe_divide"
#: a package that ``import torchmetrics`` does not load and whose modules import ``_safe_divide`` by name
LATE_PACKAGE = "torchmetrics.functional.segmentation"


def _available_targets() -> list[str]:
    """Every declared target the installed releases have (an optional setting may be absent from older torch)."""
    absent = set(torchmetrics_syncfree.unavailable_targets())
    return [target for target in torchmetrics_syncfree.declared_targets() if target not in absent]


def _class_attributes() -> dict[str, object]:
    """The raw objects behind every available target, as found in their owners' namespaces."""
    found = {}
    for target in _available_targets():
        owner, name = _registry._resolve(target)
        found[target] = owner.__dict__.get(name, "<absent>") if isinstance(owner, type) else getattr(owner, name)
    return found


def _syncs_of_update(metric: MeanMetric) -> int:
    value = torch.tensor([0.5, 1.5])
    with SyncProbe() as probe:
        metric.update(value)
    return probe.count


def test_patch_all_reports_and_unpatch_restores_identical_objects():
    before = _class_attributes()
    patched = torchmetrics_syncfree.patch_all()
    assert patched == _available_targets()
    assert MEAN_UPDATE in patched
    assert all(torchmetrics_syncfree.is_patched(target) for target in patched)
    assert _class_attributes() != before
    assert sorted(torchmetrics_syncfree.unpatch_all()) == patched
    after = _class_attributes()
    assert all(after[target] is before[target] for target in before)
    assert not any(torchmetrics_syncfree.is_patched(target) for target in patched)


def test_patch_all_is_idempotent():
    first = torchmetrics_syncfree.patch_all()
    installed = _class_attributes()
    assert torchmetrics_syncfree.patch_all() == first
    assert all(_class_attributes()[target] is installed[target] for target in installed)
    torchmetrics_syncfree.unpatch_all()
    assert torchmetrics_syncfree.unpatch_all() == []


def test_get_original_is_stable_whether_patched_or_not():
    original = MeanMetric.__dict__["update"]
    assert torchmetrics_syncfree.get_original(MEAN_UPDATE) is original
    torchmetrics_syncfree.patch_all()
    assert torchmetrics_syncfree.get_original(MEAN_UPDATE) is original
    assert MeanMetric.__dict__["update"] is not original


def test_unknown_target_is_a_key_error():
    with pytest.raises(KeyError, match="not a torchmetrics_syncfree patch target"):
        torchmetrics_syncfree.is_patched("torchmetrics.aggregation.MeanMetric.forward")


def test_patched_context_only_undoes_what_it_patched():
    with torchmetrics_syncfree.patched():
        assert torchmetrics_syncfree.is_patched(MEAN_UPDATE)
    assert not torchmetrics_syncfree.is_patched(MEAN_UPDATE)

    torchmetrics_syncfree.patch_all()
    with torchmetrics_syncfree.patched():
        pass
    assert torchmetrics_syncfree.is_patched(MEAN_UPDATE), "an outer patch_all() must survive an inner block"


def test_metrics_created_before_patching_behave_patched_and_counts_stay_right():
    metric = MeanMetric()
    assert _syncs_of_update(metric) > 0
    torchmetrics_syncfree.patch_all()
    assert _syncs_of_update(metric) == 0
    metric(torch.tensor(3.0))
    assert metric._update_count == 3, "update must be wrapped exactly once"
    torch.testing.assert_close(metric.compute(), torch.tensor(7.0 / 5))


def test_metrics_created_while_patched_behave_stock_after_unpatch():
    torchmetrics_syncfree.patch_all()
    metric = MeanMetric()
    assert _syncs_of_update(metric) == 0
    torchmetrics_syncfree.unpatch_all()
    assert _syncs_of_update(metric) > 0
    torchmetrics_syncfree.patch_all()
    assert _syncs_of_update(metric) == 0
    assert metric._update_count == 3


def test_subclass_override_calling_super_is_wrapped_once():
    class Doubled(MeanMetric):
        def update(self, value):
            super().update(value * 2)

    stock = Doubled()
    stock.update(torch.tensor([1.0, 2.0]))
    torchmetrics_syncfree.patch_all()
    patched = Doubled()
    value = torch.tensor([1.0, 2.0])
    with SyncProbe() as probe:
        patched.update(value)
    assert probe.count == 0, probe.summary()
    assert patched._update_count == stock._update_count == 1
    torch.testing.assert_close(patched.compute(), stock.compute())


def test_subclass_overriding_the_nan_check_keeps_its_override():
    class NoChecks(SumMetric):
        def _cast_and_nan_check_input(self, x, weight=None):
            return torch.as_tensor(x, dtype=self.dtype), torch.ones(())

    torchmetrics_syncfree.patch_all()
    metric = NoChecks(nan_strategy="error")
    metric.update(torch.tensor([1.0, float("nan")]))  # the override skips the check, so no error
    assert torch.isnan(metric.compute())


@pytest.mark.parametrize("roundtrip", ["pickle", "deepcopy", "clone"])
def test_patched_metrics_pickle_and_copy(roundtrip):
    torchmetrics_syncfree.patch_all()
    metric = MeanMetric()
    metric.update(torch.tensor([1.0, 3.0]))
    if roundtrip == "pickle":
        other = pickle.loads(pickle.dumps(metric))
    elif roundtrip == "deepcopy":
        other = copy.deepcopy(metric)
    else:
        other = metric.clone()
    assert _syncs_of_update(other) == 0
    torch.testing.assert_close(other.compute(), torch.tensor(1.5))
    torch.testing.assert_close(metric.compute(), torch.tensor(2.0))


def test_unsupported_version_is_refused_before_touching_anything(monkeypatch):
    monkeypatch.setattr(_registry, "SUPPORTED_TORCHMETRICS", ">=99")
    monkeypatch.delenv(_registry.FORCE_ENV_VAR, raising=False)
    before = _class_attributes()
    with pytest.raises(torchmetrics_syncfree.UnsupportedVersionError) as err:
        torchmetrics_syncfree.patch_all()
    message = str(err.value)
    import torchmetrics

    assert torchmetrics.__version__ in message
    assert ">=99" in message
    assert "force=True" in message
    assert _class_attributes() == before


def test_force_patches_an_unsupported_version(monkeypatch):
    monkeypatch.setattr(_registry, "SUPPORTED_TORCHMETRICS", ">=99")
    assert MEAN_UPDATE in torchmetrics_syncfree.patch_all(force=True)
    torchmetrics_syncfree.unpatch_all()
    monkeypatch.setenv(_registry.FORCE_ENV_VAR, "1")
    assert MEAN_UPDATE in torchmetrics_syncfree.patch_all()


def test_signature_mismatch_is_refused_before_touching_anything(monkeypatch):
    spec = _registry._spec(CAST_CHECK)  # loads the areas first, whatever ran before in this worker
    monkeypatch.setattr(spec, "params", ("self", "x", "weights"))
    before = _class_attributes()
    with pytest.raises(torchmetrics_syncfree.PatchTargetError, match="weights"):
        torchmetrics_syncfree.patch_all()
    assert _class_attributes() == before


def test_failure_while_installing_rolls_back(monkeypatch):
    real_install = _registry._install
    calls = []

    def failing_install(spec, original, bindings):
        calls.append(spec.target)
        if len(calls) == 3:
            raise OSError("simulated failure while installing")
        real_install(spec, original, bindings)

    monkeypatch.setattr(_registry, "_install", failing_install)
    before = _class_attributes()
    with pytest.raises(OSError, match="simulated"):
        torchmetrics_syncfree.patch_all()
    after = _class_attributes()
    assert all(after[target] is before[target] for target in before)
    assert not any(torchmetrics_syncfree.is_patched(target) for target in before)


DYNAMO_SETTING = "torch._dynamo.config.allow_unspec_int_on_nn_module"


def test_an_optional_setting_the_installed_torch_lacks_is_left_out(monkeypatch):
    """A torch without the setting (before 2.6) is patched without it; every metric patch still goes in."""

    spec = _registry._spec(DYNAMO_SETTING)
    assert spec.optional
    monkeypatch.setattr(_registry, "_resolve", _without(DYNAMO_SETTING, _registry._resolve))
    assert torchmetrics_syncfree.unavailable_targets() == [DYNAMO_SETTING]
    patched = torchmetrics_syncfree.patch_all()
    assert DYNAMO_SETTING not in patched
    assert MEAN_UPDATE in patched
    assert not torchmetrics_syncfree.is_patched(DYNAMO_SETTING)
    assert DYNAMO_SETTING not in torchmetrics_syncfree.unpatch_all()


def test_a_required_setting_the_installed_torch_lacks_refuses_the_patch(monkeypatch):
    spec = _registry._spec(DYNAMO_SETTING)
    monkeypatch.setattr(spec, "optional", False)
    monkeypatch.setattr(_registry, "_resolve", _without(DYNAMO_SETTING, _registry._resolve))
    with pytest.raises(torchmetrics_syncfree.PatchTargetError, match="does not exist"):
        torchmetrics_syncfree.patch_all()
    assert not torchmetrics_syncfree.patched_targets()


def _without(target: str, resolve: Callable[[str], Any]) -> Callable[[str], Any]:
    """``_registry._resolve`` as on a release without ``target``: its owner lacks the attribute."""

    def resolve_without(dotted: str) -> Any:
        owner, name = resolve(dotted)
        return (ModuleType("stand-in without the setting"), name) if dotted == target else (owner, name)

    return resolve_without


def test_unavailable_targets_are_those_of_the_installed_torch():
    has_setting = hasattr(_registry._resolve(DYNAMO_SETTING)[0], "allow_unspec_int_on_nn_module")
    assert (DYNAMO_SETTING in torchmetrics_syncfree.unavailable_targets()) is not has_setting


@pytest.mark.slow  # ~40 s of threads racing the registry, whose code is the same on every release: latest only
def test_concurrent_patch_and_unpatch_leave_a_consistent_state():
    errors = []

    def churn(patch: bool) -> None:
        try:
            for _ in range(50):
                torchmetrics_syncfree.patch_all() if patch else torchmetrics_syncfree.unpatch_all()
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=churn, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    states = {torchmetrics_syncfree.is_patched(t) for t in _available_targets()}
    assert len(states) == 1, "all targets patched or none"
    torchmetrics_syncfree.unpatch_all()
    assert BaseAggregator.__dict__["_cast_and_nan_check_input"] is torchmetrics_syncfree.get_original(CAST_CHECK)


def test_verbose_prints_the_targets(capsys):
    torchmetrics_syncfree.patch_all(verbose=True)
    out = capsys.readouterr().out
    assert MEAN_UPDATE in out


def test_a_metric_made_before_patching_reports_deferred_checks_in_compute():
    """Its checks are added on its first patched update, and compute() (the patched sync_context) reports them."""
    metric = SumMetric(nan_strategy="error")
    value = torch.tensor([float("nan")])
    torchmetrics_syncfree.patch_all()
    with _instrumentation.simulated_copy_delay(None), SyncProbe():  # the device path: the NaN check is only read later
        metric.update(value)
        with pytest.raises(RuntimeError, match="Encountered `nan` values in tensor"):
            metric.compute()


def test_compute_of_a_metric_made_while_patched_costs_no_descriptor_lookup():
    torchmetrics_syncfree.patch_all()
    metric = CatMetric()
    assert "compute" in vars(metric)
    assert type(metric).__dict__["compute"].__class__.__name__ == "_MetricMethod"
    assert not hasattr(type(type(metric).__dict__["compute"]), "__set__"), "instance attribute must win"


@pytest.fixture
def late_package(monkeypatch: pytest.MonkeyPatch) -> Callable[[], ModuleType]:
    """Import :data:`LATE_PACKAGE` afresh when called; the test's end puts back the modules that were loaded before."""
    import torchmetrics.functional

    for name in [n for n in sys.modules if n == LATE_PACKAGE or n.startswith(f"{LATE_PACKAGE}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(torchmetrics.functional, LATE_PACKAGE.rsplit(".", 1)[1], raising=False)
    return lambda: importlib.import_module(f"{LATE_PACKAGE}.dice")


def _installed_helpers() -> dict[int, str]:
    """``id -> target`` of the replacement objects ``patch_all()`` installed for the ``everywhere`` specs."""
    return {id(spec.installed): spec.target for spec in _registry._specs.values() if spec.everywhere and spec.active}


def _modules_holding(helpers: dict[int, str]) -> list[str]:
    """``module.attribute (target)`` of every TorchMetrics module attribute that is one of ``helpers``."""
    return [
        f"{module.__name__}.{attr} ({helpers[id(value)]})"
        for module in _registry._torchmetrics_modules()
        for attr, value in vars(module).items()
        if id(value) in helpers
    ]


def test_unpatch_restores_helpers_in_modules_first_imported_while_patched(late_package):
    original = torchmetrics_syncfree.get_original(SAFE_DIVIDE)
    torchmetrics_syncfree.patch_all()
    dice = late_package()
    assert dice._safe_divide is not original, "the module imported the patched helper"
    helpers = _installed_helpers()
    assert "torchmetrics.functional.segmentation.dice._safe_divide" in " ".join(_modules_holding(helpers))
    torchmetrics_syncfree.unpatch_all()
    assert dice._safe_divide is original
    assert _modules_holding(helpers) == []


def test_a_nested_patched_block_leaves_late_imports_patched_until_the_outer_unpatch(late_package):
    original = torchmetrics_syncfree.get_original(SAFE_DIVIDE)
    torchmetrics_syncfree.patch_all()
    with torchmetrics_syncfree.patched():
        dice = late_package()
    assert dice._safe_divide is _registry._spec(SAFE_DIVIDE).installed, "the outer patch is still active"
    with torchmetrics_syncfree.patched(areas=["classification"]):
        pass
    assert dice._safe_divide is not original
    torchmetrics_syncfree.unpatch_all()
    assert dice._safe_divide is original


def test_a_patched_block_restores_its_late_imports_on_exit(late_package):
    with torchmetrics_syncfree.patched():
        dice = late_package()
        helpers = _installed_helpers()
    assert dice._safe_divide is torchmetrics_syncfree.get_original(SAFE_DIVIDE)
    assert _modules_holding(helpers) == []


def test_patched_properties_keep_stock_docstring():
    properties = [
        t for t in torchmetrics_syncfree.declared_targets() if isinstance(_registry._spec(t).replacement, property)
    ]
    assert properties
    stock = {t: _as_callers_find(t).__doc__ for t in properties}
    torchmetrics_syncfree.patch_all()
    for target in properties:
        assert _as_callers_find(target) is not None and _as_callers_find(target).__doc__ == stock[target]


def _as_callers_find(target: str) -> Any:
    """The target looked up as user code does: ``MeanMetric.update``, ``compute._safe_divide``."""
    owner, name = _registry._resolve(target)
    return getattr(owner, name)


def _help_text(obj: Any) -> str:
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


@pytest.mark.parametrize(
    "target", [t for t in torchmetrics_syncfree.declared_targets() if callable(_registry._spec(t).replacement)]
)
def test_patched_targets_show_stock_docstring_signature_and_help(target):
    stock = _as_callers_find(target)
    stock_help = _help_text(stock)
    torchmetrics_syncfree.patch_all()
    patched = _as_callers_find(target)
    assert patched is not stock, "the lookup finds the patched object"
    assert patched.__doc__ == stock.__doc__
    assert inspect.signature(patched) == inspect.signature(stock)
    assert _help_text(patched) == stock_help


def _example_metrics() -> list[Any]:
    """One metric of each family whose methods the registry patches."""
    from torchmetrics import MetricCollection
    from torchmetrics.aggregation import CatMetric, MaxMetric, MinMetric
    from torchmetrics.classification import (
        BinaryAUROC,
        BinaryAveragePrecision,
        BinaryConfusionMatrix,
        BinaryHingeLoss,
        BinaryLogAUC,
        BinaryPrecisionRecallCurve,
        BinaryROC,
        BinaryStatScores,
        MulticlassAUROC,
        MulticlassAveragePrecision,
        MulticlassCohenKappa,
        MulticlassConfusionMatrix,
        MulticlassExactMatch,
        MulticlassHingeLoss,
        MulticlassLogAUC,
        MulticlassPrecisionRecallCurve,
        MulticlassROC,
        MulticlassStatScores,
        MultilabelAUROC,
        MultilabelAveragePrecision,
        MultilabelConfusionMatrix,
        MultilabelExactMatch,
        MultilabelLogAUC,
        MultilabelROC,
        MultilabelStatScores,
    )
    from torchmetrics.retrieval import RetrievalFallOut, RetrievalMRR
    from torchmetrics.segmentation import GeneralizedDiceScore
    from torchmetrics.wrappers import BootStrapper, MinMaxMetric, Running

    return [
        MetricCollection([SumMetric()]),
        MeanMetric(),
        SumMetric(),
        MaxMetric(),
        MinMetric(),
        CatMetric(),
        BinaryStatScores(),
        MulticlassStatScores(num_classes=3),
        MultilabelStatScores(num_labels=3),
        BinaryConfusionMatrix(),
        MulticlassConfusionMatrix(num_classes=3),
        MultilabelConfusionMatrix(num_labels=3),
        MulticlassCohenKappa(num_classes=3),  # its own compute and __init__, the confusion matrix's update
        BinaryHingeLoss(),
        MulticlassHingeLoss(num_classes=3),
        MulticlassExactMatch(num_classes=3),
        MultilabelExactMatch(num_labels=3),
        BinaryPrecisionRecallCurve(thresholds=5),
        MulticlassAveragePrecision(num_classes=3),  # sets validate_args after the curve's __init__
        MultilabelROC(num_labels=3),
        BinaryAUROC(max_fpr=0.5),
        MulticlassAUROC(num_classes=3),
        MultilabelAUROC(num_labels=3, thresholds=5),
        BinaryAveragePrecision(),
        MultilabelAveragePrecision(num_labels=3),
        BinaryROC(ignore_index=-1),
        MulticlassROC(num_classes=3),
        MulticlassPrecisionRecallCurve(num_classes=3, ignore_index=0),
        BinaryLogAUC(),
        MulticlassLogAUC(num_classes=3, thresholds=5),
        MultilabelLogAUC(num_labels=3),
        *_regression_metrics(),
        # the other metrics, the wrappers and retrieval
        GeneralizedDiceScore(num_classes=3),
        MinMaxMetric(MeanMetric()),
        Running(MeanMetric(), window=2),
        BootStrapper(MeanMetric(), num_bootstraps=2),
        RetrievalMRR(),  # the retrieval base class's __init__, update and compute
        RetrievalFallOut(),  # its own compute
        *_fixed_point_metrics(),
        *_calibration_fairness_ranking_metrics(),
        *_nominal_metrics(),
        *_segmentation_detection_metrics(),
        *_image_metrics(),
        *_retrieval_curve_and_wrapper_metrics(),
    ]


def _retrieval_curve_and_wrapper_metrics() -> list[Any]:
    """Areas ``retrieval_precision_recall_curve``, ``bootstrapping`` (above) and ``multioutput``."""
    from torchmetrics.regression import MeanSquaredError
    from torchmetrics.retrieval import RetrievalPrecisionRecallCurve
    from torchmetrics.wrappers import MultioutputWrapper

    return [RetrievalPrecisionRecallCurve(max_k=3), MultioutputWrapper(MeanSquaredError(), num_outputs=2)]


def _segmentation_detection_metrics() -> list[Any]:
    """Areas ``hausdorff_distance``, ``detection_iou`` and ``panoptic_qualities``."""
    from unittest import mock

    from torchmetrics.detection import ModifiedPanopticQuality, PanopticQuality
    from torchmetrics.detection import iou as iou_module
    from torchmetrics.segmentation import HausdorffDistance

    with mock.patch.object(iou_module, "_TORCHVISION_AVAILABLE", True):  # its __init__ only checks the flag
        box_iou = iou_module.IntersectionOverUnion()
    return [
        HausdorffDistance(num_classes=3),
        PanopticQuality(things={0}, stuffs={1}),
        ModifiedPanopticQuality(things={0}, stuffs={1}),
        box_iou,
    ]


def _image_metrics() -> list[Any]:
    """The image metrics whose methods the registry patches (area ``ssim``)."""
    from torchmetrics.image import MultiScaleStructuralSimilarityIndexMeasure

    return [MultiScaleStructuralSimilarityIndexMeasure()]


def _nominal_metrics() -> list[Any]:
    """One metric of each nominal class (areas ``cramers``, ``tschuprows``, ``pearsons_contingency``, ``theils_u``)."""
    from torchmetrics import nominal

    return [
        nominal.CramersV(num_classes=3),
        nominal.TschuprowsT(num_classes=3),
        nominal.PearsonsContingencyCoefficient(num_classes=3),
        nominal.TheilsU(num_classes=3),
    ]


def _calibration_fairness_ranking_metrics() -> list[Any]:
    """One metric of each class of the areas ``calibration_error``, ``group_fairness`` and ``ranking``."""
    from torchmetrics import classification

    return [
        classification.BinaryCalibrationError(),
        classification.MulticlassCalibrationError(num_classes=3),
        classification.BinaryFairness(num_groups=2),
        classification.BinaryGroupStatRates(num_groups=2),
        classification.MultilabelCoverageError(num_labels=3),
        classification.MultilabelRankingAveragePrecision(num_labels=3),
        classification.MultilabelRankingLoss(num_labels=3),
    ]


def _fixed_point_metrics() -> list[Any]:
    """One metric of each fixed-output curve class (area ``fixed_point_curves``; EER from torchmetrics 1.7)."""
    import torchmetrics.classification as classification

    from torchmetrics_syncfree.classification.fixed_point_curves import HAS_EER

    arguments = {
        "PrecisionAtFixedRecall": {"min_recall": 0.5},
        "RecallAtFixedPrecision": {"min_precision": 0.5},
        "SensitivityAtSpecificity": {"min_specificity": 0.5},
        "SpecificityAtSensitivity": {"min_sensitivity": 0.5},
        **({"EER": {}} if HAS_EER else {}),
    }
    sizes = {"Binary": {}, "Multiclass": {"num_classes": 3}, "Multilabel": {"num_labels": 3}}
    return [
        getattr(classification, f"{task}{name}")(**size, **kwargs)
        for name, kwargs in arguments.items()
        for task, size in sizes.items()
    ]


def _regression_metrics() -> list[Any]:
    """The regression metrics whose methods the regression areas patch."""
    import warnings

    from torchmetrics.regression import (
        ConcordanceCorrCoef,
        ExplainedVariance,
        LogCoshError,
        PearsonCorrCoef,
        R2Score,
        SpearmanCorrCoef,
        TweedieDevianceScore,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SpearmanCorrCoef's memory warning
        return [
            R2Score(),
            ExplainedVariance(),
            PearsonCorrCoef(num_outputs=2),
            SpearmanCorrCoef(),
            ConcordanceCorrCoef(),  # its own compute
            TweedieDevianceScore(power=1.5),  # __init__ and update
            LogCoshError(),  # update
        ]


def _method_targets() -> list[str]:
    """Every target that is an attribute of a class, so that instances reach it as a method."""
    return [t for t in torchmetrics_syncfree.declared_targets() if isinstance(_registry._resolve(t)[0], type)]


def test_methods_of_patched_metrics_show_stock_docstring_signature_and_help():
    made_stock = _example_metrics()
    expected = {}
    for metric in made_stock:
        for target in _method_targets():
            owner, name = _registry._resolve(target)
            if isinstance(metric, owner):
                expected[target, type(metric)] = _help_text(getattr(metric, name)), getattr(metric, name).__doc__
    uncovered = set(_method_targets()) - {target for target, _ in expected}
    assert not uncovered, f"add a metric of each of these classes to _example_metrics(): {sorted(uncovered)}"
    torchmetrics_syncfree.patch_all()
    for metric in [*made_stock, *_example_metrics()]:  # made before patching (then adopted) and while patched
        for target in _method_targets():
            owner, name = _registry._resolve(target)
            if not isinstance(metric, owner):
                continue
            method = getattr(metric, name)
            where = f"{type(metric).__name__}().{name} ({target})"
            assert (_help_text(method), method.__doc__) == expected[target, type(metric)], where


def test_the_replacement_is_relabelled_in_place_and_gets_its_own_labels_back():
    spec = _registry._spec(SAFE_DIVIDE)
    own_doc, own_name, own_source = (
        spec.replacement.__doc__,
        spec.replacement.__qualname__,
        inspect.getsource(spec.replacement),
    )
    torchmetrics_syncfree.patch_all()
    assert _as_callers_find(SAFE_DIVIDE) is spec.replacement, "no wrapper: a call costs what the replacement costs"
    assert spec.replacement.__doc__ != own_doc
    assert inspect.getsource(spec.replacement) == own_source, "the source shown is the code that runs"
    torchmetrics_syncfree.unpatch_all()
    assert (spec.replacement.__doc__, spec.replacement.__qualname__) == (own_doc, own_name)
    assert "__signature__" not in vars(spec.replacement)


def test_stock_objects_are_resolved_when_patching() -> None:
    """``stock()`` is a dict look-up once patched: a compiled ``forward`` reaches it through ``reset()``, and a miss
    would import modules there (a graph break)."""
    with torchmetrics_syncfree.patched() as targets:
        for target in targets:
            assert target in _registry._stock_objects, target
            assert _registry.stock(target) is _registry.get_original(target), target


def test_stock_gives_the_original_whether_or_not_patched() -> None:
    target = "torchmetrics.metric.Metric.reset"
    assert _registry.stock(target) is torchmetrics.Metric.reset
    with torchmetrics_syncfree.patched():
        assert torchmetrics.Metric.reset is not _registry.stock(target)
        assert _registry.stock(target).__module__ == "torchmetrics.metric"


def test_the_areas_reach_stock_through_the_one_accessor() -> None:
    """No area keeps its own cached copy of ``get_original`` (they imported modules on the traced path of forward)."""
    package = Path(torchmetrics_syncfree.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name in ("_registry.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "get_original":
                offenders.append(f"{path.relative_to(package)}:{node.lineno} get_original")
            if isinstance(node, ast.FunctionDef) and node.name in ("_stock", "_original"):
                offenders.append(f"{path.relative_to(package)}:{node.lineno} def {node.name}")
    assert offenders == []


def test_patching_imports_none_of_the_tooling():
    """``patch_all()`` and the patched ``torchmetrics`` load no module of ``torchmetrics_syncfree.tools`` (a fresh
    interpreter, so the audit/census/demo modules this test session imports elsewhere do not count)."""
    snippet = (
        "import sys, torchmetrics_syncfree; torchmetrics_syncfree.patch_all(); import torchmetrics;"
        " print(sorted(m for m in sys.modules if m.startswith('torchmetrics_syncfree.tools')))"
    )
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


#: the modules that may import the probe: itself, the package's public namespace, the pytest plugin, the tooling
PROBE_CLIENTS = ("probe.py", "__init__.py", "pytest_plugin.py", "__main__.py")


def test_the_patched_code_never_imports_the_probe():
    """The library tells a probe what a GPU would do through ``_instrumentation``'s hooks, installed by the probe."""
    package = Path(torchmetrics_syncfree.__file__).parent
    importers = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] == "tools" or str(relative) in PROBE_CLIENTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if "torchmetrics_syncfree.probe" in names:
                importers.append(str(relative))
    assert importers == []


def _installed_probe() -> object:
    hooks = _instrumentation.hooks
    return None if hooks is None else hooks.probe


def test_a_cpu_probe_installs_its_hooks_while_entered():
    assert _installed_probe() is None
    assert not _instrumentation.simulating_device()
    with SyncProbe():
        assert _installed_probe() is not None
        assert _instrumentation.simulating_device()
        assert not _deferred.reads_are_free(torch.zeros(1))
        with SyncProbe():  # nested: the hooks stay until the last one leaves
            pass
        assert _instrumentation.simulating_device()
    assert _installed_probe() is None


def test_nothing_is_installed_outside_tests_and_each_switch_installs_the_seam():
    """Outside tests the hot path's one read of the seam finds ``None``; each switch installs it until undone."""
    script = (
        "import torch\n"
        "from torchmetrics_syncfree import _deferred, _instrumentation as seam\n"
        "assert seam.hooks is None and _deferred.reads_are_free(torch.zeros(1))\n"
        "seam.force_device_path(True)\n"
        "assert seam.hooks is not None and not _deferred.reads_are_free(torch.zeros(1))\n"
        "seam.force_device_path(False)\n"
        "assert seam.hooks is None\n"
        "with seam.simulated_copy_delay(None):\n"
        "    assert seam.hooks.copy_delay is None and _deferred.reads_are_free(torch.zeros(1))\n"
        "with seam.copy_interval(3):\n"
        "    assert seam.hooks.copy_interval == 3\n"
        "assert seam.hooks is None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != _instrumentation.DEVICE_PATH_ENV_VAR}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    env[_instrumentation.DEVICE_PATH_ENV_VAR] = "1"
    forced = "from torchmetrics_syncfree import _instrumentation as seam\nassert seam.device_path_forced()\n"
    subprocess.run([sys.executable, "-c", forced], check=True, env=env, timeout=120)


def test_a_kept_signature_gives_way_to_a_later_override() -> None:
    """Signatures are kept per function across ``patch_all()`` calls; one given ``__signature__`` or ``__wrapped__``
    afterwards (e.g. by another library's decorator) is read again, as :func:`inspect.signature` reads it."""

    def update(self: Any, value: Any) -> None: ...

    def other(self: Any, preds: Any, target: Any) -> None: ...

    assert tuple(_registry._signature(update).parameters) == ("self", "value")
    assert _registry._signature(update) is _registry._signature(update)
    update.__signature__ = inspect.signature(other)  # type: ignore[attr-defined]
    assert tuple(_registry._signature(update).parameters) == ("self", "preds", "target")
    del update.__signature__  # type: ignore[attr-defined]
    update.__wrapped__ = other  # type: ignore[attr-defined]
    assert _registry._signature(update) == inspect.signature(update)
