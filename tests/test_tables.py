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
    caption = make_caption(table5, "table5", project, {"paper"}, {"best_test_round"}, 3)
    assert "one round per run, the one with the best global acc, for every column" in caption
    table2 = project.papers["facmic"]["tables"]["table2"]
    assert "each column its own best" in make_caption(table2, "table2", project, {"paper"}, {"best_test"}, 3)


def test_faa_clip_reads_every_table_with_one_rule_each_columns_best():
    """One round-selection rule per paper. FAA-CLIP reports "the best testing accuracy" of each client (Tables III,
    VII) and "the best test BACC and macro-F1 for each client" (Fig. 7), and its code keeps a best per client
    (AIPMLab/FAA-CLIP main.py: ``best_acc[client_idx]``): every table, Table V's BACC and F1 included, reads each
    column's best; on main Table V alone read one round per run (the best global BACC)."""
    project = load_project(["config/config.yaml"])
    tables = project.papers["faa_clip"]["tables"]
    assert {name: (t.get("selection") or {}).get("rule", "per_column") for name, t in tables.items()
            if t.get("kind", "runs") == "runs"} == dict.fromkeys([n for n, t in tables.items()
                                                                   if t.get("kind", "runs") == "runs"], "per_column")
    caption = make_caption(tables["table5"], "table5", project, {"paper"}, {"best_test"}, 3)
    assert "each column its own best" in caption and "one round per run" not in caption


@pytest.mark.parametrize("paper", ["facmic", "faa_clip"])
def test_demo_twins_select_like_the_full_configs(paper):
    full = load_project(["config/config.yaml"]).papers[paper]["tables"]["table5"].get("selection")
    demo = load_project(["config/config.yaml", "config/demo.yaml"]).papers[paper]["tables"]["table5"].get("selection")
    assert full == demo
    assert (full or {}).get("rule", "per_column") == ("one_round" if paper == "facmic" else "per_column")


def test_one_round_on_a_missing_eval_set_is_an_error(tmp_path):
    with pytest.raises(KeyError, match="one_round on nowhere/acc"):
        one_round(_run(tmp_path), tmp_path, {"rule": "one_round", "eval": "nowhere", "metric": "acc"})


# --------------------------------------------------------------------------------------------
# what a rendered table shows: Δ, published values where ours are missing, marks of derived published
# values (from the published CSV), the note and the demo warning, for every table kind

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
P = "minipaper"
PUBLISHED_CSV = """# a published table for the tests
# * derived by fedrepro: expanded from the paper's formula.
row,A,B
FedAvg,60.00,45.61
FedCLIP,70.00*,
"""
PAPER = {
    "paper": P, "title": "table test",
    "defaults": {"rounds": 2, "batch_size": 8, "optimizer": {"name": "adam", "lr": 1e-3},
                 "model": {"family": "clip_adapter",
                           "encoder": {"name": "fedrepro-tiny-clip", "pretrained": "none", "preprocess": "clip"}}},
    "settings": {"iid": {"dataset": "demo_fashion", "label": "IID", "split": {"kind": "iid", "clients": 2}}},
    "methods": {"fedavg": {"label": "FedAvg"}, "fedclip": {"label": "FedCLIP"}},
    "tables": {
        "acc": {"title": "Accuracy", "published": f"{P}/acc.csv", "note": "NOTE-OF-RUNS.",
                "rows": [{"method": "fedavg", "setting": "iid", "only": ["A"]}, {"method": "fedclip", "setting": "iid"}],
                "columns": [{"label": "A", "eval": "global"}, {"label": "B", "eval": "client0"}]},
        "counts": {"kind": "split_counts", "settings": ["iid"], "published": f"{P}/counts.csv",
                   "note": "NOTE-OF-COUNTS."},
        "balance": {"kind": "class_balance", "settings": ["iid"], "note": "NOTE-OF-BALANCE."},
    },
}


