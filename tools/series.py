"""The upstream patch series in ``patches/``: apply it to a TorchMetrics checkout, regenerate it, test it.

Commands::

    python tools/series.py apply CHECKOUT [--check] [--pr NN-name]   # git am the series (or a pull request and the
                                                        # ones it names); --check: dry run in a scratch worktree
    python tools/series.py checkout DIR                 # snapshot -> DIR, tag `upstream`, branch `syncfree` = series
    python tools/series.py make CHECKOUT [--base upstream] [--head HEAD]   # git format-patch -> patches/
    python tools/series.py test [--archive A ...] [--heavy subset]   # `tox -e upstream` (CI: --heavy subset); also
                                                        # each pull request on exactly the ones it names
    python tools/series.py baseline [--archive A]       # record the unpatched outcomes of the heavy suites
    python tools/series.py hoist CHECKOUT --pr SPEC ... --branch B   # re-make the stack behind pull requests

``patches/`` holds one folder per pull request, ``NN-short-name/``: its ``git format-patch`` files and its description
(``README.md``, whose ``Needs:`` line names the pull requests it applies on, or ``none``). The whole series is every
folder's patches in the folders' order.

``apply`` never leaves a checkout half-patched: when a patch does not apply, it names the patch and the file (and
line) that failed, runs ``git am --abort`` and so restores the checkout's HEAD, index and work tree.

"""

from __future__ import annotations

import argparse
import ast
import contextlib
import email
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _upstream import (
    GIT_IDENTITY,
    REPO,
    SHARED_UPSTREAM,
    SNAPSHOTS,
    git,
    locate_snapshot,
    make_checkout,
    snapshot_label,
    unpack,
)

SERIES_DIR = REPO / "patches"
_PATCH_NAME = re.compile(r"^\d{4}-[a-z0-9][a-z0-9._-]*\.patch$")
_PR_NAME = re.compile(r"^\d{2}-[a-z0-9][a-z0-9-]*$")

