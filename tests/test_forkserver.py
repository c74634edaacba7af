"""The fork-server runs CLI commands exactly like a fresh process would, exit codes and stderr included."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from fedrepro.data.manifest import write_manifest


def cli(args, env):
    return subprocess.run([sys.executable, "-m", "fedrepro.cli", *args], env=env, capture_output=True, text=True, timeout=300)


def test_same_output_same_errors(tmp_path, forkserver):
    manifest = pd.DataFrame({"path": [f"x{i}.png" for i in range(40)], "label": [i % 2 for i in range(40)],
                             "class_name": [f"c{i % 2}" for i in range(40)], "source": "", "split": ""})
    write_manifest(tmp_path / "m.csv", manifest)
    spec = json.dumps({"kind": "dirichlet", "clients": 3, "alpha": 0.5, "on_empty": "resample"})
    args = ["split", "--dataset", "demo_digits", "--manifest", str(tmp_path / "m.csv"), "--spec", spec, "--seed", "1"]
    served_env = dict(os.environ, FEDREPRO_FORKSERVER=str(forkserver))
    local_env = {k: v for k, v in os.environ.items() if k != "FEDREPRO_FORKSERVER"}

    served = cli(args + ["--out", str(tmp_path / "served.json")], served_env)
    local = cli(args + ["--out", str(tmp_path / "local.json")], local_env)
    assert served.returncode == local.returncode == 0, served.stderr + local.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("served.json", "local.json"))
    assert a == b

    bad = args[:-2] + ["--seed", "1", "--spec", json.dumps({"kind": "nope", "clients": 2}), "--out", str(tmp_path / "bad.json")]
    served_bad, local_bad = cli(bad, served_env), cli(bad, local_env)
    assert served_bad.returncode == local_bad.returncode == 1
    assert "unknown split kind 'nope'" in served_bad.stderr and "unknown split kind 'nope'" in local_bad.stderr
    assert not (tmp_path / "bad.json").exists()


def test_a_job_with_its_log_runs_in_the_server(tmp_path, forkserver):
    """Every rule runs `fedrepro --log <log> <command> ...`: the global option comes first, and the command still
    goes to the server (a forked child writes the log's attempt header, not the client process)."""
    manifest = pd.DataFrame({"path": ["a.png", "b.png"], "label": [0, 1], "class_name": ["c0", "c1"], "source": "", "split": ""})
    write_manifest(tmp_path / "m.csv", manifest)
    args = ["split", "--dataset", "demo_digits", "--manifest", str(tmp_path / "m.csv"), "--spec",
            json.dumps({"kind": "iid", "clients": 2, "ratios": {"train": 1.0}}), "--seed", "0"]
    for name, env in (("served", dict(os.environ, FEDREPRO_FORKSERVER=str(forkserver))),
                      ("local", {k: v for k, v in os.environ.items() if k != "FEDREPRO_FORKSERVER"})):
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen([sys.executable, "-m", "fedrepro.cli", "--log", str(log), *args, "--out",
                                 str(tmp_path / f"{name}.json")], env=env)
        assert proc.wait(timeout=300) == 0
        header = log.read_text().splitlines()[0]
        assert (f"(pid {proc.pid})" in header) == (name == "local"), (name, header)


def test_unreachable_server_falls_back_to_running_locally(tmp_path):
    manifest = pd.DataFrame({"path": ["a.png", "b.png"], "label": [0, 1], "class_name": ["c0", "c1"], "source": "", "split": ""})
    write_manifest(tmp_path / "m.csv", manifest)
    env = dict(os.environ, FEDREPRO_FORKSERVER=str(tmp_path / "no-such.sock"))
    result = cli(["split", "--dataset", "demo_digits", "--manifest", str(tmp_path / "m.csv"), "--spec",
                  json.dumps({"kind": "iid", "clients": 2, "ratios": {"train": 1.0}}), "--seed", "0",
                  "--out", str(tmp_path / "s.json")], env)
    assert result.returncode == 0, result.stderr
    assert len(json.loads((tmp_path / "s.json").read_text())["clients"]) == 2


def test_main_called_in_a_process_returns_after_a_served_command(tmp_path, forkserver, monkeypatch):
    """A script that calls ``fedrepro.cli.main`` for several commands (benchmarks/facmic_cache.py) goes on after each
    one the server ran (it used to be ended by SystemExit(0) after the first), and stops on a failing one."""
    from fedrepro.cli import main

    manifest = pd.DataFrame({"path": ["a.png", "b.png"], "label": [0, 1], "class_name": ["c0", "c1"], "source": "", "split": ""})
    write_manifest(tmp_path / "m.csv", manifest)
    monkeypatch.setenv("FEDREPRO_FORKSERVER", str(forkserver))
    args = ["split", "--dataset", "demo_digits", "--manifest", str(tmp_path / "m.csv"), "--spec",
            json.dumps({"kind": "iid", "clients": 2, "ratios": {"train": 1.0}}), "--seed", "0"]
    for name in ("first", "second"):
        assert main([*args, "--out", str(tmp_path / f"{name}.json")]) is None
    assert (tmp_path / "first.json").exists() and (tmp_path / "second.json").exists()
    bad = [*args[:-2], "--seed", "0", "--spec", json.dumps({"kind": "nope", "clients": 2}), "--out", str(tmp_path / "bad.json")]
    with pytest.raises(SystemExit) as stopped:
        main(bad)
    assert stopped.value.code == 1