def _mini_project(root: Path, paper_dir: str, published: str = PUBLISHED_CSV, stand_in: str | None = None):
    from fedrepro.config import Project

    if not (root / "workflow").exists():
        (root / "workflow").symlink_to(REPO / "workflow")
    (root / paper_dir).mkdir(parents=True, exist_ok=True)
    (root / paper_dir / f"{P}.yaml").write_text(yaml.safe_dump({**PAPER, **({"stand_in": stand_in} if stand_in else {})}))
    (root / "config/published" / P).mkdir(parents=True, exist_ok=True)
    (root / "config/published" / P / "acc.csv").write_text(published)
    (root / "config/published" / P / "counts.csv").write_text("row,IID\nclient0,10\nclient1,9*\n# * assembled.\n")
    project = Project({"papers": [P], "paper_dir": paper_dir, "seeds": [0, 1]}, root=root)
    for method, acc in (("fedavg", 0.62), ("fedclip", 0.65)):
        for seed in (0, 1):
            out = root / "results/runs/clean" / P / "iid" / method / f"seed{seed}"
            out.mkdir(parents=True, exist_ok=True)
            value = acc + 0.01 * seed
            (out / "metrics.json").write_text(json.dumps({
                "run": {"protocol": "clean"}, "selection": {"rule": "best_val"},
                "eval": {"global": {"acc": value}, "client0": {"acc": value - 0.1}}}))
    from fedrepro.registry import dataset

    classes = list(dataset("demo_fashion").classes)
    counts = pd.DataFrame([{"client": c, **{k: 1 + i + j for j, k in enumerate(classes)}} for i, c in
                           enumerate(["client0", "client1", "global_test"])])
    counts["train"], counts["val"], counts["test"] = [8, 7, 0], [1, 1, 0], [1, 1, 20]
    counts["total"] = counts[["train", "val", "test"]].sum(axis=1)
    counts["size"] = [10, 10, 20]          # client1's cut left one row out (the FACMIC code's int() cuts)
    path = root / "resources/splits" / f"{project.resolver.split_id(P, 'iid', 0)}.counts.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    counts.to_csv(path, index=False)
    return project


def _render(project, table):
    from fedrepro.report.tables import make_table, render_latex, render_markdown, table_item

    result = make_table(table_item(project, "clean", P, table))
    return result, render_markdown(result, f"{table}.seeds.csv"), render_latex(result)


def test_rendered_tables_show_delta_and_published_values_where_ours_are_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, md, tex = _render(_mini_project(tmp_path, "papers"), "acc")
    # FedAvg A: 62, 63 -> 62.50 ± 6.35 (the 95% half-width: t(0.975, 1) x 0.71 / √2), published 60 -> Δ +2.50;
    # FedAvg has no B cell, the published 45.61 stays
    assert "| FedAvg | 62.50 ± 6.35 (60.00)<br>Δ +2.50 | – (45.61) |" in md
    assert r"62.50 $\pm$ 6.35 (60.00) \\ {\footnotesize $\Delta$ +2.50}" in tex
    # what ± is, with its n, and every seed's value one click away
    assert "Measured here: mean ± half-width of the 95% t-interval of the mean over n = 2 seeds" in md
    assert md.split("\n")[0].endswith("Per-seed values: [acc.seeds.csv](acc.seeds.csv).")
    assert "-- (45.61)" in tex
    # FedCLIP B: 55, 56 against nothing published: no parentheses, no Δ
    assert "| 55.50 ± 6.35 |" in md
    assert "Δ = measured − published." in result.caption
    cell = result.summary.set_index(["row", "column"]).loc[("FedAvg", "B")]
    assert cell["n"] == 0 and cell["published"] == 45.61


def test_derived_published_values_are_marked_from_the_csv_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, md, tex = _render(_mini_project(tmp_path, "papers"), "acc")
    assert "(70.00*)" in md and r"(70.00$^{*}$)" in tex
    assert "* derived by fedrepro: expanded from the paper's formula." in result.caption
    rows = result.summary.set_index(["row", "column"])
    assert rows.loc[("FedCLIP", "A"), "derived"] and not rows.loc[("FedAvg", "A"), "derived"]
    assert rows.loc[("FedCLIP", "A"), "published_note"] == "derived by fedrepro: expanded from the paper's formula."
    # the same CSV without the mark: no mark, no footnote in the caption (an unused footnote is not printed)
    unmarked = tmp_path / "unmarked"
    unmarked.mkdir()
    monkeypatch.chdir(unmarked)
    result, md, _ = _render(_mini_project(unmarked, "papers", PUBLISHED_CSV.replace("70.00*", "70.00")), "acc")
    assert "(70.00)" in md and "(70.00*)" not in md and "derived by fedrepro" not in md
    assert not result.summary["derived"].any()


def test_the_scorecard_carries_the_mark_and_its_footnote(tmp_path, monkeypatch):
    from fedrepro.report import scorecard
    from fedrepro.report.tables import write_table

    monkeypatch.chdir(tmp_path)
    result, _, _ = _render(_mini_project(tmp_path, "papers"), "acc")
    write_table(result, tmp_path / "acc.md")
    card = scorecard.build([(P, "acc", "clean", tmp_path / "acc.csv")])
    derived = card[card["derived"]]
    assert derived[["row", "column"]].values.tolist() == [["FedCLIP", "A"]]
    md = scorecard.render_markdown(card, "card")
    assert "| acc | clean | FedCLIP | A | 65.50 ± 6.35 |" in md and "| 70.00* |" in md
    assert f"* {P} acc: derived by fedrepro: expanded from the paper's formula." in md


