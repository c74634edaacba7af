"""Paper tables: one cell = one (setting, method) over seeds, next to the published value.

Outputs for ``results/tables/<paper>/<table>``:
    .csv        one row per cell: mean, std, se, ci95, n, published, delta (ours - published)
    .seeds.csv  every per-seed value that went into a cell (long format)
    .md / .tex  the table as papers print it: "mean ± err (published)", with a caption that says
                what ± is, how many seeds, which protocol and which model-selection rule produced it
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..config import Project, resolve_cell
from ..io import read_json, write_csv, write_text
from .stats import ERROR_BARS, summarise


@dataclass
class TableResult:
    name: str
    title: str
    rows: list[str]
    columns: list[str]
    summary: pd.DataFrame       # row, column, mean, std, se, ci95, n, published, delta
    seeds: pd.DataFrame         # row, column, seed, value
    caption: str
    decimals: int


def metric_value(metrics: dict, eval_key: str, metric: str) -> float:
    """``metric`` of eval set ``eval_key``; dotted names (``comm.params_per_client_round``,
    ``time.train_s_per_round``) address the top level of metrics.json instead."""
    if "." in metric:
        section, name = metric.split(".", 1)
        return float(metrics[section][name])
    try:
        return float(metrics["eval"][eval_key][metric])
    except KeyError:
        available = sorted(metrics.get("eval", {}))
        raise KeyError(f"metrics have no {eval_key}/{metric}; eval sets available: {available}") from None


def run_dir(paper: str, setting: str, method: str, seed: int, root: str | Path = "results/runs") -> Path:
    return Path(root) / paper / setting / method / f"seed{seed}"


def downstream_path(paper: str, setting: str, method: str, seed: int, task: str,
                    root: str | Path = "results/downstream") -> Path:
    """Where the downstream evaluation ``task`` of a pre-trained run writes its result (same layout as
    metrics.json: ``{"run", "selection", "eval": {<eval>: {<metric>: value}}}``)."""
    return Path(root) / paper / setting / method / f"seed{seed}" / f"{task}.json"


def read_published(path: Path | None) -> dict[tuple[str, str], float]:
    if path is None or not path.exists():
        return {}
    frame = pd.read_csv(path, comment="#", dtype={"row": str})
    out = {}
    for _, rec in frame.iterrows():
        for col in frame.columns:
            if col != "row" and not pd.isna(rec[col]):
                try:
                    out[(str(rec["row"]), col)] = float(rec[col])
                except ValueError:
                    pass  # non-numeric published entries (e.g. "2xSigma") are shown as text by notes
    return out


def one_round(metrics: dict, folder: Path, selection: dict | None) -> dict:
    """A run's metrics as the table reads them. A run selected on the test set (paper protocol: each
    column's best over rounds) is re-read at one round for every column when the table says
    ``selection: {rule: one_round, eval, metric}``: the round best on that eval set and metric (from
    history.csv), e.g. a transferred model's column from the round selected on the source task."""
    if not selection or selection.get("rule", "per_column") != "one_round" or metrics["selection"]["rule"] != "best_test":
        return metrics
    from ..fl.engine import select

    key = f"{selection.get('eval', 'global')}/{selection.get('metric', 'acc')}"
    chosen, info = select(pd.read_csv(folder / "history.csv"), "best_test_round", selection.get("metric", "acc"), 1,
                          round_on=key)
    if not chosen:
        raise KeyError(f"{folder}: table selection one_round on {key}, but {info['note']}")
    return {**metrics, "eval": chosen, "selection": {**info, "rule": "best_test_round"}}


def build_table(project: Project, paper: str, table: str, runs_root: str | Path = "results/runs",
                published_root: str | Path = "config/published") -> TableResult:
    spec = project.papers[paper]["tables"][table]
    seeds = project.config["seeds"]
    published = read_published(Path(published_root) / spec["published"] if spec.get("published") else None)
    rows = spec.get("rows", [])
    columns = spec.get("columns", [])
    row_labels = [r.get("label") or project.papers[paper]["methods"].get(r.get("method"), {}).get("label") or r.get("method")
                  for r in rows]
    col_labels = [c["label"] for c in columns]

    per_seed: list[dict] = []
    protocols, rules = set(), set()
    for row, row_label in zip(rows, row_labels):
        values: dict[str, dict[int, float]] = {}
        for col in columns:
            cell = resolve_cell(spec, row, col)
            if cell is None:
                continue
            for seed in seeds:
                if cell["task"]:
                    metrics = read_json(downstream_path(paper, cell["setting"], cell["method"], seed, cell["task"],
                                                        Path(runs_root).parent / "downstream"))
                else:
                    folder = run_dir(paper, cell["setting"], cell["method"], seed, runs_root)
                    metrics = one_round(read_json(folder / "metrics.json"), folder, spec.get("selection"))
                protocols.add(metrics["run"]["protocol"])
                rules.add(metrics["selection"]["rule"])
                values.setdefault(col["label"], {})[seed] = metric_value(metrics, cell["eval"], cell["metric"]) * cell["scale"]
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
            stats = summarise(vals.tolist())
            pub = published.get((row_label, col_label), math.nan)
            records.append({"row": row_label, "column": col_label, **stats, "published": pub,
                            "delta": stats["mean"] - pub if not math.isnan(pub) else math.nan})
    summary = pd.DataFrame(records)
    bars = project.config["report"]["error_bars"]
    caption = make_caption(spec, table, project, protocols, rules, bars, len(seeds))
    return TableResult(table, spec.get("title", table), row_labels, col_labels, summary, seeds_frame, caption,
                       spec.get("decimals", 2))


