"""Helpers of the infrastructure tests (SLURM, DVC, resume, faults): a scratch copy of the repository,
an isolated environment for the tools, and the smallest real grid (tests/data/infra).

Nothing here talks to the network: the tiny grid uses 17 brain MRIs shipped in a Python package and a
random-init 64-px CLIP.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = "tests/data/infra/config.yaml"          # relative to a repository root
TINY_RUN = ("foundation", "bt_iid", "fedclip", 0)      # its only run
TINY_TABLE = "results/tables/clean/foundation/accuracy.md"
TINY_METRICS = "results/runs/clean/foundation/bt_iid/fedclip/seed0/metrics.json"


def copy_repo(dest: Path, profiles: bool = False) -> Path:
    """The repository as git sees it (tracked and untracked, not ignored files; symlinks kept), so no
    outputs of earlier runs come along. ``profiles``: with the full grid's model profiles (:func:`warm_profiles`),
    for tests that plan the full grid and are not about building them."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listing):
        src = REPO / rel
        if src.is_symlink() or src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    # the package's bytecode too (valid: copy2 keeps the sources' times): every process of the copy would compile it
    # again where PYTHONDONTWRITEBYTECODE is set (CI)
    for pyc in (REPO / "src").rglob("__pycache__/*.pyc"):
        if (dest / pyc.relative_to(REPO)).parent.parent.is_dir():
            (dest / pyc.relative_to(REPO)).parent.mkdir(exist_ok=True)
            shutil.copy2(pyc, dest / pyc.relative_to(REPO))
    if profiles:
        shutil.copytree(warm_profiles(), dest / "resources/model_profiles", dirs_exist_ok=True)
    return dest


@functools.lru_cache(maxsize=None)
def warm_profiles() -> Path:
    """The model profiles of every run of the full grid under both protocols (resources/model_profiles: what its
    memory estimates and SLURM requests are made from; ~40 s to build from nothing on 2 cores, then read back),
    built once per test session in this checkout. A scratch copy that plans the full grid starts from them instead
    of building them again in every dry run; the building itself is tested in tests/test_memory.py."""
    from fedrepro.config import load_project
    from fedrepro.cost.memory import model_profile

    with contextlib.chdir(REPO):                                   # profiles are written relative to the checkout
        for protocols in (["clean"], ["paper"]):
            project = load_project([REPO / "config/config.yaml"], {"protocols": protocols}, root=REPO)
            for key in project.plan.runs():
                model_profile(project.resolver.run_config(key))
        load_project([REPO / "config/config.yaml"], root=REPO)    # the default results folder, as other tests expect
    return REPO / "resources/model_profiles"


def tool_env(repo: Path, home: Path) -> dict[str, str]:
    """Environment for snakemake/dvc/git subprocesses: this checkout's package first on the path, the
    venv's tools on PATH, a private HOME (so `~` in the DVC remote and git's config point into the
    test's temporary directory) but matplotlib's existing font cache, a git identity, no DVC analytics."""
    home.mkdir(parents=True, exist_ok=True)
    import matplotlib

    env = dict(os.environ)
    env.update({
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo / "src"), env.get("PYTHONPATH")])),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        "HOME": str(home),
        "MPLCONFIGDIR": matplotlib.get_cachedir(),   # the real font cache: no rebuild in every job
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "fedrepro tests", "GIT_AUTHOR_EMAIL": "tests@fedrepro.invalid",
        "GIT_COMMITTER_NAME": "fedrepro tests", "GIT_COMMITTER_EMAIL": "tests@fedrepro.invalid",
    })
    return env


def run(cmd: list[str], cwd: Path, env: dict, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; long-running ones get `timeout -k` (a plain SIGTERM does not stop a Snakemake
    that is waiting for cluster jobs)."""
    full = ["timeout", "-k", "10", str(timeout), *cmd]
    proc = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed (exit {proc.returncode})\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def build_tiny_inputs(workdir: Path) -> dict:
    """Download (offline), prepare, split and encode the tiny grid's data in ``workdir`` with the
    `fedrepro` commands the rules call, in-process; -> the run config of its only run (its paths are
    relative to ``workdir``, as a pipeline job's are to the repository root)."""
    from fedrepro.cli import main
    from fedrepro.config import load_project

    project = load_project([REPO / "config/config.yaml", REPO / TINY_CONFIG], root=REPO)
    run_cfg = project.resolver.run_config(project.resolver.run_key(*TINY_RUN))
    paths, dataset = run_cfg["paths"], run_cfg["dataset"]
    split = project.plan.splits()[run_cfg["split_id"]]
    with contextlib.chdir(workdir):
        main(["download", dataset, "--raw-dir", paths["raw_dir"]])
        main(["prepare", dataset, "--raw-dir", paths["raw_dir"], "--out", paths["manifest"]])
        main(["split", "--dataset", dataset, "--manifest", paths["manifest"], "--spec", json.dumps(split["spec"]),
              "--seed", str(split["seed"]), "--out", paths["split"]])
        main(["features", "--dataset", dataset, "--manifest", paths["manifest"], "--raw-dir", paths["raw_dir"],
              "--encoder", json.dumps(run_cfg["features"]["encoder"]), "--device", "cpu", "--out", paths["features"]])
    return run_cfg


def with_rounds(run_cfg: dict, rounds: int) -> dict:
    """The same run with another number of rounds (and the config hash that goes with it)."""
    from fedrepro.io import hash_obj

    out = copy.deepcopy(run_cfg)
    out["train"]["rounds"] = rounds
    out.pop("config_hash")
    out["config_hash"] = hash_obj(out)
    return out
