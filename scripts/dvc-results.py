#!/usr/bin/env python3
"""Share pipeline outputs through DVC: push after a run, pull on a fresh clone.

    scripts/dvc-results.py push [--stages S ...] [--force] [-- SNAKEMAKE_ARGS ...]
    scripts/dvc-results.py pull [--stages S ...] [-- SNAKEMAKE_ARGS ...]

SNAKEMAKE_ARGS are the arguments the results were built with (e.g. ``--configfile config/demo.yaml``)
and optional targets (default ``all``); both commands use them to ask Snakemake what is up to date.

push   checks that Snakemake has nothing left to do (else it refuses, unless --force), records the
       outputs of every stage in dvc.yaml that exists (or of --stages) in dvc.lock, uploads them to
       the default DVC remote, and commits dvc.lock (only that file) to git. `git push` shares it.
pull   downloads the stages (default: manifests, splits, runs, tables, figures; no raw data, weights,
       feature caches or checkpoints), checks that the workspace now matches dvc.lock, then lets Snakemake
       re-order modification times (``snakemake --touch``). DVC does not keep mtimes, so without
       this step Snakemake would see inputs newer than outputs and rerun them. The touch is done
       only when DVC confirms the files are exactly the pushed ones; afterwards ``snakemake -n``
       reports nothing to do and a table rebuilds from the pulled metrics without training.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

DEFAULT_PULL = ("manifests", "splits", "runs", "embeddings", "tables", "figures", "scorecards")
NOTHING_TO_DO = "Nothing to be done"


class Failure(RuntimeError):
    pass


def run(cmd: list[str], *, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    proc = subprocess.run(cmd, text=True, capture_output=capture, env=env)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip() if capture else ""
        raise Failure(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}" + (f":\n{detail}" if detail else ""))
    return proc


def stage_outputs(root: Path) -> dict[str, list[str]]:
    """stage name -> its output paths, as declared in dvc.yaml."""
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text())
    out = {}
    for name, stage in dvc_yaml["stages"].items():
        out[name] = [next(iter(o)) if isinstance(o, dict) else o for o in stage.get("outs", [])]
    return out


def check_stages(requested: list[str], known: dict[str, list[str]]) -> None:
    unknown = [s for s in requested if s not in known]
    if unknown:
        raise Failure(f"unknown DVC stage(s) {unknown}; dvc.yaml has: {sorted(known)}")


def pending_jobs(snakemake_args: list[str]) -> int:
    """How many jobs Snakemake would run (0 = everything requested is present and up to date)."""
    proc = run(["snakemake", "--dry-run", "--cores", "1", *snakemake_args], capture=True)
    text = proc.stdout + proc.stderr
    if NOTHING_TO_DO in text:
        return 0
    match = re.search(r"^total\s+(\d+)\s*$", text, flags=re.MULTILINE)
    if not match:
        raise Failure(f"could not read Snakemake's dry run:\n{text[-2000:]}")
    return int(match.group(1))


def push(args, root: Path) -> None:
    known = stage_outputs(root)
    check_stages(args.stages or [], known)
    pending = pending_jobs(args.snakemake)
    if pending and not args.force:
        raise Failure(f"Snakemake still has {pending} job(s) to run for {args.snakemake or ['all']}: "
                      f"pushing now would share results that are out of date. Finish the run, or pass "
                      f"--force to push what exists.")
    stages = args.stages or [s for s, outs in known.items() if all((root / o).exists() for o in outs)]
    missing = [s for s in stages if not all((root / o).exists() for o in known[s])]
    if missing:
        raise Failure(f"nothing to push for stage(s) {missing}: {[known[s] for s in missing]} do not exist")
    if not stages:
        raise Failure("no stage of dvc.yaml has outputs yet; run the pipeline first")
    run(["dvc", "commit", "--force", "--quiet", *stages])
    run(["dvc", "push", *stages])
    run(["git", "add", "dvc.lock"])
    if run(["git", "diff", "--cached", "--quiet", "--", "dvc.lock"], check=False).returncode:
        run(["git", "commit", "--quiet", "-m", f"Results: {', '.join(stages)} (dvc.lock)", "--", "dvc.lock"])
        print("dvc.lock committed; `git push` it so that others can pull these results.", file=sys.stderr)
    else:
        print("dvc.lock unchanged: these results were already recorded.", file=sys.stderr)


def pull(args, root: Path) -> None:
    known = stage_outputs(root)
    stages = args.stages or list(DEFAULT_PULL)
    check_stages(stages, known)
    lock_path = root / "dvc.lock"
    locked = (yaml.safe_load(lock_path.read_text()) or {}).get("stages", {}) if lock_path.exists() else {}
    absent = [s for s in stages if s not in locked]
    if absent:
        if args.stages:
            raise Failure(f"stage(s) {absent} were never pushed (not in dvc.lock)")
        print(f"not in dvc.lock (never pushed), skipped: {absent}", file=sys.stderr)
        stages = [s for s in stages if s in locked]
    if not stages:
        raise Failure("dvc.lock records no results to pull; push some first (scripts/dvc-results.py push)")
    run(["dvc", "pull", *stages])
    status = json.loads(run(["dvc", "status", "--json", *stages], capture=True).stdout or "{}")
    if status:
        raise Failure(f"after the pull the workspace still differs from dvc.lock, so modification times are "
                      f"left alone (touching would hide real changes):\n{json.dumps(status, indent=2)}")
    run(["snakemake", "--touch", "--cores", "1", *args.snakemake])
    pending = pending_jobs(args.snakemake)
    print(f"pulled {', '.join(stages)}; Snakemake has "
          + ("nothing to do." if not pending else f"{pending} job(s) to run (outputs that were not pushed)."),
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    snakemake_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, snakemake_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("action", choices=("push", "pull"))
    parser.add_argument("--stages", nargs="+", metavar="STAGE", help="stages of dvc.yaml (default: see above)")
    parser.add_argument("--force", action="store_true", help="push even if Snakemake has jobs left to run")
    args = parser.parse_args(argv)
    args.snakemake = snakemake_args
    root = Path(run(["git", "rev-parse", "--show-toplevel"], capture=True).stdout.strip())
    os.chdir(root)
    try:
        (push if args.action == "push" else pull)(args, root)
    except Failure as error:
        print(f"dvc-results: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
