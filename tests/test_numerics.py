"""Numerics are not a protocol (README "Numerics"): how a run computes (precision, JPEG decoding, the pixel
pipeline) is its own choice, the authors' by default under both protocols, recorded in every run and in its
folder, and a table that compares protocols compares runs with equal numerics."""

from __future__ import annotations

import copy
import json

import pytest

from fedrepro import paths
from fedrepro.config import ConfigError, load_project
from fedrepro.paths import RunKey
from test_config import write_paper

FULL = ["config/config.yaml"]


def numerics_of(proj, key: RunKey) -> dict:
    """What a run computes with, from its resolved config."""
    from fedrepro.models.encoders import frozen_encoder_precision

    run = proj.resolver.run_config(key)
    model = run["train"]["model"]
    return {"numerics": run["numerics"], "precision": run["train"]["precision"], "jpeg_draft": run["jpeg_draft"],
            "pixels": model["pixels"], "encoder": frozen_encoder_precision(model)}


@pytest.mark.parametrize("numerics", ["authors", "fast"])
def test_clean_and_paper_runs_of_a_cell_compute_alike(numerics):
    """Every (paper, setting, method) of the full grid computes the same under clean and paper: the protocol
    changes what the authors' code leaked or got wrong, not precision, JPEG decoding or pixels (on today's main
    clean trained in bf16 autocast from DCT-scaled JPEGs and paper in fp32 / fp16 from full decodes)."""
    proj = load_project(FULL, {"protocols": ["clean", "paper"], "numerics": numerics})
    keys = {(k.paper, k.setting, k.method): k for k in proj.plan.runs() if k.seed == 0 and k.protocol == "clean"}
    compared = 0
    for (paper, setting, method), key in keys.items():
        if proj.resolver.protocol(paper, setting, "clean") != "clean":
            continue
        paper_key = proj.resolver.run_key(paper, setting, method, 0, "paper")
        assert numerics_of(proj, key) == numerics_of(proj, paper_key), (paper, setting, method)
        compared += 1
    assert compared > 250
    expected = {"authors": {"precision": {"fp32", "fp16_weights"}, "jpeg_draft": {False}, "pixels": {"authors"}},
                "fast": {"precision": {"auto"}, "jpeg_draft": {True}, "pixels": {"fast"}}}[numerics]
    seen = [numerics_of(proj, key) for key in keys.values()]
    for name, values in expected.items():
        assert {s[name] for s in seen} == values, name


def test_numerics_are_in_the_run_identity_and_folder():
    """A run's numerics are in its config (and so its hash, a Snakemake param) and in its folder: the authors'
    runs keep results/runs/<protocol>/..., the fast ones go to results/runs/<protocol>-fast/..., so runs of
    different numerics never overwrite each other; a file's path gives its run back."""
    authors, fast = (load_project(FULL, {"numerics": n}) for n in ("authors", "fast"))
    key = authors.resolver.run_key("fediic", "isic", "fediic", 0)
    fast_key = fast.resolver.run_key("fediic", "isic", "fediic", 0)
    assert (key.numerics, fast_key.numerics) == ("authors", "fast")
    run, fast_run = authors.resolver.run_config(key), fast.resolver.run_config(fast_key)
    assert run["numerics"] == "authors" and fast_run["numerics"] == "fast"
    assert run["config_hash"] != fast_run["config_hash"]
    assert paths.run_dir(key) == "results/runs/clean/fediic/isic/fediic/seed0"
    assert paths.run_dir(fast_key) == "results/runs/clean-fast/fediic/isic/fediic/seed0"
    assert paths.checkpoint_dir(fast_key).startswith("results/checkpoints/clean-fast/")
    for k in (key, fast_key):
        assert paths.run_key_of(paths.run_file(k)) == k
        assert paths.run_key_of(paths.model_file(k)) == k
    with pytest.raises(ConfigError, match="computes with the authors numerics, not fast"):
        authors.resolver.run_config(fast_key)


