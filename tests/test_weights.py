"""Pretrained weights as declared, checksummed resources (fedrepro.models.weights): what a config needs,
fetching once with a SHA-256 per file, loading the local copy with the hubs offline and no network, and
the errors a user meets when a copy is missing, truncated or changed.

Nothing here reaches the internet: a fake hub (the two network functions of
fedrepro.models.weight_sources replaced) serves real, tiny checkpoints - a 64-px open_clip CLIP under a
made-up pretrained tag that asks for QuickGELU, timm's ``test_vit`` and a 2-layer BERT repository with
its tokenizer - and every test that loads runs with sockets disabled.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from pathlib import Path

import pytest
import torch

from fedrepro.models import weight_sources as sources
from fedrepro.models import weights as W
from fedrepro.models.weights import WeightSpec

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = "fedrepro-tiny-clip"
TAG = "fake"
CLIP_REPO = "fake-org/tiny-clip"
BERT_REPO = "fake-org/tiny-bert"
TIMM_NAME = "test_vit"
TIMM_REPO = "timm/test_vit.r160_in1k"
REVISION = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"


def _safetensors_bytes(state: dict) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().contiguous() for k, v in state.items()})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """The real, tiny checkpoints the fake hub serves (built once) and the states they hold."""
    import open_clip
    import timm
    from transformers import BertConfig, BertModel

    from fedrepro.models.encoders import _open_clip
    from fedrepro.models.text_tower import generated_tokenizer

    _open_clip()
    torch.manual_seed(0)
    clip = open_clip.create_model(TINY, force_quick_gelu=True)
    vit = timm.create_model(TIMM_NAME, num_classes=1000)
    folder = tmp_path_factory.mktemp("bert")
    generated_tokenizer(300).save_pretrained(folder)          # a real tokenizer.json (WordPiece, [CLS] = 101)
    bert = BertModel(BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64), add_pooling_layer=False)
    bert.save_pretrained(folder)
    bert_files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return {
        "clip": clip.state_dict(), "vit": vit.state_dict(), "bert": bert.state_dict(),
        "repos": {
            # open_clip prefers the safetensors file; the .bin beside it must not be fetched
            CLIP_REPO: {"open_clip_model.safetensors": _safetensors_bytes(clip.state_dict()),
                        "open_clip_pytorch_model.bin": b"not fetched", "README.md": b"# tiny"},
            TIMM_REPO: {"model.safetensors": _safetensors_bytes(vit.state_dict())},
            # root-level config, tokenizer and PyTorch weights only: no other framework, no subfolders
            BERT_REPO: {**bert_files, "tf_model.h5": b"not fetched", "onnx/model.onnx": b"not fetched",
                        "README.md": b"# tiny"},
        },
    }


@pytest.fixture()
def hub(checkpoints, monkeypatch, tmp_path):
    """A fake Hugging Face hub (the network functions replaced) and a fresh working directory, so the
    local copies land in <tmp>/resources/weights; the fake open_clip tag is registered."""
    import open_clip.pretrained as oc_pretrained

    from fedrepro.models.encoders import _open_clip

    _open_clip()
    calls = []

    def listing(repo, revision=None):
        if repo not in checkpoints["repos"]:
            raise W.WeightsFetchError(f"could not list the Hugging Face repository {repo!r}")
        return REVISION, sorted(checkpoints["repos"][repo])

    def download(repo, filename, revision, dest):
        assert revision == REVISION
        calls.append((repo, filename))
        path = Path(dest) / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(checkpoints["repos"][repo][filename])
        return path

    monkeypatch.setattr(sources, "hub_listing", listing)
    monkeypatch.setattr(sources, "hub_download", download)
    monkeypatch.setitem(oc_pretrained._PRETRAINED, TINY, {TAG: oc_pretrained._pcfg(
        hf_hub=f"{CLIP_REPO}/", quick_gelu=True, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))})
    for name in W.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return calls


@pytest.fixture()
def offline(monkeypatch):
    """What a job sees: hubs switched off (restored after the test) and every socket refused."""
    import huggingface_hub.constants

    for name, value in W.OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refused(*args, **kwargs):
        raise OSError("network access in a test that must run offline")

    connect = socket.socket.connect

    def connect_local_only(sock, address):      # loader processes talk over Unix sockets: those are fine
        if sock.family != socket.AF_UNIX:
            refused()
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect_local_only)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(socket, "getaddrinfo", refused)


CLIP_SPEC = WeightSpec("open_clip", TINY, TAG)
TIMM_SPEC = WeightSpec("timm", TIMM_NAME)
BERT_SPEC = WeightSpec("hf", BERT_REPO, "model")


def _same(expected: dict, actual: dict, keys=None) -> bool:
    keys = keys or expected.keys()
    return all(torch.equal(expected[k], actual[k]) for k in keys)


# --------------------------------------------------------------------------------------------
# what a configuration needs

def test_ids_are_readable_and_reversible():
    for spec, expected in ((WeightSpec("open_clip", "ViT-B-16", "openai"), "open_clip--ViT-B-16--openai"),
                           (WeightSpec("timm", "resnet50.tv_in1k"), "timm--resnet50.tv_in1k"),
                           (WeightSpec("hf", "emilyalsentzer/Bio_ClinicalBERT", "tokenizer"),
                            "hf--emilyalsentzer--Bio_ClinicalBERT--tokenizer"),
                           (WeightSpec("hf", "bert-base-cased", "model"), "hf--bert-base-cased--model")):
        assert spec.id == expected and WeightSpec.from_id(expected) == spec
    for bad in ("openai", "nosuchkind--x", "timm--a--b", "hf--bert-base-cased--weights", "open_clip--ViT-B-16"):
        with pytest.raises(ValueError):
            WeightSpec.from_id(bad)
    with pytest.raises(ValueError, match="cannot be named"):
        WeightSpec("hf", "org/odd--name", "model")


def test_the_grid_declares_every_pretrained_file_it_loads_and_the_demo_none():
    from fedrepro.config import load_project

    grid = load_project([ROOT / "config/config.yaml"], root=ROOT)
    assert set(grid.plan.weights()) == {
        "open_clip--ViT-B-16--openai", "open_clip--ViT-B-32--openai",        # FACMIC, FAA-CLIP (+ feature caches)
        "open_clip--ViT-L-14--openai", "open_clip--ViT-L-14-336--openai",    # FAA-CLIP's backbone figure
        "timm--tf_efficientnet_b0.aa_in1k", "timm--resnet50.tv_in1k",        # FedIIC, FedAdapterProto
        "timm--deit_base_patch16_224", "hf--bert-base-cased--model",        # FedDRA's two towers
        "hf--emilyalsentzer--Bio_ClinicalBERT--tokenizer",                   # ... and the code's tokenizer
    }
    feddra = grid.resolver.run_config(next(k for k in grid.plan.runs() if k.paper == "feddra"))
    assert [s.id for s in W.weight_specs(feddra["train"]["model"])] == [
        "timm--deit_base_patch16_224", "hf--bert-base-cased--model", "hf--emilyalsentzer--Bio_ClinicalBERT--tokenizer"]
    # runs on cached features load no encoder; their feature caches do
    facmic = next(k for k in grid.plan.runs() if k.paper == "facmic" and grid.resolver.run_config(k)["input"] == "features")
    assert W.weight_specs(grid.resolver.run_config(facmic)["train"]["model"]) == []
    demo = load_project([ROOT / "config/demo.yaml"], root=ROOT)
    # the demo runs offline: packaged towers need no step; the composite CLIP's projections are built here
    assert list(demo.plan.weights()) == ["composite--fedrepro-lite0-minilm--aligned"]


def test_own_files_and_random_init_need_no_fetching(tmp_path):
    own = tmp_path / "my_clip.pt"
    own.write_bytes(b"x")
    assert W.encoder_weights({"name": "ViT-B-16", "pretrained": str(own)}) == []
    assert W.encoder_weights({"name": "ViT-B-16", "pretrained": "none"}) == []
    assert W.encoder_weights({"name": "local-dir:/some/export", "pretrained": "openai"}) == []
    assert W.timm_weights({"backbone": "efficientnet_b0", "pretrained": False}) == []
    assert W.timm_weights({"backbone": "efficientnet_b0", "pretrained": str(own)}) == []
    assert W.timm_weights({"backbone": "efficientnet_b0", "pretrained": True}) == [WeightSpec("timm", "efficientnet_b0")]


# --------------------------------------------------------------------------------------------
# fetching once, with a SHA-256 per file

def test_fetch_writes_the_files_and_a_manifest_with_every_sha256(hub, checkpoints):
    import hashlib

    killed = Path("resources/weights/.open_clip--fedrepro-tiny-clip--fake.partial-999999")   # a fetch that was killed
    killed.mkdir(parents=True)
    (killed / "open_clip_model.safetensors").write_bytes(b"half")
    manifest = W.fetch(CLIP_SPEC)
    folder = Path("resources/weights/open_clip--fedrepro-tiny-clip--fake")
    assert sorted(p.name for p in folder.iterdir()) == [".fetch.json", "open_clip_model.safetensors", "weights.json"]
    data = checkpoints["repos"][CLIP_REPO]["open_clip_model.safetensors"]
    assert manifest["files"] == {"open_clip_model.safetensors": {"sha256": hashlib.sha256(data).hexdigest(),
                                                                 "bytes": len(data)}}
    assert json.loads((folder / "weights.json").read_text()) == manifest
    assert manifest["source"] == {"hub": CLIP_REPO, "revision": REVISION, "file": "open_clip_model.safetensors"}
    assert manifest["primary"] == "open_clip_model.safetensors" and manifest["load"] == {"quick_gelu": True}
    assert not list(Path("resources/weights").glob(".*partial*"))      # staging folders are gone, the stale one too

    hub.clear()
    W.fetch(CLIP_SPEC)                                      # a verified copy is not fetched again ...
    assert hub == []
    W.fetch(CLIP_SPEC, force=True)                          # ... unless asked
    assert hub == [(CLIP_REPO, "open_clip_model.safetensors")]


def test_hugging_face_repository_keeps_config_tokenizer_and_pytorch_weights_only(hub):
    manifest = W.fetch(BERT_SPEC)
    assert "model.safetensors" in manifest["files"] and "config.json" in manifest["files"]
    assert not {"tf_model.h5", "onnx/model.onnx", "README.md"} & set(manifest["files"])
    assert manifest["primary"] is None and manifest["source"] == {"hub": BERT_REPO, "revision": REVISION}
    tokenizer_only = W.fetch(WeightSpec("hf", BERT_REPO, "tokenizer"))
    assert "config.json" in tokenizer_only["files"]
    assert not any(name.endswith((".safetensors", ".bin")) for name in tokenizer_only["files"])


# --------------------------------------------------------------------------------------------
# jobs load the local copy, offline

def test_open_clip_tag_loads_from_the_local_file_the_way_open_clip_loads_the_tag(hub, checkpoints, offline):
    from open_clip.transformer import QuickGELU

    from fedrepro.models.encoders import load_open_clip

    with pytest.MonkeyPatch.context() as m:              # fetching needs the hubs online: this machine "has internet"
        for name in W.OFFLINE_ENV:
            m.delenv(name)
        W.fetch(CLIP_SPEC)
    model, preprocess, _ = load_open_clip(TINY, TAG)
    assert _same(checkpoints["clip"], model.state_dict())
    # the tag was trained with QuickGELU and its own normalisation: both come with the local file
    assert isinstance(model.visual.transformer.resblocks[0].mlp.gelu, QuickGELU)
    assert "mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)" in repr(preprocess)


def test_timm_hub_weights_load_through_timms_own_loader_from_the_local_file(hub, checkpoints, offline):
    from fedrepro.models.encoders import create_timm

    with pytest.MonkeyPatch.context() as m:
        for name in W.OFFLINE_ENV:
            m.delenv(name)
        manifest = W.fetch(TIMM_SPEC)
    assert manifest["resolved"] == "test_vit.r160_in1k"
    backbone = create_timm(TIMM_NAME, num_classes=0, pretrained=True)      # head dropped by timm, as from the hub
    state = backbone.state_dict()
    assert "head.weight" not in state and _same(state, checkpoints["vit"], keys=state.keys())
    assert backbone.pretrained_cfg["tag"] == "r160_in1k"


def test_hugging_face_text_tower_and_tokenizer_load_from_the_local_folder(hub, checkpoints, offline):
    from fedrepro.models.text_tower import build_text_encoder, build_tokenizer

    with pytest.MonkeyPatch.context() as m:
        for name in W.OFFLINE_ENV:
            m.delenv(name)
        W.fetch(BERT_SPEC)
    text = {"name": BERT_REPO, "tokenizer": None, "pretrained": True, "layers": None, "config": {}}
    bert = build_text_encoder(text)
    assert _same(checkpoints["bert"], bert.state_dict())
    tokens = build_tokenizer(text)(["ab cd"], return_tensors="pt")["input_ids"][0].tolist()
    assert tokens[0] == 101 and tokens[-1] == 102            # [CLS] ... [SEP] of the repository's vocabulary


def test_a_training_job_loads_its_weights_from_resources_with_the_hubs_offline(hub, offline, tmp_path, monkeypatch):
    """The tiny grid's run, with the CLIP encoder run on every batch under a tag: `fedrepro train` reads the
    encoder from resources/weights (no socket can open) and records the files' digests in its manifest."""
    from fedrepro.cli import main
    from fedrepro.io import hash_obj
    from infra_support import build_tiny_inputs

    with pytest.MonkeyPatch.context() as m:
        for name in W.OFFLINE_ENV:
            m.delenv(name)
        W.fetch(CLIP_SPEC)
    run = build_tiny_inputs(tmp_path)
    run["train"]["model"] = {**run["train"]["model"], "family": "clip_adapter_images",
                             "encoder": {**run["train"]["model"]["encoder"], "name": TINY, "pretrained": TAG}}
    run.update(input="images", features=None)
    run["paths"].update(features=None, images=None)
    run["train"].update(rounds=1, num_workers=0)
    run.pop("config_hash")
    run["config_hash"] = hash_obj(run)
    main(["train", "--run", json.dumps(run), "--out", "out", "--checkpoint-dir", "ckpt"])
    recorded = json.loads(Path("out/run_manifest.json").read_text())["inputs"]["weights"]
    manifest = json.loads(Path(f"resources/weights/{CLIP_SPEC.id}/weights.json").read_text())
    assert recorded == {CLIP_SPEC.id: {"open_clip_model.safetensors": manifest["files"]["open_clip_model.safetensors"]["sha256"]}}
    assert Path("out/metrics.json").is_file()


