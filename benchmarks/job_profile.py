#!/usr/bin/env python3
"""Where a training job's time goes, per model family: start-up, inputs, model build, local training, a method's
own extra passes (FedDRA's client risks, FedIIC's difficulty pass), aggregation, evaluation, checkpoints, outputs.

    python benchmarks/job_profile.py                       # one run of every model family of the evidence run
    python benchmarks/job_profile.py --runs feddra/ev_mimic/feddra_convirt fediic/ev_isic/fediic
    python benchmarks/job_profile.py --json before.json    # keep the figures, to compare with a later measurement

Each job is the pipeline's own `fedrepro train` command, run as a fresh process (as a SLURM job starts: no
fork-server) after Snakemake has built its inputs (`--omit-from train`), into a scratch folder: nothing of the
configuration's results is written. The phases are what the job itself recorded (its run manifest's
``timings.phases``; fedrepro.timing): exclusive seconds, so they add up; "start-up" is the process's life before the
job's code ran (interpreter and imports), "other" the rest of the wall time (broadcasts, logging, the manifest).
A cluster pays each of these seconds once per run of the grid: `fedrepro estimate` counts the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# the columns, in the order a job runs them; a method's own passes go where they run (inside aggregation or broadcast)
PHASES = ("imports", "inputs", "model build", "local training", "client risks", "difficulty pass", "aggregation", "evaluation",
          "checkpoint", "outputs")


def one_run_per_family(project, seed: int) -> list:
    """The first run (in the plan's order) of every model family the configuration trains."""
    chosen = {}
    for key in project.plan.runs():
        if key.seed != seed:
            continue
        family = project.resolver.run_config(key)["train"]["model"]["family"]
        chosen.setdefault(family, key)
    return list(chosen.values())


def build_inputs(configfiles: list[str], targets: list[str], cores: int) -> None:
    """Everything the runs read (data, splits, caches, weights), through the workflow, without training them."""
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(cores), "--quiet", "rules", "--omit-from", "train",
                    "--configfile", *configfiles, "--", *targets], cwd=ROOT, check=True)


def profile(run: dict, scratch: Path) -> dict:
    """Run one job in a fresh process; its wall time from outside and the phases it recorded."""
    out, ckpt = scratch / "out", scratch / "ckpt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "FEDREPRO_CPUS": str(run["threads"] or 1)}
    env.pop("FEDREPRO_FORKSERVER", None)
    start = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("fedrepro")), "train", "--run", json.dumps(run), "--out", str(out), "--checkpoint-dir",
                           str(ckpt)], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{run['paper']}/{run['setting']}/{run['method']}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    timings = json.loads((out / "run_manifest.json").read_text())["timings"]
    phases = timings.get("phases", {})
    startup = timings.get("startup_s") or max(0.0, wall - timings["wall_s"])
    row = {"run": f"{run['paper']}/{run['setting']}/{run['method']}", "family": run["train"]["model"]["family"],
           "rounds": run["train"]["rounds"], "wall": wall, "cpu": timings.get("cpu_s")}
    # wall: start-up (interpreter, imports), the phases, the rest; CPU: the process's time, start-up within "other"
    wall_parts = {name: seconds["wall_s"] for name, seconds in phases.items()}
    row["wall_phases"] = {"start-up": startup, **wall_parts, "other": max(0.0, wall - startup - sum(wall_parts.values()))}
    cpu_parts = {name: seconds["cpu_s"] for name, seconds in phases.items()}
    row["cpu_phases"] = {**cpu_parts, "other": max(0.0, (row["cpu"] or 0.0) - sum(cpu_parts.values()))}
    return row


def table(rows: list[dict], clock: str) -> str:
    """One row per job: its total (wall and CPU) and the seconds of each phase on ``clock``."""
    key = clock + "_phases"
    names = [p for p in ("start-up", *PHASES, "other") if any(r[key].get(p) is not None for r in rows)]
    head = "| family | run | rounds | wall | CPU | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (5 + len(names))]
    for r in rows:
        cells = [f"{r[key][c]:.1f}" if r[key].get(c) is not None else "" for c in names]
        cpu = f"{r['cpu']:.1f}" if r["cpu"] is not None else ""
        lines.append(f"| {r['family']} | {r['run']} | {r['rounds']} | {r['wall']:.1f} | {cpu} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfiles", nargs="+", default=["config/evidence.yaml"])
    parser.add_argument("--runs", nargs="*", metavar="PAPER/SETTING/METHOD", help="default: one per model family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", type=int, default=2, help="for building the inputs (default 2)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="the phases in CPU seconds (default: a machine shared with other work inflates them far "
                             "less than wall seconds) or in wall seconds")
    parser.add_argument("--json", metavar="FILE", help="also write the rows here")
    args = parser.parse_args()

    from fedrepro.config import load_project

    project = load_project([ROOT / f for f in args.configfiles], root=ROOT)
    if args.runs:
        wanted = {tuple(r.split("/")) for r in args.runs}
        keys = [k for k in project.plan.runs() if (k.paper, k.setting, k.method) in wanted and k.seed == args.seed]
        missing = wanted - {(k.paper, k.setting, k.method) for k in keys}
        if missing:
            raise SystemExit(f"no such run(s) with seed {args.seed} in {args.configfiles}: {sorted(missing)}")
    else:
        keys = one_run_per_family(project, args.seed)
    runs = [project.resolver.run_config(k) for k in keys]
    build_inputs(args.configfiles, [r["paths"]["out"] + "/metrics.json" for r in runs], args.cores)
    rows = []
    for run in runs:
        with tempfile.TemporaryDirectory(prefix="job-profile-") as scratch:
            rows.append(profile(run, Path(scratch)))
        print(f"  {rows[-1]['run']}: {rows[-1]['wall']:.1f} s", file=sys.stderr)
    print(f"Seconds per phase ({args.clock}) of one training job, a fresh process, torch threads {runs[0]['threads']}, "
          f"{os.cpu_count()} CPUs ({time.strftime('%Y-%m-%d')}):\n")
    print(table(rows, args.clock))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
