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
``torchmetrics.utilities.distributed._sync_on_backend`` when it runs; ``classification/confusion_matrix.py`` imports
new helpers of ``functional/classification/confusion_matrix.py`` at its top, see :func:`_load_changed`), and
unpatched code never looks them up.
The changed modules are loaded under an alias, so a function one of them imports from another changed module (the
tree's ``MulticlassStatScores.update`` calls ``_multiclass_stat_scores_tensor_validation``) would be the unpatched
one; such names are rebound to the tree's functions (:func:`_link_changed_modules`).

Spawned processes (the DDP suites' ranks) do not run pytest's hooks: they call :func:`install_from_env` before
patching, or they would test the layer instead of the series. :func:`series_module` gives the suites the patched
tree's module of a target, for what they inspect beyond the targets (the DDP fallback's cache, its mode).

The series' ``torchmetrics.utilities.deferred`` reads CPU flags at once (free on CPU). While a CPU ``SyncProbe`` is
active, or the device path is forced, the layer's ``_deferred`` takes the accelerator path instead, so that the probe
sees what a GPU run does; the same is arranged here (:func:`_simulate_device`): the tree's ``reads_are_free`` answers
like the layer's, its host copies arrive after the layer's simulated delay and are read quietly. The tree's
counters, sweeps, reports and consumption are what run.

"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import pytest

TREE_ENV = "TORCHMETRICS_SYNCFREE_SERIES_TREE"
_ALIAS = "_syncfree_series"
#: the modules the series adds, by name, once tree mode is installed
_added: dict[str, ModuleType] = {}


def in_tree_mode() -> bool:
    """Whether the suites run against the series' tree (:data:`TREE_ENV` set) instead of the layer."""
    return bool(os.environ.get(TREE_ENV))


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
    """Functions and methods the series changes, adds to a class or removes.

    New module-level helpers are excluded: functions, and classes the stock module does not define (with their
    methods; the series' ``retrieval/base.py`` ranks the queries with a helper class).
    """
    stock, patched = _functions(stock_source), _functions(patched_source)
    stock_classes = {node.name for node in ast.parse(stock_source).body if isinstance(node, ast.ClassDef)}
    changed = {name for name in stock.keys() & patched.keys() if stock[name] != patched[name]}
    changed |= {name for name in patched.keys() - stock.keys() if name.partition(".")[0] in stock_classes}
    return changed | (stock.keys() - patched.keys())


def _load(file: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _simulate_device(deferred: ModuleType) -> None:
    """Give the tree's ``deferred`` the layer's simulated device (see the module docstring).

    While a CPU probe is active or the device path is forced (``--syncfree-device-path``), CPU tensors take the tree's
    accelerator path: ``reads_are_free`` answers false, the host copy of a sweep arrives after the layer's
    :func:`~torchmetrics_syncfree._instrumentation.simulated_copy_delay` (read quietly: on a GPU it is pinned memory
    read after its event), and a read by ``compute``/``reset`` that finds pending counts is the host wait it is on a
    GPU. The tree's counting, reporting and consumption are what run.
    """
    from torchmetrics_syncfree import _deferred as layer
    from torchmetrics_syncfree import _instrumentation, probe

    reads_are_free, sweep, take_pending = deferred.reads_are_free, deferred.sweep, deferred.take_pending
    add_checks = deferred.add_checks
    reader_class = deferred._Reader
    launch, take = reader_class.launch, reader_class.take

    def simulated_reads_are_free(tensor: Any) -> bool:  # the layer's _deferred.reads_are_free
        return reads_are_free(tensor) and not _instrumentation.simulating_device()

    def reader_of(metric: Any) -> Any:
        checks = metric.__dict__.get(deferred.CHECKS)
        return None if checks is None else checks.reader

    def aging_sweep(metric: Any) -> None:
        if deferred._quiet_time(metric):  # the tree's sweep does nothing there; and while dynamo traces, a look at the
            sweep(metric)  # reader would guard on it
            return
        reader = reader_of(metric)
        if reader is not None and reader.in_flight:
            reader.age += 1
        hooks = _instrumentation.hooks  # the tests' interval (``_instrumentation.copy_interval``)
        interval = None if hooks is None else hooks.copy_interval
        deferred.COPY_INTERVAL = layer.COPY_INTERVAL if interval is None else interval
        sweep(metric)
        reader, counters = reader_of(metric), metric.__dict__.get(deferred.STATE)
        if reader is not None and reader.event is None and not reader.in_flight and counters is not None:
            layer.mark_zero(counters)  # launched and taken at once: consumed (the layer keeps the same account)

    def zero_add_checks(metric: Any, *args: Any, **kwargs: Any) -> None:
        add_checks(metric, *args, **kwargs)
        layer.mark_zero(metric.__dict__[deferred.STATE])

    def timed_launch(self: Any, counters: Any) -> None:
        launch(self, counters)
        self.age = 0

    def simulated_ready(self: Any) -> bool:
        if self.event is None:
            hooks = _instrumentation.hooks
            delay = 0 if hooks is None else hooks.copy_delay
            return delay is not None and getattr(self, "age", 0) >= delay
        return self.event.query()

    def quiet_take(self: Any, counters: Any) -> Any:
        with probe.quiet():  # the host copy: reading it never synchronizes
            return take(self, counters)

    def waiting_take_pending(metric: Any) -> Any:
        if deferred._quiet_time(metric):  # tracing or inside forward: the tree's take_pending reads nothing, and the
            return take_pending(metric)  # account below would guard on the counters' version while tracing
        # the layer's account of counters known to be zero decides, as in the layer, whether the read is a wait
        counters = metric.__dict__.get(deferred.STATE)
        read = counters is not None and bool(deferred.kinds_of(metric)) and not layer._surely_zero(counters)
        with probe.quiet():
            counts = take_pending(metric)
        if read and probe.simulating_device() and not deferred._quiet_time(metric):
            probe.report(probe.HOST_WAIT, "Tensor.tolist")  # on a GPU this read waits for the queued work
        if counters is not None:
            layer.mark_zero(counters)
        return counts

    def waiting_take_pending_many(metrics: Any) -> Any:  # as ``waiting_take_pending``: one wait per device read
        read = {
            counters.device
            for counters, metric in ((m.__dict__.get(deferred.STATE), m) for m in metrics)
            if counters is not None
            and deferred.kinds_of(metric)
            and not deferred._quiet_time(metric)
            and not layer._surely_zero(counters)
        }
        with probe.quiet():
            taken = take_pending_many(metrics)
        if probe.simulating_device():
            for _ in read:
                probe.report(probe.HOST_WAIT, "Tensor.tolist")
        for metric in metrics:
            counters = metric.__dict__.get(deferred.STATE)
            if counters is not None and not deferred._quiet_time(metric):
                layer.mark_zero(counters)
        return taken

    take_pending_many = getattr(deferred, "take_pending_many", None)
    if take_pending_many is not None:
        deferred.take_pending_many = waiting_take_pending_many
    deferred.reads_are_free, deferred.sweep, deferred.take_pending, deferred.add_checks = (
        simulated_reads_are_free,
        aging_sweep,
        waiting_take_pending,
        zero_add_checks,
    )
    reader_class.launch, reader_class.ready, reader_class.take = timed_launch, simulated_ready, quiet_take


#: Areas of the monkeypatch layer whose upstream patches are not written yet. They are left out of the drift check
#: (and so of tree mode) by name, visibly; remove an entry in the same change that adds its patches to patches/.
AREAS_WITHOUT_PATCHES: dict[str, str] = {}


#: Targets the layer replaces only for older releases: upstream master (what the series is made against) already has
#: the fix. Left out of the drift check by name, with the reason.
LAYER_ONLY_TARGETS: dict[str, str] = {
    "torchmetrics.utilities.compute._safe_divide": "1.6-1.8 copy `zero_division` host-to-device; master and 1.9 use"
    ' `torch.full`, and no stat-score metric passes "warn"',
    "torchmetrics.regression.pearson.PearsonCorrCoef.update": "1.6 and 1.7.1 read the prior count in the update"
    " (`num_prior.mean() > 0`); master and 1.9 (1.7.4+) update without reads",
    "torchmetrics.functional.image.psnrb._psnrb_compute": "1.6 and 1.7 pick the result's dtype with"
    " `if data_range > 2` (a read); master and 1.8+ compute without it",
}


def series_specs() -> list[Any]:
    """The layer's patch specs that the series must mirror: every area except :data:`AREAS_WITHOUT_PATCHES`."""
    from torchmetrics_syncfree import _registry

    return [
        spec
        for spec in _registry._load_areas()
        # settings (e.g. of torch.compile) are the layer's own
        if spec.area not in AREAS_WITHOUT_PATCHES and spec.kind != "setting" and spec.target not in LAYER_ONLY_TARGETS
    ]


def drift(stock_src: Path, patched_src: Path, specs: list[Any]) -> tuple[list[str], dict[str, list[Any]]]:
    """Compare the series with the layer: (problems, {changed module name: the layer's specs for it})."""
    _, changed = _changed_files(stock_src, patched_src)
    problems, targets = [], {}
    for file in changed:
        name = _module_name(patched_src, file)
        stock_source, patched_source = (stock_src / file.relative_to(patched_src)).read_text(), file.read_text()
        series_changes = changed_functions(stock_source, patched_source)
        layer = {s.target.removeprefix(f"{name}."): s for s in specs if s.target.startswith(f"{name}.")}
        problems += [f"the series changes {name}.{q}; the layer does not replace it" for q in series_changes - {*layer}]
        problems += [f"the layer replaces {name}.{q}; the series leaves it as stock" for q in {*layer} - series_changes]
        # a module that only gains helpers (``functional/classification/auroc.py``) is loaded too: its helpers are
        # what the tree's changed methods call
        if series_changes or _functions(patched_source).keys() - _functions(stock_source).keys():
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


def _load_changed(patched_src: Path, names: list[str], added: dict[str, Path] | None = None) -> dict[str, ModuleType]:
    """Load the changed modules ``names`` of the patched tree under :data:`_ALIAS`, in the order of ``names``.

    The module-level names a changed module adds (its new helpers) are set on the unpatched module of its name as soon
    as it is loaded, for imports from the series' code. A changed module may import another's new helpers at its top
    (``from torchmetrics.functional.classification.stat_scores import _count``): if its import fails because they
    are not there yet, it is loaded again once the others are.

    The modules the series adds (``added``: name -> file) are loaded first, under their own names
    (:func:`_install_added`), in the same loop: an added module may import another (``utilities/deferred.py`` imports
    ``utilities/states.py``, which sorts after it) or a changed module's new helper, and most changed modules import
    ``torchmetrics.utilities.deferred``.
    """
    loaded: dict[str, ModuleType] = {}
    files = {name: (file, True) for name, file in (added or {}).items()}
    files.update({name: (patched_src / Path(*name.split(".")).with_suffix(".py"), False) for name in names})
    pending = list(files)
    while pending:
        failed: list[tuple[str, ImportError]] = []
        for name in pending:
            file, is_added = files[name]
            alias = name if is_added else f"{_ALIAS}.{name}"
            try:
                module = _load(file, alias)
            except ImportError as err:
                sys.modules.pop(alias, None)
                failed.append((name, err))
                continue
            if is_added:
                _install_added(name, module)
                continue
            loaded[name] = module
            stock = importlib.import_module(name)
            for attr, value in vars(module).items():
                if not hasattr(stock, attr):
                    setattr(stock, attr, value)
        if len(failed) == len(pending):  # no progress: a real import error
            raise failed[0][1]
        pending = [name for name, _ in failed]
    return {name: loaded[name] for name in names}


def _install_added(name: str, module: ModuleType) -> None:
    """Make ``module``, which the series adds, importable as ``name`` (its parent's attribute too)."""
    parent, _, leaf = name.rpartition(".")
    setattr(importlib.import_module(parent), leaf, module)
    _added[name] = module
    if name == "torchmetrics.utilities.deferred":
        _simulate_device(module)


def _with_stock_class(function: Any, target: str) -> Any:
    """``function`` with its ``__class__`` cell (zero-argument ``super()``) pointing at the stock class of ``target``.

    The tree's methods are defined in the tree's classes; installed into the stock classes, ``super()`` must see the
    stock class, or it raises ``TypeError`` for the stock instances.
    """
    if not isinstance(function, FunctionType) or "__class__" not in function.__code__.co_freevars:
        return function
    module_name, class_name, _ = target.rsplit(".", 2)
    stock_class = getattr(importlib.import_module(module_name), class_name)
    cells = tuple(
        types.CellType(stock_class) if var == "__class__" else cell
        for var, cell in zip(function.__code__.co_freevars, function.__closure__)
    )
    rebound = FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__, cells)
    rebound.__kwdefaults__, rebound.__dict__ = function.__kwdefaults__, dict(function.__dict__)
    rebound.__qualname__, rebound.__doc__ = function.__qualname__, function.__doc__
    return rebound


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
    added, changed = _changed_files(stock_src, patched_src)
    swapped = []
    # changed modules without targets only add names (``utilities/imports.py``'s compatibility shim): loaded too, so
    # that those names reach the unpatched modules the series' code imports them from
    helpers = [_module_name(patched_src, file) for file in changed if file.name != "__init__.py"]
    helpers = [name for name in helpers if name not in targets]
    # new modules of the series under their own names, with the changed ones
    loaded = _load_changed(patched_src, [*targets, *helpers], {_module_name(patched_src, file): file for file in added})
    _link_changed_modules(loaded)
    for name, specs in targets.items():
        module = loaded[name]
        for spec in specs:
            owner: Any = module
            for part in spec.target.removeprefix(f"{name}.").split("."):
                owner = owner.__dict__[part] if isinstance(owner, type) else getattr(owner, part)
            spec.replacement = _with_stock_class(owner, spec.target)
            swapped.append(spec.target)
    for name, module in loaded.items():  # the tree's functions check isinstance against the stock classes
        stock = importlib.import_module(name)
        for attr, value in list(vars(module).items()):
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and isinstance(getattr(stock, attr, None), type)
            ):
                setattr(module, attr, getattr(stock, attr))
    return f"{len(swapped)} targets from {tree}, stock from {stock_src}"