# --------------------------------------------------------------------------------------------
# bad input: missing, truncated, changed, unloadable; hub errors

def test_missing_weights_name_the_file_and_both_commands_that_fetch_them(hub):
    with pytest.raises(W.WeightsMissing) as error:
        W.require([CLIP_SPEC])
    message = str(error.value)
    assert "resources/weights/open_clip--fedrepro-tiny-clip--fake/weights.json does not exist" in message
    assert "fedrepro weights open_clip--fedrepro-tiny-clip--fake\n" in message
    assert "snakemake --cores 1 resources/weights/open_clip--fedrepro-tiny-clip--fake/weights.json" in message


def test_truncated_or_changed_file_is_refused_with_the_command_that_fetches_it_again(hub):
    W.fetch(CLIP_SPEC)
    path = Path("resources/weights/open_clip--fedrepro-tiny-clip--fake/open_clip_model.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])                                   # truncated
    for deep in (False, True):                                                 # the DAG's cheap check sees it too
        with pytest.raises(W.WeightsCorrupt, match=rf"{re.escape(str(path))} is {len(data) // 2} bytes but .* records "
                                                   rf"{len(data)}: the file is truncated"):
            W.check(CLIP_SPEC, deep=deep)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))                         # same size, one bit flipped
    W.check(CLIP_SPEC, deep=False)
    with pytest.raises(W.WeightsCorrupt) as error:
        W.require([CLIP_SPEC])
    assert f"{path}: SHA-256" in str(error.value) and "fedrepro weights open_clip--fedrepro-tiny-clip--fake --force" in str(error.value)
    path.unlink()
    with pytest.raises(W.WeightsMissing, match=f"{re.escape(str(path))} is missing"):
        W.require([CLIP_SPEC])


