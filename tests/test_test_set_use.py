"""No silent test-set use: the clean protocol refuses, before any job, to select on the test set or to adapt
to it unless a run opts in (``allow_test_selection: true``, then recorded in the manifest, metrics.json and
the captions); clean runs keep no best-test selections; every run checks, before training, that its index
sets are disjoint as its split declares."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from infra_support import REPO, TINY_CONFIG

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = yaml.safe_load((REPO / "tests/data/infra/foundation.yaml").read_text())


def project_with(tmp_path: Path, paper: dict, protocols=("clean",)):
    """The tiny grid's project with ``paper`` as its foundation.yaml (paper files in ``tmp_path``)."""
    from fedrepro.config import Project, deep_merge, load_yaml

    folder = tmp_path / "papers"
    folder.mkdir(exist_ok=True)
    (folder / "foundation.yaml").write_text(yaml.safe_dump(paper))
    config = deep_merge(load_yaml(REPO / "config/config.yaml"), load_yaml(REPO / TINY_CONFIG))
    return Project({**config, "paper_dir": str(folder), "protocols": list(protocols)}, root=REPO)


def with_train(**train) -> dict:
    paper = copy.deepcopy(BASE)
    paper["methods"]["fedclip"]["train"] = train
    return paper


# ---- refused at validation time ---------------------------------------------------------------

def test_clean_config_asking_for_best_test_selection_is_refused(tmp_path):
    from fedrepro.config import ConfigError

    paper = with_train(selection={"rule": "best_test"})
    with pytest.raises(ConfigError) as error:
        project_with(tmp_path, paper)
    message = str(error.value)
    assert "foundation.yaml: settings/bt_iid x methods/fedclip (protocol clean; used by tables/accuracy, figures/curves)" in message
    assert "selection rule 'best_test' picks the reported round on the test set" in message
    assert "allow_test_selection: true" in message and "protocol: paper" in message
    # the authors' protocol allows it; so does the explicit opt-in
    assert project_with(tmp_path, paper, protocols=("paper",)).plan.runs()
    opted = project_with(tmp_path, with_train(selection={"rule": "best_test"}, allow_test_selection=True))
    run = opted.resolver.run_config(opted.plan.runs()[0])
    assert run["train"]["allow_test_selection"] is True and run["protocol"] == "clean"
    # a run that does not opt in keeps its configuration (and hash) as before the key existed
    plain = project_with(tmp_path, BASE)
    assert "allow_test_selection" not in plain.resolver.run_config(plain.plan.runs()[0])["train"]


def test_clean_domain_adaptation_on_the_test_set_is_refused(tmp_path):
    from fedrepro.config import ConfigError

    paper = copy.deepcopy(BASE)
    paper["methods"]["facmic"] = {"label": "FACMIC", "train": {"model": {"family": "clip_fam"}}}
    paper["tables"]["accuracy"]["rows"].append({"method": "facmic"})
    with pytest.raises(ConfigError, match=r"settings/bt_iid x methods/facmic \(protocol clean; used by tables/accuracy\): "
                                          r"its domain-adaptation target would be the global test set"):
        project_with(tmp_path, paper)
    project_with(tmp_path, paper, protocols=("paper",))                 # the target IS the test set, by the protocol
    no_da = copy.deepcopy(paper)
    # without L_DA the target batch still passes through the FAM (its BatchNorm statistics adapt to it, as in
    # the authors' code): that reads the target too; only without the pass does the run read no target
    no_da["methods"]["facmic"]["params"] = {"lambda_da": 0}
    with pytest.raises(ConfigError, match="its domain-adaptation target would be the global test set"):
        project_with(tmp_path, no_da)
    no_da["methods"]["facmic"]["params"] = {"lambda_da": 0, "target_pass": False}
    project_with(tmp_path, no_da)
    referenced = copy.deepcopy(paper)
    referenced["settings"]["bt_iid"]["split"]["reference_fraction"] = 0.5
    project_with(tmp_path, referenced)
    paper["methods"]["facmic"]["train"]["allow_test_selection"] = True
    project_with(tmp_path, paper)


def test_target_rows_use_the_test_set_only_under_paper_or_the_opt_in():
    from fedrepro.data.partition import Split
    from fedrepro.fl.federation import target_rows

    split = Split({"client0": {"train": np.array([0, 1]), "val": np.array([2]), "test": np.array([3])}},
                  global_test=np.array([4, 5]), reference=np.zeros(0, dtype=int))
    assert target_rows(split, "clean")[1].tolist() == []
    assert target_rows(split, "clean", allow_test=True)[1].tolist() == [4, 5]
    assert target_rows(split, "paper")[1].tolist() == [4, 5]
    with_ref = Split(split.clients, global_test=np.array([4, 5]), reference=np.array([6]))
    assert target_rows(with_ref, "clean", allow_test=True)[1].tolist() == [6]     # a reference set stays the target


