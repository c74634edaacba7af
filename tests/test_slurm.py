"""The SLURM profile: what it asks for, and a real run through a real (one-node) SLURM.

The slow test installs Debian's munge/slurmctld/slurmd/slurm-client when they are missing (root and
apt needed; it is skipped otherwise), starts the daemons with scripts/slurm-local.sh, runs the tiny
grid with `snakemake --profile slurm --profile workflow/profiles/ci-slurm all`, checks that the jobs
went through sbatch (Snakemake's submission lines, SLURM's job-completion log, the SLURM job id
recorded in the run manifest) and that the table and figure came out, and stops the daemons.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
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

PROFILE = REPO / "workflow/profiles/slurm/config.yaml"
FIXTURE = REPO / "tests/data/throughput/fixture-gpu.csv"    # a hand-written throughput table, not a measurement
CI_PROFILE = REPO / "workflow/profiles/ci-slurm/config.yaml"
SLURM_PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
JOBCOMP_LOG = Path("/var/log/slurm/jobcomp.log")
# what the CI layer may change: where jobs go and what the small GPU-less node can give them
CLUSTER_KEYS = {"slurm_account", "slurm_partition", "qos", "gpu", "gpu_model", "mem_mb", "runtime"}
POLLING_KEYS = {"slurm-status-command", "slurm-init-seconds-before-status-checks", "slurm-keep-successful-logs"}
NODE_SIZE_KEYS = {"max-threads"}   # the test node is small


def test_bare_profile_name_resolves_from_the_repository_root():
    link = REPO / "slurm"
    assert link.is_symlink() and not Path(os.readlink(link)).is_absolute()
    assert link.resolve() == (REPO / "workflow/profiles/slurm").resolve()
    assert (link / "config.yaml").is_file()


def test_cluster_specific_keys_live_only_in_the_profile():
    rules = "\n".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk")) + (REPO / "Snakefile").read_text()
    for key in ("slurm_account", "slurm_partition", "gpu_model", "qos", "constraint", "slurm_extra"):
        assert not re.search(rf"\b{key}\s*=", rules), f"{key} belongs in workflow/profiles, not in the rules"
    profile = yaml.safe_load(PROFILE.read_text())
    assert profile["executor"] == "slurm"
    assert profile["retries"] >= 1
    assert {"train_features", "splits"} <= set(profile["group-components"])
    partitions = yaml.safe_load((PROFILE.parent / profile["slurm-partition-config"]).read_text())["partitions"]
    assert any(p.get("max_gpu", 0) > 0 for p in partitions.values())
    assert any(p.get("max_gpu", 0) == 0 for p in partitions.values())


def test_ci_layer_changes_only_account_partition_gpus_node_size_and_polling():
    base, ci = yaml.safe_load(PROFILE.read_text()), yaml.safe_load(CI_PROFILE.read_text())
    assert set(ci) <= {"default-resources", "set-resources"} | POLLING_KEYS | NODE_SIZE_KEYS
    assert ci["slurm-status-command"] == "squeue"          # no slurmdbd on the test cluster
    assert set(ci["default-resources"]) <= CLUSTER_KEYS
    assert set(ci["set-resources"]) == set(base["set-resources"])
    for rule, resources in base["set-resources"].items():
        kept = {k: v for k, v in resources.items() if k not in CLUSTER_KEYS}
        assert {k: v for k, v in ci["set-resources"][rule].items() if k not in CLUSTER_KEYS} == kept, rule
        assert ci["set-resources"][rule].get("gpu") == 0 and "gpu_model" not in ci["set-resources"][rule]


def dry_run_resources(repo: Path, env: dict, *flags: str) -> dict[str, dict[str, str]]:
    """{rule: resources of its (first) job} as `snakemake -n` prints them under the given flags."""
    out = run(["snakemake", "all", "-n", *flags, "--configfile", TINY_CONFIG], repo, env).stdout
    found = {}
    for match in re.finditer(r"^\s*(?:local)?rule (\w+):\n(?:\s+\w+:.*\n)*?\s+resources: (.*)$", out, flags=re.MULTILINE):
        found.setdefault(match.group(1), dict(item.split("=", 1) for item in match.group(2).split(", ")))
    return found


def test_gpu_rules_ask_for_gpus_and_retries_get_more_time_and_memory(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    env = tool_env(repo, tmp_path / "home")
    first = dry_run_resources(repo, env, "--profile", "slurm")
    assert first["features"]["gpu"] == "1" and first["features"]["gpu_model"] == "a100"
    assert first["train"]["gpu"] == "0"                   # the tiny grid's run is on cached features
    second = dry_run_resources(repo, env, "--profile", "slurm", "--attempt", "2")
    for rule in ("prepare", "split", "features", "train"):
        assert int(second[rule]["mem_mb"]) == 2 * int(first[rule]["mem_mb"]), rule
        assert int(second[rule]["runtime"]) == 2 * int(first[rule]["runtime"]), rule
    ci = dry_run_resources(repo, env, "--profile", "slurm", "--profile", "workflow/profiles/ci-slurm")
    assert ci["features"]["gpu"] == "0" and "gpu_model" not in ci["features"]
    assert ci["features"]["slurm_partition"] == "debug"


def dry_run_jobs(repo: Path, env: dict, target: str, *flags: str) -> tuple[list[dict], str]:
    """([{rule, wildcards, resources}] of every job `snakemake -n <target>` plans, its stderr) for FACMIC with seed 0."""
    proc = run(["snakemake", target, "-n", *flags, "--configfile", "config/config.yaml", "seed0.yaml"], repo, env)
    jobs = []
    for block in re.split(r"\n(?=\s*(?:local)?rule \w+:)", proc.stdout):
        rule = re.match(r"\s*(?:local)?rule (\w+):", block)
        resources = re.search(r"^\s+resources: (.*)$", block, re.M)
        if rule and resources:
            wildcards = re.search(r"^\s+wildcards: (.*)$", block, re.M)
            jobs.append({"rule": rule[1], "resources": dict(i.split("=", 1) for i in resources[1].split(", ")),
                         "wildcards": dict(i.split("=", 1) for i in wildcards[1].split(", ")) if wildcards else {}})
    return jobs, proc.stderr


def test_runtime_and_gpu_memory_follow_the_profiles_gpu_table(tmp_path, monkeypatch):
    """Without a throughput table of the profile's GPU the rules ask for the unmeasured guesses; with one
    (tests/data/throughput/fixture-gpu.csv, hand-written) each train job asks for what fedrepro.cost derives
    from its rates, and a retry for twice the time."""
    from fedrepro.config import load_project
    from fedrepro.cost import runtime as cost
    from fedrepro.cost import throughput
    from fedrepro.cost.memory import planned

    repo = copy_repo(tmp_path / "repo", profiles=True)
    env = tool_env(repo, tmp_path / "home")
    (repo / "seed0.yaml").write_text("seeds: [0]\n")
    target = "results/tables/clean/facmic/table5.md"
    guessed, notes = dry_run_jobs(repo, env, target, "--profile", "slurm")
    assert "no throughput table of GPU 'a100' in benchmarks/gpu/" in notes and "unmeasured guesses" in notes
    runtime = {(j["rule"], j["resources"].get("gpu")): j["resources"]["runtime"] for j in guessed}
    assert runtime[("train", "1")] == "720" and runtime[("train", "0")] == "15"
    assert runtime[("features", "1")] == "120" and runtime[("image_cache", None)] == "240"

    (repo / "benchmarks/gpu").mkdir(exist_ok=True)
    (repo / "benchmarks/gpu/fixture-gpu.csv").write_bytes(FIXTURE.read_bytes())
    profile = repo / "workflow/profiles/slurm/config.yaml"
    profile.write_text(profile.read_text().replace('gpu_model: "a100"', 'gpu_model: "fixture"'))   # EDIT 3
    measured, notes = dry_run_jobs(repo, env, target, "--profile", "slurm")
    assert "SLURM requests: GPU 'fixture': Fixture GPU (hand-written for the tests, not measured)" in notes
    retried, _ = dry_run_jobs(repo, env, target, "--profile", "slurm", "--attempt", "2")

    monkeypatch.chdir(repo)       # what the rules read (split files, dataset sizes) is relative to the root
    project = load_project([repo / "config/config.yaml", repo / "seed0.yaml"], root=repo)
    table = throughput.read(repo / "benchmarks/gpu/fixture-gpu.csv")
    images = [j for j in measured if j["rule"] == "train" and j["resources"]["gpu"] == "1"]
    assert images
    for job in images:
        w = job["wildcards"]
        key = project.resolver.run_key(w["paper"], w["setting"], w["method"], int(w["seed"]), w["protocol"])
        request = cost.train_request(project, key, planned(project, key, workers=project.config["image_run_threads"] - 1),
                                     table)
        assert request.measured and int(job["resources"]["runtime"]) == request.runtime != 720, w
        assert int(job["resources"]["gpu_mem_mb"]) == request.gpu_mem_mb, w
        again = next(r for r in retried if r["wildcards"] == w and r["rule"] == "train")
        assert int(again["resources"]["runtime"]) == 2 * request.runtime
    features = [j for j in measured if j["rule"] == "features"]
    assert features and all(j["resources"]["runtime"] != "120" and int(j["resources"]["gpu_mem_mb"]) > 0
                            for j in features)
    assert all(j["resources"]["runtime"] != "240" for j in measured if j["rule"] == "image_cache")
    assert all(j["resources"]["runtime"] == "15" for j in measured if j["rule"] == "train" and j["resources"]["gpu"] == "0")


# --------------------------------------------------------------------------------------------
# a real SLURM

def slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to install and start SLURM daemons"
    installed = all(subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
                    .stdout.startswith("install ok") for p in SLURM_PACKAGES) if shutil.which("dpkg-query") else False
    if not installed and not shutil.which("apt-get"):
        return f"SLURM packages {SLURM_PACKAGES} are missing and apt-get is not available"
    return None


@pytest.fixture(scope="module")
def local_slurm():
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    script = REPO / "scripts/slurm-local.sh"
    already_up = Path("/run/slurmctld.pid").exists() and subprocess.run(
        [script, "status"], capture_output=True, text=True).stdout.count("up ") == 3
    started = subprocess.run(["timeout", "-k", "10", "300", script, "start"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"could not start SLURM:\n{started.stdout}\n{started.stderr}")
    yield
    if not already_up:   # leave a cluster someone else started running
        subprocess.run([script, "stop"], capture_output=True, text=True, check=True)
        assert not Path("/etc/slurm/slurm.conf").exists()   # else every snakemake start waits ~10 s


@pytest.mark.slow
@pytest.mark.slurm
def test_tiny_grid_runs_through_slurm(local_slurm, tmp_path):
    repo = copy_repo(tmp_path / "repo")
    env = tool_env(repo, tmp_path / "home")
    result = run(["snakemake", "all", "--profile", "slurm", "--profile", "workflow/profiles/ci-slurm",
                  "--configfile", TINY_CONFIG], repo, env, timeout=900)
    output = result.stdout + result.stderr

    assert (repo / TINY_TABLE).is_file() and (repo / "results/figures/clean/foundation/curves.png").is_file()
    assert "BT (17 MRIs)" in (repo / TINY_TABLE).read_text()

    submitted = {}   # SLURM job id -> what Snakemake submitted (rule_<name> or group_<group>_<rules>)
    for job_id, log in re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+?)\)", output):
        submitted[job_id] = Path(log).relative_to(repo / "logs/slurm").parts[0]
        assert Path(log).is_file(), log
    assert sorted(submitted.values()) == sorted(["rule_prepare", "group_splits_split", "rule_features",
                                                 "group_train_features_train"]), output[-3000:]
    for local in ("download", "table", "figure"):   # local rules never reach sbatch
        assert not any(local in kind for kind in submitted.values())

    records = {}
    for line in JOBCOMP_LOG.read_text().splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        records[fields.get("JobId")] = fields
    for job_id, kind in submitted.items():
        record = records.get(job_id)
        assert record is not None, f"SLURM has no record of job {job_id} ({kind})"
        assert record["JobState"] == "COMPLETED" and record["Partition"] == "debug", record
        assert Path(record["WorkDir"]).resolve() == repo.resolve()

    manifest = json.loads((repo / TINY_METRICS).with_name("run_manifest.json").read_text())
    train_job = next(j for j, kind in submitted.items() if kind == "group_train_features_train")
    assert manifest["env"]["SLURM_JOB_ID"] == train_job   # the training ran inside that SLURM job
