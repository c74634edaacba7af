"""Issue 25, case 3: a table (figure, scorecard) is never built from runs made from other inputs than the ones here
now. A manifest changed by hand after the runs were made is refused by name, with the command that rebuilds them
(naming the configuration's files); putting the manifest back as it was makes the runs valid again. Through
`fedrepro table`, as the rule runs it."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from fedrepro import paths
from infra_support import TINY_CONFIG

from .support import tiny_config_json, tiny_project

TABLE = paths.table("clean", "foundation", "accuracy")


def build_table(out: str = TABLE, table: str = "accuracy", configfiles: tuple[str, ...] | None = (TINY_CONFIG,)) -> None:
    """``fedrepro table`` as the rule runs it, with the config files Snakemake was given (None: not passed)."""
    from fedrepro.cli import main

    named = [] if configfiles is None else ["--configfiles", *configfiles]
    main(["table", "--config-json", tiny_config_json(), *named, "--protocol", "clean", "--paper", "foundation",
          "--table", table, "--out", out])


def test_a_table_refuses_runs_made_from_another_manifest_and_says_how_to_rebuild_them(tiny, caplog):
    from fedrepro.train import train_run

    project = tiny_project()
    key = project.plan.runs()[0]
    train_run(tiny, paths.run_dir(key), paths.checkpoint_dir(key))
    build_table()
    assert Path(TABLE).exists()

    manifest = Path(tiny["paths"]["manifest"])
    shutil.copy2(manifest, "manifest.orig")
    manifest.write_text(manifest.read_text().replace("\n", "\r\n"))     # the same rows, other bytes: edited by hand
    Path(TABLE).unlink()
    caplog.set_level(logging.ERROR)
    with pytest.raises(SystemExit):
        build_table()
    message = caplog.records[-1].getMessage()
    assert f"{TABLE}: 1 run(s) were made from inputs that have changed since" in message
    assert f"{key.path}: {manifest} (SHA-256" in message
    assert f"{tiny['paths']['split']} was made from another version of {manifest}" in message
    # the split and the feature cache were both made from the old manifest: the command forces them with the run
    assert (f"snakemake {TABLE} --cores all --configfile={TINY_CONFIG} --forcerun {tiny['paths']['split']} "
            f"{tiny['paths']['features']} {paths.run_file(key)}") in message
    assert not Path(TABLE).exists()

    shutil.copy2("manifest.orig", manifest)                              # put back: the runs match again
    build_table()
    assert Path(TABLE).exists()


def test_a_table_refuses_runs_made_from_another_feature_cache(tiny, caplog):
    """The run recorded the SHA-256 of the encoder features it trained on; a cache rebuilt since (here: other
    feature values, as another encoder version gives) makes the run stale, though manifest and split are the same."""
    import torch

    from fedrepro.features import load_feature_cache
    from fedrepro.io import torch_save
    from fedrepro.train import train_run

    key = tiny_project().plan.runs()[0]
    train_run(tiny, paths.run_dir(key), paths.checkpoint_dir(key))
    features = tiny["paths"]["features"]
    cache = load_feature_cache(features)
    cache["image"] = cache["image"] + 1e-3 * torch.ones_like(cache["image"])
    torch_save(features, cache)
    caplog.set_level(logging.ERROR)
    with pytest.raises(SystemExit):
        build_table()
    message = caplog.records[-1].getMessage()
    assert f"{TABLE}: 1 run(s) were made from inputs that have changed since" in message
    assert f"{key.path}: {features} (SHA-256" in message
    assert f"--forcerun {paths.run_file(key)}" in message
    assert not Path(TABLE).exists()


def add_probe_table() -> str:
    """The tiny paper with a downstream task on its own dataset and a table of it (a cell with ``task:``);
    -> that table's path."""
    import yaml

    paper_file = Path("tests/data/infra/foundation.yaml")
    paper = yaml.safe_load(paper_file.read_text())
    paper["downstream"] = {"probe": {"kind": "linear_probe", "dataset": "demo_bt"}}
    paper["tables"]["probe"] = {"title": "Linear probe", "metric": "acc", "eval": "100%", "task": "probe",
                                "rows": [{"method": "fedclip"}], "columns": [{"label": "BT", "setting": "bt_iid"}]}
    paper_file.write_text(yaml.safe_dump(paper, sort_keys=False))
    return paths.table("clean", "foundation", "probe")


