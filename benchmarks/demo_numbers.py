#!/usr/bin/env python3
"""What the demo measured, as docs/demo.md quotes it: the mean over seeds of every (setting, method) row of the
learning bar, per paper, written into docs/demo.md between the ``demo:measured`` markers from the demo's own
``evidence/bar.csv`` (what `fedrepro evidence` wrote at the end of `bash scripts/demo.sh`).

    bash scripts/demo.sh                   # the demo, then
    python benchmarks/demo_numbers.py      # docs/demo.md's "Measured" numbers from its results
    python benchmarks/demo_numbers.py --configfiles config/demo.yaml --print    # print the block only

tests/test_doc_numbers.py checks that the block is what this script writes from the results in the checkout
(where a demo has run there).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
BLOCK = "demo:measured"


def bar_words(rows: pd.DataFrame) -> str:
    chance, threshold = float(rows["chance"].iloc[0]), float(rows["threshold"].iloc[0])
    if rows["task"].iloc[0] == "retrieval":
        return f"retrieval, pool {round(1 / chance)}; {100 * threshold:.1f}% R@1"
    return f"{round(1 / chance)} classes; {100 * threshold:.0f}% BACC"


def render(project, scores: pd.DataFrame, measured: str) -> str:
    """The block: the verdict over every row, then per paper its rows' means in %, in the order of the runs."""
    from fedrepro.report.evidence import summary_table
    from fedrepro.report.item import method_labels, short_title

    summary = summary_table(scores)
    clear = int(summary["cleared"].sum())
    seeds = scores["seed"].nunique()
    lines = [f"Measured {measured}: `bash scripts/demo.sh`, then `python benchmarks/demo_numbers.py` wrote this block "
             f"from its `evidence/bar.csv`. **{clear} of the {len(summary)} (setting, method) rows clear the bar with "
             f"every seed.**", "", f"| paper (bar) | rows: mean over {seeds} seeds, in % |", "|---|---|"]
    for paper, rows in summary.groupby("paper", sort=False):
        labels = method_labels(project, paper, rows["method"])
        several, both = rows["setting"].nunique() > 1, rows["protocol"].nunique() > 1
        cells = []
        for r in rows.to_dict("records"):
            label = labels[r["method"]] + (f" on {r['setting']}" if several else "")
            label += f" ({r['protocol']} protocol)" if both and r["protocol"] != "clean" else ""
            cells.append(f"{label} {100 * r['mean']:.1f}" if not math.isnan(r["mean"]) else f"{label} –")
        lines.append(f"| {short_title(project, paper)} ({bar_words(scores[scores['paper'] == paper])}) | "
                     f"{', '.join(cells)} |")
    return "\n".join(lines)


def block_from_results(configfiles: list[str]) -> str:
    from fedrepro import paths
    from fedrepro.config import load_project

    project = load_project(configfiles, root=ROOT)
    bar = Path(paths.evidence("bar.csv"))
    if not bar.exists():
        raise SystemExit(f"{bar} not found: run the demo first (bash scripts/demo.sh)")
    from fedrepro.report.evidence import read_bar

    return render(project, read_bar(bar), time.strftime("%Y-%m-%d", time.localtime(bar.stat().st_mtime)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfiles", nargs="+", default=["config/demo.yaml"])
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs/demo.md")
    parser.add_argument("--print", action="store_true", help="print the block, change no file")
    args = parser.parse_args(argv)
    block = block_from_results(args.configfiles)
    if args.print:
        print(block)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from docblock import replace_block

    replace_block(args.markdown, BLOCK, block)
    print(f"written to {args.markdown}")


if __name__ == "__main__":
    main()