def test_a_verified_file_that_does_not_load_is_a_clear_error(hub, offline):
    from fedrepro.models.encoders import load_open_clip

    folder = Path(W.folder(CLIP_SPEC))
    folder.mkdir(parents=True)
    (folder / "open_clip_model.safetensors").write_bytes(b"this is not a checkpoint")
    manifest = {"id": CLIP_SPEC.id, "primary": "open_clip_model.safetensors",
                "files": {"open_clip_model.safetensors": {"sha256": W.sha256_file(folder / "open_clip_model.safetensors"),
                                                          "bytes": 24}}}
    (folder / "weights.json").write_text(json.dumps(manifest))
    with pytest.raises(W.WeightsLoadError) as error:
        load_open_clip(TINY, TAG)
    assert str(folder / "open_clip_model.safetensors") in str(error.value)
    assert "fedrepro weights open_clip--fedrepro-tiny-clip--fake --force" in str(error.value)


def test_training_job_stops_on_missing_weights_before_it_reads_any_data(hub, offline, caplog):
    """`fedrepro train` of a real FACMIC run (full CLIP fine-tuning under the openai tag) on a machine
    without the weights: exit 1, the message names the file and the commands; the run's manifest and
    split do not exist here either, so failing on them would mean data was read first."""
    from fedrepro.cli import main
    from fedrepro.config import load_project

    grid = load_project([ROOT / "config/config.yaml"], root=ROOT)
    key = next(k for k in grid.plan.runs() if k.paper == "facmic" and grid.resolver.run_config(k)["train"]["model"]["family"] == "clip_full")
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stop:
        main(["train", "--run", json.dumps(grid.resolver.run_config(key)), "--out", "out", "--checkpoint-dir", "ckpt"])
    assert stop.value.code == 1
    assert "resources/weights/open_clip--ViT-B-16--openai/weights.json does not exist" in caplog.text
    assert "fedrepro weights open_clip--ViT-B-16--openai" in caplog.text
    assert not Path("out").exists()


