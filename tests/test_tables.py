"""How table cells read a run's rounds: each column's best vs one round for every column (paper protocol)."""

import pandas as pd
import pytest

from fedrepro.config import load_project
from fedrepro.report.tables import make_caption, one_round


def _run(tmp_path, rule="best_test"):
    pd.DataFrame({"round": [1, 2, 3], "eval_s": [0.1] * 3, "global/acc": [0.5, 0.8, 0.6],
                  "external/acc": [0.9, 0.3, 0.4]}).to_csv(tmp_path / "history.csv", index=False)
    return {"run": {"protocol": "paper"}, "selection": {"rule": rule},
            "eval": {"global": {"acc": 0.8}, "external": {"acc": 0.9}}}     # each column's best


def test_one_round_reads_every_column_at_the_round_chosen_on_the_source_task(tmp_path):
    metrics = _run(tmp_path)
    assert one_round(metrics, tmp_path, None)["eval"]["external"]["acc"] == 0.9
    assert one_round(metrics, tmp_path, {"rule": "per_column"})["eval"]["external"]["acc"] == 0.9
    chosen = one_round(metrics, tmp_path, {"rule": "one_round", "eval": "global", "metric": "acc"})
    assert chosen["eval"]["external"]["acc"] == 0.3 and chosen["selection"]["round"] == 2
    assert chosen["selection"]["rule"] == "best_test_round"
    # runs selected on validation (clean protocol) already report one round: left as they are
    clean = _run(tmp_path, rule="best_val")
    assert one_round(clean, tmp_path, {"rule": "one_round"}) is clean


def test_captions_name_the_selection_rule():
    project = load_project(["config/config.yaml"])
    table5 = project.papers["facmic"]["tables"]["table5"]
    caption = make_caption(table5, "table5", project, {"paper"}, {"best_test_round"}, "std", 3)
    assert "one round per run, the one with the best global acc, for every column" in caption
    table2 = project.papers["facmic"]["tables"]["table2"]
    assert "each column its own best" in make_caption(table2, "table2", project, {"paper"}, {"best_test"}, "std", 3)
    assert project.papers["faa_clip"]["tables"]["table5"]["selection"] == {"rule": "one_round", "eval": "global",
                                                                          "metric": "bacc"}


@pytest.mark.parametrize("paper", ["facmic", "faa_clip"])
def test_demo_twins_select_like_the_full_configs(paper):
    full = load_project(["config/config.yaml"]).papers[paper]["tables"]["table5"].get("selection")
    demo = load_project(["config/config.yaml", "config/demo.yaml"]).papers[paper]["tables"]["table5"].get("selection")
    assert full == demo and full["rule"] == "one_round"


def test_one_round_on_a_missing_eval_set_is_an_error(tmp_path):
    with pytest.raises(KeyError, match="one_round on nowhere/acc"):
        one_round(_run(tmp_path), tmp_path, {"rule": "one_round", "eval": "nowhere", "metric": "acc"})
