"""The report (fedrepro.report.overview, `fedrepro report`, the `report` rule): one self-contained page of whatever is
built, one table's worth or the whole grid, opening per paper on what ran, whether the published numbers reproduced
and whether every method learned, then the tables as tables, then the figures; the rule graph last (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fedrepro import paths
from fedrepro.cli import main as cli
from fedrepro.config import load_project
from fedrepro.io import write_json
from fedrepro.report import overview
from fedrepro.report.item import stand_in_warning

TINY = "tests/data/infra/config.yaml"       # one paper, one setting, one method: table `accuracy`, figure `curves`
DOT = """digraph snakemake_dag {
	0[label = "all", color = "0.00 0.6 0.85", style="rounded"];
	1[label = "table", color = "0.52 0.6 0.85", style="rounded"];
	2[label = "train", color = "0.57 0.6 0.85", style="rounded"];
	1 -> 0
	2 -> 1
}"""


@pytest.fixture
def tiny(root, tmp_path, monkeypatch):
    """The tiny grid with two seeds, in a scratch folder, both runs' files written here (seed 0 on a GPU in bf16)."""
    monkeypatch.chdir(tmp_path)
    for folder in ("workflow", "config", "tests"):       # the CLI reads schemas and paper files from its cwd
        (tmp_path / folder).symlink_to(root / folder)
    project = load_project(["config/config.yaml", TINY], {"seeds": [0, 1]}, root=root)
    for key, acc, device, precision in zip(project.plan.runs(), (0.4930555555555555, 0.5), ("cuda", "cpu"), ("bf16", "fp32")):
        Path(paths.run_dir(key)).mkdir(parents=True)
        write_json(paths.run_file(key), {"eval": {"global": {"acc": acc}}, "run": {"protocol": "clean"},
                                         "selection": {"rule": "best_val"}, "test_data": {}})
        write_json(paths.run_file(key, "run_manifest.json"), {
            "inputs": {}, "hardware": {"device": device}, "run": {"config_hash": project.resolver.run_config(key)["config_hash"]},
            "variant": {"precision": precision, "encoder_precision": "fp32", "jpeg_draft": True}})
        pd.DataFrame({"round": [1, 2], "global/acc": [0.4, acc]}).to_csv(paths.run_file(key, "history.csv"), index=False)
    yield project
    load_project([root / "config/config.yaml"], root=root)     # the results folder of the default configuration


def run_cli(project, *args):
    cli([*args[:1], "--config-json", json.dumps(project.config), "--configfiles", "config/config.yaml", TINY, *args[1:]])


def page_of(project) -> str:
    overview.write(project, "results/report.html", DOT)
    return Path("results/report.html").read_text()


def test_one_table_built_is_a_report_of_that_table(tiny):
    """Only the table exists (the issue: `snakemake --report` refused any configuration not fully built): the page
    renders it as a table at the paper's rounding, says what ran, and lists what is not built with its command."""
    run_cli(tiny, "table", "--protocol", "clean", "--paper", "foundation", "--table", "accuracy",
            "--out", paths.table("clean", "foundation", "accuracy"))
    page = page_of(tiny)
    assert "2 of 2 training runs; 1 of 1 tables; 0 of 1 figures; 0 of 1 scorecards" in page
    assert "Protocol clean (no test data used for selection or adaptation): 2 of 2 planned runs done." in page
    assert "Seeds: 2 of the 2 configured (0, 1) have runs: 0, 1." in page
    assert ("Numerics: precision bf16 (1 run), fp32 (1 run); frozen encoder fp32 (2 runs); large JPEGs DCT-scaled "
            "(2 runs); device cuda (1 run), cpu (1 run).") in page
    assert "<td>FedCLIP</td><td>49.65 ± 4.41</td>" in page                        # the table, at its 2 decimals
    assert "49.652" not in page                                                   # never the long-form CSV
    assert ("<b>accuracy.</b> Global test accuracy (%). Measured here: mean ± half-width of the 95% t-interval of the "
            "mean over n = 2 seeds") in page                                       # with its caption: what ± is
    # every seed's value one click away, relative to the page
    assert "<a href='tables/clean/foundation/accuracy.seeds.csv'>accuracy.seeds.csv</a>" in page
    assert ("<code>snakemake results/figures/clean/foundation/curves.png --cores all --configfile config/config.yaml "
            "tests/data/infra/config.yaml</code>") in page
    assert "<h3>Figures</h3>" not in page


def test_the_page_opens_on_results_and_ends_on_the_rule_graph(tiny):
    for kind, name, out in (("table", "accuracy", paths.table("clean", "foundation", "accuracy")),
                            ("figure", "curves", paths.figure("clean", "foundation", "curves"))):
        run_cli(tiny, kind, "--protocol", "clean", "--paper", "foundation", f"--{kind}", name, "--out", out)
    run_cli(tiny, "scorecard", "--paper", "foundation", "--out", paths.scorecard("foundation"))
    page = page_of(tiny)
    order = [page.index(h) for h in ("<h3>What ran</h3>", "<h3>Did the published numbers reproduce?</h3>",
                                     "<h3>Tables</h3>", "<h3>Figures</h3>", "the rule graph</h2>")]
    assert order == sorted(order), order
    assert "Not built yet" not in page and "1 of 1 figures; 1 of 1 scorecards" in page
    assert page.count("src='data:image/png;base64,") == 2                         # the figure and the rule graph
    assert "<b>curves.</b> Global test accuracy per round. Protocol: clean." in page
    assert page.index("alt='rule graph'") > page.index("alt='curves'")
    assert "no published value to score" in page                                   # the tiny table has none


