"""Shared fixtures. Tests run from the repository root (schemas and configs are read from there)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from http_files import server  # noqa: F401  (a fixture: a local HTTP server, for the download tests)

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


# tests that take minutes: `-m "not slow"` leaves all of them out, the full-size smoke test included (README)
SLOW_MARKERS = ("slow", "fullsize", "fullsize_depth")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS[1:]) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


# seconds per test file (setup, call and teardown of its tests; "<file> (not slow)": of its tests not marked slow),
# written at the end of the session where FEDREPRO_TEST_SECONDS names a file: scripts/test-shards.py places files on
# shards by them (tests/durations.json)
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    for key in [path] if "slow" in report.keywords else [path, f"{path} (not slow)"]:
        _FILE_SECONDS[key] = _FILE_SECONDS.get(key, 0.0) + report.duration


def pytest_sessionfinish(session):
    out = os.environ.get("FEDREPRO_TEST_SECONDS")
    if out and _FILE_SECONDS:
        import json

        Path(out).write_text(json.dumps({f: round(s, 1) for f, s in sorted(_FILE_SECONDS.items())}, indent=1))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def demo_raw(tmp_path_factory) -> Path:
    """The offline demo datasets materialised once per test session (raw root)."""
    from fedrepro.data import download
    from fedrepro.registry import dataset

    raw = tmp_path_factory.mktemp("raw")
    for name in ("demo_bt", "demo_fashion", "demo_domains"):
        download.download_dataset(dataset(name), raw)
    return raw


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors on one torch thread: no thread hand-off stalls on a busy machine (the demo config
    also uses 1). Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def forkserver(tmp_path_factory):
    """A warm fork-server for tests that run many CLI jobs (see fedrepro.forkserver)."""
    from fedrepro.forkclient import wait_ready

    sock = tmp_path_factory.mktemp("fs") / "fedrepro.sock"
    proc = subprocess.Popen([sys.executable, "-m", "fedrepro.forkserver", "serve", str(sock)],
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    if not wait_ready(sock, timeout=180):
        proc.kill()
        pytest.fail("fork-server did not start")
    yield sock
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    """(work directory, run config) of the tiny grid's only run, its inputs built in that directory
    (tests/infra_support.py), once per test module."""
    from infra_support import build_tiny_inputs

    workdir = tmp_path_factory.mktemp("tiny")
    return workdir, build_tiny_inputs(workdir)


def copy_repo_skeleton(dest: Path) -> Path:
    """Snakefile, workflow/ and config/ of this checkout in a scratch directory, for end-to-end runs."""
    for item in ("Snakefile", "workflow", "config", "envs"):
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    return dest


def build_image_caches(run: dict) -> None:
    """What the DAG builds before an image run: its decode-once image caches (``image_cache`` rule)."""
    from fedrepro.cli import main as cli

    for pixels in (run["paths"]["images"] or {}).values():
        if not Path(pixels).exists():
            cli(["image-cache", "--manifest", run["paths"]["manifest"], "--raw-dir", run["paths"]["raw_dir"],
                 "--spec", Path(pixels).name.removesuffix(".u8"), "--out", pixels])


def draw_figure(project, paper: str, figure: str, out_png, protocol: str = "clean") -> None:
    """What the DAG does for a figure: extract what it needs from trained models (``embed``), then draw it."""
    from fedrepro import paths
    from fedrepro.embed import embed
    from fedrepro.report.figures import figure_inputs, figure_item, make_figure

    item = figure_item(project, protocol, paper, figure)
    for key in project.plan.figure_runs(paper, figure, protocol):
        target = paths.embedding(key, figure)
        if target in figure_inputs(item) and not Path(target).exists():
            embed(project.resolver.embed_job(key, figure), target)
    make_figure(item, out_png)
