"""A report is built only from files that are what made them, for this configuration.

What :mod:`.consistency` compares is what a run was made from (manifest, split, caches, weights); this module
checks the other end of the chain, what a run (and what was made from it) wrote, before a table, figure,
scorecard, the evidence page or the report reads it:

- a run's ``run_manifest.json`` carries the SHA-256 of its own content and the digests of the files the run wrote
  (``outputs``: metrics.json, history.csv, predictions.npz, model.pt; :func:`fedrepro.train.run_outputs`): a file
  edited, cut off or copied from another run since is refused by name;
- the run was made by this configuration: its config hash is the one the configuration gives the run now (a
  second configuration writing the same folder, or ``--rerun-triggers mtime`` keeping a run whose
  hyper-parameters changed, would put runs of two configurations into one cell);
- ``metrics.json`` agrees with ``predictions.npz``: the selected round's metrics are computed again from the
  stored probabilities and labels (:func:`fedrepro.metrics.classification_metrics`), where the selection rule
  picked one round;
- a downstream result carries the SHA-256 of its own content; an embedding, the config hash and the digest of the
  model it was extracted from, which must be its run's;
- a table and a scorecard record the digests of their own files and of what they were made from (their
  ``.provenance``, :mod:`fedrepro.records`): a scorecard refuses a table CSV cut off since, and the report a table
  or scorecard that is not what its job wrote. :func:`report_changed` tells the workflow, while it plans, that a
  table or scorecard whose files or inputs changed without a newer modification time must be made again.

The refusals (:mod:`.consistency`, which imports this module) name the file, what it should hold or have been
made from, and the command that rebuilds it (:func:`fedrepro.report.consistency.rebuild_command`). Files written before these records existed carry none and
are read as before. What it costs: one SHA-256 of each small run file, and one read of predictions.npz per run
and report (benchmarks/provenance.py prints both).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from .. import paths, records
from ..config import Project
from ..io import StaleInput, content_damage, content_digest, read_json
from ..paths import RunKey

# the metrics computed again from predictions.npz (those a table or figure prints; "n" and "ece" follow them)
RECOMPUTED = ("acc", "bacc", "f1", "auc")


class ChangedFiles(StaleInput):
    """Files a report would read are not what made them, or were made by another configuration."""


def run_problems(project: Project, key: RunKey) -> list[str]:
    """What is wrong with run ``key``'s files, for this configuration: each as "<file>: what" (empty: nothing)."""
    manifest_path = paths.run_file(key, "run_manifest.json")
    manifest = read_json(manifest_path)
    if content_damage(manifest):
        return [f"{manifest_path}: its content does not match the SHA-256 recorded in it (edited since the run wrote it)"]
    problems = []
    made_by = (manifest.get("run") or {}).get("config_hash")
    wanted = project.resolver.run_config(key)["config_hash"]
    if made_by != wanted:
        problems.append(f"{paths.run_dir(key)}: made by another configuration (config hash {made_by}; this "
                        f"configuration makes the run with {wanted})")
    outputs = manifest.get("outputs") or {}
    for name in ("metrics.json", "history.csv", "predictions.npz"):
        path = paths.run_file(key, name)
        if name in outputs and Path(path).is_file() and (now := content_digest(path)) != outputs[name]:
            problems.append(f"{path}: holds {now[:19]}…, the run wrote {outputs[name][:19]}… ({manifest_path}): "
                            f"changed since")
    if not problems:
        problems += disagreements(paths.run_file(key), paths.run_file(key, "predictions.npz"))
    return problems


def disagreements(metrics_path: str, predictions_path: str) -> list[str]:
    """Where ``metrics.json`` says other than its predictions give: the metrics of every eval set of the selected
    round, computed again from the probabilities and labels stored for it. Only where the selection rule picked
    one round (``last``, ``best_val``, ``best_test_round``) and predictions.npz holds that round: a per-column best
    (``best_test``) or a mean of rounds has no single set of predictions to compare with."""
    from ..metrics import classification_metrics

    if not Path(predictions_path).is_file():
        return []
    metrics = read_json(metrics_path)
    chosen = (metrics.get("selection") or {}).get("round")
    out = []
    with np.load(predictions_path) as stored:
        if chosen is None or "selected:round" not in stored.files or int(stored["selected:round"]) != int(chosen):
            return []
        for member in stored.files:
            if not (member.startswith("selected:") and member.endswith("/probs")):
                continue
            key = member[len("selected:"):-len("/probs")]
            said = (metrics.get("eval") or {}).get(key)
            if f"selected:{key}/labels" not in stored.files or not said:
                continue
            probs, labels = stored[member], stored[f"selected:{key}/labels"]
            if probs.ndim != 2:
                continue
            again = classification_metrics(labels, probs)
            for name in RECOMPUTED:
                if name in said and not _same(said[name], again[name]):
                    out.append(f"{metrics_path}: says {key} {name} {said[name]:.6g}, its predictions "
                               f"({predictions_path}, round {chosen}) give {again[name]:.6g}")
    return out


