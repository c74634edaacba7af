# Shared setup: validate the configuration and build the workflow's jobs once (JOBS, a fedrepro.dag.Dag): every
# input function, resource request and definition hash the rules bind is one of its methods, importable and
# tested (tests/test_dag.py). What stays here is Snakemake's own: its config, its errors, the profile it loaded,
# `--until`, `ancient` and the results folder's owner (checked once, before any job).

import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from fedrepro import paths
from fedrepro.config import ConfigError, Project, check_config_files, typed_overrides
from fedrepro.cost.runtime import FALLBACK_RUNTIME
from fedrepro.dag import Dag, figure_outputs, per_attempt, scorecard_outputs, table_outputs
from fedrepro.dag.owner import ResultsOwned, claim
from fedrepro.paths import RunKey


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


def profile_gpu_model(rule: str) -> str | None:
    """The GPU model the profile Snakemake loaded asks for ``rule``, else the train rule's (None without one)."""
    for name in (rule, "train"):
        value = workflow.resource_settings.overwrite_resources.get(name, {}).get("gpu_model")
        if value is not None:
            return str(getattr(value, "raw", value))     # a profile's string, as written
    return None


# the config files Snakemake was given (none: config/config.yaml), as report jobs pass them on (--configfiles): a
# refusal's rebuild command names them, so a demo user does not rebuild against the full configuration
CONFIGFILES = " ".join(shlex.quote(os.path.relpath(f) if Path(f).resolve().is_relative_to(Path.cwd().resolve()) else str(f))
                       for f in workflow.overwrite_configfiles)
JOBS = Dag(PROJECT, gpu_model_of=profile_gpu_model, configfiles=CONFIGFILES, error=WorkflowError)
JOBS.out_of_date.prepare(JOBS.report_targets())    # every report's mark exists before planning (dag/out_of_date.py)
# one results folder, one configuration: refused before any job when this one would overwrite another's runs
try:
    claim(PROJECT, workflow.overwrite_configfiles, config.get("force_results_dir"),
          say=lambda line: print(line, file=sys.stderr))
except ResultsOwned as error:
    raise WorkflowError(str(error))
RAW = JOBS.raw
train_group = JOBS.train_group     # a rule's group: a name, or a function of the wildcards such as this one
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


def all_outputs(wildcards=None) -> list[str]:
    """What `all` builds (JOBS.all_outputs). `--until` reads every word after it as a rule (or file), so `--until
    weights all` would plan the whole grid (downloads, training), not the weights: stop before any job is planned,
    with the command that was meant. (Snakemake sets `dag_settings` after parsing this file, so the check runs in
    the input function of `all`, which `--until all` makes a target.)"""
    dag_settings = getattr(workflow, "dag_settings", None)
    if dag_settings is not None and "all" in dag_settings.until:
        rules_ = " ".join(sorted(set(dag_settings.until) - {"all"})) or "<rule>"
        raise WorkflowError(
            f"`--until` was given `all`: Snakemake reads every word after `--until` as a rule to run up to, so this "
            f"would plan the whole grid (downloads and training included). Put the target first "
            f"(`snakemake all --until {rules_}`); for the pretrained weights alone: `snakemake --cores 2 all_weights`.")
    return JOBS.all_outputs()


def by_content(inputs: dict) -> dict:
    """A job's inputs with the record of each file that has one (JOBS.by_content), the file itself `ancient`: its
    content decides what reruns, not its modification time (fedrepro.dag.jobs, "deciding by content")."""
    return {name: ancient(path) if JOBS.decided_by_content(path) else path for name, path in JOBS.by_content(inputs).items()}


def ancient_model(inputs: dict) -> dict:
    """A trained model is read by the downstream and embed jobs, but its time is not compared (`ancient`): a `dvc
    pull checkpoints` gives every model.pt the time of the pull, after the downstream results and embeddings made
    from it, and Snakemake would rerun them all (and, for the data they read, download, prepare and retrain). Each
    job also reads a file the training job writes beside the model (metrics.json, run_manifest.json), which is
    compared: a run trained again still reruns what was made from its model."""
    return {**inputs, "model": ancient(inputs["model"])}