def test_numerics_are_chosen_per_paper_setting_and_method(tmp_path):
    """The most specific choice wins: a method variant's, then the setting's, then the paper file's, then the
    config's; each run's folder and train block follow."""
    def choose(paper):
        paper["numerics"] = "fast"
        paper["settings"]["bt_iid"]["numerics"] = "authors"
        paper["methods"]["fedclip"]["numerics"] = "authors"

    project = write_paper(tmp_path, choose)
    numerics = {(k.setting, k.method): k.numerics for k in project.plan.runs()}
    assert numerics[("fashion_iid", "fedavg")] == "fast"                 # the paper's
    assert numerics[("bt_iid", "fedavg")] == "authors"                   # the setting's
    assert numerics[("fashion_iid", "fedclip")] == "authors"             # the method's
    fast = project.resolver.run_config(project.resolver.run_key("foundation", "fashion_iid", "fedavg", 0))
    assert fast["train"]["precision"] == "auto" and fast["train"]["model"]["pixels"] == "fast" and fast["jpeg_draft"]
    assert "/clean-fast/foundation/fashion_iid/fedavg/seed0" in fast["paths"]["out"]
    same = project.resolver.run_config(project.resolver.run_key("foundation", "bt_iid", "fedavg", 0))
    assert same["train"]["precision"] == "fp32" and same["train"]["model"]["pixels"] == "authors"
    assert "/clean/foundation/bt_iid/fedavg/seed0" in same["paths"]["out"]


def comparison_table(paper):
    paper["tables"]["protocols"] = {
        "title": "FedCLIP under both protocols",
        "rows": [{"method": "fedclip"}, {"method": "fedavg"}],
        "columns": [{"label": "clean", "setting": "fashion_iid", "protocol": "clean"},
                    {"label": "paper", "setting": "fashion_iid", "protocol": "paper"}],
    }


def test_a_protocol_comparison_with_unequal_numerics_is_refused_naming_the_cells(tmp_path):
    """FACMIC's protocols table, FedAdapterProto's index_bug table: a row (or column) that puts a clean and a paper
    run side by side must not compare precision, JPEG decoding or pixels; the configuration check names the cells."""
    write_paper(tmp_path, comparison_table)      # equal numerics: accepted

    def precision_under_clean(paper):
        comparison_table(paper)
        paper["methods"]["fedclip"]["protocols"] = {"clean": {"train": {"precision": "bf16"}}}

    with pytest.raises(ConfigError, match=r"tables/protocols: rows/fedclip compares the clean and the paper protocol, "
                                          r"but its cells compute differently: rows/fedclip x columns/clean "
                                          r"\(protocol clean\): .*precision bf16.*rows/fedclip x columns/paper "
                                          r"\(protocol paper\): .*precision fp32"):
        write_paper(tmp_path, precision_under_clean)

    def fast_setting(paper):                      # the paper column on another setting, with the fast numerics
        comparison_table(paper)
        paper["settings"]["fashion_fast"] = {**copy.deepcopy(paper["settings"]["fashion_iid"]), "numerics": "fast"}
        paper["tables"]["protocols"]["columns"][1]["setting"] = "fashion_fast"

    with pytest.raises(ConfigError, match=r"rows/fedclip compares .*numerics authors, precision fp32.*JPEG decoding "
                                          r"full, pixels authors.*numerics fast, precision auto.*DCT-scaled, pixels fast"):
        write_paper(tmp_path, fast_setting)


def test_the_run_manifest_and_metrics_record_the_numerics(tmp_path):
    """The real training job: run_manifest.json's variant and metrics.json's run say which numerics computed it."""
    from fedrepro.train import train_run
    from infra_support import build_tiny_inputs, with_rounds

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        run = with_rounds(build_tiny_inputs(tmp_path), 1)
        train_run(run, "out", "ckpt")
    manifest = json.loads((tmp_path / "out/run_manifest.json").read_text())
    metrics = json.loads((tmp_path / "out/metrics.json").read_text())
    assert manifest["variant"]["numerics"] == manifest["run"]["numerics"] == metrics["run"]["numerics"] == "authors"
    assert manifest["variant"]["pixels"] == "authors" and manifest["variant"]["jpeg_draft"] is False
    assert manifest["config"]["numerics"] == "authors"


def test_a_table_of_fast_runs_says_so_in_its_caption():
    from fedrepro.report.tables import make_caption

    spec = {"title": "T"}
    assert "fast numerics" not in make_caption(spec, "t", None, {"clean"}, {"last"}, 3, numerics={"authors"})
    caption = make_caption(spec, "t", None, {"clean"}, {"last"}, 3, numerics={"authors", "fast"})
    assert "Computed with the fast numerics" in caption and "(some runs)" in caption
