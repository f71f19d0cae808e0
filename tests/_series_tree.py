"""Tree mode: the project's suites against a TorchMetrics tree patched with ``patches/`` instead of ``patch_all()``.

Set ``TORCHMETRICS_SYNCFREE_SERIES_TREE`` to a checkout with the series applied and import the *unpatched* tree as
``torchmetrics`` (``PYTHONPATH=<unpatched>/src``); ``python tools/series.py test`` does both. Then:

* "stock" in the tests is the unpatched upstream tree, exactly as without tree mode;
* "patched" (``patch_all()``, ``patched()``) installs, for every target the monkeypatch layer declares, the function
  of the *patched tree* in place of the layer's replacement. The registry, the probe and every assertion of the
  suites stay the same, so the suites prove that the series behaves as the layer does;
* before any test runs, the series and the layer are compared function by function (AST, docstrings ignored): every
  function or method the series changes must be a target of the layer, and every target of the layer must be
  changed by the series. Anything else is drift and stops the run. Module-level functions that the series adds are
  helpers reached through the targets; modules it adds are imported under their own names.

Module-level names that the series adds to a changed module (its new helpers) are also set on the unpatched
module of that name: the series' code may import them from there (``Metric._sync_dist`` imports
``torchmetrics.utilities.distributed._sync_on_backend`` when it runs), and unpatched code never looks them up.
The changed modules are loaded under an alias, so a function one of them imports from another changed module (the
tree's ``MulticlassStatScores.update`` calls ``_multiclass_stat_scores_tensor_validation``) would be the unpatched
one; such names are rebound to the tree's functions (:func:`_link_changed_modules`).

Spawned processes (the DDP suites' ranks) do not run pytest's hooks: they call :func:`install_from_env` before
patching, or they would test the layer instead of the series. :func:`series_module` gives the suites the patched
tree's module of a target, for what they inspect beyond the targets (the DDP fallback's cache, its mode).

The series' ``torchmetrics.utilities.deferred`` reads CPU flags at once (free on CPU). While a CPU ``SyncProbe`` is
active the layer's ``_deferred`` takes the CUDA path instead, so that the probe sees what a GPU run does; the same is
arranged here by routing CPU flags into the tree's own queue (a host copy that is ready at the next poll) and not
counting the read of that host copy. The tree's queue, ordering and poll/flush logic are what run. Likewise the
tree's ``deferred.reads_are_free`` (which picks the CPU fast paths) answers like the layer's: false under such a probe.

"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import pytest

TREE_ENV = "TORCHMETRICS_SYNCFREE_SERIES_TREE"
_ALIAS = "_syncfree_series"
#: the modules the series adds, by name, once tree mode is installed
_added: dict[str, ModuleType] = {}


def pytest_configure(config: pytest.Config) -> None:
    tree = os.environ.get(TREE_ENV)
    if tree:
        config._syncfree_series_tree = install(Path(tree))  # type: ignore[attr-defined]


def install_from_env() -> str | None:
    """In a process that pytest did not start (a spawned rank): install tree mode if :data:`TREE_ENV` is set."""
    tree = os.environ.get(TREE_ENV)
    return install(Path(tree)) if tree else None


def series_module(name: str) -> ModuleType | None:
    """The patched tree's module ``name`` (e.g. ``torchmetrics.utilities.distributed``) in tree mode, else ``None``.

    A module the series adds (``torchmetrics.utilities.deferred``) is loaded under its own name.
    """
    return sys.modules.get(f"{_ALIAS}.{name}") or _added.get(name)


def pytest_report_header(config: pytest.Config) -> str | None:
    info = getattr(config, "_syncfree_series_tree", None)
    return f"tree mode: {info}" if info else None


def _module_name(src: Path, file: Path) -> str:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _changed_files(stock_src: Path, patched_src: Path) -> tuple[list[Path], list[Path]]:
    """(added, changed) ``.py`` files of ``patched_src/torchmetrics`` relative to the stock tree."""
    added, changed = [], []
    for file in sorted((patched_src / "torchmetrics").rglob("*.py")):
        twin = stock_src / file.relative_to(patched_src)
        if not twin.exists():
            added.append(file)
        elif twin.read_bytes() != file.read_bytes():
            changed.append(file)
    return added, changed


def _functions(source: str) -> dict[str, str]:
    """qualname -> AST dump without docstrings, for module-level functions and methods of module-level classes."""

    def dump(node: ast.AST) -> str:
        body = getattr(node, "body", [])
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
        return ast.dump(node)

    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = dump(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = dump(item)
    return found


def changed_functions(stock_source: str, patched_source: str) -> set[str]:
    """Functions and methods the series changes, adds to a class or removes (new module-level helpers excluded)."""
    stock, patched = _functions(stock_source), _functions(patched_source)
    changed = {name for name in stock.keys() & patched.keys() if stock[name] != patched[name]}
    changed |= {name for name in patched.keys() - stock.keys() if "." in name}
    return changed | (stock.keys() - patched.keys())


def _load(file: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _simulate_device(deferred: ModuleType) -> None:
    """While a CPU probe is active, CPU flags take the tree's asynchronous path (see the module docstring)."""
    from torchmetrics_syncfree import probe

    check, drain, flush, reads_are_free = deferred.check, deferred._drain, deferred.flush, deferred.reads_are_free

    def simulated_reads_are_free(tensor: Any) -> bool:  # the layer's _deferred.reads_are_free
        return reads_are_free(tensor) and not probe.simulating_device()

    def simulated_check(metric: Any, flag: Any, action: Any) -> None:
        if flag.device.type == "cpu" and probe.simulating_device():
            deferred._queue(metric, create=True).append((flag.detach().clone(), None, action))
            return
        check(metric, flag, action)

    def quiet_drain(queue: Any, wait: bool) -> None:
        with probe.quiet():  # the host copy: reading it never synchronizes
            drain(queue, wait)

    def simulated_flush(metric: Any) -> None:
        queue = deferred._queue(metric, create=False)
        if queue and probe.simulating_device() and any(event is None for _, event, _ in queue):
            probe.report(probe.HOST_WAIT, "torch.cuda.Event.synchronize")  # on a GPU the newest checks still run
        flush(metric)

    deferred.check, deferred._drain, deferred.flush = simulated_check, quiet_drain, simulated_flush
    deferred.reads_are_free = simulated_reads_are_free


