#!/usr/bin/env python3
"""How big is the full grid, how long does Snakemake take to plan it, and how many SLURM jobs does it submit?

    python benchmarks/dag_scale.py                 # every paper in config/papers, seeds 0-4
    python benchmarks/dag_scale.py --papers facmic fediic --seeds 3
    python benchmarks/dag_scale.py --synthetic 2000   # plus a synthetic grid of ~2000 runs (scaling)

It writes its table, dated, into docs/cluster-and-cache.md ("Scale", between the ``scale`` markers;
``--no-markdown`` leaves the docs alone); tests/test_doc_numbers.py checks its run counts against the plan.

For the chosen papers it prints, per paper and for all of them together:
- runs (train jobs) and all jobs of ``snakemake -n all``;
- SLURM jobs with and without grouping: every job that is not a local rule is one sbatch call
  without grouping; with the profile's ``group-components`` (workflow/profiles/slurm/config.yaml),
  the jobs of a group are packed into one SLURM job per that many. The counts come from Snakemake's
  own DAG (groups formed exactly as the SLURM executor forms them), not from arithmetic;
- the time ``snakemake -n all`` takes to plan the grid, median of ``--repeat`` runs (wall and CPU
  seconds; run with ``--forceall`` so that outputs already in this checkout do not shrink the plan,
  which is what a fresh checkout plans). Target: < 20 s.

Counting uses Snakemake internals (``Workflow._build_dag``, ``DAG.get_jobs_or_groups``) of the
pinned Snakemake 9; it is a measurement script, not part of the pipeline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "workflow/profiles/slurm/config.yaml"


# --------------------------------------------------------------------------------------------
# one measurement (runs in a child process: Snakemake's workflow state is global)

def count_jobs(configfiles: list[str], group_components: dict[str, int]) -> dict:
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        GroupSettings,
        OutputSettings,
        Quietness,
        RemoteExecutionSettings,
        ResourceSettings,
    )
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    cores = yaml.safe_load(PROFILE.read_text()).get("cores", 1)
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wapi = api.workflow(resource_settings=ResourceSettings(cores=cores, nodes=10**6),
                            config_settings=ConfigSettings(configfiles=[Path(c) for c in configfiles]),
                            snakefile=Path("Snakefile"))
        workflow = wapi._get_workflow(group_settings=GroupSettings(group_components=group_components))
        wapi._workflow_store = workflow
        # groups and local rules behave as under the SLURM executor
        workflow._executor_plugin = ExecutorPluginRegistry().get_plugin("slurm")
        workflow.execution_settings = ExecutionSettings()
        workflow.remote_execution_settings = RemoteExecutionSettings()
        workflow.include(wapi.snakefile, overwrite_default_target=True, print_compilation=False)
        workflow.check()
        workflow.dag_settings = DAGSettings(targets={"all"}, forceall=True)
        workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True)
        workflow._build_dag()
        workflow.async_run(workflow.dag.postprocess(update_needrun=False))
        by_rule, submitted, local = Counter(), Counter(), 0
        for item in workflow.dag.get_jobs_or_groups():
            if item.is_group():
                submitted[f"group {item.groupid}"] += 1
                for job in item.jobs:
                    by_rule[job.rule.name] += 1
            else:
                by_rule[item.rule.name] += 1
                if workflow.is_local(item.rule):
                    local += 1
                else:
                    submitted[item.rule.name] += 1
    return {"by_rule": dict(by_rule), "submitted": dict(submitted), "local": local}


# --------------------------------------------------------------------------------------------
# the driver

def write_config(folder: Path, papers: list[str], seeds: int, paper_dir: str = "config/papers") -> Path:
    path = folder / f"bench-{'-'.join(papers)}.yaml"
    path.write_text(yaml.safe_dump({"papers": papers, "paper_dir": paper_dir, "seeds": list(range(seeds))}))
    return path


def synthetic_paper(folder: Path, runs: int, seeds: int) -> Path:
    """A paper grid with about ``runs`` runs, built from the foundation paper: many Dirichlet settings
    x method variants (half on cached features, half on images), one table over all of them."""
    base = yaml.safe_load((ROOT / "config/papers/foundation.yaml").read_text())
    cells = max(1, runs // seeds)
    n_settings = max(1, int(math.sqrt(cells / 2)))
    n_variants = max(1, math.ceil(cells / n_settings / 2))
    template = base["settings"]["bt_a0.3"]
    settings = {}
    for i in range(n_settings):
        setting = json.loads(json.dumps(template))
        setting["split"]["alpha"] = round(0.05 + 0.05 * i, 3)
        setting["label"] = f"alpha {setting['split']['alpha']}"
        settings[f"bt_s{i}"] = setting
    methods = {}
    for j in range(n_variants):
        methods[f"fedclip_v{j}"] = {"method": "fedclip", "label": f"FedCLIP v{j}",
                                    "train": {"optimizer": {"lr": 1e-5 * (j + 1)}}}
        methods[f"fedavg_v{j}"] = {**base["methods"]["fedavg"], "method": "fedavg", "label": f"FedAvg v{j}"}
    paper = {**base, "settings": settings, "methods": methods, "figures": {},
             "tables": {"grid": {"title": "synthetic", "metric": "acc", "eval": "global",
                                 "rows": [{"method": m} for m in methods],
                                 "columns": [{"label": s, "setting": s} for s in settings]}}}
    out = folder / "synthetic"
    out.mkdir()
    (out / "foundation.yaml").write_text(yaml.safe_dump(paper, sort_keys=False))
    return out


def child(args: list[str], cwd: Path, env: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--_count", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"counting failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dry_run_seconds(configfile: Path, cwd: Path, env: dict, repeat: int) -> tuple[float, float, int]:
    """-> (median wall seconds, median CPU seconds, jobs planned) of `snakemake -n all`. CPU time is
    reported too because this machine is shared: wall time grows with everyone else's load."""
    walls, cpus, total = [], [], 0
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "snakemake", "all", "--dry-run", "--forceall", "--configfile", str(configfile)],
                              cwd=cwd, env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"snakemake -n failed:\n{proc.stderr[-3000:]}")
        for line in proc.stdout.splitlines():
            if line.startswith("total"):
                total = int(line.split()[1])
    return statistics.median(walls), statistics.median(cpus), total


