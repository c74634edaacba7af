"""Issue 25, cases 2 and 7: `scripts/dvc-results.py pull` checks every downloaded file against its MD5 in dvc.lock
before it touches the workspace, and refuses a corrupt copy on the remote naming the file and the remote; a
missing remote is named with its path. `push` never uploads the datasets' own data (raw data, pixel caches,
manifests) unless --stages names its stage. Issue 34: neither shares the results of a configuration whose
`results_dir` is not the full grid's (the demo's, the evidence run's), which no stage of dvc.yaml holds."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra_support import REPO, copy_repo, run, tool_env

METRICS = "results/runs/clean/foundation/bt_iid/fedclip/seed0/metrics.json"
TABLE = "results/tables/clean/foundation/accuracy.md"


def dvc_results():
    spec = importlib.util.spec_from_file_location("dvc_results", REPO / "scripts/dvc-results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pushed_clone(tmp_path: Path) -> tuple[Path, dict, Path]:
    """A repository whose runs and tables were pushed to its default remote, and a fresh clone of it."""
    origin = copy_repo(tmp_path / "origin")
    env = tool_env(origin, tmp_path / "home")
    for path, text in ((METRICS, json.dumps({"eval": {"global": {"acc": 0.5542}}})), (TABLE, "| FedCLIP | 55.42 |\n")):
        (origin / path).parent.mkdir(parents=True, exist_ok=True)
        (origin / path).write_text(text)
    run(["git", "init", "-q", "-b", "main"], origin, env)
    run(["dvc", "commit", "--force", "--quiet", "runs", "tables"], origin, env)
    run(["dvc", "push", "--quiet", "runs", "tables"], origin, env)
    run(["git", "add", "-A"], origin, env)
    run(["git", "commit", "-q", "-m", "results"], origin, env)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(origin), str(clone)], tmp_path, env)
    return clone, tool_env(clone, tmp_path / "home"), tmp_path / "home/.cache/fedrepro/dvc-store"


def pull(clone: Path, env: dict) -> subprocess.CompletedProcess:
    return run(["python", "scripts/dvc-results.py", "pull", "--stages", "runs", "tables", "--", "--configfile",
                "tests/data/infra/config.yaml"], clone, env, check=False)


def test_pull_refuses_a_corrupt_remote_copy_by_name_and_a_missing_remote_by_path(tmp_path):
    clone, env, remote = pushed_clone(tmp_path)
    md5 = hashlib.md5((tmp_path / "origin" / METRICS).read_bytes()).hexdigest()
    stored = remote / "files/md5" / md5[:2] / md5[2:]
    stored.chmod(0o644)
    stored.write_text(json.dumps({"eval": {"global": {"acc": 0.6694}}}))      # edited on the remote

    refused = pull(clone, env)
    assert refused.returncode == 1
    assert f"{METRICS}: MD5 " in refused.stderr and f"dvc.lock records {md5}" in refused.stderr, refused.stderr[-3000:]
    assert f"the DVC remote 'store' ({remote})" in refused.stderr
    assert [p.name for p in (clone / "results").rglob("*")] == ["README.md"]     # nothing in the workspace changed

    run(["dvc", "remote", "modify", "--local", "store", "url", str(tmp_path / "gone")], clone, env)
    missing = pull(clone, env)
    assert missing.returncode == 1 and f"{tmp_path / 'gone'} does not exist or is not readable" in missing.stderr


def recording(root: Path, monkeypatch, outputs: tuple[str, ...]):
    """dvc-results.py on a fake repository at ``root`` (dvc.yaml, the shipped top-level configs, ``outputs`` as empty
    folders) whose commands are recorded, not run, and whose Snakemake has nothing left to do -> (module, commands)."""
    module = dvc_results()
    (root / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    (root / "config").mkdir()
    for name in ("config.yaml", "demo.yaml", "evidence.yaml"):
        (root / "config" / name).write_text((REPO / "config" / name).read_text())
    for out in outputs:
        (root / out).mkdir(parents=True)
    commands = []

    def record(cmd, capture=False, check=True):
        commands.append(cmd)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(module, "run", record)
    monkeypatch.setattr(module, "pending_jobs", lambda args: 0)
    return module, commands


def test_push_leaves_the_datasets_own_data_out_unless_named(tmp_path, monkeypatch, capsys):
    """Raw data, the decode-once pixel caches and the manifests (MIMIC-CXR's carries report text) stay on the
    machine unless --stages names them; push says which it held back and why."""
    module, commands = recording(tmp_path, monkeypatch, ("resources/raw/mimic_cxr", "resources/images/mimic_cxr",
                                                         "resources/manifests", "resources/splits", "results/runs"))
    module.push(SimpleNamespace(stages=None, snakemake=[], force=False), tmp_path)
    assert ["dvc", "push", "splits", "runs"] in commands
    held = capsys.readouterr().err
    assert "not pushed: raw (resources/raw: raw data); images (resources/images: pixel caches" in held
    assert "manifests (resources/manifests: per-image metadata, with MIMIC-CXR's report text" in held
    assert "name a stage with --stages to push it" in held
    commands.clear()
    module.push(SimpleNamespace(stages=["raw", "images", "manifests", "runs"], snakemake=[], force=False), tmp_path)
    assert ["dvc", "push", "raw", "images", "manifests", "runs"] in commands


def test_push_and_pull_refuse_a_configuration_whose_results_no_stage_holds(tmp_path, monkeypatch):
    """The demo writes to results/demo and the evidence run to results/evidence-run, outside dvc.yaml's stages: pushing
    "the demo's results" would record the full grid's folders instead (or nothing), and pulling would touch the wrong
    files. Both stop before any DVC or git command, naming the folder; the full grid's configuration passes."""
    module, commands = recording(tmp_path, monkeypatch, ("results/runs",))
    for action in (module.push, module.pull):
        for words, folder in ((["--configfile", "config/demo.yaml"], "results/demo"),
                              (["all", "--cores", "2", "--configfile", "config/config.yaml", "config/demo.yaml"], "results/demo"),
                              (["--configfile=config/evidence.yaml", "all"], "results/evidence-run")):
            with pytest.raises(module.Failure, match=rf"keeps its results in {folder}/ \(its results_dir\), which no stage "
                                                     rf"of dvc.yaml holds: the stages share results/"):
                action(SimpleNamespace(stages=None, snakemake=words, force=False), tmp_path)
    assert commands == []
    assert module.config_files(["all", "--configfile", "a.yaml", "b.yaml", "-n", "--configfiles=c.yaml"]) == ["a.yaml", "b.yaml", "c.yaml"]
    known = module.stage_outputs(tmp_path)
    for words in ([], ["--configfile", "config/config.yaml"], ["all_weights"]):
        module.check_results_dir(tmp_path, words, known)


def test_a_bad_copy_in_the_local_cache_is_downloaded_again_not_blamed_on_the_remote(tmp_path):
    """Issue 32, item 8: a copy in DVC's own cache that does not match dvc.lock, though DVC takes it as fetched (its
    size and modification time are those DVC recorded, so DVC does not look again; an interrupted pull left such
    copies), made the next pull say that the remote holds a corrupt copy, which it does not. It is now downloaded
    once more, and only a copy still bad after that is blamed on the remote."""
    import os

    clone, env, _ = pushed_clone(tmp_path)
    run(["dvc", "fetch", "--quiet", "runs", "tables"], clone, env)
    md5 = hashlib.md5((tmp_path / "origin" / METRICS).read_bytes()).hexdigest()
    bad = Path(run(["dvc", "cache", "dir"], clone, env).stdout.strip()) / "files/md5" / md5[:2] / md5[2:]
    before = bad.stat()
    bad.chmod(0o644)
    bad.write_bytes(b"\0" * before.st_size)                             # same size, other bytes
    os.utime(bad, ns=(before.st_atime_ns, before.st_mtime_ns))           # and the time DVC recorded

    pulled = pull(clone, env)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert "do not match dvc.lock (copies DVC takes as fetched): downloading them again" in pulled.stderr
    assert "remote holds a corrupt copy" not in pulled.stderr
    assert (clone / METRICS).read_bytes() == (tmp_path / "origin" / METRICS).read_bytes()
