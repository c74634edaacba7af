"""Did every method learn? The learning bar of a configuration (``evidence`` in config/demo.yaml) and
the evidence page that shows it: results/evidence/{index.md, index.html, bar.csv, <paper>.png}.

Every run is scored by what its task reports at its selected round:

- classification: balanced accuracy (BACC) on the global test set. Chance is 1 / the number of classes
  present in the scored set, so predicting the majority class of a long-tailed set scores chance.
- retrieval: Recall@1 averaged over the clients' held-out pairs; random is 1 / the pool a text ranks
  its image in (``retrieval.pool``, or the client's pair count when smaller).
- a personalized method (its clients keep their own models: FedAdapterProto and its baselines with
  ``client_eval: local``, decentralized training) learns when each client's model does on held-out data of its
  own client: its client's test split, never trained on and never used to select a round (``client<k>``; for
  retrieval ``client<k>@client<k>``), chance from the classes present in each client's split. The value the
  paper's table reports for them (the clients' models on a held-out site, ``client<k>@global``; retrieval: every
  client's data scored by every model, ``clients_mean``) is shown beside it as "paper's metric": a site none of
  the clients trained on measures how far personal models transfer, not whether they learned.

A run passes when it reaches chance + ``bacc_above_chance`` (retrieval: ``recall_times_random`` x
random). A run below the bar is reported below it, never counted as passing; where its paper file gives the
reason, decided on validation data or from the configuration (``bar_explanation``), the reason stands beside it
and in the captions of the tables it is in, and the page draws the variant's validation curve. ``--check`` fails
on a run below the bar without one. The page also draws, per paper, the scored metric per round of every
method (mean and 95% t-interval over seeds), from the runs' ``history.csv``.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .. import paths
from ..config import Project
from ..io import atomic_path, read_json
from ..paths import RunKey
from .html import data_uri, inline, page, pipe_table
from .item import data_note as item_data_note
from .item import method_labels
from .plotting import data_note, grid, pyplot, save_figure, suptitle
from .stats import ci95_per_row, plus_minus, summarise

PERSONAL = re.compile(r"^client\d+@global$")       # a client's own model on the global test set (the paper's metric)
OWN = re.compile(r"^client(\d+)$")                  # a client's test split, scored with the model used for it


def bar_spec(project: Project) -> dict | None:
    return project.config.get("evidence")


def explanation(project: Project, paper: str, method: str) -> str | None:
    """Why a method variant may fall below the bar on this data (``bar_explanation`` of its paper file), or None."""
    return project.papers[paper]["methods"][method].get("bar_explanation")


def task_of(project: Project, key: RunKey) -> str:
    from ..registry import model_class

    return model_class(project.resolver.run_config(key)["train"]["model"]["family"]).task


def run_inputs(project: Project) -> list[str]:
    """Every file the evidence reads: each run's metrics, predictions and history."""
    return [paths.run_file(key, name) for key in project.plan.runs()
            for name in ("metrics.json", "predictions.npz", "history.csv")]


