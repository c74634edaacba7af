"""Resolution: the nested configuration of one (paper, protocol, setting, method variant, seed) turned into the
flat, fully explicit config of one job, with every default filled in. Its canonical-JSON hash is the run's identity
in the provenance manifest and a Snakemake ``params`` value, so editing any hyper-parameter reruns exactly the runs it
affects.

The train block of a run = the paper's ``defaults`` <- (under the authors' numerics) its ``authors_numerics.train`` <-
its ``protocols.<protocol>.train`` <- the setting's ``train`` <- the method variant's ``train`` <- (authors' numerics)
the variant's ``authors_numerics.train`` <- the variant's override for the protocol (deep merge), an overlay's scale,
then what the numerics leave open (precision, the pixel pipeline) and the schema defaults.

Numerics are not a protocol: how a run computes (precision, JPEG decoding, the pixel pipeline) is its own choice,
``numerics`` (the config's, overridden by the paper file, a setting or a method variant), the same under both
protocols by default, so that a clean and a paper run differ only in what the protocol changes:

- ``authors`` (the default): as the authors' code computes. fp32, or the authors' own precision where the paper file
  says so (``authors_numerics``: e.g. the fp16 CLIP of FACMIC's and FAA-CLIP's code); JPEGs decoded in full; every
  pipeline's pixels as the authors' transform makes them (``model.pixels: authors``: the decode-once cache keeps what
  their first transform sees, resizes with their library and interpolation; fedrepro.data.decode).
- ``fast``: bf16 autocast on a GPU that supports it (``precision: auto``), large JPEGs decoded with DCT scaling, random
  crops from a decode-once cache at twice the crop size and PIL resizes (``model.pixels: fast``). Its runs live in
  ``results/runs/<protocol>-fast/...`` (fedrepro.paths.RunKey)."""

from __future__ import annotations

import pickle
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from .. import paths
from ..data.partition import split_id_of
from ..io import hash_obj
from ..paths import DEFAULT_NUMERICS, RunKey
from ..registry import check_name
from .files import ConfigError, check_choice, deep_merge, input_kind, load_schema, model_schema, validate

if TYPE_CHECKING:
    from .loaded import LoadedConfig

# what each numerics choice sets where a train block leaves it open: the authors' precision is fp32 unless the paper
# file names their own (authors_numerics: {train: {precision: ...}}, e.g. FACMIC's and FAA-CLIP's fp16_weights)
NUMERICS_PRECISION = {"authors": "fp32", "fast": "auto"}


@lru_cache(maxsize=None)
def resolved_train_schema(root: str) -> dict:
    """The schema of a merged train block (paper.schema.yaml's ``resolved_train`` with its definitions), one object
    per checkout: validation remembers what it found valid against it."""
    schema = load_schema(root, "paper.schema.yaml")
    return {"$defs": schema["$defs"], **schema["$defs"]["resolved_train"]}


