"""Helpers of the fault-injection tests (fixtures: conftest.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from infra_support import REPO, TINY_CONFIG, tool_env


def tiny_config_json() -> str:
    """The configuration the tiny grid's jobs get (``--config-json``), from the working directory's files."""
    from fedrepro.config import deep_merge, load_yaml

    config = deep_merge(load_yaml(REPO / "config/config.yaml"), load_yaml(TINY_CONFIG))
    return json.dumps(config, sort_keys=True)


def tiny_project():
    from fedrepro.config import Project

    return Project(json.loads(tiny_config_json()), root=Path("."))


def workflow_here(home: Path) -> tuple[list[str], dict]:
    """The real workflow in the working directory (a copy of the tiny grid's inputs, the ``tiny`` fixture): its
    Snakefile, configuration and rules, so Snakemake runs on what the test made in-process; -> (``snakemake`` with
    the tiny grid's config file, the environment to run it in)."""
    for item in ("Snakefile", "config", "envs"):
        (shutil.copytree if (REPO / item).is_dir() else shutil.copy)(REPO / item, item)
    Path("workflow").unlink()
    shutil.copytree(REPO / "workflow", "workflow")
    return ["snakemake", "--cores", "1", f"--configfile={TINY_CONFIG}"], tool_env(REPO, home)


def job_counts(output: str) -> dict[str, int]:
    """Snakemake's "Job stats" table -> {rule: jobs}; {} for "Nothing to be done"."""
    table = output[output.index("Job stats:"):] if "Job stats:" in output else ""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)
            if m.group(1) != "total"}
