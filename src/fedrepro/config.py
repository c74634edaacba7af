"""Configuration: load, validate against ``workflow/schemas``, and resolve into runs.

A *project* is the top-level config (``config/config.yaml`` or ``config/demo.yaml``) plus one YAML
file per paper. Everything is validated before Snakemake schedules any job; an error names the key
path, the offending value and what is allowed (with a "did you mean" for typos).

The shape of the config files is checked against ``workflow/schemas`` (config and paper files);
what a method's ``params`` or a model's ``train.model`` may hold comes from the package's registry
(:mod:`fedrepro.registry`), where each method and model family declares its schema beside its code.
Defaults come from schemas only.

Resolution turns the nested config into flat, fully explicit *run configs*: one per
(paper, protocol, setting, method variant, seed), with every default filled in. Its canonical-JSON
hash is the run's identity in the provenance manifest and a Snakemake ``params`` value, so editing
any hyper-parameter reruns exactly the runs it affects. Paths come from :mod:`fedrepro.paths`.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import yaml

from . import paths
from .io import hash_obj
from .paths import RunKey

SCHEMA_DIR = Path("workflow/schemas")


class ConfigError(ValueError):
    pass


# --------------------------------------------------------------------------------------------
# schema validation

class DuplicateKey(yaml.YAMLError):
    pass


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's parser when PyYAML has it (the same documents, ~8x faster on the grid's YAML files), refusing
    a mapping that repeats a key: YAML would silently keep the last one. Keys merged in with ``<<: *anchor``
    may be overridden, as YAML intends."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue
                if key in seen:
                    raise DuplicateKey(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} (first at line "
                                       f"{seen[key]}); YAML would keep only the last one: remove or rename one of them")
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=_Loader)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None


def check_config_files(files) -> None:
    """What Snakemake's own loader lets through in the files it was given (``--configfile``): repeated keys."""
    for path in files:
        load_yaml(path)


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
    if error.validator in ("oneOf", "anyOf") and error.context:
        error = closest_alternative(error.context)
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
    if error.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        return f"'{path}' = {error.instance!r} is out of range; allowed: {allowed_range(error.schema)}"
    return f"'{path}': {error.message}"


def allowed_range(schema: dict) -> str:
    """``{exclusiveMinimum: 0, maximum: 1}`` -> ``'0 < value <= 1'``."""
    low = next((f"{schema[k]} {'<' if k.startswith('exclusive') else '<='} " for k in ("exclusiveMinimum", "minimum")
                if k in schema), "")
    high = next((f" {'<' if k.startswith('exclusive') else '<='} {schema[k]}" for k in ("exclusiveMaximum", "maximum")
                 if k in schema), "")
    return f"{low}value{high}"


def closest_alternative(errors):
    """The error of the alternative (of a ``oneOf``/``anyOf``) the value was most likely meant as: one whose
    type fits, with the fewest errors, and in it the error that got deepest into the value
    (``{fraction: 1.5}`` is a fraction out of range, not a wrong choice among the strings ``none``/``official``)."""
    from jsonschema.exceptions import best_match

    branches: dict = {}
    for error in errors:
        branches.setdefault(error.schema_path[0] if error.schema_path else None, []).append(error)

    def misfit(error) -> bool:
        return not error.relative_path and (error.validator == "type" or (
            error.validator == "enum" and isinstance(error.instance, (dict, list))))

    closest = min(branches.values(), key=lambda errs: (any(map(misfit, errs)), len(errs)))
    deepest = max(len(e.relative_path) for e in closest)
    return best_match([e for e in closest if len(e.relative_path) == deepest])


