"""Helpers of the fault-injection tests (fixtures: conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

from infra_support import REPO, TINY_CONFIG


def tiny_config_json() -> str:
    """The configuration the tiny grid's jobs get (``--config-json``), from the working directory's files."""
    from fedrepro.config import deep_merge, load_yaml

    config = deep_merge(load_yaml(REPO / "config/config.yaml"), load_yaml(TINY_CONFIG))
    return json.dumps(config, sort_keys=True)


def tiny_project():
    from fedrepro.config import Project

    return Project(json.loads(tiny_config_json()), root=Path("."))
