"""Paper tables: one cell = one (setting, method) over seeds, next to the published value.

Table kinds (registered with :func:`fedrepro.registry.register_table_kind`, each with the files it reads):
``runs`` (cells from training runs or their downstream evaluations), ``split_counts`` (training images
per client from the split files) and ``class_balance`` (clients, images and imbalance ratio per setting).

Outputs for ``results/tables/<protocol>/<paper>/<table>``:
    .csv        one row per cell: mean, std, se, ci95, n, published, delta (measured - published), derived,
                published_mark and published_note (a published value this project derived or assembled:
                the mark and footnote of the published CSV, :mod:`fedrepro.report.published`)
    .seeds.csv  every per-seed value that went into a cell (long format)
    .md / .tex  the table as papers print it: "mean ± half-width (published)" and, on a second line, "Δ measured −
                published" (measured: this pipeline's value, never a method the paper calls "Ours"); "– (published)"
                where we have no value; a caption that says what ± is (:data:`fedrepro.report.stats.PLUS_MINUS`), how
                many seeds, which protocol and which model-selection rule produced it, what the marks of
                derived published values mean, the table's ``note`` and, for stand-in data and models, that its numbers
                are not comparable (every table kind ends its caption with :func:`caption_notes`); the .md links
                the .seeds.csv
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import paths
from ..config import Project, column_eval, resolve_cell
from ..io import read_json, write_csv, write_text
from ..paths import DEFAULT_NUMERICS
from ..registry import TABLE_KINDS, method_class, register_table_kind
from .code_changes import code_note
from .item import ReportItem, require, split_count_inputs, stand_in, stand_in_warning
from .published import Published, read_published
from .stats import plus_minus, summarise

SUMMARY_COLUMNS = ["row", "column", "mean", "std", "se", "ci95", "n", "published", "delta", "derived", "published_mark",
                   "published_note"]


@dataclass
class TableResult:
    name: str
    title: str
    rows: list[str]
    columns: list[str]
    summary: pd.DataFrame       # row, column, mean, std, se, ci95, n, published, delta, derived, published_mark/_note
    seeds: pd.DataFrame         # row, column, seed, value
    caption: str
    decimals: int


def metric_value(metrics: dict, eval_key: str, metric: str) -> float:
    """``metric`` of eval set ``eval_key``; dotted names (``comm.params_per_client_round``,
    ``time.train_s_per_round``) address the top level of metrics.json instead."""
    if "." in metric:
        section, name = metric.split(".", 1)
        return float(metrics[section][name])
    evals = metrics.get("eval", {})
    if eval_key not in evals:
        raise KeyError(f"metrics have no eval set {eval_key!r}; eval sets available: {sorted(evals)}")
    if metric not in evals[eval_key]:
        raise KeyError(f"eval set {eval_key!r} has no metric {metric!r}; metrics available: {sorted(evals[eval_key])}")
    return float(evals[eval_key][metric])


def one_round(metrics: dict, folder: Path, selection: dict | None) -> dict:
    """A run's metrics as the table reads them. A run selected on the test set (paper protocol, or clean with
    ``allow_test_selection``: each column's best over rounds) is re-read at one round for every column when
    the table says ``selection: {rule: one_round, eval, metric}``: the round best on that eval set and metric
    (from history.csv), e.g. a transferred model's column from the round selected on the source task. Any
    other run (clean: selected on validation) is read as it is: its history is never searched."""
    if not selection or selection.get("rule", "per_column") != "one_round" or metrics["selection"]["rule"] != "best_test":
        return metrics
    from ..fl.selection import select

    key = f"{selection.get('eval', 'global')}/{selection.get('metric', 'acc')}"
    chosen, info = select(pd.read_csv(folder / "history.csv"), "best_test_round", selection.get("metric", "acc"), 1,
                          round_on=key)
    if not chosen:
        raise KeyError(f"{folder}: table selection one_round on {key}, but {info['note']}")
    return {**metrics, "eval": chosen, "selection": {**info, "rule": "best_test_round"}}


def selected_on_test(project: Project, key: paths.RunKey) -> bool:
    """Whether run ``key`` reports metrics selected on the test set (its resolved selection rule)."""
    from ..fl.selection import TEST_RULES, resolve_rule

    rule = project.resolver.train_config(key.paper, key.setting, key.method, key.protocol)["selection"]["rule"]
    return resolve_rule(rule, key.protocol) in TEST_RULES


def runs_inputs(item: ReportItem) -> list[str]:
    """Every metrics.json (or downstream result) a ``runs`` table reads, the history.csv of runs selected on
    the test set when the table re-reads them at one round, and the published CSV."""
    files: dict[str, None] = {}
    one = (item.spec.get("selection") or {}).get("rule") == "one_round"
    for cell in item.project.resolver.resolved_cells(item.paper, item.name, item.protocol):
        for seed in item.seeds:
            key = item.project.resolver.run_key(item.paper, cell["setting"], cell["method"], seed, cell["protocol"])
            if cell["task"]:
                files[paths.downstream(key, cell["task"])] = None
            else:
                files[paths.run_file(key)] = None
                if one and selected_on_test(item.project, key):
                    files[paths.run_file(key, "history.csv")] = None
    return list(files) + published_inputs(item)


def published_inputs(item: ReportItem) -> list[str]:
    return [paths.published(item.spec["published"])] if item.spec.get("published") else []


def counts_inputs(item: ReportItem) -> list[str]:
    return split_count_inputs()(item) + published_inputs(item)


def _published(item: ReportItem) -> Published:
    return read_published(paths.published(item.spec["published"]) if item.spec.get("published") else None)


def cell_record(row: str, column: str, values: list[float], published: Published) -> dict:
    """One row of a table's CSV: our summary over seeds beside the published value (and its mark)."""
    stats = summarise(values)
    pub = published.get((row, column))
    mark = published.mark((row, column))
    return {"row": row, "column": column, **stats, "published": pub,
            "delta": stats["mean"] - pub if not math.isnan(pub) else math.nan,
            "derived": bool(mark), "published_mark": mark, "published_note": published.footnotes.get(mark, "")}


