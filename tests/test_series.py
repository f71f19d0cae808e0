"""The patch series in ``patches/`` and its tools: naming, git am with rollback, and no drift from the layer.

The full proof (upstream's tests and the project's suites against the patched trees) is ``tox -e upstream``; these
tests are the fast part that runs in every environment of the matrix: they need git and the snapshots in
``../shared/upstream/`` (skipped without them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import _series_tree

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
import _upstream  # noqa: E402
import series  # noqa: E402

# the patch files against the upstream snapshots: the same on every installed release (the series is made against
# master), so run with the latest release only (the `slow` marker's meaning in tox.ini)
pytestmark = pytest.mark.slow

SNAPSHOTS = [_upstream.SHARED_UPSTREAM / name for name in _upstream.SNAPSHOTS]
needs_snapshots = pytest.mark.skipif(
    shutil.which("git") is None or not all(p.is_file() for p in SNAPSHOTS),
    reason="needs git and the upstream snapshots in ../shared/upstream/",
)


def _head(checkout: Path) -> str:
    return _upstream.git("rev-parse", "HEAD", cwd=checkout).stdout.strip()


def _status(checkout: Path) -> str:
    return _upstream.git("status", "--porcelain", cwd=checkout).stdout


@pytest.fixture(scope="module", params=SNAPSHOTS, ids=[_upstream.snapshot_label(p) for p in SNAPSHOTS])
def snapshot(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unpatched upstream checkout (shared by the module's tests: clone it before changing it)."""
    if not request.param.is_file() or shutil.which("git") is None:
        pytest.skip("needs git and the upstream snapshots in ../shared/upstream/")
    tree = _upstream.unpack(request.param, tmp_path_factory.mktemp(_upstream.snapshot_label(request.param)))
    _upstream.make_checkout(tree, "upstream", tag="upstream")
    return tree


@pytest.fixture
def checkout(snapshot: Path, tmp_path: Path) -> Iterator[Path]:
    clone = tmp_path / "torchmetrics"
    _upstream.git("clone", "-q", str(snapshot), str(clone), cwd=tmp_path)
    yield clone


def test_patch_files_are_named_and_complete():
    """Every pull request: a described folder of NNNN-short-name.patch files, each with a subject, a source change,
    upstream tests and a CHANGELOG line."""
    prs = series.pull_requests()
    assert len(prs) >= 3
    for pr in prs:
        assert [p.name[:4] for p in pr.patches] == [f"{i:04d}" for i in range(1, len(pr.patches) + 1)], pr.name
        description = pr.description.read_text()
        for section in ("## What was wrong", "## What changes", "## Behaviour", "## How it was tested"):
            assert section in description, (pr.name, section)
    for patch in series.patch_files():
        text = patch.read_text()
        touched = [line.split(" b/", 1)[1] for line in text.splitlines() if line.startswith("diff --git ")]
        assert "\nSubject: [PATCH" in text, patch.name
        assert any(path.startswith("src/torchmetrics/") for path in touched), patch.name
        assert any(path.startswith("tests/unittests/") for path in touched), patch.name
        assert "CHANGELOG.md" in touched, patch.name
        # what a test run leaves behind (tests/metric.pth once slipped into 0007) is no part of a pull request
        stray = [p for p in touched if not p.startswith(("src/", "tests/unittests/", "docs/source/", "CHANGELOG.md"))]
        assert not stray, (patch.name, stray)
        assert "GIT binary patch" not in text, patch.name


def test_pull_requests_name_what_they_need(tmp_path: Path):
    """A folder without a description, or one that needs a pull request that does not come before it, is refused."""
    folder = tmp_path / "01-first"
    folder.mkdir()
    (folder / "0001-a.patch").write_text("")
    with pytest.raises(series.SeriesError, match=r"no README\.md"):
        series.pull_requests(tmp_path)
    (folder / "README.md").write_text("# First\n\nNeeds: 02-second\n")
    with pytest.raises(series.SeriesError, match="needs \\['02-second'\\]: not a pull request before it"):
        series.pull_requests(tmp_path)
    (folder / "README.md").write_text("# First\n\nNeeds: none\n")
    second = tmp_path / "02-second"
    second.mkdir()
    (second / "0001-b.patch").write_text("")
    (second / "README.md").write_text("# Second\n\nNeeds: 01-first\n")
    first, then = series.pull_requests(tmp_path)
    assert (first.needs, then.needs) == ((), ("01-first",))
    assert series.with_needs(then, tmp_path) == ["01-first", "02-second"]
    third = tmp_path / "03-third"  # needs 02 directly, so 01 through it; not an unrelated 04
    third.mkdir()
    (third / "0001-c.patch").write_text("")
    (third / "README.md").write_text("# Third\n\nNeeds: 02-second\n")
    other = tmp_path / "04-other"
    other.mkdir()
    (other / "0001-d.patch").write_text("")
    (other / "README.md").write_text("# Other\n\nNeeds: none\n")
    *_, third_pr, other_pr = series.pull_requests(tmp_path)
    assert series.with_needs(third_pr, tmp_path) == ["01-first", "02-second", "03-third"]
    assert series.with_needs(other_pr, tmp_path) == ["04-other"]
    # checked with upstream's suites of its files: one on independent pull requests; with the tests it adds: one on a
    # pull request that needs others in turn
    assert not series._builds_on_a_stack(then, tmp_path)
    assert series._builds_on_a_stack(third_pr, tmp_path)
    (tmp_path / "0001-loose.patch").write_text("")
    with pytest.raises(series.SeriesError, match="belong in a pull request's folder"):
        series.pull_requests(tmp_path)