def test_the_verdict_of_the_learning_bar_is_in_the_papers_section(tiny):
    tiny.config["evidence"] = {"bacc_above_chance": 0.25, "recall_times_random": 3}
    rows = [{"paper": "foundation", "protocol": "clean", "setting": "bt_iid", "method": "fedclip", "seed": s,
             "metric": "bacc (global)", "value": v, "threshold": 0.5, "passed": v >= 0.5, "explanation": "",
             "paper_metric": "", "paper_value": float("nan")}
            for s, v in ((0, 0.6), (1, 0.4))]
    Path(paths.evidence("bar.csv")).parent.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(paths.evidence("bar.csv"), index=False)
    page = page_of(tiny)
    assert "<h3>Did every method learn?</h3>" in page
    assert ("0 of 1 (setting, method) rows clear the learning bar with every seed; 0 fall below it with the reason "
            "their paper file gives, 1 without one.") in page
    assert "Below the bar: FedCLIP on bt_iid (clean), measured 50.0% against a bar of 50.0% (1/2 seeds passed)." in page
    first = page[page.index("<table id='summary'>"):page.index("<h2")]
    assert "0 of 1 clear the bar; 1 below (0 with a reason on file)" in first


def _built_table(project, published: float, mean: float, ci95: float) -> None:
    """The tiny grid's table as its job writes it (its .md and .csv), with a published value."""
    md = Path(paths.table("clean", "foundation", "accuracy"))
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("**accuracy.** Global test accuracy (%).\n\n| | BT (17 MRIs) |\n|---|---|\n| FedCLIP | x |\n")
    pd.DataFrame([{"row": "FedCLIP", "column": "BT (17 MRIs)", "mean": mean, "std": 1.0, "se": 1.0, "ci95": ci95, "n": 2,
                   "published": published, "delta": mean - published}]).to_csv(md.with_suffix(".csv"), index=False)


def test_the_first_screen_answers_what_reproduced_what_learned_and_what_ran_on_stand_ins(tiny):
    """Issue 43: the report opens on one summary across the papers, linked to each section: per paper what data it ran
    on, per table how its published numbers fell (the scorecard's equivalence verdict) or why there is none, and
    whether every method learned."""
    _built_table(tiny, published=50.0, mean=49.6, ci95=0.3)       # [49.3, 49.9] within 50 ± 2
    page = page_of(tiny)
    first = page[page.index("<table id='summary'>"):page.index("<h2")]
    assert "<a href='#foundation'><b>foundation</b></a>" in first and "the paper's own" in first
    assert "<b>accuracy</b> 1/1 reproduced</span>" in first
    assert "no learning bar in this configuration" in first and "2/2 runs, 1/1 tables, 0/1 figures" in first
    assert "mean ± half-width of the 95% t-interval of the mean over the n seeds" in first      # what ± is
    assert page.index("id='summary'") < page.index("<h2 id='foundation'")
    _built_table(tiny, published=50.0, mean=49.6, ci95=4.41)      # the same mean, noisier: these seeds cannot tell
    assert "<b>accuracy</b> 0/1 reproduced, 1 inconclusive</span>" in page_of(tiny)
    # stand-in data: the row says so, and no table gets a verdict
    tiny.papers["foundation"]["stand_in"] = "Fashion-MNIST for the MRIs"
    md = Path(paths.table("clean", "foundation", "accuracy"))      # its caption says it too, as every stand-in table's
    md.write_text(md.read_text().replace("(%).", f"(%). {stand_in_warning('Fashion-MNIST for the MRIs')}", 1))
    page = page_of(tiny)
    first = page[page.index("<table id='summary'>"):page.index("<h2")]
    assert "<b>stand-in</b>" in first and "<b>no verdict</b>: stand-in data. Tables: <span" in first
    assert "<b>accuracy</b></span>" in first and "reproduced" not in first.split("<p class='legend'>")[0]
    assert "stand-in data and models, so no reproduction verdict" in page
    assert page.count("Fashion-MNIST for the MRIs. These numbers show whether") == 1    # the stand-in note once


def test_the_rule_graph_is_read_from_snakemake_and_drawn(tmp_path):
    nodes, edges = overview.parse_rule_graph(DOT)
    assert nodes == {"0": "all", "1": "table", "2": "train"} and edges == [("1", "0"), ("2", "1")]
    overview.draw_rule_graph(DOT, tmp_path / "graph.png")
    assert (tmp_path / "graph.png").stat().st_size > 2000