#: upstream tests that always run (relative to the tree's tests/), and the ones each touched source path adds
ALWAYS_TESTS = ("unittests/bases/test_aggregation.py", "unittests/utilities/", "unittests/bases/test_ddp.py")
CLASSIFICATION_TESTS = tuple(
    f"unittests/classification/test_{name}.py"
    for name in ("accuracy", "precision_recall", "f_beta", "specificity", "stat_scores")
)
#: the suites of the confusion matrix and the metrics built on it (CohenKappa, JaccardIndex, MatthewsCorrCoef)
CONFUSION_MATRIX_TESTS = tuple(
    f"unittests/classification/test_{name}.py"
    for name in ("confusion_matrix", "cohen_kappa", "jaccard", "matthews_corrcoef")
)
#: their sources, and the stat scores' functional module, whose validation and counting the confusion matrix uses
CONFUSION_MATRIX_SOURCES = (
    "src/torchmetrics/classification/confusion_matrix.py",
    "src/torchmetrics/functional/classification/confusion_matrix.py",
    "src/torchmetrics/functional/classification/jaccard.py",
    "src/torchmetrics/functional/classification/matthews_corrcoef.py",
    "src/torchmetrics/functional/classification/stat_scores.py",
)
#: the hinge loss's and exact match's sources and suites
HINGE_SOURCES = ("src/torchmetrics/classification/hinge.py", "src/torchmetrics/functional/classification/hinge.py")
HINGE_TESTS = ("unittests/classification/test_hinge.py",)
EXACT_MATCH_SOURCES = (
    "src/torchmetrics/classification/exact_match.py",
    "src/torchmetrics/functional/classification/exact_match.py",
)
EXACT_MATCH_TESTS = ("unittests/classification/test_exact_match.py",)
#: the precision-recall curve family's sources (its update, the curve and ROC computes) and suites
PR_CURVE_SOURCES = (
    "src/torchmetrics/classification/precision_recall_curve.py",
    "src/torchmetrics/functional/classification/precision_recall_curve.py",
    "src/torchmetrics/classification/roc.py",
)
PR_CURVE_TESTS = (
    "unittests/classification/test_precision_recall_curve.py",
    "unittests/classification/test_roc.py",
)
#: the family's computes without host reads (AUROC, average precision, LogAUC) and their suites; their fixed-shape
#: helpers live in the functional modules, and the shared ones in the functional precision_recall_curve.py
CURVE_COMPUTE_SOURCES = (
    "src/torchmetrics/classification/auroc.py",
    "src/torchmetrics/functional/classification/auroc.py",
    "src/torchmetrics/classification/average_precision.py",
    "src/torchmetrics/functional/classification/average_precision.py",
    "src/torchmetrics/classification/logauc.py",
    "src/torchmetrics/functional/classification/logauc.py",
)
CURVE_COMPUTE_TESTS = (
    "unittests/classification/test_auroc.py",
    "unittests/classification/test_average_precision.py",
    "unittests/classification/test_logauc.py",
)
#: the regression metrics' sources (the series changes their classes' methods and, for KLDivergence, the functional
#: update) and each one's upstream suite
REGRESSION_TESTS = {
    "src/torchmetrics/regression/r2.py": ("unittests/regression/test_r2.py",),
    "src/torchmetrics/regression/explained_variance.py": ("unittests/regression/test_explained_variance.py",),
    "src/torchmetrics/regression/pearson.py": ("unittests/regression/test_pearson.py",),
    "src/torchmetrics/functional/regression/kl_divergence.py": ("unittests/regression/test_kl_divergence.py",),
    "src/torchmetrics/regression/spearman.py": ("unittests/regression/test_spearman.py",),
}
#: MinMaxMetric's source and suite (its wrapper suite is also in the metric's list below)
MINMAX_SOURCES = ("src/torchmetrics/wrappers/minmax.py",)
MINMAX_TESTS = ("unittests/wrappers/test_minmax.py",)
#: Perplexity's statistics (the functional update, which the class's update calls) and its suite
PERPLEXITY_SOURCES = ("src/torchmetrics/functional/text/perplexity.py",)
PERPLEXITY_TESTS = ("unittests/text/test_perplexity.py",)
#: PeakSignalNoiseRatio's helpers (the functional update and compute, which the class calls) and its suite (needs
#: scikit-image)
PSNR_SOURCES = ("src/torchmetrics/functional/image/psnr.py",)
PSNR_TESTS = ("unittests/image/test_psnr.py",)
#: GeneralizedDiceScore (its update, the functional update and the segmentation formatting its update calls with
#: ``flags``; other callers of the formatting pass none) and its suite (needs monai)
GENERALIZED_DICE_SOURCES = (
    "src/torchmetrics/segmentation/generalized_dice.py",
    "src/torchmetrics/functional/segmentation/generalized_dice.py",
    "src/torchmetrics/functional/segmentation/utils.py",
)
GENERALIZED_DICE_TESTS = ("unittests/segmentation/test_generalized_dice_score.py",)
#: the retrieval metrics' update and compute (every ``RetrievalMetric``; RetrievalPrecisionRecallCurve and
#: RetrievalRecallAtFixedPrecision have their own and are not changed) and fall-out's own compute; their suites
RETRIEVAL_SOURCES = ("src/torchmetrics/retrieval/base.py", "src/torchmetrics/retrieval/fall_out.py")
RETRIEVAL_TESTS = tuple(
    f"unittests/retrieval/test_{name}.py"
    for name in ("mrr", "hit_rate", "precision", "recall", "map", "ndcg", "r_precision", "fallout", "auroc")
)
FALL_OUT_TESTS = ("unittests/retrieval/test_fallout.py",)
#: the breadth areas' second round (series 0043-0050): the classification leftovers, the fixed-output curves'
#: computes, MultioutputWrapper, HausdorffDistance, the box IoU metrics and the wrappers' held internal resets
CALIBRATION_FAIRNESS_RANKING_SOURCES = tuple(
    f"src/torchmetrics/{prefix}classification/{name}.py"
    for prefix in ("", "functional/")
    for name in ("calibration_error", "group_fairness", "ranking")
)
#: the fixed-output curve metrics' upstream modules (the functional side has no sensitivity/specificity modules)
FIXED_POINT_MODULES = (
    "eer",
    "precision_fixed_recall",
    "recall_fixed_precision",
    "sensitivity_specificity",
    "specificity_sensitivity",
)
FIXED_POINT_SOURCES = (
    *(f"src/torchmetrics/classification/{name}.py" for name in FIXED_POINT_MODULES),
    *(f"src/torchmetrics/functional/classification/{name}.py" for name in FIXED_POINT_MODULES[:3]),
)
#: their upstream suites: ~2470 tests, heavy (upstream-full), the added tests run by hand (docs/patches.md)
FIXED_POINT_TESTS = tuple(f"unittests/classification/test_{name}.py" for name in FIXED_POINT_MODULES)
#: source prefix -> (upstream tests, heavy?) ; heavy suites run on the first snapshot only
TESTS_FOR_SOURCE = {
    "src/torchmetrics/classification/": (CLASSIFICATION_TESTS, True),
    "src/torchmetrics/functional/classification/": (CLASSIFICATION_TESTS, True),
    "src/torchmetrics/utilities/compute.py": (CLASSIFICATION_TESTS, True),
    **{path: (CONFUSION_MATRIX_TESTS, True) for path in CONFUSION_MATRIX_SOURCES},
    **{path: (HINGE_TESTS, True) for path in HINGE_SOURCES},
    **{path: (EXACT_MATCH_TESTS, True) for path in EXACT_MATCH_SOURCES},
    **{path: (PR_CURVE_TESTS, True) for path in PR_CURVE_SOURCES},
    **{path: (CURVE_COMPUTE_TESTS, True) for path in CURVE_COMPUTE_SOURCES},
    # not heavy: unittests/wrappers/, which holds it, runs live on every snapshot for metric.py anyway (a recorded
    # baseline of a file inside a live directory would be missing from the live patched outcomes)
    **{path: (MINMAX_TESTS, False) for path in MINMAX_SOURCES},
    **{path: (PERPLEXITY_TESTS, True) for path in PERPLEXITY_SOURCES},
    **{path: (PSNR_TESTS, True) for path in PSNR_SOURCES},
    **{path: (GENERALIZED_DICE_TESTS, True) for path in GENERALIZED_DICE_SOURCES},
    "src/torchmetrics/retrieval/base.py": (RETRIEVAL_TESTS, True),
    "src/torchmetrics/retrieval/fall_out.py": (FALL_OUT_TESTS, True),
    "src/torchmetrics/functional/classification/precision_recall_curve.py": (
        PR_CURVE_TESTS + CURVE_COMPUTE_TESTS,
        True,
    ),
    **{path: (tests, True) for path, tests in REGRESSION_TESTS.items()},
    **{path: (FIXED_POINT_TESTS, True) for path in FIXED_POINT_SOURCES},
    # the in-place state updates' helpers: metrics across inference-mode epochs (not heavy, seconds)
    "src/torchmetrics/utilities/states.py": (("unittests/bases/test_inference_mode.py",), False),
    "src/torchmetrics/metric.py": (
        (
            "unittests/bases/test_metric.py",
            "unittests/bases/test_collections.py",
            "unittests/bases/test_saving_loading.py",
            "unittests/wrappers/",
        ),
        False,
    ),
}
#: the tree-mode project suites' tests (``test --project-markers``): all that run without CUDA; CI leaves out the slow
#: ones (the compiled-step matrix, the Lightning sequences' variants), which the layer runs on the latest release
#: (``tox -e tm19``), the DDP worlds and the catalogue matrices (strided inputs, Lightning sequences; every layer
#: environment runs them); ``tox -e upstream-full`` runs all of them in tree mode
PROJECT_MARKERS = "not cuda"
#: the heavy suites' unpatched outcomes, recorded per snapshot (``python tools/series.py baseline``): the default
#: ``test`` compares with them instead of running the heavy suites a second time on the unpatched tree
BASELINES_DIR = REPO / "tools" / "baselines"
HEAVY_TESTS = tuple(sorted({t for tests, heavy in TESTS_FOR_SOURCE.values() if heavy for t in tests}))
#: ``test --heavy subset`` (CI): the heavy suites cut to stat scores' (the file the series changes, the update every
#: stat-score metric shares; accuracy's suite repeats that update under another reduction: 1099 tests, 288 of them DDP
#: cases that run in one process; CI runs it against the layer in ``tox -e upstream-device`` and ``-e
#: upstream-classification``, and the tree-mode project suites compare Accuracy with stock); ``--heavy all`` runs all of
#: them, accuracy's included, the confusion-matrix family's four included (those add ~450 s on 2 cores: over CI's
#: budget; CI runs upstream's confusion-matrix suite against the layer in ``tox -e upstream-device``, and the tree-mode
#: project suite tests/test_confusion_matrix.py against the series), and the hinge-loss and exact-match suites (whose
#: tree-mode project suites run in CI as well)
#: The five regression suites and Perplexity's are quick (~40 s on 2 cores, DDP part included; MinMaxMetric's
#: is not heavy, it runs with unittests/wrappers/): CI runs them all; PSNR's and GeneralizedDiceScore's need
#: scikit-image and monai (``OPTIONAL_PACKAGE_TESTS``).
#: Of the nine retrieval suites (~20 min with -n 1) CI runs R-precision's (every ``RetrievalMetric`` update and the
#: shared compute, ~25 s with -n 1), and the series' own tests/unittests/retrieval/test_base.py as a touched file.
HEAVY_SUBSET = (
    "unittests/classification/test_stat_scores.py",
    *(tests[0] for tests in REGRESSION_TESTS.values()),
    *PERPLEXITY_TESTS,
    "unittests/retrieval/test_r_precision.py",
)
#: distributions whose versions a recorded baseline names: what upstream's tests import besides the tree itself
BASELINE_PACKAGES = (
    "torch",
    "numpy",
    "scipy",
    "scikit-learn",
    "lightning-utilities",
    "typing_extensions",
    "pytest",
    "pytest-xdist",
    "pytest-timeout",
    "pytest-rerunfailures",
    "pytest-doctestplus",
)
#: upstream suites that import a package which upstream's test requirements bring (suite -> module): left out, with a
#: note, where the module is missing. ``tox -e upstream`` installs them all but torchvision
#: (constraints/upstream-breadth.txt), so CI runs the series' tests in these suites
OPTIONAL_PACKAGE_TESTS = {
    "unittests/image/test_psnr.py": "skimage",
    "unittests/segmentation/test_generalized_dice_score.py": "monai",
    # series 0036 adds tests to both: they import pandas at the top
    "unittests/nominal/test_pearson.py": "pandas",
    "unittests/nominal/test_tschuprows.py": "pandas",
    # their references skip without dython, and a skip raised inside upstream's DDP process pool hangs the pool
    # (stock's tree alike): left out where dython is missing
    "unittests/nominal/test_cramers.py": "dython",
    "unittests/nominal/test_theils_u.py": "dython",
    # series 0043-0050 add tests to these: upstream's references need netcal, fairlearn, monai and torchvision
    "unittests/classification/test_calibration_error.py": "netcal",
    "unittests/classification/test_group_fairness.py": "fairlearn",
    "unittests/segmentation/test_hausdorff_distance.py": "monai",
    "unittests/detection/test_intersection.py": "torchvision",
}
#: need matplotlib and the optional extras of every metric domain (plots), or the image extras (torch-fidelity, for
#: FeatureShare's feature extractors); the series touches neither plotting nor feature extraction
IGNORED_TESTS = ("unittests/utilities/test_plot.py", "unittests/wrappers/test_feature_share.py")
#: test ids (relative to tests/) left out. test_check_full_state_update_fn compares wall-clock times of full and
#: partial state updates: ~65 s per run and flaky on a loaded 2-core machine; it checks
#: ``check_forward_full_state_property``, which the series does not touch. The BinaryAccuracy case of
#: test_merge_state_feature_for_different_metrics draws unseeded random labels and fails when both halves of the data
#: happen to have the same accuracy (about 1 run in 18); the series does not touch ``merge_state``. The multilabel
#: plot test of the confusion matrix needs matplotlib (as test_plot.py above); it fails the same unpatched.
#: test_error_on_too_few_samples (v1.9.0's R2 suite) asserts that R2 of two unseeded ``randn`` targets is non-zero,
#: but R2 is exactly 0 for near-constant targets (stock's ``isclose(tss, 0, atol=1e-4)``: the two within ~0.014,
#: about 1 draw in 100); which draw it gets depends on the tests its xdist worker ran before it (it failed in 1 of 3
#: runs of the patched v1.9.0 tree once 0030 added a test module; run alone, and in the others, it passes: the patched
#: R2 gives stock's value for the same draw). What it checks (an error for one sample, none for two) is also checked
#: by the rest of test_r2.py and tests/test_r2_explained_variance.py.
DESELECTED_TESTS = (
    "unittests/utilities/test_utilities.py::test_check_full_state_update_fn",
    "unittests/bases/test_metric.py::test_merge_state_feature_for_different_metrics[BinaryAccuracy-",
    "unittests/regression/test_r2.py::test_error_on_too_few_samples",
    "unittests/classification/test_confusion_matrix.py::TestMultilabelConfusionMatrix::test_multilabel_confusion_matrix_plot",
)
#: source path -> the project's suites (or test ids) that run against the patched tree (stock = the unpatched
#: snapshot). ``tests/test_distributed.py`` checks the layer's own helpers (mode setter, fake groups) except for the
#: one test given here; ``tests/test_ddp_fallback.py`` and ``tests/test_ddp_coalesced.py`` (the one-collective sync
#: of a metric and of a ``MetricCollection``) spawn ranks that install tree mode themselves.
DDP_PROJECT_TESTS = (
    "tests/test_ddp_fallback.py",
    "tests/test_ddp_coalesced.py",
    "tests/test_distributed.py::test_empty_list_state_of_compute_on_cpu_metric_is_gathered_on_cpu",
)
#: test_strided_parity.py runs every catalogue configuration (all areas the tree patches) with strided views and four
#: float dtypes against the unpatched tree, ~30-45 s on 2 cores
AGGREGATION_PROJECT_TESTS = (
    "tests/test_aggregation_parity.py",
    "tests/test_aggregation_syncs.py",
    "tests/test_strided_parity.py",
)
#: the deferred checks through a metric's life (forward, reset, copies, compute groups, DDP, inference-mode epochs)
#: and under torch.compile
DEFERRED_PROJECT_TESTS = (
    "tests/test_deferred_lifecycle.py",
    "tests/test_lifecycle_modes.py",
    "tests/test_deferred_ddp.py",
    "tests/test_compile.py",
)
#: the compute warnings of a full-state metric's batch value in forward (PearsonCorrCoef: the full-state metric whose
#: compute files them; its device-path warning test fails when forward drops them)
FULL_STATE_FORWARD_PROJECT_TESTS = ("tests/test_pearson.py",)
#: the regression metrics' suites: values and warnings against stock on both paths, the hypothesis fuzz of every
#: regression area and the DDP world (its ranks install tree mode themselves)
REGRESSION_SHARED_PROJECT_TESTS = ("tests/test_regression_fuzz.py", "tests/test_regression_ddp.py")
R2_PROJECT_TESTS = ("tests/test_r2_explained_variance.py", *REGRESSION_SHARED_PROJECT_TESTS)
PEARSON_PROJECT_TESTS = ("tests/test_pearson.py", *REGRESSION_SHARED_PROJECT_TESTS)
KL_SPEARMAN_PROJECT_TESTS = ("tests/test_kl_divergence_spearman.py", *REGRESSION_SHARED_PROJECT_TESTS)
CLASSIFICATION_PROJECT_TESTS = ("tests/test_classification_parity.py", "tests/test_classification_syncs.py")
CONFUSION_MATRIX_PROJECT_TESTS = ("tests/test_confusion_matrix.py",)
HINGE_PROJECT_TESTS = ("tests/test_hinge.py",)
EXACT_MATCH_PROJECT_TESTS = ("tests/test_exact_match.py",)
#: the PR-curve family's update (and the states every member's compute starts from), and its computes
PR_CURVE_PROJECT_TESTS = ("tests/test_precision_recall_curve.py",)
CURVE_COMPUTE_PROJECT_TESTS = ("tests/test_curve_computes.py",)
MINMAX_PROJECT_TESTS = ("tests/test_minmax.py",)
PERPLEXITY_PROJECT_TESTS = ("tests/test_perplexity.py",)
PSNR_PROJECT_TESTS = ("tests/test_psnr.py",)
GENERALIZED_DICE_PROJECT_TESTS = ("tests/test_generalized_dice.py",)
RETRIEVAL_PROJECT_TESTS = ("tests/test_retrieval.py",)
#: the breadth areas, the rest of TorchMetrics (series 0035-0042): each source -> its project suite, run in tree mode
#: against the patched tree; their upstream suites run as the test files the patches add or change (a whole touched
#: file), the modules' other suites by hand (docs/patches.md: the counts each patch was checked with)
BREADTH_REGRESSION_SOURCES = tuple(
    f"src/torchmetrics/{prefix}{name}.py"
    for prefix, names in (
        ("functional/regression/", ("kendall", "log_cosh", "tweedie_deviance")),
        ("regression/", ("concordance", "log_cosh", "tweedie_deviance")),
    )
    for name in names
)
NOMINAL_SOURCES = tuple(
    f"src/torchmetrics/{prefix}{name}.py"
    for prefix, names in (
        ("functional/nominal/", ("pearson", "theils_u", "utils")),
        ("nominal/", ("cramers", "pearson", "theils_u", "tschuprows")),
    )
    for name in names
)
CLUSTERING_SOURCES = tuple(
    f"src/torchmetrics/functional/clustering/{name}.py"
    for name in (
        "adjusted_mutual_info_score",
        "adjusted_rand_score",
        "calinski_harabasz_score",
        "davies_bouldin_score",
        "dunn_index",
        "fowlkes_mallows_index",
        "homogeneity_completeness_v_measure",
        "mutual_info_score",
        "normalized_mutual_info_score",
        "rand_score",
        "utils",
    )
)
BREADTH_IMAGE_SOURCES = (
    *(f"src/torchmetrics/functional/image/{name}.py" for name in ("psnrb", "rase", "scc", "ssim", "utils", "vif")),
    "src/torchmetrics/image/ssim.py",
)
PANOPTIC_SOURCES = (
    "src/torchmetrics/detection/panoptic_qualities.py",
    "src/torchmetrics/functional/detection/_panoptic_quality_common.py",
)
#: the breadth areas' second round (series 0043-0050), continued
SEGMENTATION_DETECTION_SOURCES = (
    "src/torchmetrics/functional/segmentation/hausdorff_distance.py",
    "src/torchmetrics/segmentation/hausdorff_distance.py",
    "src/torchmetrics/detection/iou.py",
    *(f"src/torchmetrics/functional/detection/{name}.py" for name in ("iou", "giou", "diou", "ciou")),
)
#: the segmentation/detection suite: HausdorffDistance, PanopticQuality and the box IoU metrics (which skip without
#: torchvision)
SEGMENTATION_DETECTION_PROJECT_TESTS = ("tests/test_segmentation_detection.py",)
WRAPPER_CHECKS_PROJECT_TESTS = ("tests/test_wrapper_checks.py",)
#: BootStrapper's and MultioutputWrapper's suite (both wrappers have their patches, 0042 and 0047)
WRAPPERS_MORE_PROJECT_TESTS = ("tests/test_wrappers_more.py",)
#: the census of a class of each kind of finding (aggregation, stat scores, curves, regression, wrappers, nominal):
#: the series' would-be syncs per call are the layer's record (README's coverage table); locations aside
CENSUS_PROJECT_TESTS = ("tests/test_census.py",)
PROJECT_TESTS_FOR_SOURCE = {
    "src/torchmetrics/aggregation.py": AGGREGATION_PROJECT_TESTS,
    "src/torchmetrics/utilities/deferred.py": AGGREGATION_PROJECT_TESTS
    + CLASSIFICATION_PROJECT_TESTS
    + DEFERRED_PROJECT_TESTS
    + WRAPPER_CHECKS_PROJECT_TESTS,
    "src/torchmetrics/utilities/distributed.py": DDP_PROJECT_TESTS,
    "src/torchmetrics/collections.py": DDP_PROJECT_TESTS,
    # the helpers of the in-place state updates (and their case of states made under inference mode)
    "src/torchmetrics/utilities/states.py": ("tests/test_lifecycle_modes.py", *AGGREGATION_PROJECT_TESTS),
    "src/torchmetrics/metric.py": DDP_PROJECT_TESTS
    + DEFERRED_PROJECT_TESTS
    + FULL_STATE_FORWARD_PROJECT_TESTS
    + CENSUS_PROJECT_TESTS,
    "src/torchmetrics/classification/stat_scores.py": CLASSIFICATION_PROJECT_TESTS,
    "src/torchmetrics/functional/classification/stat_scores.py": CLASSIFICATION_PROJECT_TESTS
    + CONFUSION_MATRIX_PROJECT_TESTS,
    "src/torchmetrics/utilities/compute.py": CLASSIFICATION_PROJECT_TESTS,
    "src/torchmetrics/classification/confusion_matrix.py": CONFUSION_MATRIX_PROJECT_TESTS,
    "src/torchmetrics/functional/classification/confusion_matrix.py": CONFUSION_MATRIX_PROJECT_TESTS,
    "src/torchmetrics/functional/classification/jaccard.py": CONFUSION_MATRIX_PROJECT_TESTS,
    "src/torchmetrics/functional/classification/matthews_corrcoef.py": CONFUSION_MATRIX_PROJECT_TESTS,
    **dict.fromkeys(HINGE_SOURCES, HINGE_PROJECT_TESTS),
    **dict.fromkeys(EXACT_MATCH_SOURCES, EXACT_MATCH_PROJECT_TESTS),
    **dict.fromkeys(PR_CURVE_SOURCES, PR_CURVE_PROJECT_TESTS),
    **dict.fromkeys(CURVE_COMPUTE_SOURCES, CURVE_COMPUTE_PROJECT_TESTS + PR_CURVE_PROJECT_TESTS),
    "src/torchmetrics/functional/classification/precision_recall_curve.py": PR_CURVE_PROJECT_TESTS
    + CURVE_COMPUTE_PROJECT_TESTS
    + ("tests/test_fixed_point_curves.py",),
    "src/torchmetrics/regression/r2.py": R2_PROJECT_TESTS,
    "src/torchmetrics/regression/explained_variance.py": R2_PROJECT_TESTS,
    "src/torchmetrics/regression/pearson.py": PEARSON_PROJECT_TESTS,
    "src/torchmetrics/functional/regression/kl_divergence.py": KL_SPEARMAN_PROJECT_TESTS,
    "src/torchmetrics/regression/spearman.py": KL_SPEARMAN_PROJECT_TESTS,
    **dict.fromkeys(MINMAX_SOURCES, MINMAX_PROJECT_TESTS + WRAPPER_CHECKS_PROJECT_TESTS),
    **dict.fromkeys(PERPLEXITY_SOURCES, PERPLEXITY_PROJECT_TESTS),
    **dict.fromkeys(PSNR_SOURCES, PSNR_PROJECT_TESTS),
    **dict.fromkeys(GENERALIZED_DICE_SOURCES, GENERALIZED_DICE_PROJECT_TESTS),
    **dict.fromkeys(RETRIEVAL_SOURCES, RETRIEVAL_PROJECT_TESTS),
    **dict.fromkeys(BREADTH_REGRESSION_SOURCES, ("tests/test_regression_more.py",)),
    **dict.fromkeys(NOMINAL_SOURCES, ("tests/test_nominal.py",)),
    **dict.fromkeys(CLUSTERING_SOURCES, ("tests/test_clustering.py",)),
    **dict.fromkeys(BREADTH_IMAGE_SOURCES, ("tests/test_image_more.py",)),
    **dict.fromkeys(PANOPTIC_SOURCES, SEGMENTATION_DETECTION_PROJECT_TESTS),
    "src/torchmetrics/retrieval/precision_recall_curve.py": RETRIEVAL_PROJECT_TESTS,
    "src/torchmetrics/wrappers/bootstrapping.py": WRAPPERS_MORE_PROJECT_TESTS + WRAPPER_CHECKS_PROJECT_TESTS,
    **dict.fromkeys(CALIBRATION_FAIRNESS_RANKING_SOURCES, ("tests/test_classification_more.py",)),
    **dict.fromkeys(FIXED_POINT_SOURCES, ("tests/test_fixed_point_curves.py",)),
    **dict.fromkeys(SEGMENTATION_DETECTION_SOURCES, SEGMENTATION_DETECTION_PROJECT_TESTS),
    "src/torchmetrics/wrappers/multioutput.py": WRAPPERS_MORE_PROJECT_TESTS,
    # the wrappers' held internal resets (series 0050, with ``deferred.held``)
    "src/torchmetrics/wrappers/running.py": WRAPPER_CHECKS_PROJECT_TESTS,
}


