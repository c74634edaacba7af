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
    assert "facmic (clean): 1 of 3 cells within the 95% interval (1 below, 1 not run)" in line
    files = scorecard.ScorecardFiles.at(tmp_path / "out" / "facmic")
    scorecard.write(card, "FACMIC scorecard", files, demo=True)
    page = files.html.read_text()
    assert "<table id='scorecard'>" in page and "src='facmic.png'" in page and "Demo data" in page
    assert files.png.stat().st_size > 5000
    assert pd.read_csv(files.csv)["verdict"].tolist() == card["verdict"].tolist()
    assert "| table2 | clean | FedAvg | SC | 40.00 | [37.52, 42.48] | 3 | 48.30 | -8.30 | below |" in files.md.read_text()


@pytest.mark.slow
def test_scorecard_page_renders_in_a_browser(tmp_path):
    from browser import rendered

    t1 = _table(tmp_path, "table1", [
        {"row": "FedAvg", "column": "BT", "mean": 66.0, "std": 1.0, "se": 0.58, "ci95": 2.48, "n": 3, "published": 66.24, "delta": -0.24},
        {"row": "FedProx", "column": "BT", "mean": 60.0, "std": 1.0, "se": 0.58, "ci95": 2.48, "n": 3, "published": 66.24, "delta": -6.24},
    ])
    files = scorecard.ScorecardFiles.at(tmp_path / "page" / "facmic")
    scorecard.write(scorecard.build([("facmic", "table1", "clean", t1)]), "FACMIC scorecard", files)
    state = rendered(files.html, ARTEFACTS / "scorecard.png")
    figure = [i for i in state["images"] if i["id"] == "scorecard-figure"]
    assert figure and figure[0]["ok"] and figure[0]["width"] > 300, state["images"]
    assert all(i["ok"] for i in state["images"]), state["images"]
    assert {"id": "scorecard", "rows": 2} in state["tables"]
    assert "1 of 2 cells within the 95% interval" in state["text"]
