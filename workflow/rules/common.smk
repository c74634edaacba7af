# Shared setup: validate the configuration, derive the grid, and every input function the rules use.
# Paths come from fedrepro.paths (the one place they are spelled); rules link to each other's outputs.

import functools
import json
import os
import shlex
import sys
import time
from pathlib import Path

from snakemake.exceptions import WorkflowError

from fedrepro import paths
from fedrepro.config import ConfigError, Project, check_config_files, typed_overrides
from fedrepro.embed import model_config as embed_model_config
from fedrepro.models.weights import WeightsError, encoder_weights, weight_specs
from fedrepro.models.weights import check as check_weights
from fedrepro.paths import RunKey


envvars:
    "PATH",


# jobs call the `fedrepro` CLI; make the one installed next to this Snakemake win when the user
# did not activate the environment (conda deployment activates its own env, which then wins)
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

try:
    check_config_files(workflow.configfiles)   # what Snakemake's loader lets through: repeated keys
    # --config seeds=[0,1]: Snakemake reads the items of a list or mapping as strings; read them as a config file would
    PROJECT = Project(typed_overrides(config, workflow.config_settings.config), root=workflow.basedir)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration:\n{error}")

RAW = PROJECT.config["data"]["raw_dir"]
RUNS = {key.path: key for key in PROJECT.plan.runs()}
SPLITS = PROJECT.plan.splits()
FEATURES = {f"{dataset}/{key}": job for (dataset, key), job in PROJECT.plan.features().items()}   # {encoder, jpeg_draft}
DOWNSTREAM = PROJECT.plan.downstream_jobs()
CONFIG_JSON = json.dumps(PROJECT.config, sort_keys=True)
# the config files Snakemake was given (none: config/config.yaml), as report jobs pass them on (--configfiles): a
# refusal's rebuild command names them, so a demo user does not rebuild against the full configuration
CONFIGFILES = " ".join(shlex.quote(os.path.relpath(f) if Path(f).resolve().is_relative_to(Path.cwd().resolve()) else str(f))
                       for f in workflow.overwrite_configfiles)
ENV = "../../envs/fedrepro.yaml"


wildcard_constraints:
    dataset=r"[A-Za-z0-9_]+",
    seed=r"\d+",
    protocol=r"clean|paper",
    paper=r"[a-z][a-z0-9_]*",
    setting=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    method=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    figure=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    spec=r"(shorter|longer|square)\d+-[a-z]+(-full)?|original",
    weights=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",


# ---- resources and targets -------------------------------------------------------------------


def per_attempt(base: int):
    """A resource that grows with each retry: a job killed for time or memory gets more on its next
    attempt (the SLURM profile sets `retries`). Values here are cluster-independent; account,
    partition, GPU model and QoS live only in workflow/profiles/slurm."""
    return lambda wildcards, attempt: base * attempt


def all_outputs(wildcards=None) -> list[str]:
    """What `all` builds: the kinds of output the configuration names (`outputs`)."""
    kinds = {
        "tables": lambda: [paths.table(protocol, paper, table) for protocol, paper, table in PROJECT.plan.tables()],
        "figures": lambda: [paths.figure(protocol, paper, figure) for protocol, paper, figure in PROJECT.plan.figures()],
        "scorecards": lambda: [paths.scorecard(paper) for paper in PROJECT.papers] + [paths.scorecard("all")],
        "evidence": lambda: [paths.evidence()] if PROJECT.config.get("evidence") else [],
    }
    return [target for kind in PROJECT.config["outputs"] for target in kinds[kind]()]


# ---- data --------------------------------------------------------------------------------------


def raw_root(marker: str) -> str:
    """The raw-data root of a dataset's marker file (``<root>/<dataset>/.complete``)."""
    return str(Path(marker).parent.parent)


def prepare_inputs(wildcards):
    from fedrepro.registry import DATASETS

    depends_on = DATASETS.get(wildcards.dataset).obj.depends_on
    return [paths.raw_marker(wildcards.dataset, RAW)] + [paths.manifest(d) for d in depends_on]


def split_of(wildcards) -> dict:
    if wildcards.split not in SPLITS:
        raise WorkflowError(f"no split {wildcards.split} in the configuration")
    return SPLITS[wildcards.split]


# ---- pretrained weights ------------------------------------------------------------------------

_CHECKED_WEIGHTS = {}


def weights_inputs(specs) -> list[str]:
    """The manifests of the pretrained-weights resources a job loads (the `weights` rule fetches a
    missing one first, as a local job). A local copy that is already there must have every file it
    lists at its recorded size: checked here, on the machine that runs Snakemake, so a missing or
    truncated file stops the workflow with the command that fetches it again before anything is
    submitted, instead of failing (and being retried) on a compute node. The job itself verifies
    every SHA-256 before it reads any data."""
    out = []
    for spec in specs:
        manifest = paths.weights_manifest(spec.id)
        if Path(manifest).exists() and spec.id not in _CHECKED_WEIGHTS:
            try:
                check_weights(spec, deep=False)
            except WeightsError as error:
                raise WorkflowError(str(error))
            _CHECKED_WEIGHTS[spec.id] = True
        out.append(manifest)
    return out


