"""One results folder, one configuration: who owns ``results_dir``, and the refusal of another configuration that
would overwrite its runs.

A run's folder is named by its run key (protocol, paper, setting, method, seed), not by its configuration, so two
configurations that share a ``results_dir`` and a run key write the same folder: the second would retrain the
first's run over it (its config hash differs, a param of the train rule) and its tables would read the other's.
Editing a hyper-parameter of *the same* configuration must still rerun exactly the runs it changes (README). What
tells the two apart is the configuration files: the first ``snakemake`` to plan in a folder writes them to
``<results_dir>/.fedrepro-owner`` (:func:`fedrepro.paths.results_owner`); a later one read from other files is
refused before any job when one of its runs would replace a run of another config hash there, naming the owner
and the ways out (another ``results_dir`` in its config file, or ``--config force_results_dir=<results_dir>``,
which names the folder it takes over, lists the runs it replaces and makes the caller the owner). Runs of the same
config hash are the same runs: another configuration that shares them (an extension, docs/plugins.md) plans
freely.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .. import paths
from ..io import read_json, write_json


def configuration_files(configfiles: list[str]) -> list[str]:
    """The config files as the owner records them: relative to the working directory where they lie under it
    (``config/demo.yaml``, ``./config/demo.yaml`` and its absolute path are one file), in the order given; none
    given: the default ``config/config.yaml``."""
    out = []
    for name in configfiles or ["config/config.yaml"]:
        real = Path(os.path.realpath(name))
        here = Path.cwd().resolve()
        out.append(str(real.relative_to(here)) if real.is_relative_to(here) else str(real))
    return out


def owner(folder: str | None = None) -> list[str] | None:
    """The config files that own the results folder, or None (no owner recorded yet)."""
    record = Path(paths.results_owner() if folder is None else f"{folder}/.fedrepro-owner")
    if not record.is_file():
        return None
    try:
        return list(read_json(record)["configfiles"])
    except (ValueError, KeyError, TypeError):
        return None           # unreadable: claimed again below


def replaced_runs(project, limit: int | None = None) -> list[str]:
    """The planned runs whose folder holds a run of another config hash ("<run>: <its hash> -> <this one>")."""
    out = []
    for key in project.plan.runs():
        manifest = Path(paths.run_file(key, "run_manifest.json"))
        if not manifest.is_file():
            continue
        try:
            made_by = (read_json(manifest).get("run") or {}).get("config_hash")
        except (ValueError, OSError):
            continue         # unreadable: its own job says so
        wanted = project.resolver.run_config(key)["config_hash"]
        if made_by and made_by != wanted:
            out.append(f"{key.path} (config hash {made_by}, this configuration's {wanted})")
            if limit and len(out) >= limit:
                break
    return out


class ResultsOwned(ValueError):
    """Another configuration's runs would be overwritten."""


def claim(project, configfiles: list[str], force: str | None = None,
          say: Callable[[str], None] = lambda line: None) -> None:
    """Check, before any job, that this configuration (read from ``configfiles``) may write its results folder, and
    record it as the owner where none is recorded. ``force``: ``force_results_dir`` of the config, the folder the
    caller takes over. Reads the run manifests only when another configuration owns the folder."""
    folder = paths.results_dir()
    mine = configuration_files(configfiles)
    theirs = owner()
    if force is not None and force.rstrip("/") != folder:
        raise ResultsOwned(f"force_results_dir={force} names another folder than this configuration's results_dir "
                           f"({folder}): give the folder it takes over, --config force_results_dir={folder}")
    if theirs is None or theirs == mine:
        if theirs is None:
            write_json(paths.results_owner(), {"configfiles": mine})
        return
    replaced = replaced_runs(project)
    if not replaced:
        return
    listed = "\n  ".join(replaced[:10]) + (f"\n  ... and {len(replaced) - 10} more" if len(replaced) > 10 else "")
    if force is None:
        raise ResultsOwned(
            f"{folder} holds the results of {' '.join(theirs)} ({paths.results_owner()}); this configuration "
            f"({' '.join(mine)}) would train {len(replaced)} of its runs again over them, with other settings:\n  "
            f"{listed}\nGive this configuration its own folder (results_dir: <folder> in {mine[-1]}), or take this one "
            f"over, replacing those runs: add --config force_results_dir={folder}")
    say(f"fedrepro: taking {folder} over from {' '.join(theirs)}: {len(replaced)} of its runs will be trained again "
        f"with this configuration ({' '.join(mine)}) and replaced:\n  {listed}")
    write_json(paths.results_owner(), {"configfiles": mine, "took_over_from": theirs})

