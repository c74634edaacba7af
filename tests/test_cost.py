"""What a run, a table and the grid cost from a throughput table (fedrepro.cost: throughput, runtime), what each
SLURM job asks for, and the commands that print it (`fedrepro estimate <target>`, benchmarks/gpu_hours.py).

Every number here comes from tests/data/throughput/fixture-gpu.csv: a HAND-WRITTEN table of round numbers, not a
measurement (no GPU figure has been measured in this repository)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedrepro.cost import runtime as cost
from fedrepro.cost import throughput
from fedrepro.cost.throughput import COLUMNS, ThroughputError

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests/data/throughput/fixture-gpu.csv"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}


def fedrepro(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedrepro.cli", *args], cwd=cwd, env=ENV, capture_output=True, text=True)


@pytest.fixture(scope="module")
def project():
    from fedrepro.config import load_project

    # the fast numerics: "ours" computes in bf16 on a GPU (auto), which the fixture's rows below are about; under the
    # authors' numerics (the default) the same arithmetic reads their fp32 / fp16 rows
    return load_project([REPO / "config/config.yaml"], {"numerics": "fast"}, root=REPO)


@pytest.fixture(scope="module")
def table():
    return throughput.read(FIXTURE)


# ---- the table ---------------------------------------------------------------------------------------

def test_the_fixture_reads_as_a_gpu_table(table):
    assert table.gpu and "not measured" in table.device_name
    assert table.value("clip_full:ViT-B-16", "bf16", None, "train_img_s") == 400
    # channels-last where the table has it (CNNs: auto), else the plain layout
    assert table.value("adapter_protonet:resnet50.tv_in1k", "fp32", None, "train_img_s") == 500
    assert table.value("adapter_protonet:resnet50.tv_in1k", "fp32", False, "train_img_s") == 400
    assert table.value("clip_full:ViT-B-16", "fp32", None, "train_img_s") == 200
    with pytest.raises(ThroughputError, match=r"no train_img_s for encode:ViT-B-16 at fp32.*train_step.py --device cuda"):
        table.value("encode:ViT-B-16", "fp32", False, "train_img_s")       # blank: not measured


def row(**values) -> dict:
    base = {"device": "cuda", "device_name": "Test GPU", "torch": "2.0", "cuda": "12.1", "date": "2026-01-01",
            "family": "clip_full", "architecture": "ViT-B-16", "precision": "bf16", "channels_last": False,
            "batch": 32, "eval_batch": 256, "train_img_s": 100.0, "eval_img_s": 400.0, "peak_gpu_mb": 9000}
    return {**base, **values}


def test_the_table_is_written_whole_and_merged_by_row(tmp_path):
    out = tmp_path / "test-gpu.csv"
    throughput.write([row(), row(precision="fp32", train_img_s=50.0)], out)
    with open(out, newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == COLUMNS
        written = list(reader)
    assert written[0]["loader_img_s"] == "" and written[0]["peak_gpu_mb"] == "9000"   # blank = not measured
    throughput.write([row(train_img_s=120.0), row(family="vlp", architecture="deit")], out)   # bf16 measured again
    table = throughput.read(out)
    assert table.value("clip_full:ViT-B-16", "bf16", False, "train_img_s") == 120.0
    assert table.value("clip_full:ViT-B-16", "fp32", False, "train_img_s") == 50.0      # kept
    assert table.value("vlp:deit", "bf16", False, "train_img_s") == 100.0
    assert (table.device_name, table.torch, table.cuda) == ("Test GPU", "2.0", "12.1")
    with pytest.raises(ThroughputError, match="holds rows of \\['Test GPU'\\]"):
        throughput.write([row(device_name="Other GPU")], out)        # another device's table is never overwritten
    assert throughput.read(out).device_name == "Test GPU"


def test_a_broken_table_is_named_with_its_line_and_column(tmp_path):
    bad = tmp_path / "bad.csv"
    throughput.write([row(), row(precision="fp32")], bad)
    text = bad.read_text().splitlines()
    text[2] = text[2].replace(",50.0,", ",fast,").replace(",100.0,", ",fast,")
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(ThroughputError, match=r"bad.csv, line 3: train_img_s is 'fast', not a number"):
        throughput.read(bad)
    bad.write_text("family,precision\nclip_full,bf16\n")
    with pytest.raises(ThroughputError, match=r"bad.csv: not a throughput table \(no column device, device_name"):
        throughput.read(bad)


def test_a_profile_gpu_model_finds_its_table_by_words(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert throughput.for_gpu("a100")[0] is None
    assert "none has been measured" in throughput.choose()[1]
    (tmp_path / "benchmarks/gpu").mkdir(parents=True)
    throughput.write([row(device_name="NVIDIA A100-SXM4-80GB")], tmp_path / "benchmarks/gpu/nvidia-a100-sxm4-80gb.csv")
    found, why = throughput.for_gpu("a100")
    assert found.device_name == "NVIDIA A100-SXM4-80GB" and "benchmarks/gpu/nvidia-a100-sxm4-80gb.csv" in why
    assert throughput.for_gpu("A100_80GB")[0] is not None
    missing, why = throughput.for_gpu("h100")
    assert missing is None and "no throughput table of GPU 'h100'" in why and "NVIDIA A100-SXM4-80GB" in why
    assert throughput.choose()[0].device_name == "NVIDIA A100-SXM4-80GB"     # no profile here: the only table


def test_train_step_writes_exactly_the_table_format(tmp_path):
    """The benchmark's table (here on the CPU, two cheap families) is the format the estimates read."""
    out = tmp_path / "cpu.csv"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/train_step.py"), "--device", "cpu", "--families",
                           "clip_adapter:ViT-B-32", "encode:ViT-B-32", "--steps", "1", "--min-seconds", "0", "--batch", "2",
                           "--precisions", "fp32", "--loader", "on", "--loader-images", "4", "--threads", "1",
                           "--out", str(out)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = {r["family"]: r for r in reader}
    assert set(rows) == {"clip_adapter", "encode"}
    assert all(r["device"] == "cpu" and r["architecture"] == "ViT-B-32" and r["torch"] for r in rows.values())
    encode, head = rows["encode"], rows["clip_adapter"]
    assert encode["train_img_s"] == "" and float(encode["eval_img_s"]) > 0       # the frozen tower: forward only
    for column in ("loader_img_s", "decode_img_s", "cache_img_s", "host_cpus"):
        assert float(encode[column]) > 0, column                                 # its input pipeline, measured
    assert head["loader_img_s"] == "" and float(head["train_img_s"]) > 0         # cached features: no loader
    assert encode["peak_gpu_mb"] == "" == head["peak_gpu_mb"]                    # a CPU has no GPU memory
    table = throughput.read(out)
    assert not table.gpu and table.value("encode:ViT-B-32", "fp32", False, "eval_img_s") > 0