def test_a_table_refuses_a_downstream_result_made_from_another_manifest(tiny, caplog):
    """A downstream result records the SHA-256 of its downstream dataset's manifest; one recorded from another
    version of it is refused by name, with the command that rebuilds it, though the run it evaluates is current."""
    from fedrepro.io import read_json, sha256_file, write_json
    from fedrepro.train import train_run

    table = add_probe_table()
    key = tiny_project().plan.runs()[0]
    train_run(tiny, paths.run_dir(key), paths.checkpoint_dir(key))
    result = paths.downstream(key, "probe")
    metrics = read_json(paths.run_file(key))

    def write_result(manifest_sha256: str) -> None:     # as the downstream job writes it (fields tables read)
        write_json(result, {"run": metrics["run"], "task": "probe", "kind": "linear_probe", "dataset": "demo_bt",
                            "selection": {"rule": "last", "pretraining": metrics["selection"]},
                            "eval": {"100%": {"acc": 0.5}}, "inputs": {"manifest_sha256": manifest_sha256}})

    def build() -> None:
        build_table(table, "probe")

    write_result(sha256_file(tiny["paths"]["manifest"]))
    build()
    assert Path(table).exists()
    Path(table).unlink()

    write_result("0" * 64)                        # made from a manifest that has changed since
    caplog.set_level(logging.ERROR)
    with pytest.raises(SystemExit):
        build()
    message = caplog.records[-1].getMessage()
    assert f"{table}: 1 downstream result(s) were made from inputs that have changed since" in message
    assert f"{result}: {tiny['paths']['manifest']} (SHA-256 000000000000… when the result was made" in message
    assert f"--forcerun {result}" in message
    assert not Path(table).exists()


def test_a_table_refuses_runs_made_with_other_weights_and_names_the_config_in_its_command(tiny, caplog, monkeypatch):
    """A run records the SHA-256 of every pretrained file it loaded; weights fetched again with other bytes (their
    weights.json lists other SHA-256s) make it stale. The rebuild command names the config files the job was
    given, so a demo user does not rebuild against the full configuration, or says to name them when unknown."""
    from fedrepro import train
    from fedrepro.models import weights as W

    from .test_weights_refetch import OneFile

    source, spec = OneFile(), W.WeightSpec("timm", "tiny_net")
    monkeypatch.setattr(W, "weight_source", lambda kind: source)
    monkeypatch.setattr(train, "weight_specs", lambda model: [spec])       # the run loads these weights
    W.fetch(spec)
    key = tiny_project().plan.runs()[0]
    train.train_run(tiny, paths.run_dir(key), paths.checkpoint_dir(key))
    build_table()
    assert Path(TABLE).exists()
    Path(TABLE).unlink()

    source.payload = b"weights v2"
    W.fetch(spec, force=True)                       # weights.json's content changes: another file SHA-256
    caplog.set_level(logging.ERROR)
    with pytest.raises(SystemExit):
        build_table()
    message = caplog.records[-1].getMessage()
    assert f"{key.path}: pretrained weights {spec.id} ({paths.weights_manifest(spec.id)} lists other" in message
    assert f"snakemake {TABLE} --cores all --configfile={TINY_CONFIG} --forcerun {paths.run_file(key)}" in message

    with pytest.raises(SystemExit):
        build_table(configfiles=None)               # a job not told its config files says to name them
    assert (f"snakemake {TABLE} --cores all --configfile=<your config> --forcerun {paths.run_file(key)}"
            in caplog.records[-1].getMessage())
    assert not Path(TABLE).exists()
