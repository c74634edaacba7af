"""End to end: the real Snakefile on a tiny config (demo data, 1 seed, 2 rounds), through the CLI."""

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import copy_repo_skeleton

pytestmark = pytest.mark.slow
ARTEFACTS = Path(__file__).resolve().parents[1] / "results" / "test-artefacts"   # for a human to look at after CI


def snakemake(workdir, *args, env=None):
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile=config/tiny.yaml", *args]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, demo_raw, forkserver):
    work = copy_repo_skeleton(tmp_path_factory.mktemp("pipeline"))
    paper = yaml.safe_load(open(work / "config/demo/foundation.yaml"))
    paper["defaults"]["rounds"] = 2
    (work / "config/demo/foundation.yaml").write_text(yaml.safe_dump(paper))
    (work / "config/tiny.yaml").write_text(yaml.safe_dump({
        "papers": ["foundation"], "paper_dir": "config/demo", "seeds": [0], "threads": 1,
        "data": {"raw_dir": str(demo_raw)}}))
    env = dict(os.environ, FEDREPRO_FORKSERVER=str(forkserver))
    result = snakemake(work, "all", env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return work, env, result


def test_tables_have_the_expected_rows_and_columns(pipeline):
    work, _, _ = pipeline
    table = pd.read_csv(work / "results/tables/clean/foundation/accuracy.csv")
    assert set(table["row"]) == {"Centralized", "FedAvg (test_resnet)", "FedCLIP"}
    assert set(table["column"]) == {"Fashion IID", "Fashion α=0.3", "Avg", "BT (17 MRIs)"}
    assert (table["n"] == 1).all() and table["mean"].between(0, 100).all()
    published = table[(table.row == "FedCLIP") & (table.column == "Fashion IID")]["published"].item()
    assert published == 50.0
    markdown = (work / "results/tables/clean/foundation/accuracy.md").read_text()
    assert "| FedCLIP |" in markdown and "Protocol: clean" in markdown and "best validation round" in markdown
    assert (work / "results/tables/clean/foundation/accuracy.tex").read_text().startswith("\\begin{table}")
    counts = pd.read_csv(work / "results/tables/clean/foundation/clients.csv")
    assert {"client0", "client1", "client2", "global_test"} <= set(counts["row"])
    for figure in ("curves", "splits"):
        assert (work / f"results/figures/clean/foundation/{figure}.png").stat().st_size > 1000
        assert (work / f"results/figures/clean/foundation/{figure}.pdf").exists()


def test_run_outputs_and_provenance(pipeline):
    work, _, _ = pipeline
    run = work / "results/runs/clean/foundation/fashion_iid/fedclip/seed0"
    manifest = yaml.safe_load((run / "run_manifest.json").read_text())
    assert manifest["run"]["config_hash"] and manifest["inputs"]["split_sha256"]
    assert manifest["determinism"]["deterministic"] is True
    assert "torch" in manifest["packages"] and manifest["seeds"]["run"] == 0
    code = manifest["code"]["components"]        # which code made it: `fedrepro stale` compares it with the installed code
    assert set(code["method"]["modules"]) == {"fedrepro.methods.fedclip", "fedrepro.fl.method"}
    assert all(len(d) == 64 for d in code["method"]["modules"].values()) and "plugin" not in code["method"]
    assert manifest["code"]["fedrepro"]["version"]
    history = pd.read_csv(run / "history.csv")
    assert list(history["round"]) == [1, 2] and (history["up_params"] > 0).all()
    assert not (work / "results/checkpoints/clean/foundation/fashion_iid/fedclip/seed0/resume.pt").exists()


def test_nothing_left_to_do_and_one_table_rebuilds_alone(pipeline):
    work, env, _ = pipeline
    dry = snakemake(work, "-n", "all", env=env)
    assert "Nothing to be done" in dry.stdout + dry.stderr
    (work / "results/tables/clean/foundation/accuracy.md").unlink()
    rebuild = snakemake(work, "results/tables/clean/foundation/accuracy.md", env=env)
    assert rebuild.returncode == 0, rebuild.stderr[-3000:]
    log = rebuild.stdout + rebuild.stderr
    assert "rule table:" in log or "localrule table:" in log
    assert "rule train:" not in log  # rebuilding a table runs no training
    # the same table under another configuration's folder (the demo's): one line naming the folder this one writes to
    misplaced = snakemake(work, "-n", "results/demo/tables/clean/foundation/accuracy.md", env=env)
    assert misplaced.returncode == 1
    assert ("fedrepro: results/demo/tables/clean/foundation/accuracy.md is not where this configuration (config/tiny.yaml) "
            "writes: it writes to results/; did you mean results/tables/clean/foundation/accuracy.md?") in misplaced.stderr
    assert "Traceback" not in misplaced.stderr and "Exception" not in misplaced.stderr


def test_the_report_is_one_page_of_what_is_built(pipeline):
    """`snakemake --cores 1 report` (README): one self-contained page that opens on the paper (what ran, the scorecard
    summary), then its tables rendered and its figures embedded, the rule graph last; Snakemake's own report of the
    `report` target carries that page."""
    work, env, _ = pipeline
    result = snakemake(work, "report", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    page = (work / "results/report.html").read_text()
    order = [page.index(h) for h in ("<h3>What ran</h3>", "<h3>Did the published numbers reproduce?</h3>",
                                     "<h3>Tables</h3>", "<h3>Figures</h3>", "alt='rule graph'")]
    assert order == sorted(order), order
    assert "<b>accuracy.</b>" in page and "<td>FedCLIP</td>" in page and "Not built yet" not in page
    assert "foundation (clean): " in page and "published numbers" in page
    assert page.count("src='data:image/png;base64,") >= 3            # two figures and the rule graph
    # issue 43: in a browser, the first screen answers what reproduced, what learned and what ran on stand-in data
    from browser import rendered

    state = rendered(work / "results/report.html", ARTEFACTS / "report-first-screen.png")
    summary = [t for t in state["tables"] if t["id"] == "summary"]
    assert summary and summary[0]["rows"] >= 1 and summary[0]["bottom"] <= state["viewport"], state["tables"]
    first = state["text"][:state["text"].index("What ran")]
    assert "did the published numbers reproduce?" in first and "did every method learn?" in first
    assert "stand-in" in first and "no verdict: stand-in data" in first       # the demo twin's data: no verdict
    rerun = snakemake(work, "-n", "report", env=env)
    assert "Nothing to be done" in rerun.stdout + rerun.stderr
    result = snakemake(work, "--report", "results/snakemake-report.html", "report", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (work / "results/snakemake-report.html").read_text()
    results = json.loads(re.search(r"var results = (\{.*?\});\s*</script>", report, re.S).group(1))
    assert list(results) == ["results/report.html"]
    html = base64.b64decode(results["results/report.html"]["data_uri"].split("base64,", 1)[1]).decode()
    assert "<h3>What ran</h3>" in html


def test_config_error_stops_before_any_job(tmp_path):
    work = copy_repo_skeleton(tmp_path)
    (work / "config/tiny.yaml").write_text(yaml.safe_dump({"papers": ["foundation"], "protocl": "paper"}))
    result = snakemake(work, "-n", "all")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "unknown key(s) ['protocl']" in output and "did you mean 'protocols'" in output
    assert "rule " not in output  # no job was scheduled