class SeriesError(RuntimeError):
    """The series cannot be applied, made or tested; the message says why."""


@dataclass(frozen=True)
class PullRequest:
    """One folder of ``patches/``: a pull request's ``git format-patch`` files and its description (``README.md``).

    ``needs``: the folders it applies on (its ``Needs:`` line; ``none`` for a pull request that applies to upstream
    alone). The whole series is every folder's patches in the folders' order.
    """

    name: str
    path: Path
    patches: tuple[Path, ...]
    needs: tuple[str, ...]

    @property
    def description(self) -> Path:
        """The pull request's description, what a maintainer reads first."""
        return self.path / "README.md"


def _needs(description: Path) -> tuple[str, ...]:
    """The ``Needs:`` line of a pull request's description: folder names, or ``none``."""
    line = next((line for line in description.read_text().splitlines() if line.startswith("Needs:")), None)
    if line is None:
        raise SeriesError(f"{description}: no 'Needs:' line (the folders it applies on, or 'none')")
    names = [name.strip(" `.") for name in line.removeprefix("Needs:").split(",")]
    return () if names == ["none"] else tuple(names)


def pull_requests(series: Path = SERIES_DIR) -> list[PullRequest]:
    """The pull requests of ``series`` in their order: folders ``NN-short-name`` of ``NNNN-short-name.patch`` files."""
    folders = sorted(p for p in series.iterdir() if p.is_dir()) if series.is_dir() else []
    bad = [p.name for p in folders if not _PR_NAME.match(p.name)]
    if bad:
        raise SeriesError(f"{series}: pull request folders must be named NN-short-name, not {bad}")
    stray = [p.name for p in series.glob("*.patch")] if series.is_dir() else []
    if stray:
        raise SeriesError(f"{series}: patches belong in a pull request's folder, not {stray}")
    prs: list[PullRequest] = []
    for folder in folders:
        files = sorted(p for p in folder.iterdir() if p.suffix == ".patch")
        bad = [p.name for p in files if not _PATCH_NAME.match(p.name)]
        if bad:
            raise SeriesError(f"{folder}: patch files must be named NNNN-short-name.patch, not {bad}")
        if not files:
            raise SeriesError(f"no patches in {folder}")
        if not (folder / "README.md").is_file():
            raise SeriesError(f"{folder}: no README.md (the pull request's description)")
        needs = _needs(folder / "README.md")
        unknown = [name for name in needs if name not in {pr.name for pr in prs}]
        if unknown:
            raise SeriesError(f"{folder.name} needs {unknown}: not a pull request before it")
        prs.append(PullRequest(folder.name, folder, tuple(files), needs))
    if not prs:
        raise SeriesError(f"no pull requests in {series}")
    return prs


def patch_files(series: Path = SERIES_DIR, names: Sequence[str] | None = None) -> list[Path]:
    """The patches in ``git am`` order: of every pull request, or of those ``names`` (in the series' order)."""
    prs = pull_requests(series)
    unknown = sorted(set(names or ()) - {pr.name for pr in prs})
    if unknown:
        raise SeriesError(f"no pull request {unknown} in {series}")
    return [patch for pr in prs if names is None or pr.name in names for patch in pr.patches]


def with_needs(pr: PullRequest, series: Path = SERIES_DIR) -> list[str]:
    """``pr`` and the pull requests it applies on, in the series' order.

    A pull request applies on what it names and on what those need in turn: its ``Needs:`` line names only the pull
    requests it builds on directly.
    """
    prs = {p.name: p for p in pull_requests(series)}
    wanted, todo = {pr.name}, list(pr.needs)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += prs[name].needs
    return [name for name in prs if name in wanted]


# ----------------------------------------------------------------------------------------------------------- apply


def _toplevel(checkout: Path) -> Path:
    result = git("rev-parse", "--show-toplevel", cwd=checkout, check=False) if checkout.is_dir() else None
    if result is None or result.returncode:
        raise SeriesError(f"{checkout} is not a git checkout (see docs/patches.md for making one from a snapshot)")
    return Path(result.stdout.strip())


def _ensure_ready(top: Path) -> None:
    for state in ("rebase-apply", "rebase-merge"):
        path = Path(git("rev-parse", "--git-path", state, cwd=top).stdout.strip())
        if not path.is_absolute():
            path = top / path
        if path.exists():
            raise SeriesError(f"a git am/rebase is in progress in {top}; finish or abort it first")
    dirty = git("status", "--porcelain", "--untracked-files=no", cwd=top).stdout.strip()
    if dirty:
        raise SeriesError(f"{top} has uncommitted changes; commit or stash them first:\n{dirty}")


def _failure(output: str, patches: Sequence[Path]) -> str:
    """Which patch failed and where, from git am's output."""
    number = re.search(r"Patch failed at (\d+)", output)
    patch = patches[int(number.group(1)) - 1] if number else None
    name = f"{patch.parent.name}/{patch.name}" if patch else "the series"
    places = [f"{path} (hunk at line {line})" for path, line in re.findall(r"error: patch failed: (\S+):(\d+)", output)]
    reasons = r"does not exist in index|already exists in \w+"
    places += [f"{path} ({why})" for path, why in re.findall(rf"error: (\S+): ({reasons})", output)]
    return f"{name} does not apply: {', '.join(places) or 'see git output below'}"


