"""Extensions (``extension:`` of the configuration; docs/plugins.md): a researcher's own methods and datasets as extra
rows and tables of the papers' tables, run exactly as the rows beside them.

- A **method** joins papers (all their tables, or some) ``like`` an algorithm of theirs (default ``fedavg``): every
  row of a joined table whose runs are of that algorithm gets a twin right after it (a column, in a table whose
  methods are its columns), with the same cells: the same settings, seeds, eval sets and metrics, and the baseline
  variant's train block (model family, optimizer, rounds, local work, selection rule, precision, under each
  protocol) with the extension's algorithm and params swapped in. Its label says what it is (``FedAvg (ConVIRT)``
  -> ``FedAvgM (ConVIRT)``).
- A **setting** (a dataset, a split by any registered splitter) stands in, per paper, for one of the paper's settings:
  every table that reads that setting gets a twin ``<table>@<setting>`` that reads this one instead, every row kept
  (baselines and the extension's methods), under the same train blocks; rows and columns of other settings are
  left out. No published value belongs to it.

A twin whose runs the method cannot train (its registered ``inputs`` and ``tasks``), whose cells name eval sets or
metrics its runs do not report, or whose clean run would read test data, is left out, and so is every table that
gains nothing: :attr:`Extension.skipped` says which and why (``fedrepro validate`` and the workflow print it).

The extension's reports go to their own folder (``paths.extension_dir``), built from the configured papers it joins:
the runs its tables share with the papers' own are the very same runs (same config, same hash, same folder), so
adding or removing an extension reruns and rebuilds nothing of the papers' results.
"""

from __future__ import annotations

import copy
import re

from .files import PROTOCOLS, ConfigError, check_choice, load_schema, method_schema, validate

# (the loaded configuration, its resolver and checks are handed in, not imported: loaded.py builds the extension)

TWIN = "_extension"     # marks an entry (row or column) the extension added, until settle() has checked it


