"""Results through DVC: separate targets per pipeline stage, a default remote that needs no setup, and
the round trip a user makes: run -> push -> fresh clone -> pull -> nothing to do -> a table rebuilds
from the pulled metrics without training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from infra_support import (
    REPO,
    TINY_CONFIG,
    TINY_METRICS,
    TINY_TABLE,
    copy_repo,
    run,
    tool_env,
)

STAGE_OUTS = {
    "raw": "resources/raw", "weights": "resources/weights", "manifests": "resources/manifests", "splits": "resources/splits",
    "images": "resources/images", "features": "resources/features", "runs": "results/runs", "checkpoints": "results/checkpoints",
    "embeddings": "results/embeddings", "tables": "results/tables", "figures": "results/figures",
    "scorecards": "results/scorecards",
}


def test_every_kind_of_output_is_its_own_dvc_target():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    outs = {name: [next(iter(o)) if isinstance(o, dict) else o for o in stage["outs"]] for name, stage in stages.items()}
    assert outs == {name: [path] for name, path in STAGE_OUTS.items()}
    for stage in stages.values():   # DVC must never delete what Snakemake built (resume, reuse)
        assert all(o[next(iter(o))].get("persist") is True for o in stage["outs"])
    # the runs target holds metrics only; models live in their own tree
    assert not Path(STAGE_OUTS["checkpoints"]).is_relative_to(STAGE_OUTS["runs"])


def test_default_remote_is_a_local_directory_and_pull_skips_heavy_targets():
    import importlib.util

    config = (REPO / ".dvc/config").read_text()
    remote = re.search(r"\[core\][^\[]*remote = (\S+)", config).group(1)
    url = re.search(rf"\['remote \"{remote}\"'\][^\[]*url = (\S+)", config).group(1)
    assert "://" not in url and not url.startswith(("s3:", "ssh:", "gs:"))   # works with no account
    spec = importlib.util.spec_from_file_location("dvc_results", REPO / "scripts/dvc-results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.DEFAULT_PULL) == {"manifests", "splits", "runs", "embeddings", "tables", "figures", "scorecards"}
    assert set(module.DEFAULT_PULL) <= set(STAGE_OUTS)


def snakemake(target: str, *flags: str) -> list[str]:
    # the target goes first: --configfile and --forcerun take every word that follows them
    return ["snakemake", target, "--cores", "2", *flags, "--configfile", TINY_CONFIG]


def job_counts(output: str) -> dict[str, int]:
    """The "Job stats" table of a Snakemake run -> {rule: count}."""
    table = output[output.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)
            if m.group(1) != "total"}


@pytest.mark.slow
def test_push_fresh_clone_pull_then_nothing_to_do_and_tables_rebuild_without_training(tmp_path):
    origin = copy_repo(tmp_path / "origin")
    env = tool_env(origin, tmp_path / "home")
    run(["git", "init", "-q", "-b", "main"], origin, env)
    run(["git", "add", "-A"], origin, env)
    run(["git", "commit", "-q", "-m", "checkout"], origin, env)
    push = ["python", "scripts/dvc-results.py", "push", "--", "--configfile", TINY_CONFIG]

    refused = run(push, origin, env, check=False)
    assert refused.returncode == 1 and "job(s) to run" in refused.stderr   # nothing built yet: no push

    run(snakemake("all"), origin, env, timeout=900)
    run(push, origin, env)
    remote = tmp_path / "home/.cache/fedrepro/dvc-store"   # the default remote, `~` = this test's HOME
    assert any(remote.rglob("*")), "nothing was uploaded to the default remote"
    assert "dvc.lock" in run(["git", "show", "--name-only", "HEAD"], origin, env).stdout

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(origin), str(clone)], tmp_path, env)
    env = tool_env(clone, tmp_path / "home")
    assert not (clone / "results/runs").exists()
    run(["python", "scripts/dvc-results.py", "pull", "--", "--configfile", TINY_CONFIG], clone, env)
    for stage in ("splits", "runs", "tables", "figures"):
        assert (clone / STAGE_OUTS[stage]).is_dir(), stage
    for stage in ("raw", "manifests", "features", "checkpoints"):   # the datasets' own data is not pushed; heavy ones stay remote
        assert not (clone / STAGE_OUTS[stage]).exists(), stage
    assert (clone / TINY_TABLE).read_text() == (origin / TINY_TABLE).read_text()

    dry = run(snakemake("all", "-n"), clone, env)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]

    metrics_mtime = (clone / TINY_METRICS).stat().st_mtime_ns
    (clone / TINY_TABLE).unlink()
    rebuilt = run(snakemake(TINY_TABLE), clone, env)
    assert job_counts(rebuilt.stdout + rebuilt.stderr) == {"table": 1}   # no train, no split, no download
    assert (clone / TINY_TABLE).read_text() == (origin / TINY_TABLE).read_text()
    assert (clone / TINY_METRICS).stat().st_mtime_ns == metrics_mtime
