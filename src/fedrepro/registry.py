"""The one catalogue of everything a configuration may name, filled by decorators beside the code.

Every pluggable piece registers itself where it is defined, the way timm's ``@register_model`` does,
together with what the configuration may say about it:

==================  ==========================================  ==========================================
registry            decorator / call (where)                    what it stores
==================  ==========================================  ==========================================
``METHODS``         ``@register_method(name, params=...)``      the FL algorithm class + its params schema
                    (fedrepro/methods/*.py)
``MODELS``          ``@register_model(name, input=..., ...)``   the model family class + its schema, what it
                    (fedrepro/models/*.py)                      trains on, its decode specs and weights
``DATASETS``        ``register_dataset(DatasetSpec(...))``      a dataset's sources, classes, preparer
                    (fedrepro/data/datasets/*.py)
``PREPARERS``       ``@preparer(name)``                         raw layout -> manifest functions
``SPLITTERS``       ``@splitter(name)``                         partition functions (data/partition.py,
                                                                data/splitters/*.py)
``BUILDERS``        ``@builder(name)``                          offline demo-data builders (data/demo.py)
``TABLE_KINDS``     ``@register_table_kind(name, inputs=...)``  table builders + the files their rule reads
``FIGURE_KINDS``    ``@register_figure_kind(name, inputs=..., reads=...)`` figure drawers + the files their rule reads
``EXTRACTORS``      ``@register_extractor(figure kind)``        what the ``embed`` rule extracts from a
                    (fedrepro/embed.py)                         trained model for such a figure
``WEIGHT_SOURCES``  ``@register_weight_source(kind)``           where pretrained weights of one kind come
                    (fedrepro/models/weight_sources.py)         from (open_clip tag, timm hub, HF repository)
==================  ==========================================  ==========================================

A registry imports the modules of its packages the first time it is asked (``fedrepro.methods``,
...), so a new module registers itself by existing. The configuration's validation schema for
methods and model families is generated from ``METHODS`` and ``MODELS`` (:func:`object_schema`);
``workflow/schemas`` keeps only the shape of the config files.

**Plug-ins** register with the same decorators from outside the package (docs/plugins.md). After its built-in
modules, a registry imports every plug-in once per process: the entry points of the group ``fedrepro.plugins`` of
the installed distributions (Python's convention for plug-ins; an entry point names a module, whose import
registers, or a function, which is called) and the modules named in ``FEDREPRO_PLUGINS`` (comma-separated; the
workflow sets it for its jobs from the configuration's ``plugins:``, which :func:`load_plugins` imports as well).
Every entry remembers where it came from (``Entry.origin``: None for built-ins). A plug-in that fails to import, or
that registers a name a built-in or another plug-in already has, is a :class:`PluginError` naming both: nothing
built in is ever replaced.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import pkgutil
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

ENTRY_POINT_GROUP = "fedrepro.plugins"
PLUGINS_ENV = "FEDREPRO_PLUGINS"        # comma-separated plug-in modules (the workflow sets it from `plugins:`)
DATASETS_ENV = "FEDREPRO_DATASETS"      # JSON of the configuration's folder datasets (``datasets:``), for jobs


class PluginError(ValueError):
    """A plug-in that cannot be imported, or that registers a name already taken: the message names the plug-in,
    the name and what has it."""


def did_you_mean(value: Any, allowed, n: int = 1) -> str:
    """`` (did you mean 'x'?)`` for the allowed name closest to ``value`` (up to ``n`` of them), or ``""``: the one
    suggestion every message about an unknown name gives (configuration keys and values, registries, command-line
    names and targets)."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(a) for a in allowed], n=n)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