#: Areas of the monkeypatch layer whose upstream patches are not written yet. They are left out of the drift check
#: (and so of tree mode) by name, visibly; remove an entry in the same change that adds its patches to patches/.
AREAS_WITHOUT_PATCHES: dict[str, str] = {}


def series_specs() -> list[Any]:
    """The layer's patch specs that the series must mirror: every area except :data:`AREAS_WITHOUT_PATCHES`."""
    from torchmetrics_syncfree import _registry

    return [spec for spec in _registry._load_areas() if spec.area not in AREAS_WITHOUT_PATCHES]


def drift(stock_src: Path, patched_src: Path, specs: list[Any]) -> tuple[list[str], dict[str, list[Any]]]:
    """Compare the series with the layer: (problems, {changed module name: the layer's specs for it})."""
    _, changed = _changed_files(stock_src, patched_src)
    problems, targets = [], {}
    for file in changed:
        name = _module_name(patched_src, file)
        series_changes = changed_functions((stock_src / file.relative_to(patched_src)).read_text(), file.read_text())
        layer = {s.target.removeprefix(f"{name}."): s for s in specs if s.target.startswith(f"{name}.")}
        problems += [f"the series changes {name}.{q}; the layer does not replace it" for q in series_changes - {*layer}]
        problems += [f"the layer replaces {name}.{q}; the series leaves it as stock" for q in {*layer} - series_changes]
        if series_changes:
            targets[name] = list(layer.values())
    changed_modules = {_module_name(patched_src, f) for f in changed}
    problems += [
        f"the layer replaces {s.target}; the series does not change its module"
        for s in specs
        if not any(s.target.startswith(f"{m}.") for m in changed_modules)
    ]
    return problems, targets


def _link_changed_modules(loaded: dict[str, ModuleType]) -> None:
    """Make the loaded modules call each other's functions, not stock's.

    ``from torchmetrics.functional.classification.stat_scores import _multiclass_stat_scores_update`` at the top of
    the tree's ``classification/stat_scores.py`` binds, while tree mode loads it, the unpatched function (the alias
    modules are not ``sys.modules["torchmetrics..."]``), and ``patch_all()`` only swaps names in ``torchmetrics.*``
    modules. Every such function of a changed module is rebound here to the tree's function of the same name, so the
    tree's update methods run the tree's validation and counting, as they do in the patched tree itself.
    """
    for module in loaded.values():
        for attr, value in list(vars(module).items()):
            source = loaded.get(getattr(value, "__module__", None)) if isinstance(value, FunctionType) else None
            if source is not None and source is not module:
                setattr(module, attr, getattr(source, value.__name__))


def install(tree: Path) -> str:
    """Swap the layer's replacements for the patched tree's functions; raises ``pytest.UsageError`` on drift."""
    import torchmetrics

    stock_src = Path(torchmetrics.__file__).resolve().parents[1]
    patched_src = (tree / "src").resolve()
    if stock_src == patched_src or not (patched_src / "torchmetrics").is_dir():
        raise pytest.UsageError(f"{TREE_ENV}={tree}: needs a patched checkout, with the unpatched one on PYTHONPATH")
    problems, targets = drift(stock_src, patched_src, series_specs())
    if problems:
        raise pytest.UsageError("the patch series and the monkeypatch layer drifted apart:\n  " + "\n  ".join(problems))
    added, _ = _changed_files(stock_src, patched_src)
    for file in added:  # new modules of the series, under their own names
        name = _module_name(patched_src, file)
        module = _load(file, name)
        parent, _, leaf = name.rpartition(".")
        setattr(importlib.import_module(parent), leaf, module)
        _added[name] = module
        if name == "torchmetrics.utilities.deferred":
            _simulate_device(module)
    swapped = []
    loaded = {
        name: _load(patched_src / Path(*name.split(".")).with_suffix(".py"), f"{_ALIAS}.{name}") for name in targets
    }
    for name, module in loaded.items():
        stock = importlib.import_module(name)
        for attr, value in vars(module).items():  # the series' new helpers, for imports from the series' code
            if not hasattr(stock, attr):
                setattr(stock, attr, value)
    _link_changed_modules(loaded)
    for name, specs in targets.items():
        module = loaded[name]
        for spec in specs:
            owner: Any = module
            for part in spec.target.removeprefix(f"{name}.").split("."):
                owner = owner.__dict__[part] if isinstance(owner, type) else getattr(owner, part)
            spec.replacement = owner
            swapped.append(spec.target)
    return f"{len(swapped)} targets from {tree}, stock from {stock_src}"
