"""Issue 25, case 4: configuration that the schema let through but that is wrong is refused before any job, with
the key, the allowed values and a suggestion. Each test edits the demo FACMIC twin (config/demo/facmic.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedrepro.config import ConfigError, Project, deep_merge, load_yaml

DEMO = ["config/config.yaml", "config/demo.yaml"]


def facmic(tmp_path: Path, edit=None, text: str | None = None) -> Project:
    """The demo configuration with only the FACMIC twin, its paper file edited (a dict) or replaced (text)."""
    paper = yaml.safe_load(Path("config/demo/facmic.yaml").read_text())
    if edit:
        edit(paper)
    (tmp_path / "facmic.yaml").write_text(text if text is not None else yaml.safe_dump(paper, sort_keys=False))
    config = {}
    for path in DEMO:
        config = deep_merge(config, load_yaml(path))
    return Project({**config, "paper_dir": str(tmp_path), "papers": ["facmic"]}, root=".")


def first_setting(paper: dict) -> dict:
    return next(iter(paper["settings"].values()))


def test_a_class_name_typo_in_a_subset_is_refused(tmp_path):
    def typo(paper):
        first_setting(paper)["split"]["subset"] = {"classes": ["t-shirt", "trousers"]}

    with pytest.raises(ConfigError, match=r"split/subset/classes.*'trousers' is not allowed \(did you mean 'trouser'\?\)"
                                          r"; allowed values: \[.*'t-shirt'"):
        facmic(tmp_path, typo)


def test_ratios_that_do_not_sum_to_one_are_refused(tmp_path):
    def wrong(paper):
        first_setting(paper)["split"]["ratios"] = {"train": 0.7, "val": 0.2, "test": 0.2}

    with pytest.raises(ConfigError, match=r"split/ratios: .* add up to 1.1, not 1; allowed: train \+ val \+ test = 1 "
                                          r"\(e.g. train: 0.6"):
        facmic(tmp_path, wrong)


def test_a_duplicate_yaml_key_is_refused_with_both_lines(tmp_path):
    text = Path("config/demo/facmic.yaml").read_text().replace("\ntables:\n", "\ntables: {}\ntables:\n", 1)
    with pytest.raises(ConfigError, match=r"facmic.yaml is not valid YAML: duplicate key 'tables' at line (\d+) "
                                          r"\(first at line \d+\)"):
        facmic(tmp_path, text=text)
    merged = "a: &base {x: 1, y: 2}\nb:\n  <<: *base\n  y: 3\n"        # overriding merged keys stays allowed
    (tmp_path / "merge.yaml").write_text(merged)
    assert load_yaml(tmp_path / "merge.yaml")["b"] == {"x": 1, "y": 3}


def test_an_unknown_split_kind_is_refused_before_any_job(tmp_path):
    def typo(paper):
        first_setting(paper)["split"]["kind"] = "dirichlett"

    with pytest.raises(ConfigError, match=r"split/kind: 'dirichlett' is not allowed \(did you mean 'dirichlet'\?\); "
                                          r"allowed values: \[.*'by_source'"):
        facmic(tmp_path, typo)


def test_an_unknown_table_metric_or_eval_is_refused_with_what_exists(tmp_path):
    table = "table2"

    def metric(paper):
        paper["tables"][table]["metric"] = "bac"

    with pytest.raises(ConfigError, match=rf"tables/{table}/rows/.* x columns/.*/metric.*'bac' is not allowed \(did "
                                          rf"you mean 'bacc'\?\); allowed values: \[.*'acc', 'auc', 'bacc'"):
        facmic(tmp_path, metric)

    def eval_set(paper):
        paper["tables"][table]["eval"] = "globl"
        for column in paper["tables"][table]["columns"]:
            column.pop("eval", None)

    with pytest.raises(ConfigError, match=r"/eval: 'globl' is not an eval set of setting .* \(3 clients\) \(did you mean "
                                          r"'global'\?\); allowed values: \[.*'client2@external'"):
        facmic(tmp_path, eval_set)

    def selection(paper):                   # the round a one_round table reads is chosen on an eval set too
        paper["tables"]["table5"]["selection"]["eval"] = "client3"

    with pytest.raises(ConfigError, match=r"tables/table5/selection/eval: 'client3' is not an eval set .* \(3 clients\)"):
        facmic(tmp_path, selection)


def test_a_column_naming_an_unknown_setting_is_refused_by_name(tmp_path):
    def typo(paper):
        paper["tables"]["table2"]["columns"][0]["setting"] += "x"

    with pytest.raises(ConfigError, match=r"tables/table2/columns/.*/setting: '.*x' is not allowed \(did you mean"):
        facmic(tmp_path, typo)


def test_a_global_test_fraction_out_of_range_says_the_range(tmp_path):
    def wrong(paper):
        first_setting(paper)["split"]["global_test"] = {"fraction": 1.5}

    with pytest.raises(ConfigError, match=r"'settings/bt_iid/split/global_test/fraction' = 1.5 is out of range; allowed: 0 < value < 1"):
        facmic(tmp_path, wrong)



def test_an_unknown_selection_metric_is_refused_with_what_the_task_reports(tmp_path):
    """best_val ranks rounds on ``selection.metric``; an unknown one would make every run report its last round."""
    def typo(paper):
        paper["defaults"]["selection"] = {"rule": "best_val", "metric": "bac"}

    with pytest.raises(ConfigError, match=r"settings/.* x methods/.* \(protocol clean\): train/selection/metric \(what a "
                                          r"classification run reports.*\): 'bac' is not allowed \(did you mean 'bacc'\?\); "
                                          r"allowed values: \['acc', 'auc', 'bacc', 'ece', 'f1'\]"):
        facmic(tmp_path, typo)


def test_an_unknown_figure_metric_or_eval_is_refused_with_what_exists(tmp_path):
    """A figure's metric(s) and eval(s) are checked as a table cell's, naming the key as written."""
    def metric(paper):
        paper["figures"]["fig2"]["metric"] = "accu"

    with pytest.raises(ConfigError, match=r"figures/fig2 \(.* x .*\)/metric \(what a classification run reports\): "
                                          r"'accu' is not allowed \(did you mean 'acc'\?\)"):
        facmic(tmp_path, metric)

    def evals(paper):
        paper["figures"]["fig2"].pop("eval")
        paper["figures"]["fig2"]["evals"] = ["global", "client7"]

    with pytest.raises(ConfigError, match=r"figures/fig2 \(.* x .*\)/evals: 'client7' is not an eval set of setting .* "
                                          r"\(3 clients\)"):
        facmic(tmp_path, evals)


@pytest.mark.parametrize("typo", [
    {"subset": {"sources": ["original", "rotatd"]}},                     # silently dropped the rotated rows
    {"global_test": {"sources": ["rotated", "rotatd"]}},                 # silently left rotatd's rows to clients
    {"external": {"sources": ["rotatd"]}},
    {"kind": "by_source", "sources": ["original", "rotatd"]},
])
def test_a_source_typo_in_a_split_is_refused_by_the_split_job(typo):
    """A dataset does not declare its sources (its manifest does), so the split job, not the configuration check,
    refuses a source name that is not there: with the key, a suggestion and the manifest's sources."""
    import pandas as pd

    from fedrepro.data.partition import SplitError, make_split

    sources = ["original", "rotated", "inverted"]
    manifest = pd.DataFrame({"path": [f"{i}.png" for i in range(60)], "label": [i % 2 for i in range(60)],
                             "class_name": [f"c{i % 2}" for i in range(60)], "source": [sources[i % 3] for i in range(60)],
                             "split": "train"})
    key = next(k for k in ("subset", "global_test", "external", "by_source") if k in typo or typo.get("kind") == k)
    with pytest.raises(SplitError, match=rf"{key}: sources \['rotatd'\] are not in .* \(did you mean 'rotated'\?\); "
                                         rf"available: \['inverted', 'original', 'rotated'\]"):
        make_split(manifest, {"kind": "iid", "clients": 2, **typo}, seed=0)