class UnknownName(KeyError, ValueError):
    """A name that is not among those allowed (a dataset, method, paper, setting, table, ...): one line that
    says so, suggests the closest and lists the rest. A KeyError (a failed lookup) and a ValueError (a bad
    value given by the user), so callers that expect either still catch it."""

    def __str__(self) -> str:          # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def check_name(kind: str, name: Any, known, where: str = "", hint: str = "") -> None:
    """Raise :class:`UnknownName` unless ``name`` is one of ``known``, e.g. "unknown dataset 'isic2018' (did
    you mean 'isic2019'?); known: [...]". ``where`` says whose names ``known`` are ("in paper facmic"), ``hint``
    what else to check (after the list)."""
    if name not in known:
        scope = f" {where}" if where else ""
        raise UnknownName(f"unknown {kind} {name!r}{scope}{did_you_mean(name, known)}; known: {sorted(map(str, known))}"
                          + (f" {hint}" if hint else ""))


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    info: dict = field(default_factory=dict)
    origin: str | None = None       # the plug-in that registered it (its top-level module); None: built in

    def __getitem__(self, key: str) -> Any:
        return self.info[key]

    def describe(self) -> str:
        """Where the entry comes from, for messages: a plug-in (and its distribution) or the built-in module."""
        if self.origin is None:
            return f"the built-in {self.obj.__module__}" if callable(self.obj) else "fedrepro itself (built in)"
        return f"plug-in {describe_plugin(self.origin)}"


# the plug-in being imported right now (:func:`load_plugins`), or None while built-in modules load
_ORIGIN: list[str | None] = []


@contextlib.contextmanager
def _registering_as(origin: str | None):
    _ORIGIN.append(origin)
    try:
        yield
    finally:
        _ORIGIN.pop()


def _origin_of(obj: Any) -> str | None:
    """Who registers ``obj``: for a class or function, the top-level package of the module that defines it (None
    for fedrepro's own, also when a plug-in's import is what imports them); for anything else (a dataset's
    declaration), the plug-in being imported."""
    if callable(obj):
        module = getattr(obj, "__module__", None) or "fedrepro"
        return None if module == "fedrepro" or module.startswith(("fedrepro.", "__main__")) else module.split(".")[0]
    return _ORIGIN[-1] if _ORIGIN else None


class Registry:
    """``name -> Entry`` for one kind of plugin, filled by importing ``packages`` on first use."""

    def __init__(self, kind: str, packages: tuple[str, ...]):
        self.kind, self.packages = kind, packages
        self._entries: dict[str, Entry] = {}
        self._loaded = False
        REGISTRIES.append(self)

    def register(self, name: str, **info) -> Callable:
        """Decorator: ``@REGISTRY.register(name, **info)`` above a class or function."""
        def decorate(obj):
            self.add(name, obj, **info)
            return obj
        return decorate

    def add(self, name: str, obj: Any, origin: str | None = None, **info) -> Any:
        """Register ``obj`` as ``name``; ``origin``: the plug-in it comes from (default: who is registering, see
        :func:`_origin_of`). A plug-in's entry is added after the built-ins (loaded first), so that a name it shares
        with one is refused here, naming both; registering the same object (or an equal one from the same
        plug-in, e.g. a dataset declared again) again changes nothing."""
        origin = origin if origin is not None else _origin_of(obj)
        if origin is not None:
            self.load_builtin()
        old = self._entries.get(name)
        if old is not None and old.obj is not obj and not (old.origin == origin and old.obj == obj):
            if origin is None and old.origin is None:
                raise ValueError(f"{self.kind} {name!r} is registered twice (already by {old.describe()})")
            new = "a built-in module" if origin is None else f"plug-in {describe_plugin(origin)}"
            raise PluginError(f"{new} registers the {self.kind} {name!r}, which {old.describe()} already registers; "
                              f"nothing is replaced: give the plug-in's {self.kind} another name "
                              f"(e.g. {name + '_' + (origin or 'mine').split('.')[0]!r})")
        self._entries[name] = Entry(name, obj, info, origin)
        return obj

    def discard(self, name: str, origin: str) -> None:
        """Remove ``name`` if ``origin`` registered it (a configuration's own declaration, declared anew)."""
        if name in self._entries and self._entries[name].origin == origin:
            del self._entries[name]

    def load_builtin(self) -> None:
        """Import the registry's own packages (once): every built-in entry, and no plug-in."""
        if self._loaded:
            return
        self._loaded = True
        with _registering_as(None):
            for package_name in self.packages:
                package = importlib.import_module(package_name)
                for module in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=f"{package_name}."):
                    importlib.import_module(module.name)

    def _load(self) -> None:
        self.load_builtin()
        load_plugins()

    def plugin_entries(self) -> list[Entry]:
        """The entries that plug-ins registered."""
        return [e for e in self.entries() if e.origin is not None]

    def get(self, name: str) -> Entry:
        self._load()
        check_name(self.kind, name, self._entries,
                   hint=f"(a plug-in's is known once its package is installed (entry point group {ENTRY_POINT_GROUP}) "
                        f"or its module is named in `plugins:`; docs/plugins.md)")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry]:
        self._load()
        return iter(sorted(self._entries.values(), key=lambda e: e.name))