# ---- the tracker and the index checks, without training -----------------------------------------

def test_clean_tracker_keeps_no_test_selection():
    from fedrepro.fl.selection import PredictionTracker, allowed_rules

    assert allowed_rules("clean", False) == ("last", "best_val", "last_k_mean")
    assert "best_test" in allowed_rules("clean", True) and "best_test_round" in allowed_rules("paper", False)
    tracker = PredictionTracker("acc", rules=allowed_rules("clean", False))
    y = np.array([0, 1])
    for rnd, acc in ((1, 0.5), (2, 0.7)):
        tracker.update(rnd, {"global/acc": acc, "val_mean/acc": 0.6}, {"global": (np.full((2, 2), rnd, float), y)})
    assert set(tracker.predictions) == {"last", "best_val"}
    old = {"best": {"best_val": 0.5, "best_test_round": 0.7, "best_test": {"global": 0.7}},
           "predictions": {"best_test": {"global/round": 1}, "best_test_round": {"round": 1}, "last": {"round": 1}}}
    tracker.load_state_dict(old)                       # a checkpoint that kept them: dropped on resume
    assert set(tracker.predictions) == {"last"}


def split_of(rows: dict, **extra):
    from fedrepro.data.partition import Split

    arr = lambda v: np.asarray(v, dtype=int)  # noqa: E731
    return Split({name: {k: arr(v) for k, v in parts.items()} for name, parts in rows.items()},
                 global_test=arr(extra.get("global_test", [])), reference=arr(extra.get("reference", [])),
                 external=arr(extra.get("external", [])), declared_overlaps=extra.get("declared_overlaps", []))


CLIENTS = {"client0": {"train": [0, 1, 2], "val": [3], "test": [4]}, "client1": {"train": [5, 6], "val": [7], "test": [8]}}


def test_disjoint_splits_pass_and_overlaps_are_named():
    from fedrepro.fl.federation import SplitOverlap, check_disjoint

    check_disjoint(split_of(CLIENTS, global_test=[9, 10], reference=[11], external=[12]), "clean")
    # paper protocol: the unlabeled target IS the global test set (declared by the protocol), not an overlap
    check_disjoint(split_of(CLIENTS, global_test=[9, 10], reference=[11]), "paper")
    with pytest.raises(SplitOverlap, match=r"splits/x\.json: .*client0/train and global_test share 2 row\(s\) "
                                           r"\(manifest rows 1, 2\).*Nothing was trained"):
        check_disjoint(split_of(CLIENTS, global_test=[1, 2, 9]), "clean", where="splits/x.json")
    crossed = copy.deepcopy(CLIENTS)
    crossed["client1"]["test"] = [8, 3]                 # client0's validation row is also client1's test row
    with pytest.raises(SplitOverlap, match=r"client0/val and client1/test share 1 row\(s\) \(manifest rows 3\)"):
        check_disjoint(split_of(crossed), "clean")
    with pytest.raises(SplitOverlap, match=r"reference and external share"):
        check_disjoint(split_of(CLIENTS, global_test=[9], reference=[10], external=[10]), "clean")
    with pytest.raises(SplitOverlap, match=r"global_test and external share"):   # paper: the target is in the test set
        check_disjoint(split_of(CLIENTS, global_test=[9], reference=[10], external=[10]), "paper")
    many = {f"client{i}": {"train": list(range(20)), "val": [], "test": []} for i in range(2)}
    with pytest.raises(SplitOverlap, match=r"share 20 row\(s\) \(manifest rows 0, 1, 2, 3, 4, \.\.\.\)"):
        check_disjoint(split_of(many), "clean")


def test_declared_overlaps_pass_and_only_those():
    from fedrepro.fl.federation import SplitOverlap, check_disjoint

    leak = [{"parts": ["global_test", "clients"], "reason": "the authors' indexing"}]
    split = split_of(CLIENTS, global_test=[0, 5, 9], declared_overlaps=leak)
    check_disjoint(split, "clean")
    check_disjoint(split, "paper")                      # the target = the global test set: the same declaration
    with pytest.raises(SplitOverlap, match="client0/train and reference share"):
        check_disjoint(split_of(CLIENTS, global_test=[9], reference=[0], declared_overlaps=leak), "clean")
    from fedrepro.data.partition import Split, SplitError

    with pytest.raises(SplitError, match="declared_overlaps entry"):
        Split.from_json({**split.to_json(), "declared_overlaps": [{"parts": ["global_test", "train"], "reason": "x"}]})
    assert Split.from_json(split.to_json()).declared_overlaps == leak