class Resolver:
    """The complete config of every job of a loaded configuration (resolved once per key, copied out: every seed's run
    asks for the same train block, and validation is the slow part of planning)."""

    def __init__(self, loaded: LoadedConfig):
        self.loaded = loaded
        self.papers = loaded.papers
        self.config = loaded.config
        self.overlays = loaded.overlays
        self.root = loaded.root
        # resolved once, kept pickled: every caller gets its own copy (a pickle round trip is ~10x a deepcopy's speed)
        self._train_configs: dict[tuple[str, str, str, str], bytes] = {}
        self._run_configs: dict[RunKey, bytes] = {}

    @property
    def protocols(self) -> list[str]:
        return self.loaded.protocols

    def check_names(self, paper: str, *, setting: str | None = None, method: str | None = None,
                    table: str | None = None, figure: str | None = None) -> None:
        """A paper and its setting, method variant, table or figure as a user names them (a command line, a
        Snakemake target): :class:`~fedrepro.registry.UnknownName` with the closest name for one that is not in
        this configuration."""
        check_name("paper", paper, self.papers, "in this configuration")
        spec = self.papers[paper]
        for kind, name, known in (("setting", setting, spec["settings"]), ("method", method, spec["methods"]),
                                  ("table", table, spec.get("tables") or {}), ("figure", figure, spec.get("figures") or {})):
            if name is not None:
                check_name(kind, name, known, f"in paper {paper}")

    def run_key(self, paper: str, setting: str, method: str, seed: int, protocol: str | None = None) -> RunKey:
        """The run of (paper, setting, method, seed) under ``protocol`` (default: the first configured),
        or under the protocol its setting pins, with its numerics."""
        self.check_names(paper, setting=setting, method=method)
        return RunKey(paper, self.protocol(paper, setting, protocol or self.protocols[0]), setting, method, seed,
                      self.numerics(paper, setting, method))

    def numerics(self, paper: str, setting: str, method: str) -> str:
        """How runs of (paper, setting, method) compute: ``authors`` or ``fast``, the most specific of the method
        variant's, the setting's, the paper file's and the config's ``numerics`` (the same under both protocols)."""
        p = self.papers[paper]
        for scope in (p["methods"][method], p["settings"][setting], p):
            if "numerics" in scope:
                return scope["numerics"]
        return self.config.get("numerics", DEFAULT_NUMERICS)

    def protocol(self, paper: str, setting: str, protocol: str) -> str:
        """The protocol a run of ``setting`` uses when a table or figure is built for ``protocol``: the
        setting's own ``protocol`` if it pins one (e.g. a reproduction of the authors' index bug), else
        ``protocol``."""
        return self.papers[paper]["settings"][setting].get("protocol", protocol)

    def protocol_override(self, paper: str, method: str, protocol: str) -> dict:
        """What a method variant changes under ``protocol`` (``protocols: {paper: {params, train}}``): e.g.
        the authors' code's behaviour that moves published numbers, on under ``paper`` only."""
        return self.papers[paper]["methods"][method].get("protocols", {}).get(protocol, {})

    def method_params(self, paper: str, method: str, protocol: str) -> dict:
        """The variant's ``params`` with its override for ``protocol`` merged in (an overlay's scale applied)."""
        variant = self.papers[paper]["methods"][method]
        params = deep_merge(variant.get("params", {}), self.protocol_override(paper, method, protocol).get("params"))
        overlay = self.overlays.get(paper)
        return overlay.scale_params(variant.get("method", method), params) if overlay else params

    def train_config(self, paper: str, setting: str, method: str, protocol: str) -> dict:
        """The merged, validated train block of (paper, setting, method) under ``protocol``; resolved
        once, copied out (every seed's run asks for it, and validation is the slow part of planning)."""
        key = (paper, setting, method, protocol)
        if key not in self._train_configs:
            self._train_configs[key] = pickle.dumps(self._resolve_train_config(*key))
        return pickle.loads(self._train_configs[key])

    def _resolve_train_config(self, paper: str, setting: str, method: str, protocol: str) -> dict:
        p, variant = self.papers[paper], self.papers[paper]["methods"][method]
        numerics = self.numerics(paper, setting, method)
        authors = numerics == "authors"
        # the paper's defaults, what the authors' numerics add to them, what they change under this protocol
        # (protocols: {paper: {train: ...}}), then the setting's and the method's
        train = deep_merge(p["defaults"], p.get("authors_numerics", {}).get("train") if authors else None)
        train = deep_merge(train, p.get("protocols", {}).get(protocol, {}).get("train"))
        train = deep_merge(deep_merge(train, p["settings"][setting].get("train")), variant.get("train"))
        train = deep_merge(train, variant.get("authors_numerics", {}).get("train") if authors else None)
        train = deep_merge(train, self.protocol_override(paper, method, protocol).get("train"))
        if paper in self.overlays:      # (an extension's twin of a variant gets what the overlay gives that variant)
            extension = self.loaded.extension
            train = self.overlays[paper].apply_train(train, extension.baseline_of(paper, method) if extension else method)
        train.setdefault("precision", NUMERICS_PRECISION[numerics])
        if isinstance(train.get("model"), dict):
            train["model"].setdefault("pixels", numerics)
        where = f"{paper}: settings/{setting} x methods/{method}: train"
        missing = [k for k in ("rounds", "batch_size", "model", "optimizer") if k not in train]
        if missing:
            raise ConfigError(f"{where}: missing {missing} (set them in defaults, the setting or the method)")
        from ..registry import MODELS

        check_choice(train["model"].get("family"), MODELS.names(), f"{where}/model/family")
        validate(train["model"], model_schema(train["model"]["family"]), f"{where}/model")
        return validate(train, resolved_train_schema(str(self.root.resolve())), where)

    def setting(self, paper: str, setting: str, protocol: str = "clean") -> dict:
        """The setting as runs of ``protocol`` read it: the ``dataset`` and the whole ``split`` its
        ``protocols: {<protocol>: {dataset, split}}`` names instead (e.g. the paper protocol's skin set with the
        sources' overlap, or FedIIC's own split of ISIC, as the authors built them)."""
        s = self.papers[paper]["settings"][setting]
        override = s.get("protocols", {}).get(self.protocol(paper, setting, protocol), {})
        return {**s, "dataset": override.get("dataset", s["dataset"]), "split": override.get("split", s["split"])}

    def split_seed(self, paper: str, setting: str, seed: int, protocol: str = "clean") -> int:
        value = self.setting(paper, setting, protocol)["split"].get("seed", 0)
        return seed if value == "run" else int(value)

    def split_spec(self, paper: str, setting: str, seed: int, protocol: str = "clean") -> dict:
        """The split spec the split job of run seed ``seed`` gets: without its ``seed`` (a separate argument), and
        with ``partition_seed: run`` / ``client_seed: run`` turned into that run seed (the clients' draw, or only
        their train/val/test cut, redrawn per run while the rest stays)."""
        spec = {k: v for k, v in self.setting(paper, setting, protocol)["split"].items() if k != "seed"}
        for key in ("partition_seed", "client_seed"):
            if spec.get(key) == "run":
                spec[key] = seed
        return spec

    def split_id(self, paper: str, setting: str, seed: int, protocol: str = "clean") -> str:
        return split_id_of(self.setting(paper, setting, protocol)["dataset"], self.split_spec(paper, setting, seed, protocol),
                           self.split_seed(paper, setting, seed, protocol))

    def jpeg_draft(self, numerics: str) -> bool:
        """Whether runs of ``numerics`` decode large JPEGs with DCT scaling (``data.jpeg_draft``; auto = under the
        fast numerics only: the authors' code decodes every JPEG in full)."""
        setting = self.config["data"]["jpeg_draft"]
        return numerics == "fast" if setting == "auto" else bool(setting)

    def features_key(self, model: dict, draft: bool) -> str | None:
        if input_kind(model["family"]) != "features":
            return None
        enc = model.get("encoder", {})
        size = f"-{enc['image_size']}px" if enc.get("image_size") else ""
        tag = re.sub(r"[^A-Za-z0-9.]+", "_", Path(enc["pretrained"]).stem if "/" in enc["pretrained"] else enc["pretrained"])
        full = "" if draft else "-full"   # images decoded without JPEG DCT scaling
        # the encoder's precision, where it is not fp32 (the hash holds it too; an fp32 spec's key is as before)
        half = "-fp16w" if enc.get("precision", "fp32") == "fp16_weights" else ""
        # the authors' pixel pipeline is in the hash; the fast one's key is the key caches had before it was a choice
        pixels = model.get("pixels", DEFAULT_NUMERICS)
        identity = enc if pixels == "fast" else {**enc, "pixels": pixels}
        return f"{enc['name']}-{tag}-{enc['preprocess']}{size}{full}{half}-{hash_obj(identity, 6)}"

    def image_cache_paths(self, dataset: str, model: dict, draft: bool) -> dict[str, str] | None:
        """{"train": file, "eval": file} of the decode-once image caches an image run reads (None for
        runs on cached features, or with ``data.image_cache: false``)."""
        if input_kind(model["family"]) == "features" or not self.config["data"]["image_cache"]:
            return None
        from ..models.decoding import decode_specs

        specs = decode_specs(model, draft=draft)
        # a pipeline that needs the full-resolution image (the authors' random crops, a resize of float tensors)
        # reads the original files every epoch, as the authors' code does: a cache would be the dataset decoded in
        # full (ISIC 2019: ~60 GB)
        return {part: paths.image_cache(dataset, spec.key) for part, spec in specs.items() if spec.size is not None}

    def run_config(self, key: RunKey) -> dict:
        """The complete, explicit configuration of one training job (resolved once, copied out)."""
        if key not in self._run_configs:
            self._run_configs[key] = pickle.dumps(self._resolve_run_config(key))
        return pickle.loads(self._run_configs[key])

    def _resolve_run_config(self, key: RunKey) -> dict:
        paper = self.papers[key.paper]
        setting = self.setting(key.paper, key.setting, key.protocol)
        variant = paper["methods"][key.method]
        train = self.train_config(key.paper, key.setting, key.method, key.protocol)
        numerics = self.numerics(key.paper, key.setting, key.method)
        if key.numerics != numerics:
            raise ConfigError(f"run {key.path}: its configuration computes with the {numerics} numerics, not {key.numerics}")
        draft = self.jpeg_draft(numerics)
        features_key = self.features_key(train["model"], draft)
        split_id = self.split_id(key.paper, key.setting, key.seed, key.protocol)
        run = {
            "paper": key.paper,
            "setting": key.setting,
            "method": key.method,
            "seed": key.seed,
            "protocol": key.protocol,
            "dataset": setting["dataset"],
            "algorithm": {"name": variant.get("method", key.method), "params": self.method_params(key.paper, key.method, key.protocol)},
            "train": train,
            "input": input_kind(train["model"]["family"]),
            "split_id": split_id,
            "features": {"key": features_key, "encoder": train["model"].get("encoder", {})} if features_key else None,
            "paths": {
                "raw_dir": self.config["data"]["raw_dir"],
                "manifest": paths.manifest(setting["dataset"]),
                "split": paths.split(split_id),
                "features": paths.features(setting["dataset"], features_key) if features_key else None,
                "images": self.image_cache_paths(setting["dataset"], train["model"], draft),
                "out": paths.run_dir(key),
                "checkpoints": paths.checkpoint_dir(key),
            },
            "device": self.config["device"],
            "deterministic": self.config["deterministic"],
            "threads": self.config["threads"],
            "corrupt_images": self.config["data"]["corrupt_images"],
            "numerics": numerics,
            "jpeg_draft": draft,
        }
        run["config_hash"] = hash_obj(run)
        return run

    def downstream_config(self, key: RunKey, task: str) -> dict:
        """The complete configuration of one downstream evaluation (``task``) of a pre-trained run."""
        spec = self.papers[key.paper]["downstream"][task]
        run = self.run_config(key)
        job = {
            "task": task,
            "spec": spec,
            "seed": key.seed,
            "run": run,
            "paths": {
                "raw_dir": self.config["data"]["raw_dir"],
                "manifest": paths.manifest(spec["dataset"]),
                "checkpoint": paths.model_file(key),
                "metrics": paths.run_file(key),
            },
            "device": self.config["device"],
            "deterministic": self.config["deterministic"],
            "threads": self.config["threads"],
        }
        job["config_hash"] = hash_obj(job)
        return job

    def embed_job(self, key: RunKey, figure: str) -> dict:
        """What the ``embed`` rule extracts from run ``key``'s trained model for ``figure`` (fedrepro.embed)."""
        spec = self.papers[key.paper]["figures"][figure]
        return {"run": self.run_config(key), "figure": {"name": figure, **spec}, "checkpoint": paths.model_file(key)}

    def resolved_cells(self, paper: str, table: str, protocol: str) -> list[dict]:
        """Every run cell of a table built for ``protocol``, resolved (derived 'mean_of' and blank cells
        excluded); a cell's own ``protocol`` (row, column or table) or its setting's wins."""
        return self.cells(paper, self.papers[paper]["tables"][table], protocol)

    def cells(self, paper: str, spec: dict, protocol: str) -> list[dict]:
        """:meth:`resolved_cells` of a table ``spec`` of ``paper`` (one in the paper file, or one being made)."""
        if spec.get("kind", "runs") != "runs":
            return []
        out = []
        for i, row in enumerate(spec.get("rows", [])):
            for col in spec.get("columns", []):
                cell = resolve_cell(spec, row, col)
                if cell is not None:
                    cell["protocol"] = self.protocol(paper, cell["setting"], cell["protocol"] or protocol)
                    cell["numerics"] = self.numerics(paper, cell["setting"], cell["method"])
                    cell["eval"] = column_eval(col, cell["protocol"]) or cell["eval"]
                    cell["row"], cell["column"] = f"rows/{row.get('label') or row.get('method') or i}", f"columns/{col['label']}"
                    cell["where"] = f"{cell['row']} x {cell['column']}"
                    out.append(cell)
        return out


