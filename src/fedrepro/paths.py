"""Every file the pipeline reads or writes, named in one place.

Configuration resolution, the Snakemake rules (through ``workflow/rules/common.smk``), the training
and downstream jobs and the report all ask these functions; nothing else spells a path. Runs, tables
and figures carry their protocol (``clean`` or ``paper``) in the path, so results of the two protocols
live side by side and never overwrite each other; a run computed with other numerics than the authors' (the
default, README "Numerics") carries them too (``results/runs/clean-fast/...``), so runs of different numerics
never overwrite each other either, and runs at the authors' numerics keep the paths they always had.

    resources/raw/<dataset>/                              raw files (+ .complete when verified)
    resources/manifests/<dataset>.csv                     one row per image (+ .skipped.csv)
    resources/splits/<split>.json                         client index file (+ .counts.csv, .png)
    resources/images/<dataset>/<decode spec>.u8           decode-once image cache (+ .index.npz)
    resources/features/<dataset>/<encoder key>.pt         frozen-encoder feature cache
    <any of these four>.provenance                        what it holds and was made from (fedrepro.records)
    resources/weights/<weights id>/                       pretrained weights, fetched once (+ weights.json:
                                                          every file's SHA-256, the source and its revision;
                                                          .fetch.json: when, with which library versions)
    resources/model_profiles/<key>.json                   a model's memory figures (a cache, fedrepro.cost.memory)
    resources/folder_checks/<dataset>.json                what the check of a folder dataset's files found (a cache)
    benchmarks/gpu/<device>.csv                           a GPU's measured throughput table (fedrepro.cost.throughput)
    benchmarks/dataset_sizes.csv                          images per dataset where no split file is there (assumptions)
    results/runs/<protocol>/<paper>/<setting>/<method>/seed<k>/{metrics.json, history.csv,
                                                          predictions.npz, run_manifest.json}
                                                          (<protocol>-fast/...: a run under the fast numerics)
    results/checkpoints/<protocol>/<paper>/<setting>/<method>/seed<k>/model.pt (resume.pt and clients/ while running)
    results/downstream/<protocol>/<paper>/<setting>/<method>/seed<k>/<task>.json
    results/embeddings/<protocol>/<paper>/<setting>/<method>/seed<k>/<figure>.npz
    results/.fedrepro-owner                               the config files whose results the folder holds
    results/tables/<protocol>/<paper>/<table>.{md,csv,tex,seeds.csv,provenance}
    results/figures/<protocol>/<paper>/<figure>.{png,pdf}
    results/scorecards/<paper>.{md,html,csv,png,provenance}   (and all.* across papers)
    results/extensions/<name>/{tables,scorecards,evidence}/...   an extension's reports (same runs; docs/plugins.md)
    results/report.html                                   the report: what is built, per paper
    logs/<rule>/<job>.log                                 a job's log: every attempt (+ .<job>.log.attempts)
    results/parity/<paper>/                               a whole-run parity comparison's fixture, the authors' record
                                                          and the replayed run (fedrepro parity; docs/parity.md)
    tests/data/parity/<paper>/                            its golden record, which CI replays without the authors' code
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RAW_DIR = "resources/raw"
# where a configuration's results go (``results_dir`` of the config; set by fedrepro.config.Project): the demo and
# the full grid write to results/, the evidence run to results/evidence-run/, so neither overwrites the other
_RESULTS = {"dir": "results"}
WEIGHTS_DIR = "resources/weights"
PUBLISHED_DIR = "config/published"
RUN_FILES = ("metrics.json", "history.csv", "predictions.npz", "run_manifest.json")


DEFAULT_NUMERICS = "authors"
NUMERICS = ("authors", "fast")


@dataclass(frozen=True)
class RunKey:
    """One training job: (paper, protocol, setting, method variant, seed), computed with ``numerics``
    (``authors`` or ``fast``; fedrepro.config.resolve)."""

    paper: str
    protocol: str
    setting: str
    method: str
    seed: int
    numerics: str = DEFAULT_NUMERICS

    @property
    def folder(self) -> str:
        """The run's top folder: its protocol, with ``-<numerics>`` where it does not compute as the authors did."""
        return self.protocol if self.numerics == DEFAULT_NUMERICS else f"{self.protocol}-{self.numerics}"

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.paper}/{self.setting}/{self.method}/seed{self.seed}"


def split_folder(folder: str) -> tuple[str, str]:
    """A run folder (:attr:`RunKey.folder`) -> (protocol, numerics)."""
    protocol, _, numerics = folder.partition("-")
    return protocol, numerics or DEFAULT_NUMERICS


# ---- data --------------------------------------------------------------------------------------

def raw_dir(dataset: str, root: str = RAW_DIR) -> str:
    return f"{root}/{dataset}"


