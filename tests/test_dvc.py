"""Results through DVC: separate targets per pipeline stage, a default remote that needs no setup, and
the round trip a user makes: run -> push -> fresh clone -> pull -> nothing to do -> every table, figure and
scorecard rebuilds from the pulled files without training, and the report builds. It is made as README shows it for the
demo: a configuration with a results folder of its own, and the overlay config/dvc-overlay.yaml that puts it where
dvc.yaml's stages are."""

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
    "downstream": "results/downstream", "embeddings": "results/embeddings", "tables": "results/tables",
    "figures": "results/figures", "scorecards": "results/scorecards", "evidence": "results/evidence",
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
    # everything a table, figure, scorecard, the evidence page or the report is made of, nothing heavy or of the datasets'
    assert set(module.DEFAULT_PULL) == {"manifests", "splits", "runs", "downstream", "embeddings", "tables", "figures",
                                        "scorecards", "evidence"}
    assert set(module.DEFAULT_PULL) <= set(STAGE_OUTS)


def dvc_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dvc_results", REPO / "scripts/dvc-results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demo_is_refused_with_the_overlay_that_lets_it_through():
    module = dvc_results()
    known = module.stage_outputs(REPO)
    with pytest.raises(module.Failure, match=r"keeps its results in results/demo/ .* --configfile config/demo.yaml "
                                             r"config/dvc-overlay.yaml"):
        module.check_results_dir(REPO, ["--configfile", "config/demo.yaml"], known)
    module.check_results_dir(REPO, ["all", "--configfile", "config/demo.yaml", module.OVERLAY], known)
    with pytest.raises(module.Failure, match=r"--configfile read 'all' as a config file"):      # the target swallowed
        module.check_results_dir(REPO, ["--configfile", "config/demo.yaml", module.OVERLAY, "all"], known)


def job_counts(output: str) -> dict[str, int]:
    """The "Job stats" table of a Snakemake run -> {rule: count}."""
    table = output[output.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)
            if m.group(1) != "total"}


SHARING = "tests/data/infra/sharing.yaml"      # the tiny grid + a downstream result, an embedding and the evidence page
OWN_FOLDER = "tests/data/infra/own-folder.yaml"   # ... in a results folder of its own, as the demo's
OVERLAY = "config/dvc-overlay.yaml"            # results_dir: results (README: the round trip with the demo)
HEAVY = {"download", "prepare", "split", "image_cache", "features", "weights", "train", "downstream", "embed"}


@pytest.mark.slow
def test_push_fresh_clone_pull_then_every_output_and_the_report_rebuild_without_training(tmp_path, forkserver):
    """Issue 34: everything a table, figure, scorecard, the evidence page or the report is made of comes back with a
    pull (downstream results and embeddings included), so deleting every table, figure and scorecard of a fresh clone
    and asking for them again runs report jobs only: no training, downstream, download, prepare or feature job, and
    `snakemake --report` builds. A plain `dvc pull checkpoints` afterwards reruns nothing either."""
    origin = copy_repo(tmp_path / "origin")
    env = {**tool_env(origin, tmp_path / "home"), "FEDREPRO_FORKSERVER": str(forkserver)}   # jobs start in < 1 s
    run(["git", "init", "-q", "-b", "main"], origin, env)
    run(["git", "add", "-A"], origin, env)
    run(["git", "commit", "-q", "-m", "checkout"], origin, env)
    # the grid in a folder of its own, as the demo's, brought to dvc.yaml's results/ by the overlay README shows for the
    # demo: without the overlay a push is refused, naming it
    refused = run(["python", "scripts/dvc-results.py", "push", "--", "--configfile", TINY_CONFIG, SHARING, OWN_FOLDER],
                  origin, env, check=False)
    assert refused.returncode == 1 and "keeps its results in results/tiny/" in refused.stderr
    assert f"--configfile {TINY_CONFIG} {SHARING} {OWN_FOLDER} {OVERLAY}" in refused.stderr
    configs = ["--configfile", TINY_CONFIG, SHARING, OWN_FOLDER, OVERLAY]
    push = ["python", "scripts/dvc-results.py", "push", "--", *configs]

    refused = run(push, origin, env, check=False)
    assert refused.returncode == 1 and "job(s) to run" in refused.stderr   # nothing built yet: no push

    built = run(["snakemake", "all", "--cores", "2", *configs], origin, env, timeout=1800)
    assert {"downstream", "embed", "evidence"} <= set(job_counts(built.stdout + built.stderr))
    run(push, origin, env)
    remote = tmp_path / "home/.cache/fedrepro/dvc-store"   # the default remote, `~` = this test's HOME
    assert any(remote.rglob("*")), "nothing was uploaded to the default remote"
    assert "dvc.lock" in run(["git", "show", "--name-only", "HEAD"], origin, env).stdout

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(origin), str(clone)], tmp_path, env)
    env = {**tool_env(clone, tmp_path / "home"), "FEDREPRO_FORKSERVER": str(forkserver)}
    assert not (clone / "results/runs").exists()
    run(["python", "scripts/dvc-results.py", "pull", "--", *configs], clone, env)
    for stage in ("splits", "runs", "downstream", "embeddings", "tables", "figures", "scorecards", "evidence"):
        assert (clone / STAGE_OUTS[stage]).is_dir(), stage
    for stage in ("raw", "manifests", "images", "features", "checkpoints"):   # the datasets' own data is not pushed; heavy ones stay remote
        assert not (clone / STAGE_OUTS[stage]).exists(), stage
    assert (clone / TINY_TABLE).read_text() == (origin / TINY_TABLE).read_text()

    dry = run(["snakemake", "all", "-n", *configs], clone, env)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]

    metrics_mtime = (clone / TINY_METRICS).stat().st_mtime_ns
    made = {p.relative_to(clone / "results") for kind in ("tables", "figures", "scorecards")
            for p in (clone / "results" / kind).rglob("*") if p.is_file()}
    for path in made:
        (clone / "results" / path).unlink()
    rebuilt = run(["snakemake", "all", "--cores", "2", *configs], clone, env)
    jobs = job_counts(rebuilt.stdout + rebuilt.stderr)
    assert not HEAVY & set(jobs), jobs
    assert jobs == {"table": 2, "figure": 2, "scorecard": 3, "all": 1}, jobs
    assert made == {p.relative_to(clone / "results") for kind in ("tables", "figures", "scorecards")
                    for p in (clone / "results" / kind).rglob("*") if p.is_file()}
    for table in (TINY_TABLE, "results/tables/clean/pretraining/probe.md"):     # the downstream result's table too
        assert (clone / table).read_text() == (origin / table).read_text()
    assert (clone / TINY_METRICS).stat().st_mtime_ns == metrics_mtime

    report = run(["snakemake", "--report", "results/report.html", *configs], clone, env)
    assert (clone / "results/report.html").stat().st_size > 10_000, report.stderr[-3000:]

    run(["dvc", "pull", "--quiet", "checkpoints"], clone, env)       # plain DVC: every model.pt newer than what was made from it
    assert (clone / "results/checkpoints").is_dir()
    dry = run(["snakemake", "all", "-n", *configs], clone, env)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
