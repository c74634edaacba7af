"""Fixtures of the fault-injection tests: the tiny grid's inputs, built once for the package, and a private copy
of them per test (a test may truncate, corrupt or edit any of them)."""

from __future__ import annotations

import copy
import shutil

import pytest

from infra_support import REPO, build_tiny_inputs


@pytest.fixture(scope="package")
def tiny_built(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny")
    return workdir, build_tiny_inputs(workdir)


@pytest.fixture
def tiny(tiny_built, tmp_path, monkeypatch) -> dict:
    """A copy of the tiny grid's inputs as the working directory (with the schemas and the tiny paper file where
    the CLI looks for them); -> the run config of its only run."""
    source, run = tiny_built
    work = tmp_path / "work"
    shutil.copytree(source, work, symlinks=True)
    (work / "workflow").symlink_to(REPO / "workflow")
    (work / "tests/data").mkdir(parents=True)
    shutil.copytree(REPO / "tests/data/infra", work / "tests/data/infra")
    monkeypatch.chdir(work)
    return copy.deepcopy(run)
