"""A report is built only from runs made from the inputs that are here now.

Every run records in its ``run_manifest.json`` the SHA-256 of the manifest and the split it was trained on, of the
feature cache it read (runs on cached encoder features) and of every pretrained-weights file it loaded; every
downstream result records that of its downstream dataset's manifest. Before a table, figure, scorecard or the
evidence page reads them, its job compares those records with the files as they are now (those on this machine: a
``dvc pull`` brings the splits, the manifests only where they were pushed by name, not always the weights). A run
or downstream result made from other inputs (a manifest edited or restored by hand, a split or feature cache
rebuilt, weights fetched again with other bytes) is refused by name, with the command that rebuilds it
(:func:`rebuild_command`: the split, feature and image caches made from another manifest too, then the runs), so a
table never mixes results made from different data. The rules declare the run manifests as inputs
(:func:`with_run_manifests`).

Snakemake does not notice either case by itself: a run file deleted after the table was made (a missing
intermediate file is not a reason to rerun what is up to date), or an input put back with its old modification
time (``cp -p``). :func:`out_of_date` finds both while Snakemake builds the DAG, so the rules can make the report
rerun (:mod:`fedrepro.dag.out_of_date`, which writes the report's out-of-date mark): it then rebuilds the missing run files first, or refuses
the stale runs by name.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import paths
from ..config import Project
from ..io import StaleInput, file_digest, read_json
from ..paths import RunKey


class StaleRuns(StaleInput):
    """Runs a report would read were made from inputs that have changed since."""


def runs_behind(files) -> list[RunKey]:
    """The runs the files belong to (metrics, downstream results, embeddings), in order, once each."""
    return list(dict.fromkeys(key for key in map(paths.run_key_of, map(str, files)) if key is not None))


def with_run_manifests(files: list[str]) -> list[str]:
    """A report rule's inputs plus the ``run_manifest.json`` of every run behind them (what the check reads)."""
    manifests = [paths.run_file(key, "run_manifest.json") for key in runs_behind(files)]
    return list(dict.fromkeys([*files, *manifests]))


def changed_inputs(project: Project, key: RunKey, since: int | None = None) -> tuple[list[str], list[str]]:
    """-> (what changed since run ``key`` was made, files to rebuild besides the run): each recorded input that is
    here now and differs, compared with the files the run would be made from today, and the split and caches made
    from another version of its manifest (each would refuse the run's job). ``since`` (ns): only files changed
    (their ctime, which no copy can set back) after it are read, the others count as unchanged; None: all."""
    from ..data.image_cache import image_cache_manifest
    from ..features import feature_cache_manifest

    recorded = read_json(paths.run_file(key, "run_manifest.json")).get("inputs", {})
    now = project.resolver.run_config(key)["paths"]

    def here(path) -> bool:
        return bool(path) and Path(path).is_file() and (since is None or os.stat(path).st_ctime_ns > since)

    changes, rebuild = [], []
    inputs = (("manifest_sha256", now["manifest"]), ("split_sha256", now["split"]),
              ("features_sha256", now["features"]))     # features: runs on cached encoder features only
    for name, path in inputs:
        if recorded.get(name) and here(path) and file_digest(path) != recorded[name]:
            changes.append(f"{path} (SHA-256 {recorded[name][:12]}… when the run was made, {file_digest(path)[:12]}… now)")
    manifest = now["manifest"]
    made_from = {now["split"]: lambda f: read_json(f).get("manifest_sha256")}     # what each recorded as its manifest
    if now["features"]:
        made_from[now["features"]] = feature_cache_manifest
    for pixels in (now.get("images") or {}).values():
        made_from[pixels] = image_cache_manifest
    for path, manifest_of in made_from.items():
        if Path(path).is_file() and Path(manifest).is_file() and (here(path) or here(manifest)):
            sha = manifest_of(path)
            if sha and sha != file_digest(manifest):
                changes.append(f"{path} was made from another version of {manifest}")
                rebuild.append(path)
    for weights_id, files in (recorded.get("weights") or {}).items():
        listing = Path(paths.weights_manifest(weights_id))
        if listing.is_file():
            current = {name: r["sha256"] for name, r in read_json(listing)["files"].items()}
            if current != files:
                changes.append(f"pretrained weights {weights_id} ({listing} lists other files or SHA-256s)")
    return changes, rebuild


def changed_downstream(project: Project, result: str) -> list[str]:
    """What changed since the downstream result ``result`` was made: its downstream dataset's manifest, when it is
    here now and differs from the one the result recorded."""
    key, task = paths.downstream_of(result)
    recorded = read_json(result).get("inputs", {}).get("manifest_sha256")
    manifest = project.resolver.downstream_config(key, task)["paths"]["manifest"]
    if recorded and Path(manifest).is_file() and file_digest(manifest) != recorded:
        return [f"{manifest} (SHA-256 {recorded[:12]}… when the result was made, {file_digest(manifest)[:12]}… now)"]
    return []


