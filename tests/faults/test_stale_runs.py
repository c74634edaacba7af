"""Issue 25, case 3: a table (figure, scorecard) is never built from runs made from other inputs than the ones here
now. A manifest changed by hand after the runs were made is refused by name, with the command that rebuilds them;
putting the manifest back as it was makes the runs valid again. Through `fedrepro table`, what the rule runs."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from fedrepro import paths

from .support import tiny_config_json, tiny_project

TABLE = paths.table("clean", "foundation", "accuracy")


def build_table(out: str = TABLE) -> None:
    from fedrepro.cli import main

    main(["table", "--config-json", tiny_config_json(), "--protocol", "clean", "--paper", "foundation",
          "--table", "accuracy", "--out", out])


def test_a_table_refuses_runs_made_from_another_manifest_and_says_how_to_rebuild_them(tiny, caplog):
    from fedrepro.train import train_run

    project = tiny_project()
    key = project.runs()[0]
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
    assert (f"snakemake {TABLE} --cores all --forcerun {tiny['paths']['split']} {paths.run_file(key)}") in message
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

    key = tiny_project().runs()[0]
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