@register_table_kind("runs", inputs=runs_inputs)
def build_table(item: ReportItem) -> TableResult:
    project, paper, table, spec = item.project, item.paper, item.name, item.spec
    seeds = item.seeds
    published = _published(item)
    rows = spec.get("rows", [])
    columns = spec.get("columns", [])
    row_labels = [r.get("label") or project.papers[paper]["methods"].get(r.get("method"), {}).get("label") or r.get("method")
                  for r in rows]
    col_labels = [c["label"] for c in columns]

    per_seed: list[dict] = []
    protocols, rules, test_data, numerics = set(), set(), set(), set()
    for row, row_label in zip(rows, row_labels):
        values: dict[str, dict[int, float]] = {}
        for col in columns:
            cell = resolve_cell(spec, row, col)
            if cell is None:
                continue
            protocol = project.resolver.protocol(paper, cell["setting"], cell["protocol"] or item.protocol)
            eval_key = column_eval(col, protocol) or cell["eval"]
            for seed in seeds:
                key = project.resolver.run_key(paper, cell["setting"], cell["method"], seed, protocol)
                if cell["task"]:
                    metrics = read_json(require(paths.downstream(key, cell["task"])))
                else:
                    folder = Path(paths.run_dir(key))
                    metrics = one_round(read_json(require(folder / "metrics.json")), folder, spec.get("selection"))
                protocols.add(metrics["run"]["protocol"])
                numerics.add(key.numerics)
                rules.add(metrics["selection"]["rule"])
                test_data |= notes_on_test_use(metrics)
                values.setdefault(col["label"], {})[seed] = metric_value(metrics, eval_key, cell["metric"]) * cell["scale"]
        for col in columns:
            if "mean_of" in col and ("only" not in row or col["label"] in row["only"]):
                parts = [values[c] for c in col["mean_of"] if c in values]
                if parts and len(parts) == len(col["mean_of"]):
                    values[col["label"]] = {s: sum(p[s] for p in parts) / len(parts) for s in seeds}
        for col_label, by_seed in values.items():
            per_seed += [{"row": row_label, "column": col_label, "seed": s, "value": v} for s, v in by_seed.items()]

    seeds_frame = pd.DataFrame(per_seed, columns=["row", "column", "seed", "value"])
    records = []
    for row_label in row_labels:
        for col_label in col_labels:
            vals = seeds_frame[(seeds_frame.row == row_label) & (seeds_frame.column == col_label)]["value"]
            records.append(cell_record(row_label, col_label, vals.tolist(), published))
    summary = pd.DataFrame(records)
    caption = make_caption(spec, table, project, protocols, rules, len(seeds), test_data, numerics)
    return TableResult(table, spec.get("title", table), row_labels, col_labels, summary, seeds_frame, caption,
                       spec.get("decimals", 2))


