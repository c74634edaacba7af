"""Configuration validation: typos are errors that name the key and what is allowed."""

import copy

import pytest
import yaml

from fedrepro.config import (
    ConfigError,
    Project,
    deep_merge,
    load_project,
)
from fedrepro.paths import RunKey

DEMO = ["config/config.yaml", "config/demo.yaml"]


def demo_config() -> dict:
    config = {}
    for path in DEMO:
        config = deep_merge(config, yaml.safe_load(open(path)))
    return config


def write_paper(tmp_path, mutate) -> Project:
    paper = yaml.safe_load(open("config/demo/foundation.yaml"))
    mutate(paper)
    (tmp_path / "foundation.yaml").write_text(yaml.safe_dump(paper))
    config = demo_config()
    config["paper_dir"] = str(tmp_path)
    config["papers"] = ["foundation"]
    return Project(config, root=".")


def test_shipped_configs_validate():
    for files in (["config/config.yaml"], DEMO):
        project = load_project(files)
        assert project.plan.runs()


def test_unknown_top_level_key_names_allowed_keys():
    config = demo_config()
    config["seed"] = [1]  # typo for seeds
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['seed'\].*did you mean 'seeds'.*allowed keys"):
        Project(config)


def test_unknown_method_names_allowed_values(tmp_path):
    def typo(paper):
        paper["methods"]["fedclip"]["method"] = "fedclp"

    with pytest.raises(ConfigError, match=r"methods/fedclip/method: 'fedclp' is not allowed \(did you mean 'fedclip'\?\); allowed values: \[.*'fedavg'"):
        write_paper(tmp_path, typo)


def test_unknown_dataset(tmp_path):
    def typo(paper):
        paper["settings"]["fashion_iid"]["dataset"] = "demo_fashon"

    with pytest.raises(ConfigError, match=r"dataset: 'demo_fashon' is not allowed \(did you mean 'demo_fashion'\?\)"):
        write_paper(tmp_path, typo)


def test_non_positive_alpha(tmp_path):
    def bad(paper):
        paper["settings"]["fashion_a0.3"]["split"]["alpha"] = 0

    with pytest.raises(ConfigError, match=r"settings/fashion_a0.3/split/alpha"):
        write_paper(tmp_path, bad)


def test_unknown_method_param(tmp_path):
    def bad(paper):
        paper["methods"]["fedprox"] = {"method": "fedprox", "params": {"mu": 0.1, "squard": False}}
        paper["tables"]["accuracy"]["rows"].append({"method": "fedprox"})

    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['squard'\].*did you mean 'squared'.*allowed keys: \['anchor', 'mu', 'squared', 'warmup_updates'\]"):
        write_paper(tmp_path, bad)


def test_unknown_model_family_and_key(tmp_path):
    def bad(paper):
        paper["methods"]["fedavg"]["train"]["model"]["backbon"] = "resnet18"

    with pytest.raises(ConfigError, match=r"fedavg: train/model.*unknown key\(s\) \['backbon'\]"):
        write_paper(tmp_path, bad)


def test_protocol_overrides_merge_into_the_runs_of_that_protocol_only(tmp_path):
    def with_override(paper):
        paper["methods"]["fedprox"] = {"method": "fedprox", "params": {"mu": 0.01, "squared": False},
                                       "protocols": {"paper": {"params": {"anchor": "previous_round"},
                                                               "train": {"optimizer": {"lr": 0.5}}}}}
        paper["tables"]["accuracy"]["rows"].append({"method": "fedprox"})
        paper["settings"]["fashion_paper"] = {**copy.deepcopy(paper["settings"]["fashion_iid"]), "protocol": "paper"}

    project = write_paper(tmp_path, with_override)
    clean = project.resolver.run_config(project.resolver.run_key("foundation", "fashion_iid", "fedprox", 0))
    paper = project.resolver.run_config(project.resolver.run_key("foundation", "fashion_paper", "fedprox", 0))
    assert clean["algorithm"]["params"] == {"mu": 0.01, "squared": False, "anchor": "round_start", "warmup_updates": 0}
    assert paper["algorithm"]["params"] == {"mu": 0.01, "squared": False, "anchor": "previous_round", "warmup_updates": 0}
    assert paper["train"]["optimizer"]["lr"] == 0.5 and clean["train"]["optimizer"]["lr"] != 0.5

    def bad(paper):
        with_override(paper)
        paper["methods"]["fedprox"]["protocols"]["paper"]["params"] = {"anchor": "last_round"}

    with pytest.raises(ConfigError, match=r"methods/fedprox/protocols/paper/params.*'last_round' is not allowed"):
        write_paper(tmp_path, bad)


def test_table_naming_a_missing_method(tmp_path):
    def bad(paper):
        paper["tables"]["accuracy"]["rows"].append({"method": "moon"})

    with pytest.raises(ConfigError, match=r"tables/accuracy/rows/moon/method: 'moon' is not allowed"):
        write_paper(tmp_path, bad)


def test_run_config_hash_follows_every_hyperparameter(tmp_path):
    key = RunKey("foundation", "clean", "fashion_iid", "fedclip", 0)
    before = write_paper(tmp_path, lambda paper: None).resolver.run_config(key)

    def other_lr(paper):
        paper["defaults"]["optimizer"]["lr"] = 0.5

    after = write_paper(tmp_path, other_lr).resolver.run_config(key)
    assert before["config_hash"] != after["config_hash"]
    assert after["train"]["optimizer"]["lr"] == 0.5
    engine_check = load_project(DEMO, overrides={"papers": ["foundation"]})     # the tests' engine-check paper
    assert engine_check.resolver.run_config(engine_check.resolver.run_key("foundation", "fashion_iid", "fedclip", 1))["seed"] == 1


