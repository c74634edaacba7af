#!/usr/bin/env python3
"""Run the test suite as N shards side by side, each in its own copy of the repository (CI: 2 on 2 cores).

    python scripts/test-shards.py 2                    # what `FEDREPRO_TEST_SHARDS=2 bash scripts/test.sh` runs
    python scripts/test-shards.py 2 -m "not slow"      # pytest options go to every shard
    python scripts/test-shards.py 2 --record           # also write each file's measured seconds to tests/durations.json
    FEDREPRO_TEST_SECONDS=/tmp/s.json bash .ci/run     # ... or to /tmp/s.json (e.g. from a CI run on a fresh clone)

Most tests run one Python process on one core (a Snakemake dry run, a CLI command, a small model), so one pytest
leaves the second core of a 2-core runner idle for much of the suite. The shards share nothing: shard 0 runs in this
checkout, every other one in a copy of it (the files git tracks and the untracked ones it does not ignore, as
tests/infra_support.py copies the repository), with this checkout's environment (`.venv`) and its own package
source first on PYTHONPATH, so tests that write under the repository root (resources/, results/, .snakemake/) never
meet. Test files go to the shards by their measured seconds (tests/durations.json, longest first onto the least
loaded shard); a file not measured yet counts as the median. A shard's output is printed when it ends; the exit
status is the first failing shard's. With test paths among the arguments it runs them as one plain pytest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from infra_support import copy_repo  # noqa: E402  (the tests' copy of the repository as git sees it)

DURATIONS = ROOT / "tests/durations.json"
NO_TESTS = 5          # pytest's exit status when a shard's files hold no selected test


def test_files() -> list[str]:
    listing = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "tests"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in listing if re.fullmatch(r"tests/(.*/)?test_[^/]*\.py", f) and (ROOT / f).is_file())


def for_selection(seconds: dict[str, float], options: list[str]) -> dict[str, float]:
    """The measured seconds that fit the selection: with -m "not slow", those of each file's tests not marked slow
    (tests/conftest.py records both; a file measured only as a whole counts whole)."""
    marks = " ".join(options[i + 1] for i, o in enumerate(options[:-1]) if o == "-m")
    if " ".join(marks.split()) != "not slow":
        return {f: s for f, s in seconds.items() if not f.endswith(" (not slow)")}
    return {f: seconds.get(f"{f} (not slow)", s) for f, s in seconds.items() if not f.endswith(" (not slow)")}


def assign(files: list[str], shards: int, seconds: dict[str, float]) -> list[list[str]]:
    """Longest first onto the least loaded shard (files not measured yet count as the median file)."""
    default = statistics.median(seconds.values()) if seconds else 1.0
    load, out = [0.0] * shards, [[] for _ in range(shards)]
    for f in sorted(files, key=lambda f: -seconds.get(f, default)):
        i = load.index(min(load))
        out[i].append(f)
        load[i] += seconds.get(f, default)
    return out


def copy_checkout(dest: Path) -> Path:
    """The checkout as git sees it (tracked and untracked, not ignored files), with its environment linked in.

    The copy is a git repository at the same commit (a shared clone: no objects copied) with this checkout's files
    laid over it, so tests that ask git what the repository holds (tests/infra_support.copy_repo) see what they see
    here, edits not yet committed included."""
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "reset", "-q"], cwd=dest, check=True)     # the index at HEAD: tracked files stay tracked
    copy_repo(dest)                                                   # the files and the package's bytecode
    (dest / ".venv").symlink_to(ROOT / ".venv")
    with (dest / ".git/info/exclude").open("a") as exclude:     # a link, not a folder: '.venv/' would not match it
        exclude.write("/.venv\n")
    return dest


def merge(parts: list[Path]) -> dict[str, float]:
    """The shards' seconds per test file (tests/conftest.py writes them where FEDREPRO_TEST_SECONDS says)."""
    merged: dict[str, float] = {}
    for part in parts:
        if part.exists():
            merged.update(json.loads(part.read_text()))
    return merged


def main(argv: list[str]) -> int:
    keep = "--record" in argv
    argv = [a for a in argv if a != "--record"]
    if not argv or not argv[0].isdigit():
        raise SystemExit("usage: test-shards.py N [--record] [pytest options]")
    shards, options = int(argv[0]), argv[1:]
    paths = [a for a in options if not a.startswith("-") and ("::" in a or (ROOT / a).exists())]
    if shards < 2 or paths:
        return subprocess.call([sys.executable, "-m", "pytest", *options], cwd=ROOT)
    seconds = for_selection(json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}, options)
    plan = [files for files in assign(test_files(), shards, seconds) if files]
    scratch = Path(tempfile.mkdtemp(prefix="fedrepro-shards-"))
    parts = [scratch / f"seconds{i}.json" for i in range(len(plan))]
    procs, logs = [], []
    for i, files in enumerate(plan):
        where = ROOT if i == 0 else copy_checkout(scratch / f"shard{i}")
        env = dict(os.environ, FEDREPRO_TEST_SECONDS=str(parts[i]))
        if i:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where / "src"), env.get("PYTHONPATH")]))
        log = scratch / f"shard{i}.log"
        expected = sum(seconds.get(f, 0.0) for f in files)
        print(f"shard {i}: {len(files)} test files (~{expected / 60:.0f} min measured) in {where}", flush=True)
        procs.append(subprocess.Popen([sys.executable, "-m", "pytest", *files, *options, "--durations=25",
                                       f"--basetemp={scratch / f'tmp{i}'}"], cwd=where, env=env,
                                      stdout=log.open("w"), stderr=subprocess.STDOUT))
        logs.append(log)
    start, codes = time.monotonic(), []
    for i, proc in enumerate(procs):
        codes.append(proc.wait())
        print(f"\n======== shard {i} (exit {codes[-1]}, {(time.monotonic() - start) / 60:.1f} min) ========", flush=True)
        sys.stdout.write(logs[i].read_text(errors="replace"))
        sys.stdout.flush()
    measured = merge(parts)
    for i, files in enumerate(plan):
        print(f"shard {i}: {sum(measured.get(f, 0.0) for f in files) / 60:.1f} min in its tests "
              f"(~{sum(seconds.get(f, 0.0) for f in files) / 60:.0f} min expected)")
    if os.environ.get("FEDREPRO_TEST_SECONDS"):
        Path(os.environ["FEDREPRO_TEST_SECONDS"]).write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    if keep:    # a file's whole seconds only from a run of all its tests
        kept = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        whole = "-m" not in options and "-k" not in options
        kept.update({f: round(s, 1) for f, s in measured.items() if whole or f.endswith(" (not slow)")})
        DURATIONS.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        print(f"{DURATIONS.relative_to(ROOT)}: the measured seconds of {len(measured)} entries")
    failed = [c for c in codes if c not in (0, NO_TESTS)]
    if failed:
        print(f"\nfailed: shard(s) {[i for i, c in enumerate(codes) if c not in (0, NO_TESTS)]}; their copies and "
              f"logs are kept in {scratch}")
        return failed[0]
    shutil.rmtree(scratch, ignore_errors=True)
    return NO_TESTS if all(c == NO_TESTS for c in codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