OPT_IN = "by explicit opt-in (allow_test_selection: true)"
TEST_DATA_NOTES = {
    "clean_selection": f"Under the clean protocol these runs were selected on the test set {OPT_IN}.",
    "clean_target": f"Domain-adaptation target under the clean protocol: the global test images (labels hidden), {OPT_IN}.",
    "paper_target": "Domain-adaptation target: the global test images (labels hidden), as the authors' code did.",
}


def notes_on_test_use(metrics: dict) -> set[str]:
    """Which of :data:`TEST_DATA_NOTES` a run's metrics.json calls for (its ``test_data`` record)."""
    use = metrics.get("test_data") or {}
    clean = use.get("protocol") == "clean"
    notes = {"clean_selection"} if clean and use.get("selection_on_test") else set()
    if use.get("target_is_test"):
        notes.add("clean_target" if clean else "paper_target")
    return notes


NUMERICS_NOTE = {"fast": "fast numerics (bf16 autocast on a capable GPU, JPEG DCT scaling, random crops from a cache "
                         "at twice the crop size, PIL resizes), not the authors' arithmetic and pixels"}


def make_caption(spec: dict, table: str, project: Project, protocols: set, rules: set, n: int,
                 test_data: set[str] = frozenset(), numerics: set[str] = frozenset()) -> str:
    parts = [spec.get("title", table) + "."]
    parts.append(f"Measured here: {plus_minus(n)}; the published value in parentheses.")
    if protocols:
        parts.append(f"Protocol: {', '.join(sorted(protocols))}.")
    other = sorted(numerics - {DEFAULT_NUMERICS})
    if other:   # the authors' numerics go unsaid: they are the default (README "Numerics")
        some = " (some runs)" if len(numerics) > 1 else ""
        parts.append(f"Computed with the {'; '.join(NUMERICS_NOTE[n] for n in other)}{some}.")
    if rules:
        on = spec.get("selection") or {}
        described = {"best_val": "best validation round", "last": "last round",
                     "best_test": "best test score over rounds, each column its own best (selected on the test set, "
                                  "as the paper's code did)",
                     "best_test_round": f"best test score over rounds: one round per run, the one with the best "
                                        f"{on.get('eval', 'global')} {on.get('metric', 'acc')}, for every column "
                                        f"(selected on the test set)",
                     "last_k_mean": "mean of the last rounds"}
        parts.append("Model selection: " + "; ".join(described.get(r, r) for r in sorted(rules)) + ".")
    parts += [TEST_DATA_NOTES[note] for note in sorted(test_data)]
    return " ".join(parts)


def caption_notes(item: ReportItem, summary: pd.DataFrame) -> str:
    """What every table's caption ends with, whatever its kind: what Δ is, the footnotes of the
    derived published values it shows (from the published CSV), the table's ``note`` and, for the
    stand-in data and models of a demo twin or an evidence overlay (``stand_in``), what they are and that its
    numbers are not comparable to the paper."""
    parts = []
    if summary["delta"].notna().any():
        parts.append("Δ = measured − published.")
    marked = summary[summary["published_mark"] != ""] if len(summary) else summary
    for mark, note in dict(zip(marked["published_mark"], marked["published_note"])).items():
        parts.append(f"{mark} {note.rstrip('.')}.")
    if item.spec.get("note"):
        parts.append(item.spec["note"])
    parts += method_notes(item)
    parts += bar_explanations(item)
    parts += code_notes(item)
    description = stand_in(item.project, item.paper)
    if description:
        parts.append(stand_in_warning(description))
    return " ".join(parts)