class Extension:
    def __init__(self, spec: dict, loaded):
        self.spec = spec
        self.name = spec["name"]
        self.loaded = loaded
        self.where = "config: extension"
        self.skipped: list[tuple[str, str, str]] = []       # (paper, table, why)
        self.added: dict[tuple[str, str], dict] = {}        # (paper, table) -> {"rows": labels, "columns": labels, "all"}
        self._variants: dict[tuple[str, str, str], str] = {}  # (paper, extension method, baseline variant) -> twin name

    # ---- the view: the joined papers with every candidate twin -----------------------------------
    def view(self, papers: dict) -> dict:
        """The papers the extension joins, with its method variants and settings, holding only the tables that gain
        something (the candidates; :meth:`settle` removes what does not fit), and no figures."""
        from ..registry import METHODS

        joined: dict[str, dict[str, list[str]]] = {}       # paper -> method -> the tables it joins
        files = sorted(path.stem for path in (self.loaded.root / self.loaded.config["paper_dir"]).glob("*.yaml"))

        def configured(paper: str, at: str) -> bool:
            """A paper the configuration builds; one it does not (a paper file it leaves out) is skipped, saying so."""
            if paper in papers:
                return True
            check_choice(paper, files, f"{at} (the papers of {self.loaded.config['paper_dir']})")
            self.skip(paper, "*", f"{paper} is not among the configuration's papers {sorted(papers)}")
            return False

        for key, method in self.spec["methods"].items():
            at = f"{self.where}/methods/{key}"
            algorithm = method.get("method", key)
            check_choice(algorithm, METHODS.names(), f"{at}/method (a registered method; a plug-in's once it loads)")
            check_choice(method["like"], METHODS.names(), f"{at}/like")
            validate(method["params"], method_schema(algorithm), f"{at}/params")
            for protocol, override in method.get("protocols", {}).items():
                validate({**method["params"], **override.get("params", {})}, method_schema(algorithm),
                         f"{at}/protocols/{protocol}/params")
            targets = method["papers"] if isinstance(method["papers"], dict) else dict.fromkeys(method["papers"], "all")
            for paper, tables in targets.items():
                if not configured(paper, f"{at}/papers"):
                    continue
                for table in [] if tables == "all" else tables:
                    check_choice(table, papers[paper].get("tables", {}), f"{at}/papers/{paper}")
                joined.setdefault(paper, {})[key] = list(papers[paper].get("tables", {})) if tables == "all" else tables
        for key, setting in self.spec["settings"].items():
            for paper, like in setting["papers"].items():
                at = f"{self.where}/settings/{key}/papers/{paper}"
                if not configured(paper, f"{self.where}/settings/{key}/papers"):
                    continue
                check_choice(like, papers[paper]["settings"], f"{at} (the setting it stands in for)")
                joined.setdefault(paper, {})
        out = {}
        for paper, methods in joined.items():
            view = copy.deepcopy(papers[paper])
            view["figures"] = {}
            tables = view.get("tables", {})
            extended: dict[str, dict] = {}
            for key, names in methods.items():
                for table in names:
                    spec = extended.get(table) or copy.deepcopy(tables[table])
                    if self.add_twins(view, paper, table, key, spec):
                        extended[table] = spec
            for key, setting in self.spec["settings"].items():
                if paper in setting["papers"] and paper in papers:
                    self.add_setting(view, paper, key, setting, extended)
            view["tables"] = extended
            out[paper] = view
        return out

    def add_twins(self, view: dict, paper: str, table: str, key: str, spec: dict) -> bool:
        """Twins of every entry of ``spec`` (a row, or a column where rows name no method) whose runs are of the
        method's ``like``; False (with the reason in :attr:`skipped`) when it has none."""
        method = self.spec["methods"][key]
        if spec.get("kind", "runs") != "runs":
            self.skip(paper, table, f"a {spec['kind']} table: it has no method rows")
            return False
        axis = "rows" if any(self.variants_of(r) for r in spec.get("rows", [])) else "columns"
        entries = spec.get(axis, [])
        baselines = [e for e in entries if self.variants_of(e) and TWIN not in e and all(
            view["methods"][v].get("method", v) == method["like"] for v in self.variants_of(e))]
        if not baselines:
            shown = sorted({view["methods"][v].get("label", v) for e in entries for v in self.variants_of(e)})
            self.skip(paper, table, f"for {method.get('label', key)}: no row of {method['like']} (its like:) to swap "
                                    f"it into; its {axis}: {', '.join(shown)}")
            return False
        labels = {self.label_of(view, e) for e in entries}
        for base in baselines:
            twin = copy.deepcopy(base)
            if "method" in twin:
                twin["method"] = self.variant(view, paper, key, twin["method"])
            if "methods" in twin:
                twin["methods"] = {col: self.variant(view, paper, key, v) for col, v in twin["methods"].items()}
            if "label" in base:
                twin["label"] = swapped_label(base["label"], method["like"], method.get("label", key))
            label = self.label_of(view, twin)
            if label in labels:
                raise ConfigError(f"{self.where}/methods/{key}: its {axis[:-1]} in {paper}'s {table} would be labelled "
                                  f"{label!r}, like one it already has; give the method another label")
            labels.add(label)
            twin[TWIN] = key
            if axis == "columns":
                for row in spec.get("rows", []):      # what a row says per column, it says for the twin as for its baseline
                    for per_column in ("evals", "settings", "methods"):
                        if base["label"] in row.get(per_column, {}):
                            row[per_column][twin["label"]] = row[per_column][base["label"]]
                    if base["label"] in row.get("only", []):
                        row["only"].append(twin["label"])
            entries.insert(entries.index(base) + 1, twin)
        return True

    def variant(self, view: dict, paper: str, key: str, baseline: str) -> str:
        """The twin of the paper's variant ``baseline``: its train block (under each protocol), the extension's
        method and params (a new variant of the paper, named after both: fedavg_convirt -> fedavgm_convirt)."""
        if (paper, key, baseline) in self._variants:
            return self._variants[(paper, key, baseline)]
        method = self.spec["methods"][key]
        like = method["like"]
        name = key if baseline == like else baseline.replace(like, key, 1) if like in baseline else f"{key}.{baseline}"
        if name in view["methods"]:
            raise ConfigError(f"{self.where}/methods/{key}: its twin of {paper}'s {baseline!r} would be called {name!r}, "
                              f"a variant {paper} already has; give the method another name")
        base = view["methods"][baseline]
        twin = {"method": method.get("method", key), "label": swapped_label(base.get("label", baseline), like,
                                                                            method.get("label", key)),
                "params": copy.deepcopy(method["params"])}
        if "train" in base:
            twin["train"] = copy.deepcopy(base["train"])
        protocols = {}
        for protocol in PROTOCOLS:
            train = base.get("protocols", {}).get(protocol, {}).get("train")
            params = method.get("protocols", {}).get(protocol, {}).get("params")
            protocols[protocol] = {k: copy.deepcopy(v) for k, v in (("train", train), ("params", params)) if v}
        if any(protocols.values()):
            twin["protocols"] = {p: o for p, o in protocols.items() if o}
        if method.get("bar_explanation"):
            twin["bar_explanation"] = method["bar_explanation"]
        view["methods"][name] = twin
        self._variants[(paper, key, baseline)] = name
        return name

    def add_setting(self, view: dict, paper: str, key: str, setting: dict, extended: dict) -> None:
        """The setting, training as the one it stands in for, and a twin ``<table>@<key>`` of every table that
        reads that one (the extended table where the extension's methods joined it)."""
        from ..registry import DATASETS

        at = f"{self.where}/settings/{key}"
        like = setting["papers"][paper]
        if key in view["settings"]:
            raise ConfigError(f"{at}: {paper} already has a setting {key!r}; give yours another name")
        check_choice(setting["dataset"], DATASETS.names(), f"{at}/dataset (a registered dataset, or one of datasets:)")
        schema = load_schema(str(self.loaded.root.resolve()), "paper.schema.yaml")
        split = validate(copy.deepcopy(setting["split"]), {"$defs": schema["$defs"], **schema["$defs"]["split"]},
                         f"{at}/split")
        base = view["settings"][like]
        view["settings"][key] = {"dataset": setting["dataset"], "label": setting.get("label", key), "split": split,
                                 **({"train": copy.deepcopy(base["train"])} if "train" in base else {})}
        stand_in = {"like": like, "like_label": base.get("label", like), "label": setting.get("label", key),
                    "dataset": setting["dataset"], "dataset_title": DATASETS.get(setting["dataset"]).obj.title}
        for table, spec in list(self.loaded.papers[paper].get("tables", {}).items()):
            twin = substitute_setting(extended.get(table, spec), like, key, stand_in)
            if twin is not None:
                twin[TWIN] = key
                extended[f"{table}@{key}"] = twin

    # ---- the fit: what stays ------------------------------------------------------------------------
    def settle(self, resolver, checks) -> None:
        """Drop every twin whose runs the method cannot train or whose cells the checks refuse, and every table left
        with nothing of the extension, recording why; then what each table gained (for the scorecards)."""
        for paper, view in self.loaded.papers.items():
            for table in list(view["tables"]):
                spec = view["tables"][table]
                if TWIN in spec:                           # a twin table: its baselines must run on the new setting
                    plain = {**spec, "rows": [r for r in spec.get("rows", []) if TWIN not in r],
                             "columns": [c for c in spec.get("columns", []) if TWIN not in c]}
                    why = self.unfit(resolver, checks, paper, plain, table)
                    if why:
                        del view["tables"][table]
                        self.skip(paper, table, why)
                        continue
                for axis in ("rows", "columns"):
                    for entry in [e for e in spec.get(axis, []) if TWIN in e]:
                        alone = {**spec, axis: [entry]}
                        why = self.unfit(resolver, checks, paper, alone, table)
                        if why:
                            spec[axis].remove(entry)
                            self.skip(paper, table, f"{axis[:-1]} {self.label_of(view, entry)}: {why}")
                twins = {axis: [self.label_of(view, e) for e in spec.get(axis, []) if TWIN in e]
                         for axis in ("rows", "columns")}
                if TWIN not in spec and not any(twins.values()):
                    del view["tables"][table]
                    continue
                self.added[(paper, table)] = {"all": TWIN in spec, **{axis: set(labels) for axis, labels in twins.items()}}
                spec.pop(TWIN, None)
                for axis in ("rows", "columns"):
                    for entry in spec.get(axis, []):
                        entry.pop(TWIN, None)
        if not self.added:
            raise ConfigError(f"{self.where} ({self.name}) adds nothing to any table:\n" + "\n".join(self.notes())
                              + "\nJoin other papers or tables, or choose another `like`.")
        used = {m for view in self.loaded.papers.values() for t in view["tables"].values()
                for e in [*t.get("rows", []), *t.get("columns", [])] for m in self.variants_of(e)}
        for view in self.loaded.papers.values():    # twin variants no table kept
            for name in [n for n in view["methods"] if n in self._variants.values() and n not in used]:
                del view["methods"][name]

    def unfit(self, resolver, checks, paper: str, spec: dict, table: str) -> str | None:
        """Why the cells of ``spec`` cannot be run as asked (None: they can): the method's registered inputs and
        tasks, the names the cells read, and the clean protocol's rule on test data."""
        from ..registry import METHODS, MODELS

        for protocol in PROTOCOLS:
            for cell in resolver.cells(paper, spec, protocol):
                if cell["task"]:
                    continue
                algorithm = self.loaded.papers[paper]["methods"][cell["method"]].get("method", cell["method"])
                try:
                    train = resolver.train_config(paper, cell["setting"], cell["method"], cell["protocol"])
                    family = MODELS.get(train["model"]["family"])
                    fits = METHODS.get(algorithm)
                    if family["input"] not in fits["inputs"] or family.obj.task not in fits["tasks"]:
                        return (f"{algorithm} trains {', '.join(fits['inputs'])} ({', '.join(fits['tasks'])}; as "
                                f"{fits.describe()} registers it), but these runs train {family.name} on "
                                f"{family['input']} ({family.obj.task})")
                    checks.cell(self.loaded.papers[paper], cell, f"{paper}/{table}/{cell['where']}")
                except ConfigError as error:
                    return str(error)
                asks = checks.reads_test_data(paper, cell["setting"], cell["method"]) if cell["protocol"] == "clean" else []
                if asks:
                    return f"under the clean protocol {' and '.join(asks)}"
        return None

    # ---- helpers ------------------------------------------------------------------------------------
    def baseline_of(self, paper: str, variant: str) -> str:
        """The paper's variant that ``variant`` is a twin of (itself for any other): what an overlay (the evidence
        run) adds to a variant's train block, it adds to its twin's too."""
        return next((b for (p, _, b), twin in self._variants.items() if p == paper and twin == variant), variant)

    def twin_of(self, paper: str, variant: str) -> tuple[str, str] | None:
        """(the extension's method key, the paper's baseline variant) of a twin variant; None for any other."""
        return next(((key, base) for (p, key, base), twin in self._variants.items() if p == paper and twin == variant),
                    None)

    def skip(self, paper: str, table: str, why: str) -> None:
        self.skipped.append((paper, table, why))

    @staticmethod
    def variants_of(entry: dict) -> list[str]:
        return ([entry["method"]] if entry.get("method") else []) + list((entry.get("methods") or {}).values())

    @staticmethod
    def label_of(view: dict, entry: dict) -> str:
        """The label a table prints for a row or column (a row without one shows its method's)."""
        if entry.get("label"):
            return entry["label"]
        method = entry.get("method")
        return view["methods"].get(method, {}).get("label", method) if method else ""

    def notes(self) -> list[str]:
        """What the extension joined and skipped, one line each (``fedrepro validate``, the workflow)."""
        lines = []
        for (paper, table), added in self.added.items():
            rows = "; ".join(f"{axis} {', '.join(sorted(labels))}" for axis, labels in added.items()
                             if axis != "all" and labels)
            if added["all"]:
                base, setting = table.split("@")
                what = f"{base} on setting {setting}, every row" + (f" (with {rows})" if rows else "")
            else:
                what = f"{rows}"
            lines.append(f"extension {self.name}: {paper}/{table}: {what}")
        skipped = dict.fromkeys(f"extension {self.name}: {paper}{'' if table == '*' else '/' + table} skipped: {why}"
                                for paper, table, why in self.skipped)
        return lines + list(skipped)


