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
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    info: dict = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.info[key]


class Registry:
    """``name -> Entry`` for one kind of plugin, filled by importing ``packages`` on first use."""

    def __init__(self, kind: str, packages: tuple[str, ...]):
        self.kind, self.packages = kind, packages
        self._entries: dict[str, Entry] = {}
        self._loaded = False

    def register(self, name: str, **info) -> Callable:
        """Decorator: ``@REGISTRY.register(name, **info)`` above a class or function."""
        def decorate(obj):
            self.add(name, obj, **info)
            return obj
        return decorate

    def add(self, name: str, obj: Any, **info) -> Any:
        if name in self._entries and self._entries[name].obj is not obj:
            where = getattr(self._entries[name].obj, "__module__", "?")
            raise ValueError(f"{self.kind} {name!r} is registered twice (already by {where})")
        self._entries[name] = Entry(name, obj, info)
        return obj

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for package_name in self.packages:
            package = importlib.import_module(package_name)
            for module in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=f"{package_name}."):
                importlib.import_module(module.name)

    def get(self, name: str) -> Entry:
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), list(self._entries), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}{hint}; known: {sorted(self._entries)}") from None

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry]:
        self._load()
        return iter(sorted(self._entries.values(), key=lambda e: e.name))


METHODS = Registry("method", ("fedrepro.methods",))
MODELS = Registry("model family", ("fedrepro.models",))
DATASETS = Registry("dataset", ("fedrepro.data.datasets",))
PREPARERS = Registry("preparer", ("fedrepro.data.prepare", "fedrepro.data.datasets"))
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


def register_method(name: str, params: dict | None = None) -> Callable:
    """An FL algorithm (a :class:`fedrepro.fl.method.FederatedMethod`); ``params``: the schema of its
    ``params`` block (property name -> JSON schema, with defaults)."""
    return METHODS.register(name, schema=object_schema(params))


INPUTS = ("features", "images", "image_text")
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


def register_dataset(spec):
    """A :class:`fedrepro.data.spec.DatasetSpec`."""
    return DATASETS.add(spec.name, spec)


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