def method_notes(item: ReportItem) -> list[str]:
    """What the methods of this table's runs say about themselves (``FederatedMethod.caption_note``): a phrase after
    the row's label ("trains ..."); a note that begins with the label (or the method's own name, before a twin's
    "(...)") is taken as it is, not prefixed a second time."""
    methods, notes = item.project.papers[item.paper]["methods"], {}
    for key in item.project.plan.table_runs(item.paper, item.name, item.protocol):
        variant = methods[key.method]
        note = method_class(variant.get("method", key.method)).caption_note(
            item.project.resolver.method_params(item.paper, key.method, key.protocol))
        if note:
            label, text = variant.get("label", key.method), note.strip().rstrip(".")
            named = any(re.match(rf"{re.escape(name)}(?![\w-])", text) for name in {label, label.split(" (")[0]})
            notes.setdefault(f"{text}." if named else f"{label} {text}.", None)
    return list(notes)


def code_notes(item: ReportItem) -> list[str]:
    """Which of this table's rows hold runs made by other code than the installed one (:mod:`.code_changes`)."""
    note = code_note(item.project, item.project.plan.table_runs(item.paper, item.name, item.protocol))
    return [note] if note else []


def bar_explanations(item: ReportItem) -> list[str]:
    """For a configuration with a learning bar (config ``evidence``): the methods of this table whose paper file says
    why they may fall below it on this data (decided on validation data or from the configuration), with the reason.
    The evidence page reports their runs below the bar, not as passing."""
    if not item.project.config.get("evidence"):
        return []
    methods = item.project.papers[item.paper]["methods"]
    named = dict.fromkeys(key.method for key in item.project.plan.table_runs(item.paper, item.name, item.protocol)
                          if methods[key.method].get("bar_explanation"))
    return [f"{methods[m].get('label', m)} may fall below the learning bar on these data: "
            f"{methods[m]['bar_explanation'].rstrip('.')}." for m in named]


def _number(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def cell_lines(rec, decimals: int) -> list[str]:
    """A cell as printed: "mean ± half-width (published)" ("–" for our mean where there is none; the published
    value keeps its mark), and a second line "Δ ±d" where both exist."""
    published = "" if math.isnan(rec["published"]) else f" ({_number(rec['published'], decimals)}{rec['published_mark']})"
    if rec["n"] == 0:
        return ["–" + published]
    text = _number(rec["mean"], decimals)
    if not math.isnan(rec["ci95"]):
        text += f" ± {_number(rec['ci95'], decimals)}"
    lines = [text + published]
    if not math.isnan(rec["delta"]):
        lines.append(f"Δ {'−' if rec['delta'] < 0 else '+'}{_number(abs(rec['delta']), decimals)}")
    return lines


def to_grid(result: TableResult) -> pd.DataFrame:
    """rows x columns of cell lines (a list per cell; ["–"] where the table has no cell)."""
    grid = pd.DataFrame(index=result.rows, columns=result.columns, dtype=object)
    for row in result.rows:
        for column in result.columns:
            grid.at[row, column] = ["–"]
    for _, rec in result.summary.iterrows():
        grid.at[rec["row"], rec["column"]] = cell_lines(rec, result.decimals)
    return grid


def seeds_file(out_md: str | Path) -> Path:
    """``<table>.seeds.csv`` beside ``<table>.md``: every per-seed value behind the table's cells."""
    out_md = Path(out_md)
    return out_md.with_name(f"{out_md.stem}.seeds.csv")


def render_markdown(result: TableResult, seeds_csv: str | None = None) -> str:
    """The caption line (ending with a link to the per-seed values, ``seeds_csv``, where the table has some), then the
    pipe table."""
    grid = to_grid(result)
    header = "| | " + " | ".join(result.columns) + " |"
    rule = "|---|" + "---|" * len(result.columns)
    body = ["| " + row + " | " + " | ".join("<br>".join(lines) for lines in grid.loc[row]) + " |" for row in result.rows]
    several = seeds_csv and result.seeds["seed"].nunique() > 1      # a split table's one split has no seeds to show
    link = f" Per-seed values: [{seeds_csv}]({seeds_csv})." if several else ""
    return "\n".join([f"**{result.name}.** {result.caption}{link}", "", header, rule, *body, ""])


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("±", r"$\pm$"),
                 ("α", r"$\alpha$"), ("Δ", r"$\Delta$"), ("−", "$-$"), ("–", "--"), ("*", r"$^{*}$"), ("†", r"$^{\dagger}$"),
                 ("‡", r"$^{\ddagger}$"), ("§", r"\S{}")):
        text = text.replace(a, b)
    return text