def swapped_label(label: str, like: str, new: str) -> str:
    """``label`` with the name of the algorithm ``like`` in it replaced by ``new`` (``FedAvg (ConVIRT)`` ->
    ``FedAvgM (ConVIRT)``, case and ``_``/``-``/`` `` ignored), or ``new (like <label>)`` where it does not say it."""
    words = "[-_ ]?".join(re.escape(part) for part in re.split(r"[-_ ]+", like) if part)
    pattern = re.compile(rf"(?<![A-Za-z0-9]){words}(?![A-Za-z0-9])", re.IGNORECASE)
    return pattern.sub(lambda _: new, label, count=1) if pattern.search(label) else f"{new} (like {label})"


def substitute_setting(spec: dict, like: str, new: str, stand_in: dict) -> dict | None:
    """A copy of table ``spec`` reading setting ``new`` wherever it read ``like``, without the rows and columns of
    other settings and without published values; None when it does not read ``like``."""
    reads = like in spec.get("settings", []) or any(
        e.get("setting") == like or like in (e.get("settings") or {}).values()
        for e in [*spec.get("rows", []), *spec.get("columns", [])])
    if not reads:
        return None
    out = copy.deepcopy(spec)
    out.pop("published", None)
    if "settings" in out:
        out["settings"] = [new]
    for axis in ("rows", "columns"):
        kept = []
        for entry in out.get(axis, []):
            if entry.get("setting") not in (None, like):
                continue
            if entry.get("setting") == like:
                entry["setting"] = new
            if "settings" in entry:
                entry["settings"] = {col: new for col, s in entry["settings"].items() if s == like}
            kept.append(entry)
        if axis in out:
            out[axis] = kept
    labels = {c["label"] for c in out.get("columns", [])}
    out["columns"] = [c for c in out.get("columns", []) if set(c.get("mean_of", [])) <= labels]
    labels = {c["label"] for c in out["columns"]} if "columns" in spec else labels
    for row in out.get("rows", []):
        for per_column in ("evals", "methods", "settings"):
            if per_column in row:
                row[per_column] = {c: v for c, v in row[per_column].items() if c in labels}
        if "only" in row:
            row["only"] = [c for c in row["only"] if c in labels]
    out["rows"] = [r for r in out.get("rows", []) if r.get("only", True) != []] if "rows" in spec else out.get("rows")
    if "columns" not in spec:
        out.pop("columns")
    if "rows" not in spec:
        out.pop("rows", None)
    renamed = renamed_entries(spec, like, stand_in["label"].split(" (")[0].strip() or new)
    rename_entries(out, renamed)
    dataset = f"{stand_in['dataset']}: {stand_in['dataset_title']}" if stand_in.get("dataset_title") else stand_in["dataset"]
    out["title"] = f"On {stand_in['label']} (dataset {dataset}) in place of {stand_in['like_label']}: {spec.get('title', '')}"
    original = f"The original table's note: {spec['note'].rstrip('.')}." if spec.get("note") else ""
    out["note"] = " ".join(filter(None, [(
        f"Extension setting {stand_in['label']!r} (dataset {stand_in['dataset']}) in place of {stand_in['like_label']!r}, "
        f"trained as that setting is" + (f"; {', '.join(repr(n) for n in renamed.values())} in place of "
                                         f"{', '.join(repr(o) for o in renamed)}" if renamed else "")
        + "; no published values belong to it."), original]))
    return out


