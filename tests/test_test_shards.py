"""scripts/test-shards.py: the copies the shards run in, and how test files are placed on shards."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shards():
    spec = importlib.util.spec_from_file_location("test_shards_script", ROOT / "scripts/test-shards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _listing(where: Path) -> set[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=where,
                         capture_output=True, check=True).stdout.decode()
    return set(filter(None, out.split("\0")))


def test_a_shard_copy_is_a_git_repository_holding_what_git_sees_in_the_checkout(tmp_path):
    """Tests copy the repository by asking git what it holds (infra_support.copy_repo): in a shard's copy that must
    work and list the checkout's files, not fail for want of a repository (it did, for six tests on CI)."""
    copy = _shards().copy_checkout(tmp_path / "shard1")
    assert _listing(copy) == _listing(ROOT)
    assert (copy / ".venv").resolve() == (ROOT / ".venv").resolve()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=copy).stdout == head
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert (copy / tracked[0]).read_bytes() == (ROOT / tracked[0]).read_bytes()


def test_longest_files_go_first_onto_the_least_loaded_shard():
    seconds = {"a": 100.0, "b": 60.0, "c": 50.0, "d": 10.0}
    plan = _shards().assign(["a", "b", "c", "d", "new"], 2, seconds)
    loads = [sum(seconds.get(f, 55.0) for f in files) for files in plan]     # "new": the median, 55 s
    assert sorted(f for files in plan for f in files) == ["a", "b", "c", "d", "new"]
    assert plan == [["a", "c"], ["b", "new", "d"]] and loads == [150.0, 125.0]


def test_a_not_slow_run_is_placed_by_the_seconds_of_its_files_not_slow_tests():
    seconds = {"tests/a.py": 500.0, "tests/a.py (not slow)": 2.0, "tests/b.py": 30.0}
    select = _shards().for_selection
    assert select(seconds, ["-m", "not slow"]) == {"tests/a.py": 2.0, "tests/b.py": 30.0}
    assert select(seconds, ["-q"]) == {"tests/a.py": 500.0, "tests/b.py": 30.0}