def _tex_cell(lines: list[str]) -> str:
    """One line as it is; two (value, then Δ) stacked in a nested tabular, the Δ line smaller."""
    if len(lines) == 1:
        return _tex_escape(lines[0])
    return (r"\begin{tabular}[t]{@{}c@{}}" + _tex_escape(lines[0])
            + "".join(r" \\ {\footnotesize " + _tex_escape(line) + "}" for line in lines[1:]) + r"\end{tabular}")


def render_latex(result: TableResult) -> str:
    grid = to_grid(result)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{_tex_escape(result.caption)}}}", rf"\label{{tab:{result.name}}}",
             r"\begin{tabular}{l" + "c" * len(result.columns) + "}", r"\toprule",
             " & ".join([""] + [_tex_escape(c) for c in result.columns]) + r" \\", r"\midrule"]
    for row in result.rows:
        lines.append(" & ".join([_tex_escape(row)] + [_tex_cell(cell) for cell in grid.loc[row]]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def write_table(result: TableResult, out_md: str | Path) -> list[Path]:
    """-> the files written (.csv, .seeds.csv, .tex, .md)."""
    out_md = Path(out_md)
    files = [out_md.with_suffix(".csv"), seeds_file(out_md), out_md.with_suffix(".tex"), out_md]
    write_csv(files[0], result.summary)
    write_csv(files[1], result.seeds)
    write_text(files[2], render_latex(result))
    write_text(out_md, render_markdown(result, seeds_file(out_md).name))
    return files


@register_table_kind("split_counts", inputs=counts_inputs)
def build_split_counts_table(item: ReportItem) -> TableResult:
    """Samples per client (rows) for each listed setting (columns), from the split files: every client's whole
    size (``count: client``, the default: what FACMIC's Table 1 and FAA-CLIP's Table I print, "samples of each
    client") or its training part (``count: train``)."""
    spec, table = item.spec, item.name
    seed = item.seeds[0]
    published = _published(item)
    whole = spec.get("count", "client") == "client"
    columns, records, seeds_rows = [], [], []
    row_order: list[str] = []
    for setting in spec["settings"]:
        label = item.setting_label(setting)
        columns.append(label)
        counts = item.split_counts(setting)
        # the global set a run of this protocol tests on: under paper the reference set too (fl.federation.target_rows)
        reference = float(counts.loc[counts["client"] == "reference", "total"].sum())
        tested = reference if item.project.resolver.protocol(item.paper, setting, item.protocol) == "paper" else 0.0
        for _, rec in counts.iterrows():
            if rec["client"] == "reference":
                continue
            if rec["client"] in ("global_test", "external"):
                value = float(rec["total"]) + (tested if rec["client"] == "global_test" else 0.0)
            else:
                value = float(rec.get("size", rec["total"]) if whole else rec["train"])
            row = rec["client"]
            row_order += [row] if row not in row_order else []
            seeds_rows.append({"row": row, "column": label, "seed": seed, "value": value})
    frame = pd.DataFrame(seeds_rows, columns=["row", "column", "seed", "value"])
    for row in row_order:
        for col in columns:
            vals = frame[(frame.row == row) & (frame.column == col)]["value"].tolist()
            records.append(cell_record(row, col, vals, published))
    what = "Samples per client (the whole client, before its train/val/test cut)" if whole else "Training samples per client"
    caption = (f"{spec.get('title', table)}. {what} under split seed {seed} (global_test / external: size of the "
               f"global / external evaluation set; under the clean protocol the global set without the part held out "
               f"as the unlabeled domain-adaptation target); the published counts in parentheses.")
    return TableResult(table, spec.get("title", table), row_order, columns, pd.DataFrame(records), frame, caption, 0)


# --------------------------------------------------------------------------------------------
# class balance of the splits (FedIIC: imbalance ratios)

NON_CLIENT_ROWS = ("global_test", "reference", "external")
CLASS_BALANCE_COLUMNS = ("clients", "train images", "val images", "test images", "largest class", "smallest class",
                         "imbalance ratio")


def pooled_train_counts(counts: pd.DataFrame, classes: list[str]) -> np.ndarray:
    """Training images per class over all clients."""
    clients = counts[~counts["client"].isin(NON_CLIENT_ROWS)]
    return clients[classes].sum(axis=0).to_numpy(dtype=float)


def imbalance_ratio(per_class: np.ndarray) -> float:
    """max / min class count (inf when a class has no training image)."""
    per_class = np.asarray(per_class, dtype=float)
    return float(per_class.max() / per_class.min()) if per_class.min() > 0 else math.inf


@register_table_kind("class_balance", inputs=counts_inputs)
def build_class_balance_table(item: ReportItem) -> TableResult:
    """Rows = settings; columns = :data:`CLASS_BALANCE_COLUMNS`, from the split count files of the first seed."""
    spec, table = item.spec, item.name
    published = _published(item)
    rows, records, per_seed = [], [], []
    seed = item.seeds[0]
    for setting in spec["settings"]:
        label = item.setting_label(setting)
        rows.append(label)
        counts = item.split_counts(setting)
        classes = item.classes(setting)
        clients = counts[~counts["client"].isin(NON_CLIENT_ROWS)]
        per_class = pooled_train_counts(counts, classes)
        values = {
            "clients": len(clients),
            "train images": float(clients["train"].sum()),
            "val images": float(clients["val"].sum()),
            "test images": float(counts["test"].sum()),
            "largest class": float(per_class.max()),
            "smallest class": float(per_class.min()),
            "imbalance ratio": imbalance_ratio(per_class),
        }
        for column in CLASS_BALANCE_COLUMNS:
            records.append(cell_record(label, column, [values[column]], published))
            per_seed.append({"row": label, "column": column, "seed": seed, "value": values[column]})
    caption = (f"{spec.get('title', table)}. Imbalance ratio = largest / smallest class of the pooled client training "
               f"data under split seed {seed}; the published ratio in parentheses.")
    return TableResult(table, spec.get("title", table), rows, list(CLASS_BALANCE_COLUMNS), pd.DataFrame(records),
                       pd.DataFrame(per_seed, columns=["row", "column", "seed", "value"]), caption, 2)


# --------------------------------------------------------------------------------------------
# building one table

def table_item(project: Project, protocol: str, paper: str, table: str) -> ReportItem:
    project.resolver.check_names(paper, table=table)
    return ReportItem(project, protocol, paper, "tables", table)


def table_inputs(item: ReportItem) -> list[str]:
    return TABLE_KINDS.get(item.spec["kind"])["inputs"](item)


def make_table(item: ReportItem) -> TableResult:
    """Build a table with its kind's builder; every kind's caption then ends with :func:`caption_notes`."""
    result = TABLE_KINDS.get(item.spec["kind"]).obj(item)
    summary = result.summary if len(result.summary) else pd.DataFrame(columns=SUMMARY_COLUMNS)
    result.summary = summary[SUMMARY_COLUMNS]
    notes = caption_notes(item, result.summary)
    result.caption = f"{result.caption} {notes}" if notes else result.caption
    return result