def features_weights(wildcards) -> list[str]:
    return weights_inputs(encoder_weights(FEATURES[f"{wildcards.dataset}/{wildcards.key}"]["encoder"]))


def class_texts(dataset: str) -> list[str]:
    """What a CLIP prompt says for each class of ``dataset`` (fedrepro.data.spec.DatasetSpec.class_texts)."""
    from fedrepro.registry import dataset as dataset_spec

    return list(dataset_spec(dataset).class_texts)


# ---- runs --------------------------------------------------------------------------------------


def run_key(wildcards) -> RunKey:
    path = f"{wildcards.protocol}/{wildcards.paper}/{wildcards.setting}/{wildcards.method}/seed{wildcards.seed}"
    if path not in RUNS:
        raise WorkflowError(f"no run {path} in the configuration")
    return RUNS[path]


def run_config(wildcards) -> dict:
    return PROJECT.resolver.run_config(run_key(wildcards))


def train_inputs(wildcards):
    run = run_config(wildcards)
    inputs = {"manifest": run["paths"]["manifest"], "split": run["paths"]["split"]}
    if run["paths"]["features"]:
        inputs["features"] = run["paths"]["features"]
    elif run["paths"]["images"]:  # decode-once caches: the job never opens an original image
        for part, pixels in run["paths"]["images"].items():
            inputs[f"images_{part}"] = pixels
            inputs[f"images_{part}_index"] = paths.image_cache_index(pixels)
    else:
        inputs["raw"] = paths.raw_marker(run["dataset"], RAW)
    weights = weights_inputs(weight_specs(run["train"]["model"]))
    if weights:
        inputs["weights"] = weights
    return inputs


def on_features(wildcards) -> bool:
    """Runs on cached encoder features take seconds to minutes on a CPU; image runs want a GPU."""
    return run_config(wildcards)["input"] == "features"


IMAGE_RUN_THREADS = PROJECT.config["image_run_threads"]
FALLBACK_MEMORY = {"mem_mb": 32000, "gpu_mem_mb": 0}   # when a run's model cannot be estimated


@functools.lru_cache(maxsize=None)
def _run_memory(path: str) -> dict:
    from fedrepro.fl.memory import planned

    try:
        est = planned(PROJECT, RUNS[path], workers=IMAGE_RUN_THREADS - 1)
    except Exception as error:  # noqa: BLE001 - planning never fails on an estimate
        print(f"fedrepro: no memory estimate for {path} ({error}); asking for {FALLBACK_MEMORY}", file=sys.stderr)
        return FALLBACK_MEMORY
    if "error" in est.profile:
        print(f"fedrepro: {path}: {est.profile['error']}; asking for {FALLBACK_MEMORY}", file=sys.stderr)
        return FALLBACK_MEMORY
    return {"mem_mb": est.host_mb(), "gpu_mem_mb": est.gpu_mb()}


def run_memory(wildcards) -> dict:
    """{"mem_mb", "gpu_mem_mb"} of a run, from its estimate (fedrepro.fl.memory): the host memory its
    job needs with the rule's loader workers, and the GPU memory of an image run."""
    return _run_memory(run_key(wildcards).path)


def train_group(wildcards):
    # Feature-level runs are tiny: on a cluster they share one group, and the profile's
    # `group-components: train_features=N` packs N of them into one SLURM job.
    return "train_features" if on_features(wildcards) else None


def downstream_job(wildcards) -> dict:
    key = run_key(wildcards)
    if f"{key.path}/{wildcards.task}" not in DOWNSTREAM:
        raise WorkflowError(f"no downstream evaluation {key.path}/{wildcards.task} in the configuration")
    return PROJECT.resolver.downstream_config(key, wildcards.task)


def downstream_inputs(wildcards) -> dict:
    job = downstream_job(wildcards)
    return {
        "model": job["paths"]["checkpoint"],
        "metrics": job["paths"]["metrics"],
        "manifest": job["paths"]["manifest"],
        "raw": paths.raw_marker(job["spec"]["dataset"], RAW),
        "weights": weights_inputs(weight_specs(job["run"]["train"]["model"])),
    }


# ---- report ------------------------------------------------------------------------------------


def embed_job(wildcards) -> dict:
    return PROJECT.resolver.embed_job(run_key(wildcards), wildcards.figure)


def embed_inputs(wildcards) -> dict:
    job = embed_job(wildcards)
    inputs = {"model": job["checkpoint"], **train_inputs(wildcards)}
    inputs["weights"] = weights_inputs(weight_specs(embed_model_config(job["run"])))
    return inputs