def test_hub_errors_never_reach_the_user_raw(monkeypatch, tmp_path, caplog, capsys):
    """The real network function with the hub answering like an unreachable one: a fetch error naming
    the repository and what to check, no traceback, no partial folder."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import LocalEntryNotFoundError

    from fedrepro.cli import main

    def unreachable(self, *args, **kwargs):
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    for name in W.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stop:
        main(["weights", "hf--bert-base-cased--model"])
    assert "1 of 1 weights resource(s) failed: hf--bert-base-cased--model" in str(stop.value.code)
    assert "could not list the Hugging Face repository 'bert-base-cased' (LocalEntryNotFoundError" in caplog.text
    assert "login node" in caplog.text and "Traceback" not in caplog.text + capsys.readouterr().err
    assert not Path("resources/weights/hf--bert-base-cased--model").exists()
    assert not list(Path("resources/weights").glob(".*"))


def test_fetching_refuses_a_shell_with_the_hubs_switched_off(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(W.WeightsFetchError, match="HF_HUB_OFFLINE"):
        W.fetch(CLIP_SPEC)
    assert hub == []


def test_cli_lists_and_checks_what_a_configuration_needs(hub, capsys, monkeypatch):
    from fedrepro.cli import main

    main(["weights", CLIP_SPEC.id])
    main(["weights", "--list", CLIP_SPEC.id, TIMM_SPEC.id])
    listing = capsys.readouterr().out
    assert re.search(r"^present\s+open_clip--fedrepro-tiny-clip--fake\s+\(\d+\.\d MB\)", listing, re.MULTILINE)
    assert re.search(r"^missing\s+timm--test_vit\s", listing, re.MULTILINE)
    main(["weights", "--check", CLIP_SPEC.id])
    assert capsys.readouterr().out.startswith("verified")
    monkeypatch.chdir(ROOT)
    main(["weights", "--list", "--configfile", "config/demo.yaml"])
    assert re.search(r"^(missing|present)\s+composite--fedrepro-lite0-minilm--aligned\s", capsys.readouterr().out, re.MULTILINE)


# --------------------------------------------------------------------------------------------
# FedDRA builds offline at random init

def test_random_init_text_tower_builds_offline_from_the_shipped_architecture(offline):
    from fedrepro.models.text_tower import build_text_encoder, build_tokenizer, text_weights

    text = {"name": "bert-base-cased", "tokenizer": "generated", "pretrained": False, "layers": 6,
            "max_length": 112, "config": {}}
    assert text_weights(text) == []
    bert = build_text_encoder(text)
    assert (bert.config.hidden_size, bert.config.num_hidden_layers, bert.config.vocab_size) == (768, 6, 28996)
    tokens = build_tokenizer(text)(["Left pleural effusion, unchanged since the prior exam. " * 20],
                                   padding="max_length", truncation=True, max_length=112, return_tensors="pt")
    assert tokens["input_ids"].shape == (1, 112) and int(tokens["input_ids"].max()) < 28996
    # random init with the real tokenizer still fetches the tokenizer (its files, no weights)
    assert [s.id for s in text_weights({**text, "tokenizer": "emilyalsentzer/Bio_ClinicalBERT"})] == [
        "hf--emilyalsentzer--Bio_ClinicalBERT--tokenizer"]
    with pytest.raises(ValueError, match="random-init smoke tests"):
        text_weights({**text, "pretrained": True})


def test_generated_vocabulary_is_bert_shaped_and_exactly_the_size_asked():
    from fedrepro.models.text_tower import generated_tokenizer, generated_vocabulary

    vocab = generated_vocabulary(28996)
    assert len(vocab) == 28996 and sorted(vocab.values()) == list(range(28996))
    assert [vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 100, 101, 102, 103]
    assert generated_vocabulary(28996) == vocab                                 # deterministic
    tok = generated_tokenizer(28996)
    ids = tok(["No acute findings", "x"], padding="longest", return_tensors="pt")
    assert ids["input_ids"][0, 0] == 101 and ids["input_ids"][1].tolist()[-1] == 0   # [CLS] first, [PAD] last
    assert tok.convert_ids_to_tokens(ids["input_ids"][0, 1:5].tolist()) == ["N", "##o", "acu", "##te"]


# --------------------------------------------------------------------------------------------
# the workflow: a local job before the jobs that need it; a bad local copy stops it before submitting

def _dry_run_jobs(output: str) -> list[dict]:
    """Every job block of `snakemake -n` output: {"rule", "input", "output", "reason"}."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:\n)", output):
        head = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):\n", block)
        if head:
            fields = dict(re.findall(r"^\s{4}(\w+): (.*)$", block, flags=re.MULTILINE))
            jobs.append({"rule": head.group(1), **{k: fields.get(k, "") for k in ("input", "output", "reason")}})
    return jobs