def measure(label: str, configfile: Path, cwd: Path, env: dict, grouping: dict, repeat: int) -> dict:
    cfg = ["config/config.yaml", str(configfile)]
    flat = child([json.dumps({"configfiles": cfg, "group_components": {}})], cwd, env)
    grouped = child([json.dumps({"configfiles": cfg, "group_components": grouping})], cwd, env)
    wall, cpu, total = dry_run_seconds(configfile, cwd, env, repeat) if repeat else (float("nan"), float("nan"), 0)
    return {"label": label, "runs": flat["by_rule"].get("train", 0), "jobs": sum(flat["by_rule"].values()),
            "dry_run_jobs": total, "local": flat["local"],
            "slurm_flat": sum(flat["submitted"].values()), "slurm_grouped": sum(grouped["submitted"].values()),
            "grouped_detail": grouped["submitted"], "dag_s": wall, "dag_cpu_s": cpu}


def markdown_table(rows: list[dict], seeds: int) -> str:
    lines = [f"| grid ({seeds} seeds) | runs | jobs | SLURM jobs, no grouping | SLURM jobs, grouped | `snakemake -n all` wall / CPU |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        bold = "**" if r["label"] == "all papers" else ""
        dag = "" if math.isnan(r["dag_s"]) else f"{bold}{r['dag_s']:.1f} s / {r['dag_cpu_s']:.1f} s{bold}"
        cells = [f"{bold}{r[k]:,}{bold}" for k in ("runs", "jobs", "slurm_flat", "slurm_grouped")]
        lines.append(f"| {bold}{r['label']}{bold} | " + " | ".join(cells) + f" | {dag} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_count":
        spec = json.loads(sys.argv[2])
        print(json.dumps(count_jobs(spec["configfiles"], spec["group_components"])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--papers", nargs="+", help="default: every config/papers/*.yaml")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--synthetic", type=int, default=0, metavar="RUNS", help="also time a synthetic grid of ~RUNS runs")
    parser.add_argument("--repeat", type=int, default=3, help="dry runs to time per grid (median)")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs/cluster-and-cache.md")
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]

    papers = args.papers or sorted(p.stem for p in (ROOT / "config/papers").glob("*.yaml"))
    grouping = {k: int(v) for k, v in (yaml.safe_load(PROFILE.read_text()).get("group-components") or {}).items()}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    rows = []
    with tempfile.TemporaryDirectory(prefix="dag_scale_") as tmp:
        configs = Path(tmp)
        if len(papers) > 1:
            for paper in papers:
                rows.append(measure(paper, write_config(configs, [paper], args.seeds), ROOT, env, grouping, 0))
        rows.append(measure("all papers" if len(papers) > 1 else papers[0],
                            write_config(configs, papers, args.seeds), ROOT, env, grouping, args.repeat))
        if args.synthetic:
            folder = synthetic_paper(configs, args.synthetic, args.seeds)
            rows.append(measure(f"synthetic (~{args.synthetic} runs)",
                                write_config(configs, ["foundation"], args.seeds, str(folder)), ROOT, env, grouping,
                                args.repeat))

    print(f"papers: {', '.join(papers)}; seeds: {args.seeds}; group-components: {grouping}")
    print(f"load average at start: {load:.1f} on {os.cpu_count()} CPUs (wall times grow with the machine's load)")
    print(f"{'grid':<26}{'runs':>7}{'jobs':>8}{'local':>7}{'SLURM jobs':>12}{'grouped':>9}{'snakemake -n (wall / CPU)':>28}")
    for r in rows:
        dag = "" if math.isnan(r["dag_s"]) else f"{r['dag_s']:.1f} s / {r['dag_cpu_s']:.1f} s"
        print(f"{r['label']:<26}{r['runs']:>7}{r['jobs']:>8}{r['local']:>7}{r['slurm_flat']:>12}{r['slurm_grouped']:>9}{dag:>28}")
    for r in rows:
        if r["dry_run_jobs"] and r["dry_run_jobs"] != r["jobs"]:
            print(f"note: {r['label']}: snakemake -n planned {r['dry_run_jobs']} jobs, the DAG has {r['jobs']}")
    print("grouped SLURM jobs of the last grid by kind:", json.dumps(rows[-1]["grouped_detail"], sort_keys=True))
    if not args.no_markdown:
        from docblock import replace_block

        header = (f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} CPUs (load average {load:.1f} at the start; wall "
                  f"time grows with the machine's load, CPU time does not), every paper of config/papers, seeds "
                  f"0-{args.seeds - 1}, group-components {grouping}: `python benchmarks/dag_scale.py"
                  + (f" --synthetic {args.synthetic}" if args.synthetic else "") + "`.")
        replace_block(args.markdown, "scale", f"{header}\n\n{markdown_table(rows, args.seeds)}")
        print(f"written to {args.markdown}")


if __name__ == "__main__":
    main()
