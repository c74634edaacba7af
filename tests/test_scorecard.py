"""The reproduction scorecard: verdicts against the 95% interval, summaries, and what it renders."""

import math
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.report import scorecard

# screenshots and other files a human may want to look at after a CI run
ARTEFACTS = Path(__file__).resolve().parents[1] / "results" / "test-artefacts"


def test_verdicts_are_an_equivalence_test_that_noise_cannot_pass():
    """Issue 43: "the published value inside the interval" let a noisier run reproduce more easily than a precise one.
    Now the whole 95% interval must lie within published ± margin; a wider interval can only make it harder."""
    assert scorecard.verdict(80.0, 0.5, 3, 79.0, margin=2.0) == "reproduced"     # [79.5, 80.5] within [77, 81]
    assert scorecard.verdict(80.0, 1.0, 3, 81.0, margin=2.0) == "reproduced"     # on the edge (79 = 81 - 2) counts
    # the same mean, noisier: the interval reaches past the margin, so these seeds cannot tell
    assert scorecard.verdict(80.0, 3.0, 3, 79.0, margin=2.0) == "inconclusive"
    assert scorecard.verdict(80.0, 30.0, 3, 80.0, margin=2.0) == "inconclusive"  # centred, but wider than the band
    # the old rule's "reproduced" for a published value just inside a wide interval is now inconclusive
    assert scorecard.verdict(46.61, 5.53, 3, 49.41, margin=2.0) == "inconclusive"
    assert scorecard.verdict(80.0, 0.5, 3, 77.0, margin=2.0) == "above"          # [79.5, 80.5] wholly above 79
    assert scorecard.verdict(80.0, 0.5, 3, 83.0, margin=2.0) == "below"          # wholly below 81
    assert scorecard.verdict(80.0, math.nan, 1, 80.0) == "no interval"
    assert scorecard.verdict(math.nan, math.nan, 0, 80.0) == "not run"


def test_the_margin_comes_from_the_table_then_the_paper_then_the_configuration():
    from types import SimpleNamespace

    project = SimpleNamespace(config={"report": {"equivalence_margin": 1.5}},
                              papers={"p": {"equivalence_margin": 3.0, "tables": {"t1": {}, "t2": {"equivalence_margin": {"relative": 0.05}}}},
                                      "q": {"tables": {"t": {}}}})
    assert scorecard.margin_of(project, "p", "t1") == 3.0
    assert scorecard.margin_of(project, "q", "t") == 1.5
    relative = scorecard.margin_of(project, "p", "t2")
    assert scorecard.margin_value(relative, 0.63) == pytest.approx(0.0315)      # 5% of a time in minutes
    # the schema's default is the module's (one number, stated before any result)
    import yaml

    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["report"]["properties"]["equivalence_margin"]["default"] == scorecard.DEFAULT_MARGIN


def test_stand_in_data_gets_no_reproduction_verdict(tmp_path):
    """Issue 43: the demo's FedIIC FedAvg "46.61 [41.08, 52.13] vs 49.41 -> reproduced" under a note that a verdict
    there says nothing about the paper. On stand-in data no cell is judged, data cells included."""
    t1 = _table(tmp_path, "table1", [{"row": "FedAvg", "column": "BACC", "mean": 46.61, "ci95": 5.53, "n": 3, "published": 49.41}])
    counts = _table(tmp_path, "sizes", [{"row": "client0", "column": "x", "mean": 10.0, "ci95": math.nan, "n": 1, "published": 10.0}])
    card = scorecard.build([("fediic", "table1", "clean", t1), ("fediic", "sizes", "clean", counts, "split_counts")],
                           stand_ins={"fediic"})
    assert set(card["verdict"]) == {"stand-in data"}
    line = scorecard.summary_line(card, "FedIIC")
    assert line.startswith("FedIIC (clean): stand-in data and models, so no reproduction verdict") and "reproduced" not in line
    files = scorecard.ScorecardFiles.at(tmp_path / "out" / "fediic")
    scorecard.write(card, "FedIIC", files, ["FedIIC: Fashion-MNIST for ISIC."])
    assert "reproduced" not in files.html.read_text().split("<table")[1].split("</table>")[0]


