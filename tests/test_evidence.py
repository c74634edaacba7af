"""The learning bar and the evidence page (fedrepro.report.evidence) on run files written by the test: what
each task scores, chance from the classes present, personalized methods scored by their clients' own
models on their own held-out data, reasons for runs below the bar named in captions and drawn with validation
curves, and the check that fails a run below the bar without one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedrepro import paths
from fedrepro.config import load_project
from fedrepro.io import write_json
from fedrepro.report import evidence

ROOT_CONFIG = "config/evidence.yaml"      # every variant of the two papers: more than the demo runs


def write_run(project, key, evals: dict, labels: np.ndarray, history: pd.DataFrame) -> None:
    write_json(paths.run_file(key), {"eval": evals})
    # made by this configuration (the page refuses another's runs) from nothing the input check can compare
    write_json(paths.run_file(key, "run_manifest.json"),
               {"inputs": {}, "run": {"config_hash": project.resolver.run_config(key)["config_hash"]}})
    np.savez(paths.run_file(key, "predictions.npz"), **{f"selected:{k}/labels": labels for k in evals})
    history.to_csv(paths.run_file(key, "history.csv"), index=False)


@pytest.fixture
def project(root, tmp_path, monkeypatch):
    project = load_project([root / ROOT_CONFIG], {"papers": ["fedadapterproto", "feddra"]}, root=root)
    monkeypatch.chdir(tmp_path)
    yield project
    load_project([root / "config/config.yaml"], root=root)     # the results folder of the default configuration


def fill(project, bacc: float = 0.9, recall: float = 0.5, low: tuple = (), site: float = 0.6) -> None:
    """Every run of ``project`` written with these scores; (method, seed) in ``low`` score chance on their own data;
    a personalized run's models score ``site`` on the held-out site."""
    for key in project.plan.runs():
        Path(paths.run_file(key)).parent.mkdir(parents=True, exist_ok=True)
        poor = (key.method, key.seed) in low
        if key.paper == "feddra":
            value = 0.01 if poor else recall
            evals = {f"client{i}": {"recall@1": value, "n": 200} for i in range(3)} | {"clients_mean": {"recall@1": value}}
            history = pd.DataFrame({"round": [1, 2], "clients_mean/recall@1": [value / 2, value]})
        else:   # one model per client: its own held-out data (client<k>) and the held-out site (client<k>@global)
            value = 0.5 if poor else bacc
            evals = ({f"client{i}": {"bacc": value} for i in range(3)} | {f"client{i}@global": {"bacc": site}
                     for i in range(3)} | {"global": {"bacc": 0.5}})
            history = pd.DataFrame({"round": [1, 2, 3], **{f"client{i}/bacc": [0.5, np.nan, value] for i in range(3)},
                                    **{f"client{i}@global/bacc": [0.5, np.nan, site] for i in range(3)}})
        write_run(project, key, evals, np.array([0, 1] * 50), history)


def test_scores_use_the_task_and_the_clients_own_models(project):
    fill(project, low={("fedavg", 1), ("fedavg_convirt", 1)})
    scores = evidence.score_runs(project)
    assert len(scores) == len(project.plan.runs())
    proto = scores[scores["paper"] == "fedadapterproto"]
    assert (proto["chance"] == 0.5).all() and np.allclose(proto["threshold"], 0.75)
    ours = proto[(proto["method"] == "fedadapterproto") & (proto["seed"] == 0)].iloc[0]
    # each client's model on its own held-out data (0.9), not the server's 0.5 nor the held-out site's 0.6, which
    # stands beside it as the paper's metric
    assert ours["value"] == 0.9 and ours["passed"] and "own held-out data" in ours["metric"]
    assert ours["paper_value"] == 0.6 and "on global" in ours["paper_metric"]
    drra = scores[scores["paper"] == "feddra"]
    pool = project.resolver.run_config(project.plan.runs()[-1])["train"]["model"]["retrieval"]["pool"]
    assert np.allclose(drra["chance"], 1 / pool) and np.allclose(drra["threshold"], 3 / pool)
    failed = evidence.failures(scores)
    assert set(zip(failed["method"], failed["seed"])) == {("fedavg", 1), ("fedavg_convirt", 1)}   # both papers' FedAvg
    assert set(failed["paper"]) == {"fedadapterproto", "feddra"}