REGISTRIES: list[Registry] = []   # every registry below, in this order (filled by Registry.__init__)

METHODS = Registry("method", ("fedrepro.methods",))
MODELS = Registry("model family", ("fedrepro.models",))
DATASETS = Registry("dataset", ("fedrepro.data.datasets", "fedrepro.data.folder"))   # folder: FEDREPRO_DATASETS's
PREPARERS = Registry("preparer", ("fedrepro.data.prepare", "fedrepro.data.folder", "fedrepro.data.datasets"))
SPLITTERS = Registry("splitter", ("fedrepro.data.partition", "fedrepro.data.splitters"))
BUILDERS = Registry("demo-data builder", ("fedrepro.data.demo",))
TABLE_KINDS = Registry("table kind", ("fedrepro.report",))
FIGURE_KINDS = Registry("figure kind", ("fedrepro.report",))
EXTRACTORS = Registry("embedding extractor", ("fedrepro.embed",))
WEIGHT_SOURCES = Registry("weight source", ("fedrepro.models",))


def method_class(name: str):
    """The class of the FL algorithm registered as ``name``."""
    return METHODS.get(name).obj


def model_class(family: str):
    """The class of the model family registered as ``family``."""
    return MODELS.get(family).obj


def object_schema(params: dict | None, required: tuple[str, ...] = ()) -> dict:
    """A JSON schema for a mapping with exactly ``params`` (name -> property schema, defaults included)."""
    schema = {"type": "object", "additionalProperties": False, "properties": dict(params or {})}
    if required:
        schema["required"] = list(required)
    return schema


INPUTS = ("features", "images", "image_text")
TASKS = ("classification", "retrieval")


def register_method(name: str, params: dict | None = None, *, inputs: tuple[str, ...] = INPUTS,
                    tasks: tuple[str, ...] = TASKS) -> Callable:
    """An FL algorithm (a :class:`fedrepro.fl.method.FederatedMethod`); ``params``: the schema of its
    ``params`` block (property name -> JSON schema, with defaults). ``inputs`` and ``tasks``: the model families it
    can train, by what they train on and how they are scored (default: any); an extension's row of the method
    (``extension:`` of the configuration) joins only the tables whose runs fit them."""
    for what, given, allowed in (("inputs", inputs, INPUTS), ("tasks", tasks, TASKS)):
        unknown = sorted(set(given) - set(allowed))
        if unknown or not given:
            raise ValueError(f"method {name!r}: {what} must name some of {list(allowed)}, not {list(given)}")
    return METHODS.register(name, schema=object_schema(params), inputs=tuple(inputs), tasks=tuple(tasks))