@needs_snapshots
def test_each_pull_request_applies_on_exactly_the_ones_it_names(
    checkout: Path, snapshot: Path, capsys: pytest.CaptureFixture[str]
):
    """A pull request that needs none applies to the unpatched tree alone; the others on exactly what they name.

    On master with their CHANGELOG lines (each sits where only what it needs touches the context), on a release tag
    without them.
    """
    standalone = [pr for pr in series.pull_requests() if not pr.needs]
    assert len(standalone) >= 2
    on_master = snapshot.parent.name.startswith(_upstream.snapshot_label(SNAPSHOTS[0]))
    for pr in series.pull_requests():
        commits = series.apply(checkout, check=True, names=series.with_needs(pr))
        assert len(commits) == len(series.patch_files(names=series.with_needs(pr))), pr.name
        assert ("CHANGELOG.md left out" in capsys.readouterr().out) != on_master, pr.name


@needs_snapshots
def test_ci_checks_alone_only_the_independent_pull_requests_a_heavy_suite_adds_to(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``--pull-requests heavy`` (CI's upstream environment) leaves to the runs without heavy suites what they check.

    An independent pull request whose files map to no heavy suite gets the same check there (the other torch releases'
    environments); one that touches the stat scores runs their suites alone here, where nothing else does.
    """
    if not snapshot.parent.name.startswith(_upstream.snapshot_label(SNAPSHOTS[0])):
        pytest.skip("CI checks the pull requests alone on master")
    ran: dict[str, list[str]] = {}

    def fake_pytest(tree: Path, paths: list[str], report: Path, workers: int) -> tuple[series.Outcomes, float]:
        ran[tree.name.removeprefix("pr-")] = paths
        return series.Outcomes(), 0.0

    monkeypatch.setattr(series, "_pytest", fake_pytest)
    monkeypatch.setattr(series, "_stock_outcomes", lambda *args: (series.Outcomes(), 0.0))
    monkeypatch.setattr(series, "_ruff_findings", lambda *args: series.Counter())
    independent = [pr for pr in series.pull_requests() if not pr.needs]
    for pr in independent:
        problems, _ = series.check_pull_request(pr, snapshot, series.SERIES_DIR, tmp_path, 1, "ruff", "subset", True)
        assert not problems, problems
    assert "08-multiclass-stat-score-counting" in ran
    assert 0 < len(ran) < len(independent)
    assert all(set(paths) & set(series.HEAVY_SUBSET) for paths in ran.values()), ran


@needs_snapshots
def test_a_pull_request_alone_takes_stocks_heavy_suites_from_their_record(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Checked alone with its snapshot's record (tools/baselines/), a pull request's heavy suites are compared with the
    record: stock runs or collects only its other suites, and a heavy test the patched tree lacks is found."""
    archive = next(a for a in SNAPSHOTS if snapshot.parent.name.startswith(_upstream.snapshot_label(a)))
    if not series.baseline_file(archive).is_file():
        pytest.skip(f"no record of {archive.name}'s heavy suites")
    asked: list[list[str]] = []

    def fake_stock(stock: Path, paths: list[str], *args: object) -> tuple[series.Outcomes, float]:
        asked.append(list(paths))
        return series.Outcomes(), 0.0

    monkeypatch.setattr(series, "_pytest", lambda *args: (series.Outcomes(), 0.0))  # the patched tree runs nothing
    monkeypatch.setattr(series, "_stock_outcomes", fake_stock)
    monkeypatch.setattr(series, "_ruff_findings", lambda *args: series.Counter())
    pr = next(pr for pr in series.pull_requests() if pr.name == "08-multiclass-stat-score-counting")
    problems, rows = series.check_pull_request(
        pr, snapshot, series.SERIES_DIR, tmp_path, 1, "ruff", "subset", archive=archive
    )
    assert len(asked) == 1 and not set(asked[0]) & set(series.HEAVY_TESTS), asked
    assert any(p.startswith(f"{pr.name}: missing on the patched tree: ") for p in problems), problems
    assert "recorded" in rows[0][2]


def _multiclass_syncs(tree: Path) -> dict[str, int]:
    """The probe's would-be syncs of multiclass stat-score updates of ``tree``'s TorchMetrics."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree / "src"), str(TOOLS.parent)))}
    run = subprocess.run(
        [sys.executable, str(TOOLS / "multiclass_scaling.py")], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["syncs"]


@needs_snapshots
def test_the_multiclass_counting_pull_request_alone_reads_nothing_in_the_counting(checkout: Path, snapshot: Path):
    """``08-multiclass-stat-score-counting`` on master alone: the updates the probe sees syncing there read nothing.

    The validation is not that pull request's (it still reads label inputs); score inputs, which it does not check,
    show the counting alone.
    """
    if not snapshot.parent.name.startswith(_upstream.snapshot_label(SNAPSHOTS[0])):
        pytest.skip("measured on master, which the pull request is made against")
    before = _multiclass_syncs(checkout)
    series.apply(checkout, names=["08-multiclass-stat-score-counting"])
    after = _multiclass_syncs(checkout)
    assert before.keys() == after.keys()
    assert sum(before.values()) > 0
    assert before["macro, validate_args=False"] > 0 and before["macro, samplewise, validate_args=False"] > 0
    assert all(count == 0 for count in after.values()), after


def test_diff_lines_are_the_lines_a_diff_adds_or_removes():
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n keep\n-old\n+new\n"
    assert series.diff_lines(diff) == {"x.py": ["new"]}
    assert series.diff_lines(diff, "-") == {"x.py": ["old"]}


def test_added_tests_are_the_test_functions_a_change_adds(tmp_path: Path):
    """A pull request that builds on others runs the tests it adds: new test functions, not changed or helper ones."""
    repo = _repository(tmp_path)
    (repo / "tests" / "unittests" / "area").mkdir(parents=True)
    suite = "tests/unittests/area/test_a.py"
    base = _commit(repo, {suite: "def test_old():\n    pass\n", "tests/unittests/area/helper.py": ""}, "base")
    changed = "def test_old():\n    assert 1\n\n\ndef test_new(x):\n    pass\n\n\nasync def test_waits():\n    pass\n"
    _commit(repo, {suite: changed, "tests/unittests/area/helper.py": "def test_like():\n    pass\n"}, "change")
    assert series.added_tests(repo, base) == [
        "unittests/area/test_a.py::test_new",
        "unittests/area/test_a.py::test_waits",
    ]


def test_a_pull_request_alone_runs_the_suites_of_its_files_not_of_their_folders():
    """The whole stack runs every suite of the folders it touches; a pull request alone the suites of its files."""
    jaccard = "src/torchmetrics/functional/classification/jaccard.py"
    alone = series.upstream_tests_for([jaccard], heavy=True, whole=False)
    assert "unittests/classification/test_jaccard.py" in alone
    assert "unittests/classification/test_stat_scores.py" not in alone
    assert not set(series.ALWAYS_TESTS) & set(alone)
    whole = series.upstream_tests_for([jaccard], heavy=True)
    assert {"unittests/classification/test_stat_scores.py", *series.ALWAYS_TESTS} <= set(whole)
    unmapped = "src/torchmetrics/classification/hamming.py"  # only its folder names it: the folder's suites
    assert "unittests/classification/test_stat_scores.py" in series.upstream_tests_for([unmapped], True, whole=False)


def _changed_lines(patch: Path, sign: str) -> dict[str, set[str]]:
    """The non-blank lines a patch adds (``+``) or removes (``-``), per file but CHANGELOG.md."""
    changed = series.diff_lines(patch.read_text(), sign)
    return {
        path: {line.strip() for line in lines if line.strip()}
        for path, lines in changed.items()
        if path != "CHANGELOG.md"
    }


#: lines a later pull request rewrites in an earlier one's change, by (earlier, later): reviewed, each with its reason
REWRITTEN_LINES = {
    # 06 imports one more name from typing on the line 01 extended
    ("01-ddp-gloo-fallback", "06-coalesced-ddp-sync"): {"from typing import Any, Callable, Dict, List, Optional"},
    ("07-aggregation-python-numbers-and-nan", "10-deferred-checks"): {
        # 10 replaces the host reads that 07 keeps for "warn" and "error" (and their docstring) by deferred checks
        'Returns ``None`` for ``"disable"``, and where the check of ``"warn"``/``"error"`` found no `nan`. '
        "Otherwise the",
        "mask may be clear: the sums mask by arithmetic, never by a data-dependent shape, "
        "so that a batch adds the same bits",
        'on every device. ``"ignore"`` and float strategies read nothing on the host; ``"warn"`` and ``"error"`` read',
        "whether the batch holds a `nan`, to warn or raise at once.",
        'if metric.nan_strategy in ("error", "warn") and not nans.any():',
        "return None",
        "raise RuntimeError(_NAN_MESSAGE)",
        'rank_zero_warn(f"{_NAN_MESSAGE}. Will be removed.", UserWarning)',
        # with "error" deferred, CatMetric's state may hold the masked batches that compute leaves out
        '"""Return the batches without their `nan` entries (flattened)."""',
        '# with "warn" and "ignore" the batch keeps its `nan` entries (the neutral element here):',
        "`nan` entries kept by ``update`` are left out here.",
        "def _without_nan(values: list[Tensor]) -> list[Tensor]:",
        'keeps_nan = self.nan_strategy in ("warn", "ignore")',
        "kept = _without_nan([values] if isinstance(values, Tensor) else values)",
        # 10 writes states through ``add_to_states`` and ``_fold_extreme`` (in place, inference-mode states)
        'self.max_value = torch.max(self.max_value, _cast_and_neutralise(self, value, float("-inf")).max())',
        'self.min_value = torch.min(self.min_value, _cast_and_neutralise(self, value, float("inf")).min())',
        "self.sum_value += _sum_of(self, value)",
        "self.mean_value += mean_value",
        "self.weight += total_weight",
    },
    ("08-multiclass-stat-score-counting", "11-stat-scores"): {
        # 11 imports the names of the deferred checks, ``_bincount`` (its ``_count``) and ``_is_compiling`` (of 10)
        "from typing import Optional, Union",
        "from torchmetrics.utilities.data import select_topk",
        "from torchmetrics.utilities.imports import _XLA_AVAILABLE",
        # ``_class_counts`` also returns the count of targets that are no class (the check of score inputs) and
        # weighs the entries of a validated batch without masks; the update passes ``validated`` on
        ") -> Tensor:",
        '"""Compute tp/fp/tn/fn per class as one ``(4, C)`` block in O(entries + classes).',
        "The ``(4, C)`` block (rows tp, fp, tn, fn)",
        "return torch.stack((hits, predicted - hits, torch.rsub(predicted, counted) - misses, misses))",
        "weights = _counted_entries(labels, target, num_classes, ignore_index, from_scores).long()",
        "return _class_counts(labels, target, num_classes, ignore_index, from_scores, samplewise).unbind(0)",
        # the micro block from two columns made once per device (``_is_compiling`` of 10): one launch fewer
        "``tp`` hits of ``counted`` entries fp and fn are ``counted - tp`` and tn is ``(C - 2) * counted + tp``.",
        "tp = correct.sum()",
        "misses = torch.rsub(tp, counted)",
        "return torch.stack((tp, misses, tp.add(counted, alpha=num_classes - 2), misses)).view(4, 1)",
        # XLA and MPS count ``top_k=1`` with the mesh of ``_bincount`` (the docstring's line wraps anew)
        "comparison",
        # not 08's lines: the same text as lines of the validation 11 rewrites
        '"""',
        "if ignore_index is None:",
    },
}


