"""Commands that forgive: what a `snakemake` command a user typed meant, where it cannot work as typed.

- A target under another configuration's results folder (``results/tables/...`` while the demo configuration writes
  to ``results/demo/``): Snakemake would say "No rule to produce" and nothing else. The workflow has a rule whose
  output is exactly such a path (:func:`misplaced_pattern`, never a path this configuration writes), and its input
  function stops with one line naming the folder this configuration writes to, the target there, and which
  configuration writes where the target was (:func:`misplaced_message`).
- ``--configfile config/demo.yaml all``: ``--configfile`` takes every word after it, so ``all`` is read as a second
  config file and Snakemake fails with a traceback before it reads the workflow. :func:`swallowed` finds such words
  in the command line; :mod:`fedrepro.snakemake_guard` says so in one line before Snakemake starts.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import yaml

from . import paths

# the folders of a results directory a target can name (paths.py), and the report page
KINDS = ("tables", "figures", "scorecards", "evidence", "runs", "checkpoints", "downstream", "embeddings", "extensions")
CONFIG_DIR = "config"
DEFAULT_CONFIG = f"{CONFIG_DIR}/config.yaml"      # the Snakefile's own configfile: results/


def _roots() -> list[str]:
    """The folders this configuration writes to: its results and, for an extension, its reports."""
    return list(dict.fromkeys([paths.results_dir(), paths.report_dir()]))


def misplaced_pattern() -> str:
    """A regular expression for a target under some ``results*/`` folder's tables, figures, ... (or its report.html)
    that is not under this configuration's own folders: the output of the workflow's rule that explains it."""
    kinds = "|".join(KINDS)
    own = "|".join(rf"{re.escape(root)}/(?:(?:{kinds})/|report\.html$)" for root in _roots())
    return rf"(?!(?:{own}))results(?:/[^/]+)*?/(?:(?:{kinds})/.+|report\.html)"


def results_dirs(root: str | Path = ".") -> dict[str, str]:
    """results folder -> the configuration file that writes there (config/*.yaml; config/config.yaml: results)."""
    found = {"results": DEFAULT_CONFIG}
    for path in sorted(Path(root, CONFIG_DIR).glob("*.yaml")):
        try:
            folder = (yaml.safe_load(path.read_text()) or {}).get("results_dir")
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(folder, str):
            found.setdefault(folder.rstrip("/"), f"{CONFIG_DIR}/{path.name}")
    return found


def split_target(target: str) -> tuple[str, str]:
    """(the results folder, the rest) of a target: ``results/demo/tables/x.md`` -> (``results/demo``, ``tables/x.md``)."""
    parts = target.split("/")
    for i, part in enumerate(parts[1:], start=1):
        if part in KINDS or (part == "report.html" and i == len(parts) - 1):
            return "/".join(parts[:i]), "/".join(parts[i:])
    return str(Path(target).parent), Path(target).name


def misplaced_message(target: str, configfiles: list[str], root: str | Path = ".") -> str:
    """One line: where this configuration writes, the target there, and which configuration writes where it was."""
    folder, rest = split_target(target)
    mine = paths.report_dir() if rest.split("/")[0] not in ("runs", "checkpoints", "downstream", "embeddings") else \
        paths.results_dir()
    these = " ".join(configfiles) or DEFAULT_CONFIG
    text = (f"fedrepro: {target} is not where this configuration ({these}) writes: it writes to {mine}/; did you "
            f"mean {mine}/{rest}?")
    other = results_dirs(root).get(folder)
    if other and other not in configfiles:
        how = "leave out --configfile" if other == DEFAULT_CONFIG else f"use --configfile={shlex.quote(other)}"
        text += f" ({folder}/ is where {other} writes: to build it there, {how}.)"
    return text


def refuse_misplaced(target: str, configfiles) -> None:
    """The input function of the workflow's rule for misplaced targets: print :func:`misplaced_message` and stop
    Snakemake (exit 1) before any job, as one line rather than an exception with its traceback."""
    named = [os.path.relpath(f) if Path(f).resolve().is_relative_to(Path.cwd().resolve()) else str(f) for f in configfiles]
    print(misplaced_message(target, named), file=sys.stderr, flush=True)
    raise SystemExit(1)


# ---- a target swallowed by --configfile ------------------------------------------------------------

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
CONFIG_OPTIONS = ("--configfile", "--configfiles")


def swallowed(argv: list[str]) -> list[str]:
    """The words after ``--configfile``/``--configfiles`` (up to the next option) that cannot be config files: no such
    file and not a YAML/JSON name (``all``, a rule, a target), or a file that is not YAML/JSON (a table's .md)."""
    words, taking = [], False
    for word in argv:
        if word.startswith("-"):
            taking = word in CONFIG_OPTIONS      # "--configfile=a.yaml" takes one word, its own
            continue
        if taking:
            words.append(word)
    return [w for w in words if not w.endswith(CONFIG_SUFFIXES) and not (Path(w).is_file() and _is_mapping(w))]


def _is_mapping(path: str) -> bool:
    try:
        return isinstance(yaml.safe_load(Path(path).read_text()), dict)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False


def swallowed_message(argv: list[str]) -> str | None:
    """One line saying which words ``--configfile`` took as config files and how to write the command (None: none)."""
    words = swallowed(argv)
    if not words:
        return None
    files = []
    taking = False
    for word in argv:
        if word.startswith("-"):
            taking = word in CONFIG_OPTIONS
        elif taking and word not in words:
            files.append(word)
    first = shlex.quote(files[0]) if files else "<config file>"
    named = " ".join(shlex.quote(w) for w in words)
    what = f"'{words[0]}' as a config file" if len(words) == 1 else f"{', '.join(repr(w) for w in words)} as config files"
    return (f"fedrepro: --configfile read {what} (it takes every word after it): put the target first, "
            f"snakemake {named} --configfile {' '.join(map(shlex.quote, files)) or first}, or write "
            f"--configfile={first} (with '=') before it")