def raw_marker(dataset: str, root: str = RAW_DIR) -> str:
    """Written when a dataset's raw files are downloaded (or placed) and verified."""
    return f"{root}/{dataset}/.complete"


def manifest(dataset: str) -> str:
    return f"resources/manifests/{dataset}.csv"


def manifest_skipped(dataset: str) -> str:
    return f"resources/manifests/{dataset}.skipped.csv"


def split(split_id: str, suffix: str = ".json") -> str:
    """``suffix``: ``.json`` (the index file), ``.counts.csv`` or ``.png``."""
    return f"resources/splits/{split_id}{suffix}"


def image_cache(dataset: str, spec_key: str) -> str:
    return f"resources/images/{dataset}/{spec_key}.u8"


def image_cache_index(pixels: str) -> str:
    return pixels.removesuffix(".u8") + ".index.npz"


def features(dataset: str, key: str) -> str:
    return f"resources/features/{dataset}/{key}.pt"


PROVENANCE = ".provenance"


def provenance(path: str) -> str:
    """The record beside a file its job wrote: the digests of what it holds and of what it was made from
    (:mod:`fedrepro.records`). A suffix no other output ends with, so no rule's pattern matches it by mistake."""
    return f"{path}{PROVENANCE}"


def provenance_of(path: str) -> str | None:
    """The record that vouches for input ``path`` (a manifest, a split, an image cache or its index, a feature
    cache), or None for a file without one. The rules decide by it, not by ``path``'s modification time
    (:meth:`fedrepro.dag.Dag.by_content`)."""
    path = str(path)
    if path.startswith("resources/manifests/") and path.endswith(".csv") and not path.endswith(".skipped.csv"):
        return provenance(path)
    if path.startswith("resources/splits/") and path.endswith(".json"):
        return provenance(path)
    if path.startswith("resources/images/") and path.endswith((".u8", ".index.npz")):
        return provenance(path.removesuffix(".index.npz") + ".u8" if path.endswith(".index.npz") else path)
    if path.startswith("resources/features/") and path.endswith(".pt"):
        return provenance(path)
    return None


def weights_dir(weights_id: str, root: str = WEIGHTS_DIR) -> str:
    """The local copy of one pretrained-weights resource (``fedrepro.models.weights``)."""
    return f"{root}/{weights_id}"


def weights_manifest(weights_id: str, root: str = WEIGHTS_DIR) -> str:
    """Written last by the ``weights`` rule: every file's SHA-256 and size, the source and its revision."""
    return f"{root}/{weights_id}/weights.json"


def weights_fetch_record(weights_id: str, root: str = WEIGHTS_DIR) -> str:
    """When a resource was last fetched and with which library versions (beside its manifest, not in it)."""
    return f"{root}/{weights_id}/.fetch.json"


def folder_check(dataset: str) -> str:
    """What the configuration check found in a folder dataset's files (their fingerprint), so it opens them once."""
    return f"resources/folder_checks/{dataset}.json"


def model_profile(key: str) -> str:
    """A model's and method's memory figures, computed once on the meta device (fedrepro.cost.memory)."""
    return f"resources/model_profiles/{key}.json"


THROUGHPUT_DIR = "benchmarks/gpu"
DATASET_SIZES = "benchmarks/dataset_sizes.csv"
SLURM_PROFILE = "workflow/profiles/slurm/config.yaml"


def throughput_dir() -> str:
    """Where the GPU throughput tables live (``benchmarks/train_step.py --device cuda`` writes them)."""
    return THROUGHPUT_DIR


def throughput_table(device_slug: str) -> str:
    """One GPU's throughput table (:func:`fedrepro.cost.throughput.slug` of its device name)."""
    return f"{THROUGHPUT_DIR}/{device_slug}.csv"


def published(relative: str) -> str:
    """A published-values CSV named by a table's ``published:`` (relative to config/published)."""
    return f"{PUBLISHED_DIR}/{relative}"


# ---- runs --------------------------------------------------------------------------------------

def use_results_dir(folder: str) -> None:
    """Every result path below starts with ``folder`` (the configuration's ``results_dir``) from now on, the reports
    (tables, figures, scorecards, evidence) too until :func:`use_report_dir` says otherwise."""
    _RESULTS["dir"] = str(folder).rstrip("/")
    _RESULTS.pop("reports", None)


def use_report_dir(folder: str) -> None:
    """Tables, figures, scorecards and the evidence page go to ``folder`` from now on, runs stay where they are: an
    extension's reports (``<results_dir>/extensions/<name>``) are made from the same runs as the papers' own."""
    _RESULTS["reports"] = str(folder).rstrip("/")


def results_dir() -> str:
    return _RESULTS["dir"]


def report_dir() -> str:
    return _RESULTS.get("reports", _RESULTS["dir"])


