"""The example plug-in (examples/fedrepro-fedavgm) as a researcher uses it: installed with ``pip install -e`` into an
environment of its own, its own tests run there, then the demo grid's FedIIC twin with the example's extension
(examples/fedrepro-fedavgm/fedavgm.yaml, as it ships) through Snakemake and the fork-server.

- the papers' own results are made first, without the plug-in; the server that runs the jobs starts before the
  package is installed, so its children must find a package installed after it (entry points, .pth files);
- with the extension only the new runs train (FedAvgM beside FedAvg, and every row on the folder dataset);
- its tables hold the FedAvgM row with real numbers and, for the FedAvg row, the very numbers of the papers' table;
  the scorecard and evidence page list it, the published column stays empty; the run manifest names the plug-in;
- without the extension again, nothing is to be done: no run, table or scorecard of the papers' changed, not even
  once the plug-in's code has changed; `fedrepro stale` then lists exactly the plug-in's runs as made by other code,
  and the command it prints (planned with -n) trains exactly those again.

The shared environment is left as it was: the package goes into a throw-away venv that sees the shared one's
packages through a .pth file. About four minutes on two CPU cores (9 training runs of 2 rounds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, copy_repo_skeleton

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples/fedrepro-fedavgm"
RESULTS = "results"      # config/tiny.yaml below sets no results_dir (config/demo.yaml's results/demo is not read)
TABLES = f"{RESULTS}/extensions/fedavgm/tables/clean/fediic"


def venv_with_shared_packages(folder: Path) -> Path:
    """A venv whose interpreter also sees this one's packages (and runs `fedrepro` from them); -> its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
    Path(purelib, "_shared_venv.pth").write_text(lines)
    script = folder / "bin" / "fedrepro"
    script.write_text(f"#!{python}\nimport sys\nfrom fedrepro.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return python


def snakemake(python: Path, work: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "snakemake", "--cores", "2", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1500)


def trained(log: str) -> set[str]:
    """The runs a Snakemake log (or dry run) trains: their folders."""
    return set(re.findall(rf"output: ({RESULTS}/runs/[^,\s]+)/metrics\.json", log))


@pytest.fixture(scope="module")
def example(tmp_path_factory, demo_raw):
    base = tmp_path_factory.mktemp("plugin")
    (base / "work").mkdir()
    work = copy_repo_skeleton(base / "work")
    python = venv_with_shared_packages(base / "venv")
    paper = yaml.safe_load((work / "config/demo/fediic.yaml").read_text())
    paper["defaults"]["rounds"] = 2
    (work / "config/demo/fediic.yaml").write_text(yaml.safe_dump(paper, allow_unicode=True))
    (work / "config/tiny.yaml").write_text(yaml.safe_dump({
        "papers": ["fediic"], "paper_dir": "config/demo", "seeds": [0], "threads": 1, "image_run_threads": 1,
        "outputs": ["tables", "scorecards", "evidence"], "evidence": {"bacc_above_chance": 0.05},
        "data": {"jpeg_draft": False, "raw_dir": str(demo_raw)}}))
    shutil.copy(EXAMPLE / "fedavgm.yaml", work / "fedavgm.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDREPRO_")}
    sock = base / "fs.sock"
    server = subprocess.Popen([str(python), "-m", "fedrepro.forkserver", "serve", str(sock)], cwd=work, env=env,
                              stderr=subprocess.DEVNULL)
    try:
        from fedrepro.forkclient import wait_ready

        assert wait_ready(sock, timeout=180), "the fork-server did not start"
        env["FEDREPRO_FORKSERVER"] = str(sock)
        papers = snakemake(python, work, env, "--configfile=config/tiny.yaml", "all")
        assert papers.returncode == 0, papers.stderr[-4000:]
        # installed after the server started: its children must find it all the same (a copy: its code is edited)
        package = base / "fedrepro-fedavgm"
        shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
        install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(package), "--no-deps",
                                  "--no-build-isolation"], cwd=base, env=env, capture_output=True, text=True)
        assert install.returncode == 0, install.stderr[-3000:]
        own_tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
                                   cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        shapes = subprocess.run([str(python), "-m", "fedrepro_fedavgm.shapes", "resources/shapes", "--per-class", "30"],
                                cwd=work, env=env, capture_output=True, text=True)
        assert shapes.returncode == 0, shapes.stderr
        plan = snakemake(python, work, env, "-n", "--configfile", "config/tiny.yaml", "fedavgm.yaml", "--", "all")
        extended = snakemake(python, work, env, "--configfile", "config/tiny.yaml", "fedavgm.yaml", "--", "all")
        assert extended.returncode == 0, extended.stderr[-4000:]
        source = package / "src/fedrepro_fedavgm/fedavgm.py"        # the author changes the method's code
        source.write_text(source.read_text().replace("out[key] = global_state[key] - lr * velocity[key]",
                                                     "out[key] = global_state[key] - lr * velocity[key]\n        out[key] += 0"))
        again = snakemake(python, work, env, "-n", "--configfile=config/tiny.yaml", "all")
        stale = subprocess.run([str(base / "venv/bin/fedrepro"), "stale", "--configfile", "config/tiny.yaml",
                                "fedavgm.yaml"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        command = re.search(r"rerun them \(and what is made from them\): snakemake (.*)", stale.stdout)
        rerun = snakemake(python, work, env, "-n", *command.group(1).split()) if command else None
        yield {"work": work, "papers": papers, "own_tests": own_tests, "plan": plan, "extended": extended, "again": again,
               "stale": stale, "rerun": rerun}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_package_passes_its_own_tests_where_it_is_installed(example):
    result = example["own_tests"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "3 passed" in result.stdout


def test_only_the_new_runs_train(example):
    papers = trained(example["papers"].stdout + example["papers"].stderr)
    assert papers == {f"{RESULTS}/runs/clean/fediic/lt_creff/fedavg/seed0", f"{RESULTS}/runs/clean/fediic/lt_creff/fediic/seed0"}
    planned = trained(example["plan"].stdout)
    assert planned == {f"{RESULTS}/runs/clean/fediic/lt_creff/fedavgm/seed0"} | {
        f"{RESULTS}/runs/clean/fediic/shapes/{m}/seed0" for m in ("fedavg", "fedavgm", "fediic")}
    log = example["extended"].stderr
    assert "extension fedavgm: feddra skipped: feddra is not among the configuration's papers ['fediic']" in log
    assert "extension fedavgm: fediic/imbalance skipped: a class_balance table" in log


def test_the_tables_gain_the_row_with_real_numbers(example):
    work = example["work"]
    table = pd.read_csv(work / TABLES / "table1.csv")
    assert list(dict.fromkeys(table["row"])) == ["FedAvg", "FedAvgM", "FedIIC"]
    mine = table[table["row"] == "FedAvgM"]
    assert (mine["n"] == 1).all() and mine["mean"].between(0, 100).all() and mine["published"].isna().all()
    assert table[table["row"] == "FedAvg"]["published"].notna().all()      # the papers' values stay beside it
    papers = pd.read_csv(work / f"{RESULTS}/tables/clean/fediic/table1.csv")
    same = table.merge(papers, on=["row", "column"], suffixes=("", "_papers"))
    assert len(same) == 6 and (same["mean"] == same["mean_papers"]).all()  # FedAvg and FedIIC: the very same runs
    markdown = (work / TABLES / "table1.md").read_text()
    assert re.search(r"\| FedAvgM \| \d+\.\d\d \| \d+\.\d\d \| \d+\.\d\d \|", markdown)

    shapes = pd.read_csv(work / TABLES / "table1@shapes.csv")
    assert list(dict.fromkeys(shapes["row"])) == ["FedAvg", "FedAvgM", "FedIIC"]
    assert shapes["mean"].between(0, 100).all() and shapes["published"].isna().all()
    balance = pd.read_csv(work / TABLES / "imbalance@shapes.csv")
    assert set(balance["row"]) == {"Shapes (3 clients, Dirichlet α=0.5)"}


def test_the_scorecard_and_the_evidence_page_include_it(example):
    work = example["work"]
    card = pd.read_csv(work / f"{RESULTS}/extensions/fedavgm/scorecards/fediic.csv")
    mine = card[(card["table"] == "table1") & (card["row"] == "FedAvgM")]
    assert len(mine) == 3 and (mine["verdict"] == "unpublished").all()
    # the tiny grid's stand-in data: no verdict at all (before it, 'no interval' for its one seed)
    assert set(card[(card["table"] == "table1") & (card["row"] == "FedAvg")]["verdict"]) == {"stand-in data"}
    assert set(card[card["table"] == "table1@shapes"]["verdict"]) == {"unpublished"}
    evidence = pd.read_csv(work / f"{RESULTS}/extensions/fedavgm/evidence/bar.csv")
    assert {("lt_creff", "fedavgm"), ("shapes", "fedavgm"), ("shapes", "fediic")} <= set(zip(evidence["setting"],
                                                                                               evidence["method"]))
    manifest = json.loads((work / f"{RESULTS}/runs/clean/fediic/shapes/fedavgm/seed0/run_manifest.json").read_text())
    assert manifest["plugins"]["method"] == {"name": "fedavgm", "plugin": "fedrepro_fedavgm", "version": "0.1.0",
                                             "found": "entry point fedavgm = fedrepro_fedavgm of fedrepro-fedavgm 0.1.0"}
    assert manifest["plugins"]["dataset"]["plugin"] == "config"
    code = manifest["code"]["components"]["method"]      # which code made it, compared by `fedrepro stale`
    assert (code["plugin"], code["distribution"], code["version"]) == ("fedrepro_fedavgm", "fedrepro-fedavgm", "0.1.0")
    assert set(code["modules"]) == {"fedrepro_fedavgm.fedavgm", "fedrepro.fl.method"}


def test_without_the_extension_nothing_is_to_be_done(example):
    again = example["again"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_change_of_the_plugins_code_is_listed_and_reruns_exactly_its_runs(example):
    stale = example["stale"]
    assert stale.returncode == 0, stale.stderr[-3000:]
    mine = {f"clean/fediic/{setting}/fedavgm/seed0" for setting in ("lt_creff", "shapes")}
    assert "2 of them by other code than the installed one:" in stale.stdout
    assert "  method fedavgm: fedrepro_fedavgm.fedavgm changed: 2 run(s)" in stale.stdout
    assert set(re.findall(r"^    (\S+)$", stale.stdout, re.M)) == mine
    rerun = example["rerun"]
    assert rerun is not None and rerun.returncode == 0, (stale.stdout, rerun and rerun.stderr[-3000:])
    assert trained(rerun.stdout) == {f"{RESULTS}/runs/{path}" for path in mine}