def test_full_grid_dry_run_fetches_weights_locally_before_the_jobs_that_need_them(tmp_path):
    from fedrepro.config import load_project
    from infra_support import copy_repo, run, tool_env

    repo = copy_repo(tmp_path / "repo", profiles=True)
    env = tool_env(repo, tmp_path / "home")
    out = run(["snakemake", "all", "-n", "--profile", "slurm"], repo, env, timeout=300).stdout
    jobs = _dry_run_jobs(out)
    fetched = {re.fullmatch(r"resources/weights/(.+)/weights\.json", j["output"]).group(1) for j in jobs if j["rule"] == "weights"}
    assert fetched == set(load_project([ROOT / "config/config.yaml"], root=ROOT).plan.weights())
    needing = {}
    for job in jobs:
        for manifest in re.findall(r"resources/weights/[^,\s]+/weights\.json", job["input"]):
            # scheduled after the weights job: Snakemake names the manifest as an input another job makes
            assert manifest in job["reason"] and "Input files updated by another job" in job["reason"], job
            needing.setdefault(job["rule"], set()).add(manifest.split("/")[2])
    assert set(needing) == {"train", "features", "downstream"}
    assert {"open_clip--ViT-B-16--openai", "timm--tf_efficientnet_b0.aa_in1k", "timm--resnet50.tv_in1k",
            "hf--bert-base-cased--model"} <= needing["train"]
    assert needing["features"] == {i for i in fetched if i.startswith("open_clip--")}     # ViT-L ones only as features
    assert needing["downstream"] == {"timm--deit_base_patch16_224", "hf--bert-base-cased--model",
                                     "hf--emilyalsentzer--Bio_ClinicalBERT--tokenizer"}
    # a local rule (Snakemake never says "local" in a dry run): it runs where Snakemake runs, like the downloads
    declared = re.findall(r"^localrules:\n((?:\s+\w+,?\n)+)", "\n".join(p.read_text() for p in (repo / "workflow/rules").glob("*.smk")),
                          flags=re.MULTILINE)
    assert "weights" in {name.strip(" ,") for block in declared for name in block.split()}


