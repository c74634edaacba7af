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

from fedrepro import cost, paths
from fedrepro.config import ConfigError, Project, check_config_files, typed_overrides
from fedrepro.embed import model_config as embed_model_config
from fedrepro.models.weights import WeightsError, encoder_weights, weight_specs
from fedrepro.models.weights import check as check_weights
from fedrepro.paths import RunKey
from fedrepro.throughput import ThroughputError, for_gpu


# jobs call the `fedrepro` CLI; make the one installed next to this Snakemake win when the user
# did not activate the environment (conda deployment activates its own env, which then wins)
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

try:
    check_config_files(workflow.configfiles)   # what Snakemake's loader lets through: repeated keys
    # --config seeds=[0,1]: Snakemake reads the items of a list or mapping as strings; read them as a config file would
    PROJECT = Project(typed_overrides(config, workflow.config_settings.config), root=workflow.basedir)
except ConfigError as error:
    raise WorkflowError(f"invalid configuration:\n{error}")

# every job loads the configuration's plug-ins and folder datasets as this process did (FEDREPRO_PLUGINS,
# FEDREPRO_DATASETS): local jobs and the fork-server's children inherit the environment, SLURM jobs get the
# variables named below
os.environ.update(PROJECT.job_environment())
for line in PROJECT.extension.notes() if PROJECT.extension else []:
    print(f"fedrepro: {line}", file=sys.stderr)


envvars:
    "PATH",
    "FEDREPRO_PLUGINS",
    "FEDREPRO_DATASETS",

RAW = PROJECT.config["data"]["raw_dir"]
RUNS = {key.path: key for key in PROJECT.plan.runs()}
SPLITS = PROJECT.plan.splits()
FEATURES = {f"{dataset}/{key}": job for (dataset, key), job in PROJECT.plan.features().items()}   # {encoder, jpeg_draft, pixels}
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
    protocol=r"(clean|paper)(-fast)?",     # a run's folder: its protocol, -<numerics> unless the authors' (paths.RunKey)
    paper=r"[a-z][a-z0-9_]*",
    setting=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    method=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    figure=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",
    spec=r"(shorter|longer|square)\d+-[a-z]+(-cv2)?(-native)?(-full)?|original",
    weights=r"[A-Za-z0-9][A-Za-z0-9_.+-]*",


# ---- resources and targets -------------------------------------------------------------------


def per_attempt(base: int):
    """A resource that grows with each retry: a job killed for time or memory gets more on its next
    attempt (the SLURM profile sets `retries`). Values here are cluster-independent; account,
    partition, GPU model and QoS live only in workflow/profiles/slurm."""
    return lambda wildcards, attempt: base * attempt


def refuse_until_all() -> None:
    """`--until` reads every word after it as a rule (or file), so `--until weights all` means "everything up to
    `weights` and up to `all`": the whole grid (downloads, training), not the weights. `all` is never meant there:
    stop before any job is planned, with the command that was meant. (Snakemake sets `dag_settings` after parsing
    this file, so the check runs in the input function of `all`, which `--until all` makes a target.)"""
    dag_settings = getattr(workflow, "dag_settings", None)
    if dag_settings is not None and "all" in dag_settings.until:
        rules_ = " ".join(sorted(set(dag_settings.until) - {"all"})) or "<rule>"
        raise WorkflowError(
            f"`--until` was given `all`: Snakemake reads every word after `--until` as a rule to run up to, so this "
            f"would plan the whole grid (downloads and training included). Put the target first "
            f"(`snakemake all --until {rules_}`); for the pretrained weights alone: `snakemake --cores 2 all_weights`.")


def all_outputs(wildcards=None) -> list[str]:
    """What `all` builds: the kinds of output the configuration names (`outputs`)."""
    refuse_until_all()
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


def download_inputs(wildcards) -> list[str]:
    """A folder dataset's labels CSV (fedrepro.data.folder): a new CSV links and prepares the dataset again."""
    from fedrepro.data.folder import is_folder
    from fedrepro.registry import dataset as dataset_spec

    spec = dataset_spec(wildcards.dataset)
    return [spec.options["labels"]] if is_folder(spec) else []


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


def all_weights(wildcards=None) -> list[str]:
    """What `all_weights` fetches: the manifest of every pretrained-weights resource some job loads."""
    return weights_inputs(PROJECT.plan.weights().values())


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
    else:
        # decode-once caches; a pipeline without one (the authors' full-resolution crops) reads the original files
        caches = run["paths"]["images"] or {}
        for part, pixels in caches.items():
            inputs[f"images_{part}"] = pixels
            inputs[f"images_{part}_index"] = paths.image_cache_index(pixels)
        if len(caches) < 2:
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


# ---- SLURM runtime and GPU memory from a measured throughput table --------------------------------
# The profile names each GPU rule's GPU model (set-resources: <rule>: gpu_model, workflow/profiles/slurm); where
# benchmarks/gpu/ holds that GPU's table (benchmarks/train_step.py --device cuda), the jobs ask for the runtime
# and GPU memory its rates give, with the margins of fedrepro.cost; else for cost.FALLBACK_RUNTIME, unmeasured
# guesses. CPU rules (image_cache) read the train rule's table, taken on the GPU nodes' CPUs.


def profile_gpu_model(rule: str) -> str | None:
    """The GPU model the profile Snakemake loaded asks for ``rule``, else the train rule's (None without one)."""
    for name in (rule, "train"):
        value = workflow.resource_settings.overwrite_resources.get(name, {}).get("gpu_model")
        if value is not None:
            return str(getattr(value, "raw", value))     # a profile's string, as written
    return None