# A report's inputs include the run_manifest.json of every run it reads: its job checks that each run was made
# from the manifest, split and weights that are here now (fedrepro.report.consistency). And its out-of-date mark:
# Snakemake reruns nothing for a run file deleted after the report was made (a missing intermediate file is not a
# reason to rerun what is up to date) nor for an input put back with its old mtime (`cp -p`); the mark is rewritten
# when either is found, so the report reruns, rebuilding first what it is missing (or refusing stale runs by name).
# It says only what holds now: once nothing is found (the report rebuilt, or the file put back after a dry run),
# it is made old again.

_SAID_OUT_OF_DATE = set()


def report_inputs(target: str, files: list[str]) -> list[str]:
    from fedrepro.report.consistency import out_of_date

    mark = Path(paths.report_mark(target))
    if not mark.exists():
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    reasons = out_of_date(PROJECT, target, files)
    if not reasons:
        if mark.stat().st_mtime_ns:
            os.utime(mark, ns=(0, 0))   # older than any report
    else:
        # new content and mtime: Snakemake compares both (an input newer than the output, with another checksum)
        mark.write_text(f"{time.time_ns()}\n" + "\n".join(reasons) + "\n")
        if target not in _SAID_OUT_OF_DATE:
            _SAID_OUT_OF_DATE.add(target)
            listed = "\n  ".join(reasons[:10]) + (f"\n  ... and {len(reasons) - 10} more" if len(reasons) > 10 else "")
            print(f"fedrepro: {target} is out of date, so it is made again (after what it needs):\n  {listed}",
                  file=sys.stderr)
    return [*files, str(mark)]


def table_inputs(wildcards) -> list[str]:
    from fedrepro.report.consistency import with_run_manifests
    from fedrepro.report.tables import table_inputs, table_item

    files = with_run_manifests(table_inputs(table_item(PROJECT, wildcards.protocol, wildcards.paper, wildcards.table)))
    return report_inputs(paths.table(wildcards.protocol, wildcards.paper, wildcards.table), files)


def figure_inputs(wildcards) -> list[str]:
    from fedrepro.report.consistency import with_run_manifests
    from fedrepro.report.figures import figure_inputs, figure_item

    files = with_run_manifests(figure_inputs(figure_item(PROJECT, wildcards.protocol, wildcards.paper, wildcards.figure)))
    return report_inputs(paths.figure(wildcards.protocol, wildcards.paper, wildcards.figure), files)


def evidence_inputs(wildcards=None) -> list[str]:
    from fedrepro.report.consistency import with_run_manifests
    from fedrepro.report.evidence import run_inputs

    return report_inputs(paths.evidence(), with_run_manifests(run_inputs(PROJECT)))


# What each table, figure, scorecard and the evidence page is made from besides its input files (its spec, the
# labels it prints, ...), hashed: a param of its rule, so editing one definition rebuilds exactly that output.


def configuration(wildcards, output) -> str:
    """The whole configuration, for a report job to rebuild the project from. It takes ``output``, which makes it
    a param Snakemake derives from files and does not compare between runs: a change to the configuration
    reruns only the outputs whose definition param it changes."""
    return CONFIG_JSON


def configfiles(wildcards, output) -> str:
    """The config files Snakemake was given, shell-quoted, which a refusal's rebuild command names; like
    ``configuration``, a param Snakemake does not compare between runs."""
    return CONFIGFILES


def table_definition(wildcards) -> str:
    from fedrepro.report.definitions import definition_hash, item_definition
    from fedrepro.report.tables import table_item

    return definition_hash(item_definition(table_item(PROJECT, wildcards.protocol, wildcards.paper, wildcards.table)))


def figure_definition(wildcards) -> str:
    from fedrepro.report.definitions import definition_hash, item_definition
    from fedrepro.report.figures import figure_item

    return definition_hash(item_definition(figure_item(PROJECT, wildcards.protocol, wildcards.paper, wildcards.figure)))


def scorecard_definition(wildcards) -> str:
    from fedrepro.report.definitions import definition_hash, scorecard_definition

    return definition_hash(scorecard_definition(PROJECT, wildcards.paper))


def evidence_definition(wildcards) -> str:
    from fedrepro.report.definitions import definition_hash, evidence_definition

    return definition_hash(evidence_definition(PROJECT))


def scorecard_inputs(wildcards) -> list[str]:
    from fedrepro.report import consistency

    papers = list(PROJECT.papers) if wildcards.paper == "all" else [wildcards.paper]
    tables = [paths.table(protocol, paper, table, ".csv") for protocol, paper, table in PROJECT.plan.tables() if paper in papers]
    runs = consistency.runs_behind(consistency.scorecard_inputs(PROJECT, wildcards.paper))
    return report_inputs(paths.scorecard(wildcards.paper),
                         tables + [paths.run_file(key, "run_manifest.json") for key in runs])
