"""FAA-CLIP figure kinds: the curve maths against hand-computed values, and every kind drawn from
synthetic run directories of a tiny project."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedrepro import metrics as M

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# metrics

def test_roc_curve_steps_and_ties():
    # scores 0.9(+) 0.8(-) 0.8(+) 0.3(-) 0.1(+): 3 positives, 2 negatives; the tie at 0.8 is one step
    fpr, tpr = M.roc_curve(np.array([1, 0, 1, 0, 1]), np.array([0.9, 0.8, 0.8, 0.3, 0.1]))
    np.testing.assert_allclose(fpr, [0, 0, 0.5, 1, 1])
    np.testing.assert_allclose(tpr, [0, 1 / 3, 2 / 3, 2 / 3, 1])
    with pytest.raises(ValueError, match="positives and negatives"):
        M.roc_curve(np.array([1, 1]), np.array([0.2, 0.3]))


def test_macro_roc_by_hand():
    y = np.array([0, 1, 2, 0])
    p = np.array([[0.7, 0.2, 0.1], [0.3, 0.4, 0.3], [0.2, 0.3, 0.5], [0.4, 0.5, 0.1]])
    # the classes' ROC points as sklearn's default roc_curve gives them (collinear points dropped):
    # class 0: both positives ranked first -> (0,0),(0,1/2),(0,1),(1,1)
    # class 1: one negative (0.5) above the positive (0.4) -> (0,0),(1/3,0),(1/3,1),(1,1)
    # class 2: positive first, then a negative, then two tied negatives -> (0,0),(0,1),(1/3,1),(1,1)
    # union of FPRs {0, 1/3, 1}; mean TPR (1+0+1)/3 = 2/3 at 0 (tops of the steps), then 1 everywhere
    out = M.macro_roc(y, p, grid=np.array([0.0, 0.5, 1.0]))
    np.testing.assert_allclose(out["fpr"], [0, 1 / 3, 1])
    np.testing.assert_allclose(out["tpr"], [2 / 3, 1, 1])
    # area: (2/3 + 1)/2 * 1/3 + 1 * 2/3 = 5/18 + 12/18
    assert out["auc"] == pytest.approx(17 / 18)
    np.testing.assert_allclose(out["grid_tpr"], [2 / 3, 1, 1])
    # a class absent from the labels is left out, not averaged in as nan
    out = M.macro_roc(np.array([0, 0, 1, 1]), np.array([[0.9, 0.1, 0], [0.6, 0.4, 0], [0.3, 0.7, 0], [0.8, 0.2, 0]]))
    assert out["classes"].tolist() == [0, 1]


def test_net_benefit_by_hand():
    y = np.array([0, 1, 1, 2])
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.4, 0.1], [0.1, 0.3, 0.6]])
    t = np.array([0.25, 0.5])
    # t=0.5 (odds 1): class 0 TP1 FP1 -> 0; class 1 TP1 -> 1/4; class 2 TP1 -> 1/4; mean 1/6
    # t=0.25 (odds 1/3): class 0 TP1 FP1 -> (1-1/3)/4; class 1 TP2 FP2 -> (2-2/3)/4; class 2 TP1 -> 1/4; mean 1/4
    np.testing.assert_allclose(M.net_benefit(y, p, t), [1 / 4, 1 / 6])
    # treat all: prevalences 1/4, 1/2, 1/4; pi - (1-pi)*odds
    np.testing.assert_allclose(M.net_benefit_treat_all(y, 3, t), [(0 + 1 / 3 + 0) / 3, (-1 / 2 + 0 - 1 / 2) / 3])
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        M.net_benefit(y, p, np.array([0.0, 0.5]))


# --------------------------------------------------------------------------------------------
# figure kinds on synthetic runs

CLASSES = 10  # demo_fashion
P = "faa_clip"  # the config schema only admits the known paper names; this tiny grid stands in for it
EVALS = ("global", "client0", "client1")

PAPER = {
    "paper": P,
    "title": "figure test",
    "defaults": {"rounds": 2, "batch_size": 8, "optimizer": {"name": "adam", "lr": 1e-3},
                 "model": {"family": "clip_adapter",
                           "encoder": {"name": "fedrepro-tiny-clip", "pretrained": "none", "preprocess": "clip"}}},
    "settings": {
        "iid": {"dataset": "demo_fashion", "label": "IID", "split": {"kind": "iid", "clients": 2}},
        "dir": {"dataset": "demo_fashion", "split": {"kind": "dirichlet", "alpha": 0.5, "clients": 2, "seed": "run"}},
    },
    "methods": {"fedavg": {"label": "FedAvg"}, "fedclip": {"label": "FedCLIP"}},
    "figures": {
        "kite": {"kind": "radar", "settings": ["iid", "dir"]},
        "kite_norm": {"kind": "radar", "settings": ["dir"], "options": {"normalize": True}},
        "bars": {"kind": "client_bars", "settings": ["iid"], "methods": ["fedavg", "fedclip"], "evals": list(EVALS)},
        "roc": {"kind": "roc", "settings": ["iid"], "methods": ["fedavg", "fedclip"], "evals": ["global", "client0"]},
        "dca": {"kind": "dca", "settings": ["iid"], "methods": ["fedavg", "fedclip"]},
        "rel": {"kind": "reliability", "settings": ["iid"], "methods": ["fedavg", "fedclip"], "evals": ["global"],
                "options": {"bins": 10}},
        "bb": {"kind": "backbones", "settings": ["iid", "dir"], "methods": ["fedavg", "fedclip"], "evals": list(EVALS)},
    },
}


def _write_run(root: Path, setting: str, method: str, seed: int, rng) -> dict:
    out = root / "results/runs" / "clean" / P / setting / method / f"seed{seed}"
    out.mkdir(parents=True)
    arrays, evals = {}, {}
    for key in EVALS:
        labels = rng.integers(0, CLASSES, 40)
        logits = rng.normal(size=(40, CLASSES)) + 2.0 * np.eye(CLASSES)[labels]
        probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        arrays[f"selected:{key}/probs"], arrays[f"selected:{key}/labels"] = probs, labels
        arrays[f"last:{key}/probs"], arrays[f"last:{key}/labels"] = probs, labels
        evals[key] = M.classification_metrics(labels, probs)
    np.savez_compressed(out / "predictions.npz", **arrays)
    (out / "metrics.json").write_text(json.dumps({"eval": evals, "run": {"seed": seed}, "selection": {"rule": "best_test"}}))
    pd.DataFrame({"round": [1, 2], **{f"{k}/acc": [0.1, evals[k]["acc"]] for k in EVALS}}).to_csv(out / "history.csv", index=False)
    return evals


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from fedrepro.config import Project

    root = tmp_path_factory.mktemp("proj")
    (root / "workflow").symlink_to(REPO / "workflow")
    (root / "papers").mkdir()
    (root / f"papers/{P}.yaml").write_text(yaml.safe_dump(PAPER))
    project = Project({"papers": [P], "paper_dir": "papers", "seeds": [0, 1]}, root=root)
    rng = np.random.default_rng(0)
    evals = {(s, m, seed): _write_run(root, s, m, seed, rng)
             for s in ("iid", "dir") for m in ("fedavg", "fedclip") for seed in (0, 1)}
    counts = {}
    for setting in ("iid", "dir"):
        for seed in (0, 1):
            path = root / "resources/splits" / f"{project.resolver.split_id(P, setting, seed)}.counts.csv"
            if path.exists():  # a fixed split seed: every run seed shares one split file
                counts[(setting, seed)] = counts[(setting, seed - 1)]
                continue
            table = pd.DataFrame(rng.integers(0, 30, size=(3, CLASSES)),
                                 columns=list(_fashion_classes()), index=["client0", "client1", "global_test"])
            counts[(setting, seed)] = table
            frame = table.reset_index(names="client")
            frame["train"], frame["val"], frame["test"] = table.sum(axis=1).to_numpy(), 0, 0
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(path, index=False)
    return project, root, evals, counts


def _item(project, figure):
    from fedrepro.report.figures import figure_item

    return figure_item(project, "clean", P, figure)


def test_curve_figures_say_which_round_their_predictions_come_from(tiny, monkeypatch):
    from fedrepro.report.predictions import _rounds_note

    project, root, _, _ = tiny
    monkeypatch.chdir(root)
    assert _rounds_note(_item(project, "dca")) == "predictions: each eval set at its best test round"


def _fashion_classes():
    from fedrepro.registry import dataset

    return dataset("demo_fashion").classes


def test_radar_counts_average_the_seeds_splits(tiny, monkeypatch):
    from fedrepro.report.splits import client_class_counts

    project, root, _, counts = tiny
    monkeypatch.chdir(root)
    # "dir" redraws its split per seed: the kite shows the mean over both splits, clients only
    got = client_class_counts(_item(project, "kite"), "dir")
    expected = (counts[("dir", 0)] + counts[("dir", 1)]).loc[["client0", "client1"]] / 2
    np.testing.assert_allclose(got.to_numpy(), expected.to_numpy())
    assert list(got.index) == ["client0", "client1"]
    # "iid" uses split seed 0 for every run seed: one split, not an average
    assert project.resolver.split_id(P, "iid", 0) == project.resolver.split_id(P, "iid", 1)
    np.testing.assert_allclose(client_class_counts(_item(project, "kite"), "iid").to_numpy(),
                               counts[("iid", 0)].loc[["client0", "client1"]].to_numpy())


@pytest.mark.parametrize("figure", list(PAPER["figures"]))
def test_every_kind_writes_png_and_pdf(tiny, monkeypatch, figure):
    from fedrepro.report.figures import figure_inputs, make_figure

    project, root, _, _ = tiny
    monkeypatch.chdir(root)
    item = _item(project, figure)
    assert all(Path(f).exists() for f in figure_inputs(item))   # the rule declares what the figure reads
    out = root / "results/figures/clean" / P / f"{figure}.png"
    make_figure(item, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    pdf = out.with_suffix(".pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000


def test_bar_values_are_seed_means(tiny, monkeypatch):
    from fedrepro.report.bars import metric_summary

    project, root, evals, _ = tiny
    monkeypatch.chdir(root)
    got = metric_summary(_item(project, "bars"), "iid", "fedclip", "client1", "bacc")
    values = [evals[("iid", "fedclip", s)]["client1"]["bacc"] for s in (0, 1)]
    assert got["mean"] == pytest.approx(np.mean(values)) and got["std"] == pytest.approx(np.std(values, ddof=1))


def test_missing_eval_set_and_missing_run_are_named(tiny, monkeypatch):
    from fedrepro.report.predictions import load_predictions

    project, root, _, _ = tiny
    monkeypatch.chdir(root)
    item = _item(project, "roc")
    with pytest.raises(KeyError, match=r"client7.*available: \['client0', 'client1', 'global'\]"):
        load_predictions(item, "iid", "fedavg", 0, "client7")
    with pytest.raises(FileNotFoundError, match="seed5/predictions.npz"):
        load_predictions(item, "iid", "fedavg", 5, "global")


def test_bad_figure_specs_are_named(tiny, monkeypatch):
    from fedrepro.report.predictions import reliability, roc

    project, root, _, _ = tiny
    monkeypatch.chdir(root)
    figures = project.papers[P]["figures"]
    figures["rel_typo"] = {"kind": "reliability", "settings": ["iid"], "methods": ["fedavg"], "options": {"bin": 10}}
    figures["roc_short"] = {"kind": "roc", "settings": ["iid"]}
    with pytest.raises(ValueError, match=r"figures/rel_typo/options: unknown key\(s\) \['bin'\].*allowed: \['bins'\]"):
        reliability(_item(project, "rel_typo"), root / "x.png")
    with pytest.raises(ValueError, match=r"figures/roc_short \(kind roc\) needs \['methods'\]"):
        roc(_item(project, "roc_short"), root / "x.png")


def test_seed_table_and_turn_series_by_hand(tmp_path, monkeypatch):
    """The curve figures plot seed_table's per-seed columns; FedDRA's per-turn curves take the value
    after each turn's last evaluated round."""
    from types import SimpleNamespace

    from fedrepro.report.curves import seed_table, turn_series
    from fedrepro.report.item import ReportItem

    monkeypatch.chdir(tmp_path)
    histories = {  # rounds 1..4, evaluated at 2 and 4 (NaN elsewhere); neither run logs cos_sim
        0: {"round": [1, 2, 3, 4], "global/acc": [np.nan, 0.5, np.nan, 0.7], "loss": [1, 1, 1, 1]},
        1: {"round": [1, 2, 3, 4], "global/acc": [np.nan, 0.3, np.nan, 0.9], "loss": [1, 1, 1, 1]},
    }
    for seed, columns in histories.items():
        out = tmp_path / "results/runs/clean/p/s/m" / f"seed{seed}"
        out.mkdir(parents=True)
        pd.DataFrame(columns).to_csv(out / "history.csv", index=False)
    from fedrepro.paths import RunKey

    resolver = SimpleNamespace(protocol=lambda paper, setting, protocol: protocol,
                               run_key=lambda paper, setting, method, seed, protocol: RunKey(paper, protocol, setting,
                                                                                             method, seed))
    project = SimpleNamespace(seeds=[0, 1], resolver=resolver)
    item = ReportItem(project, "clean", "p", "figures", "f")

    table = seed_table(item, "s", "m", "global/acc")
    assert list(table.index) == [2, 4]
    np.testing.assert_allclose(table.mean(axis=1), [0.4, 0.8])
    np.testing.assert_allclose(table.std(axis=1), [np.sqrt(0.02), np.sqrt(0.02)])
    assert seed_table(item, "s", "m", "cos_sim") is None

    # two rounds per turn: turn 1 = round 2, turn 2 = round 4; one round per turn keeps evaluated rounds
    by_turn = seed_table(item, "s", "m", "global/acc", per_run=lambda h, c: turn_series(h, c, 2))
    assert list(by_turn.index) == [1, 2]
    np.testing.assert_allclose(by_turn.iloc[:, 0], [0.5, 0.7])
    history = pd.DataFrame({"round": [1, 2, 3], "x": [0.1, np.nan, 0.3]})
    assert turn_series(history, "x", 1).to_dict() == {1: 0.1, 3: 0.3}
    assert turn_series(history, "x", 3).to_dict() == {1: 0.3}