# ---- real runs of the tiny grid -----------------------------------------------------------------

def test_clean_run_computes_and_stores_no_best_test(tiny_inputs, monkeypatch):
    from fedrepro.train import train_run

    workdir, run = tiny_inputs
    monkeypatch.chdir(workdir)
    train_run(run, "clean/out", "clean/ckpt")
    metrics = json.loads(Path("clean/out/metrics.json").read_text())
    assert set(metrics["by_rule"]) == {"last", "best_val", "last_k_mean"}
    assert metrics["selection"]["rule"] == "best_val"
    assert metrics["test_data"] == {"protocol": "clean", "allow_test_selection": False, "selection_on_test": False,
                                    "target_is_test": False}
    assert "best_test" not in json.dumps(metrics)
    manifest = json.loads(Path("clean/out/run_manifest.json").read_text())
    assert manifest["test_data"] == metrics["test_data"]


def test_opted_in_run_is_recorded_in_manifest_metrics_and_caption(tiny_inputs, tmp_path, monkeypatch):
    from fedrepro import paths
    from fedrepro.report.tables import make_table, table_item
    from fedrepro.train import train_run

    workdir, _ = tiny_inputs
    project = project_with(tmp_path, with_train(selection={"rule": "best_test"}, allow_test_selection=True))
    key = project.plan.runs()[0]
    run = project.resolver.run_config(key)
    monkeypatch.chdir(workdir)
    train_run(run, paths.run_dir(key), paths.checkpoint_dir(key))
    metrics = json.loads(Path(paths.run_file(key)).read_text())
    assert metrics["selection"]["rule"] == "best_test" and {"best_test", "best_test_round"} <= set(metrics["by_rule"])
    assert metrics["test_data"]["allow_test_selection"] and metrics["test_data"]["selection_on_test"]
    manifest = json.loads(Path(paths.run_file(key, "run_manifest.json")).read_text())
    assert manifest["test_data"]["allow_test_selection"] and manifest["config"]["train"]["allow_test_selection"]
    caption = make_table(table_item(project, "clean", "foundation", "accuracy")).caption
    assert "Under the clean protocol these runs were selected on the test set by explicit opt-in " \
           "(allow_test_selection: true)." in caption


def test_an_overlapping_split_stops_the_run_before_training(tiny_inputs, monkeypatch):
    from fedrepro.fl.federation import SplitOverlap
    from fedrepro.io import with_content_digest
    from fedrepro.train import train_run

    workdir, run = tiny_inputs
    monkeypatch.chdir(workdir)
    split = json.loads(Path(run["paths"]["split"]).read_text())
    leaked = split["global_test"][:2]
    split["clients"]["client0"]["train"] = sorted(split["clients"]["client0"]["train"] + leaked)
    bad = copy.deepcopy(run)
    bad["paths"]["split"] = "resources/splits/overlapping.json"
    Path(bad["paths"]["split"]).write_text(json.dumps(with_content_digest(split)))    # as a splitter would write it
    shown = ", ".join(map(str, sorted(leaked)))
    with pytest.raises(SplitOverlap, match=rf"resources/splits/overlapping\.json: .*client0/train and global_test share "
                                           rf"2 row\(s\) \(manifest rows {shown}\)"):
        train_run(bad, "overlap/out", "overlap/ckpt")
    assert not Path("overlap/out").exists() and not Path("overlap/ckpt").exists()      # nothing trained
    # the same overlap, declared by the split (as FedAdapterProto's authors' indexing does), runs
    split["declared_overlaps"] = [{"parts": ["clients", "global_test"], "reason": "reproduces a leak on purpose"}]
    Path(bad["paths"]["split"]).write_text(json.dumps(with_content_digest(split)))
    train_run(bad, "overlap/out", "overlap/ckpt")
    assert Path("overlap/out/metrics.json").exists()


def test_a_run_config_that_bypassed_validation_is_refused_before_training(tiny_inputs, monkeypatch):
    from fedrepro.fl.selection import ForbiddenTestUse
    from fedrepro.train import train_run

    workdir, run = tiny_inputs
    monkeypatch.chdir(workdir)
    bad = copy.deepcopy(run)
    bad["train"]["selection"]["rule"] = "best_test"          # e.g. a hand-edited `fedrepro train --run` JSON
    with pytest.raises(ForbiddenTestUse, match=r"foundation/bt_iid/fedclip \(protocol clean\) would read the test set "
                                               r"\(selection rule 'best_test'.*allow_test_selection: true"):
        train_run(bad, "bypass/out", "bypass/ckpt")
    assert not Path("bypass").exists()