# every family's train.model: whose pixel pipeline its images go through (set from the run's numerics,
# fedrepro.config.resolve; for a family on cached features, the frozen encoder's preprocessing)
PIXELS_SCHEMA = {
    "description": "authors = the authors' pixel pipeline: the decode-once cache keeps what their first transform sees "
                   "(the full-resolution image where they crop from it at random, read from the original files), "
                   "resizes with their library and interpolation; fast = random crops from a cache at twice the crop "
                   "size, PIL resizes (fedrepro.data.decode). Set from the run's numerics.",
    "enum": ["authors", "fast"],
    "default": "authors",
}


def register_model(name: str, *, input: str, params: dict | None = None, decode: Callable | None = None,
                   weights: Callable | None = None) -> Callable:
    """A model family (a :class:`fedrepro.models.families.ModelFamily`).

    ``input``: what it trains on (cached encoder ``features``, ``images``, ``image_text`` pairs);
    ``params``: the schema of ``train.model`` (its ``family`` key is added here); ``decode``:
    ``cfg -> {"train": DecodeSpec, "eval": DecodeSpec}`` for image families, from the config alone
    (the DAG names the decode-once caches before any model exists); ``weights``: ``cfg ->
    [WeightSpec]``, the pretrained files the family loads for this config, from the config alone
    (:mod:`fedrepro.models.weights`; the ``weights`` rule fetches each once, jobs load the local copy).
    """
    if input not in INPUTS:
        raise ValueError(f"model family {name!r}: input must be one of {list(INPUTS)}, not {input!r}")
    schema = object_schema({"family": {"const": name}, "pixels": PIXELS_SCHEMA, **(params or {})}, required=("family",))
    return MODELS.register(name, schema=schema, input=input, decode=decode, weights=weights)


def register_dataset(spec, origin: str | None = None):
    """A :class:`fedrepro.data.spec.DatasetSpec` (``origin``: the plug-in that declares it, when not the one being
    imported; ``"config"`` for the configuration's ``datasets:``)."""
    return DATASETS.add(spec.name, spec, origin=origin)


def dataset(name: str):
    """The :class:`~fedrepro.data.spec.DatasetSpec` registered as ``name``."""
    return DATASETS.get(name).obj


def preparer(name: str, check: Callable | None = None) -> Callable:
    """A function ``(spec, raw_root, manifest_dir=None) -> manifest DataFrame`` (raw layout -> manifest).
    ``check(spec, raw_root)``: what the download step runs before it marks a dataset complete (tables
    readable, every listed file there) where the preparer itself converts files (default: the preparer)."""
    return PREPARERS.register(name, check=check)


def splitter(name: str) -> Callable:
    """A partition function ``(labels, sources, spec, rng) -> [index arrays] | Partition``."""
    return SPLITTERS.register(name)


def builder(name: str) -> Callable:
    """An offline demo-data builder ``(spec, dataset_dir) -> None``."""
    return BUILDERS.register(name)


def register_table_kind(name: str, inputs: Callable) -> Callable:
    """A table builder ``(project, paper, table) -> TableResult``; ``inputs(project, paper, table)`` lists
    every file it reads (its Snakemake rule's inputs)."""
    return TABLE_KINDS.register(name, inputs=inputs)


def register_figure_kind(name: str, inputs: Callable, reads: tuple[str, ...] = ()) -> Callable:
    """A figure drawer ``(project, paper, name, spec, out_png) -> None``; ``inputs(project, paper, name)``
    lists every file it reads (its Snakemake rule's inputs). ``reads``: which of the spec's names are what its
    runs report, checked before any job like a table cell's: ``"metric"`` (``metric``/``metrics``), ``"eval"``
    (``eval``/``evals``)."""
    return FIGURE_KINDS.register(name, inputs=inputs, reads=tuple(reads))


def register_extractor(figure_kind: str) -> Callable:
    """A function ``(embed job) -> {name: array}`` that extracts from a trained model what figures of
    ``figure_kind`` draw (the ``embed`` rule writes it as .npz)."""
    return EXTRACTORS.register(figure_kind)