def renamed_entries(spec: dict, like: str, name: str) -> dict[str, str]:
    """Old -> new label of the rows or columns of ``spec`` that read setting ``like`` and name it: two or more whose
    labels begin with the same words and differ after them (``ISIC BACC``, ``ISIC F1`` -> ``Shapes BACC``, ``Shapes F1``).
    A label that does not name its setting (``C0``, ``cls 1%``) stays."""
    out = {}
    for axis in ("rows", "columns"):
        labels = [e["label"] for e in spec.get(axis, []) or [] if e.get("setting") == like and e.get("label")]
        words = [label.split() for label in labels]
        common = []
        for parts in zip(*words) if len(words) > 1 else ():
            if len(set(parts)) > 1:
                break
            common.append(parts[0])
        if common and all(len(w) > len(common) for w in words):
            out.update({label: " ".join([name, *label.split()[len(common):]]) for label in labels})
    return out


def rename_entries(spec: dict, renamed: dict[str, str]) -> None:
    """Apply ``renamed`` (old -> new label) to a table spec's rows and columns and to everything naming them (a row's
    per-column ``evals``/``methods``/``settings``, its ``only``, a column's ``mean_of``)."""
    if not renamed:
        return
    for axis in ("rows", "columns"):
        for entry in spec.get(axis, []) or []:
            if entry.get("label") in renamed:
                entry["label"] = renamed[entry["label"]]
            for per_column in ("evals", "methods", "settings"):
                if isinstance(entry.get(per_column), dict):
                    entry[per_column] = {renamed.get(k, k): v for k, v in entry[per_column].items()}
            for listed in ("only", "mean_of"):
                if isinstance(entry.get(listed), list):
                    entry[listed] = [renamed.get(k, k) for k in entry[listed]]