def test_a_mark_without_footnote_and_a_non_number_are_errors_naming_the_cell(tmp_path):
    from fedrepro.report.published import PublishedError, parse_published

    with pytest.raises(PublishedError, match=r"x\.csv: row 'FedAvg', column 'A' is marked '\*' but .* '# \* "):
        parse_published("row,A\nFedAvg,1.5*\n", "x.csv")
    with pytest.raises(PublishedError, match=r"x\.csv: row 'FedAvg', column 'A': '2xSigma' is not a number"):
        parse_published("row,A\nFedAvg,2xSigma\n", "x.csv")
    parsed = parse_published("# † from the text\nrow,A,B\nFedAvg,1.5†,-2e-1\n", "x.csv")
    assert parsed.values == {("FedAvg", "A"): 1.5, ("FedAvg", "B"): -0.2} and parsed.mark(("FedAvg", "A")) == "†"


def test_every_table_kind_renders_its_note_and_what_stands_in(tmp_path, monkeypatch):
    """A paper file on stand-in data and models (``stand_in``: the demo twins, the evidence overlays) says what they
    are in every table's caption; the real grid's do not."""
    from fedrepro.registry import TABLE_KINDS

    monkeypatch.chdir(tmp_path)
    described = "Fashion-MNIST domains for BT and a composite CLIP for ViT-B/16"
    demo = _mini_project(tmp_path, "config/demo", stand_in=described)
    full = _mini_project(tmp_path, "papers")
    kinds = {spec.get("kind", "runs"): name for name, spec in PAPER["tables"].items()}
    assert set(kinds) == set(TABLE_KINDS.names()), "add a table of the new kind to PAPER"
    for kind, table in kinds.items():
        note = PAPER["tables"][table]["note"]
        result, md, tex = _render(demo, table)
        assert note in md and f"STAND-IN DATA AND MODELS: {described}. These numbers show" in md, kind
        assert note in tex and "STAND-IN DATA AND MODELS" in tex, kind
        _, md, _ = _render(full, table)
        assert note in md and "STAND-IN" not in md, kind
    # the count table's published counts and their mark; a client counts whole (its size, the row its cut left
    # out included), as the papers' client tables do
    result, md, _ = _render(full, "counts")
    assert "| client1 | 10 (9*)<br>Δ +1 |" in md and "* assembled." in result.caption
    assert "the whole client" in result.caption


def test_tables_never_ask_clean_runs_for_test_selections():
    """A one_round table re-reads (and its rule declares) the history of runs selected on the test set only:
    under clean it reads metrics.json alone."""
    from fedrepro.report.tables import runs_inputs, table_item

    project = load_project(["config/config.yaml"], {"protocols": ["clean", "paper"]})
    clean = runs_inputs(table_item(project, "clean", "facmic", "table5"))
    paper = runs_inputs(table_item(project, "paper", "facmic", "table5"))
    assert not any(f.endswith("history.csv") for f in clean) and any(f.endswith("metrics.json") for f in clean)
    assert any(f.endswith("history.csv") for f in paper)


def test_captions_say_which_test_data_the_runs_read():
    from fedrepro.report.tables import make_caption, notes_on_test_use

    project = load_project(["config/config.yaml"])
    spec = project.papers["facmic"]["tables"]["table3"]
    use = {"protocol": "paper", "allow_test_selection": False, "selection_on_test": True, "target_is_test": True}
    assert notes_on_test_use({"test_data": use}) == {"paper_target"}
    caption = make_caption(spec, "table3", project, {"paper"}, {"best_test"}, 3, notes_on_test_use({"test_data": use}))
    assert "as the paper's code did" in caption and "target: the global test images (labels hidden), as the authors'" in caption
    opted = {**use, "protocol": "clean", "allow_test_selection": True}
    caption = make_caption(spec, "table3", project, {"clean"}, {"best_test"}, 3, notes_on_test_use({"test_data": opted}))
    assert "selected on the test set by explicit opt-in (allow_test_selection: true)" in caption
    assert "Domain-adaptation target under the clean protocol: the global test images" in caption
    assert notes_on_test_use({"test_data": {**use, "protocol": "clean", "selection_on_test": False,
                                            "target_is_test": False}}) == set()
