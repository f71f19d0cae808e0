"""The patch registry: what is patched, how, and how to undo it.

Every patch is declared once with :func:`replaces` next to its replacement function (one module per upstream
area). :func:`patch_all` validates *all* declared targets against the installed TorchMetrics before it touches
anything, then installs them; a failure half-way rolls back what was installed, so TorchMetrics is never left
half-patched. :func:`unpatch_all` puts every original object back (identity, not a copy).

Two kinds of targets exist:

``attribute``
    A plain attribute of a module or class (a helper function, a method that TorchMetrics looks up on every
    call). Module-level helpers that other TorchMetrics modules imported by name (``from ... import
    _safe_divide``) are replaced in every ``torchmetrics.*`` module that holds the original object, because those
    modules look the name up in their own globals. A module first imported while patched binds the replacement
    itself; :func:`unpatch_all` finds such copies by a scan of the loaded ``torchmetrics.*`` modules and puts the
    original there too.

``setting``
    A configuration value outside TorchMetrics that the patched code needs (:func:`declares_setting`), set while
    patched and put back by :func:`unpatch_all`. A setting declared ``optional`` that the installed torch lacks is
    left alone (feature detection: :func:`unavailable_targets` names it); a required one fails :func:`patch_all`.

``metric_method``
    ``update`` or ``compute`` of a :class:`~torchmetrics.Metric` subclass. ``Metric.__init__`` wraps the *bound*
    method once (``self.update = self._wrap_update(self.update)``), so swapping the class attribute alone would
    not reach metrics that already exist, and would leave metrics created while patched patched forever. The
    class attribute becomes a descriptor instead (see :class:`_MetricUpdate`, :class:`_MetricMethod`): metrics created
    while patched wrap a dispatcher that follows the registry's state, and metrics created before are switched
    to that dispatcher the first time their method is looked up.

While installed, every replacement carries the original's name, docstring and signature (see
:func:`_present_as_original`), so ``help(MeanMetric.update)`` and IDEs show stock's documentation.

"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FunctionType, MethodType, ModuleType
from typing import Any, Literal

from lightning_utilities.core.imports import RequirementCache

#: The TorchMetrics releases this package knows how to patch.
SUPPORTED_TORCHMETRICS = ">=1.6.1,<1.10"
#: Set to ``1`` to patch an unsupported TorchMetrics release anyway (targets and signatures are still checked).
FORCE_ENV_VAR = "TORCHMETRICS_SYNCFREE_FORCE"

_MISSING: Any = object()
#: what ``help()``, IDEs and ``inspect.signature`` read from a function, besides ``__signature__``
_PRESENTED = ("__module__", "__name__", "__qualname__", "__doc__")
_lock = threading.RLock()
_specs: dict[str, PatchSpec] = {}
_area_modules: dict[str, str] = {}
_area_requires: dict[str, tuple[str, ...]] = {}


class UnsupportedVersionError(RuntimeError):
    """The installed TorchMetrics is outside :data:`SUPPORTED_TORCHMETRICS`."""


class PatchTargetError(RuntimeError):
    """A patch target is missing or its signature is not the one the replacement was written for."""


@dataclass
class PatchSpec:
    """One declared replacement.

    Args:
        target: dotted path of the replaced object, e.g. ``torchmetrics.aggregation.MeanMetric.update``.
        replacement: the new function.
        kind: ``"attribute"`` or ``"metric_method"`` (see the module docstring).
        params: expected parameter names of the original, checked before patching; ``None`` skips the check.
        area: the upstream area (module of this package) that declared the patch.
        everywhere: for ``attribute`` patches of module-level functions, also replace every other
            ``torchmetrics.*`` module's reference to the same object.
        optional: for ``setting`` targets, a release that lacks the setting is patched without it.

    """

    target: str
    replacement: Callable[..., Any]
    kind: Literal["attribute", "metric_method", "setting"]
    params: tuple[str, ...] | None
    area: str
    everywhere: bool = False
    optional: bool = False
    active: bool = False
    original: Any = _MISSING
    # (namespace, attribute name, previous value or _MISSING) for every place the patch was written to
    installed_at: list[tuple[Any, str, Any]] = field(default_factory=list)
    # what _install wrote into the owner (the replacement, or the metric-method descriptor) while active
    installed: Any = _MISSING
    # (replacement, its own name, docstring and __signature__) while it presents itself as the original
    own_presentation: tuple[Callable[..., Any], dict[str, Any]] | None = None
    _dispatcher: Callable[..., Any] | None = None

    @property
    def attribute(self) -> str:
        return self.target.rsplit(".", 1)[1]

    def dispatcher(self) -> Callable[..., Any]:
        """A stable function that runs the replacement while the patch is active and the original otherwise."""
        if self._dispatcher is None:
            spec = self

            if self.attribute == "compute":  # compute(self) takes no arguments: skip the packing on the hot path

                @functools.wraps(self.original)
                def dispatch(metric: Any) -> Any:
                    return (spec.replacement if spec.active else spec.original)(metric)

            else:

                @functools.wraps(self.original)
                def dispatch(metric: Any, *args: Any, **kwargs: Any) -> Any:
                    return (spec.replacement if spec.active else spec.original)(metric, *args, **kwargs)

            self._dispatcher = dispatch
        return self._dispatcher


def replaces(
    target: str,
    *,
    params: tuple[str, ...] | None,
    kind: Literal["attribute", "metric_method"] = "attribute",
    everywhere: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the decorated function as the replacement of ``target``.

    Example:
        >>> from torchmetrics_syncfree._registry import replaces
        >>> @replaces("torchmetrics.aggregation.MeanMetric.update", params=("self", "value", "weight"),
        ...           kind="metric_method")  # doctest: +SKIP
        ... def _update(self, value, weight=None): ...

    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        area = _area_of(fn.__module__)
        with _lock:
            if target in _specs and _specs[target].replacement is not fn:
                raise ValueError(f"{target} is already declared by {_specs[target].replacement!r}")
            _specs[target] = PatchSpec(target, fn, kind, params, area, everywhere)
        return fn

    return decorator


def _area_of(module: str) -> str:
    """The registered area whose module is ``module`` or the closest package holding it (else its last name)."""
    holding = [
        (len(area_module), name)
        for name, area_module in _area_modules.items()
        if module == area_module or module.startswith(f"{area_module}.")
    ]
    return max(holding)[1] if holding else module.rsplit(".", 1)[-1]


def declares_setting(target: str, value: Any, area: str, *, optional: bool = False) -> None:
    """Declare that ``area`` needs the module attribute ``target`` set to ``value`` while patched.

    ``optional``: the setting only improves something (e.g. how often ``torch.compile`` recompiles) that releases
    without it do without; :func:`patch_all` then skips it where the installed torch does not have it.

    Example:
        >>> from torchmetrics_syncfree._registry import declares_setting
        >>> declares_setting("torch._dynamo.config.allow_unspec_int_on_nn_module", True, "metric",
        ...                  optional=True)  # doctest: +SKIP

    """
    with _lock:
        if target in _specs and _specs[target].replacement != value:
            raise ValueError(f"{target} is already declared with {_specs[target].replacement!r}")
        _specs[target] = PatchSpec(target, value, "setting", None, area, optional=optional)


def register_area(name: str, module: str, requires: tuple[str, ...] = ()) -> None:
    """Make ``module`` (which declares patches with :func:`replaces`) part of :func:`patch_all`.

    ``requires`` names areas that are patched whenever this one is (e.g. the ``Metric`` life cycle of the deferred
    checks that an area's updates file).
    """
    _area_modules[name] = module
    _area_requires[name] = requires


def _load_areas(areas: Iterator[str] | None = None) -> list[PatchSpec]:
    names = list(_area_modules) if areas is None else list(areas)
    unknown = sorted(set(names) - set(_area_modules))
    if unknown:
        raise ValueError(f"Unknown patch area(s) {unknown}; known: {sorted(_area_modules)}")
    names += [required for name in list(names) for required in _area_requires[name] if required not in names]
    for name in names:
        importlib.import_module(_area_modules[name])
    return [spec for spec in _specs.values() if spec.area in names]


def _resolve(target: str) -> tuple[Any, str]:
    """Return ``(owner, attribute name)`` for a dotted target, importing its module."""
    parts = target.split(".")
    owner: Any = None
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:-1]:
            owner = getattr(owner, name, _MISSING)
            if owner is _MISSING:
                raise PatchTargetError(f"{target}: {'.'.join(parts[: split + 1])} does not exist")
        return owner, parts[-1]
    raise PatchTargetError(f"{target}: no importable module in the path")


def _lookup(owner: Any, name: str) -> Any:
    """The attribute as callers see it (for classes: through the MRO, without invoking descriptors)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in klass.__dict__:
                return klass.__dict__[name]
        return _MISSING
    return getattr(owner, name, _MISSING)


def installed_torchmetrics_version() -> str:
    import torchmetrics

    return torchmetrics.__version__


@functools.cache
def _supported(version: str, supported: str) -> bool:
    """Whether the installed TorchMetrics (``version``: the cache's key) is in the range ``supported``."""
    return bool(RequirementCache(f"torchmetrics{supported}"))


def check_version(force: bool = False) -> None:
    """Raise :class:`UnsupportedVersionError` unless the installed TorchMetrics is supported (or forced)."""
    if force or os.environ.get(FORCE_ENV_VAR, "") not in ("", "0"):
        return
    if not _supported(installed_torchmetrics_version(), SUPPORTED_TORCHMETRICS):
        raise UnsupportedVersionError(
            f"torchmetrics_syncfree supports torchmetrics{SUPPORTED_TORCHMETRICS}, but torchmetrics"
            f" {installed_torchmetrics_version()} is installed. Nothing was patched. To try anyway, call"
            f" patch_all(force=True) or set {FORCE_ENV_VAR}=1 (every target is still checked)."
        )


def _available(spec: PatchSpec) -> bool:
    """Whether the installed releases have the target of an optional setting (every other target: True)."""
    if not spec.optional:
        return True
    try:
        owner, name = _resolve(spec.target)
    except PatchTargetError:
        return False
    return hasattr(owner, name)


#: the signatures of plain functions, by function: every ``patch_all()`` validates and relabels the same stock
#: functions, and :func:`inspect.signature` was half of a ``patched()`` block's time (paid by every test that patches)
_signatures: weakref.WeakKeyDictionary[FunctionType, inspect.Signature] = weakref.WeakKeyDictionary()


def _signature(obj: Any) -> inspect.Signature:
    """``inspect.signature(obj)``, kept for a plain function whose signature nothing overrides."""
    if not isinstance(obj, FunctionType) or "__signature__" in obj.__dict__ or "__wrapped__" in obj.__dict__:
        return inspect.signature(obj)
    known = _signatures.get(obj)
    if known is None:
        known = _signatures[obj] = inspect.signature(obj)
    return known


def _validate(spec: PatchSpec) -> Any:
    """Check that the target exists with the expected signature and return its current value."""
    owner, name = _resolve(spec.target)
    if spec.kind == "setting":
        if not hasattr(owner, name):
            raise PatchTargetError(f"{spec.target} does not exist (torch {_torch_version()})")
        return getattr(owner, name)
    current = _lookup(owner, name)
    if current is _MISSING:
        raise PatchTargetError(f"{spec.target} does not exist in torchmetrics {installed_torchmetrics_version()}")
    if spec.params is not None:
        found = tuple(_signature(current).parameters)
        if found != spec.params:
            raise PatchTargetError(
                f"{spec.target} has parameters {found} in torchmetrics {installed_torchmetrics_version()},"
                f" the replacement was written for {spec.params}"
            )
    if spec.kind == "metric_method":
        _check_metric_wrapper(name)
    return current


def _check_metric_wrapper(name: str) -> None:
    """``Metric._wrap_update``/``_wrap_compute`` must close over the bound method we re-point (see the descriptor)."""
    from torchmetrics import Metric

    factory = getattr(Metric, f"_wrap_{name}", None)
    inner = [c for c in getattr(getattr(factory, "__code__", None), "co_consts", ()) if inspect.iscode(c)]
    if not inner or name not in inner[0].co_freevars:
        raise PatchTargetError(f"torchmetrics.Metric._wrap_{name} no longer wraps a closure over `{name}`")


class _MetricMethod:
    """Class attribute standing in for a metric class's ``compute`` while the patch is active (a non-data descriptor).

    * During ``Metric.__init__``/``__setstate__`` (nothing wrapped yet) it hands out the registry dispatcher, which
      the metric then wraps with its own ``_wrap_compute`` as usual; afterwards the instance attribute is found first,
      so calls cost nothing extra.
    * ``super().compute()`` from a subclass that overrides the method gets the plain bound replacement, because the
      subclass's own wrapper already did the bookkeeping.
    * A metric created before :func:`patch_all` keeps its wrapper around the bound *original* until it is adopted
      (see :meth:`adopt`): its ``update`` (a :class:`_MetricUpdate`) adopts it on first access. Before that, the
      original runs, which is right: only a patched ``update`` queues checks for ``compute`` to report.

    """

    def __init__(self, spec: PatchSpec) -> None:
        self.spec = spec
        self.name = spec.attribute
        self.dispatcher = spec.dispatcher()
        self._reaches_directly: dict[type, bool] = {}
        functools.update_wrapper(self, spec.original)  # type: ignore[arg-type]

    def __get__(self, metric: Any, owner: type | None = None) -> Any:
        if metric is None:
            return self.spec.replacement
        wrapper = metric.__dict__.get(self.name)
        try:  # attribute reads, not ``getattr`` with defaults: this runs at every ``metric.update`` of every metric
            if wrapper.__wrapped__.__func__ is self.dispatcher:
                return wrapper  # a metric created (or already adopted) while patched
        except AttributeError:
            pass
        cls = type(metric)
        direct = self._reaches_directly.get(cls)
        if direct is None:
            direct = self._reaches_directly[cls] = _lookup(cls, self.name) is self
        if not direct:
            return MethodType(self.spec.replacement, metric)
        if wrapper is None:
            return MethodType(self.dispatcher, metric)
        adopt(metric)
        return wrapper

    def adopt(self, metric: Any) -> None:
        """Point the wrapper a metric made before patching at the dispatcher: it then behaves as if made now."""
        wrapper = metric.__dict__.get(self.name)
        cells = getattr(wrapper, "__closure__", None)
        if not cells:
            return
        for var, cell in zip(wrapper.__code__.co_freevars, cells):
            if var != self.name:
                continue
            bound = cell.cell_contents
            if getattr(bound, "__self__", None) is metric and getattr(bound, "__func__", None) is self.spec.original:
                cell.cell_contents = MethodType(self.dispatcher, metric)
                wrapper.__wrapped__ = cell.cell_contents
            return


class _MetricUpdate(_MetricMethod):
    """The ``update`` stand-in: a *data* descriptor, so it also sees metrics created before :func:`patch_all`.

    A data descriptor wins over the instance ``__dict__``: every access passes :meth:`__get__`, whose hot path returns
    the instance's wrapper after one identity check. A metric made before patching is adopted on first access, its
    ``compute`` with it.
    """

    def __set__(self, metric: Any, value: Any) -> None:
        metric.__dict__[self.name] = value

    def __delete__(self, metric: Any) -> None:
        del metric.__dict__[self.name]


def adopt(metric: Any) -> None:
    """Adopt every patched ``update``/``compute`` wrapper of a metric created before :func:`patch_all`."""
    cls = type(metric)
    for name in ("update", "compute"):
        stand_in = _lookup(cls, name)
        if isinstance(stand_in, _MetricMethod):
            stand_in.adopt(metric)


def _torch_version() -> str:
    import torch

    return torch.__version__


def _install(spec: PatchSpec, original: Any, bindings: _Bindings) -> None:
    """Install ``spec`` in place of ``original``; ``bindings``: :func:`_module_bindings` of the originals."""
    owner, name = _resolve(spec.target)
    spec.original = original
    _stock_objects[spec.target] = original
    spec.installed_at = []
    if spec.kind == "setting":
        spec.installed_at.append((owner, name, original))
        setattr(owner, name, spec.replacement)
        spec.active = True
        return
    if spec.kind == "metric_method":
        if not isinstance(owner, type):
            raise PatchTargetError(f"{spec.target}: metric_method targets must be class attributes")
        places = [(owner, name)]
        new_value: Any = (_MetricUpdate if name == "update" else _MetricMethod)(spec)
    else:
        places = [(owner, name)]
        if spec.everywhere:
            found = bindings.get(id(original), [])
            places += [(module, attr) for module, attr in found if module is not owner]
        new_value = spec.replacement
    for namespace, attr in places:
        previous = namespace.__dict__.get(attr, _MISSING) if isinstance(namespace, type) else vars(namespace)[attr]
        spec.installed_at.append((namespace, attr, previous))
        setattr(namespace, attr, new_value)
    spec.installed = new_value
    _present_as_original(spec)
    spec.active = True


def _present_as_original(spec: PatchSpec) -> None:
    """Give the installed replacement the original's name, docstring and signature, as ``functools.wraps`` would.

    ``help()``, IDEs and :func:`inspect.signature` then show stock's documentation while TorchMetrics is patched.
    The replacement itself is relabelled rather than wrapped: a wrapper would add a call to every update, and the
    layer relies on finding its own function object installed (e.g. to tell a subclass's override from the
    patch). The signature goes into ``__signature__``, not ``__wrapped__``: :func:`inspect.getsource` follows
    ``__wrapped__`` and would show stock code that does not run. :func:`_uninstall` gives the replacement its own
    labels back.
    """
    replacement, original = spec.replacement, spec.original
    if not isinstance(replacement, FunctionType) or not isinstance(original, FunctionType):
        return
    own = {attr: getattr(replacement, attr) for attr in _PRESENTED}
    own["__signature__"] = replacement.__dict__.get("__signature__", _MISSING)
    signature = _signature(original)
    for attr in _PRESENTED:
        setattr(replacement, attr, getattr(original, attr))
    replacement.__signature__ = signature  # type: ignore[attr-defined]
    spec.own_presentation = replacement, own


def _present_as_itself(spec: PatchSpec) -> None:
    presented, spec.own_presentation = spec.own_presentation, None
    if presented is None:
        return
    replacement, own = presented
    for attr, value in own.items():
        if value is _MISSING:
            delattr(replacement, attr)
        else:
            setattr(replacement, attr, value)


def _copies_made_by_later_imports(spec: PatchSpec, bindings: _Bindings) -> list[tuple[Any, str, Any]]:
    """Places outside :attr:`PatchSpec.installed_at` that hold the installed replacement of an ``everywhere`` spec.

    A TorchMetrics module first imported while patched runs ``from torchmetrics.utilities.compute import
    _safe_divide`` against the patched module and binds the replacement in its own globals; :func:`patch_all` never
    wrote there, so only a scan at unpatch time finds it. The original is what such a module would hold had it been
    imported while TorchMetrics was stock.
    """
    recorded = {(id(namespace), attr) for namespace, attr, _ in spec.installed_at}
    found = bindings.get(id(spec.installed), [])
    return [(module, attr, spec.original) for module, attr in found if (id(module), attr) not in recorded]


def _uninstall(spec: PatchSpec, bindings: _Bindings) -> None:
    """Restore what ``spec`` replaced; ``bindings``: :func:`_module_bindings` of the installed objects."""
    if spec.everywhere:
        spec.installed_at += _copies_made_by_later_imports(spec, bindings)
    for namespace, attr, previous in reversed(spec.installed_at):
        if spec.kind == "setting":
            setattr(namespace, attr, previous)
        elif previous is _MISSING:
            delattr(namespace, attr)
        else:
            setattr(namespace, attr, previous)
    _present_as_itself(spec)
    spec.installed_at = []
    spec.installed = _MISSING
    spec.active = False


def _torchmetrics_modules() -> list[ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if isinstance(module, ModuleType) and (name == "torchmetrics" or name.startswith("torchmetrics."))
    ]


#: ``id(object)`` -> the (module, global name) pairs that bind it
_Bindings = dict[int, list[tuple[ModuleType, str]]]


def _module_bindings(objects: Iterable[Any]) -> _Bindings:
    """Where ``objects`` are bound in the globals of the loaded TorchMetrics modules, in one scan of them all.

    ``patch_all``/``unpatch_all`` look up every ``everywhere`` spec's function at once: one scan per spec cost
    ~2 ms each (~50 ms a ``patched()`` block, paid by every test that patches).
    """
    wanted = {id(obj) for obj in objects}
    found: _Bindings = {}
    if not wanted:
        return found
    for module in _torchmetrics_modules():
        for attr, value in list(vars(module).items()):
            if id(value) in wanted:
                found.setdefault(id(value), []).append((module, attr))
    return found


def _uninstall_all(specs: Iterable[PatchSpec]) -> None:
    """Uninstall ``specs`` in the given order, with one scan of the modules for the ``everywhere`` ones."""
    specs = list(specs)
    bindings = _module_bindings(spec.installed for spec in specs if spec.everywhere)
    for spec in specs:
        _uninstall(spec, bindings)


def patch_all(*, areas: list[str] | None = None, force: bool = False, verbose: bool = False) -> list[str]:
    """Patch TorchMetrics in place so that metric updates never synchronize host and device.

    Idempotent and thread-safe. Every target is validated before anything is changed; if installing fails
    part-way, what was installed is rolled back and the error is raised.

    Args:
        areas: restrict to these upstream areas (default: all), e.g. ``["aggregation"]``.
        force: patch even if the installed TorchMetrics is outside :data:`SUPPORTED_TORCHMETRICS`.
        verbose: print the patched targets.

    Returns:
        The dotted names of the targets that are patched after the call, sorted.

    Raises:
        UnsupportedVersionError: the installed TorchMetrics release is not supported (and not forced).
        PatchTargetError: a target is missing or has an unexpected signature.

    Example:
        >>> import torchmetrics_syncfree
        >>> patched = torchmetrics_syncfree.patch_all()
        >>> "torchmetrics.aggregation.MeanMetric.update" in patched
        True
        >>> torchmetrics_syncfree.unpatch_all()

    """
    with _lock:
        check_version(force)
        specs = _load_areas(areas)
        pending = [(spec, _validate(spec)) for spec in specs if not spec.active and _available(spec)]
        done: list[PatchSpec] = []
        bindings = _module_bindings(original for spec, original in pending if spec.everywhere)
        try:
            for spec, original in pending:
                _install(spec, original, bindings)
                done.append(spec)
        except BaseException:
            _uninstall_all(reversed(done))
            raise
        result = sorted(spec.target for spec in specs if spec.active)
    if verbose:
        print(f"torchmetrics_syncfree patched {len(result)} targets:")
        for target in result:
            print(f"  {target}")
    return result


def unpatch_all() -> list[str]:
    """Restore every patched target to its original object; returns the targets that were restored."""
    with _lock:
        active = [spec for spec in _specs.values() if spec.active]
        _uninstall_all(reversed(active))
        return sorted(spec.target for spec in active)


@contextmanager
def patched(**kwargs: Any) -> Iterator[list[str]]:
    """Context manager: patch on entry, and on exit undo only what this block patched.

    Example:
        >>> import torchmetrics, torchmetrics_syncfree
        >>> with torchmetrics_syncfree.patched():
        ...     torchmetrics_syncfree.is_patched("torchmetrics.aggregation.MeanMetric.update")
        True
        >>> torchmetrics_syncfree.is_patched("torchmetrics.aggregation.MeanMetric.update")
        False

    """
    with _lock:
        before = {spec.target for spec in _specs.values() if spec.active}
        result = patch_all(**kwargs)
    try:
        yield result
    finally:
        with _lock:
            ours = [spec for spec in _specs.values() if spec.active and spec.target not in before]
            _uninstall_all(reversed(ours))


def _spec(target: str) -> PatchSpec:
    _load_areas()
    try:
        return _specs[target]
    except KeyError:
        raise KeyError(f"{target} is not a torchmetrics_syncfree patch target; see declared_targets()") from None


def is_patched(target: str) -> bool:
    """Whether ``target`` (a dotted name from :func:`declared_targets`) is currently patched."""
    return _spec(target).active


class _StockObjects(dict):
    """Stock's object behind each declared target: filled when a target is patched, and at its first look-up otherwise.

    A plain dict look-up on every hit (``dict.__getitem__``, no Python call: host time on every ``forward``), which
    traced code (a compiled ``forward``'s ``reset()``) follows without imports or registry work.
    """

    def __missing__(self, target: str) -> Any:
        found = self[target] = get_original(target)
        return found


_stock_objects = _StockObjects()

#: ``stock(target)``: the original TorchMetrics object behind the patch target ``target``, the one accessor the areas
#: call (e.g. ``stock("torchmetrics.metric.Metric.reset") is torchmetrics.Metric.reset``).
stock = _stock_objects.__getitem__


def get_original(target: str) -> Any:
    """The original TorchMetrics object behind ``target``, whether or not it is patched right now."""
    spec = _spec(target)
    if spec.active:
        return spec.original
    owner, name = _resolve(target)
    return getattr(owner, name) if spec.kind == "setting" else _lookup(owner, name)


def unavailable_targets() -> list[str]:
    """The optional targets (settings) that the installed releases lack: :func:`patch_all` leaves them out.

    Example:
        >>> import torchmetrics_syncfree
        >>> isinstance(torchmetrics_syncfree.unavailable_targets(), list)
        True

    """
    with _lock:
        return sorted(spec.target for spec in _load_areas() if not _available(spec))


def patched_targets() -> list[str]:
    """The targets that are patched right now (empty when TorchMetrics is stock)."""
    with _lock:
        return sorted(spec.target for spec in _specs.values() if spec.active)


def registered_areas() -> list[str]:
    """The upstream areas :func:`patch_all` knows, e.g. ``["aggregation", "classification", "distributed"]``."""
    return sorted(_area_modules)


def declared_targets() -> list[str]:
    """Every target this package knows how to patch."""
    _load_areas()
    return sorted(_specs)
