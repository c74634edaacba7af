#!/usr/bin/env python3
"""What the provenance chain costs (docs/cluster-and-cache.md, "A result proves what it was made from"), on a
configuration whose results are built (default: the demo's, after `bash scripts/demo.sh`):

1. the report jobs' check of the runs they read (:func:`fedrepro.report.chain.problems`: the run manifest's own
   SHA-256, the digests of metrics.json, history.csv and predictions.npz, the config hash, the metrics computed
   again from predictions.npz): seconds per run, and summed over every table, figure and scorecard job of the
   configuration as each job reads its runs;
2. a training job's check of its inputs' records (:func:`fedrepro.records.verify` of its split, manifest, image or
   feature caches), per distinct input and summed over the configuration's runs;
3. what planning adds: the out-of-date check of every table's and scorecard's own record
   (:func:`fedrepro.report.chain.report_changed`) and the owner check of the results folder
   (:func:`fedrepro.dag.owner.claim`).

    python benchmarks/provenance.py                              # config/demo.yaml
    python benchmarks/provenance.py --configfile config/demo.yaml --repeats 5

Nothing is written (the owner check runs against the recorded owner). Timings are the best of ``--repeats``,
files in the page cache (as a job that reads them after the job that wrote them finds them), the digests a
process remembers forgotten before each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def best(fn, repeats: int) -> float:
    """The best of ``repeats`` calls, each without the digests a process remembers (a job is a fresh process)."""
    from fedrepro import io

    times = []
    for _ in range(repeats):
        io._DIGESTS.clear()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", nargs="+", default=["config/demo.yaml"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from fedrepro import paths, records
    from fedrepro.config import load_project
    from fedrepro.dag.owner import owner, replaced_runs
    from fedrepro.report import chain

    project = load_project(args.configfile)
    runs = [k for k in project.plan.runs() if Path(paths.run_file(k, "run_manifest.json")).is_file()]
    if not runs:
        sys.exit(f"no built runs under {paths.results_dir()}: build the configuration first")

    # 1. per run, then as the report jobs read them
    per_run = {k: best(lambda k=k: chain.problems(project, [k]), args.repeats) for k in runs}
    reads = []
    for protocol, paper, table in project.plan.tables():
        reads += project.plan.table_runs(paper, table, protocol)
    for protocol, paper, figure in project.plan.figures():
        reads += project.plan.figure_runs(paper, figure, protocol)
    reports = sum(per_run.get(k, 0.0) for k in reads)
    print(f"1. run check: {1e3 * sum(per_run.values()) / len(per_run):.1f} ms per run ({len(per_run)} runs, "
          f"max {1e3 * max(per_run.values()):.1f} ms); the table and figure jobs read {len(reads)} runs in all: "
          f"{reports:.2f} s")

    # 2. a training job's inputs
    inputs = {}
    for key in runs:
        run = project.resolver.run_config(key)
        for path in [run["paths"]["split"], run["paths"]["manifest"], run["paths"].get("features"),
                     *((run["paths"].get("images") or {}).values())]:
            if path and Path(path).is_file():
                inputs.setdefault(path, 0)
                inputs[path] += 1
    cost = {p: best(lambda p=p: records.verify(p), args.repeats) for p in inputs}
    trained = sum(cost[p] * n for p, n in inputs.items())
    print(f"2. input records: {len(cost)} distinct inputs, {1e3 * sum(cost.values()) / max(len(cost), 1):.1f} ms "
          f"each on average (max {1e3 * max(cost.values(), default=0):.1f} ms); over the {len(runs)} training jobs "
          f"{trained:.2f} s")

    # 3. planning
    targets = [paths.table(protocol, paper, table) for protocol, paper, table in project.plan.tables()]
    targets += [paths.scorecard(p) for p in [*project.papers, "all"]]
    planned = best(lambda: [chain.report_changed(t) for t in targets], args.repeats)
    owned = best(lambda: (owner(), replaced_runs(project)), args.repeats)
    print(f"3. planning: report records of {len(targets)} tables and scorecards {1e3 * planned:.1f} ms; the owner "
          f"check {1e3 * owned:.1f} ms (its run manifests read only when another configuration owns the folder)")


if __name__ == "__main__":
    main()
