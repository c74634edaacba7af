"""The memory estimate (fedrepro.cost.memory): its parts follow the config, it bounds the peak RSS that
small runs really reach, and a run whose estimate exceeds what its job has is refused before it starts."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fedrepro.cost.memory import (
    GiB,
    InsufficientMemory,
    MiB,
    check_fits,
    client_count,
    estimate,
    host_limit,
    model_profile,
)

pytestmark = pytest.mark.usefixtures("one_thread")

RESNET = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, "tests")
    torch.set_num_threads(1)
    from parity.harness import image_federation, drive
    fed = image_federation(size=64, classes=4, sizes=(24, 24, 24), val=4, test=4, global_test=8)
    drive(json.loads(sys.argv[1]), fed, sys.argv[2])
    from fedrepro.train import peak_rss
    print(json.dumps({"peak": peak_rss()}))   # VmHWM: ru_maxrss would report the (larger) pytest parent's peak
""")

SETTINGS = {
    # every client's Adam state and local model in memory: per-client state dominates
    "memory": {"rounds": 1, "batch_size": 8, "client_state": "memory", "client_eval": "local",
               "optimizer": {"name": "adam", "lr": 1e-3, "persist": True}},
    # the same, kept on disk between turns
    "disk": {"rounds": 1, "batch_size": 8, "client_state": "disk", "client_eval": "local",
             "optimizer": {"name": "adam", "lr": 1e-3, "persist": True}},
}


def resnet_run(train: dict) -> dict:
    """A FedIIC-grid FedAvg run on a ResNet-18 (11.7 M parameters) at 64 px."""
    from parity.harness import configured_model, paper_run

    model = configured_model("fediic", "fedavg", "isic", backbone="resnet18", image_size=64,
                             projector={"hidden": 32, "out": 16})
    run = paper_run("fediic", "fedavg", "isic", train=train, model=model)
    run["train"].update(train)
    return run


