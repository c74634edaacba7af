"""Issue 25, case 1: every table, figure, scorecard and the evidence page carries, as a Snakemake param, the hash of
exactly the definition it is made from (its spec, the labels of what it names), so editing a table's metric or a
method's label rebuilds what shows it, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedrepro.config import Project, deep_merge, load_yaml
from infra_support import REPO, TINY_CONFIG, run


def definitions(project: Project) -> dict[tuple, str]:
    """The definition hash of every output the rules build from the report (what the rules' params hold)."""
    from fedrepro.report import definitions as D
    from fedrepro.report.figures import figure_item
    from fedrepro.report.tables import table_item

    out = {("table", *t): D.definition_hash(D.item_definition(table_item(project, *t))) for t in project.plan.tables()}
    out |= {("figure", *f): D.definition_hash(D.item_definition(figure_item(project, *f))) for f in project.plan.figures()}
    out |= {("scorecard", p): D.definition_hash(D.scorecard_definition(project, p)) for p in [*project.papers, "all"]}
    return out | {("evidence",): D.definition_hash(D.evidence_definition(project))}


def demo(tmp_path: Path, edit=None) -> Project:
    """The demo configuration with its FACMIC and FedIIC twins, FACMIC's paper file edited."""
    for paper in ("facmic", "fediic"):
        spec = yaml.safe_load((REPO / f"config/demo/{paper}.yaml").read_text())
        if edit and paper == "facmic":
            edit(spec)
        (tmp_path / f"{paper}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    config = deep_merge(load_yaml(REPO / "config/config.yaml"), load_yaml(REPO / "config/demo.yaml"))
    return Project({**config, "paper_dir": str(tmp_path), "papers": ["facmic", "fediic"]}, root=REPO)


def changed(tmp_path, edit) -> set[tuple]:
    before = definitions(demo(tmp_path))
    after = definitions(demo(tmp_path, edit))
    assert before.keys() == after.keys()
    return {key for key in before if before[key] != after[key]}


def test_editing_a_table_metric_changes_that_table_only(tmp_path):
    def metric(paper):
        paper["tables"]["table2"]["metric"] = "bacc"

    assert changed(tmp_path, metric) == {("table", "clean", "facmic", "table2")}


def test_renaming_a_method_changes_what_shows_its_label(tmp_path):
    def label(paper):
        paper["methods"]["fedclip"]["label"] = "FedCLIP (renamed)"

    project = demo(tmp_path)
    showing = {("table", "clean", "facmic", t) for t in project.papers["facmic"]["tables"]
               if "fedclip" in {k.method for k in project.plan.table_runs("facmic", t, "clean")}}
    showing |= {("figure", "clean", "facmic", f) for f, spec in project.papers["facmic"]["figures"].items()
                if "fedclip" in spec.get("methods", [])}
    assert changed(tmp_path, label) == showing | {("evidence",)}
    assert ("table", "clean", "facmic", "table2") in showing and ("table", "clean", "facmic", "table3") not in showing


def test_training_settings_and_other_papers_leave_report_definitions_alone(tmp_path):
    def train(paper):
        paper["defaults"]["optimizer"]["lr"] = 0.5                  # reruns the runs, whose files the reports read

    assert changed(tmp_path, train) == set()
    both = definitions(demo(tmp_path))                              # adding a paper: the other's outputs stay
    alone = definitions(Project({**demo(tmp_path).config, "papers": ["facmic"]}, root=REPO))
    spanning = {("scorecard", "all"), ("evidence",)}
    assert {k: v for k, v in alone.items() if k not in spanning}.items() <= both.items()


@pytest.mark.usefixtures("tiny")
def test_snakemake_rebuilds_a_table_whose_metric_was_edited_and_only_it(tmp_path):
    """The real rule: the tiny grid's inputs and run are made in-process, Snakemake builds the table, then the table's
    metric is edited in the paper file."""
    from fedrepro import paths
    from fedrepro.train import train_run

    from .support import job_counts, tiny_project, workflow_here

    project = tiny_project()
    key = project.plan.runs()[0]
    train_run(project.resolver.run_config(key), paths.run_dir(key), paths.checkpoint_dir(key))
    table = paths.table("clean", "foundation", "accuracy")
    snakemake, env = workflow_here(tmp_path / "home")
    snakemake = [*snakemake, table]

    built = run(snakemake, Path.cwd(), env)
    assert job_counts(built.stdout + built.stderr) == {"table": 1}       # the runs made here are up to date
    paper = Path(TINY_CONFIG).with_name("foundation.yaml")
    paper.write_text(paper.read_text().replace("metric: acc\n    eval: global\n    rows", "metric: bacc\n    eval: global\n"
                                                                                         "    rows", 1))
    planned = run([*snakemake, "--dry-run"], Path.cwd(), env)
    assert job_counts(planned.stdout + planned.stderr) == {"table": 1}, planned.stdout[-3000:]
    assert "params" in planned.stdout + planned.stderr