def subject(patch: Path) -> str:
    """The commit subject of a patch file, without ``[PATCH n/m]``."""
    header = email.message_from_string(patch.read_text(errors="replace"))["Subject"] or ""
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(header.split()))


def _git_am(top: Path, patches: Sequence[Path], changelog: bool = True) -> list[str]:
    before = git("rev-parse", "HEAD", cwd=top).stdout.strip()
    has_identity = git("config", "user.email", cwd=top, check=False).stdout.strip()
    exclude = () if changelog else ("--exclude=CHANGELOG.md",)
    result = git(*(() if has_identity else GIT_IDENTITY), "am", *exclude, *map(str, patches), cwd=top, check=False)
    if result.returncode:
        git("am", "--abort", cwd=top, check=False)
        after = git("rev-parse", "HEAD", cwd=top).stdout.strip()
        state = "nothing was applied (git am --abort)" if after == before else f"HEAD is {after}, was {before}!"
        raise SeriesError(f"{_failure(result.stdout, patches)}\n{state}\n--- git am said:\n{result.stdout.strip()}")
    return git("log", "--reverse", "--format=%h %s", f"{before}..HEAD", cwd=top).stdout.splitlines()


def _changelog_matches(top: Path, series: Path) -> bool:
    """Whether ``top``'s CHANGELOG.md is the one the series was made against (its first CHANGELOG change's base).

    The series is made against master, and every pull request's entries sit where they apply on master with only the
    pull requests it needs, so a pull request checked alone is checked with its CHANGELOG lines too (comparing with
    the base of its own first patch would leave them out of every check but the first pull request's). A release
    tag's CHANGELOG differs in its Unreleased section (``### Fixed`` holds master's entries there), so the series
    applies to it without its CHANGELOG lines.
    """
    for patch in patch_files(series):
        found = re.search(r"^diff --git a/CHANGELOG.md b/CHANGELOG.md\nindex ([0-9a-f]+)\.\.", patch.read_text(), re.M)
        if found:
            blob = git("rev-parse", "HEAD:CHANGELOG.md", cwd=top, check=False).stdout.strip()
            return blob.startswith(found.group(1))
    return True


def apply(
    checkout: Path,
    series: Path = SERIES_DIR,
    check: bool = False,
    names: Sequence[str] | None = None,
    changelog: bool | None = None,
) -> list[str]:
    """``git am`` the series, or the pull requests ``names``, onto ``checkout``; returns the new commits.

    With ``check``: only in a scratch worktree. On a tree whose CHANGELOG.md is not master's (a release tag), the
    patches apply without their CHANGELOG lines (see :func:`_changelog_matches`), and it says so. ``changelog``
    decides that for a caller that applies pull requests in steps (the tree after the first step is not master).
    """
    patches = patch_files(series, names)
    top = _toplevel(checkout)
    _ensure_ready(top)
    recent = set(git("log", "-n", "500", "--format=%s", cwd=top).stdout.splitlines())
    applied = [p.name for p in patches if subject(p) in recent]
    if applied:
        raise SeriesError(f"{top} already has commits with the subjects of {applied}; nothing was applied")
    if changelog is None:
        changelog = _changelog_matches(top, series)
    if not changelog:
        print(f"{top}: CHANGELOG.md left out (it is not the one the series was made against)", flush=True)
    if not check:
        return _git_am(top, patches, changelog)
    with tempfile.TemporaryDirectory(prefix="series-check-") as tmp:
        scratch = Path(tmp) / "worktree"
        git("worktree", "add", "-q", "--detach", str(scratch), "HEAD", cwd=top)
        try:
            return _git_am(scratch, patches, changelog)
        finally:
            git("worktree", "remove", "--force", str(scratch), cwd=top, check=False)
            git("worktree", "prune", cwd=top, check=False)


# ------------------------------------------------------------------------------------------------ checkout / make


def checkout(dest: Path, archive: Path, series: Path = SERIES_DIR) -> list[str]:
    """Unpack ``archive`` to ``dest``, commit it (tag ``upstream``), apply the series on a new branch ``syncfree``."""
    if dest.exists() and any(dest.iterdir()):
        raise SeriesError(f"{dest} is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="series-unpack-", dir=dest.parent) as tmp:
        tree = unpack(archive, Path(tmp))
        for item in tree.iterdir():
            shutil.move(str(item), dest / item.name)
    make_checkout(dest, f"upstream {snapshot_label(archive)}", tag="upstream")
    git("checkout", "-q", "-b", "syncfree", cwd=dest)
    return apply(dest, series)


def diff_lines(diff: str, sign: str = "+") -> dict[str, list[str]]:
    """The lines a unified diff (``git diff``, a ``git format-patch`` file) adds or removes (``sign``), per file."""
    changed: dict[str, list[str]] = {}
    path, in_hunk = "", False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            path, in_hunk = line.split()[-1].removeprefix("b/"), False
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith(sign):
            changed.setdefault(path, []).append(line[1:])
    return changed


def _added_lines(top: Path, commit: str) -> dict[str, list[str]]:
    """The lines a commit adds, per file."""
    return diff_lines(git("diff", f"{commit}~1", commit, cwd=top).stdout)


def _unreleased_entries(changelog: str) -> list[tuple[str, str]]:
    """``(section, entry)`` of every ``- ...`` line under Unreleased, in order."""
    entries: list[tuple[str, str]] = []
    section = ""
    lines = changelog.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("## [Unreleased]"))
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("### "):
            section = line
        elif line.startswith("- "):
            entries.append((section, line))
    return entries


def _with_entries(changelog: str, entries: Sequence[tuple[str, str]]) -> str:
    """``changelog`` with ``entries`` appended to their Unreleased sections (each followed by two blank lines)."""
    lines = changelog.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("## [Unreleased]"))
    for section, entry in entries:
        heading = lines.index(section, start)
        end = next(i for i in range(heading + 1, len(lines)) if lines[i].startswith(("### ", "---", "## ")))
        lines[end:end] = [entry, "", ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class Hoisted:
    """A pull request that :func:`hoist` puts in front of the stack.

    ``commit``: its commit on the base (each on the ones before it). ``moved``: the stack commit it is (the same
    change, moved to the front). ``owns``: its files are final: every stack commit takes them as the pull request has
    them (the stack commits ``absorbed`` made those changes and nothing else, so they disappear with their entries).
    Neither: a change cut out of the stack, merged into every stack commit.
    """

    commit: str
    moved: str | None = None
    owns: bool = False
    absorbed: tuple[str, ...] = ()


def _hoisted(spec: str) -> Hoisted:
    """``SHA``, ``SHA:STACK_COMMIT`` or ``SHA:own[=STACK_COMMIT+...]`` (see :class:`Hoisted`)."""
    commit, _, rest = spec.partition(":")
    if rest.startswith("own"):
        absorbed = rest.partition("=")[2]
        return Hoisted(commit, owns=True, absorbed=tuple(filter(None, absorbed.split("+"))))
    return Hoisted(commit, moved=rest or None)


def hoist(checkout: Path, base: str, stack: str, prs: Sequence[Hoisted], branch: str) -> list[str]:
    """Re-make the commits ``base..stack`` on top of pull requests put in front of them; returns what was dropped.

    Each stack commit is re-made with every pull request it does not hold yet: a ``moved`` one cherry-picked into the
    commits before its stack commit (the later ones hold it), a cut-out one into every commit (a conflicting hunk keeps
    the stack commit's version, and a line of the pull request that is then missing stops the run: resolve that
    commit by hand), an owning one by taking its files. The CHANGELOG of every re-made commit is the pull requests'
    with the stack commit's own Unreleased entries appended to their sections (but the entries of moved and absorbed
    commits). A commit whose tree is its new parent's is dropped. The result is branch ``branch``; compare its tree
    with ``stack``'s before using it (only the pull requests' additions may differ).
    """
    top = _toplevel(checkout)

    def rev(name: str) -> str:
        return git("rev-parse", name, cwd=top).stdout.strip()

    commits = git("rev-list", "--reverse", f"{base}..{stack}", cwd=top).stdout.split()
    index_of = {sha: i for i, sha in enumerate(commits)}
    origins = [index_of[rev(pr.moved)] if pr.moved else len(commits) for pr in prs]
    gone = {rev(pr.moved) for pr in prs if pr.moved} | {rev(c) for pr in prs for c in pr.absorbed}
    gone_entries = {line for sha in gone for line in _added_lines(top, sha).get("CHANGELOG.md", [])}
    shas = [rev(pr.commit) for pr in prs]
    # each pull request's files but CHANGELOG.md, once: the loop below re-makes every stack commit
    pr_files = [
        [f for f in git("diff", "--name-only", f"{sha}~1", sha, cwd=top).stdout.split() if f != "CHANGELOG.md"]
        for sha in shas
    ]
    tip = shas[-1]
    tip_changelog = git("show", f"{tip}:CHANGELOG.md", cwd=top).stdout
    known = {entry for _, entry in _unreleased_entries(git("show", f"{base}:CHANGELOG.md", cwd=top).stdout)}
    known |= {entry for _, entry in _unreleased_entries(tip_changelog)}
    dropped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="series-hoist-") as tmp:
        work = Path(tmp) / "worktree"
        git("worktree", "add", "-q", "--detach", str(work), base, cwd=top)
        try:
            parent, parent_tree = tip, rev(f"{tip}^{{tree}}")
            for index, commit in enumerate(commits):
                git("checkout", "-q", "--detach", "-f", commit, cwd=work)
                stack_changelog = (work / "CHANGELOG.md").read_text()
                for pr, origin, sha, files in zip(prs, origins, shas, pr_files):
                    if pr.owns:
                        git("checkout", sha, "--", *files, cwd=work)
                        continue
                    if index >= origin:
                        continue
                    result = git("cherry-pick", "--no-commit", "-X", "ours", sha, cwd=work, check=False)
                    if result.returncode:
                        raise SeriesError(f"{commit[:7]}: cherry-pick of {sha[:7]} failed:\n{result.stdout}")
                    for path, lines in _added_lines(top, sha).items():
                        if path == "CHANGELOG.md":
                            continue
                        have = set((work / path).read_text().splitlines())
                        lost = [line for line in lines if line not in have]
                        if lost:
                            raise SeriesError(f"{commit[:7]} {path}: {len(lost)} line(s) of {sha[:7]} lost: {lost[:2]}")
                own = [
                    (s, e) for s, e in _unreleased_entries(stack_changelog) if e not in known and e not in gone_entries
                ]
                (work / "CHANGELOG.md").write_text(_with_entries(tip_changelog, own))
                git("add", "-A", cwd=work)
                tree = git("write-tree", cwd=work).stdout.strip()
                title = git("log", "-1", "--format=%s", commit, cwd=top).stdout.strip()
                if tree == parent_tree:
                    dropped.append(f"{commit[:7]} {title}")
                    continue
                fields = "%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd"
                info = git("log", "-1", f"--format={fields}", "--date=raw", commit, cwd=top).stdout.rstrip("\n")
                keys = (
                    "AUTHOR_NAME",
                    "AUTHOR_EMAIL",
                    "AUTHOR_DATE",
                    "COMMITTER_NAME",
                    "COMMITTER_EMAIL",
                    "COMMITTER_DATE",
                )
                env = dict(os.environ, **{f"GIT_{k}": v for k, v in zip(keys, info.split("\x00"))})
                message = git("log", "-1", "--format=%B", commit, cwd=top).stdout
                made = subprocess.run(
                    ["git", "commit-tree", tree, "-p", parent],
                    cwd=top,
                    env=env,
                    input=message,
                    text=True,
                    capture_output=True,
                    check=True,
                )
                parent, parent_tree = made.stdout.strip(), tree
            git("branch", "-f", branch, parent, cwd=top)
        finally:
            git("cherry-pick", "--quit", cwd=work, check=False)
            git("worktree", "remove", "--force", str(work), cwd=top, check=False)
    return dropped