def register_weight_source(kind: str) -> Callable:
    """A source of pretrained weights (a :class:`fedrepro.models.weights.WeightSource` subclass):
    how files of ``kind`` are fetched once on a machine with internet, and what a job loads offline."""
    return WEIGHT_SOURCES.register(kind)


# ---- plug-ins -----------------------------------------------------------------------------------

_PLUGINS: dict[str, str] = {}      # a plug-in's top-level module -> how it was found (for messages and manifests)
_IMPORTED: set[str] = set()        # what load_plugins has imported (entry point values, module names)
_DISTRIBUTIONS: dict[str, str | None] = {}   # a plug-in's top-level module -> the distribution that installs it
_STATE: dict[str, Any] = {"entry_points": False, "datasets": None, "busy": False}
_DECLARE: dict[str, Callable[[str], Any] | None] = {"datasets": None}   # installed by the layer that declares them


def declares_datasets(declare: Callable[[str], Any]) -> Callable[[str], Any]:
    """Decorator: ``declare(text)`` registers the folder datasets that ``FEDREPRO_DATASETS`` carries to a job.
    :mod:`fedrepro.data.folder` installs it when it is imported (the ``DATASETS`` registry imports it with its
    built-ins), so that this module imports nothing above it; :func:`load_plugins` calls it."""
    _DECLARE["datasets"] = declare
    return declare


def describe_plugin(origin: str) -> str:
    """``'fedrepro_fedavgm' (entry point fedavgm = fedrepro_fedavgm of fedrepro-fedavgm 0.1.0)``."""
    return f"{origin!r} ({_PLUGINS[origin]})" if origin in _PLUGINS else repr(origin)


