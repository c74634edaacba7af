"""The checks a configuration must pass before any job runs, beyond the shape its schemas check: names the registry
and the paper files must know, table cells and figures that name what their runs report, split ratios, and the
clean protocol's rule that no run reads its test data. Each error names the key and what is allowed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from .files import PROTOCOLS, ConfigError, check_choice, deep_merge, did_you_mean, method_schema, validate

if TYPE_CHECKING:
    from .loaded import LoadedConfig
    from .plan import Plan
    from .resolve import Resolver


class Checks:
    """The checks of one loaded configuration, with its resolver and plan (the checks resolve train blocks and table
    cells as the jobs will)."""

    def __init__(self, loaded: LoadedConfig, resolver: Resolver, plan: Plan):
        self.loaded = loaded
        self.papers = loaded.papers
        self.config = loaded.config
        self.resolver = resolver
        self.plan = plan

    def run(self) -> None:
        """Every check, for every paper, then the clean protocol's rule on test data."""
        for name, paper in self.papers.items():
            self.paper(paper, self.loaded.paper_files[name])
            self.client_counts(name, self.loaded.paper_files[name])
        self.test_data_use()
        self.runs_as_trained()

    def client_counts(self, paper: str, where: str) -> None:
        """No split asks for more clients (times ``min_train``) than its dataset has images, where that is known
        before any job: the dataset's manifest is here. The split job would refuse it after prepare, listing
        every empty client."""
        from .. import paths

        for name in self.papers[paper]["settings"]:
            for protocol in PROTOCOLS:
                setting = self.resolver.setting(paper, name, protocol)
                clients = expected_clients(setting["split"])
                images = manifest_rows(paths.manifest(setting["dataset"]))
                per_client = max(1, int(setting["split"].get("min_train", 1)))
                if clients and images is not None and clients * per_client > images:
                    at = f"settings/{name}" + ("/protocols/" + protocol if "split" in
                                               setting.get("protocols", {}).get(protocol, {}) else "")
                    raise ConfigError(f"{where}: {at}/split/clients: {clients} clients, but {setting['dataset']} has "
                                      f"{images} images ({paths.manifest(setting['dataset'])}), and each client needs "
                                      f"at least {per_client} to train on; use at most {images // per_client} clients")

    def paper(self, paper: dict, where: str) -> None:
        from ..registry import DATASETS, FIGURE_KINDS, METHODS, TABLE_KINDS

        for name, setting in paper["settings"].items():
            check_choice(setting["dataset"], DATASETS.names(), f"{where}: settings/{name}/dataset")
            check_files(setting["dataset"])
            check_split(setting["split"], DATASETS.get(setting["dataset"]).obj.classes, f"{where}: settings/{name}/split")
            for protocol, override in setting.get("protocols", {}).items():
                at = f"{where}: settings/{name}/protocols/{protocol}"
                dataset = override.get("dataset", setting["dataset"])
                check_choice(dataset, DATASETS.names(), f"{at}/dataset")
                check_files(dataset)
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
                    train = self.resolver.train_config(paper["paper"], setting, method, protocol)  # validates the merged block
                    self.selection(train, f"{where}: settings/{setting} x methods/{method} (protocol {protocol})")
        for name, task in paper.get("downstream", {}).items():
            check_choice(task["dataset"], DATASETS.names(), f"{where}: downstream/{name}/dataset")
        for table_name, table in paper.get("tables", {}).items():
            check_choice(table["kind"], TABLE_KINDS.names(), f"{where}: tables/{table_name}/kind")
            for s in table.get("settings", []):
                check_choice(s, paper["settings"], f"{where}: tables/{table_name}/settings")
            check_table_names(paper, table, f"{where}: tables/{table_name}")
            self.protocol_comparison(paper["paper"], table_name, f"{where}: tables/{table_name}")
            for protocol in PROTOCOLS:
                for cell in self.resolver.resolved_cells(paper["paper"], table_name, protocol):
                    self.cell(paper, cell, f"{where}: tables/{table_name}/{cell['where']}")
                    selection = table.get("selection") or {}
                    if selection.get("rule") == "one_round" and not cell["task"]:   # the round is chosen on these
                        self.cell(paper, {**cell, "eval": selection["eval"], "metric": selection["metric"]},
                                         f"{where}: tables/{table_name}/selection")
        for fig_name, fig in paper.get("figures", {}).items():
            check_choice(fig["kind"], FIGURE_KINDS.names(), f"{where}: figures/{fig_name}/kind")
            for s in fig.get("settings", []):
                check_choice(s, paper["settings"], f"{where}: figures/{fig_name}/settings")
            for m in fig.get("methods", []):
                check_choice(m, paper["methods"], f"{where}: figures/{fig_name}/methods")
            for t in fig.get("tables", []):
                check_choice(t, paper.get("tables", {}), f"{where}: figures/{fig_name}/tables")
            self.figure_names(paper, fig_name, f"{where}: figures/{fig_name}")

    def protocol_comparison(self, paper: str, table: str, where: str) -> None:
        """A table whose rows or columns put runs of both protocols side by side compares them with equal numerics:
        a difference between a clean and a paper cell must come from what the protocol changes (the leak, the
        authors' bugs), not from precision, JPEG decoding or the pixel pipeline. Refused here, naming the cells."""
        for protocol in PROTOCOLS:
            cells = self.resolver.resolved_cells(paper, table, protocol)
            for axis in ("row", "column"):
                for name in dict.fromkeys(c[axis] for c in cells):
                    line = [c for c in cells if c[axis] == name and not c["task"]]
                    if len({c["protocol"] for c in line}) < 2:
                        continue
                    computed = {c["where"]: self.numerics_of(paper, c) for c in line}
                    if len(set(map(_frozen, computed.values()))) > 1:
                        shown = "; ".join(f"{w} (protocol {c['protocol']}): {describe_numerics(computed[w])}"
                                          for w, c in zip(computed, line))
                        raise ConfigError(
                            f"{where}: {name} compares the clean and the paper protocol, but its cells compute "
                            f"differently: {shown}. A protocol comparison must differ only in what the protocol "
                            f"changes: give these runs the same numerics (one `numerics` for both; no precision or "
                            f"pixels in a protocols: {{<protocol>: {{train: ...}}}} block; README \"Numerics\")")

    def numerics_of(self, paper: str, cell: dict) -> dict:
        """How the run of a table cell computes: its precision (and its frozen encoder's), JPEG decoding and pixels."""
        from ..models.encoders import frozen_encoder_precision

        train = self.resolver.train_config(paper, cell["setting"], cell["method"], cell["protocol"])
        return {"numerics": cell["numerics"], "precision": train["precision"],
                "frozen encoder": frozen_encoder_precision(train["model"]),
                "JPEG decoding": "DCT-scaled" if self.resolver.jpeg_draft(cell["numerics"]) else "full",
                "pixels": train["model"].get("pixels")}

    def selection(self, train: dict, where: str) -> None:
        """A run's ``selection.metric`` is a metric its task reports: best_val ranks rounds on its validation
        column, and with an unknown one the run would report its last round without a word."""
        from ..fl.evaluation import TASK_METRICS
        from ..registry import MODELS

        task = MODELS.get(train["model"]["family"]).obj.task
        allowed = [m for m in TASK_METRICS[task] if m != "n"]       # n counts images: it ranks no round
        check_choice(train["selection"]["metric"], allowed, f"{where}: train/selection/metric (what a {task} run "
                                                            f"reports; set in defaults, the setting's or the method's train)")

    def figure_names(self, paper: dict, name: str, where: str) -> None:
        """A figure's ``metric(s)`` and ``eval(s)`` name what the runs it draws report, checked as a table cell's
        for every run it reads (only the names its kind reads from runs: ``reads`` of its registration)."""
        from ..registry import FIGURE_KINDS

        fig = paper["figures"][name]
        reads = FIGURE_KINDS.get(fig["kind"])["reads"]

        def named(key: str) -> tuple[str, list]:        # -> (the key as written, the names it gives)
            if key not in reads:
                return key, []
            plural = f"{key}s"
            return (plural, fig[plural]) if plural in fig else (key, [fig[key]] if key in fig else [])

        (metric_key, metrics), (eval_key, evals) = named("metric"), named("eval")
        for protocol in PROTOCOLS:
            runs = self.plan.figure_runs(paper["paper"], name, protocol)
            for run_protocol, setting, method in dict.fromkeys((k.protocol, k.setting, k.method) for k in runs):
                for metric in metrics or [None]:
                    for eval_name in evals or [None]:
                        cell = {"setting": setting, "method": method, "protocol": run_protocol, "task": None,
                                "metric": metric, "eval": eval_name}
                        self.cell(paper, cell, f"{where} ({setting} x {method})", keys=(metric_key, eval_key))

    def cell(self, paper: dict, cell: dict, where: str, keys: tuple[str, str] = ("metric", "eval")) -> None:
        """A table cell's ``metric`` and ``eval`` name something its run (or downstream result) reports (None: not
        named; ``keys``: what the configuration calls them)."""
        from ..registry import METHODS, MODELS

        if cell["task"]:
            from ..downstream import TASK_METRICS, fraction_key

            task = paper["downstream"][cell["task"]]
            check_choice(cell["eval"], [fraction_key(f) for f in task["fractions"]],
                         f"{where}/eval (the training fractions of downstream/{cell['task']})")
            check_choice(cell["metric"], TASK_METRICS[task["kind"]], f"{where}/metric (what a {task['kind']} reports)")
            return
        from ..fl.evaluation import TASK_METRICS, eval_keys
        from ..train import SUMMARY_METRICS

        train = self.resolver.train_config(paper["paper"], cell["setting"], cell["method"], cell["protocol"])
        task = MODELS.get(train["model"]["family"]).obj.task
        summary = [f"{section}.{name}" for section, names in SUMMARY_METRICS.items() for name in names]
        if cell["metric"] is not None:
            check_choice(cell["metric"], [*TASK_METRICS[task], *summary], f"{where}/{keys[0]} (what a {task} run reports)")
        if cell["metric"] in summary or cell["eval"] is None:
            return      # a run's total, not per eval set; or no eval set named
        algorithm = METHODS.get(paper["methods"][cell["method"]].get("method", cell["method"])).obj
        prefixes = algorithm.eval_prefixes(self.resolver.method_params(paper["paper"], cell["method"], cell["protocol"]))
        clients = expected_clients(self.resolver.setting(paper["paper"], cell["setting"], cell["protocol"])["split"])
        known = eval_keys(task, [f"client{i}" for i in range(clients if clients is not None else 1)], prefixes)
        # with a client count only the data can tell, any client<k> stands for client0
        named = cell["eval"] if clients is not None else re.sub(r"client\d+", "client0", cell["eval"])
        if named not in known:
            count = f"{clients} clients" if clients is not None else "clients client0, client1, ..."
            shown = known if len(known) <= 24 else [*known[:24], "..."]
            raise ConfigError(f"{where}/{keys[1]}: {cell['eval']!r} is not an eval set of setting {cell['setting']!r} ({count})"
                              f"{did_you_mean(cell['eval'], known)}; allowed values: {shown}")

    def test_data_use(self) -> None:
        """No run of the clean protocol reads its test data, unless its train block opts in with
        ``allow_test_selection: true``: neither a selection rule that picks on the test set (``best_test``;
        a table's ``one_round`` re-reads only runs selected that way) nor, for a domain-adaptation method, the
        global test set as its unlabeled target (a split without ``reference_fraction``). The paper protocol
        is the authors' and allows both. Refused here, before any job, naming what asks for it."""
        users: dict[tuple[str, str, str], list[str]] = {}
        for protocol, paper, table in self.plan.tables():
            for cell in self.resolver.resolved_cells(paper, table, protocol):
                if cell["protocol"] == "clean":
                    users.setdefault((paper, cell["setting"], cell["method"]), []).append(f"tables/{table}")
        for protocol, paper, figure in self.plan.figures():
            for key in self.plan.figure_runs(paper, figure, protocol):
                if key.protocol == "clean":
                    users.setdefault((paper, key.setting, key.method), []).append(f"figures/{figure}")
        problems = []
        for (paper, setting, method), used_by in users.items():
            asks = self.reads_test_data(paper, setting, method)
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


    def runs_as_trained(self) -> None:
        """Every planned run's method and model family accept the train block it will run under (their ``check_run``;
        docs/plugins.md): a combination one of them cannot run correctly stops here, one line per variant and problem,
        naming where the run's train block comes from (the paper file, or the extension whose twin it is)."""
        from ..registry import run_problems

        found: dict[tuple[str, str, str], list[str]] = {}      # (paper, variant, problem) -> the runs' settings
        for paper, setting, method, protocol in dict.fromkeys((k.paper, k.setting, k.method, k.protocol)
                                                              for k in self.plan.runs()):
            variant = self.papers[paper]["methods"][method]
            train = self.resolver.train_config(paper, setting, method, protocol)
            params = self.resolver.method_params(paper, method, protocol)
            for problem in run_problems(variant.get("method", method), params, train):
                found.setdefault((paper, method, problem), []).append(f"{setting} ({protocol})")
        lines = []
        for (paper, method, problem), runs in found.items():
            where = f"{self.loaded.paper_files.get(paper, paper)}: methods/{method}"
            twin = self.loaded.extension.twin_of(paper, method) if self.loaded.extension else None
            if twin is not None:
                where = (f"{self.loaded.extension.where}/methods/{twin[0]} (as {paper}'s {twin[1]}, whose train block "
                         f"it runs with)")
            lines.append(f"{where} on settings {', '.join(runs)}: {problem}")
        if lines:
            raise ConfigError("\n".join(lines))

    def reads_test_data(self, paper: str, setting: str, method: str) -> list[str]:
        """How a clean run of (setting, method) would read its test data without opting in (nothing: [])."""
        from ..fl.selection import TEST_RULES, opted_in, resolve_rule
        from ..registry import METHODS

        train = self.resolver.train_config(paper, setting, method, "clean")
        if opted_in(train):
            return []
        asks = []
        rule = resolve_rule(train["selection"]["rule"], "clean")
        if rule in TEST_RULES:
            asks.append(f"selection rule {rule!r} picks the reported round on the test set")
        algorithm = self.papers[paper]["methods"][method].get("method", method)
        split = self.resolver.setting(paper, setting, "clean")["split"]
        if (METHODS.get(algorithm).obj.reads_target(self.resolver.method_params(paper, method, "clean"))
                and float(split.get("reference_fraction", 0)) <= 0):
            asks.append("its domain-adaptation target would be the global test set (the split has no "
                        "reference_fraction)")
        return asks