def test_a_run_below_the_bar_with_a_reason_is_reported_below_it_with_its_validation_curve(project, tmp_path):
    from fedrepro.report.tables import bar_explanations, table_item

    project.papers["feddra"]["methods"]["centralized_convirt"]["bar_explanation"] = "its image encoder starts at random"
    fill(project, low={("centralized_convirt", s) for s in project.seeds})
    for key in project.plan.runs():       # a validation curve to draw (val_mean per evaluated round)
        if key.method == "centralized_convirt":
            history = pd.DataFrame({"round": [1, 2], "clients_mean/recall@1": [0.005, 0.01],
                                    "val_mean/recall@1": [0.01, 0.02]})
            history.to_csv(paths.run_file(key, "history.csv"), index=False)
    scores = evidence.score_runs(project)
    assert evidence.failures(scores).empty                      # --check passes: every run below has its reason
    below = scores[scores["method"] == "centralized_convirt"]
    assert (~below["passed"]).all() and (below["explanation"] != "").all()      # reported below it, not passing
    assert len(evidence.explained(scores)) == len(project.seeds)
    caption = bar_explanations(table_item(project, "clean", "feddra", "evidence"))
    assert "Centralized (ConVIRT) may fall below the learning bar on these data: its image encoder starts at random." in caption
    named = {m for m, spec in project.papers["feddra"]["methods"].items() if spec.get("bar_explanation")}
    assert len(caption) == len(named) and "fedmae_convirt" in named     # the overlay's own reason is named too
    evidence.write_page(project, tmp_path / "page")
    page = (tmp_path / "page/index.md").read_text()
    rows = len(evidence.summary_table(scores))
    assert f"{rows - 1} of {rows} (setting, method) rows clear the bar with every seed; 1 fall below it" in page
    assert "its image encoder starts at random" in page and "feddra-validation.png" in page
    assert (tmp_path / "page/feddra-validation.png").stat().st_size > 5_000


def test_a_validation_curve_is_linked_only_where_a_run_with_a_reason_falls_below_the_bar(project, tmp_path):
    """FedMAE carries the overlay's reason but clears the bar here, while FedAvg falls below it without one: the page
    draws no validation figure, so it links none (the page once linked one, and its HTML then failed to embed it)."""
    assert project.papers["feddra"]["methods"]["fedmae_convirt"].get("bar_explanation")
    fill(project, low={("fedavg_convirt", 0)})
    scores = evidence.write_page(project, tmp_path / "page")
    assert set(evidence.failures(scores)["method"]) == {"fedavg_convirt"} and evidence.explained(scores).empty
    page = (tmp_path / "page/index.md").read_text()
    assert "-validation.png" not in page and not list((tmp_path / "page").glob("*-validation.png"))
    below = int((~evidence.summary_table(scores)["cleared"]).sum())
    assert below >= 1 and "; 0 fall below it with the reason" in page and f"{below} without one" in page
    assert (tmp_path / "page/index.html").stat().st_size > 0


def test_the_page_draws_every_paper_and_the_check_names_failing_runs(project, tmp_path, root):
    from fedrepro import cli

    for folder in ("workflow", "config"):               # the CLI reads the schemas and paper files from its cwd
        (tmp_path / folder).symlink_to(root / folder)
    fill(project, low={("fedproto", 2)})
    scores = evidence.write_page(project, "results/evidence")
    page = (tmp_path / "results/evidence/index.md").read_text()
    assert "## fedadapterproto" in page and "## feddra" in page and "2/3" in page
    for paper in ("fedadapterproto", "feddra"):
        assert (tmp_path / f"results/evidence/{paper}.png").stat().st_size > 10_000
    assert "data:image/png;base64," in (tmp_path / "results/evidence/index.html").read_text()
    assert len(pd.read_csv(tmp_path / "results/evidence/bar.csv")) == len(scores)
    with pytest.raises(SystemExit) as refused:
        cli.main(["evidence", "--config-json", json.dumps(project.config), "--check"])
    assert "1 run(s) below the learning bar with no reason" in str(refused.value) and "fedproto" in str(refused.value)
    fill(project)
    cli.main(["evidence", "--config-json", json.dumps(project.config), "--check"])     # all clear: no exit