def check_runs(project: Project, keys, target: str | Path, downstream=(), embeddings=()) -> None:
    """Refuse to build ``target`` from runs (and ``downstream`` result files, ``embeddings``) that are not what made
    them or were made by another configuration (:func:`fedrepro.report.chain.problems`), or whose recorded inputs
    differ from the current files."""
    from . import chain

    if found := chain.problems(project, keys, downstream, embeddings):
        lines = [p for problems in found.values() for p in problems]
        listed = "\n".join(f"  {line}" for line in lines[:10]) + (f"\n  ... and {len(lines) - 10} more" if len(lines) > 10 else "")
        raise chain.ChangedFiles(f"{target}: {len(found)} of the files it reads are not what made them, or were made by "
                                 f"another configuration, so it is not built from them:\n{listed}\nMake them again:\n"
                                 f"    {rebuild_command(project, target, list(found))}")
    stale, rebuild = {}, {}    # file to force (run metrics, downstream result) -> (its name, what changed); inputs to force first
    for key in dict.fromkeys(keys):
        manifest = paths.run_file(key, "run_manifest.json")
        if not Path(manifest).is_file():
            raise FileNotFoundError(f"{manifest} not found: {target} reads run {key.path}, whose run manifest records what "
                                    f"it was made from; rebuild the run ({rebuild_command(project, target, [paths.run_file(key)])}) "
                                    f"or pull it (scripts/dvc-results.py pull)")
        changes, files = changed_inputs(project, key)
        if changes:
            stale[paths.run_file(key)] = (key.path, changes)
            rebuild.update(dict.fromkeys(files))
    runs = len(stale)
    for result in dict.fromkeys(map(str, downstream)):
        if Path(result).is_file() and (changes := changed_downstream(project, result)):
            stale[result] = (result, changes)
    if not stale:
        return
    what = " and ".join(f"{n} {kind}" for n, kind in ((runs, "run(s)"), (len(stale) - runs, "downstream result(s)")) if n)
    listed = "\n".join(f"  {name}: {'; '.join(changes)}" for name, changes in list(stale.values())[:10])
    more = f"\n  ... and {len(stale) - 10} more" if len(stale) > 10 else ""
    files = [*rebuild, *stale]
    raise StaleRuns(f"{target}: {what} were made from inputs that have changed since, so they cannot go into it "
                    f"beside those made from the current ones:\n{listed}{more}\nRebuild them from the current inputs:\n"
                    f"    {rebuild_command(project, target, files)}")


def rebuild_command(project: Project, target: str | Path, files) -> str:
    """The Snakemake command that rebuilds ``files`` and then ``target``, naming this configuration's files (a demo
    user's rebuild must not read the full configuration)."""
    config = project.snakemake_config_args()
    return f"snakemake {target} --cores all {config + ' ' if config else ''}--forcerun {' '.join(map(str, files))}"


def out_of_date(project: Project, target: str | Path, files) -> list[str]:
    """Why a report ``target`` that exists must be made again though Snakemake sees nothing newer than it, from
    ``files`` (its inputs): a file it was made from is missing now (deleted, never pulled), or a run behind it was
    made from inputs that have changed since, without a newer modification time (put back with ``cp -p``). Cheap
    enough for every DAG build: only inputs changed (ctime) after a run recorded them are hashed."""
    from .chain import report_changed

    if not Path(target).exists():
        return []                   # Snakemake builds it anyway
    files = list(map(str, files))
    reasons = [f"{f} is missing" for f in files if not Path(f).exists()] + report_changed(target)
    for key in runs_behind(files):
        manifest = Path(paths.run_file(key, "run_manifest.json"))
        if manifest.is_file():
            since = manifest.stat().st_mtime_ns
            if (key, since) not in _CHANGED:           # a run behind several reports is looked at once per DAG
                _CHANGED[key, since] = changed_inputs(project, key, since=since)[0]
            if _CHANGED[key, since]:
                reasons.append(f"run {key.path} was made from inputs that have changed since: "
                               f"{'; '.join(_CHANGED[key, since])}")
    return reasons


_CHANGED: dict[tuple[RunKey, int], list[str]] = {}


def check_inputs(project: Project, files, target: str | Path) -> None:
    """:func:`check_runs` for a report that reads ``files``: the runs behind them and the downstream results among
    them."""
    files = list(map(str, files))
    check_runs(project, runs_behind(files), target, [f for f in files if paths.downstream_of(f)],
               [f for f in files if f.startswith(f"{paths.results_dir()}/embeddings/")])


def scorecard_inputs(project: Project, paper: str) -> list[str]:
    """The files behind a scorecard: those of every table of ``paper`` (or of every paper: ``all``)."""
    from .tables import table_inputs, table_item

    return list(dict.fromkeys(f for protocol, p, table in project.plan.tables() if paper in ("all", p)
                              for f in table_inputs(table_item(project, protocol, p, table))))


def check_made(project: Project, primaries, reader: str | Path) -> None:
    """Refuse to build ``reader`` from tables or scorecards (``primaries``: their Snakemake targets) whose files
    are not what their job wrote (:func:`fedrepro.report.chain.changed_reports`), with the command that makes them
    again."""
    from . import chain

    if damaged := chain.changed_reports(primaries):
        listed = "\n".join(f"  {', '.join(c)}: not what {paths.provenance(p)} says its job wrote" for p, c in damaged.items())
        raise chain.ChangedFiles(f"{reader}: {len(damaged)} of the reports it reads changed since they were made (cut "
                                 f"off or edited), so it is not built from them:\n{listed}\nMake them again:\n"
                                 f"    {rebuild_command(project, reader, list(damaged))}")