def results_owner() -> str:
    """Which configuration files the results folder belongs to (fedrepro.dag.owner): another configuration is
    refused before it overwrites a run of theirs."""
    return f"{results_dir()}/.fedrepro-owner"


def extension_dir(name: str) -> str:
    """Where an extension's tables, scorecards and evidence page go (``extension.name`` of the configuration)."""
    return f"{results_dir()}/extensions/{name}"


def parity_work(paper: str) -> str:
    """Where ``fedrepro parity <paper>`` builds its fixture, records the authors' run and replays ours."""
    return f"{results_dir()}/parity/{paper}"


def parity_record(paper: str) -> str:
    """A paper's committed golden parity record (what CI replays fedrepro against)."""
    return f"tests/data/parity/{paper}"


def run_dir(key: RunKey) -> str:
    return f"{results_dir()}/runs/{key.path}"


def run_file(key: RunKey, name: str = "metrics.json") -> str:
    return f"{run_dir(key)}/{name}"


def checkpoint_dir(key: RunKey) -> str:
    return f"{results_dir()}/checkpoints/{key.path}"


def client_states(checkpoint_dir: str | Path) -> str:
    """Per-client state kept on disk between a client's turns while a run is unfinished, one folder per
    store, one file per client (fedrepro.fl.client_state); removed with resume.pt when the run ends."""
    return f"{checkpoint_dir}/clients"


def model_file(key: RunKey) -> str:
    return f"{checkpoint_dir(key)}/model.pt"


def downstream(key: RunKey, task: str) -> str:
    return f"{results_dir()}/downstream/{key.path}/{task}.json"


def embedding(key: RunKey, figure: str) -> str:
    """What a figure needs from a trained model (features, prototype patches), extracted once."""
    return f"{results_dir()}/embeddings/{key.path}/{figure}.npz"


_RUN_TREES = ("runs/", "checkpoints/", "downstream/", "embeddings/")


def run_key_of(path: str) -> RunKey | None:
    """The run a file under one of the run trees belongs to (its metrics, checkpoint, downstream result or
    embedding), or None for any other file."""
    for tree in (f"{results_dir()}/{t}" for t in _RUN_TREES):
        if path.startswith(tree):
            parts = path[len(tree):].split("/")
            if len(parts) >= 6 and parts[4].startswith("seed") and parts[4][4:].isdigit():
                folder, paper, setting, method = parts[:4]
                protocol, numerics = split_folder(folder)
                return RunKey(paper, protocol, setting, method, int(parts[4][4:]), numerics)
    return None


def downstream_of(path: str) -> tuple[RunKey, str] | None:
    """(run, task) of a downstream result file (:func:`downstream`), or None for any other file."""
    key = run_key_of(path) if path.startswith(f"{results_dir()}/downstream/") and path.endswith(".json") else None
    return None if key is None else (key, Path(path).stem)


# ---- report ------------------------------------------------------------------------------------

def table(protocol: str, paper: str, name: str, suffix: str = ".md") -> str:
    """``suffix``: ``.md``, ``.csv``, ``.tex`` or ``.seeds.csv``."""
    return f"{report_dir()}/tables/{protocol}/{paper}/{name}{suffix}"


def figure(protocol: str, paper: str, name: str, suffix: str = ".png") -> str:
    return f"{report_dir()}/figures/{protocol}/{paper}/{name}{suffix}"


def scorecard(paper: str, suffix: str = ".html") -> str:
    """``paper``: a paper, or ``all`` for every paper together."""
    return f"{report_dir()}/scorecards/{paper}{suffix}"


def evidence(name: str = "index.html") -> str:
    """The learning-bar evidence page and its files (<results>/evidence/)."""
    return f"{report_dir()}/evidence/{name}"


def report() -> str:
    """The report: one self-contained page of everything the configuration has built (fedrepro.report.overview), beside
    the tables and scorecards it shows (an extension's in its own folder)."""
    return f"{report_dir()}/report.html"


def report_mark(target: str) -> str:
    """An input of a table, figure, scorecard or the evidence page that the workflow rewrites when the report is
    out of date though nothing it reads is newer (a run file deleted, an input put back with its old mtime:
    fedrepro.report.consistency.out_of_date), so that Snakemake makes it again; beside Snakemake's own records."""
    return f".snakemake/fedrepro/out-of-date/{target}"


def log(kind: str, name: str) -> str:
    return f"logs/{kind}/{name}.log"


def log_attempts(log_file: str) -> str:
    """Where every attempt of a job appends its output (the job's log is a hard link to it: ``fedrepro --log``)."""
    folder, _, name = str(log_file).rpartition("/")
    return f"{folder}/.{name}.attempts" if folder else f".{name}.attempts"


def as_path(value: str) -> Path:
    return Path(value)