def test_defaults_filled_and_model_blocks_replace_across_families():
    project = load_project(DEMO, overrides={"papers": ["foundation"]})
    fedavg = project.resolver.run_config(project.resolver.run_key("foundation", "fashion_iid", "fedavg", 0))
    assert fedavg["train"]["model"]["family"] == "classifier"
    assert "encoder" not in fedavg["train"]["model"]  # the clip_adapter default did not leak in
    assert fedavg["train"]["model"]["normalize"] == "imagenet"  # schema default
    fedclip = project.resolver.run_config(project.resolver.run_key("foundation", "fashion_iid", "fedclip", 0))
    assert fedclip["train"]["model"]["encoder"]["prompt"] == "a picture of a {}"
    assert fedclip["input"] == "features" and fedavg["input"] == "images"


def test_registry_holds_every_method_and_model_family_with_a_schema():
    from fedrepro.registry import METHODS, MODELS

    assert {"fedavg", "facmic", "faa_clip", "fediic", "feddra", "fedadapterproto", "creff"} <= set(METHODS.names())
    for entry in METHODS.entries():
        assert entry["schema"]["type"] == "object" and entry["schema"]["additionalProperties"] is False, entry.name
    for entry in MODELS.entries():
        assert entry["input"] in ("features", "images", "image_text"), entry.name
        assert entry["schema"]["properties"]["family"] == {"const": entry.name}
        # every image family names its decode-once caches from its config alone
        assert (entry["decode"] is None) == (entry["input"] == "features"), entry.name
    with pytest.raises(KeyError, match=r"unknown method 'fedprx' \(did you mean 'fedprox'\?\)"):
        METHODS.get("fedprx")


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1}}
    out = deep_merge(base, {"a": {"c": 2}})
    assert out == {"a": {"b": 1, "c": 2}} and base == {"a": {"b": 1}}
    assert copy.deepcopy(out) == out


def test_a_figure_sits_in_the_folder_of_the_protocol_its_runs_used():
    """FAA-CLIP's demo setting oh_acp_r pins `paper` (each eval set at its best test round): its figures are built
    once, under paper/, even where the configuration asks for clean only; a figure of unpinned settings is built
    under every configured protocol."""
    from fedrepro import paths

    for protocols in (["clean"], ["clean", "paper"]):
        project = load_project(DEMO, overrides={"papers": ["faa_clip"], "protocols": protocols})
        figures = list(project.plan.figures())
        assert len(figures) == len(set(figures))
        pinned = [f for f in figures if f[2] in ("fig3", "fig4", "fig8")]
        assert pinned == [("paper", "faa_clip", "fig3"), ("paper", "faa_clip", "fig4"), ("paper", "faa_clip", "fig8")]
        assert [p for p, _, name in figures if name == "fig2"] == protocols          # multi_of pins nothing
        for protocol, paper, figure in pinned:                                         # its runs are that protocol's
            assert {key.protocol for key in project.plan.figure_runs(paper, figure, protocol)} == {"paper"}
        assert paths.figure("paper", "faa_clip", "fig3") == "results/demo/figures/paper/faa_clip/fig3.png"


def test_the_demo_writes_its_results_to_its_own_folder():
    """Only the full grid's results are where dvc.yaml's stages are (results/): a push never carries demo runs."""
    from fedrepro import paths

    demo = load_project(DEMO, overrides={"papers": ["feddra"]})
    key = demo.resolver.run_key("feddra", "demo_a1", "feddra", 0)
    assert paths.run_file(key) == "results/demo/runs/clean/feddra/demo_a1/feddra/seed0/metrics.json"
    for path in (paths.model_file(key), paths.downstream(key, "cls"), paths.embedding(key, "fig3"), paths.evidence(),
                 paths.table("clean", "feddra", "table2"), paths.figure("clean", "feddra", "fig3"), paths.scorecard("all")):
        assert path.startswith("results/demo/"), path
    assert demo.resolver.downstream_config(key, "cls")["paths"]["checkpoint"] == paths.model_file(key)
    load_project(["config/config.yaml"])            # the full grid's: results/ (and other tests expect it)
    assert paths.run_file(key) == "results/runs/clean/feddra/demo_a1/feddra/seed0/metrics.json"


def test_validation_remembers_a_valid_block_and_never_an_invalid_one():
    """validate() fills defaults in place; a block already found valid against the same schema object gets the same
    filled block again (its own object, in its own key order), and a later edit of one block does not reach
    another; an invalid block is refused every time."""
    from fedrepro.config.files import ConfigError, validate

    schema = {"type": "object", "additionalProperties": False,
              "properties": {"lr": {"type": "number", "default": 0.1}, "opt": {"type": "object",
                             "properties": {"name": {"type": "string", "default": "sgd"}}, "default": {}}}}
    first, second = {"opt": {}}, {"opt": {}}
    assert validate(first, schema, "a") is first and first == {"opt": {"name": "sgd"}, "lr": 0.1}
    assert validate(second, schema, "b") is second and second == first and second["opt"] is not first["opt"]
    first["opt"]["name"] = "adam"
    third = {"opt": {}}
    assert validate(third, schema, "c") == {"opt": {"name": "sgd"}, "lr": 0.1}
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"d: unknown key\(s\) \['momentum'\]"):
            validate({"momentum": 0.9}, schema, "d")