def load_plugins(modules=(), where: str | None = None) -> None:
    """Import every plug-in not imported yet: the entry points of group ``fedrepro.plugins`` (looked up once per
    process), the modules of ``FEDREPRO_PLUGINS`` and ``modules`` (``where``: what names them, e.g. ``config:
    plugins``); then register the folder datasets of ``FEDREPRO_DATASETS`` (through :func:`declares_datasets`, once
    :mod:`fedrepro.data.folder` is imported: loading the ``DATASETS`` registry imports it)."""
    if _STATE["busy"]:          # a plug-in that asks a registry while it is being imported
        return
    _STATE["busy"] = True
    try:
        if not _STATE["entry_points"]:
            _STATE["entry_points"] = True
            from importlib.metadata import entry_points

            for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.value, e.name)):
                dist = f" of {point.dist.name} {point.dist.version}" if point.dist is not None else ""
                if point.dist is not None:
                    _DISTRIBUTIONS.setdefault(point.value.split(":")[0].split(".")[0].strip(), point.dist.name)
                fix = f"pip uninstall {point.dist.name}" if point.dist is not None else "uninstall its distribution"
                _import_plugin(point.value, f"entry point {point.name} = {point.value}{dist}",
                               f"fix it, or uninstall it ({fix})", point.load)
        named = [(m.strip(), f"{PLUGINS_ENV}={os.environ[PLUGINS_ENV]}", f"correct or unset {PLUGINS_ENV}")
                 for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
        named += [(m, where or "named in the configuration", "correct the name, or make the module importable (install "
                   "its package, or put its folder on PYTHONPATH)") for m in modules]
        for module, how, fix in named:
            _import_plugin(module, how, fix)
        declared = os.environ.get(DATASETS_ENV) or None
        if declared and declared != _STATE["datasets"] and _DECLARE["datasets"] is not None:
            _DECLARE["datasets"](declared)
            _STATE["datasets"] = declared
    finally:
        _STATE["busy"] = False


def _import_plugin(target: str, how: str, fix: str, load: Callable | None = None) -> None:
    """Import one plug-in (``module`` or ``module:function``; a function is called once, with no arguments), every
    entry it registers marked as its own."""
    if target in _IMPORTED:
        return
    _IMPORTED.add(target)
    module = target.split(":")[0].strip()
    origin = module.split(".")[0]
    _PLUGINS.setdefault(origin, how)
    with _registering_as(origin):
        try:
            if load is None:
                obj = importlib.import_module(module)
                for attr in target.partition(":")[2].strip().split(".") if ":" in target else []:
                    obj = getattr(obj, attr)
            else:
                obj = load()
            if callable(obj) and not isinstance(obj, type):
                obj()
        except PluginError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure of a plug-in's code is reported as the plug-in's
            frames = traceback.extract_tb(error.__traceback__)
            at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            raise PluginError(f"plug-in {origin!r} ({how}) failed to import: {type(error).__name__}: {error}{at}; "
                              f"{fix}") from None


def plugins_loaded() -> dict[str, dict]:
    """plug-in -> {"how": how it was found, "entries": {registry kind: [names it registered]}} of this process."""
    out: dict[str, dict] = {}
    for registry in REGISTRIES:
        registry._load()
        for entry in registry.plugin_entries():
            found = out.setdefault(entry.origin, {"how": _found(entry.origin), "entries": {}})
            found["entries"].setdefault(registry.kind, []).append(entry.name)
    return out


def plugin_version(origin: str) -> str | None:
    """The version of the distribution that installs plug-in module ``origin`` (None: not from a distribution)."""
    found = plugin_distribution(origin)
    return found[1] if found else None


def plugin_distribution(origin: str) -> tuple[str, str] | None:
    """(name, version) of the distribution that installs plug-in module ``origin`` (None: not from a distribution):
    the distribution of its entry point, else the one whose files hold the module (looked up once per process:
    listing every installed distribution takes a quarter of a second); its version as installed now."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    if origin not in _DISTRIBUTIONS:
        _DISTRIBUTIONS[origin] = next(iter(packages_distributions().get(origin, [])), None)
    name = _DISTRIBUTIONS[origin]
    try:
        return (name, version(name)) if name else None
    except PackageNotFoundError:
        return None



class RunRefused(ValueError):
    """A run whose method or model family refuses its train block (their ``check_run``): the message says which,
    the key and the fix."""


def run_problems(algorithm: str, params: dict, train: dict) -> list[str]:
    """What method ``algorithm`` (with ``params``) and the model family of ``train`` refuse in the resolved train block
    ``train`` (:meth:`fedrepro.fl.method.FederatedMethod.check_run`, :meth:`fedrepro.models.families.ModelFamily.check_run`):
    one line each, naming the method or family and where it comes from. A hook that fails is named with its error."""
    found = []
    for kind, entry, args in (("method", METHODS.get(algorithm), (params, train)),
                              ("model family", MODELS.get(train["model"]["family"]), (train["model"], train))):
        check = getattr(entry.obj, "check_run", None)
        if check is None:
            continue
        try:
            problems = [str(p) for p in check(*args) or []]
        except Exception as error:  # noqa: BLE001 - a plug-in's hook that fails is reported as its own
            frames = traceback.extract_tb(error.__traceback__)
            at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
            problems = [f"its check_run failed: {type(error).__name__}: {error}{at}"]
        found += [f"{kind} {entry.name} ({entry.describe()}): {problem}" for problem in problems]
    return found


def run_plugins(run: dict) -> dict:
    """What a run uses that plug-ins registered, for its run manifest: kind -> {name, plugin, version}."""
    used = {"method": (METHODS, run["algorithm"]["name"]), "model family": (MODELS, run["train"]["model"]["family"]),
            "dataset": (DATASETS, run["dataset"])}
    out = {}
    for kind, (registry, name) in used.items():
        entry = registry.get(name)
        if entry.origin is not None:
            out[kind] = {"name": name, "plugin": entry.origin, "found": _found(entry.origin),
                         "version": plugin_version(entry.origin)}
    return out


def _found(origin: str) -> str:
    return "the configuration's datasets:" if origin == "config" else _PLUGINS.get(origin, "imported directly")