def _throughput_tables() -> dict:
    tables, notes = {}, {}
    for name in ("train", "features", "downstream", "image_cache"):
        model = profile_gpu_model(name)
        try:
            tables[name], why = for_gpu(model)
        except ThroughputError as error:
            raise WorkflowError(f"a throughput table in {paths.throughput_dir()}/ cannot be read: {error}")
        if model:
            notes[why if tables[name] else f"{why}; runtime and GPU memory requests are unmeasured guesses"] = True
    for note in notes:
        print(f"fedrepro: SLURM requests: {note}", file=sys.stderr)
    return tables


THROUGHPUT = _throughput_tables()


@functools.lru_cache(maxsize=None)
def _run_resources(path: str) -> dict:
    """A run's mem_mb, gpu_mem_mb and runtime, planned once (Snakemake asks for each resource separately)."""
    from fedrepro.fl.memory import planned

    key = RUNS[path]
    guess = cost.FALLBACK_RUNTIME["train_features" if PROJECT.resolver.run_config(key)["input"] == "features" else "train_images"]
    try:
        est = planned(PROJECT, key, workers=IMAGE_RUN_THREADS - 1)
    except Exception as error:  # noqa: BLE001 - planning never fails on an estimate
        print(f"fedrepro: no memory estimate for {path} ({error}); asking for {FALLBACK_MEMORY}", file=sys.stderr)
        return {**FALLBACK_MEMORY, "runtime": guess}
    if "error" in est.profile:
        print(f"fedrepro: {path}: {est.profile['error']}; asking for {FALLBACK_MEMORY}", file=sys.stderr)
        return {**FALLBACK_MEMORY, "runtime": guess}
    request = cost.train_request(PROJECT, key, est, THROUGHPUT["train"])
    return {"mem_mb": est.host_mb(), "gpu_mem_mb": request.gpu_mem_mb, "runtime": request.runtime}


def run_resources(wildcards) -> dict:
    """{"mem_mb", "gpu_mem_mb", "runtime"} of a run: host memory from its estimate (fedrepro.fl.memory) with the
    rule's loader workers; GPU memory and runtime from the measured rates where a table is here (fedrepro.cost)."""
    return _run_resources(run_key(wildcards).path)


@functools.lru_cache(maxsize=None)
def _features_request(dataset: str, key: str, threads: int):
    encoder = FEATURES[f"{dataset}/{key}"]["encoder"]
    return cost.features_request(THROUGHPUT["features"], dataset, encoder, max(1, threads - 1))


def features_request(wildcards, threads: int):
    """Runtime and GPU memory of a feature cache: one encoder pass, decoded by the job's workers (threads - 1)."""
    return _features_request(wildcards.dataset, wildcards.key, threads)


def image_cache_request(wildcards, threads: int):
    return cost.image_cache_request(THROUGHPUT["image_cache"], wildcards.dataset, threads)


def train_group(wildcards):
    # Feature-level runs are tiny: on a cluster they share one group, and the profile's
    # `group-components: train_features=N` packs N of them into one SLURM job.
    return "train_features" if on_features(wildcards) else None


def downstream_key(wildcards) -> str:
    key = run_key(wildcards)
    if f"{key.path}/{wildcards.task}" not in DOWNSTREAM:
        raise WorkflowError(f"no downstream evaluation {key.path}/{wildcards.task} in the configuration")
    return f"{key.path}/{wildcards.task}"


def downstream_job(wildcards) -> dict:
    return PROJECT.resolver.downstream_config(*DOWNSTREAM[downstream_key(wildcards)])


@functools.lru_cache(maxsize=None)
def _downstream_request(name: str):
    table = THROUGHPUT["downstream"]       # without one, the guess: no job config to build
    return cost.downstream_request(table, PROJECT.resolver.downstream_config(*DOWNSTREAM[name]) if table else None)


def downstream_request(wildcards):
    return _downstream_request(downstream_key(wildcards))


# A trained model is read by the downstream and embed jobs, but its time is not compared (`ancient`): a `dvc pull
# checkpoints` gives every model.pt the time of the pull, after the downstream results and embeddings made from it,
# and Snakemake would rerun them all (and, for the data they read, download, prepare and retrain). Each job also reads
# a file the training job writes beside the model (metrics.json, run_manifest.json), which is compared: a run
# trained again still reruns what was made from its model.


def downstream_inputs(wildcards) -> dict:
    job = downstream_job(wildcards)
    return {
        "model": ancient(job["paths"]["checkpoint"]),
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
    inputs = {"model": ancient(job["checkpoint"]), "run": paths.run_file(run_key(wildcards), "run_manifest.json"),
              **train_inputs(wildcards)}
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


def report_definition(wildcards) -> str:
    from fedrepro.report.definitions import definition_hash, report_definition

    return definition_hash(report_definition(PROJECT))


def overview_inputs(wildcards) -> list[str]:
    """The report page's inputs: the planned outputs that exist now (fedrepro.report.overview)."""
    from fedrepro.report import overview

    return overview.report_inputs(PROJECT)


def scorecard_inputs(wildcards) -> list[str]:
    from fedrepro.report import consistency

    papers = list(PROJECT.papers) if wildcards.paper == "all" else [wildcards.paper]
    tables = [paths.table(protocol, paper, table, ".csv") for protocol, paper, table in PROJECT.plan.tables() if paper in papers]
    runs = consistency.runs_behind(consistency.scorecard_inputs(PROJECT, wildcards.paper))
    return report_inputs(paths.scorecard(wildcards.paper),
                         tables + [paths.run_file(key, "run_manifest.json") for key in runs])