def score_run(project: Project, key: RunKey) -> dict:
    """One run's scored value against its bar (and, for a personalized run, the paper's metric beside it)."""
    spec = bar_spec(project) or {}
    metrics = read_json(paths.run_file(key, "metrics.json"))
    evals = metrics["eval"]
    row = {"paper": key.paper, "protocol": key.protocol, "setting": key.setting, "method": key.method, "seed": key.seed,
           "paper_metric": "", "paper_value": math.nan}
    if task_of(project, key) == "retrieval":
        pool = project.resolver.run_config(key)["train"]["model"]["retrieval"]["pool"]
        clients = sorted(k for k in evals if OWN.match(k))
        own = [f"{k}@{k}" for k in clients if f"{k}@{k}" in evals]
        # a client's pair count: from its own row, or (one model per client) its own model on its own pairs
        sizes = [evals[k].get("n") or evals.get(f"{k}@{k}", {}).get("n") for k in clients]
        sizes = [n for n in sizes if n]
        random = float(np.mean([1.0 / min(pool, n) for n in sizes])) if sizes else math.nan
        if own:     # one model per client: each on its own client's held-out pairs
            value = float(np.mean([evals[k].get("recall@1", math.nan) for k in own]))
            row.update(metric="recall@1 (each client's model, own held-out pairs)", paper_metric="recall@1 (clients_mean)",
                       paper_value=evals.get("clients_mean", {}).get("recall@1", math.nan))
        else:
            value = evals.get("clients_mean", {}).get("recall@1", math.nan)
            row.update(metric="recall@1 (clients_mean)")
        row.update(task="retrieval", value=value, chance=random, threshold=spec.get("recall_times_random", 3.0) * random)
    else:
        personal = sorted(k for k in evals if PERSONAL.match(k))
        own = [k.split("@")[0] for k in personal if k.split("@")[0] in evals]
        if personal and own:
            keys = own
            row.update(metric="bacc (each client's model, own held-out data)",
                       paper_metric="bacc (clients' models on global)",
                       paper_value=float(np.mean([evals[k]["bacc"] for k in personal])))
        elif personal:      # a split that holds no client test data (e.g. the authors' indexing trains on every row)
            keys = personal
            row.update(metric="bacc (clients' models on global: no client holds held-out data)")
        else:
            keys = ["global"]
            row.update(metric="bacc (global)")
        value = float(np.mean([evals[k]["bacc"] for k in keys])) if all(k in evals for k in keys) else math.nan
        predictions = np.load(paths.run_file(key, "predictions.npz"))
        present = [len(np.unique(predictions[f"selected:{k}/labels"])) for k in keys
                   if f"selected:{k}/labels" in predictions]
        chance = float(np.mean([1.0 / n for n in present if n])) if present else math.nan
        row.update(task="classification", value=value, chance=chance, threshold=chance + spec.get("bacc_above_chance", 0.25))
    row["explanation"] = explanation(project, key.paper, key.method) or ""
    row["passed"] = bool(value >= row["threshold"]) if not math.isnan(value) else False
    return row


def score_runs(project: Project) -> pd.DataFrame:
    return pd.DataFrame([score_run(project, key) for key in project.plan.runs()])


def read_bar(path: str | Path) -> pd.DataFrame:
    """bar.csv as :func:`write_page` wrote it (an empty ``explanation`` or ``paper_metric`` is none, not NaN)."""
    scores = pd.read_csv(path)
    for column in ("explanation", "paper_metric"):
        if column in scores:
            scores[column] = scores[column].astype(object).fillna("").astype(str)
    return scores


def failures(scores: pd.DataFrame) -> pd.DataFrame:
    """Runs below the bar whose paper file gives no reason for it (``--check`` fails on these)."""
    return scores[~scores["passed"] & (scores["explanation"] == "")]


def explained(scores: pd.DataFrame) -> pd.DataFrame:
    """Runs below the bar with the reason their paper file gives: reported below it, never counted as passing."""
    return scores[~scores["passed"] & (scores["explanation"] != "")]


def curve_column(history: pd.DataFrame, task: str) -> pd.Series:
    """The scored metric per evaluated round of one run."""
    evals = {c.rsplit("/", 1)[0] for c in history.columns if "/" in c}
    if task == "retrieval":
        own = [f"{k}@{k}/recall@1" for k in evals if OWN.match(k) and f"{k}@{k}/recall@1" in history]
        column = history[own].mean(axis=1, skipna=False) if own else history.get("clients_mean/recall@1")
    else:
        personal = sorted(f"{k}/bacc" for k in evals if PERSONAL.match(k) and f"{k}/bacc" in history)
        own = sorted(f"{k}/bacc" for k in evals if OWN.match(k) and f"{k}/bacc" in history)
        scored = (own or personal) if personal else []
        column = history[scored].mean(axis=1, skipna=False) if scored else history.get("global/bacc")
    return per_round(history, column)


def per_round(history: pd.DataFrame, column: pd.Series | None) -> pd.Series:
    """``column`` of a run's history indexed by round, the rounds it was not evaluated at dropped."""
    if column is None:
        return pd.Series(dtype=float)
    return pd.Series(column.to_numpy(), index=history["round"].to_numpy()).dropna()