def short_name(subject: str, limit: int = 40) -> str:
    """``Aggregation: check `nan` on the device`` -> ``aggregation-check-nan-on-the-device``, cut at a word."""
    words = re.sub(r"[^a-z0-9]+", " ", subject.lower()).split()
    name = words[0] if words else "patch"
    for word in words[1:]:
        if len(name) + 1 + len(word) > limit:
            break
        name += f"-{word}"
    return name


def make(checkout: Path, base: str, head: str, series: Path = SERIES_DIR) -> list[Path]:
    """Regenerate ``series`` from the commits ``base..head`` of an upstream checkout (``git format-patch``).

    Each commit goes to the pull request whose folder has a patch with its subject; a commit with a new subject goes
    to the pull request of the commit before it (a pull request that starts with a new commit: make its folder, with
    its description, and a first patch of that subject by hand). Each folder is one ``git format-patch`` run, so its
    patches are numbered as the pull request's own series.
    """
    top = _toplevel(checkout)
    subjects = git("log", "--reverse", "--format=%s", f"{base}..{head}", cwd=top).stdout.splitlines()
    commits = git("rev-list", "--reverse", f"{base}..{head}", cwd=top).stdout.split()
    if not commits:
        raise SeriesError(f"no commits in {base}..{head} of {top}")
    prs = pull_requests(series)
    folder_of: dict[str, PullRequest] = {}
    for pr in prs:  # a subject in two folders (a commit just moved to an earlier pull request): the earlier one
        for patch in pr.patches:
            folder_of.setdefault(subject(patch), pr)
    assigned: list[PullRequest] = []
    for sha, title in zip(commits, subjects):
        pr = folder_of.get(title) or (assigned[-1] if assigned else None)
        if pr is None:
            raise SeriesError(f"{sha[:7]} {title!r}: no pull request has this subject; make its folder first")
        if assigned and prs.index(pr) < prs.index(assigned[-1]):
            raise SeriesError(f"{sha[:7]} {title!r} belongs to {pr.name}, after a commit of {assigned[-1].name}")
        assigned.append(pr)
    with tempfile.TemporaryDirectory(prefix="series-make-") as tmp:
        for pr in prs:
            mine = [sha for sha, owner in zip(commits, assigned) if owner is pr]
            if not mine:
                raise SeriesError(f"{pr.name}: no commit of base..head is one of its patches")
            out = Path(tmp) / pr.name
            # --zero-commit and --no-signature: the files only change when the commits do
            git(
                "format-patch",
                "-q",
                "--zero-commit",
                "--no-signature",
                "-o",
                str(out),
                f"{mine[0]}~1..{mine[-1]}",
                cwd=top,
            )
            for old in pr.patches:
                old.unlink()
            made = sorted(out.glob("*.patch"))
            titles = [subjects[commits.index(sha)] for sha in mine]
            for number, (patch, title) in enumerate(zip(made, titles), start=1):
                shutil.copy2(patch, pr.path / f"{number:04d}-{short_name(title)}.patch")
    return patch_files(series)


# ------------------------------------------------------------------------------------------------------------ test


@dataclass
class Outcomes:
    """Per-test outcome ("passed", "skipped", "failed") from a junit XML report."""

    tests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, report: Path) -> Outcomes:
        """Outcomes of a ``--junitxml`` report (empty when pytest wrote none)."""
        outcomes = cls()
        if not report.exists():
            return outcomes
        for case in ElementTree.parse(report).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case}
            outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            outcomes.tests[name] = outcome
        return outcomes

    def counts(self) -> Counter:
        """Number of tests per outcome."""
        return Counter(self.tests.values())

    def summary(self) -> str:
        """``N passed, N skipped, N failed`` (and ``, N collected`` for tests collected but not run)."""
        return _counts_text(self.counts())


def _counts_text(counts: Counter) -> str:
    text = f"{counts['passed']} passed, {counts['skipped']} skipped, {counts['failed']} failed"
    return text + (f", {counts['not run']} collected" if counts["not run"] else "")


def _touched(tree: Path, base: str) -> list[str]:
    return git("diff", "--name-only", f"{base}..HEAD", cwd=tree).stdout.split()


def added_tests(tree: Path, base: str) -> list[str]:
    """Node ids (relative to ``tests/``) of the test functions that the commits ``base..HEAD`` of ``tree`` add."""
    ids, path = [], ""
    for line in git("diff", f"{base}..HEAD", "--", "tests/", cwd=tree).stdout.splitlines():
        if line.startswith("+++ "):
            path = line.removeprefix("+++ b/").removeprefix("tests/")
        found = re.match(r"^\+(?:async )?def (test_\w+)\(", line)
        if found and Path(path).name.startswith("test_") and f"{path}::{found.group(1)}" not in ids:
            ids.append(f"{path}::{found.group(1)}")
    return ids


def _with_heavy(paths: list[str], heavy: str) -> list[str]:
    """``paths`` with the heavy suites ``test --heavy`` keeps: ``all``, the ``subset`` (CI's) or ``none``."""
    if heavy == "subset":
        return [p for p in paths if p not in HEAVY_TESTS or p in HEAVY_SUBSET]
    if heavy == "none":
        return [p for p in paths if p not in HEAVY_TESTS]
    return paths


def _maps(prefix: str, path: str, whole: bool) -> bool:
    """Whether the :data:`TESTS_FOR_SOURCE` key ``prefix`` gives ``path`` its suites.

    For a pull request checked alone (not ``whole``), a folder's suites only where no key names the file itself: a
    change to the confusion matrix runs the confusion-matrix suites, not also the stat scores' of its folder.
    """
    if not path.startswith(prefix):
        return False
    return whole or not prefix.endswith("/") or path not in TESTS_FOR_SOURCE


def upstream_tests_for(touched: Sequence[str], heavy: bool, whole: bool = True) -> list[str]:
    """Upstream test paths (relative to tests/) for the touched files of the series.

    ``whole``: for the whole stack, with :data:`ALWAYS_TESTS` (it changes what every metric inherits) and the suites
    of every folder it touches; a pull request checked alone runs the suites of the files it touches only.
    """
    paths = list(ALWAYS_TESTS) if whole else []
    for prefix, (tests, is_heavy) in TESTS_FOR_SOURCE.items():
        if any(_maps(prefix, path, whole) for path in touched) and (heavy or not is_heavy):
            paths += [t for t in tests if t not in paths]
    for path in touched:  # test files added or changed by the series (not helpers such as conftest.py)
        if path.startswith("tests/unittests/") and Path(path).name.startswith("test_") and path.endswith(".py"):
            relative = path.removeprefix("tests/")
            if not any(relative.startswith(p) for p in paths):
                paths.append(relative)
    return paths


#: seconds one pytest run of upstream's tests may take before it is killed (the longest, the heavy suites, ~8 min)
RUN_TIMEOUT = 1800
#: the process groups of the pytest runs going on (killed with this process: see :func:`_stop_runs`)
_running: set[int] = set()


def _stop_runs(signum: int, frame: Any) -> None:
    """On SIGTERM/SIGINT: kill the pytest runs (each in its own session, with its DDP pool) before exiting."""
    for pgid in list(_running):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    raise SystemExit(128 + signum)


#: lines of a failed pytest run's tracebacks that the log keeps (a failure that shows only in CI needs its reason)
FAILURE_LINES = 200


def _report_lines(lines: Sequence[str], returncode: int) -> list[str]:
    """The last lines of a pytest run's output; after a failure, its ``FAILURES`` section (at most ``FAILURE_LINES``).

    >>> _report_lines(["a", "=== FAILURES ===", "_ test _", "assert 0", "=== short test summary info ==="], 1)[:3]
    ['=== FAILURES ===', '_ test _', 'assert 0']
    >>> _report_lines(["x"] * 20, 0) == ["x"] * 15
    True
    """
    tail = list(lines[-15:])
    if returncode == 0:
        return tail
    starts = [i for i, line in enumerate(lines) if line.strip("= ") == "FAILURES" and line.startswith("=")]
    ends = [i for i, line in enumerate(lines) if "short test summary info" in line]
    if not starts:
        return tail
    end = min([i for i in ends if i > starts[0]] or [len(lines)])
    failures = list(lines[starts[0] : end])
    if len(failures) > FAILURE_LINES:
        failures = [*failures[:FAILURE_LINES], f"... ({len(failures) - FAILURE_LINES} more lines of failures)"]
    return failures + list(lines[max(end, len(lines) - 15) :])


def _file_of(test: str) -> str:
    """The test file of a path or node id relative to ``tests/`` (``unittests/a/test_b.py::test_c[x]``)."""
    return test.split("::", 1)[0]


