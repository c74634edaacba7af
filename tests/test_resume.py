"""A training job killed with SIGKILL and started again resumes from its last checkpointed round and
ends with exactly the numbers of an uninterrupted run (CPU, deterministic mode on).

The job is the real `fedrepro train` command of the Snakemake rule, on the tiny grid's real inputs
(17 brain MRIs encoded by a random-init CLIP), run in a subprocess and killed for real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from infra_support import REPO, build_tiny_inputs, with_rounds

ROUNDS = 40          # ~70 ms each here: long enough to be killed in the middle
KILL_AFTER = 4       # kill once resume.pt says this many rounds are done


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("resume")
    return workdir, with_rounds(build_tiny_inputs(workdir), ROUNDS)


def train_cmd(run_cfg: dict, tag: str) -> list[str]:
    # a checkpoint after every round (the command's default is one a minute): the kill lands between any two rounds
    return [sys.executable, "-m", "fedrepro.cli", "train", "--run", json.dumps(run_cfg),
            "--out", f"{tag}/out", "--checkpoint-dir", f"{tag}/ckpt", "--checkpoint-every", "0"]


def train_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}


def with_train(run_cfg: dict, **train) -> dict:
    """The same run with train-block entries replaced (and the config hash that goes with it)."""
    from fedrepro.io import hash_obj

    out = {**run_cfg, "train": {**run_cfg["train"], **train}}
    out.pop("config_hash")
    out["config_hash"] = hash_obj(out)
    return out


def rounds_done(resume: Path) -> int:
    try:
        return torch.load(resume, map_location="cpu", weights_only=False)["next_round"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


def eval_history(path: Path) -> pd.DataFrame:
    history = pd.read_csv(path)
    return history.drop(columns=[c for c in ("train_s", "eval_s") if c in history])  # wall times differ


@pytest.mark.parametrize("client_state", ["auto", "disk"])
def test_killed_run_resumes_and_matches_uninterrupted(tiny_run, client_state):
    """``disk``: every client's Adam state lives in its own file between turns (resume.pt names them);
    the kill lands anywhere, also between a client's file write and the round's checkpoint."""
    from fedrepro.train import train_run

    workdir, run_cfg = tiny_run
    if client_state == "disk":
        run_cfg = with_train(run_cfg, client_state="disk", optimizer={**run_cfg["train"]["optimizer"], "persist": True})
    tag = f"{client_state}-"
    env = train_env()
    with pytest.MonkeyPatch.context() as mp:   # the uninterrupted reference, in this process
        mp.chdir(workdir)
        train_run(run_cfg, f"{tag}full/out", f"{tag}full/ckpt")

    proc = subprocess.Popen(train_cmd(run_cfg, f"{tag}killed"), cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    resume = workdir / f"{tag}killed/ckpt/resume.pt"
    deadline = time.time() + 120
    while rounds_done(resume) < KILL_AFTER:
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = rounds_done(resume)
    assert KILL_AFTER <= killed_at < ROUNDS, f"killed after round {killed_at} of {ROUNDS}"
    assert not (workdir / f"{tag}killed/out/metrics.json").exists(), "a killed run must not look complete"
    assert not (workdir / f"{tag}killed/ckpt/model.pt").exists()

    subprocess.run(train_cmd(run_cfg, f"{tag}killed"), cwd=workdir, env=env, check=True, capture_output=True)

    full = json.loads((workdir / f"{tag}full/out/metrics.json").read_text())
    resumed = json.loads((workdir / f"{tag}killed/out/metrics.json").read_text())
    manifest = json.loads((workdir / f"{tag}killed/out/run_manifest.json").read_text())
    assert manifest["resumed_from_round"] == killed_at
    assert json.loads((workdir / f"{tag}full/out/run_manifest.json").read_text())["resumed_from_round"] is None
    assert resumed["rounds"] == full["rounds"] == ROUNDS
    for key in ("eval", "by_rule", "selection", "comm"):
        assert resumed[key] == full[key], key
    pd.testing.assert_frame_equal(eval_history(workdir / f"{tag}killed/out/history.csv"),
                                  eval_history(workdir / f"{tag}full/out/history.csv"))
    with np.load(workdir / f"{tag}full/out/predictions.npz") as a, np.load(workdir / f"{tag}killed/out/predictions.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    model_a = torch.load(workdir / f"{tag}full/ckpt/model.pt", weights_only=False)["model"]["server"]
    model_b = torch.load(workdir / f"{tag}killed/ckpt/model.pt", weights_only=False)["model"]["server"]
    assert model_a.keys() == model_b.keys()
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)
    assert not resume.exists(), "resume.pt is removed once the run is complete"
    assert not (workdir / f"{tag}killed/ckpt/clients").exists(), "so are the per-client state files"
    if client_state == "disk":
        assert manifest["execution"]["client_state"]["stores"]["optimizer"]["on_disk"] == 2      # both clients


def test_checkpoint_of_another_configuration_is_not_resumed(tiny_run):
    from fedrepro.train import train_run

    workdir, run_cfg = tiny_run
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        other = with_rounds(run_cfg, 3)
        ckpt = Path("other/ckpt")
        ckpt.mkdir(parents=True)
        # a leftover resume.pt from a run with 2 rounds: different config hash, must be ignored
        stale = with_rounds(run_cfg, 2)
        torch.save({"config_hash": stale["config_hash"], "next_round": 2, "history": [], "method": {},
                    "comm": {}, "tracker": {}}, ckpt / "resume.pt")
        summary = train_run(other, "other/out", ckpt)
    manifest = json.loads((workdir / "other/out/run_manifest.json").read_text())
    assert manifest["resumed_from_round"] is None
    assert summary["rounds"] == 3


def test_determinism_switch_is_applied_and_recorded(tiny_run):
    from fedrepro.seeding import configure_determinism
    from fedrepro.train import train_run

    workdir, run_cfg = tiny_run
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(workdir)
            mp.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
            train_run(with_rounds(run_cfg, 1), "det/out", "det/ckpt")
            assert torch.are_deterministic_algorithms_enabled()
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"   # set before any CUDA work
            assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
            recorded = json.loads(Path("det/out/run_manifest.json").read_text())["determinism"]
            assert recorded["deterministic"] is True
            assert recorded["cudnn.deterministic"] is True and recorded["cudnn.benchmark"] is False
            assert recorded["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"

            off = configure_determinism(False)
            assert not torch.are_deterministic_algorithms_enabled()
            assert off["deterministic"] is False and off["cudnn.benchmark"] is True
    finally:
        configure_determinism(previous)