def draw_paper(project: Project, paper: str, scores: pd.DataFrame, out_png: Path) -> None:
    """One panel per (protocol, setting): the scored metric per round of every method, mean and 95%
    t-interval over seeds, with the bar as a dashed line."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    mine = scores[scores["paper"] == paper]
    labels = method_labels(project, paper, mine["method"])
    panels = list(mine.groupby(["protocol", "setting"], sort=False))
    fig, axes = grid(plt, len(panels), 3, size=(5.0, 3.6))
    for ax, ((protocol, setting), runs) in zip(axes, panels):
        for method, seeds in runs.groupby("method", sort=False):
            series = [curve_column(pd.read_csv(paths.run_file(project.resolver.run_key(paper, setting, method, s, protocol), "history.csv")),
                                   seeds["task"].iloc[0]) for s in seeds["seed"]]
            table = pd.concat(series, axis=1).dropna(how="all")
            if table.empty:
                continue
            mean, half = 100 * table.mean(axis=1), 100 * ci95_per_row(table)
            line, = ax.plot(mean.index, mean, marker="o", markersize=3, label=labels[method] + evaluated_at(mean.index))
            ax.fill_between(mean.index, mean - half, mean + half, alpha=0.15, color=line.get_color())
        bar = 100 * runs["threshold"].mean()
        ax.axhline(bar, color="black", linestyle="--", linewidth=1, label="learning bar")
        ax.set_title(f"{setting} ({protocol})")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))     # rounds are whole numbers
        ax.set_ylabel(f"{runs['metric'].iloc[0]} (%)")
        ax.legend(fontsize=6, ncol=2)
    suptitle(fig, f"{paper}: scored metric at each evaluated round", f"line and band: {plus_minus(len(project.seeds))}")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    save_figure(fig, out_png)
    plt.close(fig)


def evaluated_at(rounds) -> str:
    """What a legend says about a method evaluated at only some rounds (``train.eval_every``), so that a curve
    that starts late, or a single point, is not taken for a missing one: "" (every round from the first), "
    (evaluated at round 3 only)", " (evaluated every 4 rounds)"."""
    rounds = [int(r) for r in rounds]
    if len(rounds) == 1:
        return f" (evaluated at round {rounds[0]} only)" if rounds[0] != 1 else ""
    steps = {b - a for a, b in zip(rounds, rounds[1:])}
    if rounds[0] == 1 and steps == {1}:
        return ""
    return f" (evaluated every {steps.pop()} rounds)" if len(steps) == 1 else f" (evaluated at rounds {', '.join(map(str, rounds))})"


def validation_column(history: pd.DataFrame, task: str) -> pd.Series:
    """The scored metric on the clients' validation splits per evaluated round (``val_mean``): what a decision on the
    budget of a variant below the bar rests on (never its test score)."""
    return per_round(history, history.get("val_mean/recall@1" if task == "retrieval" else "val_mean/bacc"))