def _same(a: float, b: float) -> bool:
    a, b = float(a), float(b)
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def downstream_problems(result: str) -> list[str]:
    if Path(result).is_file() and content_damage(read_json(result)):
        return [f"{result}: its content does not match the SHA-256 recorded in it (edited since its job wrote it)"]
    return []


def embedding_problems(project: Project, embedding: str) -> list[str]:
    """An embedding extracted from a model that is not its run's, for this configuration."""
    key = paths.run_key_of(embedding)
    made = records.embedded(embedding) if key is not None and Path(embedding).is_file() else None
    if not made:
        return []
    wanted = project.resolver.run_config(key)["config_hash"]
    if made.get("config_hash") != wanted:
        return [f"{embedding}: extracted from a model of another configuration (config hash {made.get('config_hash')}, "
                f"run {key.path} is {wanted})"]
    manifest = paths.run_file(key, "run_manifest.json")
    model = (read_json(manifest).get("outputs") or {}).get("model.pt") if Path(manifest).is_file() else None
    if model and made.get("model.pt") != model:
        return [f"{embedding}: extracted from another model.pt than run {key.path} wrote ({manifest})"]
    return []


def problems(project: Project, keys, downstream=(), embeddings=()) -> dict[str, list[str]]:
    """What is wrong with runs ``keys``, ``downstream`` results and ``embeddings`` (:func:`run_problems`, ...): the
    file to force -> its problems (empty: nothing). :func:`fedrepro.report.consistency.check_runs` refuses them
    with the command that makes them again."""
    found: dict[str, list[str]] = {}
    for key in dict.fromkeys(keys):
        if Path(paths.run_file(key, "run_manifest.json")).is_file() and (wrong := run_problems(project, key)):
            found[paths.run_file(key)] = wrong
    for result in dict.fromkeys(map(str, downstream)):
        if wrong := downstream_problems(result):
            found[result] = wrong
    for embedding in dict.fromkeys(map(str, embeddings)):
        if wrong := embedding_problems(project, embedding):
            found[embedding] = wrong
    return found


# ---- the records of tables and scorecards ----------------------------------------------------------

def write_record(primary: str | Path, outputs, inputs) -> None:
    """A table's or scorecard's record: the digests of its ``outputs`` and of the ``inputs`` it was made from."""
    records.write(primary, outputs, records.made_from(*[f for f in dict.fromkeys(map(str, inputs)) if Path(f).is_file()]))


def changed_reports(primaries) -> dict[str, list[str]]:
    """The tables or scorecards among ``primaries`` (their Snakemake targets) whose files are not what their job
    wrote (a CSV cut off mid-write or mid-number, edited by hand): target -> its changed files.
    :func:`fedrepro.report.consistency.check_made` refuses them."""
    damaged = {}
    for primary in map(str, primaries):
        record = records.read(primary) if Path(primary).exists() else None
        if record and (changed := records.changed(primary, record)):
            damaged[primary] = changed
    return damaged


def report_changed(target: str | Path) -> list[str]:
    """Why a table or scorecard ``target`` must be made again though Snakemake sees nothing newer: one of its own
    files, or a file it was made from, holds other than its record says. Cheap enough for every DAG build: only
    files changed (ctime, which no copy can set back) after the record was written are hashed."""
    primary = str(target)
    record_path = Path(paths.provenance(primary))
    if not record_path.is_file():
        return []
    try:
        record = records.read(primary)
    except records.ChangedFile as error:
        return [str(error)]
    since = record_path.stat().st_mtime_ns
    folder = Path(primary).parent

    def touched(path: Path) -> bool:
        return path.is_file() and os.stat(path).st_ctime_ns > since

    reasons = [f"{folder / name} is not what its job wrote" for name, digest in record["files"].items()
               if touched(folder / name) and records.digest(folder / name) != digest]
    reasons += [f"{path} changed since {primary} was made from it" for path, digest in record["made_from"].items()
                if touched(Path(path)) and records.digest(path) != digest]
    return reasons