def _frozen(numerics: dict) -> tuple:
    return tuple(sorted(numerics.items()))


def describe_numerics(numerics: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in numerics.items() if v is not None)


def check_project(loaded: LoadedConfig, resolver: Resolver, plan: Plan) -> None:
    """Raise :class:`ConfigError` naming the key and what is allowed where the configuration cannot work."""
    Checks(loaded, resolver, plan).run()


def check_files(dataset: str) -> None:
    """A folder dataset's images and labels CSV (fedrepro.data.folder), before any job: the message names the
    declaration (``config: datasets/<name>`` or the plug-in), the file and the line."""
    from ..data.folder import FolderError, check_folder, is_folder
    from ..registry import DATASETS

    entry = DATASETS.get(dataset)
    if is_folder(entry.obj):
        where = f"config: datasets/{dataset}" if entry.origin == "config" else f"dataset {dataset!r} of {entry.describe()}"
        try:
            check_folder(entry.obj, where)
        except FolderError as error:
            raise ConfigError(str(error)) from None


def check_split(split: dict, classes, where: str) -> None:
    """What the schema cannot see in a split: a registered kind, class names the dataset has, ratios that add
    up (the train part is what val and test leave, so a train ratio that does not fit would be ignored)."""
    from ..registry import SPLITTERS

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


_ROWS: dict[tuple, int] = {}


def manifest_rows(manifest: str | Path) -> int | None:
    """At most how many images a manifest lists (its lines but the header: a quoted caption may span lines, never
    fewer), None where it is not here. Counted once per version of the file."""
    path = Path(manifest)
    if not path.is_file():
        return None
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _ROWS:
        lines, last = 0, b"\n"
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                lines, last = lines + block.count(b"\n"), block[-1:]
        _ROWS[key] = max(0, lines + (last != b"\n") - 1)       # a last line without its newline counts too
    return _ROWS[key]


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

