"""Configuration: load, validate against ``workflow/schemas``, and resolve into runs.

A *project* is the top-level config (``config/config.yaml`` or ``config/demo.yaml``) plus one YAML
file per paper. Everything is validated before Snakemake schedules any job; an error names the key
path, the offending value and what is allowed (with a "did you mean" for typos).

Resolution turns the nested config into flat, fully explicit *run configs*: one per
(paper, setting, method variant, seed), with every default filled in. Its canonical-JSON hash is the
run's identity in the provenance manifest and a Snakemake ``params`` value, so editing any
hyper-parameter reruns exactly the runs it affects. This module imports neither torch nor
Snakemake, so building the DAG stays fast.
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import yaml

from .io import hash_obj

SCHEMA_DIR = Path("workflow/schemas")


class ConfigError(ValueError):
    pass


# --------------------------------------------------------------------------------------------
# schema validation

# libyaml's parser when PyYAML has it: the same documents, ~8x faster on the grid's YAML files
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_YAML_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None


@lru_cache(maxsize=None)
def _schema(root: str, name: str) -> dict:
    return load_yaml(Path(root) / SCHEMA_DIR / name)


@lru_cache(maxsize=None)
def _validator_with_defaults():
    # building the validator class costs ~4 ms; validate() runs for every run config of the grid
    from jsonschema import Draft202012Validator, validators

    check_properties = Draft202012Validator.VALIDATORS["properties"]

    def fill_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, properties, instance, schema)

    return validators.extend(Draft202012Validator, {"properties": fill_defaults})


def validate(instance: Any, schema: dict, where: str) -> Any:
    """Validate (and fill defaults into) ``instance``; raise ConfigError with a readable message."""
    validator = _validator_with_defaults()(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise ConfigError("\n".join(f"{where}: {describe_error(e)}" for e in errors[:5]))
    return instance


def describe_error(error) -> str:
    from jsonschema.exceptions import best_match

    if error.validator in ("oneOf", "anyOf") and error.context:
        error = best_match(error.context)
    path = "/".join(map(str, error.absolute_path)) or "(top level)"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted((error.schema.get("properties") or {}).keys())
        unknown = [k for k in error.instance if k not in allowed]
        hints = "; ".join(_did_you_mean(k, allowed) for k in unknown)
        return f"unknown key(s) {unknown} under '{path}'{hints}; allowed keys: {allowed}"
    if error.validator == "enum":
        allowed = error.validator_value
        return f"'{path}' = {error.instance!r} is not allowed{_did_you_mean(error.instance, allowed)}; allowed values: {allowed}"
    if error.validator == "const":
        return f"'{path}' = {error.instance!r}, expected {error.validator_value!r}"
    return f"'{path}': {error.message}"


def _did_you_mean(value: Any, allowed) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(a) for a in allowed], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_choice(value: str, allowed, where: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not allowed{_did_you_mean(value, list(allowed))}; allowed values: {sorted(allowed)}")


# --------------------------------------------------------------------------------------------
# catalogue of algorithms and model families, read from the schema (no torch import)

@dataclass(frozen=True)
class Catalog:
    methods: dict[str, dict]
    models: dict[str, dict]
    defs: dict

    def method_schema(self, name: str) -> dict:
        return {"$defs": self.defs, **self.methods[name]}

    def model_schema(self, family: str) -> dict:
        return {"$defs": self.defs, **self.models[family]}

    def input_kind(self, family: str) -> str:
        return self.models[family]["x-input"]

    def implementation(self, kind: str, name: str) -> str:
        return (self.methods if kind == "method" else self.models)[name]["x-module"]


def catalog(root: str | Path = ".") -> Catalog:
    """Merge every ``workflow/schemas/methods/*.yaml``; a name defined twice is an error."""
    methods, models, defs = {}, {}, {}
    folder = Path(root).resolve() / SCHEMA_DIR / "methods"
    for path in sorted(folder.glob("*.yaml")):
        part = _schema(str(Path(root).resolve()), f"methods/{path.name}")
        for target, key in ((methods, "methods"), (models, "models"), (defs, "$defs")):
            for name, entry in (part.get(key) or {}).items():
                if name in target and key != "$defs":
                    raise ConfigError(f"{path}: {key[:-1]} {name!r} is already defined in another schema file")
                target[name] = entry
    return Catalog(methods, models, defs)


# --------------------------------------------------------------------------------------------
# the project: top-level config + papers

def deep_merge(base: dict, override: dict | None) -> dict:
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if key == "model" and isinstance(value, dict) and value.get("family", (out.get(key) or {}).get("family")) != (out.get(key) or {}).get("family"):
            out[key] = copy.deepcopy(value)  # another model family: its keys replace the old family's
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class RunKey:
    paper: str
    setting: str
    method: str
    seed: int

    @property
    def path(self) -> str:
        return f"{self.paper}/{self.setting}/{self.method}/seed{self.seed}"


class Project:
    """The validated configuration of every active paper, and everything derived from it."""

    def __init__(self, config: dict, root: str | Path = "."):
        self.root = Path(root)
        self.config = validate(copy.deepcopy(config), _schema(str(self.root.resolve()), "config.schema.yaml"), "config")
        self.catalog = catalog(self.root)
        self.papers: dict[str, dict] = {}
        self._train_configs: dict[tuple[str, str, str], dict] = {}
        for name in self.config["papers"]:
            path = self.root / self.config["paper_dir"] / f"{name}.yaml"
            paper = load_yaml(path)
            if not isinstance(paper, dict):
                raise ConfigError(f"{path}: expected a mapping at the top level")
            validate(paper, _schema(str(self.root.resolve()), "paper.schema.yaml"), str(path))
            if paper["paper"] != name:
                raise ConfigError(f"{path}: 'paper' is {paper['paper']!r} but the file is for {name!r}")
            self.papers[name] = paper
            self._check_paper(paper, str(path))

    # ---- checks that need more than the schema ---------------------------------------------
    def _check_paper(self, paper: dict, where: str) -> None:
        from .data import registry

        for name, setting in paper["settings"].items():
            check_choice(setting["dataset"], registry.names(), f"{where}: settings/{name}/dataset")
        for name, variant in paper["methods"].items():
            algorithm = variant.get("method", name)
            check_choice(algorithm, self.catalog.methods, f"{where}: methods/{name}/method")
            validate(variant.setdefault("params", {}), self.catalog.method_schema(algorithm), f"{where}: methods/{name}/params")
            for protocol, override in variant.get("protocols", {}).items():
                validate(deep_merge(variant["params"], override.get("params")), self.catalog.method_schema(algorithm),
                         f"{where}: methods/{name}/protocols/{protocol}/params")
        for setting in paper["settings"]:
            for method in paper["methods"]:
                self.train_config(paper["paper"], setting, method)  # validates the merged train block
        for name, task in paper.get("downstream", {}).items():
            check_choice(task["dataset"], registry.names(), f"{where}: downstream/{name}/dataset")
        for table_name, table in paper.get("tables", {}).items():
            for s in table.get("settings", []):
                check_choice(s, paper["settings"], f"{where}: tables/{table_name}/settings")
            for key in self.table_cells(paper["paper"], table_name):
                check_choice(key[0], paper["settings"], f"{where}: tables/{table_name} setting")
                check_choice(key[1], paper["methods"], f"{where}: tables/{table_name} method")
            for _, _, task in self.table_tasks(paper["paper"], table_name):
                check_choice(task, paper.get("downstream", {}), f"{where}: tables/{table_name} task")
        for fig_name, fig in paper.get("figures", {}).items():
            for s in fig.get("settings", []):
                check_choice(s, paper["settings"], f"{where}: figures/{fig_name}/settings")
            for m in fig.get("methods", []):
                check_choice(m, paper["methods"], f"{where}: figures/{fig_name}/methods")
            for t in fig.get("tables", []):
                check_choice(t, paper.get("tables", {}), f"{where}: figures/{fig_name}/tables")

    # ---- runs --------------------------------------------------------------------------
    def train_config(self, paper: str, setting: str, method: str) -> dict:
        """The merged, validated train block of (paper, setting, method); resolved once, copied out
        (every seed's run asks for it, and schema validation is the slow part of planning a grid)."""
        key = (paper, setting, method)
        if key not in self._train_configs:
            self._train_configs[key] = self._resolve_train_config(paper, setting, method)
        return copy.deepcopy(self._train_configs[key])

    def _resolve_train_config(self, paper: str, setting: str, method: str) -> dict:
        p = self.papers[paper]
        variant = p["methods"][method]
        train = deep_merge(deep_merge(p["defaults"], p["settings"][setting].get("train")), variant.get("train"))
        train = deep_merge(train, self.protocol_override(paper, setting, method).get("train"))
        where = f"{paper}: settings/{setting} x methods/{method}: train"
        missing = [k for k in ("rounds", "batch_size", "model", "optimizer") if k not in train]
        if missing:
            raise ConfigError(f"{where}: missing {missing} (set them in defaults, the setting or the method)")
        family = train["model"].get("family")
        check_choice(family, self.catalog.models, f"{where}/model/family")
        validate(train["model"], self.catalog.model_schema(family), f"{where}/model")
        train.setdefault("local", {}).setdefault("drop_last", False)
        if "epochs" not in train["local"] and "steps" not in train["local"]:
            train["local"]["epochs"] = 1
        train.setdefault("aggregation", {}).setdefault("weights", "train_size")
        train.setdefault("eval_every", 1)
        train.setdefault("eval_batch_size", max(train["batch_size"], 256))
        train.setdefault("num_workers", "auto")
        sel = train.setdefault("selection", {})
        sel.setdefault("rule", "auto")
        sel.setdefault("metric", "acc")
        sel.setdefault("k", 5)
        opt = train["optimizer"]
        opt.setdefault("name", "adam")
        opt.setdefault("weight_decay", 0.0)
        opt.setdefault("persist", False)
        return train

    def protocol(self, paper: str, setting: str) -> str:
        return self.papers[paper]["settings"][setting].get("protocol", self.config["protocol"])

    def protocol_override(self, paper: str, setting: str, method: str) -> dict:
        """What a method variant changes under the protocol of ``setting`` (``protocols: {paper: {params,
        train}}``): e.g. the authors' code's behaviour that moves published numbers, on under ``paper`` only."""
        variant = self.papers[paper]["methods"][method]
        return variant.get("protocols", {}).get(self.protocol(paper, setting), {})

    def method_params(self, paper: str, setting: str, method: str) -> dict:
        """The variant's ``params`` with its override for the setting's protocol merged in."""
        variant = self.papers[paper]["methods"][method]
        return deep_merge(variant.get("params", {}), self.protocol_override(paper, setting, method).get("params"))

    def split_seed(self, paper: str, setting: str, seed: int) -> int:
        value = self.papers[paper]["settings"][setting]["split"].get("seed", 0)
        return seed if value == "run" else int(value)

    def split_id(self, paper: str, setting: str, seed: int) -> str:
        s = self.papers[paper]["settings"][setting]
        spec = {k: v for k, v in s["split"].items() if k != "seed"}
        split_seed = self.split_seed(paper, setting, seed)
        alpha = f"-a{spec['alpha']:g}" if "alpha" in spec else ""
        clients = f"-c{spec['clients']}" if "clients" in spec else ""
        return f"{s['dataset']}-{spec['kind']}{alpha}{clients}-s{split_seed}-{hash_obj([s['dataset'], spec], 6)}"

    def splits(self) -> dict[str, dict]:
        """Every split some run needs, plus those that split-count tables and figures read directly
        (their settings at the first seed), even where no run uses them."""
        needed = [(key.paper, key.setting, key.seed) for key in self.runs()]
        seed = self.config["seeds"][0]
        for paper_name, table in self.tables():
            spec = self.papers[paper_name]["tables"][table]
            if spec.get("kind", "runs") == "split_counts":
                needed += [(paper_name, s, seed) for s in spec.get("settings", [])]
        for paper_name, figure in self.figures():
            needed += [(paper_name, s, seed) for s in self.papers[paper_name]["figures"][figure].get("settings", [])]
        out = {}
        for paper_name, setting, run_seed in needed:
            s = self.papers[paper_name]["settings"][setting]
            out[self.split_id(paper_name, setting, run_seed)] = {
                "dataset": s["dataset"],
                "spec": {k: v for k, v in s["split"].items() if k != "seed"},
                "seed": self.split_seed(paper_name, setting, run_seed),
            }
        return out

    def features_key(self, model: dict) -> str | None:
        if self.catalog.input_kind(model["family"]) != "features":
            return None
        enc = model.get("encoder", {})
        size = f"-{enc['image_size']}px" if enc.get("image_size") else ""
        tag = re.sub(r"[^A-Za-z0-9.]+", "_", Path(enc["pretrained"]).stem if "/" in enc["pretrained"] else enc["pretrained"])
        full = "" if self.config["data"]["jpeg_draft"] else "-full"   # images decoded without JPEG DCT scaling
        return f"{enc['name']}-{tag}-{enc['preprocess']}{size}{full}-{hash_obj(enc, 6)}"

    def features(self) -> dict[tuple[str, str], dict]:
        """(dataset, features key) -> encoder spec, for every feature cache some run needs."""
        out = {}
        for key in self.runs():
            run = self.run_config(key)
            if run["features"]:
                out[(run["dataset"], run["features"]["key"])] = run["features"]["encoder"]
        return out

    def image_cache_paths(self, dataset: str, model: dict) -> dict[str, str] | None:
        """{"train": file, "eval": file} of the decode-once image caches an image run reads (None for
        runs on cached features, or with ``data.image_cache: false``)."""
        if self.catalog.input_kind(model["family"]) == "features" or not self.config["data"]["image_cache"]:
            return None
        from .models.decoding import decode_specs

        specs = decode_specs(model, draft=self.config["data"]["jpeg_draft"])
        return {part: f"resources/images/{dataset}/{spec.key}.u8" for part, spec in specs.items()}

    def image_caches(self) -> dict[str, dict]:
        """Cache file -> {"dataset", "spec"} for every decode-once image cache some run needs."""
        out = {}
        for key in self.runs():
            run = self.run_config(key)
            for path in (run["paths"]["images"] or {}).values():
                out[path] = {"dataset": run["dataset"], "spec": Path(path).name.removesuffix(".u8")}
        return out

    def run_config(self, key: RunKey) -> dict:
        """The complete, explicit configuration of one training job."""
        paper = self.papers[key.paper]
        setting = paper["settings"][key.setting]
        variant = paper["methods"][key.method]
        train = self.train_config(key.paper, key.setting, key.method)
        protocol = self.protocol(key.paper, key.setting)
        features_key = self.features_key(train["model"])
        split_id = self.split_id(key.paper, key.setting, key.seed)
        raw = self.config["data"]["raw_dir"]
        run = {
            "paper": key.paper,
            "setting": key.setting,
            "method": key.method,
            "seed": key.seed,
            "protocol": protocol,
            "dataset": setting["dataset"],
            "algorithm": {"name": variant.get("method", key.method), "params": self.method_params(key.paper, key.setting, key.method)},
            "train": train,
            "input": self.catalog.input_kind(train["model"]["family"]),
            "impl": {
                "method": self.catalog.implementation("method", variant.get("method", key.method)),
                "model": self.catalog.implementation("model", train["model"]["family"]),
            },
            "split_id": split_id,
            "features": {"key": features_key, "encoder": train["model"].get("encoder", {})} if features_key else None,
            "paths": {
                "raw_dir": raw,
                "manifest": f"resources/manifests/{setting['dataset']}.csv",
                "split": f"resources/splits/{split_id}.json",
                "features": f"resources/features/{setting['dataset']}/{features_key}.pt" if features_key else None,
                "images": self.image_cache_paths(setting["dataset"], train["model"]),
            },
            "device": self.config["device"],
            "deterministic": self.config["deterministic"],
            "threads": self.config["threads"],
            "corrupt_images": self.config["data"]["corrupt_images"],
            "jpeg_draft": self.config["data"]["jpeg_draft"],
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
                "manifest": f"resources/manifests/{spec['dataset']}.csv",
                "checkpoint": f"results/checkpoints/{key.path}/model.pt",
                "metrics": f"results/runs/{key.path}/metrics.json",
            },
            "device": self.config["device"],
            "deterministic": self.config["deterministic"],
            "threads": self.config["threads"],
        }
        job["config_hash"] = hash_obj(job)
        return job

    def downstream_jobs(self) -> dict[str, tuple[RunKey, str]]:
        """``<run path>/<task>`` -> (run, task) for every downstream result some table needs."""
        jobs = {}
        for paper_name, table in self.tables():
            for key, task in self.table_downstream(paper_name, table):
                jobs[f"{key.path}/{task}"] = (key, task)
        return jobs

    def runs(self) -> list[RunKey]:
        """Every run some table or figure needs, once per seed, in a stable order."""
        needed: dict[tuple[str, str, str], None] = {}
        for paper_name, paper in self.papers.items():
            for table_name in paper.get("tables", {}):
                for setting, method in self.table_cells(paper_name, table_name):
                    needed[(paper_name, setting, method)] = None
            for fig in paper.get("figures", {}).values():
                for setting in fig.get("settings", []):
                    for method in fig.get("methods", []):
                        needed[(paper_name, setting, method)] = None
        return [RunKey(p, s, m, seed) for (p, s, m) in needed for seed in self.config["seeds"]]

    # ---- tables and figures -------------------------------------------------------------
    def resolved_cells(self, paper: str, table: str) -> list[dict]:
        """Every run cell of a table, resolved (derived 'mean_of' and blank cells excluded)."""
        spec = self.papers[paper]["tables"][table]
        if spec.get("kind", "runs") != "runs":
            return []
        cells = (resolve_cell(spec, row, col) for row in spec.get("rows", []) for col in spec.get("columns", []))
        return [cell for cell in cells if cell is not None]

    def table_cells(self, paper: str, table: str) -> list[tuple[str, str]]:
        """(setting, method) of every run cell of a table (derived 'mean_of' columns excluded)."""
        return list(dict.fromkeys((c["setting"], c["method"]) for c in self.resolved_cells(paper, table)))

    def table_tasks(self, paper: str, table: str) -> list[tuple[str, str, str]]:
        """(setting, method, task) of every cell of a table that reads a downstream result."""
        return list(dict.fromkeys((c["setting"], c["method"], c["task"]) for c in self.resolved_cells(paper, table) if c["task"]))

    def table_downstream(self, paper: str, table: str) -> list[tuple[RunKey, str]]:
        return [(RunKey(paper, s, m, seed), t) for s, m, t in self.table_tasks(paper, table) for seed in self.config["seeds"]]

    def table_runs(self, paper: str, table: str) -> list[RunKey]:
        return [RunKey(paper, s, m, seed) for s, m in self.table_cells(paper, table) for seed in self.config["seeds"]]

    def figure_runs(self, paper: str, figure: str) -> list[RunKey]:
        fig = self.papers[paper]["figures"][figure]
        return [RunKey(paper, s, m, seed) for s in fig.get("settings", []) for m in fig.get("methods", [])
                for seed in self.config["seeds"]]

    def tables(self) -> Iterator[tuple[str, str]]:
        for paper_name, paper in self.papers.items():
            for table in paper.get("tables", {}):
                yield paper_name, table

    def figures(self) -> Iterator[tuple[str, str]]:
        for paper_name, paper in self.papers.items():
            for figure in paper.get("figures", {}):
                yield paper_name, figure

    def datasets(self) -> list[str]:
        from .data import registry

        names = {split["dataset"] for split in self.splits().values()}
        names.update(self.papers[key.paper]["downstream"][task]["dataset"] for key, task in self.downstream_jobs().values())
        for name in list(names):
            names.update(registry.get(name).depends_on)
        return sorted(names)


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
    }


def load_project(configfiles: list[str | Path] | None = None, overrides: dict | None = None, root: str | Path = ".") -> Project:
    """Load and merge config files (later ones win) the way ``snakemake --configfile`` does."""
    config: dict = {}
    for path in configfiles or [Path(root) / "config/config.yaml"]:
        config = deep_merge(config, load_yaml(path) or {})
    return Project(deep_merge(config, overrides), root)