def test_more_clients_than_images_is_refused_before_any_job_and_briefly_by_the_split_job(tiny):
    """Issue 32, item 8: ``clients: 5000`` on a dataset of 17 images passed validation, and the split job then
    failed with a 58 KB line listing every empty client. Where the manifest is there the configuration check
    refuses it, naming the setting and the number of images; where it is not yet, the split job says it in a
    line."""
    import re

    from fedrepro.data.manifest import read_manifest
    from fedrepro.data.partition import SplitError, make_split

    from .support import tiny_project

    paper = Path("tests/data/infra/foundation.yaml")
    spec = yaml.safe_load(paper.read_text())
    spec["settings"]["bt_iid"]["split"]["clients"] = 5000
    paper.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigError, match=r"foundation.yaml: settings/bt_iid/split/clients: 5000 clients, but demo_bt "
                                          r"has 17 images \(resources/manifests/demo_bt.csv\).*at most 17 clients"):
        tiny_project()

    with pytest.raises(SplitError) as error:
        make_split(read_manifest(tiny["paths"]["manifest"]), spec["settings"]["bt_iid"]["split"], seed=0)
    message = str(error.value)
    assert len(message) < 600 and re.search(r"leaves \d+ of 5000 clients with fewer than min_train=1", message), message
    assert re.search(r"5000 clients for the \d+ images of the pool: at most \d+", message) and "more" in message


def test_a_list_override_on_the_command_line_is_read_as_in_a_config_file(tiny, tmp_path):
    """Issue 32, item 8: ``snakemake --config seeds=[0,1]`` stopped with "'0' is not of type 'integer'" (Snakemake
    reads the items of a list as strings); it now plans both seeds."""
    from infra_support import run

    from .support import job_counts, workflow_here

    snakemake, env = workflow_here(tmp_path / "home")
    planned = run([*snakemake, "--dry-run", "--config", "seeds=[0,1]", "--", "all"], Path.cwd(), env, check=False)
    output = planned.stdout + planned.stderr
    assert planned.returncode == 0 and job_counts(output)["train"] == 2, output[-3000:]
    assert "seed1" in output