def test_no_pull_request_rewrites_the_lines_of_another():
    """A pull request builds on the ones before it: it removes no line that an earlier one added, but those listed."""
    patches = {pr.name: list(pr.patches) for pr in series.pull_requests()}
    added = {name: [_changed_lines(p, "+") for p in files] for name, files in patches.items()}
    removed = {name: [_changed_lines(p, "-") for p in files] for name, files in patches.items()}
    names = list(patches)
    found = {}
    for i, earlier in enumerate(names):
        for later in names[i + 1 :]:
            for before in added[earlier]:
                for after in removed[later]:
                    for path in before.keys() & after.keys():
                        found.setdefault((earlier, later), set()).update(before[path] & after[path])
    assert {pair: lines for pair, lines in found.items() if lines} == REWRITTEN_LINES


def test_the_ddp_pass_runs_only_where_a_selected_test_may_be_marked_ddp(tmp_path: Path):
    """The DDP pass costs about 6 s even when empty: only for a selection that may hold a DDP test."""
    unittests = tmp_path / "tests" / "unittests"
    (unittests / "area").mkdir(parents=True)
    (unittests / "area" / "test_ddp.py").write_text("@pytest.mark.DDP\ndef test_a():\n    pass\n")
    (unittests / "area" / "test_plain.py").write_text("def test_b():\n    pass\n")
    (unittests / "_helpers.py").write_text("x = 1\n")
    assert series._marks_ddp_tests(tmp_path, ["unittests/area/test_ddp.py::test_a"])
    assert series._marks_ddp_tests(tmp_path, ["unittests/area"])
    assert not series._marks_ddp_tests(tmp_path, ["unittests/area/test_plain.py", "unittests/area/test_plain.py::b"])
    # of a file selected by node ids, a DDP sibling does not count; module-level code and the selected test do
    suite = unittests / "area" / "test_suite.py"
    sibling = "class TestSuite:\n    @pytest.mark.DDP\n    def test_ddp(self):\n        pass\n\n\n"
    added = "@pytest.mark.parametrize('x', [1])\ndef test_added(x):\n    pass\n"
    suite.write_text(sibling + added)
    assert not series._marks_ddp_tests(tmp_path, ["unittests/area/test_suite.py::test_added[1]"])
    assert series._marks_ddp_tests(tmp_path, ["unittests/area/test_suite.py::TestSuite::test_ddp"])
    whole = "unittests/area/test_suite.py"
    assert series._marks_ddp_tests(tmp_path, [f"{whole}::test_added", whole])
    suite.write_text("CASES = [pytest.param(True, marks=pytest.mark.DDP)]\n\n\n" + sibling + added)
    assert series._marks_ddp_tests(tmp_path, ["unittests/area/test_suite.py::test_added"])
    suite.write_text(sibling + added.replace("@pytest.mark.parametrize", "@pytest.mark.DDP\n@pytest.mark.parametrize"))
    assert series._marks_ddp_tests(tmp_path, ["unittests/area/test_suite.py::test_added"])
    (unittests / "_helpers.py").write_text("DDP_CASE = pytest.param(True, marks=pytest.mark.DDP)\n")
    assert series._marks_ddp_tests(tmp_path, ["unittests/area/test_plain.py"])


