"""Runs made by other code than the installed one: which they are, and what a table or scorecard says about them.

Every run records which code made it (``code`` of its ``run_manifest.json``, :mod:`fedrepro.code_identity`). A run
whose method or model family has changed since (its source, as code: not a comment or a docstring; or its plug-in's
version) stays where it is and is never rerun by itself: Snakemake does not see code. It is listed instead, by
``fedrepro stale`` (which prints the Snakemake command that reruns exactly those runs, and runs it with ``--rerun``), and
each table and scorecard built from it says so in its caption. A run that records no code (made before fedrepro
recorded it) is *unknown*: counted once by ``fedrepro stale``, never listed as changed, never rerun.

A table's and a scorecard's definition holds the runs of theirs made by other code, with what changed
(:func:`changed_code`; nothing while there are none, so a grid whose runs are all current keeps the definitions it had
before code was recorded): a change of code makes them again (not the runs), and the new caption names the runs it
no longer describes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..code_identity import COMPARED, code_changes, components
from ..config import Project
from ..io import read_json
from ..paths import RunKey


@dataclass
class CodeCheck:
    changed: dict[RunKey, list[str]] = field(default_factory=dict)   # run -> how its code differs from the installed
    unknown: list[RunKey] = field(default_factory=list)              # made, but no code recorded
    current: list[RunKey] = field(default_factory=list)              # made by the installed code
    missing: list[RunKey] = field(default_factory=list)              # not made (yet)


_RECORDED: dict[str, tuple[tuple[int, int], dict | None]] = {}     # a manifest -> (its version, its code)


def _recorded_code(manifest: Path) -> dict | None:
    """The ``code`` a run manifest records, read once per version of the file (a DAG build asks for every table and
    scorecard: the same runs several times)."""
    try:
        stat = manifest.stat()
        version = (stat.st_mtime_ns, stat.st_size)
        if _RECORDED.get(str(manifest), (None,))[0] != version:
            _RECORDED[str(manifest)] = (version, read_json(manifest).get("code"))
        return _RECORDED[str(manifest)][1]
    except (OSError, ValueError, AttributeError):
        return None


def check_code(project: Project, keys) -> CodeCheck:
    """Which of the runs ``keys`` were made by other code than the installed one (their run manifests)."""
    out = CodeCheck()
    now: dict[tuple, dict] = {}             # seeds share their components
    for key in dict.fromkeys(keys):
        manifest = Path(paths.run_file(key, "run_manifest.json"))
        if not manifest.is_file() or not Path(paths.run_file(key)).is_file():
            out.missing.append(key)
            continue
        variant = (key.folder, key.paper, key.setting, key.method)
        if variant not in now:
            now[variant] = components(project.resolver.run_config(key), COMPARED)
        recorded = _recorded_code(manifest)
        changes = code_changes(recorded, now[variant])
        if changes is None:
            out.unknown.append(key)
        elif changes:
            out.changed[key] = changes
        else:
            out.current.append(key)
    return out


def changed_code(project: Project, keys) -> dict[str, list[str]]:
    """Run path -> how its code differs from the installed one, for the runs among ``keys`` made by other code (what
    a report's definition holds; {} when there are none)."""
    return {key.path: why for key, why in check_code(project, keys).changed.items()}


def code_note(project: Project, keys, label=None) -> str | None:
    """A caption's sentence on the runs among ``keys`` made by other code than the installed one, per method variant
    (``label``: run -> the name the report gives it; default: the variant's label), or None when there are none."""
    keys = list(dict.fromkeys(keys))
    label = label or (lambda key: project.papers[key.paper]["methods"][key.method].get("label", key.method))
    check = check_code(project, keys)
    if not check.changed:
        return None
    rows: dict[str, dict] = {}
    for key in keys:
        row = rows.setdefault(label(key), {"runs": 0, "changed": 0, "why": {}})
        row["runs"] += 1
        if key in check.changed:
            row["changed"] += 1
            row["why"].update(dict.fromkeys(check.changed[key]))
    listed = "; ".join(f"{name} ({row['changed']} of {row['runs']} runs: {'; '.join(row['why'])})"
                       for name, row in rows.items() if row["changed"])
    return (f"Made by other code than the installed one: {listed}. `fedrepro stale --configfile <its config files>` "
            f"lists these runs; with --rerun it reruns them.")


def rerun_command(project: Project, target: str, keys, how: str = "--cores all") -> list[str]:
    """The Snakemake command that trains exactly the runs ``keys`` again (their ``metrics.json`` forced: what is made
    from them follows) and makes ``target``, with this configuration's files; ``how``: where the jobs run."""
    config = project.snakemake_config_args()
    return ["snakemake", target, *shlex.split(how), *shlex.split(config), "--forcerun",
            *[paths.run_file(key) for key in dict.fromkeys(keys)]]


def listing(check: CodeCheck, what: str) -> list[str]:
    """What ``fedrepro stale`` prints: the runs made by other code, grouped by what changed, and the unknown, once."""
    made = len(check.changed) + len(check.unknown) + len(check.current)
    runs = f"{made + len(check.missing)} run(s)"
    if not made:
        return [f"{what}: none of its {runs} has been made yet; nothing to compare"]
    lines = [f"{what}: {made} of its {runs} made, " + (f"{len(check.changed)} of them by other code than the "
                                                      f"installed one:" if check.changed else
                                                      "none by other code than the installed one.")]
    groups: dict[tuple[str, ...], list[RunKey]] = {}
    for key, why in check.changed.items():
        groups.setdefault(tuple(why), []).append(key)
    for why, keys in groups.items():
        lines.append(f"  {'; '.join(why)}: {len(keys)} run(s)")
        lines += [f"    {key.path}" for key in keys]
    if check.unknown:
        lines.append(f"{len(check.unknown)} run(s) record no code (made before fedrepro recorded it): unknown, not "
                     f"counted as changed and not rerun")
    return lines