def _table(tmp_path, name, records):
    path = tmp_path / f"{name}.csv"
    pd.DataFrame(records).to_csv(path, index=False)
    return path


def test_scorecard_cells_summary_and_rendering(tmp_path):
    nan = float("nan")
    t2 = _table(tmp_path, "table2", [
        {"row": "FedAvg", "column": "BT", "mean": 66.0, "std": 0.24, "se": 0.14, "ci95": 0.6, "n": 3, "published": 66.24, "delta": -0.24},
        {"row": "FedAvg", "column": "SC", "mean": 40.0, "std": 1.0, "se": 0.58, "ci95": 2.48, "n": 3, "published": 48.30, "delta": -8.3},
        {"row": "FedAvg", "column": "avg", "mean": 53.0, "std": 1.0, "se": 0.58, "ci95": 2.48, "n": 3, "published": nan, "delta": nan},
        {"row": "FACMIC", "column": "BT", "mean": nan, "std": nan, "se": nan, "ci95": nan, "n": 0, "published": 82.74, "delta": nan},
    ])
    card = scorecard.build([("facmic", "table2", "clean", t2), ("facmic", "table2", "paper", t2)])
    assert len(card) == 6                                   # published cells only, once per protocol
    clean = card[card.protocol == "clean"].set_index(["row", "column"])
    assert clean.loc[("FedAvg", "BT"), "verdict"] == "reproduced"
    assert clean.loc[("FedAvg", "SC"), "verdict"] == "below"
    assert clean.loc[("FACMIC", "BT"), "verdict"] == "not run"
    assert clean.loc[("FedAvg", "SC"), "delta"] == pytest.approx(-8.3)
    assert clean.loc[("FedAvg", "BT"), "ci_low"] == pytest.approx(66.0 - 0.6)
    assert clean.loc[("FedAvg", "BT"), "margin"] == scorecard.DEFAULT_MARGIN
    line = scorecard.summary_line(card)
    assert ("facmic (clean): of the 2 published numbers that could be judged, 1 reproduced (the whole 95% interval of "
            "the measured mean within the equivalence margin of the published value) and 1 below the published value "
            "(the whole interval beyond the margin: not reproduced). Not judged: 1 not run here.") in line.splitlines()
    files = scorecard.ScorecardFiles.at(tmp_path / "out" / "facmic")
    scorecard.write(card, "FACMIC scorecard", files, ["FACMIC: Fashion-MNIST domains for BT."])
    page = files.html.read_text()
    assert "<table id='scorecard'>" in page and "src='data:image/png;base64," in page
    assert "Stand-in data and models" in page and "Fashion-MNIST domains for BT." in page
    assert files.png.stat().st_size > 5000
    assert pd.read_csv(files.csv)["verdict"].tolist() == card["verdict"].tolist()
    markdown = files.md.read_text()
    assert "| table2 | clean | FedAvg | SC | 40.00 ± 2.48 | 3 | 48.30 | -8.30 | ± 2.00 | below |" in markdown
    assert "| measured (mean ± 95% CI) | n (seeds) |" in markdown and "ours" not in markdown.lower()   # FedAdapterProto's "Ours"
    # every seed's value one click away: the tables' .seeds.csv, relative to the scorecard page
    assert "[facmic table2 (clean)](../tables/clean/facmic/table2.seeds.csv)" in markdown


