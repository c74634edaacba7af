"""The workflow's logic without Snakemake (fedrepro.dag): what each rule's jobs read and ask for, the two steps of a
report's out-of-date mark, and the jobs a target needs (what `fedrepro estimate` prices), on the demo configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedrepro import paths
from fedrepro.config import ConfigError, load_project
from fedrepro.cost.runtime import FALLBACK_RUNTIME
from fedrepro.dag import Dag, DagError, figure_outputs, scorecard_outputs, table_outputs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project():
    project = load_project([REPO / "config/config.yaml", REPO / "config/demo.yaml"], root=REPO)
    yield project
    paths.use_results_dir("results")


@pytest.fixture(scope="module")
def dag(project):
    return Dag(project)


def run_wildcards(key, **more) -> SimpleNamespace:
    return SimpleNamespace(protocol=paths.run_dir(key).split("/")[-5], paper=key.paper, setting=key.setting,
                           method=key.method, seed=str(key.seed), **more)


def by_input(project, features: bool):
    return next(k for k in project.plan.runs() if (project.resolver.run_config(k)["input"] == "features") == features)


def test_the_package_does_not_import_snakemake():
    """The fork-server and every job import fedrepro: the DAG module leaves Snakemake to the rules."""
    code = "import sys, fedrepro.dag, fedrepro.cost.estimate; sys.exit('snakemake' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_all_is_every_kind_of_output_the_configuration_names(project, dag):
    expected = [paths.table(*t) for t in project.plan.tables()] + [paths.figure(*f) for f in project.plan.figures()]
    expected += [paths.scorecard(p) for p in project.papers] + [paths.scorecard("all")]
    expected += [paths.evidence()] if project.config.get("evidence") else []
    assert project.config["outputs"] == ["tables", "figures", "scorecards", "evidence"]
    assert dag.all_outputs() == expected


def test_a_run_is_found_by_its_wildcards_and_an_unknown_one_named(project, dag):
    key = project.plan.runs()[0]
    assert dag.run_key(run_wildcards(key)) == key
    assert dag.run_config(run_wildcards(key)) == project.resolver.run_config(key)
    with pytest.raises(DagError, match=r"no run clean/facmic/bt_iid/nothing/seed0 in the configuration"):
        dag.run_key(SimpleNamespace(protocol="clean", paper="facmic", setting="bt_iid", method="nothing", seed="0"))
    with pytest.raises(DagError, match=r"no split nowhere in the configuration"):
        dag.split_of(SimpleNamespace(split="nowhere"))


def test_the_rules_error_is_raised_where_one_is_given(project):
    class WorkflowStop(Exception):
        pass

    with pytest.raises(WorkflowStop, match="no split nowhere"):
        Dag(project, error=WorkflowStop).split_of(SimpleNamespace(split="nowhere"))


def test_a_run_on_features_reads_its_cache_and_an_image_run_its_pixels(project, dag):
    features = run_wildcards(by_input(project, features=True))
    run = dag.run_config(features)
    assert dag.train_inputs(features) == {"manifest": run["paths"]["manifest"], "split": run["paths"]["split"],
                                          "features": run["paths"]["features"]}
    assert dag.on_features(features) and dag.train_group(features) == "train_features" and dag.train_threads(features) == 1

    images = run_wildcards(by_input(project, features=False))
    run, inputs = dag.run_config(images), dag.train_inputs(images)
    for part, pixels in run["paths"]["images"].items():
        assert inputs[f"images_{part}"] == pixels and inputs[f"images_{part}_index"] == paths.image_cache_index(pixels)
    assert "features" not in inputs and dag.train_group(images) is None
    assert dag.train_threads(images) == project.config["image_run_threads"]


def test_a_downstream_job_reads_its_model_and_the_files_beside_it(project, dag):
    key, task = next(iter(dag.downstream_jobs.values()))
    inputs = dag.downstream_inputs(run_wildcards(key, task=task))
    assert inputs["model"] == paths.model_file(key) and inputs["metrics"] == paths.run_file(key)
    with pytest.raises(DagError, match=f"no downstream evaluation {key.path}/nothing"):
        dag.downstream_key(run_wildcards(key, task="nothing"))


def test_the_report_rules_outputs_are_the_targets_estimate_knows(project, dag):
    protocol, paper, table = next(iter(project.plan.tables()))
    assert list(table_outputs(protocol, paper, table)) == ["md", "csv", "tex", "seeds", "provenance"]
    assert table_outputs(protocol, paper, table)["md"] == paths.table(protocol, paper, table)
    protocol, paper, figure = next(iter(project.plan.figures()))
    assert list(figure_outputs(protocol, paper, figure).values()) == [paths.figure(protocol, paper, figure),
                                                                     paths.figure(protocol, paper, figure, ".pdf")]
    assert scorecard_outputs("all")["html"] == paths.scorecard("all")
    for path in [*table_outputs(protocol, paper, table).values(), *scorecard_outputs(paper).values()]:
        assert dag.target(path).path == path


def test_the_jobs_a_target_needs(project, dag):
    protocol, paper, table = next(iter(project.plan.tables()))
    target = dag.target(paths.table(protocol, paper, table, ".csv"))
    assert target.runs == project.plan.table_runs(paper, table, protocol)
    assert target.downstream == project.plan.table_downstream(paper, table, protocol)
    everything = dag.target("all")
    assert everything.runs == project.plan.runs() and len(everything.downstream) == len(dag.downstream_jobs)
    key = project.plan.runs()[0]
    assert dag.target(paths.run_file(key, "history.csv")).runs == [key]
    with pytest.raises(ConfigError, match="is not a target of this configuration"):
        dag.target("results/demo/tables/clean/facmic/no_such_table.md")


def test_without_a_throughput_table_the_requests_are_the_guesses(project, dag):
    assert dag.requests.image_cache_request(SimpleNamespace(dataset="demo_bt"), 8).runtime == FALLBACK_RUNTIME["image_cache"]
    dataset_key = next(iter(dag.features))
    dataset, key = dataset_key.split("/", 1)
    request = dag.requests.features_request(SimpleNamespace(dataset=dataset, key=key), 8)
    assert request.runtime == FALLBACK_RUNTIME["features"] and not request.measured


def test_a_report_is_out_of_date_in_two_steps(project, dag, tmp_path, monkeypatch):
    """Deciding writes nothing; recording writes the mark: new content and mtime with reasons, mtime 0 without."""
    monkeypatch.chdir(tmp_path)
    said = []
    dag = Dag(project, say=said.append)
    protocol, paper, table = next(iter(project.plan.tables()))
    target = paths.table(protocol, paper, table)
    files = dag.table_files(protocol, paper, table)
    mark = Path(paths.report_mark(target))

    assert dag.out_of_date.decide(target, files) == [] and not mark.exists()     # not made yet: Snakemake builds it
    Path(target).parent.mkdir(parents=True)
    Path(target).write_text("made\n")
    reasons = dag.out_of_date.decide(target, files)
    assert reasons == [f"{f} is missing" for f in files] and not mark.exists()

    assert dag.report_inputs(target, files) == [*files, str(mark)]
    assert mark.stat().st_mtime_ns > 0 and mark.read_text().splitlines()[1:] == reasons
    assert len(said) == 1 and said[0].startswith(f"fedrepro: {target} is out of date")
    dag.out_of_date.record(target, reasons)
    assert len(said) == 1                                                       # said once per target

    for f in files:
        Path(f).parent.mkdir(parents=True, exist_ok=True)
        Path(f).write_text("")
    assert dag.out_of_date.decide(target, files) == []
    assert dag.table_inputs(SimpleNamespace(protocol=protocol, paper=paper, table=table)) == [*files, str(mark)]
    assert mark.stat().st_mtime_ns == 0                                          # older than any report


def test_every_reports_mark_exists_before_planning_and_two_reports_of_a_folder_plan_on_a_fresh_checkout(
        project, dag, tmp_path, monkeypatch):
    """The marks are made (old: mtime 0) in one step before Snakemake plans: a mark created while it planned was
    reported missing as soon as two reports of one folder were asked for in one command on a fresh checkout
    (Snakemake caches what it saw of a folder), e.g. a scorecard and the all-papers scorecard."""
    from infra_support import TINY_CONFIG, copy_repo, run, tool_env

    monkeypatch.chdir(tmp_path)
    targets = dag.report_targets()
    assert set(dag.all_outputs()) <= set(targets) and paths.scorecard("all") in targets
    dag.out_of_date.prepare(targets)
    assert all(Path(paths.report_mark(t)).stat().st_mtime_ns == 0 for t in targets)

    repo = copy_repo(tmp_path / "repo")
    planned = run(["snakemake", "-n", f"--configfile={TINY_CONFIG}", "results/scorecards/foundation.html",
                   "results/scorecards/all.html"], repo, tool_env(repo, tmp_path / "home"), check=False)
    assert planned.returncode == 0, planned.stderr[-3000:]


def test_the_definition_params_hash_what_each_report_is_made_from(project, dag):
    from fedrepro.report.definitions import definition_hash, item_definition, scorecard_definition
    from fedrepro.report.tables import table_item

    protocol, paper, table = next(iter(project.plan.tables()))
    wildcards = SimpleNamespace(protocol=protocol, paper=paper, table=table)
    assert dag.table_definition(wildcards) == definition_hash(item_definition(table_item(project, protocol, paper, table)))
    assert dag.scorecard_definition(SimpleNamespace(paper=paper)) == definition_hash(scorecard_definition(project, paper))
    assert dag.configuration(wildcards, None) == dag.config_json and dag.configfiles(wildcards, None) == ""
    assert os.path.isabs(dag.raw_root("resources/raw/demo_bt/.complete")) is False
    assert dag.raw_root("resources/raw/demo_bt/.complete") == "resources/raw"
