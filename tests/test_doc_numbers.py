"""The numbers the docs quote are the ones the commands give (issue 34, item 5): counts of the configurations from
their plan, the Scale table's runs from the plan at 5 seeds, the cluster table's rules and resources from the
workflow, and docs/demo.md's measured means from the demo's own results where a demo has run here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.config import load_project

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import demo_numbers  # noqa: E402
from docblock import block_of  # noqa: E402


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_readme_counts_are_what_fedrepro_validate_prints(capsys):
    from fedrepro.cli import main

    main(["validate"])
    printed = capsys.readouterr().out
    counts = {name: int(n) for n, name in re.findall(r"(\d+) (runs|tables|figures|downstream evaluations|pretrained)", printed)}
    readme = " ".join((REPO / "README.md").read_text().split())
    quoted = re.search(r"the full grid: ([\d,]+) runs with the default (\d+) seeds, (\d+) tables, (\d+) figures, "
                       r"([\d,]+) downstream evaluations", readme)
    assert quoted, "README no longer quotes what `fedrepro validate` counts"
    assert [number(g) for g in quoted.groups()] == [counts["runs"], len(load_project().seeds), counts["tables"],
                                                   counts["figures"], counts["downstream evaluations"]], printed
    weights = re.search(r"fetch all of it \(the full grid: (\d+) resources", readme)
    assert weights and int(weights.group(1)) == counts["pretrained"], printed
    cluster = " ".join((REPO / "docs/cluster-and-cache.md").read_text().split())
    assert f"the full grid's FedDRA has {counts['downstream evaluations']} with 3 seeds" in cluster


def test_the_demo_and_evidence_counts_are_their_plans():
    demo = load_project(["config/demo.yaml"])
    text = " ".join((REPO / "docs/demo.md").read_text().split())
    assert f"3 seeds: {len(demo.plan.runs())} training runs" in text
    assert len(demo.seeds) == 3
    evidence = load_project(["config/evidence.yaml"])
    variants = {(k.paper, k.method) for k in evidence.plan.runs()}
    assert f"every method variant of the full grid ({len(variants)}), 3 seeds: {len(evidence.plan.runs())} training runs" in text
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"Every method variant of the full grid ({len(variants)} of them" in readme
    load_project()          # the default configuration's results folder again


def test_the_scale_table_counts_the_plan_at_five_seeds():
    """docs/cluster-and-cache.md "Scale" is what benchmarks/dag_scale.py wrote (dated, with its command); its runs
    column is the plan of each paper with seeds 0-4 (the SLURM columns need Snakemake's DAG: the script's)."""
    block = block_of((REPO / "docs/cluster-and-cache.md").read_text(), "scale")
    assert block and "`python benchmarks/dag_scale.py" in block and re.search(r"Measured \d{4}-\d\d-\d\d", block), block
    rows = {cells[0].strip("* "): number(cells[1].strip("* "))
            for cells in (line.strip("|").split("|") for line in block.splitlines() if line.startswith("| "))
            if cells[1].strip("* ").replace(",", "").isdigit()}
    papers = sorted(p.stem for p in (REPO / "config/papers").glob("*.yaml"))
    expected = {p: len(load_project(None, {"papers": [p], "seeds": list(range(5))}).plan.runs()) for p in papers}
    expected["all papers"] = sum(expected.values())
    assert {p: rows.get(p) for p in expected} == expected
    load_project()


def rules_of_the_workflow() -> dict[str, dict]:
    """Every rule of workflow/rules/*.smk: local or not, its group, threads and per-attempt base resources (a runtime
    from a GPU's measured rate: the value it asks for without one, fedrepro.cost.runtime.FALLBACK_RUNTIME)."""
    from fedrepro.cost.runtime import FALLBACK_RUNTIME

    rules, local = {}, set()
    for smk in sorted((REPO / "workflow/rules").glob("*.smk")):
        text = smk.read_text()
        for block in re.findall(r"^localrules:\n((?:    \w+,?\n)+)", text, re.M):
            local |= set(re.findall(r"\w+", block))
        for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text, re.M | re.S):
            resources = dict(re.findall(r"^        (\w+)=per_attempt\((\d+)\)", body, re.M))
            if re.search(r"^        runtime=", body, re.M) and "runtime" not in resources and name in FALLBACK_RUNTIME:
                resources["runtime"] = FALLBACK_RUNTIME[name]      # from a measured rate, this without one
            rules[name] = {"mem_mb": resources.get("mem_mb"), "runtime": resources.get("runtime"),
                           "gpu": bool(re.search(r"^        gpu=1,", body, re.M)),
                           "group": re.search(r"^    group:\n        \"?(\w+)", body, re.M),
                           "threads": re.search(r"^    threads: (\d+)", body, re.M)}
    for name in local:
        rules[name]["local"] = True
    return rules


def test_where_jobs_run_lists_every_rule_with_its_resources():
    """docs/cluster-and-cache.md "Where jobs run": every rule but `all`, local ones on the login node, the others with
    the resources the rule asks for (or the profile's default-resources where it asks for none)."""
    import yaml

    text = (REPO / "docs/cluster-and-cache.md").read_text()
    table = text[text.index("| rule | where | resources"):]
    table = table[:table.index("\n\n")]
    rows = {}
    for line in table.splitlines()[2:]:
        first, where, resources = (c.strip() for c in line.strip("|").split("|"))
        for name in re.findall(r"`(\w+)`", first):
            rows.setdefault(name, []).append((where, resources))
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())["default-resources"]
    rules = rules_of_the_workflow()
    assert set(rows) == set(rules) - {"all"}, (set(rows) ^ (set(rules) - {"all"}))
    for name, rule in rules.items():
        for where, resources in rows.get(name, []):
            if rule.get("local"):
                assert "login node" in where and "localrules" in where, name
                continue
            assert where.startswith("SLURM"), name
            assert ("1 GPU" in where) == rule["gpu"] or name == "train", name           # train: per run
            if rule["group"] and rule["group"].group(1) != "train_group":
                assert f"grouped (`{rule['group'].group(1)}`)" in where, name
            if rule["threads"]:
                assert f"{rule['threads'].group(1)} threads" in where, name
            if name == "train":
                continue                                # two rows: image runs and runs on cached features
            mem = rule["mem_mb"] or profile["mem_mb"]
            runtime = rule["runtime"] or profile["runtime"]
            if mem:
                assert f"{int(mem) / 1000:g} GB" in resources, (name, resources)
            if runtime:
                assert f"{runtime} min" in resources, (name, resources)
            if not rule["mem_mb"]:
                assert "default-resources" in resources, name


# --------------------------------------------------------------------------------------------
# docs/demo.md's measured means

def scores(project, value: dict) -> pd.DataFrame:
    rows = []
    for key in project.plan.runs():
        chance, task = (1 / 16, "retrieval") if key.paper == "feddra" else (0.1, "classification")
        v = value.get((key.paper, key.method), 0.5)
        rows.append({"paper": key.paper, "protocol": key.protocol, "setting": key.setting, "method": key.method,
                     "seed": key.seed, "task": task, "metric": "m", "value": v, "chance": chance,
                     "threshold": 3 * chance if task == "retrieval" else chance + 0.25, "explanation": "", "paper_metric": "", "paper_value": float("nan"),
                     "passed": v >= (3 * chance if task == "retrieval" else chance + 0.25)})
    return pd.DataFrame(rows)


def test_the_demo_block_is_rendered_from_the_bar_of_a_demo_run():
    demo = load_project(["config/demo.yaml"])
    block = demo_numbers.render(demo, scores(demo, {("facmic", "facmic_no_da"): 0.606, ("feddra", "fedavg"): 0.241}), "D")
    lines = block.splitlines()
    assert lines[0].startswith("Measured D: `bash scripts/demo.sh`, then `python benchmarks/demo_numbers.py`")
    assert "**17 of the 17 (setting, method) rows clear the bar with every seed.**" in lines[0]
    facmic = next(line for line in lines if line.startswith("| FACMIC (10 classes; 35% BACC) |"))
    assert "FACMIC w/o L_DA 60.6" in facmic and "FACMIC (paper protocol) 50.0" in facmic
    assert "| FedDRA (retrieval, pool 16; 18.8% R@1) | FedAvg (ConVIRT) 24.1, FedDRA (ConVIRT) 50.0 |" in lines
    load_project()


def test_docs_demo_quotes_what_this_checkouts_demo_measured():
    """Where a demo has run in this checkout (the integrator's), docs/demo.md's block is what benchmarks/demo_numbers.py
    writes from its results, apart from the first line's date and provenance."""
    from fedrepro import paths

    load_project(["config/demo.yaml"])           # its results folder
    bar = Path(paths.evidence("bar.csv"))
    load_project()
    if not bar.exists():
        pytest.skip(f"no demo results here ({bar}): run bash scripts/demo.sh")
    documented = block_of((REPO / "docs/demo.md").read_text(), demo_numbers.BLOCK)
    generated = demo_numbers.block_from_results(["config/demo.yaml"])
    table = [line for line in generated.splitlines() if line.startswith("|")]
    assert [line for line in documented.splitlines() if line.startswith("|")] == table, (
        "docs/demo.md's measured means differ from this checkout's demo: python benchmarks/demo_numbers.py")


@pytest.mark.slow
def test_the_demo_dag_has_the_jobs_the_docs_say():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--forceall", "--configfile=config/demo.yaml", "all"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    total = re.search(r"^total\s+(\d+)", proc.stdout, re.M)
    assert total, proc.stdout[-2000:] + proc.stderr[-2000:]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"{total.group(1)} jobs — the five papers' DAGs" in readme
    assert f"the DAG of {total.group(1)} jobs" in " ".join((REPO / "docs/demo.md").read_text().split())
