"""Issue 32, item 7: a table, figure or scorecard asked for by name is made again when a file it was made from is
missing, or when a run behind it was made from inputs that have changed without a newer modification time, and
the command a refusal prints works as printed. Snakemake alone says "Nothing to be done" for both: a deleted
intermediate file is no reason for it to rerun what is up to date, and `cp -p` keeps the old mtime. The real
workflow, on the tiny grid's inputs made in-process."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from fedrepro import paths
from infra_support import run

from .support import job_counts, tiny_project, workflow_here


@pytest.fixture
def trained(tiny):
    from fedrepro.train import train_run

    key = tiny_project().plan.runs()[0]
    train_run(tiny, paths.run_dir(key), paths.checkpoint_dir(key))
    return key


def output_of(proc) -> str:
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_report_whose_run_file_was_deleted_rebuilds_the_run_and_itself(trained, tmp_path):
    """Each report asked for by name plans its run again once a file it reads is gone, and nothing once the file
    is back (the dry run left nothing behind); deleted for real, the table's run is trained again."""
    snakemake, env = workflow_here(tmp_path / "home")
    built = run([*snakemake, "all"], Path.cwd(), env)
    targets = {"table": paths.table("clean", "foundation", "accuracy"),
               "figure": paths.figure("clean", "foundation", "curves"), "scorecard": paths.scorecard("foundation")}
    assert all(Path(t).exists() for t in targets.values()), output_of(built)[-3000:]

    for deleted, rule in (("metrics.json", "table"), ("history.csv", "figure"), ("run_manifest.json", "scorecard")):
        file = Path(paths.run_file(trained, deleted))
        file.rename("aside")
        planned = output_of(run([*snakemake, targets[rule], "--dry-run"], Path.cwd(), env))
        assert {"train", rule} <= set(job_counts(planned)), planned[-3000:]      # (and what else reads the file)
        assert f"{targets[rule]} is out of date" in planned and f"{file} is missing" in planned
        Path("aside").rename(file)                                         # back, as it was
    assert job_counts(output_of(run([*snakemake, *targets.values(), "--dry-run"], Path.cwd(), env))) == {}

    Path(paths.run_file(trained)).unlink()
    run([*snakemake, targets["table"]], Path.cwd(), env)
    assert Path(paths.run_file(trained)).exists()
    assert job_counts(output_of(run([*snakemake, targets["table"], "--dry-run"], Path.cwd(), env))) == {}


@pytest.mark.slow
def test_a_manifest_put_back_with_its_old_mtime_makes_the_table_refuse_with_a_command_that_works(trained, tmp_path):
    """The runs, split and feature cache were rebuilt from an edited manifest; `cp -p` puts the original back. The
    table is out of date (its runs were made from the other manifest): its job refuses, naming the runs, and the
    command it prints rebuilds the split, the feature cache (before: left out, so the command failed once) and the
    runs."""
    table = paths.table("clean", "foundation", "accuracy")
    snakemake, env = workflow_here(tmp_path / "home")
    manifest = Path(tiny_project().resolver.run_config(trained)["paths"]["manifest"])
    shutil.copy2(manifest, "manifest.orig")
    manifest.write_bytes(manifest.read_bytes().replace(b"\n", b"\r\n"))      # the same rows, other bytes
    run([*snakemake, table], Path.cwd(), env)                                  # rebuilds split, features, run, table
    shutil.copy2("manifest.orig", manifest)                                    # cp -p: the old mtime

    planned = output_of(run([*snakemake, table, "--dry-run"], Path.cwd(), env))
    assert job_counts(planned) == {"table": 1}, planned[-3000:]
    refused = run([*snakemake, table], Path.cwd(), env, check=False)
    assert refused.returncode != 0
    log = Path(paths.log("tables", "clean/foundation/accuracy")).read_text()
    assert f"{trained.path}: {manifest} (SHA-256" in log
    command = re.search(r"Rebuild them from the current inputs:\n\s+(snakemake .*)", log).group(1)
    inputs = tiny_project().resolver.run_config(trained)["paths"]
    assert f"--forcerun {inputs['split']} {inputs['features']} {paths.run_file(trained)}" in command, command
    rebuilt = run(command.split(), Path.cwd(), env)                            # as printed
    assert Path(table).exists(), output_of(rebuilt)[-3000:]
    assert job_counts(output_of(run([*snakemake, table, "--dry-run"], Path.cwd(), env))) == {}
