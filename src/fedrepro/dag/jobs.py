"""Every job of the workflow as a function of the configuration: what it reads, what it is made from, what it asks
for. The rules (``workflow/rules/*.smk``) only bind these to their inputs, params and resources.

Paths come from :mod:`fedrepro.paths` (the one place they are spelled); a rule's input function takes Snakemake's
``wildcards`` (any object with the rule's wildcards as attributes: a test passes a ``SimpleNamespace``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

from .. import paths
from ..models.weights import WeightsError, encoder_weights, weight_specs
from ..models.weights import check as check_weights
from ..paths import RunKey
from .out_of_date import OutOfDate
from .requests import Requests


class DagError(ValueError):
    """A wildcard that names nothing in the configuration, a weights copy that fails its check, a throughput table
    that cannot be read: the workflow stops with this message before any job runs."""


def _say(line: str) -> None:
    print(line, file=sys.stderr)


class Dag:
    """The workflow's jobs for one :class:`~fedrepro.config.Project`, built once by the Snakefile (``DAG``).

    ``gpu_model_of(rule)``: the GPU model the SLURM profile asks for ``rule`` (SLURM requests, :mod:`.requests`);
    ``configfiles``: the config files Snakemake was given, shell-quoted, as report jobs pass them on; ``error``: the
    exception the lookups raise (the Snakefile passes Snakemake's ``WorkflowError``; default :class:`DagError`);
    ``say``: where notes go (stderr)."""

    def __init__(self, project, gpu_model_of: Callable[[str], str | None] = lambda rule: None, configfiles: str = "",
                 error: type[Exception] = DagError, say: Callable[[str], None] = _say):
        self.project, self.error, self.say = project, error, say
        self.raw = project.config["data"]["raw_dir"]
        self.runs = {key.path: key for key in project.plan.runs()}
        self.splits = project.plan.splits()
        self.features = {f"{dataset}/{key}": job for (dataset, key), job in project.plan.features().items()}
        self.downstream_jobs = project.plan.downstream_jobs()
        self.config_json = json.dumps(project.config, sort_keys=True)
        self.configfiles_text = configfiles
        self.out_of_date = OutOfDate(project, say)
        self.requests = Requests(self, gpu_model_of, error, say)
        self._checked_weights: set[str] = set()
        self._skewed: set[str] = set()
        self._vouched: dict[str, bool] = {}

    # ---- targets ------------------------------------------------------------------------------

    def all_outputs(self) -> list[str]:
        """What `all` builds: the kinds of output the configuration names (`outputs`)."""
        project = self.project
        kinds = {
            "tables": lambda: [paths.table(protocol, paper, table) for protocol, paper, table in project.plan.tables()],
            "figures": lambda: [paths.figure(protocol, paper, figure) for protocol, paper, figure in project.plan.figures()],
            "scorecards": lambda: [paths.scorecard(paper) for paper in project.papers] + [paths.scorecard("all")],
            "evidence": lambda: [paths.evidence()] if project.config.get("evidence") else [],
        }
        return [target for kind in project.config["outputs"] for target in kinds[kind]()]

    def report_targets(self) -> list[str]:
        """Every table, figure, scorecard and evidence page the configuration plans (whatever `outputs` says): the
        reports that have an out-of-date mark (:meth:`report_inputs`)."""
        plan = self.project.plan
        return ([paths.table(*t) for t in plan.tables()] + [paths.figure(*f) for f in plan.figures()]
                + [paths.scorecard(p) for p in [*self.project.papers, "all"]]
                + ([paths.evidence()] if self.project.config.get("evidence") else []))

    def target(self, name: str):
        """The jobs building file ``name`` (or ``all``) needs (:mod:`.targets`; ``fedrepro estimate`` prints them)."""
        from .targets import resolve

        return resolve(self, name)

    # ---- data ---------------------------------------------------------------------------------

    @staticmethod
    def raw_root(marker: str) -> str:
        """The raw-data root of a dataset's marker file (``<root>/<dataset>/.complete``)."""
        return str(Path(marker).parent.parent)

    def download_inputs(self, wildcards) -> list[str]:
        """A folder dataset's labels CSV (fedrepro.data.folder): a new CSV links and prepares the dataset again."""
        from ..data.folder import is_folder
        from ..registry import dataset as dataset_spec

        spec = dataset_spec(wildcards.dataset)
        return [spec.options["labels"]] if is_folder(spec) else []

    def prepare_inputs(self, wildcards) -> list[str]:
        from ..registry import DATASETS

        depends_on = DATASETS.get(wildcards.dataset).obj.depends_on
        return [paths.raw_marker(wildcards.dataset, self.raw)] + [paths.manifest(d) for d in depends_on]

    def split_of(self, wildcards) -> dict:
        if wildcards.split not in self.splits:
            raise self.error(f"no split {wildcards.split} in the configuration")
        return self.splits[wildcards.split]

    def feature_job(self, wildcards) -> dict:
        """A feature cache's {encoder, jpeg_draft, pixels}."""
        return self.features[f"{wildcards.dataset}/{wildcards.key}"]

    @staticmethod
    def class_texts(dataset: str) -> list[str]:
        """What a CLIP prompt says for each class of ``dataset`` (fedrepro.data.spec.DatasetSpec.class_texts)."""
        from ..registry import dataset as dataset_spec

        return list(dataset_spec(dataset).class_texts)

    # ---- deciding by content ------------------------------------------------------------------
    # The inputs every job after `prepare` reads (manifest, split, image and feature caches) come with a record of
    # what they hold (fedrepro.records): a job reads such a file `ancient` (its modification time is not compared)
    # together with its record, an ordinary input. Snakemake compares a small file's checksum when its time is newer
    # (it records the checksum of every input under 1 MB when a job ends), and a record holds no time, so a file
    # rebuilt with the same bytes, pulled, or stamped by a skewed clock reruns nothing; one rebuilt with other bytes
    # has another record and reruns what reads it; a producer that runs in the same invocation makes its readers
    # run (the record is not ancient). Big files alone would be compared by time: Snakemake hashes no input over 1 MB.

    def decided_by_content(self, path) -> bool:
        """Whether input ``path`` has a record that decides for it (the rules read it `ancient`): one that still
        vouches for it. A file that holds other than its record says (a manifest edited by hand, a cache replaced)
        is decided by its modification time, as a file without a record is, and named once; its readers then rerun
        and refuse a derived file by name (fedrepro.records.verify)."""
        if not isinstance(path, str) or paths.provenance_of(path) is None:
            return False
        if path not in self._vouched:
            self._vouched[path] = self._vouches(path, paths.provenance_of(path))
        return self._vouched[path]

    def _vouches(self, path: str, record: str) -> bool:
        """Cheap: a file not changed (ctime, which no copy can set back) since its record was written is what the
        record describes; only one changed since is compared with it (a digest)."""
        from .. import records

        try:
            if os.stat(path).st_ctime_ns <= os.stat(record).st_mtime_ns:
                return True
            recorded = records.read(path.removesuffix(".index.npz") + ".u8" if path.endswith(".index.npz") else path)
        except (OSError, records.ChangedFile):
            return True          # a missing file or record is rebuilt anyway; an unreadable record, refused by the job
        if recorded is None or recorded["files"].get(Path(path).name) in (None, records.digest(path)):
            return True
        self.say(f"fedrepro: {path} is not what {record} says its job wrote (edited or replaced since): its "
                 f"modification time decides what reruns, not its record")
        return False

    def by_content(self, inputs: dict) -> dict:
        """``inputs`` (a rule's named inputs) with the record of each file that has one, as ``<name>_provenance``,
        whether or not it still vouches for the file (:meth:`decided_by_content` decides only whether the file is
        read `ancient`): a job's set of inputs must not change with it, or Snakemake reruns the job for that alone.
        A file or record whose modification time lies in the future is named once (clocks of the machines that
        share the folder disagree): its content decides, its time is not acted on."""
        out = dict(inputs)
        for name, path in inputs.items():
            record = paths.provenance_of(path) if isinstance(path, str) else None
            if record is None:
                continue
            if record not in out.values():             # an image cache and its index share one
                out[f"{name}_provenance"] = record
            if self.decided_by_content(path):
                self._note_skew(path, record)
        return out

    def _note_skew(self, *files: str) -> None:
        now = time.time()
        for path in files:
            if path in self._skewed:
                continue
            try:
                ahead = os.stat(path).st_mtime - now
            except OSError:
                continue
            if ahead > 1:
                self._skewed.add(path)
                self.say(f"fedrepro: {path} is dated {ahead / 3600:.1f} h in the future (the clocks of the machines "
                         f"sharing this folder disagree?): its content decides what reruns, not its time; a job that "
                         f"has to read it anyway is failed by Snakemake's own clock check until then (or `touch {path}`)")

    # ---- pretrained weights -------------------------------------------------------------------

    def weights_inputs(self, specs) -> list[str]:
        """The manifests of the pretrained-weights resources a job loads (the `weights` rule fetches a
        missing one first, as a local job). A local copy that is already there must have every file it
        lists at its recorded size: checked here, on the machine that runs Snakemake, so a missing or
        truncated file stops the workflow with the command that fetches it again before anything is
        submitted, instead of failing (and being retried) on a compute node. The job itself verifies
        every SHA-256 before it reads any data."""
        out = []
        for spec in specs:
            manifest = paths.weights_manifest(spec.id)
            if Path(manifest).exists() and spec.id not in self._checked_weights:
                try:
                    check_weights(spec, deep=False)
                except WeightsError as error:
                    raise self.error(str(error))
                self._checked_weights.add(spec.id)
            out.append(manifest)
        return out

    def all_weights(self, wildcards=None) -> list[str]:
        """What `all_weights` fetches: the manifest of every pretrained-weights resource some job loads."""
        return self.weights_inputs(self.project.plan.weights().values())

    def features_weights(self, wildcards) -> list[str]:
        return self.weights_inputs(encoder_weights(self.feature_job(wildcards)["encoder"]))

    # ---- runs ---------------------------------------------------------------------------------

    def run_key(self, wildcards) -> RunKey:
        path = f"{wildcards.protocol}/{wildcards.paper}/{wildcards.setting}/{wildcards.method}/seed{wildcards.seed}"
        if path not in self.runs:
            raise self.error(f"no run {path} in the configuration")
        return self.runs[path]

    def run_config(self, wildcards) -> dict:
        return self.project.resolver.run_config(self.run_key(wildcards))

    def train_inputs(self, wildcards) -> dict:
        run = self.run_config(wildcards)
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
                inputs["raw"] = paths.raw_marker(run["dataset"], self.raw)
        weights = self.weights_inputs(weight_specs(run["train"]["model"]))
        if weights:
            inputs["weights"] = weights
        return inputs

    def on_features(self, wildcards) -> bool:
        """Runs on cached encoder features take seconds to minutes on a CPU; image runs want a GPU."""
        return self.run_config(wildcards)["input"] == "features"

    def train_group(self, wildcards) -> str | None:
        # Feature-level runs are tiny: on a cluster they share one group, and the profile's
        # `group-components: train_features=N` packs N of them into one SLURM job.
        return "train_features" if self.on_features(wildcards) else None

    def train_threads(self, wildcards) -> int:
        """Image runs: one CPU trains, the rest decode (``image_run_threads``); runs on features: one."""
        return 1 if self.on_features(wildcards) else self.requests.image_run_threads

    # ---- downstream evaluations and embeddings -------------------------------------------------
    # A trained model is read by the downstream and embed jobs (``model``), whose rules mark it `ancient`; each job
    # also reads a file the training job writes beside the model, which is compared (docs/cluster-and-cache.md).

    def downstream_key(self, wildcards) -> str:
        key = self.run_key(wildcards)
        if f"{key.path}/{wildcards.task}" not in self.downstream_jobs:
            raise self.error(f"no downstream evaluation {key.path}/{wildcards.task} in the configuration")
        return f"{key.path}/{wildcards.task}"

    def downstream_job(self, wildcards) -> dict:
        return self.project.resolver.downstream_config(*self.downstream_jobs[self.downstream_key(wildcards)])

    def downstream_inputs(self, wildcards) -> dict:
        job = self.downstream_job(wildcards)
        return {
            "model": job["paths"]["checkpoint"],
            "metrics": job["paths"]["metrics"],
            "manifest": job["paths"]["manifest"],
            "raw": paths.raw_marker(job["spec"]["dataset"], self.raw),
            "weights": self.weights_inputs(weight_specs(job["run"]["train"]["model"])),
        }

    def embed_job(self, wildcards) -> dict:
        return self.project.resolver.embed_job(self.run_key(wildcards), wildcards.figure)

    def embed_inputs(self, wildcards) -> dict:
        from ..embed import model_config as embed_model_config

        job = self.embed_job(wildcards)
        inputs = {"model": job["checkpoint"], "run": paths.run_file(self.run_key(wildcards), "run_manifest.json"),
                  **self.train_inputs(wildcards)}
        inputs["weights"] = self.weights_inputs(weight_specs(embed_model_config(job["run"])))
        return inputs

    # ---- reports ------------------------------------------------------------------------------
    # A report's inputs include the run_manifest.json of every run it reads (its job checks that each run was made
    # from the manifest, split and weights that are here now: fedrepro.report.consistency) and its out-of-date mark.

    def report_inputs(self, target: str, files: list[str]) -> list[str]:
        """What report ``target`` reads, as Snakemake plans it: ``files`` and its out-of-date mark. Planning a report
        runs the two out-of-date steps here, by name (:mod:`.out_of_date`): decide why it is out of date (writes
        nothing), then record that in its mark, the one file planning writes."""
        reasons = self.out_of_date.decide(target, files)
        return [*files, self.out_of_date.record(target, reasons)]

    def table_files(self, protocol: str, paper: str, table: str) -> list[str]:
        """The files a table reads (its kind's declared inputs and their runs' manifests)."""
        from ..report.consistency import with_run_manifests
        from ..report.tables import table_inputs, table_item

        return with_run_manifests(table_inputs(table_item(self.project, protocol, paper, table)))

    def figure_files(self, protocol: str, paper: str, figure: str) -> list[str]:
        from ..report.consistency import with_run_manifests
        from ..report.figures import figure_inputs, figure_item

        return with_run_manifests(figure_inputs(figure_item(self.project, protocol, paper, figure)))

    def evidence_files(self) -> list[str]:
        from ..report.consistency import with_run_manifests
        from ..report.evidence import run_inputs

        return with_run_manifests(run_inputs(self.project))

    def scorecard_files(self, paper: str) -> list[str]:
        from ..report import consistency

        papers = list(self.project.papers) if paper == "all" else [paper]
        tables = [paths.table(protocol, p, table, ".csv") for protocol, p, table in self.project.plan.tables() if p in papers]
        runs = consistency.runs_behind(consistency.scorecard_inputs(self.project, paper))
        return tables + [paths.run_file(key, "run_manifest.json") for key in runs]

    def table_inputs(self, wildcards) -> list[str]:
        return self.report_inputs(paths.table(wildcards.protocol, wildcards.paper, wildcards.table),
                                  self.table_files(wildcards.protocol, wildcards.paper, wildcards.table))

    def figure_inputs(self, wildcards) -> list[str]:
        return self.report_inputs(paths.figure(wildcards.protocol, wildcards.paper, wildcards.figure),
                                  self.figure_files(wildcards.protocol, wildcards.paper, wildcards.figure))

    def scorecard_inputs(self, wildcards) -> list[str]:
        return self.report_inputs(paths.scorecard(wildcards.paper), self.scorecard_files(wildcards.paper))

    def evidence_inputs(self, wildcards=None) -> list[str]:
        return self.report_inputs(paths.evidence(), self.evidence_files())

    def overview_inputs(self, wildcards) -> list[str]:
        """The report page's inputs: the planned outputs that exist now (fedrepro.report.overview)."""
        from ..report import overview

        return overview.report_inputs(self.project)

    # What each table, figure, scorecard and the evidence page is made from besides its input files (its spec, the
    # labels it prints, ...), hashed: a param of its rule, so editing one definition rebuilds exactly that output.

    def configuration(self, wildcards, output) -> str:
        """The whole configuration, for a report job to rebuild the project from. It takes ``output``, which makes it
        a param Snakemake derives from files and does not compare between runs: a change to the configuration
        reruns only the outputs whose definition param it changes."""
        return self.config_json

    def configfiles(self, wildcards, output) -> str:
        """The config files Snakemake was given, shell-quoted, which a refusal's rebuild command names; like
        ``configuration``, a param Snakemake does not compare between runs."""
        return self.configfiles_text

    def table_definition(self, wildcards) -> str:
        from ..report.definitions import definition_hash, item_definition
        from ..report.tables import table_item

        return definition_hash(item_definition(table_item(self.project, wildcards.protocol, wildcards.paper,
                                                          wildcards.table)))

    def figure_definition(self, wildcards) -> str:
        from ..report.definitions import definition_hash, item_definition
        from ..report.figures import figure_item

        return definition_hash(item_definition(figure_item(self.project, wildcards.protocol, wildcards.paper,
                                                           wildcards.figure)))

    def scorecard_definition(self, wildcards) -> str:
        from ..report.definitions import definition_hash, scorecard_definition

        return definition_hash(scorecard_definition(self.project, wildcards.paper))

    def evidence_definition(self, wildcards) -> str:
        from ..report.definitions import definition_hash, evidence_definition

        return definition_hash(evidence_definition(self.project))

    def report_definition(self, wildcards) -> str:
        from ..report.definitions import definition_hash, report_definition

        return definition_hash(report_definition(self.project))
