"""The reproduction scorecard: verdicts against the 95% interval, summaries, and what it renders."""

import math
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.report import scorecard

# screenshots and other files a human may want to look at after a CI run
ARTEFACTS = Path(__file__).resolve().parents[1] / "results" / "test-artefacts"


def test_verdicts_against_the_95_percent_interval():
    assert scorecard.verdict(80.0, 2.0, 3, 79.0) == "reproduced"
    assert scorecard.verdict(80.0, 2.0, 3, 82.0) == "reproduced"      # on the edge counts as inside
    assert scorecard.verdict(80.0, 2.0, 3, 77.5) == "above"           # ours higher than published
    assert scorecard.verdict(80.0, 2.0, 3, 82.5) == "below"
    assert scorecard.verdict(80.0, math.nan, 1, 80.0) == "no interval"
    assert scorecard.verdict(math.nan, math.nan, 0, 80.0) == "not run"


def _table(tmp_path, name, records):
    path = tmp_path / f"{name}.csv"
    pd.DataFrame(records).to_csv(path, index=False)
    return path


def test_scorecard_cells_summary_and_rendering(tmp_path):
    nan = float("nan")
    t2 = _table(tmp_path, "table2", [
        {"row": "FedAvg", "column": "BT", "mean": 66.0, "std": 1.0, "se": 0.58, "ci95": 2.48, "n": 3, "published": 66.24, "delta": -0.24},
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
    assert clean.loc[("FedAvg", "BT"), "ci_low"] == pytest.approx(66.0 - 2.48)
    line = scorecard.summary_line(card)
    assert ("facmic (clean): 1 of the 2 published numbers that could be judged reproduced (the published value lies "
            "inside the 95% interval of the measured mean); the whole measured interval lies below the published value "
            "for 1. Not judged: 1 not run here.") in line.splitlines()
    files = scorecard.ScorecardFiles.at(tmp_path / "out" / "facmic")
    scorecard.write(card, "FACMIC scorecard", files, ["FACMIC: Fashion-MNIST domains for BT."])
    page = files.html.read_text()
    assert "<table id='scorecard'>" in page and "src='data:image/png;base64," in page
    assert "Stand-in data and models" in page and "Fashion-MNIST domains for BT." in page
    assert files.png.stat().st_size > 5000
    assert pd.read_csv(files.csv)["verdict"].tolist() == card["verdict"].tolist()
    markdown = files.md.read_text()
    assert "| table2 | clean | FedAvg | SC | 40.00 | [37.52, 42.48] | 3 | 48.30 | -8.30 | below |" in markdown
    assert "| measured (mean) |" in markdown and "ours" not in markdown.lower()    # FedAdapterProto's method is "Ours"


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
    assert {"id": "scorecard", "rows": 1} in state["tables"]
    assert "of the 1 published numbers that could be judged" in state["text"]
    assert "derived by fedrepro: a value" in state["text"]
    assert (ARTEFACTS / "scorecard.png").stat().st_size > 10_000


def test_the_summary_reads_right_without_the_docs():
    """Issue 34: "0 of 19 cells within the 95% interval (11 below, 8 no interval); 11 judged" made a reader count;
    the summary says in words what was judged, which way the rest fell and why some could not be judged."""
    card = pd.DataFrame({"paper": "facmic", "protocol": "clean", "verdict": ["below"] * 11 + ["no interval"] * 8})
    assert scorecard.summary_line(card, "FACMIC") == (
        "FACMIC (clean): 0 of the 11 published numbers that could be judged reproduced (the published value lies "
        "inside the 95% interval of the measured mean); the whole measured interval lies below the published value "
        "for 11. Not judged: 8 ran with one seed only, so there is no interval to judge by.")
    mixed = pd.DataFrame({"paper": "x", "protocol": "paper", "verdict": ["reproduced", "below", "above", "above"]})
    assert scorecard.summary_line(mixed).endswith("lies below the published value for 1 and above it for 2.")
    single = pd.DataFrame({"paper": "x", "protocol": "clean", "verdict": ["no interval"] * 3})
    assert scorecard.summary_line(single) == ("x (clean): none of the 3 published numbers could be judged. 3 ran with one "
                                              "seed only, so there is no interval to judge by.")