def peak_rss(run: dict, tmp_path) -> int:
    """Peak RSS of a process that imports the project and drives ``run`` for its rounds (three clients)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", RESNET, json.dumps(run), str(tmp_path / "resume.pt")],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


@pytest.mark.parametrize("mode", sorted(SETTINGS))
def test_estimate_bounds_the_measured_peak_rss(mode, tmp_path):
    """A ResNet-18 (11.7 M parameters) FedAvg round of three clients on the CPU, in a process of its
    own: the estimate is an upper bound of its peak RSS and within 3x of it (the right order)."""
    run = resnet_run(SETTINGS[mode])
    est = estimate(run, clients=3, device="cpu", workers=0, profile=model_profile(run, cache=False))
    peak = peak_rss(run, tmp_path)
    assert peak <= est.host_bytes <= 3 * peak, (mode, peak / MiB, est.lines())


def test_parts_follow_the_config(tmp_path):
    run = resnet_run(SETTINGS["memory"])
    profile = model_profile(run, cache=False)
    model = profile["model_bytes"]
    assert 11e6 * 4 < model < 12e6 * 4                              # ResNet-18's fp32 weights (+ head, projector)
    assert profile["activation"]["measured"] and profile["activation"]["per_sample"] > 0
    assert profile["layout"]["per_client"]["optimizer"] == 2 * profile["trainable_bytes"]     # Adam's two moments
    assert profile["layout"]["per_client"]["local_models"] == model
    memory = estimate(run, clients=10, device="cpu", workers=0, profile=profile)
    disk = estimate({**run, "train": {**run["train"], "client_state": "disk"}}, 10, "cpu", 0, profile=profile)
    states = [k for k in memory.host if k.startswith("per-client state")][0]
    per_client = 2 * profile["trainable_bytes"] + model               # Adam's two moments + a local model
    assert memory.host[states] == 10 * per_client
    assert sum(v for k, v in disk.host.items() if k.startswith("per-client state")) == per_client   # one at a time
    run = {**run, "train": {**run["train"], "eval_batch_size": 8}}     # training activations decide
    gpu = estimate(run, clients=10, device="cuda", workers=0, profile=profile)
    assert gpu.gpu["optimizer state of the training client"] == 2 * profile["trainable_bytes"]
    assert gpu.gpu["round uploads (participants x shared tensors)"] == 10 * profile["shared_bytes"]
    bigger = estimate({**run, "train": {**run["train"], "batch_size": 64}}, 10, "cuda", 0, profile=profile)
    assert 7 * gpu.gpu["activations"] < bigger.gpu["activations"] <= 8 * gpu.gpu["activations"]   # 8x the batch
    half = estimate({**run, "train": {**run["train"], "precision": "bf16"}}, 10, "cuda", 0, profile=profile)
    assert half.gpu["activations"] < gpu.gpu["activations"]
    assert client_count({"kind": "by_source", "sources": ["a", "b", "c"], "per_source": {"kind": "iid", "clients": 5}}) == 15
    assert client_count({"kind": "sites", "clients": 4}) == 4


def test_the_grids_largest_models_are_counted_on_the_meta_device():
    """CLIP ViT-B/16 full fine-tuning of FACMIC, built on the meta device (nothing allocated)."""
    from fedrepro.config import load_project

    project = load_project(["config/config.yaml"])
    run = project.resolver.run_config(project.resolver.run_key("facmic", "bt_iid", "moon", 0))
    profile = model_profile(run, cache=False)
    assert 149e6 < profile["params"] < 150e6 and profile["trainable_params"] == profile["params"]
    assert profile["frozen"]["host"] == profile["model_bytes"]     # the pristine CLIP kept on the host
    # server, working copy, MOON's global and previous models (clean protocol: previous = last_local)
    assert profile["layout"]["device_models"] == 4
    assert profile["layout"]["per_client"]["previous"] == profile["model_bytes"]


def test_a_run_that_cannot_fit_is_refused_with_its_parts(tmp_path):
    run = resnet_run(SETTINGS["memory"])
    est = estimate(run, clients=50, device="cpu", workers=0)
    with pytest.raises(InsufficientMemory) as refused:
        check_fits(est, host=(2 * GiB, "SLURM_MEM_PER_NODE"))
    message = str(refused.value)
    assert est.run in message and "SLURM_MEM_PER_NODE" in message
    assert "per-client state" in message and "train.client_state: disk" in message
    assert f"mem_mb={est.host_mb()}" in message
    check_fits(est, host=(est.host_bytes + GiB, "enough"))        # fits: nothing raised
    gpu = estimate(run, clients=3, device="cuda", workers=0)
    with pytest.raises(InsufficientMemory, match="GPU memory"):
        check_fits(gpu, host=(64 * GiB, "big host"), gpu=256 * MiB)


def test_the_training_job_refuses_before_it_starts(tmp_path, monkeypatch, caplog):
    """SLURM gave the job 200 MB: fedrepro train stops before loading data or writing a checkpoint."""
    from fedrepro.train import train_run
    from infra_support import build_tiny_inputs, with_rounds

    monkeypatch.chdir(tmp_path)
    run = with_rounds(build_tiny_inputs(tmp_path), 1)
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "200")
    assert host_limit() == (200 * MiB, "SLURM_MEM_PER_NODE")
    with pytest.raises(InsufficientMemory, match=r"foundation/bt_iid/fedclip/seed0 does not fit"):
        train_run(run, "out", "ckpt")
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "out").exists()
    from fedrepro.cli import main

    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as exited:     # the job's command: no traceback
        main(["train", "--run", json.dumps(run), "--out", "out", "--checkpoint-dir", "ckpt"])
    assert exited.value.code == 1
    assert "does not fit its job" in caplog.text and "host memory: needs" in caplog.text
    assert "Traceback" not in caplog.text
    monkeypatch.setenv("FEDREPRO_MEMORY_CHECK", "warn")
    train_run(run, "out", "ckpt")
    manifest = json.loads((tmp_path / "out/run_manifest.json").read_text())
    assert manifest["execution"]["memory_estimate"]["host_bytes"] > 200 * MiB
    # the manifest records the job's peak; that the estimate bounds it is checked in a fresh process above
    # (here the job shares pytest's process, whose size depends on the tests that ran before)
    assert isinstance(manifest["execution"]["peak_rss_bytes"], int) and manifest["execution"]["peak_rss_bytes"] > 0


def test_cli_prints_the_estimate():
    out = subprocess.run([sys.executable, "-m", "fedrepro.cli", "estimate", "fediic", "isic", "moon"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "src"}, check=True).stdout
    assert "memory estimate of clean/fediic/isic/moon/seed0 (model on cuda)" in out
    assert "optimizer state of the training client" in out and "request: mem_mb=" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_limit_is_the_devices_memory():
    from fedrepro.cost.memory import gpu_limit

    assert gpu_limit() == torch.cuda.get_device_properties(0).total_memory