def resolve_cell(table: dict, row: dict, col: dict) -> dict | None:
    """The run and metric behind one table cell, or None for a blank or derived cell."""
    if "mean_of" in col:
        return None
    if "only" in row and col["label"] not in row["only"]:
        return None
    setting = row.get("settings", {}).get(col["label"]) or row.get("setting") or col.get("setting")
    method = row.get("methods", {}).get(col["label"]) or row.get("method") or col.get("method")
    if setting is None or method is None:
        return None
    return {
        "setting": setting,
        "method": method,
        "metric": col.get("metric") or row.get("metric") or table.get("metric", "acc"),
        "eval": row.get("evals", {}).get(col["label"]) or col.get("eval") or row.get("eval") or table.get("eval", "global"),
        "scale": col.get("scale", table.get("scale", 100)),
        # a downstream task's result file instead of the run's metrics.json (None: metrics.json)
        "task": col.get("task") or row.get("task") or table.get("task"),
        # a protocol the cell pins (protocol-comparison tables); None = the table's
        "protocol": col.get("protocol") or row.get("protocol") or table.get("protocol"),
    }


def column_eval(col: dict, protocol: str) -> str | None:
    """The eval key a column reads from runs of ``protocol`` when it names one (``protocols: {<protocol>:
    {eval}}``, e.g. the authors' pooled per-client accuracy under ``paper``), else None."""
    return col.get("protocols", {}).get(protocol, {}).get("eval")