@pytest.mark.slow
def test_scorecard_page_of_real_tables_renders_in_a_browser(tiny_inputs, monkeypatch):
    """The tiny grid's run trained for real under two seeds, its table built by `fedrepro table` and the
    scorecard by `fedrepro scorecard` (what the rules run): Chromium shows the scorecard table and its
    figure (loaded, not broken), and the card's cells are the table CSV's."""
    import json

    import yaml

    from browser import rendered
    from fedrepro import paths
    from fedrepro.cli import main as cli
    from fedrepro.config import Project, deep_merge, load_yaml
    from fedrepro.train import train_run
    from infra_support import REPO, TINY_CONFIG

    workdir, _ = tiny_inputs
    monkeypatch.chdir(workdir)
    paper = yaml.safe_load((REPO / "tests/data/infra/foundation.yaml").read_text())
    paper["tables"]["accuracy"]["published"] = "foundation/tiny.csv"
    Path("papers").mkdir(exist_ok=True)
    Path("papers/foundation.yaml").write_text(yaml.safe_dump(paper))
    Path("config/published/foundation").mkdir(parents=True, exist_ok=True)
    Path("config/published/foundation/tiny.csv").write_text(
        "# * derived by fedrepro: a value for this test.\nrow,BT (17 MRIs)\nFedCLIP,40.0*\n")
    if not Path("workflow").exists():
        Path("workflow").symlink_to(REPO / "workflow")
    config = deep_merge(deep_merge(load_yaml(REPO / "config/config.yaml"), load_yaml(REPO / TINY_CONFIG)),
                        {"paper_dir": "papers", "seeds": [0, 1]})
    project = Project(config, root=".")
    for key in project.plan.runs():
        train_run(project.resolver.run_config(key), paths.run_dir(key), paths.checkpoint_dir(key))
    config_json = json.dumps(project.config, sort_keys=True)
    table_md = paths.table("clean", "foundation", "accuracy", ".md")
    cli(["table", "--config-json", config_json, "--protocol", "clean", "--paper", "foundation", "--table", "accuracy",
         "--out", table_md])
    cli(["scorecard", "--config-json", config_json, "--paper", "foundation", "--out", paths.scorecard("foundation")])

    table = pd.read_csv(paths.table("clean", "foundation", "accuracy", ".csv"))
    card = pd.read_csv(paths.scorecard("foundation", ".csv"))
    assert len(card) == 1 and card.loc[0, "n"] == 2 and card.loc[0, "derived"]
    assert card.loc[0, "mean"] == pytest.approx(table.loc[0, "mean"]) and card.loc[0, "published"] == 40.0
    assert "(40.00*)<br>Δ " in Path(table_md).read_text()
    state = rendered(Path(paths.scorecard("foundation")), ARTEFACTS / "scorecard.png")
    figure = [i for i in state["images"] if i["id"] == "scorecard-figure"]
    assert figure and figure[0]["ok"] and figure[0]["width"] > 300, state["images"]
    assert all(i["ok"] for i in state["images"]), state["images"]
    assert [(t["id"], t["rows"]) for t in state["tables"]] == [("scorecard", 1)]
    assert "of the 1 published numbers that could be judged" in state["text"]
    assert "derived by fedrepro: a value" in state["text"]
    assert (ARTEFACTS / "scorecard.png").stat().st_size > 10_000


def test_the_summary_reads_right_without_the_docs():
    """Issue 34: "0 of 19 cells within the 95% interval (11 below, 8 no interval); 11 judged" made a reader count;
    the summary says in words what was judged, which way the rest fell and why some could not be judged."""
    card = pd.DataFrame({"paper": "facmic", "protocol": "clean", "verdict": ["below"] * 11 + ["no interval"] * 8})
    assert scorecard.summary_line(card, "FACMIC") == (
        "FACMIC (clean): of the 11 published numbers that could be judged, 0 reproduced (the whole 95% interval of the "
        "measured mean within the equivalence margin of the published value) and 11 below the published value (the "
        "whole interval beyond the margin: not reproduced). Not judged: 8 ran with one seed only, so there is no "
        "interval to judge by.")
    mixed = pd.DataFrame({"paper": "x", "protocol": "paper", "verdict": ["reproduced", "inconclusive", "below", "above", "above"]})
    assert scorecard.summary_line(mixed) == (
        "x (paper): of the 5 published numbers that could be judged, 1 reproduced (the whole 95% interval of the measured "
        "mean within the equivalence margin of the published value), 1 inconclusive (the interval reaches past the "
        "margin: these seeds cannot tell) and 1 below and 2 above the published value (the whole interval beyond the "
        "margin: not reproduced).")
    single = pd.DataFrame({"paper": "x", "protocol": "clean", "verdict": ["no interval"] * 3})
    assert scorecard.summary_line(single) == ("x (clean): none of the 3 published numbers could be judged. 3 ran with one "
                                              "seed only, so there is no interval to judge by.")