# ---- one run -----------------------------------------------------------------------------------------

def write_split(tmp_path: Path, run: dict, train: int, held_per_client: int, global_test: int, external: int) -> None:
    """A split file with known counts: three clients of ``train`` training images each."""
    clients = {f"client{i}": {"train": list(range(train)), "val": list(range(held_per_client)), "test": []}
               for i in range(3)}
    path = tmp_path / run["paths"]["split"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"clients": clients, "global_test": list(range(global_test)),
                                "external": list(range(external))}))


def test_an_image_run_costs_its_images_at_the_tables_rates(project, table, tmp_path, monkeypatch):
    """FACMIC's FedAvg on BT (CLIP ViT-B/16 fine-tuned, 3 clients, 199 local steps of 32, 100 rounds): by hand."""
    monkeypatch.chdir(tmp_path)
    key = project.resolver.run_key("facmic", "bt_iid", "fedavg", 0)
    run = project.resolver.run_config(key)
    write_split(tmp_path, run, train=800, held_per_client=100, global_test=400, external=700)
    got = cost.run_cost(project, key, table, profile={"layout": {"device_models": 2}})
    train_images = 100 * 3 * 199 * 32                 # rounds x clients x local steps x batch
    eval_images = 100 * (3 * 100 + 400 + 700)         # every round: the clients' held-out parts, global test, external
    # ours: bf16 (auto on a GPU), step 400 img/s, under the loader's 1500; eval 1600
    assert got.ours_s == pytest.approx(train_images / 400 + eval_images / 1600)
    # the authors': fp32 (200 / 800 img/s) bounded by one process decoding 100 original JPEGs a second (FACMIC's code)
    assert got.authors_s == pytest.approx(train_images / 100 + eval_images / 100)
    assert got.on_gpu and got.cache is None and got.source == "split file" and not got.missing
    moon = cost.run_cost(project, project.resolver.run_key("facmic", "bt_iid", "moon", 0), table,
                         profile={"layout": {"device_models": 4}})   # + MOON's global and previous models
    assert moon.ours_s == pytest.approx(train_images * (1 / 400 + 2 / 1600) + eval_images / 1600)


