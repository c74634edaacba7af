#!/usr/bin/env python3
"""Share pipeline outputs through DVC: push after a run, pull on a fresh clone.

    scripts/dvc-results.py push [--stages S ...] [--force] [-- SNAKEMAKE_ARGS ...]
    scripts/dvc-results.py pull [--stages S ...] [-- SNAKEMAKE_ARGS ...]

SNAKEMAKE_ARGS are the arguments the results were built with (e.g. ``--configfile config/demo.yaml``)
and optional targets (default ``all``); both commands use them to ask Snakemake what is up to date.

push   checks that Snakemake has nothing left to do (else it refuses, unless --force), records the
       outputs of every stage in dvc.yaml that exists (or of --stages) in dvc.lock, uploads them to
       the default DVC remote, and commits dvc.lock (only that file) to git. `git push` shares it.
       Data of the datasets themselves is never pushed unless --stages names its stage: raw data
       (``raw``), the decode-once pixel caches made from it (``images``) and the manifests (``manifests``:
       per-image metadata, and MIMIC-CXR's report text in its ``caption`` column). Credentialed datasets
       (MIMIC-CXR, BRSET, mBRSET, EyePACS, ...) may not be redistributed under their data use agreements.
pull   downloads the stages (default: manifests if they were pushed, splits, runs, downstream results, embeddings,
       tables, figures, scorecards, the evidence page; no raw data, weights, image or feature caches, or checkpoints:
       nothing a table, figure, scorecard or the report is made of is left behind) into DVC's cache,
       checks every downloaded file against its MD5 in dvc.lock before it touches the workspace (a bad copy in
       the local cache, which DVC takes as fetched, is downloaded again; one that is still bad, a corrupt copy
       on the remote, is refused by name), puts them in place, checks that the workspace now matches
       dvc.lock, then lets Snakemake re-order modification times (``snakemake --touch``). DVC does not keep
       mtimes, so without this step Snakemake would see inputs newer than outputs and rerun them.
       Afterwards ``snakemake -n`` reports nothing to do, every table, figure and scorecard rebuilds from the
       pulled files without training, downstream, download or feature jobs, and ``snakemake --report`` builds.

Both refuse a configuration whose ``results_dir`` is not the folder dvc.yaml's stages hold (``results``, the full
grid's): the demo and the evidence run keep their results in their own folders, so a push never carries them. To try
the round trip with the demo, add the overlay ``config/dvc-overlay.yaml`` (``results_dir: results``) after its config
file, in a clone made for trying (README, "Sharing results with DVC").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

DEFAULT_PULL = ("manifests", "splits", "runs", "downstream", "embeddings", "tables", "figures", "scorecards", "evidence")
# pushed only when --stages names them (-> why): the datasets' own data, which credentialed datasets' data use
# agreements forbid redistributing, must not leave the machine by default
PUSHED_ONLY_BY_NAME = {
    "raw": "raw data",
    "images": "pixel caches of the raw images",
    "manifests": "per-image metadata, with MIMIC-CXR's report text (caption column)",
}
NOTHING_TO_DO = "Nothing to be done"
OVERLAY = "config/dvc-overlay.yaml"     # results_dir: results, for trying the round trip with the demo


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


def config_files(snakemake_args: list[str]) -> list[str]:
    """The files after ``--configfile``/``--configfiles`` in SNAKEMAKE_ARGS (``--configfile=a`` or ``--configfile a b``)."""
    files, i = [], 0
    while i < len(snakemake_args):
        word = snakemake_args[i]
        name, eq, value = word.partition("=")
        if name in ("--configfile", "--configfiles"):
            if eq:
                files.append(value)
            else:
                while i + 1 < len(snakemake_args) and not snakemake_args[i + 1].startswith("-"):
                    i += 1
                    files.append(snakemake_args[i])
        i += 1
    return files


def check_results_dir(root: Path, snakemake_args: list[str], known: dict[str, list[str]]) -> None:
    """Refuse a configuration whose results are not where dvc.yaml's results stages are. The Snakefile reads
    config/config.yaml, then the --configfile files (later ones win); only ``results_dir`` matters here."""
    from fedrepro.targets import swallowed_message

    swallowed = swallowed_message(snakemake_args)          # `--configfile a.yaml all`: `all` read as a config file
    if swallowed:
        raise Failure(swallowed.removeprefix("fedrepro: "))
    files = ["config/config.yaml", *config_files(snakemake_args)]
    folder = "results"
    for name in files:
        path = root / name if not Path(name).is_absolute() else Path(name)
        try:
            folder = (yaml.safe_load(path.read_text()) or {}).get("results_dir", folder)
        except (OSError, yaml.YAMLError) as error:
            raise Failure(f"cannot read the config file {name}: {error}") from None
    shared = str(Path(known["runs"][0]).parent)
    if Path(folder) != Path(shared):
        given = " ".join(files[1:])
        raise Failure(f"this configuration ({given}) keeps its results in {folder}/ (its results_dir), which "
                      f"no stage of dvc.yaml holds: the stages share {shared}/, the full grid's results "
                      f"(config/config.yaml). The demo and the evidence run have their own folders so that a push of "
                      f"real results never carries them. To try the round trip with them anyway, in a clone made for "
                      f"trying, build and push with the overlay {OVERLAY} after the config files (results_dir: "
                      f"{shared}): snakemake --cores 2 all --configfile {given} {OVERLAY}, then scripts/dvc-results.py "
                      f"push -- --configfile {given} {OVERLAY} (README, \"Sharing results with DVC\").")


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
    check_results_dir(root, args.snakemake, known)
    pending = pending_jobs(args.snakemake)
    if pending and not args.force:
        raise Failure(f"Snakemake still has {pending} job(s) to run for {args.snakemake or ['all']}: "
                      f"pushing now would share results that are out of date. Finish the run, or pass "
                      f"--force to push what exists.")
    stages = args.stages or [s for s, outs in known.items()
                             if s not in PUSHED_ONLY_BY_NAME and all((root / o).exists() for o in outs)]
    held = [s for s in PUSHED_ONLY_BY_NAME if s in known and s not in stages and all((root / o).exists() for o in known[s])]
    if held:
        listed = "; ".join(f"{s} ({', '.join(known[s])}: {PUSHED_ONLY_BY_NAME[s]})" for s in held)
        print(f"not pushed: {listed}. They hold the datasets' own data, which the data use agreements of credentialed "
              f"datasets (MIMIC-CXR, BRSET, mBRSET, EyePACS, ...) forbid sharing; name a stage with --stages to push it.",
              file=sys.stderr)
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
    check_results_dir(root, args.snakemake, known)
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
    remote = default_remote(root)
    fetch(stages, remote)
    bad = verify_fetched(locked, stages)
    if bad:
        # a copy in DVC's cache can be bad here, not on the remote, while DVC takes it as fetched (its size and mtime
        # are those DVC recorded): verify_fetched dropped it, so download those once more before blaming the remote
        print(f"{len(bad)} file(s) in DVC's cache do not match dvc.lock (copies DVC takes as fetched): "
              f"downloading them again", file=sys.stderr)
        fetch(stages, remote)
        bad = verify_fetched(locked, stages)
    if bad:
        listed = "\n".join(f"  {path}: {problem}" for path, problem in bad[:20])
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise Failure(f"{len(bad)} file(s) downloaded from {remote} do not match dvc.lock, also when downloaded "
                      f"again:\n{listed}{more}\nNothing in the workspace was changed, and the bad copies were dropped "
                      f"from DVC's cache. The remote holds a corrupt copy: push these results again from a machine "
                      f"that has them (scripts/dvc-results.py push), then pull.")
    run(["dvc", "checkout", *stages])
    status = json.loads(run(["dvc", "status", "--json", *stages], capture=True).stdout or "{}")
    if status:
        raise Failure(f"after the pull the workspace still differs from dvc.lock, so modification times are "
                      f"left alone (touching would hide real changes):\n{json.dumps(status, indent=2)}")
    touched = run(["snakemake", "--touch", "--cores", "1", *args.snakemake], capture=True, check=False)
    if touched.returncode:
        output = (touched.stdout + touched.stderr).strip()
        if "LockException" in output:
            raise Failure(f"the files are in place, but Snakemake refused to update their modification times: a "
                          f"snakemake that was stopped (an interrupted pull, a killed run) left its lock on this folder. "
                          f"If no other snakemake is running here, remove it (snakemake --unlock "
                          f"{' '.join(args.snakemake)}) and pull again.")
        raise Failure(f"`snakemake --touch` failed with exit code {touched.returncode}:\n{output[-3000:]}")
    pending = pending_jobs(args.snakemake)
    print(f"pulled {', '.join(stages)}; Snakemake has "
          + ("nothing to do." if not pending else f"{pending} job(s) to run (outputs that were not pushed)."),
          file=sys.stderr)


def fetch(stages: list[str], remote: str) -> None:
    fetched = run(["dvc", "fetch", *stages], capture=True, check=False)
    if fetched.returncode:
        raise Failure(f"downloading {', '.join(stages)} from {remote} failed (`dvc fetch`, exit {fetched.returncode}); "
                      f"nothing in the workspace was changed:\n{(fetched.stderr or fetched.stdout).strip()}")


def default_remote(root: Path) -> str:
    """``remote 'name' (url)`` of the default DVC remote, after checking that a local one is there and readable
    (DVC itself only says "failed to pull")."""
    name = run(["dvc", "remote", "default"], capture=True, check=False).stdout.strip()
    if not name:
        raise Failure("this repository has no default DVC remote (dvc remote add -d <name> <url>; see .dvc/config)")
    url = run(["dvc", "config", f"remote.{name}.url"], capture=True).stdout.strip()
    described = f"the DVC remote '{name}' ({url})"
    if "://" not in url:    # a local directory: DVC reads a relative one from the folder of its config file
        folder = (root / ".dvc" / Path(url).expanduser()).resolve()
        if not folder.is_dir() or not os.access(folder, os.R_OK | os.X_OK):
            raise Failure(f"{described} cannot be read: {folder} does not exist or is not readable. Point the remote "
                          f"at the store the results were pushed to (dvc remote modify {name} url <path>).")
    return described


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_fetched(locked: dict, stages: list[str]) -> list[tuple[str, str]]:
    """Every file of ``stages`` in DVC's cache against the MD5 that dvc.lock records for it (a directory's
    listing, then each file in it) -> [(workspace path, what is wrong)]; bad copies are removed from the cache."""
    cache = Path(run(["dvc", "cache", "dir"], capture=True).stdout.strip())

    def cached(md5: str) -> Path:
        return cache / "files" / "md5" / md5[:2] / md5[2:]

    bad = []

    def check(path: str, md5: str) -> bool:
        copy = cached(md5)
        if not copy.is_file():
            bad.append((path, f"not downloaded (the remote has no object {md5})"))
            return False
        actual, expected = md5_file(copy), md5.removesuffix(".dir")    # a listing's MD5 is that of its bytes too
        if actual != expected:
            bad.append((path, f"MD5 {actual}, dvc.lock records {expected}"))
            copy.unlink()
            return False
        return True

    for stage in stages:
        for out in locked[stage].get("outs", []):
            if out.get("md5") is None:
                continue
            if not out["md5"].endswith(".dir"):
                check(out["path"], out["md5"])
            elif check(f"{out['path']}/ (its file listing)", out["md5"]):
                for entry in json.loads(cached(out["md5"]).read_text()):
                    check(f"{out['path']}/{entry['relpath']}", entry["md5"])
    return bad


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