def make_caption(spec: dict, table: str, project: Project, protocols: set, rules: set, bars: str, n: int) -> str:
    parts = [spec.get("title", table) + "."]
    parts.append(f"Ours: mean ± {ERROR_BARS[bars]} (n = {n} seeds); the published value in parentheses.")
    if protocols:
        parts.append(f"Protocol: {', '.join(sorted(protocols))}.")
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
    if Path(project.config["paper_dir"]).name == "demo":
        parts.append("DEMO DATA AND TINY MODELS: these numbers exercise the pipeline and are not comparable to the paper.")
    if spec.get("note"):
        parts.append(spec["note"])
    return " ".join(parts)


def _cell_text(rec, bars: str, decimals: int) -> str:
    if rec["n"] == 0:
        return "–"
    text = f"{rec['mean']:.{decimals}f}"
    if not math.isnan(rec[bars]):
        text += f" ± {rec[bars]:.{decimals}f}"
    if not math.isnan(rec["published"]):
        text += f" ({rec['published']:.{decimals}f})"
    return text


def to_grid(result: TableResult, bars: str) -> pd.DataFrame:
    grid = pd.DataFrame(index=result.rows, columns=result.columns, dtype=object)
    for _, rec in result.summary.iterrows():
        grid.loc[rec["row"], rec["column"]] = _cell_text(rec, bars, result.decimals)
    return grid


def render_markdown(result: TableResult, bars: str) -> str:
    grid = to_grid(result, bars)
    header = "| | " + " | ".join(result.columns) + " |"
    rule = "|---|" + "---|" * len(result.columns)
    body = ["| " + row + " | " + " | ".join(grid.loc[row].fillna("–")) + " |" for row in result.rows]
    return "\n".join([f"**{result.name}.** {result.caption}", "", header, rule, *body, ""])


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("±", r"$\pm$"),
                 ("α", r"$\alpha$"), ("–", "--")):
        text = text.replace(a, b)
    return text


def render_latex(result: TableResult, bars: str) -> str:
    grid = to_grid(result, bars)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{_tex_escape(result.caption)}}}", rf"\label{{tab:{result.name}}}",
             r"\begin{tabular}{l" + "c" * len(result.columns) + "}", r"\toprule",
             " & ".join([""] + [_tex_escape(c) for c in result.columns]) + r" \\", r"\midrule"]
    for row in result.rows:
        lines.append(" & ".join([_tex_escape(row)] + [_tex_escape(v) for v in grid.loc[row].fillna("–")]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def write_table(result: TableResult, out_md: str | Path, bars: str) -> None:
    out_md = Path(out_md)
    stem = out_md.with_suffix("")
    write_csv(stem.with_suffix(".csv"), result.summary)
    write_csv(stem.parent / f"{stem.name}.seeds.csv", result.seeds)
    write_text(stem.with_suffix(".tex"), render_latex(result, bars))
    write_text(out_md, render_markdown(result, bars))


def build_split_counts_table(project: Project, paper: str, table: str, splits_root: str | Path = "resources/splits",
                             published_root: str | Path = "config/published") -> TableResult:
    """Training samples per client (rows) for each listed setting (columns), from the split files."""
    spec = project.papers[paper]["tables"][table]
    seed = project.config["seeds"][0]
    published = read_published(Path(published_root) / spec["published"] if spec.get("published") else None)
    columns, records, seeds_rows = [], [], []
    row_order: list[str] = []
    for setting in spec["settings"]:
        label = project.papers[paper]["settings"][setting].get("label", setting)
        columns.append(label)
        counts = pd.read_csv(Path(splits_root) / f"{project.split_id(paper, setting, seed)}.counts.csv")
        for _, rec in counts.iterrows():
            if rec["client"] == "reference":
                continue
            value = float(rec["total"] if rec["client"] in ("global_test", "external") else rec["train"])
            row = rec["client"]
            row_order += [row] if row not in row_order else []
            seeds_rows.append({"row": row, "column": label, "seed": seed, "value": value})
    frame = pd.DataFrame(seeds_rows, columns=["row", "column", "seed", "value"])
    for row in row_order:
        for col in columns:
            vals = frame[(frame.row == row) & (frame.column == col)]["value"].tolist()
            pub = published.get((row, col), math.nan)
            stats = summarise(vals)
            records.append({"row": row, "column": col, **stats, "published": pub,
                            "delta": stats["mean"] - pub if not math.isnan(pub) else math.nan})
    caption = (f"{spec.get('title', table)}. Training samples per client under split seed {seed} "
               f"(global_test / external: size of the global / external evaluation set); the published counts in parentheses.")
    return TableResult(table, spec.get("title", table), row_order, columns, pd.DataFrame(records), frame, caption, 0)


TABLE_KINDS = {"runs": build_table, "split_counts": build_split_counts_table}
# kind -> "module:function" for table kinds defined elsewhere; like split_counts they read the split
# count files of the table's ``settings``
TABLE_PLUGINS: dict[str, str] = {
    "class_balance": "fedrepro.report.fediic:build_class_balance_table",
}


def make_table(project: Project, paper: str, table: str) -> TableResult:
    kind = project.papers[paper]["tables"][table].get("kind", "runs")
    if kind in TABLE_PLUGINS:
        from ..methods import load_class

        return load_class(TABLE_PLUGINS[kind])(project, paper, table)
    return TABLE_KINDS[kind](project, paper, table)