def test_a_run_on_cached_features_costs_its_head_and_one_encoder_pass(project, table, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    key = project.resolver.run_key("facmic", "bt_iid", "facmic", 0)
    run = project.resolver.run_config(key)
    write_split(tmp_path, run, train=800, held_per_client=100, global_test=400, external=700)
    manifest = tmp_path / run["paths"]["manifest"]
    manifest.parent.mkdir(parents=True)
    manifest.write_text("path,label\n" + "".join(f"img{i}.jpg,0\n" for i in range(7000)))
    got = cost.run_cost(project, key, table, profile={"layout": {"device_models": 2}}, cache_workers=7)
    train_images, eval_images = 100 * 3 * 199 * 32, 100 * (3 * 100 + 400 + 700)
    assert not got.on_gpu                                       # the train rule runs it on a CPU
    assert got.ours_s == pytest.approx(train_images / 100000 + eval_images / 200000)   # clip_fam head, bf16
    # the cache: the manifest's 7000 images, encoder 1000 img/s (fp32) vs decoding 7 x 100 img/s: decode-bound
    assert got.cache == (run["dataset"], run["features"]["key"]) and got.cache_s == pytest.approx(7000 / 700)
    # the authors': the encoder on every batch (1000 img/s) + the head, and one loading process at 100 img/s
    assert got.authors_s == pytest.approx((train_images + eval_images) / 100)


def test_what_the_table_or_the_data_lack_is_named_not_guessed(project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                                  # no split file, no dataset_sizes.csv here
    out = tmp_path / "partial.csv"
    throughput.write([row()], out)                               # clip_full:ViT-B-16 at bf16 only
    key = project.resolver.run_key("fediic", "isic", "fedavg", 0)
    got = cost.run_cost(project, key, throughput.read(out), profile={})
    assert got.ours_s is None and any("isic2019: no split file" in m for m in got.missing)
    write_split(tmp_path, project.resolver.run_config(key), train=100, held_per_client=10, global_test=10, external=0)
    got = cost.run_cost(project, key, throughput.read(out), profile={})
    assert got.ours_s is None and got.authors_s is None
    assert any("no train_img_s for proj_classifier:tf_efficientnet_b0.aa_in1k at bf16" in m for m in got.missing)


# ---- what a job asks SLURM for -------------------------------------------------------------------------

def test_the_train_request_follows_the_measured_rates_with_its_margin(project, table, tmp_path):
    from fedrepro.cost.memory import CUDA_CONTEXT, MiB, planned

    key = project.resolver.run_key("facmic", "sc_a0.3", "moon", 0)
    est = planned(project, key, workers=7)
    got = cost.train_request(project, key, est, table)
    seconds = cost.run_cost(project, key, table, profile=est.profile).ours_s
    assert got.measured and got.runtime == max(15, math.ceil((seconds * 1.5 / 60 + 10) / 5) * 5)
    # GPU memory: the family's bf16 peak (12000 MiB at its batch of 32, the run's) + MOON's other model copies and
    # the uploads (what one model's step does not hold) + the CUDA context, x 1.2; never below the estimate
    profile = est.profile
    beyond = (profile["layout"]["device_models"] - 1) * profile["model_bytes"] + profile["frozen"]["device"] \
        + 3 * profile["shared_bytes"]
    measured = (12000 * MiB + beyond + CUDA_CONTEXT) / MiB
    assert got.gpu_mem_mb == max(est.gpu_mb(), math.ceil(measured * 1.2 / 100) * 100)
    assert got.gpu_mem_mb > est.gpu_mb()                        # here the measured peak decides
    # a table measured at another batch: the peak moves by the estimate's activations per sample (bf16: x0.6,
    # x1.5 for the backward's buffers) times the difference
    smaller = tmp_path / "batch16.csv"
    throughput.write([row(batch=16, peak_gpu_mb=12000, eval_peak_gpu_mb=3600)], smaller)
    moved = cost.measured_gpu_mb(throughput.read(smaller), project.resolver.run_config(key), est)
    assert moved == pytest.approx(measured + profile["activation"]["per_sample"] * 0.6 * 1.5 * 16 / MiB)
    guess = cost.train_request(project, key, est, None)
    assert (guess.runtime, guess.gpu_mem_mb, guess.measured) == (720, est.gpu_mb(), False)
    features = project.resolver.run_key("facmic", "sc_a0.3", "facmic", 0)
    assert cost.train_request(project, features, planned(project, features), table).runtime == 15   # a CPU job


def test_cache_and_downstream_requests(project, table, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    key, task = next(iter(project.plan.downstream_jobs().values()))            # a FedDRA encoder's linear probe
    job = project.resolver.downstream_config(key, task)
    got = cost.downstream_request(table, job)                              # its images not counted here: 60 min
    assert (got.runtime, got.measured) == (60, False)
    assert got.gpu_mem_mb == math.ceil((4800 + 768) * 1.2 / 100) * 100    # vlp's bf16 evaluation peak + the context
    assert cost.features_request(None, "bt", {"name": "ViT-B-16"}, 7).runtime == 120           # no table: the guess
    assert cost.image_cache_request(None, "bt", 8).runtime == 240
    got = cost.features_request(table, "bt", {"name": "ViT-B-16"}, 7)   # 3264 images (dataset_sizes.csv: absent here)
    assert not got.measured and got.runtime == 120 and "unknown" in got.why
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks/dataset_sizes.csv").write_text("dataset,images\nbt,300000\n")
    got = cost.features_request(table, "bt", {"name": "ViT-B-16"}, 7)
    assert got.measured and got.runtime == math.ceil((300000 / 700 * 1.5 / 60 + 10) / 5) * 5
    assert got.gpu_mem_mb == math.ceil((3000 + 768) * 1.2 / 100) * 100           # eval peak + CUDA context, x 1.2
    cache = cost.image_cache_request(table, "bt", 8)                              # 200 img/s per process x 8
    assert cache.measured and cache.runtime == math.ceil((300000 / 1600 * 1.5 / 60 + 10) / 5) * 5
    (tmp_path / "benchmarks/dataset_sizes.csv").write_text(f"dataset,images\n{job['spec']['dataset']},10000000\n")
    got = cost.downstream_request(table, job)                              # one pass at vlp's 1200 img/s (bf16)
    assert got.measured and got.runtime == math.ceil((10_000_000 / 1200 * 1.5 / 60 + 10) / 5) * 5
    assert cost.downstream_request(None, job).runtime == 60


# ---- the commands --------------------------------------------------------------------------------------

def test_gpu_hours_says_plainly_when_no_gpu_table_is_here(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_hours.py"), "--papers", "fedadapterproto"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "GPU-hours cannot be given: no GPU throughput table in benchmarks/gpu/" in proc.stdout
    assert "No GPU figure has been measured in this repository yet" in proc.stdout
    assert "python benchmarks/train_step.py --device cuda" in proc.stdout
    assert "grid:" not in proc.stdout and " h " not in proc.stdout


def test_gpu_hours_per_paper_and_per_table(table):
    from fedrepro.config import load_project
    from infra_support import warm_profiles

    warm_profiles()             # the grid's model profiles, built once per session (the script reads them)
    project = load_project([REPO / "config/config.yaml"], root=REPO)       # the script's: the default numerics
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_hours.py"), "--throughput", str(FIXTURE),
                           "--papers", "fedadapterproto"], cwd=REPO, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Fixture GPU (hand-written for the tests, not measured)" in out
    keys = [k for k in project.plan.runs() if k.paper == "fedadapterproto"]
    from fedrepro.cost.memory import model_profile

    costs = {k: cost.run_cost(project, k, table, profile=model_profile(project.resolver.run_config(k))) for k in keys}
    ours = sum(c.ours_s for c in costs.values()) / 3600
    theirs = sum(c.authors_s for c in costs.values()) / 3600
    paper = re.search(r"^fedadapterproto\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", out, re.M)
    assert paper and int(paper[1]) == len(keys) and float(paper[3]) == pytest.approx(ours, abs=0.05)
    assert float(paper[4]) == pytest.approx(theirs, abs=0.05)
    for protocol, name, tbl in project.plan.tables():
        runs = project.plan.table_runs(name, tbl, protocol) if name == "fedadapterproto" else []
        if runs:
            line = re.search(rf"^{protocol}/fedadapterproto/{tbl}\s+(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)", out, re.M)
            assert line and int(line[1]) == len(runs), tbl
            assert float(line[2]) == pytest.approx(sum(costs[k].ours_s for k in runs) / 3600, abs=0.05), tbl
    assert re.search(rf"^grid: {len(keys)} runs, \d+ GPU-h ours vs \d+ the authors' way", out, re.M)


def test_estimate_of_a_table_lists_its_jobs_hours_and_memory():
    target = "results/tables/clean/fedadapterproto/aptos.md"
    proc = fedrepro("estimate", target, "--throughput", str(FIXTURE))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"target: {target}: table aptos of fedadapterproto (clean protocol)" in out
    assert re.search(r"train, image runs \(1 GPU each\)\s+3 / 3", out)
    assert "rates measured on Fixture GPU (hand-written for the tests, not measured)" in out
    assert re.search(r"ours: [\d.]+ (h|min): image runs on the GPU", out)
    assert "the authors' way (fp32, no feature cache, decoding every epoch)" in out
    assert "memory per run (estimated from the configs, not measured" in out
    assert re.search(r"1 of 1 run variants \(first seed\) from the measured rates", out)


def test_estimate_without_a_table_gives_what_it_can():
    target = "results/tables/clean/fedadapterproto/aptos.md"
    proc = fedrepro("estimate", target, "--gpu", "no-such-gpu-model")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cannot be given in GPU-hours: no throughput table of GPU 'no-such-gpu-model'" in out
    assert "No GPU figure has been measured in this repository yet" in out
    assert re.search(r"train, image runs \(1 GPU each\)\s+3 / 3", out) and "largest GPU memory" in out
    assert not re.search(r"^\s+ours:", out, re.M) and "720 min each (a guess: no throughput table)" in out


@pytest.mark.parametrize("args, message", [
    (("fediic", "isik", "moon"), "unknown setting 'isik' in paper fediic (did you mean 'isic'?)"),
    (("fediic", "isic", "mooon"), "unknown method 'mooon' in paper fediic (did you mean 'moon'?)"),
    (("fedic", "isic", "moon"), "unknown paper 'fedic' in this configuration (did you mean 'fediic'?)"),
    (("results/tables/clean/facmic/table22.md",), "is not a target of this configuration (did you mean "
                                                  "'results/tables/clean/facmic/table2.md'"),
])
def test_a_bad_estimate_gets_one_line_with_a_suggestion(args, message):
    proc = fedrepro("estimate", *args)
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