def _did_you_mean(value: Any, allowed) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [str(a) for a in allowed], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_choice(value: str, allowed, where: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not allowed{_did_you_mean(value, list(allowed))}; allowed values: {sorted(allowed)}")


# --------------------------------------------------------------------------------------------
# what a config may name: the registry (fedrepro.registry)

def method_schema(name: str) -> dict:
    from .registry import METHODS

    return METHODS.get(name)["schema"]


def model_schema(family: str) -> dict:
    from .registry import MODELS

    return MODELS.get(family)["schema"]


def input_kind(family: str) -> str:
    """What a model family trains on: ``features``, ``images`` or ``image_text``."""
    from .registry import MODELS

    return MODELS.get(family)["input"]


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


PROTOCOLS = ("clean", "paper")
# the paper protocol computes as the authors did: fp32 unless a paper file names the authors' own precision
# for a method (protocols: {paper: {train: {precision: ...}}}, e.g. FACMIC's and FAA-CLIP's fp16_weights)
PAPER_PRECISION = "fp32"


class Project:
    """The validated configuration of every active paper, and everything derived from it."""

    def __init__(self, config: dict, root: str | Path = ".", configfiles: list[str] | None = None):
        self.root = Path(root)
        # the files the configuration was read from (none: the default config/config.yaml; None: unknown), which
        # a command a message suggests must name: `snakemake ... --configfile=...`
        self.configfiles = None if configfiles is None else [str(f) for f in configfiles]
        if "protocol" in config:
            raise ConfigError(f"config: 'protocol: {config['protocol']}' is now a list, 'protocols: [{config['protocol']}]' "
                              f"(results of each protocol live in their own folder: results/runs/<protocol>/...)")
        self.config = validate(copy.deepcopy(config), _schema(str(self.root.resolve()), "config.schema.yaml"), "config")
        paths.use_results_dir(self.config["results_dir"])
        self.papers: dict[str, dict] = {}
        self._train_configs: dict[tuple[str, str, str, str], dict] = {}
        self._run_configs: dict[RunKey, dict] = {}
        paper_dir = self.root / self.config["paper_dir"]
        available = sorted(path.stem for path in paper_dir.glob("*.yaml"))
        self.overlays: dict[str, Overlay] = {}
        for name in self.config["papers"]:
            check_choice(name, available, f"config: papers (files in {self.config['paper_dir']})")
            path = paper_dir / f"{name}.yaml"
            paper = load_yaml(path)
            if not isinstance(paper, dict):
                raise ConfigError(f"{path}: expected a mapping at the top level")
            if "base" in paper:
                overlay = Overlay(paper, self.root, str(path))
                paper = overlay.paper((self.config.get("variants") or {}).get(name))
                self.overlays[name] = overlay
            validate(paper, _schema(str(self.root.resolve()), "paper.schema.yaml"), str(path))
            if paper["paper"] != name:
                raise ConfigError(f"{path}: 'paper' is {paper['paper']!r} but the file is for {name!r}")
            self.papers[name] = paper
            self._check_paper(paper, str(path))
        self._check_test_data_use()

    def snakemake_config_args(self) -> str:
        """What a suggested `snakemake` command needs to read this configuration: its files, in order (one with
        ``=``, so that no target is read as a second file; several before another option ends the list)."""
        if self.configfiles is None:
            return "--configfile=<your config>"
        if len(self.configfiles) == 1:
            return f"--configfile={shlex.quote(self.configfiles[0])}"
        return f"--configfile {' '.join(map(shlex.quote, self.configfiles))}" if self.configfiles else ""

    @property
    def protocols(self) -> list[str]:
        """The protocols every table and figure is built for (``protocols`` of the config)."""
        return self.config["protocols"]

    @property
    def seeds(self) -> list[int]:
        return self.config["seeds"]

    # ---- checks that need more than the schema ---------------------------------------------
    def _check_paper(self, paper: dict, where: str) -> None:
        from .registry import DATASETS, FIGURE_KINDS, METHODS, TABLE_KINDS

        for name, setting in paper["settings"].items():
            check_choice(setting["dataset"], DATASETS.names(), f"{where}: settings/{name}/dataset")
            check_split(setting["split"], DATASETS.get(setting["dataset"]).obj.classes, f"{where}: settings/{name}/split")
            for protocol, override in setting.get("protocols", {}).items():
                at = f"{where}: settings/{name}/protocols/{protocol}"
                dataset = override.get("dataset", setting["dataset"])
                check_choice(dataset, DATASETS.names(), f"{at}/dataset")
                if DATASETS.get(dataset).obj.classes != DATASETS.get(setting["dataset"]).obj.classes:
                    raise ConfigError(f"{at}/dataset: {dataset!r} has other classes than {setting['dataset']!r}; "
                                      f"a setting reads datasets of the same classes under every protocol")
                if "split" in override:
                    check_split(override["split"], DATASETS.get(dataset).obj.classes, f"{at}/split")
        for name, variant in paper["methods"].items():
            algorithm = variant.get("method", name)
            check_choice(algorithm, METHODS.names(), f"{where}: methods/{name}/method")
            validate(variant.setdefault("params", {}), method_schema(algorithm), f"{where}: methods/{name}/params")
            for protocol, override in variant.get("protocols", {}).items():
                validate(deep_merge(variant["params"], override.get("params")), method_schema(algorithm),
                         f"{where}: methods/{name}/protocols/{protocol}/params")
        for setting in paper["settings"]:
            for method in paper["methods"]:
                for protocol in PROTOCOLS:
                    train = self.train_config(paper["paper"], setting, method, protocol)  # validates the merged block
                    self._check_selection(train, f"{where}: settings/{setting} x methods/{method} (protocol {protocol})")
        for name, task in paper.get("downstream", {}).items():
            check_choice(task["dataset"], DATASETS.names(), f"{where}: downstream/{name}/dataset")
        for table_name, table in paper.get("tables", {}).items():
            check_choice(table["kind"], TABLE_KINDS.names(), f"{where}: tables/{table_name}/kind")
            for s in table.get("settings", []):
                check_choice(s, paper["settings"], f"{where}: tables/{table_name}/settings")
            check_table_names(paper, table, f"{where}: tables/{table_name}")
            for protocol in PROTOCOLS:
                for cell in self.resolved_cells(paper["paper"], table_name, protocol):
                    self._check_cell(paper, cell, f"{where}: tables/{table_name}/{cell['where']}")
                    selection = table.get("selection") or {}
                    if selection.get("rule") == "one_round" and not cell["task"]:   # the round is chosen on these
                        self._check_cell(paper, {**cell, "eval": selection["eval"], "metric": selection["metric"]},
                                         f"{where}: tables/{table_name}/selection")
        for fig_name, fig in paper.get("figures", {}).items():
            check_choice(fig["kind"], FIGURE_KINDS.names(), f"{where}: figures/{fig_name}/kind")
            for s in fig.get("settings", []):
                check_choice(s, paper["settings"], f"{where}: figures/{fig_name}/settings")
            for m in fig.get("methods", []):
                check_choice(m, paper["methods"], f"{where}: figures/{fig_name}/methods")
            for t in fig.get("tables", []):
                check_choice(t, paper.get("tables", {}), f"{where}: figures/{fig_name}/tables")
            self._check_figure_names(paper, fig_name, f"{where}: figures/{fig_name}")

    def _check_selection(self, train: dict, where: str) -> None:
        """A run's ``selection.metric`` is a metric its task reports: best_val ranks rounds on its validation
        column, and with an unknown one the run would report its last round without a word."""
        from .fl.evaluation import TASK_METRICS
        from .registry import MODELS

        task = MODELS.get(train["model"]["family"]).obj.task
        allowed = [m for m in TASK_METRICS[task] if m != "n"]       # n counts images: it ranks no round
        check_choice(train["selection"]["metric"], allowed, f"{where}: train/selection/metric (what a {task} run "
                                                            f"reports; set in defaults, the setting's or the method's train)")

    def _check_figure_names(self, paper: dict, name: str, where: str) -> None:
        """A figure's ``metric(s)`` and ``eval(s)`` name what the runs it draws report, checked as a table cell's
        for every run it reads (only the names its kind reads from runs: ``reads`` of its registration)."""
        from .registry import FIGURE_KINDS

        fig = paper["figures"][name]
        reads = FIGURE_KINDS.get(fig["kind"])["reads"]

        def named(key: str) -> tuple[str, list]:        # -> (the key as written, the names it gives)
            if key not in reads:
                return key, []
            plural = f"{key}s"
            return (plural, fig[plural]) if plural in fig else (key, [fig[key]] if key in fig else [])

        (metric_key, metrics), (eval_key, evals) = named("metric"), named("eval")
        for protocol in PROTOCOLS:
            runs = self.figure_runs(paper["paper"], name, protocol)
            for run_protocol, setting, method in dict.fromkeys((k.protocol, k.setting, k.method) for k in runs):
                for metric in metrics or [None]:
                    for eval_name in evals or [None]:
                        cell = {"setting": setting, "method": method, "protocol": run_protocol, "task": None,
                                "metric": metric, "eval": eval_name}
                        self._check_cell(paper, cell, f"{where} ({setting} x {method})", keys=(metric_key, eval_key))

    def _check_cell(self, paper: dict, cell: dict, where: str, keys: tuple[str, str] = ("metric", "eval")) -> None:
        """A table cell's ``metric`` and ``eval`` name something its run (or downstream result) reports (None: not
        named; ``keys``: what the configuration calls them)."""
        from .registry import METHODS, MODELS

        if cell["task"]:
            from .downstream import TASK_METRICS, fraction_key

            task = paper["downstream"][cell["task"]]
            check_choice(cell["eval"], [fraction_key(f) for f in task["fractions"]],
                         f"{where}/eval (the training fractions of downstream/{cell['task']})")
            check_choice(cell["metric"], TASK_METRICS[task["kind"]], f"{where}/metric (what a {task['kind']} reports)")
            return
        from .fl.evaluation import TASK_METRICS, eval_keys
        from .train import SUMMARY_METRICS

        train = self.train_config(paper["paper"], cell["setting"], cell["method"], cell["protocol"])
        task = MODELS.get(train["model"]["family"]).obj.task
        summary = [f"{section}.{name}" for section, names in SUMMARY_METRICS.items() for name in names]
        if cell["metric"] is not None:
            check_choice(cell["metric"], [*TASK_METRICS[task], *summary], f"{where}/{keys[0]} (what a {task} run reports)")
        if cell["metric"] in summary or cell["eval"] is None:
            return      # a run's total, not per eval set; or no eval set named
        algorithm = METHODS.get(paper["methods"][cell["method"]].get("method", cell["method"])).obj
        prefixes = algorithm.eval_prefixes(self.method_params(paper["paper"], cell["method"], cell["protocol"]))
        clients = expected_clients(self.setting(paper["paper"], cell["setting"], cell["protocol"])["split"])
        known = eval_keys(task, [f"client{i}" for i in range(clients if clients is not None else 1)], prefixes)
        # with a client count only the data can tell, any client<k> stands for client0
        named = cell["eval"] if clients is not None else re.sub(r"client\d+", "client0", cell["eval"])
        if named not in known:
            count = f"{clients} clients" if clients is not None else "clients client0, client1, ..."
            shown = known if len(known) <= 24 else [*known[:24], "..."]
            raise ConfigError(f"{where}/{keys[1]}: {cell['eval']!r} is not an eval set of setting {cell['setting']!r} ({count})"
                              f"{_did_you_mean(cell['eval'], known)}; allowed values: {shown}")

    def _check_test_data_use(self) -> None:
        """No run of the clean protocol reads its test data, unless its train block opts in with
        ``allow_test_selection: true``: neither a selection rule that picks on the test set (``best_test``;
        a table's ``one_round`` re-reads only runs selected that way) nor, for a domain-adaptation method, the
        global test set as its unlabeled target (a split without ``reference_fraction``). The paper protocol
        is the authors' and allows both. Refused here, before any job, naming what asks for it."""
        from .fl.selection import TEST_RULES, opted_in, resolve_rule
        from .registry import METHODS

        users: dict[tuple[str, str, str], list[str]] = {}
        for protocol, paper, table in self.tables():
            for cell in self.resolved_cells(paper, table, protocol):
                if cell["protocol"] == "clean":
                    users.setdefault((paper, cell["setting"], cell["method"]), []).append(f"tables/{table}")
        for protocol, paper, figure in self.figures():
            for key in self.figure_runs(paper, figure, protocol):
                if key.protocol == "clean":
                    users.setdefault((paper, key.setting, key.method), []).append(f"figures/{figure}")
        problems = []
        for (paper, setting, method), used_by in users.items():
            train = self.train_config(paper, setting, method, "clean")
            if opted_in(train):
                continue
            asks = []
            rule = resolve_rule(train["selection"]["rule"], "clean")
            if rule in TEST_RULES:
                asks.append(f"selection rule {rule!r} picks the reported round on the test set")
            algorithm = self.papers[paper]["methods"][method].get("method", method)
            split = self.setting(paper, setting, "clean")["split"]
            if (METHODS.get(algorithm).obj.reads_target(self.method_params(paper, method, "clean"))
                    and float(split.get("reference_fraction", 0)) <= 0):
                asks.append("its domain-adaptation target would be the global test set (the split has no "
                            "reference_fraction)")
            if asks:
                where = f"{self.config['paper_dir']}/{paper}.yaml: settings/{setting} x methods/{method}"
                problems.append(f"{where} (protocol clean; used by {', '.join(dict.fromkeys(used_by))}): "
                                f"{' and '.join(asks)}")
        if problems:
            listed = "\n".join(problems[:5]) + (f"\n... and {len(problems) - 5} more" if len(problems) > 5 else "")
            raise ConfigError(
                f"{listed}\nThe clean protocol reads no test data. Run these under the paper protocol (protocols: "
                f"[paper] in the config, or protocol: paper on the setting or the table), choose another selection "
                f"rule (best_val, last, last_k_mean) or a reference_fraction, or opt in explicitly with "
                f"allow_test_selection: true in the train block (the paper's defaults, the setting's or the method's "
                f"train:); the run manifest, metrics.json and the table captions then record it.")

    def run_key(self, paper: str, setting: str, method: str, seed: int, protocol: str | None = None) -> RunKey:
        """The run of (paper, setting, method, seed) under ``protocol`` (default: the first configured),
        or under the protocol its setting pins."""
        return RunKey(paper, self.protocol(paper, setting, protocol or self.protocols[0]), setting, method, seed)

    # ---- protocols ---------------------------------------------------------------------------
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

    # ---- runs --------------------------------------------------------------------------
    def train_config(self, paper: str, setting: str, method: str, protocol: str) -> dict:
        """The merged, validated train block of (paper, setting, method) under ``protocol``; resolved
        once, copied out (every seed's run asks for it, and validation is the slow part of planning)."""
        key = (paper, setting, method, protocol)
        if key not in self._train_configs:
            self._train_configs[key] = self._resolve_train_config(*key)
        return copy.deepcopy(self._train_configs[key])

    def _resolve_train_config(self, paper: str, setting: str, method: str, protocol: str) -> dict:
        p = self.papers[paper]
        # the paper's defaults for this protocol (protocols: {paper: {train: ...}}), then the setting's and the method's
        train = deep_merge(p["defaults"], p.get("protocols", {}).get(protocol, {}).get("train"))
        train = deep_merge(deep_merge(train, p["settings"][setting].get("train")), p["methods"][method].get("train"))
        train = deep_merge(train, self.protocol_override(paper, method, protocol).get("train"))
        if paper in self.overlays:
            train = self.overlays[paper].apply_train(train, method)
        if protocol == "paper":
            train.setdefault("precision", PAPER_PRECISION)
        where = f"{paper}: settings/{setting} x methods/{method}: train"
        missing = [k for k in ("rounds", "batch_size", "model", "optimizer") if k not in train]
        if missing:
            raise ConfigError(f"{where}: missing {missing} (set them in defaults, the setting or the method)")
        from .registry import MODELS

        check_choice(train["model"].get("family"), MODELS.names(), f"{where}/model/family")
        validate(train["model"], model_schema(train["model"]["family"]), f"{where}/model")
        schema = _schema(str(self.root.resolve()), "paper.schema.yaml")
        return validate(train, {"$defs": schema["$defs"], **schema["$defs"]["resolved_train"]}, where)

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

    def split_id(self, paper: str, setting: str, seed: int, protocol: str = "clean") -> str:
        s = self.setting(paper, setting, protocol)
        spec = {k: v for k, v in s["split"].items() if k != "seed"}
        split_seed = self.split_seed(paper, setting, seed, protocol)
        alpha = f"-a{spec['alpha']:g}" if "alpha" in spec else ""
        clients = f"-c{spec['clients']}" if "clients" in spec else ""
        return f"{s['dataset']}-{spec['kind']}{alpha}{clients}-s{split_seed}-{hash_obj([s['dataset'], spec], 6)}"

    def count_settings(self, paper: str, kind: str, name: str) -> list[str]:
        """Settings whose split count files a table (``kind="tables"``) or figure reads directly."""
        return list(self.papers[paper][kind][name].get("settings", []))

    def splits(self) -> dict[str, dict]:
        """Every split some run needs, plus those that tables and figures read directly (their
        settings at the first seed), even where no run uses them."""
        needed = [(key.paper, key.setting, key.seed, key.protocol) for key in self.runs()]
        seed = self.seeds[0]
        for paper_name, paper in self.papers.items():
            for kind in ("tables", "figures"):
                for name in paper.get(kind, {}):
                    needed += [(paper_name, s, seed, protocol) for s in self.count_settings(paper_name, kind, name)
                               for protocol in self.protocols]
        out = {}
        for paper_name, setting, run_seed, protocol in needed:
            s = self.setting(paper_name, setting, protocol)
            out[self.split_id(paper_name, setting, run_seed, protocol)] = {
                "dataset": s["dataset"],
                "spec": {k: v for k, v in s["split"].items() if k != "seed"},
                "seed": self.split_seed(paper_name, setting, run_seed, protocol),
            }
        return out

    def jpeg_draft(self, protocol: str) -> bool:
        """Whether runs of ``protocol`` decode large JPEGs with DCT scaling (``data.jpeg_draft``; auto = not
        under the paper protocol, whose pixels are the authors')."""
        setting = self.config["data"]["jpeg_draft"]
        return protocol != "paper" if setting == "auto" else bool(setting)

    def features_key(self, model: dict, draft: bool) -> str | None:
        if input_kind(model["family"]) != "features":
            return None
        enc = model.get("encoder", {})
        size = f"-{enc['image_size']}px" if enc.get("image_size") else ""
        tag = re.sub(r"[^A-Za-z0-9.]+", "_", Path(enc["pretrained"]).stem if "/" in enc["pretrained"] else enc["pretrained"])
        full = "" if draft else "-full"   # images decoded without JPEG DCT scaling
        # the encoder's precision, where it is not fp32 (the hash holds it too; an fp32 spec's key is as before)
        half = "-fp16w" if enc.get("precision", "fp32") == "fp16_weights" else ""
        return f"{enc['name']}-{tag}-{enc['preprocess']}{size}{full}{half}-{hash_obj(enc, 6)}"

    def features(self) -> dict[tuple[str, str], dict]:
        """(dataset, features key) -> {"encoder": spec, "jpeg_draft": bool}, for every feature cache some run needs."""
        out = {}
        for key in self.runs():
            run = self.run_config(key)
            if run["features"]:
                out[(run["dataset"], run["features"]["key"])] = {"encoder": run["features"]["encoder"],
                                                                 "jpeg_draft": run["jpeg_draft"]}
        return out

    def weights(self) -> dict:
        """id -> :class:`~fedrepro.models.weights.WeightSpec` of every pretrained resource some job loads:
        the models of the runs (training; downstream and embedding jobs rebuild the same models, with no
        more weights) and the encoders of the feature caches."""
        from .models.weights import encoder_weights, weight_specs

        out = {}
        for key in self.runs():
            out.update((spec.id, spec) for spec in weight_specs(self.run_config(key)["train"]["model"]))
        for job in self.features().values():
            out.update((spec.id, spec) for spec in encoder_weights(job["encoder"]))
        return dict(sorted(out.items()))

    def image_cache_paths(self, dataset: str, model: dict, draft: bool) -> dict[str, str] | None:
        """{"train": file, "eval": file} of the decode-once image caches an image run reads (None for
        runs on cached features, or with ``data.image_cache: false``)."""
        if input_kind(model["family"]) == "features" or not self.config["data"]["image_cache"]:
            return None
        from .models.decoding import decode_specs

        specs = decode_specs(model, draft=draft)
        return {part: paths.image_cache(dataset, spec.key) for part, spec in specs.items()}

    def image_caches(self) -> dict[str, dict]:
        """Cache file -> {"dataset", "spec"} for every decode-once image cache some run needs."""
        out = {}
        for key in self.runs():
            run = self.run_config(key)
            for path in (run["paths"]["images"] or {}).values():
                out[path] = {"dataset": run["dataset"], "spec": Path(path).name.removesuffix(".u8")}
        return out

    def run_config(self, key: RunKey) -> dict:
        """The complete, explicit configuration of one training job (resolved once, copied out)."""
        if key not in self._run_configs:
            self._run_configs[key] = self._resolve_run_config(key)
        return copy.deepcopy(self._run_configs[key])

    def _resolve_run_config(self, key: RunKey) -> dict:
        paper = self.papers[key.paper]
        setting = self.setting(key.paper, key.setting, key.protocol)
        variant = paper["methods"][key.method]
        train = self.train_config(key.paper, key.setting, key.method, key.protocol)
        draft = self.jpeg_draft(key.protocol)
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

    def downstream_jobs(self) -> dict[str, tuple[RunKey, str]]:
        """``<run path>/<task>`` -> (run, task) for every downstream result some table needs."""
        jobs = {}
        for protocol, paper_name, table in self.tables():
            for key, task in self.table_downstream(paper_name, table, protocol):
                jobs[f"{key.path}/{task}"] = (key, task)
        return jobs

    def runs(self) -> list[RunKey]:
        """Every run some table or figure needs, under every configured protocol, once per seed."""
        needed: dict[RunKey, None] = {}
        for protocol, paper_name, table in self.tables():
            needed.update(dict.fromkeys(self.table_runs(paper_name, table, protocol)))
        for protocol, paper_name, figure in self.figures():
            needed.update(dict.fromkeys(self.figure_runs(paper_name, figure, protocol)))
        return list(needed)

    # ---- tables and figures -------------------------------------------------------------
    def resolved_cells(self, paper: str, table: str, protocol: str) -> list[dict]:
        """Every run cell of a table built for ``protocol``, resolved (derived 'mean_of' and blank cells
        excluded); a cell's own ``protocol`` (row, column or table) or its setting's wins."""
        spec = self.papers[paper]["tables"][table]
        if spec["kind"] != "runs":
            return []
        out = []
        for i, row in enumerate(spec.get("rows", [])):
            for col in spec.get("columns", []):
                cell = resolve_cell(spec, row, col)
                if cell is not None:
                    cell["protocol"] = self.protocol(paper, cell["setting"], cell["protocol"] or protocol)
                    cell["eval"] = column_eval(col, cell["protocol"]) or cell["eval"]
                    cell["where"] = f"rows/{row.get('label') or row.get('method') or i} x columns/{col['label']}"
                    out.append(cell)
        return out

    def table_runs(self, paper: str, table: str, protocol: str) -> list[RunKey]:
        cells = dict.fromkeys((c["protocol"], c["setting"], c["method"]) for c in self.resolved_cells(paper, table, protocol))
        return [RunKey(paper, p, s, m, seed) for p, s, m in cells for seed in self.seeds]

    def table_downstream(self, paper: str, table: str, protocol: str) -> list[tuple[RunKey, str]]:
        cells = dict.fromkeys((c["protocol"], c["setting"], c["method"], c["task"])
                              for c in self.resolved_cells(paper, table, protocol) if c["task"])
        return [(RunKey(paper, p, s, m, seed), t) for p, s, m, t in cells for seed in self.seeds]

    def figure_runs(self, paper: str, figure: str, protocol: str) -> list[RunKey]:
        fig = self.papers[paper]["figures"][figure]
        return [RunKey(paper, self.protocol(paper, s, protocol), s, m, seed)
                for s in fig.get("settings", []) for m in fig.get("methods", []) for seed in self.seeds]

    def tables(self) -> Iterator[tuple[str, str, str]]:
        """(protocol, paper, table) of every table to build."""
        for protocol in self.protocols:
            for paper_name, paper in self.papers.items():
                for table in paper.get("tables", {}):
                    yield protocol, paper_name, table

    def figures(self) -> Iterator[tuple[str, str, str]]:
        """(protocol, paper, figure) of every figure to build."""
        for protocol in self.protocols:
            for paper_name, paper in self.papers.items():
                for figure in paper.get("figures", {}):
                    yield protocol, paper_name, figure

    def datasets(self) -> list[str]:
        from .registry import DATASETS

        names = {split["dataset"] for split in self.splits().values()}
        names.update(self.papers[key.paper]["downstream"][task]["dataset"] for key, task in self.downstream_jobs().values())
        for name in list(names):
            names.update(DATASETS.get(name).obj.depends_on)
        return sorted(names)


class Overlay:
    """A paper file over another (``base:``; workflow/schemas/overlay.schema.yaml): the base file's method variants,
    with their params and train blocks, run on the overlay's settings, at one scale of rounds, local steps and
    batch size for every run, with the models swapped per family. The evidence run (config/evidence.yaml) is made of these:
    every variant of the full grid, on offline data, with the paper's hyper-parameters otherwise."""

    def __init__(self, spec: dict, root: Path, where: str):
        schema = _schema(str(root.resolve()), "overlay.schema.yaml")
        self.spec = validate(copy.deepcopy(spec), schema, where)
        self.where = where
        base_path = root / self.spec["base"]
        self.base = load_yaml(base_path)
        if not isinstance(self.base, dict) or "base" in self.base:
            raise ConfigError(f"{where}: base {self.spec['base']} must be a paper file (not another overlay)")
        validate(self.base, _schema(str(root.resolve()), "paper.schema.yaml"), str(base_path))
        if self.base["paper"] != self.spec["paper"]:
            raise ConfigError(f"{where}: base {self.spec['base']} is paper {self.base['paper']!r}, not {self.spec['paper']!r}")
        for method in self.spec["methods"]:
            check_choice(method, self.base["methods"], f"{where}: methods (the variants of {self.spec['base']})")

    def variants(self) -> list[str]:
        """Every method variant the base file runs: a row of one of its tables or a method of one of its figures."""
        used: dict[str, None] = {}
        for table in self.base.get("tables", {}).values():
            for row in table.get("rows", []):
                used.update(dict.fromkeys([row["method"]] if "method" in row else []))
                used.update(dict.fromkeys((row.get("methods") or {}).values()))
            for col in table.get("columns", []):
                used.update(dict.fromkeys([col["method"]] if "method" in col else []))
        for figure in self.base.get("figures", {}).values():
            used.update(dict.fromkeys(figure.get("methods", [])))
        return [m for m in self.base["methods"] if m in used]

    def paper(self, only: list[str] | None = None) -> dict:
        """The paper file this overlay stands for: the base's defaults, protocols and variants (each with the
        overlay's additions), the overlay's settings and one table of every variant x setting."""
        variants = self.variants()
        for name in only or []:
            check_choice(name, variants, f"config: variants/{self.spec['paper']} (the variants of {self.spec['base']})")
        rows = [m for m in variants if not only or m in only]
        methods = {m: deep_merge(self.base["methods"][m], {k: v for k, v in self.spec["methods"].get(m, {}).items()
                                                          if k != "train"}) for m in rows}
        table = {"title": f"Every method variant of {self.spec['base']} on the evidence data "
                          f"({self.spec['table']['metric']}, {self.spec['table']['eval']}, %)",
                 "metric": self.spec["table"]["metric"], "eval": self.spec["table"]["eval"],
                 "rows": [{"method": m} for m in rows],
                 "columns": [{"label": s.get("label", name), "setting": name} for name, s in self.spec["settings"].items()],
                 "note": f"Scaled-down runs of the full grid's variants ({self.where}); not comparable to the paper."}
        paper = {"paper": self.spec["paper"], "title": self.spec["title"], "defaults": self.base["defaults"],
                 "settings": self.settings(), "methods": methods, "tables": {"evidence": table}}
        for key in ("notes", "stand_in", "protocols"):
            source = self.base if key == "protocols" else self.spec
            if key in source:
                paper[key] = source[key]
        return paper

    def stands_for(self, setting: str) -> str:
        """The base file's setting an overlay setting stands for (``stands_for``)."""
        return self.spec["settings"][setting]["stands_for"]

    def settings(self) -> dict:
        """The overlay's settings; one that ``stands_for`` a base setting trains as that one does (its train block:
        FACMIC's 100 rounds of 199 steps on BT, FedIIC's learning rate on Real), before the overlay's scale."""
        out = {}
        for name, setting in self.spec["settings"].items():
            setting = {k: v for k, v in setting.items() if k != "stands_for"}
            base = self.stands_for(name)
            check_choice(base, self.base["settings"], f"{self.where}: settings/{name}/stands_for")
            setting["train"] = deep_merge(self.base["settings"][base].get("train") or {}, setting.get("train"))
            out[name] = setting
        return out

    def apply_train(self, train: dict, method: str) -> dict:
        """A run's merged train block at the overlay's scale: its train additions, the family's model swap, the
        variant's own additions, then rounds, local steps and batch size scaled."""
        train = deep_merge(train, self.spec["train"])
        train["model"] = {**train["model"], **self.spec["models"].get(train["model"]["family"], {})}
        train = deep_merge(train, self.spec["methods"].get(method, {}).get("train"))
        train["rounds"] = scaled(train["rounds"], self.spec["scale"]["rounds"])
        train["batch_size"] = scaled(train["batch_size"], self.spec["scale"]["batch_size"])
        if "steps" in train.get("local", {}):
            train["local"]["steps"] = scaled(train["local"]["steps"], self.spec["scale"]["steps"])
        return train

    def scale_params(self, algorithm: str, params: dict) -> dict:
        """Method params whose schema says they count rounds or local steps (``x-counts``), scaled like them."""
        out = dict(params)
        for key, prop in method_schema(algorithm).get("properties", {}).items():
            kind = prop.get("x-counts")
            if kind and isinstance(out.get(key), int) and not isinstance(out[key], bool):
                out[key] = scaled(out[key], self.spec["scale"][kind])
        return out


def scaled(value: int, factor: float) -> int:
    """ceil(value x factor), at least 1 where value was (0 stays 0: 'none of it')."""
    return value if value <= 0 else max(1, math.ceil(value * factor - 1e-9))


def check_split(split: dict, classes, where: str) -> None:
    """What the schema cannot see in a split: a registered kind, class names the dataset has, ratios that add
    up (the train part is what val and test leave, so a train ratio that does not fit would be ignored)."""
    from .registry import SPLITTERS

    check_choice(split["kind"], SPLITTERS.names(), f"{where}/kind")
    if "per_source" in split:
        check_split(split["per_source"], classes, f"{where}/per_source")
    for name in (split.get("subset") or {}).get("classes", []):
        check_choice(name, classes, f"{where}/subset/classes (the dataset's classes)")
    ratios = split.get("ratios")
    if ratios:
        total = sum(ratios.values())
        if ("train" in ratios and abs(total - 1) > 1e-6) or total > 1 + 1e-6:
            raise ConfigError(f"{where}/ratios: {ratios} add up to {total:g}, not 1; allowed: train + val + test = 1 "
                              f"(e.g. train: {max(0.0, 1 - ratios.get('val', 0) - ratios.get('test', 0)):g} with these "
                              f"val and test)")


def expected_clients(split: dict) -> int | None:
    """How many clients a split makes, where its spec says (``clients``, or one per listed source of
    ``by_source``, times the clients of ``per_source``); None where only the data can tell."""
    if split["kind"] != "by_source":
        return split.get("clients")
    if not split.get("sources"):
        return None
    inner = expected_clients(split["per_source"]) if "per_source" in split else 1
    return None if inner is None else inner * len(split["sources"])


def check_table_names(paper: dict, table: dict, where: str) -> None:
    """Every setting, method and task a table's rows and columns name exists in the paper file."""
    kinds = {"setting": paper["settings"], "method": paper["methods"], "task": paper.get("downstream", {})}
    for axis, entries in (("rows", table.get("rows", [])), ("columns", table.get("columns", []))):
        for i, entry in enumerate(entries):
            at = f"{where}/{axis}/{entry.get('label') or entry.get('method') or i}"
            for key, allowed in kinds.items():
                if key in entry:
                    check_choice(entry[key], allowed, f"{at}/{key}")
                for label, name in (entry.get(f"{key}s") or {}).items() if key != "task" else ():
                    check_choice(name, allowed, f"{at}/{key}s/{label}")


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


def load_project(configfiles: list[str | Path] | None = None, overrides: dict | None = None, root: str | Path = ".") -> Project:
    """Load and merge config files (later ones win) the way ``snakemake --configfile`` does."""
    config: dict = {}
    for path in configfiles or [Path(root) / "config/config.yaml"]:
        config = deep_merge(config, load_yaml(path) or {})
    return Project(deep_merge(config, overrides), root, configfiles=configfiles or [])
