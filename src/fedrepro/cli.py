"""Command-line entry points; the Snakemake rules call these (``fedrepro <command> ...``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def _setup_logging(verbose: bool = False) -> logging.Logger:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    return logging.getLogger("fedrepro")


def cmd_download(args) -> None:
    from .data import download
    from .registry import dataset

    spec = dataset(args.dataset)          # an unknown name: one line with the closest known one
    if args.check:  # report on the placed tree, change nothing
        complete, lines = download.check_dataset(spec, Path(args.raw_dir))
        print("\n".join(f"{spec.name}: {line}" for line in lines))
        if not complete:
            raise SystemExit(f"{spec.name} is not complete under {Path(args.raw_dir) / spec.name} (see above)")
        return
    download.download_dataset(spec, Path(args.raw_dir), reverify=args.reverify)


def cmd_prepare(args) -> None:
    import pandas as pd

    from . import records
    from .data.images import find_corrupt
    from .data.manifest import ManifestError, write_manifest
    from .data.prepare import prepare_dataset, unreadable
    from .io import write_csv
    from .registry import dataset

    spec = dataset(args.dataset)
    again = f"fedrepro prepare {spec.name} --raw-dir {args.raw_dir} --out {args.out}"
    try:
        manifest = prepare_dataset(spec, Path(args.raw_dir), manifest_dir=Path(args.out).parent)
    except (ManifestError, FileNotFoundError) as error:   # a table or a listed file: say which dataset, and what next
        raise ManifestError(f"{spec.name}: {error}\nOnce that is fixed, run `{again}` (or Snakemake again); "
                            f"`fedrepro download {spec.name} --raw-dir {args.raw_dir} --check` reports on the whole "
                            f"tree.") from None
    known = unreadable(manifest)                     # files the preparer could not convert (a damaged DICOM, ...)
    listed = {p for p, _ in known}
    rest = [p for p in manifest["path"] if p not in listed]
    bad = known + (find_corrupt(Path(args.raw_dir), rest, progress=True, workers=args.workers) if args.verify else [])
    report = Path(args.out).with_suffix(".skipped.csv")
    if bad and args.corrupt == "error":
        listing = "\n".join(f"  {p}: {why}" for p, why in bad[:20]) + (f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise SystemExit(f"{len(bad)} unreadable image(s) in {spec.name}:\n{listing}\n"
                         f"Replace them, or set data.corrupt_images: skip to leave them out (listed in {report}); "
                         f"then run `{again} --corrupt skip` (or Snakemake again).")
    write_csv(report, pd.DataFrame(bad, columns=["path", "reason"]))
    manifest = manifest[~manifest["path"].isin({p for p, _ in bad})].reset_index(drop=True)
    if manifest.empty:
        raise ManifestError(f"{spec.name}: every one of its {len(bad)} images is unreadable (listed in {report})")
    write_manifest(args.out, manifest)
    records.write(args.out, [args.out, report], dataset=spec.name)
    logging.getLogger("fedrepro").info("%s: %d images, %d classes, %d left out%s", spec.name, len(manifest),
                                       manifest["label"].nunique(), len(bad),
                                       f" (listed in {report})" if bad else "")
    for path, why in bad[:20]:
        logging.getLogger("fedrepro").warning("%s: left out %s: %s", spec.name, path, why)


def cmd_split(args) -> None:
    from . import records
    from .data.manifest import read_manifest
    from .data.partition import count_table, make_split, task_classes
    from .io import sha256_file, with_content_digest, write_csv, write_json
    from .registry import dataset
    from .report.splits import split_heatmap

    spec = json.loads(args.spec)
    everything = list(dataset(args.dataset).classes)
    kept = task_classes(everything, spec)
    classes = [everything[c] for c in kept]
    manifest = read_manifest(args.manifest)
    split = make_split(manifest, spec, args.seed, list(dataset(args.dataset).class_texts))
    out = Path(args.out)
    counts = count_table(split, manifest, classes, kept)
    write_csv(out.with_suffix(".counts.csv"), counts)
    split_heatmap(counts, classes, f"{out.stem}", out.with_suffix(".png"))
    write_json(out, with_content_digest({"dataset": args.dataset, "spec": spec, "seed": args.seed,
                                         "manifest_sha256": sha256_file(args.manifest), **split.to_json()}))
    # the picture is left out: what it shows is the counts, and its bytes follow matplotlib's version
    records.write(out, [out, out.with_suffix(".counts.csv")], records.made_from(args.manifest), dataset=args.dataset,
                  spec=spec, seed=args.seed)


def cmd_image_cache(args) -> None:
    from .data.decode import DecodeSpec
    from .data.image_cache import build_image_cache

    meta = build_image_cache(Path(args.manifest), Path(args.raw_dir), DecodeSpec.from_key(args.spec), Path(args.out),
                             workers=args.workers, progress=True)
    logging.getLogger("fedrepro").info("%s: %d images decoded as %s", args.out, meta["rows"], args.spec)


def cmd_features(args) -> None:
    from .data.loader import resolve_workers
    from .device import resolve_device
    from .features import build_feature_cache
    from .registry import dataset
    from .seeding import configure_determinism, seed_global

    configure_determinism(True)
    seed_global(0, "init")  # random-init encoders (tests, demo) must be the same in every job
    build_feature_cache(Path(args.manifest), Path(args.raw_dir), list(dataset(args.dataset).class_texts),
                        json.loads(args.encoder), Path(args.out), resolve_device(args.device),
                        workers=resolve_workers(args.workers), draft=args.jpeg_draft == "true", precision=args.precision,
                        pixels=args.pixels)


def cmd_train(args) -> None:
    from .train import train_run

    run = json.loads(args.run)
    train_run(run, args.out, args.checkpoint_dir, logging.getLogger("fedrepro.train"), args.checkpoint_every)


def cmd_parity(args) -> None:
    from . import paths
    from .parity import PARITY, ParityError, run_parity

    work = Path(args.work or paths.parity_work(args.paper))
    if args.paper not in PARITY:
        raise SystemExit(f"fedrepro parity: no whole-run comparison for {args.paper!r} yet (have: {', '.join(PARITY)}); "
                         f"docs/parity.md says which component checks stand in for the others")
    try:
        passed = run_parity(args.paper, work=work, authors=args.authors, golden=args.golden, python=args.python,
                            rounds=args.rounds, batch_size=args.batch_size, threads=args.threads,
                            stochastic=args.stochastic == "on", config=args.config, save=args.save,
                            reuse=args.reuse)
    except ParityError as error:      # the comparison could not be made: what and what next, no traceback
        logging.getLogger("fedrepro").error("%s", error)
        raise SystemExit(1) from None
    if not passed:
        raise SystemExit(1)


def cmd_downstream(args) -> None:
    from .downstream import run_downstream

    run_downstream(json.loads(args.job), args.out, logging.getLogger("fedrepro.downstream"))


def _project(args):
    from .config import Project

    return Project(json.loads(args.config_json), root=".", configfiles=args.configfiles)


def _add_config_json(p, required: bool = True) -> None:
    """A report job's configuration: the merged config as JSON, and the files it came from (which a refusal's
    rebuild command names; the rules pass the ones Snakemake was given). Where the JSON is optional (``fedrepro
    evidence``, which users run too), the configuration is read from those files."""
    p.add_argument("--config-json", required=required)
    p.add_argument("--configfiles", nargs="*", metavar="FILE",
                   help="the config files Snakemake was given (none: the default config/config.yaml); unset: unknown")


def cmd_table(args) -> None:
    from .report.chain import write_record
    from .report.consistency import check_inputs, with_run_manifests
    from .report.tables import make_table, table_inputs, table_item, write_table

    project = _project(args)
    item = table_item(project, args.protocol, args.paper, args.table)
    inputs = table_inputs(item)
    check_inputs(project, inputs, args.out)
    files = write_table(make_table(item), args.out)
    write_record(args.out, files, with_run_manifests(inputs))


def cmd_figure(args) -> None:
    from .report.consistency import check_inputs
    from .report.figures import figure_inputs, figure_item, make_figure

    project = _project(args)
    item = figure_item(project, args.protocol, args.paper, args.figure)
    check_inputs(project, figure_inputs(item), args.out)
    make_figure(item, args.out)


def cmd_scorecard(args) -> None:
    from . import paths
    from .report import scorecard
    from .report.chain import write_record
    from .report.code_changes import code_note
    from .report.consistency import check_inputs, check_made, scorecard_inputs
    from .report.item import stand_in

    project = _project(args)
    if args.paper != "all":
        project.resolver.check_names(args.paper)
    check_inputs(project, scorecard_inputs(project, args.paper), args.out)
    papers = list(project.papers) if args.paper == "all" else [args.paper]
    tables = [(protocol, paper, table) for protocol, paper, table in project.plan.tables() if paper in papers]
    check_made(project, [paths.table(protocol, paper, table) for protocol, paper, table in tables], args.out)
    title = ("Reproduction scorecard: all papers" if args.paper == "all"
             else f"Reproduction scorecard: {project.papers[args.paper]['title']}")
    stand_ins = [f"{project.papers[p]['title']}: {stand_in(project, p).rstrip('.')}." for p in papers if stand_in(project, p)]
    runs = [k for protocol, paper, table in project.plan.tables() if paper in papers
            for k in project.plan.table_runs(paper, table, protocol)]
    files = scorecard.ScorecardFiles.at(Path(args.out).with_suffix(""))
    scorecard.write(scorecard.project_card(project, papers), title, files, stand_ins,
                    code_note(project, runs, lambda k: f"{project.papers[k.paper]['methods'][k.method].get('label', k.method)} "
                                                       f"({k.paper})"))
    write_record(args.out, [files.html, files.md, files.csv, files.png],
                 [paths.table(protocol, paper, table, ".csv") for protocol, paper, table in tables])


def cmd_evidence(args) -> None:
    from . import paths
    from .config import load_project
    from .report import evidence
    from .report.consistency import check_runs

    project = _project(args) if args.config_json else load_project(args.configfiles or None)
    if not project.config.get("evidence"):
        raise SystemExit("this configuration sets no learning bar (config key `evidence`)")
    out = args.out or paths.evidence()
    check_runs(project, project.plan.runs(), out)
    scores = evidence.write_page(project, Path(out).parent)
    failed = evidence.failures(scores)
    logging.getLogger("fedrepro").info("evidence: %d of %d runs clear the bar; %d below it with the reason their paper "
                                       "file gives, %d without one", int(scores["passed"].sum()), len(scores),
                                       len(evidence.explained(scores)), len(failed))
    if args.check and len(failed):
        rows = failed[["paper", "protocol", "setting", "method", "seed", "value", "threshold"]].to_string(index=False)
        raise SystemExit(f"{len(failed)} run(s) below the learning bar with no reason in their paper file "
                         f"(bar_explanation) ({Path(out).parent / 'bar.csv'}):\n{rows}")


def cmd_report(args) -> None:
    from . import paths
    from .config import load_project
    from .report import overview
    from .report.consistency import check_made

    project = _project(args) if args.config_json else load_project(args.configfiles or None)
    out = args.out or paths.report()
    # what the page shows is what the jobs wrote: a table or scorecard cut off or edited since is refused
    check_made(project, [o.path for o in overview.planned_outputs(project) if o.kind != "figure" and o.built], out)
    rule_graph = None if args.no_rule_graph else overview.rule_graph_dot(project.configfiles)
    overview.write(project, out, rule_graph)
    logging.getLogger("fedrepro").info("report: %s", out)


def cmd_embed(args) -> None:
    from .embed import embed

    embed(json.loads(args.job), args.out)


def cmd_weights(args) -> None:
    """Fetch (default), verify (--check) or list (--list) pretrained-weights resources."""
    from .models import weights as W

    log = logging.getLogger("fedrepro.weights")
    if args.ids:
        try:
            specs = [W.WeightSpec.from_id(i) for i in args.ids]
        except ValueError as error:
            raise W.WeightsError(str(error)) from None
    else:
        from .config import load_project

        specs = list(load_project(args.configfile or None).plan.weights().values())
    failed = []
    for spec in specs:
        try:
            if args.list or args.check:
                manifest = W.check(spec, args.root, deep=args.check)
                size = sum(r["bytes"] for r in manifest["files"].values())
                print(f"{'verified' if args.check else 'present':9} {spec.id}  ({size / 1e6:.1f} MB)  {spec.describe()}")
            else:
                W.fetch(spec, args.root, force=args.force)
        except W.WeightsError as error:
            if args.list and isinstance(error, W.WeightsMissing) and not W.manifest_path(spec, args.root).exists():
                print(f"{'missing':9} {spec.id}  {spec.describe()}")
                continue
            failed.append(spec.id)
            log.error("%s", error)
    if not specs:
        print("this configuration loads no pretrained weights (every model is random init or a local file)")
    if failed:
        raise SystemExit(f"{len(failed)} of {len(specs)} weights resource(s) failed: {', '.join(failed)}")


def cmd_estimate(args) -> None:
    from . import dag
    from .config import ConfigError, load_project
    from .cost import estimate
    from .cost import runtime as cost
    from .cost.memory import fmt, planned
    from .cost.throughput import choose
    from .dag.requests import FALLBACK_MEMORY

    project = load_project(args.configfile or None)
    authors = cost.AuthorsWay(args.authors_loader_cores, args.decode_img_s)
    if args.paper and not args.setting and (args.paper == "all" or "/" in args.paper or "." in args.paper):
        target = dag.Dag(project).target(args.paper)          # a file snakemake builds, or all
        table, why = choose(args.throughput, args.gpu)
        print("\n".join(estimate.summary(project, target, table, why, authors)))
        return
    if args.paper:
        project.resolver.check_names(args.paper)          # one line with the closest name, as everywhere
        if not (args.setting and args.method):
            raise ConfigError("fedrepro estimate <paper> <setting> <method>: give all three, a target file (e.g. "
                              "results/tables/clean/facmic/table2.md), or nothing for a line per run of the grid")
        key = project.resolver.run_key(args.paper, args.setting, args.method, args.seed if args.seed is not None else project.seeds[0],
                              args.protocol)
        if key not in set(project.plan.runs()):
            raise ConfigError(f"no run {key.path} in the configuration: no table or figure uses {args.method} on "
                              f"{args.setting} (`fedrepro estimate` without arguments lists every run)")
        est = planned(project, key, args.workers, args.device)
        print("\n".join(est.lines()))
        if "error" in est.profile:        # what the train rule asks for then (fedrepro.dag.requests)
            print(f"request: mem_mb={FALLBACK_MEMORY['mem_mb']} (the workflow's fallback: no estimate, see the note)")
        else:
            print(f"request: mem_mb={est.host_mb()}" + (f" gpu_mem_mb={est.gpu_mb()}" if est.gpu else ""))
        table, why = choose(args.throughput, args.gpu)
        if table is None:
            print(f"time: cannot be given in GPU-hours: {why}")
            return
        run_cost = cost.run_cost(project, key, table, authors, profile=est.profile)
        request = cost.train_request(project, key, est, table)
        for missing in run_cost.missing:
            print(f"time: not measured: {missing}")
        if run_cost.ours_s is not None:
            where = "on the GPU" if run_cost.on_gpu else "(on a CPU in the workflow; at this device's rate)"
            print(f"time on {table.describe()}: ours {run_cost.ours_s / 3600:.2f} h {where}"
                  + (f", the authors' way {run_cost.authors_s / 3600:.2f} h" if run_cost.authors_s is not None else "")
                  + f"; image counts from {run_cost.source}")
        print(f"SLURM request: runtime={request.runtime} gpu_mem_mb={request.gpu_mem_mb} "
              + ("(from the measured rates)" if request.measured else f"(a guess{': ' + request.why if request.why else ''})"))
        return
    seen = {}
    for key in project.plan.runs():
        seen.setdefault((key.protocol, key.paper, key.setting, key.method), key)
    print(f"{'run (first seed)':<72} {'device':>6} {'host':>10} {'GPU':>10}")
    for key in seen.values():
        est = planned(project, key, args.workers, args.device)
        if "error" in est.profile:
            print(f"{key.path:<72} {est.device:>6} no estimate: {est.profile['error']}")
            continue
        print(f"{key.path:<72} {est.device:>6} {fmt(est.host_bytes):>10} {fmt(est.gpu_bytes) if est.gpu else '-':>10}")


def cmd_validate(args) -> None:
    from .config import load_project
    from .registry import plugins_loaded

    project = load_project(args.configfile or None)
    runs = project.plan.runs()
    print(f"config OK: {len(project.papers)} paper(s), {len(runs)} runs, {len(list(project.plan.tables()))} tables, "
          f"{len(list(project.plan.figures()))} figures, {len(project.plan.splits())} splits, {len(project.plan.features())} feature caches, "
          f"{len(project.plan.downstream_jobs())} downstream evaluations, {len(project.plan.weights())} pretrained weights "
          f"resources (fedrepro weights --list)")
    for origin, found in plugins_loaded().items():
        entries = "; ".join(f"{len(names)} {kind}{'s' if len(names) > 1 else ''} ({', '.join(names)})"
                            for kind, names in found["entries"].items())
        print(f"{'declared in' if origin == 'config' else f'plug-in {origin}'} ({found['how']}): {entries}")
    if project.extension:
        from . import paths

        print(f"extension {project.extension.name}: its tables, scorecards and evidence go to "
              f"{paths.extension_dir(project.extension.name)}/")
        print("\n".join(project.extension.notes()))
    for line in plugin_memory_failures(project):
        print(line)


def plugin_memory_failures(project) -> list[str]:
    """The memory estimate of every run whose method or model family a plug-in registered, built now (the built-in
    ones are the tests'; the workflow sizes every job when it plans): one warning per failure."""
    from .cost.memory import profile_failures
    from .dag.requests import FALLBACK_MEMORY
    from .registry import METHODS, MODELS

    def plugin_run(key) -> bool:
        train = project.resolver.train_config(key.paper, key.setting, key.method, key.protocol)
        variant = project.papers[key.paper]["methods"][key.method]
        return (METHODS.get(variant.get("method", key.method)).origin is not None
                or MODELS.get(train["model"]["family"]).origin is not None)

    first = {}         # seeds share their model and method
    for key in project.plan.runs():
        first.setdefault((key.folder, key.paper, key.setting, key.method), key)
    keys = [key for key in first.values() if plugin_run(key)]
    return [f"warning: no memory estimate: {error}. Its jobs (the first: {key.path}) ask SLURM for the fallback "
            f"mem_mb={FALLBACK_MEMORY['mem_mb']} until it is fixed" for error, key in profile_failures(project, keys).items()]


def cmd_stale(args) -> None:
    """The runs of a target made by other code than the installed one, and the command that reruns exactly them."""
    import shlex
    import subprocess

    from . import dag
    from .config import load_project
    from .report.code_changes import check_code, listing, rerun_command

    project = load_project(args.configfile or None)
    target = dag.Dag(project).target(args.target)
    check = check_code(project, target.runs)
    print("\n".join(listing(check, target.what)))
    if not check.changed:
        return
    command = rerun_command(project, args.target, check.changed,
                            f"--profile {shlex.quote(args.profile)}" if args.profile else "--cores all")
    if not args.rerun:
        print(f"rerun them (and what is made from them): {shlex.join(command)}\n(`fedrepro stale --rerun` with the "
              f"same arguments runs it)")
        return
    print(f"running: {shlex.join(command)}", flush=True)
    code = subprocess.run([sys.executable, "-m", *command]).returncode
    if code:
        raise SystemExit(code)


def attach_log(log_file: str | Path) -> None:
    """Send this process's stderr (logging, tracebacks, libraries' own output) to the job's log, keeping earlier
    attempts: Snakemake deletes a job's log before each attempt, so the text goes to ``paths.log_attempts``,
    opened for appending, and the log is a hard link to it: a retry of a killed job shows the killed attempt's
    output above its own, each under its header."""
    from . import paths

    log_file = Path(log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    history = Path(paths.log_attempts(str(log_file)))
    fd = os.open(history, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if not (log_file.exists() and os.path.samefile(log_file, history)):
            log_file.unlink(missing_ok=True)
            os.link(history, log_file)
    except OSError:                   # no hard links on this file system: the log holds this attempt only
        os.close(fd)
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


def attempt_header(command: str) -> None:
    """The first line of each attempt in a job's log (:func:`attach_log` keeps the earlier attempts above it)."""
    import socket
    import time

    slurm = f", SLURM job {os.environ['SLURM_JOB_ID']}" if os.environ.get("SLURM_JOB_ID") else ""
    os.write(2, f"==== fedrepro {command}: attempt started {time.strftime('%Y-%m-%d %H:%M:%S')} on "
                f"{socket.gethostname()} (pid {os.getpid()}{slurm}) ====\n".encode())


# jobs that load models: they read pretrained weights from resources/weights with the hubs switched off
OFFLINE_JOBS = ("train", "features", "downstream", "embed")
# seconds of work a killed train job may have to redo (fedrepro.fl.engine.run_rounds): runs of short rounds (the demo,
# runs on cached features) do not spend more time writing their state than training, and a kill costs at most a
# minute; a cluster may set its own for every job
CHECKPOINT_VAR = "FEDREPRO_CHECKPOINT_EVERY"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    from .forkclient import ENV_VAR, run_via_server

    if os.environ.get(ENV_VAR):  # a warm fork-server runs the command (see fedrepro.forkserver)
        code = run_via_server(argv)
        if code:
            raise SystemExit(code)
        if code == 0:
            return       # done there; a caller in this process (a benchmark calling main()) goes on, as after a run here
    args = build_parser().parse_args(argv)
    run(args)


def build_parser() -> argparse.ArgumentParser:
    """Every command and its options (the commands the docs and messages name are checked against it)."""
    parser = argparse.ArgumentParser(prog="fedrepro", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--log", metavar="FILE", help="append this process's stderr to the job log FILE, which keeps "
                                                      "every attempt (the rules pass their log)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("download", help="fetch and verify a dataset's raw files")
    p.add_argument("dataset")
    p.add_argument("--raw-dir", default="resources/raw")
    p.add_argument("--check", action="store_true",
                   help="verify a placed tree (archives' digests, every source's files) without changing anything")
    p.add_argument("--reverify", action="store_true",
                   help="an archive whose digest recorded on first use no longer matches (a copy you replaced on "
                        "purpose) is checked whole again and, if it is, its new digest is recorded")
    p.set_defaults(fn=cmd_download)

    p = sub.add_parser("prepare", help="raw layout -> manifest CSV (decodes every image once)")
    p.add_argument("dataset")
    p.add_argument("--raw-dir", default="resources/raw")
    p.add_argument("--out", required=True)
    p.add_argument("--corrupt", choices=("error", "skip"), default="error")
    p.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument("--workers", type=int, default=1, help="processes that decode images in parallel")
    p.set_defaults(fn=cmd_prepare)

    p = sub.add_parser("split", help="manifest + partition spec -> client split")
    p.add_argument("--dataset", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--spec", required=True, help="partition spec as JSON")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_split)

    p = sub.add_parser("image-cache", help="decode every image of a manifest once, at a pipeline's size")
    p.add_argument("--manifest", required=True)
    p.add_argument("--raw-dir", default="resources/raw")
    p.add_argument("--spec", required=True, help="decode spec key, e.g. shorter256-bilinear (see fedrepro.data.decode)")
    p.add_argument("--workers", type=int, default=1, help="processes that decode images in parallel")
    p.add_argument("--out", required=True, help="the pixel file <dir>/<spec>.u8 (its .index.npz is written beside it)")
    p.set_defaults(fn=cmd_image_cache)

    p = sub.add_parser("features", help="cache frozen-encoder features of every image")
    p.add_argument("--dataset", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--raw-dir", default="resources/raw")
    p.add_argument("--encoder", required=True, help="encoder spec as JSON")
    p.add_argument("--device", default="auto")
    p.add_argument("--workers", default="auto", help="image decoding processes (auto = the job's CPUs minus one)")
    p.add_argument("--jpeg-draft", choices=("true", "false"), default="false", help="JPEG DCT scaling (data.jpeg_draft)")
    p.add_argument("--pixels", choices=("authors", "fast"), default="authors",
                   help="whose pixel pipeline (train.model.pixels, from the run's numerics)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16", "auto"), default="fp32",
                   help="the image tower's forward pass (fedrepro.device); fp32 keeps the cache exact")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_features)

    p = sub.add_parser("train", help="one federated run (method x setting x seed)")
    p.add_argument("--run", required=True, help="resolved run config as JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", type=float, metavar="SECONDS", default=os.environ.get(CHECKPOINT_VAR, "60"),
                   help=f"write resume.pt after a round once this long has passed since the last write, and after the "
                        f"last round; 0: after every round (default: ${CHECKPOINT_VAR}, else 60)")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("parity", help="run the authors' own training code and fedrepro's paper run on the same fixture "
                                      "and first model, and compare them round by round (docs/parity.md)")
    p.add_argument("paper")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--authors", metavar="CHECKOUT", help="the authors' repository at the commit docs/parity.md names")
    source.add_argument("--golden", metavar="DIR", help="replay fedrepro against a golden record instead (what CI "
                                                        "does; no authors' code needed)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python of the authors' environment (default: this one)")
    p.add_argument("--rounds", type=int, help="rounds to run (default: 2; a golden record: all it holds)")
    p.add_argument("--batch-size", type=int, help="local batch size on both sides (default: the paper configuration's)")
    p.add_argument("--threads", type=int, default=2, help="torch threads on both sides (default: 2)")
    p.add_argument("--stochastic", choices=("off", "on"), default="off",
                   help="dropout and drop-path: off on both sides for the exact comparison (default)")
    p.add_argument("--work", help="working folder (default: <results>/parity/<paper>)")
    p.add_argument("--reuse", action="store_true", help="compare again with the authors' run already recorded in the "
                                                        "working folder with the same settings (after a change to fedrepro)")
    p.add_argument("--save", metavar="DIR", help="write the golden record of this comparison there (e.g. "
                                                 "tests/data/parity/<paper>)")
    p.add_argument("--config", default="config/config.yaml", help="the configuration whose paper run is compared")
    p.set_defaults(fn=cmd_parity)

    p = sub.add_parser("downstream", help="evaluate a pre-trained checkpoint on a downstream task")
    p.add_argument("--job", required=True, help="resolved downstream job config as JSON")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_downstream)

    for name, fn, item in (("table", cmd_table, "table"), ("figure", cmd_figure, "figure")):
        p = sub.add_parser(name, help=f"build one paper {name} from run results")
        _add_config_json(p)
        p.add_argument("--protocol", required=True, choices=("clean", "paper"))
        p.add_argument("--paper", required=True)
        p.add_argument(f"--{item}", required=True)
        p.add_argument("--out", required=True)
        p.set_defaults(fn=fn)

    p = sub.add_parser("scorecard", help="did each published number reproduce? (Markdown, HTML, CSV, figure)")
    _add_config_json(p)
    p.add_argument("--paper", required=True, help="a paper, or 'all'")
    p.add_argument("--out", required=True, help="results/scorecards/<paper>.html (the .md, .csv, .png beside it)")
    p.set_defaults(fn=cmd_scorecard)

    p = sub.add_parser("evidence", help="did every run clear the learning bar? (<results_dir>/evidence/)")
    _add_config_json(p, required=False)
    p.add_argument("--out", help="default: <results_dir>/evidence/index.html of the configuration")
    p.add_argument("--check", action="store_true", help="exit 1 if a run is below the bar without a reason in its paper file (bar_explanation)")
    p.set_defaults(fn=cmd_evidence)

    p = sub.add_parser("report", help="one self-contained page of what is built: per paper what ran, whether the "
                                      "published numbers reproduced, the tables and figures (<results_dir>/report.html)")
    _add_config_json(p, required=False)
    p.add_argument("--out", help="default: <results_dir>/report.html of the configuration")
    p.add_argument("--no-rule-graph", action="store_true", help="leave out the rule graph (it asks Snakemake for it)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("embed", help="extract what a figure needs from a trained model (features, prototype patches)")
    p.add_argument("--job", required=True, help="resolved embed job as JSON")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_embed)

    p = sub.add_parser("weights", help="fetch pretrained weights once into resources/weights/ (run it where there "
                                       "is internet: jobs load the local copies offline)")
    p.add_argument("ids", nargs="*", help="weights ids, e.g. open_clip--ViT-B-16--openai, timm--efficientnet_b0, "
                                         "hf--bert-base-cased--model (default: every resource the configuration needs)")
    p.add_argument("--configfile", nargs="*", help="config files, merged in order (default config/config.yaml)")
    p.add_argument("--root", default="resources/weights", help="where the local copies live")
    p.add_argument("--force", action="store_true", help="fetch again even if a verified copy is there")
    p.add_argument("--check", action="store_true", help="verify every file's SHA-256 instead of fetching")
    p.add_argument("--list", action="store_true", help="list the resources and whether they are present")
    p.set_defaults(fn=cmd_weights)
    p = sub.add_parser("estimate", help="what a target costs before running it (jobs, GPU-hours, memory), or the "
                                        "memory a run needs, part by part (what the train rule requests)")
    p.add_argument("paper", nargs="?", metavar="paper|target",
                   help="a file snakemake builds (e.g. results/tables/clean/facmic/table2.md) or all: its jobs, GPU-hours "
                        "and memory; a paper with setting and method: one run; none: a line per run of the grid")
    p.add_argument("setting", nargs="?")
    p.add_argument("method", nargs="?")
    p.add_argument("--seed", type=int, help="default: the first configured seed")
    p.add_argument("--protocol", choices=("clean", "paper"), help="default: the first configured protocol")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: as the job is planned (image runs on a GPU)")
    p.add_argument("--workers", type=int, default=7, help="image loader workers (the train rule's 8 threads - 1)")
    p.add_argument("--throughput", metavar="CSV", help="a throughput table (default: the table in "
                                                    "benchmarks/gpu/ of the SLURM profile's GPU model)")
    p.add_argument("--gpu", help="the GPU model whose table in benchmarks/gpu/ to read (default: the SLURM profile's)")
    p.add_argument("--authors-loader-cores", type=int,
                   help="the authors' loader processes (default: their code's, per paper: fedrepro.cost)")
    p.add_argument("--decode-img-s", type=float, help="the authors' loader: images/s per process (default: the table's)")
    p.add_argument("--configfile", nargs="*", help="config files, merged in order (default config/config.yaml)")
    p.set_defaults(fn=cmd_estimate)

    p = sub.add_parser("stale", help="the runs made by other code than the installed one (their method's or model "
                                     "family's source, or their plug-in's version, changed), and the Snakemake command "
                                     "that reruns exactly them")
    p.add_argument("target", nargs="?", default="all", help="a file snakemake builds (a table, scorecard, run file) "
                                                            "or all (default): the runs it is made from")
    p.add_argument("--rerun", action="store_true", help="run that command (by default it is printed)")
    p.add_argument("--profile", help="run the jobs with this Snakemake profile (e.g. slurm) instead of --cores all")
    p.add_argument("--configfile", nargs="*", help="config files, merged in order (default config/config.yaml)")
    p.set_defaults(fn=cmd_stale)

    p = sub.add_parser("validate", help="validate the configuration and count what it would build")
    p.add_argument("--configfile", nargs="*", help="config files, merged in order (default config/config.yaml)")
    p.set_defaults(fn=cmd_validate)
    return parser


def run(args) -> None:
    if args.log:
        attach_log(args.log)
        attempt_header(args.command)
    log = _setup_logging(args.verbose)
    if getattr(args, "out", None) and args.command != "train":      # train clears its own folders
        from .io import clear_temporaries

        # what a killed attempt of this job left: temporaries of <stem>.* beside --out (a table's .md/.csv/.tex,
        # a cache's .u8/.index.npz, a split's .json/.counts.csv/.png)
        clear_temporaries(Path(args.out).with_name(Path(args.out).stem))
    if args.command in OFFLINE_JOBS:
        from .models.weights import force_offline

        force_offline()
    from .config import ConfigError
    from .cost.memory import InsufficientMemory
    from .cost.throughput import ThroughputError
    from .data.download import DownloadError
    from .data.image_cache import StaleImageCache
    from .data.images import CorruptImageError
    from .data.manifest import ManifestError
    from .data.partition import SplitError
    from .io import BrokenFile, DiskFull, StaleInput
    from .models.weights import WeightsError
    from .registry import PluginError, RunRefused, UnknownName

    try:
        args.fn(args)
    except (ConfigError, DownloadError, CorruptImageError, ManifestError, SplitError, StaleImageCache,
            WeightsError, InsufficientMemory, FileNotFoundError, BrokenFile, DiskFull, StaleInput, ThroughputError,
            PluginError, RunRefused, UnknownName) as error:
        # errors the user can act on: say what and where, without a traceback
        log.error("%s", error)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