def test_the_curves_say_what_they_show(project, monkeypatch):
    """Issue 34: one legend entry per method, named so that a reader cannot take the paper's "Ours" for this
    pipeline's numbers; whole-number round ticks; a method evaluated at only some rounds says so in the legend
    (FedAdapterProto's clients here: rounds 1 and 3); the bar is named."""
    fill(project)
    drawn = {}
    monkeypatch.setattr(evidence, "save_figure", lambda fig, out: drawn.setdefault("fig", fig))
    evidence.draw_paper(project, "fedadapterproto", evidence.score_runs(project), Path("unused.png"))
    axes = [ax for ax in drawn["fig"].axes if ax.get_legend() is not None]
    assert axes
    for ax in axes:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(labels) == len(set(labels)), labels
        assert "learning bar" in labels
        assert all(float(tick).is_integer() for tick in ax.get_xticks())
    labels = [t.get_text() for ax in axes for t in ax.get_legend().get_texts()]
    assert "Ours (fedadapterproto) (evaluated every 2 rounds)" in labels
    page = evidence.markdown(evidence.summary_table(evidence.score_runs(project)), project)
    assert "| ours |" not in page and "| Ours (fedadapterproto) |" in page
    n = len(project.seeds)
    assert f"| measured (mean ± 95% CI, n = {n}) |" in page                 # what ± is, with its n (issue 43)
    assert f"mean ± half-width of the 95% t-interval of the mean over n = {n} seeds" in page
    assert "every seed's value: [bar.csv](bar.csv)" in page


def test_labels_that_would_be_misread_carry_the_variant_key(root):
    from fedrepro.report.item import method_labels

    project = load_project([root / "config/config.yaml"], {"papers": ["faa_clip", "fedadapterproto"]}, root=root)
    labels = method_labels(project, "faa_clip", ["fedclip", "fedclip_images", "faa_clip", "fedavg"])
    assert labels["fedclip"] == "FedCLIP (fedclip)" and labels["fedclip_images"] == "FedCLIP (fedclip_images)"
    assert labels["fedavg"] == project.papers["faa_clip"]["methods"]["fedavg"]["label"]       # unique: as the paper file
    assert method_labels(project, "fedadapterproto", ["fedadapterproto"]) == {"fedadapterproto": "Ours (fedadapterproto)"}
    assert evidence.evaluated_at([1, 2, 3]) == "" and evidence.evaluated_at([3]) == " (evaluated at round 3 only)"
    assert evidence.evaluated_at([4, 8]) == " (evaluated every 4 rounds)"


def test_personalized_runs_learn_on_their_own_clients_data_with_the_paper_metric_beside(project, tmp_path):
    """A personalized method whose clients' models do well on their own held-out data but poorly on a site none of
    them trained on learns (the page says so, the paper's value beside it); one whose own-data scores are at chance
    does not, whatever the held-out site says; a split without client test data falls back to the held-out site."""
    fill(project, bacc=0.9, site=0.55, low={("fedproto", 0)})
    scores = evidence.score_runs(project)
    proto = scores[scores["paper"] == "fedadapterproto"].set_index(["method", "seed"])
    assert proto.loc[("fedadapterproto", 1), "passed"] and proto.loc[("fedadapterproto", 1), "paper_value"] == 0.55
    assert not proto.loc[("fedproto", 0), "passed"]            # 0.5 on its own clients' data: chance
    page = evidence.markdown(evidence.summary_table(scores), project)
    assert "bacc (clients' models on global): 55.0" in page and "held-out data of its own client" in page
    key = next(k for k in project.plan.runs() if k.paper == "fedadapterproto")
    evals = {f"client{i}@global": {"bacc": 0.8} for i in range(3)} | {"global": {"bacc": 0.5}}
    write_run(project, key, evals, np.array([0, 1] * 50), pd.DataFrame({"round": [1], "client0@global/bacc": [0.8]}))
    row = evidence.score_run(project, key)
    assert row["value"] == pytest.approx(0.8) and "no client holds held-out data" in row["metric"] and row["paper_metric"] == ""
    history = pd.DataFrame({"round": [1, 2], "client0/bacc": [0.7, 0.9], "client0@global/bacc": [0.5, 0.6],
                            "global/bacc": [0.1, 0.2]})
    assert evidence.curve_column(history, "classification").tolist() == [0.7, 0.9]    # what is scored, per round