def test_short_names_cut_at_a_word():
    assert series.short_name("Aggregation: check `nan` on the device and never write the inputs") == (
        "aggregation-check-nan-on-the-device-and"
    )


def test_a_failed_run_reports_its_tracebacks_not_only_its_summary():
    """CI keeps only what ``series.py`` prints: a failure that shows only there must bring its reason along."""
    tracebacks = ["_ test_one _", *(f"frame {i}" for i in range(40)), "E   assert 1 == 2"]
    summary = ["=== short test summary info ===", "FAILED test_one", "1 failed"]
    run = ["collected", "=== FAILURES ===", *tracebacks, *summary]
    report = series._report_lines(run, returncode=1)
    assert report[: len(tracebacks) + 1] == ["=== FAILURES ===", *tracebacks]
    assert report[-2:] == ["FAILED test_one", "1 failed"]
    assert series._report_lines(run, returncode=0) == run[-15:]
    long = ["=== FAILURES ===", *(f"line {i}" for i in range(500)), "=== short test summary info ===", "1 failed"]
    assert len(series._report_lines(long, returncode=1)) == series.FAILURE_LINES + 3


def test_tree_mode_runs_the_tests_its_markers_select(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """CI's ``upstream`` environment leaves the slow tests out of tree mode: the marker expression reaches pytest."""
    commands: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> object:
        commands.append(command)
        return type("Done", (), {"returncode": 0, "stdout": "1 passed"})()

    monkeypatch.setattr(series.subprocess, "run", run)
    touched = ["src/torchmetrics/classification/confusion_matrix.py"]
    series._project_suites(tmp_path, tmp_path, touched, workers=1)
    series._project_suites(tmp_path, tmp_path, touched, workers=1, markers="not cuda and not slow")
    markers = [c[c.index("-m", c.index("pytest")) + 1] for c in commands]  # pytest's -m, not python's
    assert markers == [series.PROJECT_MARKERS, "not cuda and not slow"]
    assert "--project-markers" in _help("test")


def _help(command: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        series.main([command, "--help"])
    return out.getvalue()


@needs_snapshots
def test_series_applies_and_matches_the_layer(checkout: Path, snapshot: Path):
    """git am onto the snapshot, then every function the series changes is a layer target and vice versa.

    On master with the CHANGELOG lines; on a release tag, whose Unreleased section differs, without them.
    """
    commits = series.apply(checkout)
    assert len(commits) == len(series.patch_files())
    changelog_changed = bool(_upstream.git("diff", "upstream", "HEAD", "--", "CHANGELOG.md", cwd=checkout).stdout)
    assert changelog_changed == snapshot.parent.name.startswith(_upstream.snapshot_label(SNAPSHOTS[0]))
    stock = checkout.parent / "stock"
    _upstream.git("worktree", "add", "-q", "--detach", str(stock), "upstream", cwd=checkout)
    specs = _series_tree.series_specs()
    problems, targets = _series_tree.drift(stock / "src", checkout / "src", specs)
    assert problems == []
    assert sum(len(specs) for specs in targets.values()) == len(specs)


def test_curve_costs_tool_times_the_series_against_its_upstream(checkout: Path, snapshot: Path):
    """``tools/series_curve_costs.py`` (the timing table of patch 12's README) runs both trees and compares counts."""
    if not snapshot.parent.name.startswith(_upstream.snapshot_label(SNAPSHOTS[0])):
        pytest.skip("the series is made against master: timed there")
    series.apply(checkout)
    tool = Path(__file__).resolve().parents[1] / "tools" / "series_curve_costs.py"
    run = subprocess.run(
        [sys.executable, str(tool), str(checkout), "--quick"], capture_output=True, text=True, timeout=900, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = run.stdout.splitlines()
    assert rows[0].startswith("| case (one `update`, CPU, one thread) | upstream (us) | series (us) |")
    assert len(rows) == 2 + 10  # the header and the ten cases
    for row in rows[2:]:
        *_, ratio, same = (cell.strip() for cell in row.strip("|").split("|"))
        assert float(ratio) > 0 and same == "yes", row


def test_areas_left_out_of_the_series_are_real_areas():
    from torchmetrics_syncfree import _registry

    areas = {spec.area for spec in _registry._load_areas()}
    assert set(_series_tree.AREAS_WITHOUT_PATCHES) <= areas
    assert {spec.area for spec in _series_tree.series_specs()} == areas - set(_series_tree.AREAS_WITHOUT_PATCHES)


def test_drift_compares_code_not_docstrings():
    cls = "class A:\n    def g(self):\n        {doc}return 1\n"
    stock = "def f(x):\n    return x\n\n" + cls.format(doc="'doc'\n        ")
    same_but_docs = "def f(x):\n    return x\n\n" + cls.format(doc="'new doc'\n        ")
    changed = "def f(x):\n    return x + 1\n\ndef _helper():\n    pass\n\n" + cls.format(doc="")
    removed = cls.format(doc="")
    assert _series_tree.changed_functions(stock, same_but_docs) == set()
    assert _series_tree.changed_functions(stock, changed) == {"f"}  # new module-level helpers are not targets
    assert _series_tree.changed_functions(stock, removed) == {"f"}
    assert _series_tree.changed_functions(removed, removed + "    def h(self):\n        pass\n") == {"A.h"}
    helper_class = "class _Helper:\n    def h(self):\n        pass\n"
    assert _series_tree.changed_functions(removed, removed + helper_class) == set()  # a new class is a helper


@needs_snapshots
def test_check_is_a_dry_run(checkout: Path):
    head = _head(checkout)
    commits = series.apply(checkout, check=True)
    assert len(commits) == len(series.patch_files())
    assert _head(checkout) == head
    assert _status(checkout) == ""
    assert _upstream.git("worktree", "list", cwd=checkout).stdout.count("\n") == 1


@needs_snapshots
@pytest.mark.parametrize("check", [False, True], ids=["apply", "check"])
def test_a_hunk_that_does_not_apply_names_patch_and_file_and_rolls_back(checkout: Path, check: bool):
    source = checkout / "src/torchmetrics/aggregation.py"
    text = source.read_text()
    source.write_text(text.replace('"""Convert input ``x`` to a tensor and check for Nans."""', '"""Changed."""'))
    _upstream.git(*_upstream.GIT_IDENTITY, "commit", "-qam", "diverge", cwd=checkout)
    head = _head(checkout)
    with pytest.raises(series.SeriesError) as err:
        series.apply(checkout, check=check)
    message = str(err.value)
    first_to_touch_it = next(
        f"{patch.parent.name}/{patch.name}"
        for patch in series.patch_files()
        if "a/src/torchmetrics/aggregation.py" in patch.read_text()
    )
    assert message.startswith(first_to_touch_it) and "src/torchmetrics/aggregation.py (hunk at line" in message
    assert "nothing was applied" in message
    assert _head(checkout) == head
    assert _status(checkout) == ""
    assert not (checkout / "src/torchmetrics/utilities/deferred.py").exists()


@needs_snapshots
def test_refuses_a_dirty_checkout(checkout: Path):
    (checkout / "CHANGELOG.md").write_text("local edit\n")
    with pytest.raises(series.SeriesError, match="uncommitted changes"):
        series.apply(checkout)


@needs_snapshots
def test_refuses_a_checkout_that_has_the_series(checkout: Path):
    series.apply(checkout)
    head = _head(checkout)
    with pytest.raises(series.SeriesError, match="already has commits with the subjects of"):
        series.apply(checkout, check=True)
    assert _head(checkout) == head


def test_refuses_a_directory_that_is_not_a_checkout(tmp_path: Path):
    with pytest.raises(series.SeriesError, match="not a git checkout"):
        series.apply(tmp_path)


@needs_snapshots
def test_make_regenerates_the_same_series(checkout: Path, tmp_path: Path, snapshot: Path):
    """apply then make gives back byte-identical patch files (the series is reproducible from a branch)."""
    if not snapshot.parent.name.startswith(_upstream.snapshot_label(SNAPSHOTS[0])):
        pytest.skip("the series is made against master; on other trees the blob ids of CHANGELOG.md differ")
    series.apply(checkout)
    out = tmp_path / "made"
    shutil.copytree(series.SERIES_DIR, out)
    made = series.make(checkout, "upstream", "HEAD", out)
    assert [p.relative_to(out) for p in made] == [p.relative_to(series.SERIES_DIR) for p in series.patch_files()]
    for new, old in zip(made, series.patch_files()):
        assert new.read_text() == old.read_text(), new.name


def _recorded(outcomes: dict[str, str]) -> series.RecordedBaseline:
    grouped: dict[str, list[tuple[str, str]]] = {}
    for name, outcome in outcomes.items():
        grouped.setdefault(series._function(name), []).append((name, outcome))
    functions = {
        function: {
            "passed": sum(o == "passed" for _, o in items),
            "skipped": sum(o == "skipped" for _, o in items),
            "failed": sum(o == "failed" for _, o in items),
            "digest": series._digest(items),
        }
        for function, items in grouped.items()
    }
    return series.RecordedBaseline(["unittests/classification/test_x.py"], functions)


def test_recorded_baseline_finds_what_a_live_baseline_finds():
    """A record of the unpatched outcomes flags failures, new skips and missing tests, and nothing else."""
    stock = {
        "tests.unittests.classification.test_x.TestX::test_a[0]": "passed",
        "tests.unittests.classification.test_x.TestX::test_a[1]": "skipped",
        "tests.unittests.classification.test_x::test_b": "passed",
    }
    recorded = _recorded(stock)
    assert recorded.covers("tests.unittests.classification.test_x.TestX::test_a[0]")
    assert not recorded.covers("tests.unittests.classification.test_xy::test_c")
    assert recorded.summary() == "2 passed, 1 skipped, 0 failed"
    added = {"tests.unittests.classification.test_x::test_new[cuda]": "skipped"}
    assert recorded.compare(series.Outcomes({**stock, **added})) == []
    problems = recorded.compare(
        series.Outcomes({**stock, "tests.unittests.classification.test_x.TestX::test_a[0]": "skipped"})
    )
    assert problems == [
        "tests.unittests.classification.test_x.TestX::test_a: 0 passed, 2 skipped on the patched tree;"
        " recorded on stock: 1 passed, 1 skipped"
    ]
    failed = recorded.compare(series.Outcomes({**stock, "tests.unittests.classification.test_x::test_b": "failed"}))
    assert failed[0] == "FAILED on the patched tree: tests.unittests.classification.test_x::test_b"
    missing = {k: v for k, v in stock.items() if "test_b" not in k}
    assert recorded.compare(series.Outcomes(missing)) == [
        "missing on the patched tree: tests.unittests.classification.test_x::test_b (1 passed on stock)"
    ]


@needs_snapshots
def test_recorded_baselines_match_their_snapshots():
    """Every committed record names a snapshot in ../shared/upstream/ and was made from that very archive."""
    records = sorted(series.BASELINES_DIR.glob("*.json"))
    assert records, "tools/baselines/ holds the heavy suites' unpatched outcomes (python tools/series.py baseline)"
    for record in records:
        archive = next(a for a in SNAPSHOTS if series.baseline_file(a) == record)
        baseline, why = series.RecordedBaseline.load(archive, series.HEAVY_TESTS)
        assert baseline is not None, why


@needs_snapshots
def test_a_subset_of_the_recorded_suites_only_expects_its_own_functions():
    """``--heavy subset`` runs two of the heavy files: the record must not report the others' functions as missing."""
    archive = next(a for a in SNAPSHOTS if series.baseline_file(a).is_file())
    full, why = series.RecordedBaseline.load(archive, series.HEAVY_TESTS)
    assert full is not None, why
    subset, why = series.RecordedBaseline.load(archive, series.HEAVY_SUBSET)
    assert subset is not None, why
    assert {series._suite(f) for f in subset.functions} == set(series.HEAVY_SUBSET)
    assert set(subset.functions) < set(full.functions)
    ran = series.Outcomes({f"{f}[0]": "passed" for f in subset.functions})
    assert not [p for p in subset.compare(ran) if p.startswith("missing")]


def test_a_selection_of_test_functions_runs_in_one_process():
    """Whole files run on the workers asked for; node ids only (a pull request's added tests, stock's reruns) in one
    process, where starting workers costs more than the tests."""
    assert series._workers_for(["unittests/test_x.py", "unittests/test_y.py::test_f"], 2) == 2
    assert series._workers_for(["unittests/test_x.py::test_f", "unittests/test_y.py::TestC::test_g[a]"], 2) == 1
    assert series._workers_for(["unittests/folder/"], 3) == 3


def test_stock_runs_only_the_tests_the_patched_tree_did_not_pass(tmp_path: Path):
    """Stock's tests are collected (the names junit gives them, parameters with ``::`` and dots included), and only
    those the patched tree skipped or failed run there: a skip that passes on stock and a missing test are found."""
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")  # the rootdir: the tree, as upstream's
    (tmp_path / "tests" / "unittests").mkdir(parents=True)
    (tmp_path / "tests" / "unittests" / "test_x.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('p', ['a::b', '1.5'])\n"
        "def test_f(p):\n    pass\n\n"
        "class TestC:\n    def test_g(self):\n        pass\n\n    def test_h(self):\n        pass\n"
    )
    stock_tree = tmp_path
    names = series._collected(stock_tree, ["unittests/test_x.py"])
    assert sorted(names) == [
        "tests.unittests.test_x.TestC::test_g",
        "tests.unittests.test_x.TestC::test_h",
        "tests.unittests.test_x::test_f[1.5]",
        "tests.unittests.test_x::test_f[a::b]",
    ]
    ran, _ = series._pytest(stock_tree, ["unittests/test_x.py"], tmp_path / "all.xml", workers=1)
    assert set(ran.tests) == set(names)  # the junit names of a run are the collected ones
    patched = series.Outcomes(
        {
            "tests.unittests.test_x::test_f[a::b]": "passed",
            "tests.unittests.test_x::test_f[1.5]": "skipped",
            "tests.unittests.test_x.TestC::test_g": "passed",
        }
    )
    stock, _ = series._stock_outcomes(stock_tree, ["unittests/test_x.py"], patched, tmp_path / "s.xml", workers=1)
    assert stock.tests == {
        "tests.unittests.test_x::test_f[a::b]": "not run",
        "tests.unittests.test_x::test_f[1.5]": "passed",
        "tests.unittests.test_x.TestC::test_g": "not run",
        "tests.unittests.test_x.TestC::test_h": "not run",
    }
    assert series.compare_outcomes(stock, patched) == [
        "skipped on the patched tree, passed on stock: tests.unittests.test_x::test_f[1.5]",
        "missing on the patched tree: tests.unittests.test_x.TestC::test_h",
    ]
    assert stock.summary() == "1 passed, 0 skipped, 0 failed, 3 collected"


def _repository(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    repo.mkdir()
    _upstream.git("init", "-q", cwd=repo)
    return repo


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).write_text(text)
    _upstream.git("add", "-A", cwd=repo)
    _upstream.git(*_upstream.GIT_IDENTITY, "commit", "-qm", message, cwd=repo)
    return _upstream.git("rev-parse", "HEAD", cwd=repo).stdout.strip()


def test_hoist_moves_a_change_to_the_front_and_keeps_the_final_tree(tmp_path: Path):
    """A stack commit moved to the front is dropped from the stack; the stack's final tree keeps its code, the
    pull requests' entries replace the moved commit's, and a change cut out of the stack is merged into every commit.
    """
    repo = _repository(tmp_path)
    changelog = "## [Unreleased] - YYYY-MM-DD\n\n### Added\n\n-\n\n\n### Changed\n\n-\n\n\n### Fixed\n\n-\n\n\n---\n"
    code = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(8))
    base = _commit(repo, {"CHANGELOG.md": changelog, "a.py": code}, "base")
    _upstream.git("tag", "upstream", cwd=repo)
    first = _commit(repo, {"a.py": code.replace("return 1\n", "return 10\n")}, "first")
    _commit(repo, {"CHANGELOG.md": changelog.replace("### Changed\n\n-", "### Changed\n\n- first")}, "first entry")
    stack_tip = _commit(
        repo, {"a.py": code.replace("return 1\n", "return 10\n").replace("return 6\n", "return 60\n")}, "second"
    )
    _upstream.git("branch", "stack", cwd=repo)
    _upstream.git("checkout", "-q", "-b", "prs", base, cwd=repo)
    moved_entry = changelog.replace("-\n\n\n### Changed", "-\n\n\n- Added first\n\n\n### Changed")
    moved = _commit(repo, {"a.py": code.replace("return 1\n", "return 10\n"), "CHANGELOG.md": moved_entry}, "PR 1")
    cut = _commit(
        repo, {"b.py": "x = 1\n", "CHANGELOG.md": moved_entry.replace("### Fixed\n\n-", "### Fixed\n\n- b")}, "PR 2"
    )
    dropped = series.hoist(
        repo, "upstream", "stack", [series.Hoisted(moved, moved=first), series.Hoisted(cut)], "hoisted"
    )
    assert [line.split(" ", 1)[1] for line in dropped] == ["first"]
    log = _upstream.git("log", "--format=%s", "upstream..hoisted", cwd=repo).stdout.split("\n")
    assert [line for line in log if line] == ["second", "first entry", "PR 2", "PR 1"]
    final = lambda path: _upstream.git("show", f"hoisted:{path}", cwd=repo).stdout  # noqa: E731
    assert final("a.py") == _upstream.git("show", f"{stack_tip}:a.py", cwd=repo).stdout
    assert final("b.py") == "x = 1\n"
    assert "- Added first" in final("CHANGELOG.md") and "- b" in final("CHANGELOG.md")


def test_hoist_lets_an_owning_pull_request_absorb_the_commits_that_made_its_files(tmp_path: Path):
    """Stack commits that only built what an owning pull request holds disappear, entries included."""
    repo = _repository(tmp_path)
    changelog = "## [Unreleased] - YYYY-MM-DD\n\n### Added\n\n-\n\n\n### Changed\n\n-\n\n\n---\n"
    base = _commit(repo, {"CHANGELOG.md": changelog, "c.py": "v0\n", "d.py": "d0\n"}, "base")
    _upstream.git("tag", "upstream", cwd=repo)
    entry = changelog.replace("### Changed\n\n-", "### Changed\n\n- c1")
    first = _commit(repo, {"c.py": "v1\n", "CHANGELOG.md": entry}, "c two paths")
    entries = entry.replace("- c1\n", "- c1\n\n\n- c2\n")
    second = _commit(repo, {"c.py": "v2\n", "CHANGELOG.md": entries}, "c one path")
    _commit(repo, {"d.py": "d1\n", "CHANGELOG.md": entries.replace("- c2\n", "- c2\n\n\n- d\n")}, "d")
    _upstream.git("branch", "stack", cwd=repo)
    _upstream.git("checkout", "-q", "-b", "prs", base, cwd=repo)
    owning = _commit(
        repo, {"c.py": "v2\n", "CHANGELOG.md": changelog.replace("-\n\n\n---", "-\n\n\n- c\n\n\n---")}, "PR"
    )
    hoisted = series.Hoisted(owning, owns=True, absorbed=(first, second))
    dropped = series.hoist(repo, "upstream", "stack", [hoisted], "hoisted")
    assert [line.split(" ", 1)[1] for line in dropped] == ["c two paths", "c one path"]
    final = _upstream.git("show", "hoisted:CHANGELOG.md", cwd=repo).stdout
    assert "- c\n" in final and "- d\n" in final and "- c1" not in final and "- c2" not in final
    assert _upstream.git("show", "hoisted:c.py", cwd=repo).stdout == "v2\n"
    assert series._hoisted(f"{owning}:own={first}+{second}") == hoisted