def test_fetching_weights_through_the_workflow_plans_weights_jobs_only(tmp_path):
    """Issue 34: the workflow command README, docs/cluster-and-cache.md and the weights error message give for "fetch
    every resource" plans weights jobs and nothing else (`--until weights all` planned the whole grid: `--until` reads
    `all` as a second rule), and `--until ... all` itself is refused before any job, with the command that was meant."""
    import shlex

    from fedrepro.config import load_project
    from infra_support import copy_repo, run, tool_env

    repo = copy_repo(tmp_path / "repo", profiles=True)
    env = tool_env(repo, tmp_path / "home")
    commands = set()
    for doc in ("README.md", "docs/cluster-and-cache.md"):
        shown = re.findall(r"^(snakemake [^#\n]*?)\s+# the same through the workflow", (ROOT / doc).read_text(), flags=re.MULTILINE)
        assert len(shown) == 1, doc
        commands |= set(shown)
    message = W.fetch_command(WeightSpec.from_id("open_clip--ViT-B-16--openai"))
    commands |= set(re.findall(r"`(snakemake [^`]*)` fetches every resource", message))
    assert len(commands) == 2, commands                                  # the docs' and the message's (--cores 1)
    wanted = set(load_project([ROOT / "config/config.yaml"], root=ROOT).plan.weights())
    for command in sorted(commands):
        jobs = _dry_run_jobs(run([*shlex.split(command), "-n"], repo, env, timeout=300).stdout)
        assert {j["rule"] for j in jobs} == {"weights", "all_weights"}, command
        fetched = {re.fullmatch(r"resources/weights/(.+)/weights\.json", j["output"]).group(1) for j in jobs if j["rule"] == "weights"}
        assert fetched == wanted, command

    trap = run(["snakemake", "--cores", "2", "--until", "weights", "all", "-n"], repo, env, timeout=300, check=False)
    text = trap.stdout + trap.stderr
    assert trap.returncode != 0 and "rule train:" not in text and "rule download:" not in text
    assert "`--until` was given `all`" in text and "`snakemake all --until weights`" in text
    assert "`snakemake --cores 2 all_weights`" in text
    first = _dry_run_jobs(run(["snakemake", "all", "--cores", "2", "--until", "weights", "-n"], repo, env, timeout=300).stdout)
    assert {j["rule"] for j in first} == {"weights"}                   # the target first: what was meant


def test_a_truncated_local_copy_stops_the_workflow_before_any_job_is_submitted(tmp_path):
    from infra_support import copy_repo, run, tool_env

    repo = copy_repo(tmp_path / "repo", profiles=True)
    env = tool_env(repo, tmp_path / "home")
    folder = repo / "resources/weights/timm--tf_efficientnet_b0.aa_in1k"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    (folder / "weights.json").write_text(json.dumps({"id": "timm--tf_efficientnet_b0.aa_in1k", "primary": "model.safetensors",
                                                     "files": {"model.safetensors": {"sha256": "0" * 64, "bytes": 21_000_000}}}))
    result = run(["snakemake", "results/tables/clean/fediic/table1.md", "-n", "--profile", "slurm"], repo, env,
                 timeout=300, check=False)
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "resources/weights/timm--tf_efficientnet_b0.aa_in1k/model.safetensors is 10 bytes but" in text
    assert "fedrepro weights timm--tf_efficientnet_b0.aa_in1k --force" in text
    assert "rule train:" not in text