def draw_validation(project: Project, paper: str, low: pd.DataFrame, out_png: Path) -> None:
    """One panel per variant below the bar with a reason on file: its validation metric per evaluated round, one line
    per seed, so a reader sees whether it was still climbing when the scaled budget ran out."""
    plt = pyplot()
    variants = list(low.groupby(["protocol", "setting", "method"], sort=False))
    fig, axes = grid(plt, len(variants), 3, size=(4.2, 3.2))
    for ax, ((protocol, setting, method), runs) in zip(axes, variants):
        task = runs["task"].iloc[0]
        for seed in sorted(runs["seed"]):
            history = pd.read_csv(paths.run_file(project.resolver.run_key(paper, setting, method, seed, protocol), "history.csv"))
            curve = validation_column(history, task)
            ax.plot(curve.index, 100 * curve, marker="o", markersize=3, label=f"seed {seed}")
        ax.set_title(f"{method_labels(project, paper, [method])[method]} ({setting})", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(("Recall@1" if task == "retrieval" else "BACC") + " on validation (%)")
        ax.legend(fontsize=6)
    suptitle(fig, f"{paper}: validation curves of the variants below the bar")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    save_figure(fig, out_png)
    plt.close(fig)


def summary_table(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per (paper, protocol, setting, method): the value over seeds and how many seeds passed."""
    rows = []
    for (paper, protocol, setting, method), runs in scores.groupby(["paper", "protocol", "setting", "method"], sort=False):
        values = runs["value"].to_numpy(dtype=float)
        n, stats = len(values), summarise(values)
        rows.append({"paper": paper, "protocol": protocol, "setting": setting, "method": method,
                     "metric": runs["metric"].iloc[0], "mean": values.mean(), "ci95": stats["ci95"], "n": n,
                     "paper_metric": runs["paper_metric"].iloc[0], "paper_mean": runs["paper_value"].mean(),
                     "bar": runs["threshold"].mean(), "seeds passed": f"{int(runs['passed'].sum())}/{n}",
                     "cleared": bool(runs["passed"].all()), "explanation": runs["explanation"].iloc[0]})
    return pd.DataFrame(rows)


def markdown(summary: pd.DataFrame, project: Project) -> str:
    spec = bar_spec(project) or {}
    lines = ["# Evidence: did every method learn?", "",
             f"Bar: classification BACC >= chance + {100 * spec.get('bacc_above_chance', 0.25):.0f} points on the global "
             f"test set (chance = 1 / classes present); retrieval Recall@1 >= {spec.get('recall_times_random', 3.0):g} x "
             f"random. Measured: this pipeline's value, {plus_minus(len(project.seeds))}, in %; every seed's "
             f"value: [bar.csv](bar.csv).", "",
             "A personalized method (one model per client) is scored by each client's model on held-out data of its "
             "own client (its test split: never trained on, never used to select a round); the value its paper's "
             "table reports (the clients' models on a site none of them trained on) stands beside it, as "
             "\"paper's metric\".", ""]
    below = ~summary["cleared"]
    reasoned = int((below & (summary["explanation"] != "")).sum())
    headline = f"{int((~below).sum())} of {len(summary)} (setting, method) rows clear the bar with every seed"
    if below.any():
        headline += (f"; {reasoned} fall below it with the reason their paper file gives (with their validation curves), "
                     f"{int(below.sum()) - reasoned} without one")
    lines += [f"**{headline}.**", ""]
    for paper, rows in summary.groupby("paper", sort=False):
        lines += [f"## {paper}", "", f"![{paper}]({paper}.png)", ""]
        if (~rows["cleared"] & (rows["explanation"] != "")).any():      # write_page draws it for these rows
            lines += [f"![validation curves of {paper}'s rows below the bar]({paper}-validation.png)", ""]
        n = rows["n"].max()
        lines += [f"| protocol | setting | method | metric | measured (mean ± 95% CI, n = {n}) | bar | seeds passed | "
                  f"paper's metric | below the bar because |",
                  "|---|---|---|---|---|---|---|---|---|"]
        labels = method_labels(project, paper, rows["method"])
        for r in rows.to_dict("records"):
            label = labels[r["method"]]
            ci = f" ± {100 * r['ci95']:.1f}" if not math.isnan(r["ci95"]) else ""
            beside = f"{r['paper_metric']}: {100 * r['paper_mean']:.1f}" if r["paper_metric"] else ""
            lines.append(f"| {r['protocol']} | {r['setting']} | {label} | {r['metric']} | {100 * r['mean']:.1f}{ci} | "
                         f"{100 * r['bar']:.1f} | {r['seeds passed']} | {beside} | "
                         f"{'' if r['cleared'] else r['explanation']} |")
        lines.append("")
    return "\n".join(lines)


def write_page(project: Project, out_dir: str | Path) -> pd.DataFrame:
    """bar.csv (every run), index.md and index.html (figures embedded), one figure per paper."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = score_runs(project)
    with atomic_path(out_dir / "bar.csv") as tmp:
        scores.to_csv(tmp, index=False)
    summary = summary_table(scores)
    for paper in scores["paper"].unique():
        with data_note(item_data_note(project, paper)):
            draw_paper(project, paper, scores, out_dir / f"{paper}.png")
            low = explained(scores[scores["paper"] == paper])
            if len(low):
                draw_validation(project, paper, low, out_dir / f"{paper}-validation.png")
    text = markdown(summary, project)
    with atomic_path(out_dir / "index.md") as tmp:
        Path(tmp).write_text(text)
    with atomic_path(out_dir / "index.html") as tmp:
        Path(tmp).write_text(to_html(text, out_dir))
    return scores


def to_html(text: str, folder: Path) -> str:
    """The Markdown page as a self-contained HTML page (figures as data URIs, so it also works inside the
    report)."""
    body, table = [], []

    def flush():
        if table:
            body.append(pipe_table(table))
            table.clear()

    for line in text.split("\n"):
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        image = re.fullmatch(r"!\[(.*)\]\((.*)\)", line)
        if image:
            body.append(f'<img alt="{html.escape(image.group(1))}" src="{data_uri(folder / image.group(2))}" '
                        f'style="max-width:100%">')
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line:
            body.append(f"<p>{inline(line)}</p>")
    flush()
    return page("Evidence", "".join(body))