def _runnable(tree: Path, tests: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The ``tests`` (paths or node ids) that ``tree`` has, less those whose optional package is missing here.

    Also returns the files left out for a missing package (file -> package).
    """
    existing = [t for t in tests if (tree / "tests" / _file_of(t)).exists()]
    files = {_file_of(t) for t in existing}
    missing = {p: m for p, m in OPTIONAL_PACKAGE_TESTS.items() if p in files and importlib.util.find_spec(m) is None}
    return [t for t in existing if _file_of(t) not in missing], missing


def _selection_options() -> list[str]:
    """The ``--ignore``/``--deselect`` options of every run of upstream's tests (node ids: rootdir-relative)."""
    return [f"--ignore={p}" for p in IGNORED_TESTS] + [f"--deselect=tests/{t}" for t in DESELECTED_TESTS]


def _pytest_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")])))
    env.pop("TORCHMETRICS_SYNCFREE_AUTOPATCH", None)
    env.pop("USE_PYTEST_POOL", None)
    return env


def _marks_ddp_tests(tree: Path, tests: Sequence[str]) -> bool:
    """Whether a test of ``tests`` (paths or node ids under ``tree/tests``) may be marked ``DDP``.

    Upstream marks its DDP tests where they are written (``pytest.mark.DDP`` in the test file); a helper module that
    did it for them (any non-test module under ``unittests/`` that names the mark) makes every selection answer yes.
    A whole file is read whole; of a file selected by node ids (the tests a pull request adds) only the module-level
    code and the selected top-level tests (:func:`_selected_source`): the suites they join mark their own tests
    ``DDP``, which the run deselects anyway.
    """
    root = tree / "tests"
    helpers = (p for p in (root / "unittests").rglob("*.py") if not p.name.startswith("test_"))
    if any("mark.DDP" in p.read_text(encoding="utf-8", errors="replace") for p in helpers):
        return True
    selected: dict[Path, set[str] | None] = {}
    for test in tests:
        path, _, name = test.partition("::")
        for file in _test_files(root / path):
            names = selected.setdefault(file, set())
            if not name or names is None:
                selected[file] = None  # the whole file
            else:
                names.add(re.split(r"[\[:]", name, maxsplit=1)[0])
    return any("mark.DDP" in _selected_source(file, names) for file, names in selected.items())


def _selected_source(path: Path, names: set[str] | None) -> str:
    """The text of test file ``path`` that can mark the tests ``names`` (all where ``None``).

    That is the file less its top-level functions and classes that are not selected: a mark reaches a test from its
    own definition or from module-level code (``pytestmark``, a parametrize list), never from a sibling test.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    if names is None:
        return text
    try:
        module = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    for node in reversed(module.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name not in names:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            del lines[first : node.end_lineno]
    return "".join(lines)


def _test_files(path: Path) -> list[Path]:
    return sorted(path.rglob("test_*.py")) if path.is_dir() else [path]


def _workers_for(tests: Sequence[str], workers: int) -> int:
    """How many xdist workers a run of ``tests`` (paths or node ids) gets: one process for node ids only.

    Each worker imports torch and the tree and collects the tests again, ~5 s on the 2-core VM; a selection of test
    functions (the tests a pull request adds, stock's reruns of the tests the patched tree skipped) runs in less time
    than that: 550 tests of a pull request took 8.6 s in one process against 15.5 s on two workers.
    """
    return 1 if all("::" in test for test in tests) else workers


def _pytest(tree: Path, paths: Sequence[str], report: Path, workers: int) -> tuple[Outcomes, float]:
    """Run upstream's tests of ``tree`` against ``tree/src``, as upstream's CI does; returns outcomes and seconds.

    Two runs: the tests not marked ``DDP`` on ``workers`` xdist workers (one process for a selection of test
    functions: :func:`_workers_for`), then the ``DDP`` tests in one process with ``USE_PYTEST_POOL=1`` (upstream's
    process pool, a gloo world on the fixed ports 8088-8100: no xdist there).
    Without the pool, upstream skips its DDP tests or runs their ``ddp=True`` cases in a single process. The second
    run is left out where no selected file marks a test ``DDP`` (:func:`_marks_ddp_tests`): an empty run (imports,
    the pool) costs about 6 s, a third of a small pull request's check.
    """
    existing, missing = _runnable(tree, paths)
    for path, module in missing.items():
        print(f"  left out {path}: needs `{module}`, which this environment does not have", flush=True)
    if not existing:  # pytest without paths would collect every test of the tree
        return Outcomes(), 0.0
    env = _pytest_env(tree)
    outcomes, start = Outcomes(), time.monotonic()
    passes = [("not DDP", _workers_for(existing, workers), False)]
    passes += [("DDP", 1, True)] if _marks_ddp_tests(tree, existing) else []
    for marker, n, pool in passes:
        part = report.with_name(f"{report.stem}-{'ddp' if pool else 'main'}{report.suffix}")
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no", "-q", "-rfE", "-m", marker]
        command += ["-n", str(n)] if n > 1 else []
        # node ids are relative to pytest's rootdir: the tree, where upstream's pyproject.toml is
        command += [*_selection_options(), f"--junitxml={part}", *existing]
        prefix = ["USE_PYTEST_POOL=1"] if pool else []
        print("+", *prefix, " ".join(command), f"(in {tree / 'tests'})", flush=True)
        run_env = dict(env, USE_PYTEST_POOL="1") if pool else env
        # its own session, so that a run past RUN_TIMEOUT (a hung DDP pool) is killed with its workers
        with subprocess.Popen(
            command,
            cwd=tree / "tests",
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        ) as process:
            _running.add(process.pid)
            try:
                output, returncode = process.communicate(timeout=RUN_TIMEOUT)[0], process.returncode
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                output, returncode = process.communicate()[0], 1
                output += f"\nkilled after {RUN_TIMEOUT} s: its tests count as missing".encode()
            finally:
                _running.discard(process.pid)
        lines = output.decode(errors="replace").strip().splitlines()
        print("\n".join("    " + line for line in _report_lines(lines, returncode)), flush=True)
        outcomes.tests.update(Outcomes.read(part).tests)
    return outcomes, time.monotonic() - start


def _outcome_name(node_id: str) -> str:
    """The :class:`Outcomes` name of a pytest node id (relative to the rootdir): its junit ``classname::name``."""
    path, bracket, params = node_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    return f"{'.'.join(names[:-1])}::{names[-1]}{bracket}{params}"


def _collected(tree: Path, paths: Sequence[str]) -> dict[str, str]:
    """Outcome name -> node id (relative to ``tests/``) of every test of ``paths`` that :func:`_pytest` would run."""
    existing = _runnable(tree, paths)[0]
    if not existing:
        return {}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no", "-q", "--collect-only"]
    command += [*_selection_options(), *existing]
    result = subprocess.run(command, cwd=tree / "tests", env=_pytest_env(tree), capture_output=True, text=True)
    # node ids are relative to pytest's rootdir, the tree: ``tests/unittests/...::test_name[params]``
    ids = [line for line in result.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    return {_outcome_name(node_id): node_id.removeprefix("tests/") for node_id in ids}


def _stock_outcomes(
    stock: Path, paths: Sequence[str], patched: Outcomes, report: Path, workers: int
) -> tuple[Outcomes, float]:
    """Stock's outcomes as far as :func:`compare_outcomes` needs them, and the seconds they took.

    The comparison asks stock which tests it has (one the patched tree lacks is a problem) and whether a test that
    the patched tree skips passes there (a failure on the patched tree is a problem whatever stock does; its stock
    outcome only annotates it). Collecting stock's tests answers the first; only the tests the patched tree skipped
    or failed run on stock for the second. The others have the outcome ``"not run"``: running all of stock's tests
    took as long as ~40 % of the patched run, for answers the collection gives.
    """
    start = time.monotonic()
    collected = _collected(stock, paths)
    rerun = [collected[n] for n, o in sorted(patched.tests.items()) if o != "passed" and n in collected]
    outcomes = Outcomes(dict.fromkeys(collected, "not run"))
    if rerun:
        outcomes.tests.update(_pytest(stock, rerun, report, workers)[0].tests)
    return outcomes, time.monotonic() - start


def compare_outcomes(stock: Outcomes, patched: Outcomes) -> list[str]:
    """Problems: a test that passed on stock and does not on the patched tree, a new skip, any failure."""
    problems = []
    for name, outcome in sorted(patched.tests.items()):
        before = stock.tests.get(name)
        if outcome == "failed":
            problems.append(f"FAILED on the patched tree: {name}" + (f" ({before} on stock)" if before else ""))
        elif outcome == "skipped" and before == "passed":
            problems.append(f"skipped on the patched tree, passed on stock: {name}")
    problems += [f"missing on the patched tree: {name}" for name in sorted(set(stock.tests) - set(patched.tests))]
    return problems


def _ruff_findings(tree: Path, files: Sequence[str], ruff: str) -> Counter:
    """(file, rule) counts of ``ruff check`` plus unformatted files, with the tree's own configuration."""
    files = [f for f in files if (tree / f).exists()]
    if not files:
        return Counter()
    check = subprocess.run(
        [ruff, "check", "--output-format=concise", "--no-cache", *files], cwd=tree, capture_output=True, text=True
    )
    found = Counter()
    for line in check.stdout.splitlines():
        match = re.match(r"^(\S+?):\d+:\d+: (\S+)", line)
        if match:
            found[(match.group(1), match.group(2))] += 1
    fmt = subprocess.run([ruff, "format", "--check", "--no-cache", *files], cwd=tree, capture_output=True, text=True)
    for line in fmt.stdout.splitlines():
        if line.startswith("Would reformat: "):
            found[(line.removeprefix("Would reformat: ").strip(), "format")] += 1
    return found


def _project_suites(
    stock: Path, patched: Path, touched: Sequence[str], workers: int, markers: str = PROJECT_MARKERS
) -> tuple[bool, float, str]:
    """The project's parity and probe suites with stock = ``stock/src`` and the layer's targets from ``patched``.

    ``markers``: the pytest marker expression of the tests that run (CI leaves out the slow ones).
    """
    suites = sorted({t for path in touched for t in PROJECT_TESTS_FOR_SOURCE.get(path, ())})
    if not suites:
        return True, 0.0, "no project suite maps to the touched files"
    env = dict(os.environ, PYTHONPATH=str(stock / "src"), TORCHMETRICS_SYNCFREE_SERIES_TREE=str(patched))
    env["TORCHMETRICS_SYNCFREE_FORCE"] = "1"  # the snapshots' version is checked by the tree mode itself
    env.pop("TORCHMETRICS_SYNCFREE_AUTOPATCH", None)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no", "-q", "--tb=short"]
    command += ["-m", markers, *(["-n", str(workers)] if workers > 1 else []), *suites]
    print("+", " ".join(command), "(in the project, tree mode)", flush=True)
    start = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = result.stdout.strip().splitlines()
    print("\n".join("    " + line for line in _report_lines(lines, result.returncode)), flush=True)
    return result.returncode == 0, time.monotonic() - start, lines[-1] if lines else ""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in BASELINE_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _test_module(path: str) -> str:
    """``unittests/classification/test_x.py`` -> ``tests.unittests.classification.test_x`` (junit classname)."""
    return "tests." + path.removesuffix(".py").replace("/", ".")


def _function(name: str) -> str:
    """A test id without its parametrisation: ``mod.Class::test_x[a-b]`` -> ``mod.Class::test_x``."""
    return name.split("[", 1)[0]


def _suite(name: str) -> str:
    """The test file of a junit ``classname::name`` (``tests.unittests.a.test_x.Y::t`` -> ``unittests/a/test_x.py``)."""
    parts = name.split("::", 1)[0].split(".")
    end = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "/".join(parts[1 : end + 1]) + ".py"


def _suite_counts(outcomes: Iterable[tuple[str, str]]) -> dict[str, Counter]:
    counts: dict[str, Counter] = {}
    for name, outcome in outcomes:
        counts.setdefault(_suite(name), Counter())[outcome] += 1
    return counts


def _suite_table(label: str, stock: dict[str, Counter], patched: dict[str, Counter]) -> list[str]:
    def text(counts: Counter | None) -> str:
        return _counts_text(counts) if counts else "-"

    return [
        f"{label:16} {suite:52} stock: {text(stock.get(suite))} | patched: {text(patched.get(suite))}"
        for suite in sorted(stock.keys() | patched.keys())
    ]


def _digest(outcomes: Sequence[tuple[str, str]]) -> str:
    return hashlib.sha256("\n".join(f"{n} {o}" for n, o in sorted(outcomes)).encode()).hexdigest()[:16]


def _run_options(tests: Sequence[str]) -> list[str]:
    """The ``--ignore``/``--deselect`` options of :func:`_pytest` for ``tests`` (a change makes a record stale)."""
    options = _selection_options()
    return [o for o in options if any(o.split("=", 1)[1].removeprefix("tests/").startswith(t) for t in tests)]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def baseline_file(archive: Path) -> Path:
    """Where the recorded outcomes of the heavy suites on the unpatched ``archive`` live."""
    return BASELINES_DIR / f"{snapshot_label(archive)}-classification.json"


@dataclass
class RecordedBaseline:
    """Unpatched outcomes of the heavy suites, per test function: counts and a digest of every id with its outcome."""

    tests: list[str]
    functions: dict[str, dict[str, Any]]

    def covers(self, name: str) -> bool:
        """Whether the test ``name`` (junit ``classname::name``) belongs to the recorded suites."""
        classname = name.split("::", 1)[0]
        return any(classname == m or classname.startswith(f"{m}.") for m in map(_test_module, self.tests))

    def suite_counts(self) -> dict[str, Counter]:
        """Recorded outcomes per test file."""
        counts: dict[str, Counter] = {}
        for function, recorded in self.functions.items():
            counts.setdefault(_suite(function), Counter()).update(
                {k: recorded[k] for k in ("passed", "skipped", "failed")}
            )
        return counts

    def summary(self) -> str:
        """``N passed, N skipped, N failed`` over the recorded suites."""
        total: Counter = Counter()
        for counts in self.functions.values():
            total.update({k: counts[k] for k in ("passed", "skipped", "failed")})
        return f"{total['passed']} passed, {total['skipped']} skipped, {total['failed']} failed"

    @classmethod
    def load(cls, archive: Path, tests: Sequence[str]) -> tuple[RecordedBaseline | None, str]:
        """The record for ``archive`` if it covers ``tests`` and was made from the same snapshot; else why not."""
        path = baseline_file(archive)
        if not tests:
            return None, "no heavy suite to run"
        if not path.is_file():
            return None, f"no recorded baseline {_shown(path)}"
        data = json.loads(path.read_text())
        if data["sha256"] != _sha256(archive):
            return None, f"{path.name} was recorded from another {archive.name} (sha256 differs)"
        if not set(tests) <= set(data["tests"]) or data["options"] != _run_options(data["tests"]):
            return None, f"{path.name} does not record these suites with today's options ({list(tests)})"
        versions = _versions()
        changed = {k: f"{v} -> {versions.get(k)}" for k, v in data["versions"].items() if versions.get(k) != v}
        if changed:  # a new release can change which tests pass; any failure on the patched tree is reported anyway
            print(f"note: {path.name} was recorded with other versions: {changed}", flush=True)
        # only the requested suites: a subset run (``--heavy subset``) must not miss the functions it did not run
        recorded = cls(list(tests), {})
        recorded.functions = {f: c for f, c in data["functions"].items() if recorded.covers(f)}
        return recorded, f"recorded in {_shown(path)}"

    def compare(self, patched: Outcomes) -> list[str]:
        """Problems of the patched outcomes of the recorded suites, as :func:`compare_outcomes` finds them."""
        problems = [f"FAILED on the patched tree: {n}" for n, o in sorted(patched.tests.items()) if o == "failed"]
        grouped: dict[str, list[tuple[str, str]]] = {}
        for name, outcome in patched.tests.items():
            grouped.setdefault(_function(name), []).append((name, outcome))
        for function, stock in sorted(self.functions.items()):
            mine = grouped.get(function, [])
            if _digest(mine) == stock["digest"]:
                continue
            counts = Counter(outcome for _, outcome in mine)
            if not mine:
                problems.append(f"missing on the patched tree: {function} ({stock['passed']} passed on stock)")
            elif counts["passed"] < stock["passed"] or counts["skipped"] > stock["skipped"]:
                problems.append(
                    f"{function}: {counts['passed']} passed, {counts['skipped']} skipped on the patched tree;"
                    f" recorded on stock: {stock['passed']} passed, {stock['skipped']} skipped"
                )
        return problems


def _against_record(
    archive: Path | None, paths: Sequence[str], patched: Outcomes
) -> tuple[RecordedBaseline | None, list[str], Outcomes, list[str]]:
    """Compare the patched outcomes of the heavy suites among ``paths`` with their record for ``archive``, if it fits.

    Returns the record (``None`` where it does not fit, or without ``archive``), the problems found, and the patched
    outcomes and paths left to compare with stock's live run: running the heavy suites on the unpatched tree again,
    or only collecting them, costs more than the record's checks.
    """
    heavy = [p for p in paths if p in HEAVY_TESTS]
    if archive is None or not heavy:
        return None, [], patched, list(paths)
    recorded, why = RecordedBaseline.load(archive, heavy)
    print(f"baseline of the heavy suites: {why}" + ("" if recorded else " (running them)"), flush=True)
    if recorded is None:
        return None, [], patched, list(paths)
    covered = Outcomes({n: o for n, o in patched.tests.items() if recorded.covers(n)})
    live = Outcomes({n: o for n, o in patched.tests.items() if n not in covered.tests})
    return recorded, recorded.compare(covered), live, [p for p in paths if p not in recorded.tests]


def _record_to_extend(archive: Path, tests: Sequence[str]) -> dict[str, Any]:
    """The record of ``archive`` that ``baseline --missing`` adds ``tests`` to; it must match the archive and today."""
    path = baseline_file(archive)
    if not path.is_file():
        raise SeriesError(f"no recorded baseline {_shown(path)} to add to: record all heavy suites")
    data = json.loads(path.read_text())
    if data["sha256"] != _sha256(archive) or data["versions"] != _versions():
        raise SeriesError(f"{path.name} was recorded from another archive or with other versions: record all suites")
    if data["options"] != _run_options(data["tests"]):
        raise SeriesError(f"{path.name} was recorded with other options for its suites: record all suites")
    return data


def record_baseline(
    archive: Path, workers: int, tests: Sequence[str] = HEAVY_TESTS, missing_only: bool = False
) -> Path:
    """Run ``tests`` on the unpatched ``archive`` and write their outcomes to :func:`baseline_file`.

    ``missing_only``: run only the suites the existing record lacks and add them to it (its snapshot, versions and
    options must match; the outcomes of the suites it holds are kept).
    """
    previous = _record_to_extend(archive, tests) if missing_only else None
    run = [t for t in tests if t not in previous["tests"]] if previous else list(tests)
    if not run:
        return baseline_file(archive)
    with tempfile.TemporaryDirectory(prefix="series-baseline-") as tmp:
        stock = unpack(archive, Path(tmp))
        outcomes, seconds = _pytest(stock, run, Path(tmp) / "baseline.xml", workers)
    return write_baseline(archive, run, outcomes, seconds, previous)


def write_baseline(
    archive: Path, tests: Sequence[str], outcomes: Outcomes, seconds: float, previous: dict[str, Any] | None = None
) -> Path:
    """Write the unpatched ``outcomes`` of ``tests`` on ``archive`` (a :func:`_pytest` run) to :func:`baseline_file`.

    With ``previous`` (a record of other suites of the same archive) the result holds both.
    """
    grouped: dict[str, list[tuple[str, str]]] = {}
    for name, outcome in outcomes.tests.items():
        grouped.setdefault(_function(name), []).append((name, outcome))
    functions = {}
    for function, items in sorted(grouped.items()):
        counts = Counter(outcome for _, outcome in items)
        functions[function] = {
            "passed": counts["passed"],
            "skipped": counts["skipped"],
            "failed": counts["failed"],
            "digest": _digest(items),
        }
    if previous is not None:
        tests = sorted({*previous["tests"], *tests})
        functions = dict(sorted({**previous["functions"], **functions}.items()))
        seconds += previous["seconds"]
    total = Counter()
    for counts in functions.values():
        total.update({k: counts[k] for k in ("passed", "skipped", "failed")})
    data = {
        "about": "unpatched outcomes of the heavy upstream suites; regenerate: python tools/series.py baseline",
        "snapshot": archive.name,
        "sha256": _sha256(archive),
        "versions": _versions(),
        "tests": list(tests),
        "options": _run_options(tests),
        "summary": f"{total['passed']} passed, {total['skipped']} skipped, {total['failed']} failed",
        "seconds": round(seconds),
        "functions": functions,
    }
    path = baseline_file(archive)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def _builds_on_a_stack(pr: PullRequest, series: Path) -> bool:
    """Whether ``pr`` needs a pull request that needs others in turn (the areas on the deferred checks).

    Those are checked with the tests they add; the independent pull requests and those on independent ones only
    (e.g. the coalesced sync on the DDP fallback) with upstream's suites of their files.
    """
    prs = {p.name: p for p in pull_requests(series)}
    return any(prs[name].needs for name in pr.needs)


def check_pull_request(
    pr: PullRequest,
    stock: Path,
    series: Path,
    tmp: Path,
    workers: int,
    ruff: str,
    heavy: str,
    unless_light: bool = False,
    archive: Path | None = None,
) -> tuple[list[str], list[tuple[str, str, str, str, float]]]:
    """Apply ``pr`` on exactly the pull requests it needs to the unpatched ``stock`` checkout and check it there.

    A pull request that needs none, or independent ones only: upstream's tests of the modules it touches, unpatched
    against patched (the heavy classification suites as ``heavy`` says), and the tests it adds to suites ``heavy``
    leaves out. One that builds on a stack (:func:`_builds_on_a_stack`): with ``heavy="all"`` the same; otherwise the
    tests it adds to upstream's suites (:func:`added_tests`), which must pass: upstream's suites of its modules pass on
    the whole stack, checked before, and what a pull request can lack on its own (a helper of a later one) breaks its
    own tests. Both: upstream's ruff on its files. Returns problems and summary rows.

    ``unless_light``: one that does not build on a stack is left out where ``heavy`` adds no suite to its check (the
    same check as ``--heavy none``'s, which the other torch releases' environments run). ``archive``: the snapshot
    ``stock`` was unpacked from, whose recorded heavy suites (:func:`_against_record`) stand for stock's run of them.
    """
    names = with_needs(pr, series)
    label = f"{pr.name}" + (f" (on {', '.join(n[:2] for n in names if n != pr.name)})" if pr.needs else " (alone)")
    print(f"\n=== {label}: {len(patch_files(series, names))} patches", flush=True)
    patched = tmp / f"pr-{pr.name}"
    git("worktree", "add", "-q", "--detach", str(patched), "upstream", cwd=stock)
    problems: list[str] = []
    rows: list[tuple[str, str, str, str, float]] = []
    try:
        needed = [name for name in names if name != pr.name]
        changelog = _changelog_matches(patched, series)
        if needed:
            apply(patched, series, names=needed, changelog=changelog)
        before_pr = git("rev-parse", "HEAD", cwd=patched).stdout.strip()
        try:
            apply(patched, series, names=[pr.name], changelog=changelog)
        except SeriesError as err:
            return [f"{pr.name}: {err}"], rows
        touched = _touched(patched, before_pr)
        report = tmp / f"pr-{pr.name}.xml"
        if _builds_on_a_stack(pr, series) and heavy != "all":
            after, seconds = _pytest(patched, added_tests(patched, before_pr), report, workers)
            problems += [f"{pr.name}: {p}" for p in compare_outcomes(Outcomes(), after)]
            rows.append((label, "tests it adds", "", after.summary(), seconds))
        else:
            paths = _with_heavy(upstream_tests_for(touched, heavy=heavy != "none", whole=False), heavy)
            if unless_light and not any(p in HEAVY_TESTS for p in paths):
                rows.append((label, "upstream tests", "", "left to the runs with --heavy none", 0))
                return problems, rows
            # and the tests it adds in suites the heavy option leaves out (on an old torch those found what the
            # whole stack hid)
            added = [t for t in added_tests(patched, before_pr) if _file_of(t) not in paths]
            after, seconds = _pytest(patched, paths + added, report, workers)
            recorded, found, after_live, live_paths = _against_record(archive, paths, after)
            stock_report = tmp / f"pr-{pr.name}-stock.xml"
            before, stock_seconds = _stock_outcomes(stock, live_paths, after_live, stock_report, workers)
            problems += [f"{pr.name}: {p}" for p in found + compare_outcomes(before, after_live)]
            stock_text = before.summary() + (f" + recorded {recorded.summary()}" if recorded else "")
            rows.append((label, "upstream tests", stock_text, after.summary(), seconds + stock_seconds))
        sources = [p for p in touched if p.endswith(".py")]
        new_findings = _ruff_findings(patched, sources, ruff) - _ruff_findings(stock, sources, ruff)
        problems += [f"{pr.name}: ruff {rule} in {path} ({n}x)" for (path, rule), n in sorted(new_findings.items())]
        rows.append((label, f"ruff ({len(sources)} files)", "", "clean" if not new_findings else "NEW FINDINGS", 0))
    finally:
        git("worktree", "remove", "--force", str(patched), cwd=stock, check=False)
    return problems, rows


def check_series(
    archives: Sequence[Path],
    series: Path,
    workers: int,
    ruff: str,
    baseline: str,
    project: str,
    heavy: str = "all",
    project_markers: str = PROJECT_MARKERS,
    alone: str = "all",
) -> int:
    """Apply the series to each snapshot and check it; returns the number of problems found.

    ``alone``: which pull requests are then checked on exactly what they need, on the first snapshot: ``all``,
    ``independent`` (those that need none: where a release difference that the whole stack hides shows), ``heavy``
    (those that build on a stack, and the independent ones that ``heavy`` gives a heavy suite: what the ``independent``
    runs without heavy suites leave out) or ``none``.
    """
    patches = patch_files(series)
    problems: list[str] = []
    rows = []
    suites_text: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="series-test-") as tmp:
        for index, archive in enumerate(archives):
            label = snapshot_label(archive)
            print(f"\n=== {label}: {len(patches)} patches", flush=True)
            stock = unpack(archive, Path(tmp) / label)
            make_checkout(stock, f"upstream {label}", tag="upstream")
            patched = Path(tmp) / f"{label}-patched"
            git("worktree", "add", "-q", "-b", "syncfree", str(patched), "upstream", cwd=stock)
            try:
                for line in apply(patched, series):
                    print("  applied", line)
            except SeriesError as err:
                problems.append(f"{label}: {err}")
                continue
            touched = _touched(patched, "upstream")
            paths = _with_heavy(upstream_tests_for(touched, heavy=index == 0), heavy)
            after_report, before_report = Path(tmp) / f"{label}-after.xml", Path(tmp) / f"{label}-before.xml"
            after, seconds = _pytest(patched, paths, after_report, workers)
            before: Outcomes | None = None
            recorded: RecordedBaseline | None = None
            after_live, live_paths = after, paths
            if baseline == "first" and index == 0:  # the heavy suites' unpatched outcomes from the record if it fits
                recorded, found, after_live, live_paths = _against_record(archive, paths, after)
                problems += [f"{label}: {p}" for p in found]
            if baseline == "all" or (baseline == "first" and index == 0):
                before, stock_seconds = _stock_outcomes(stock, live_paths, after_live, before_report, workers)
                seconds += stock_seconds
                problems += [f"{label}: {p}" for p in compare_outcomes(before, after_live)]
            else:
                problems += [f"{label}: {p}" for p in compare_outcomes(Outcomes(), after_live)]
            stock_text = before.summary() if before else "-"
            if recorded is not None:
                stock_text += f" + recorded {recorded.summary()}"
            rows.append((label, "upstream tests", stock_text, after.summary(), seconds))
            stock_suites = _suite_counts(before.tests.items() if before else ())
            if recorded is not None:
                for suite, counts in recorded.suite_counts().items():
                    stock_suites.setdefault(suite, Counter()).update(counts)
            suites_text += _suite_table(label, stock_suites, _suite_counts(after.tests.items()))

            sources = [p for p in touched if p.endswith(".py")]
            new_findings = _ruff_findings(patched, sources, ruff) - _ruff_findings(stock, sources, ruff)
            problems += [f"{label}: ruff {rule} in {path} ({n}x)" for (path, rule), n in sorted(new_findings.items())]
            rows.append((label, f"ruff ({len(sources)} files)", "", "clean" if not new_findings else "NEW FINDINGS", 0))

            if project == "all" or (project == "first" and index == 0):
                ok, seconds, last = _project_suites(stock, patched, touched, workers, project_markers)
                if not ok:
                    problems.append(f"{label}: the project's suites fail against the patched tree: {last}")
                rows.append((label, "project suites (tree mode)", "", last, seconds))
            git("worktree", "remove", "--force", str(patched), cwd=stock, check=False)
            if index == 0:  # each pull request on exactly the ones it names (the whole stack is checked above)
                for pr in pull_requests(series):
                    if alone == "none" or (alone == "independent" and pr.needs):
                        continue
                    if len(with_needs(pr, series)) < len(pull_requests(series)):
                        found, pr_rows = check_pull_request(
                            pr,
                            stock,
                            series,
                            Path(tmp),
                            workers,
                            ruff,
                            heavy,
                            unless_light=alone == "heavy",
                            archive=archive if baseline == "first" else None,
                        )
                        problems += found
                        rows += pr_rows
    print("\n=== per suite", *suites_text, sep="\n")
    print("\n=== summary")
    for label, what, before, after, seconds in rows:
        before_text = f"stock: {before} | " if before else ""
        print(f"{label:16} {what:28} {before_text}patched: {after}" + (f"  [{seconds:.0f} s]" if seconds else ""))
    for problem in problems:
        print("PROBLEM:", problem)
    print(f"total {time.monotonic() - start:.0f} s; {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return len(problems)


# ------------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--series", type=Path, default=SERIES_DIR, help="folders of pull requests, NN-name/NNNN-*.patch (patches/)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    p_apply = commands.add_parser("apply", help="git am the series onto a TorchMetrics checkout")
    p_apply.add_argument("checkout", type=Path)
    p_apply.add_argument("--check", action="store_true", help="dry run in a scratch worktree; checkout untouched")
    p_apply.add_argument("--pr", action="append", help="a pull request (folder name) and the ones it names; repeatable")

    p_checkout = commands.add_parser("checkout", help="make an upstream checkout with the series on branch syncfree")
    p_checkout.add_argument("dest", type=Path)
    p_checkout.add_argument("--archive", type=Path, default=SHARED_UPSTREAM / SNAPSHOTS[0])

    p_make = commands.add_parser("make", help="regenerate the series from commits of an upstream checkout")
    p_make.add_argument("checkout", type=Path)
    p_make.add_argument("--base", default="upstream", help="the upstream commit the series applies to")
    p_make.add_argument("--head", default="HEAD")

    p_hoist = commands.add_parser("hoist", help="re-make the stack on top of pull requests moved to its front")
    p_hoist.add_argument("checkout", type=Path)
    p_hoist.add_argument(
        "--pr",
        action="append",
        required=True,
        help="a pull request's commit on --base (each on the ones before): SHA (cut out of the stack),"
        " SHA:STACK_COMMIT (that commit, moved), SHA:own[=STACK_COMMIT+...] (its files are final; commits absorbed)",
    )
    p_hoist.add_argument("--base", default="upstream")
    p_hoist.add_argument("--stack", default="syncfree")
    p_hoist.add_argument("--branch", required=True, help="the branch to write the re-made stack to")

    p_test = commands.add_parser("test", help="apply to each snapshot; upstream tests, ruff, project suites")
    p_test.add_argument("--archive", type=Path, action="append", help="snapshot(s); default: both in shared/upstream")
    p_test.add_argument("-n", "--workers", type=int, default=2)
    p_test.add_argument("--ruff", default="ruff", help="ruff executable (upstream pins its version in pre-commit)")
    p_test.add_argument(
        "--baseline",
        choices=("first", "all", "none"),
        default="first",
        help="unpatched runs: first snapshot (its heavy suites from the record in tools/baselines/), all (live), none",
    )

    p_base = commands.add_parser("baseline", help="record the heavy suites' outcomes on an unpatched snapshot")
    p_base.add_argument("--archive", type=Path, default=SHARED_UPSTREAM / SNAPSHOTS[0])
    p_base.add_argument("-n", "--workers", type=int, default=2)
    p_base.add_argument(
        "--missing",
        action="store_true",
        help="run only the heavy suites the record lacks and add them to it (same archive, versions and options)",
    )
    p_test.add_argument("--project", choices=("first", "all", "none"), default="first", help="trees for tree mode")
    p_test.add_argument(
        "--project-markers",
        default=PROJECT_MARKERS,
        help=f"pytest -m expression of the tree-mode suites (default {PROJECT_MARKERS!r}; CI adds 'and not slow')",
    )
    p_test.add_argument(
        "--heavy",
        choices=("all", "subset", "none"),
        default="all",
        help="the heavy classification suites: all of them, the stat-scores and accuracy files (CI), or none (the"
        " other torch releases' CI environments)",
    )
    p_test.add_argument(
        "--pull-requests",
        choices=("all", "independent", "heavy", "none"),
        default="all",
        help="which pull requests to check on exactly what they need after the whole stack: all, those that need none"
        " (the other torch releases' CI environments, with --heavy none), those the independent ones' check without"
        " heavy suites leaves out: the ones that build on a stack, and the independent ones that --heavy gives a"
        " heavy suite (CI's upstream environment), or none",
    )

    args = parser.parse_args(argv)
    try:
        if args.command == "apply":
            names = None
            if args.pr:
                chosen = {pr.name: pr for pr in pull_requests(args.series) if pr.name in args.pr}
                wanted = {name for pr in chosen.values() for name in with_needs(pr, args.series)}
                names = [pr.name for pr in pull_requests(args.series) if pr.name in wanted] or list(args.pr)
            commits = apply(args.checkout, args.series, check=args.check, names=names)
            verb = "would apply cleanly" if args.check else "applied"
            print(f"{len(commits)} patch(es) {verb} to {args.checkout}:")
            print("\n".join(f"  {line}" for line in commits))
        elif args.command == "checkout":
            commits = checkout(args.dest, args.archive, args.series)
            label = snapshot_label(args.archive)
            print(f"{args.dest}: tag upstream = {label}, branch syncfree = {len(commits)} patches")
        elif args.command == "baseline":
            path = record_baseline(args.archive, args.workers, missing_only=args.missing)
            print(f"{_shown(path)}: {json.loads(path.read_text())['summary']}")
        elif args.command == "hoist":
            prs = [_hoisted(spec) for spec in args.pr]
            dropped = hoist(args.checkout, args.base, args.stack, prs, args.branch)
            print(f"branch {args.branch}: the stack re-made on {len(prs)} pull request(s)")
            print("\n".join(f"  dropped (now in a pull request) {line}" for line in dropped))
        elif args.command == "make":
            made = make(args.checkout, args.base, args.head, args.series)
            print("\n".join(str(p.relative_to(REPO) if p.is_relative_to(REPO) else p) for p in made))
        else:
            archives = [locate_snapshot(a) for a in args.archive or [SHARED_UPSTREAM / name for name in SNAPSHOTS]]
            missing = [str(a) for a in archives if not a.is_file()]
            if missing:
                raise SeriesError(f"snapshot(s) not found: {missing} (they live in ../shared/upstream/)")
            problems = check_series(
                archives,
                args.series,
                args.workers,
                args.ruff,
                args.baseline,
                args.project,
                args.heavy,
                args.project_markers,
                args.pull_requests,
            )
            return min(1, problems)
    except SeriesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_runs)
    sys.exit(main())
