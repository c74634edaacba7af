"""Every command README.md and docs/ show runs as written and does what the text says, and every command a message
of the package names would run (issue 34, item 1). tests/doc_commands.py holds the reviewed table of how each
documented command is exercised: run as is, as a dry run, by a stand-in, or skipped with the reason."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import doc_commands as D
from infra_support import copy_repo, tool_env

REPO = D.REPO


# --------------------------------------------------------------------------------------------
# the table covers the docs

def test_every_documented_command_has_an_entry_and_every_entry_is_documented():
    shown = D.documented()
    missing = {c: files for c, files in shown.items() if D.how_of(c) is None}
    assert not missing, ("commands in the docs with no entry in tests/doc_commands.py (say how each is exercised): "
                         f"{missing}")
    stale = [c for c in D.HOW if c not in shown]
    assert not stale, f"entries of tests/doc_commands.py that no doc shows any more (remove or update them): {stale}"
    unused = [p for p, _ in D.PATTERNS if not any(re.fullmatch(p, c) for c in shown)]
    assert not unused, f"patterns that match no documented command: {unused}"
    for command, how in D.HOW.items():
        assert how.mode in ("run", "dry", "instead", "skip"), command
        assert how.mode not in ("instead", "skip") or len(how.why) > 10, f"{command}: say why it is not run as written"
        assert how.mode != "dry" or command.startswith("snakemake"), command


def test_the_extractor_finds_block_lines_and_inline_commands():
    text = ("Run `snakemake --cores 2\n--configfile=x.yaml all` or `fedrepro`.\n\n```bash\n# a comment\n"
            "fedrepro weights --list   # what is here\nsnakemake -n all \\\n  --configfile c.yaml\n```\n\n"
            "```\nresults/runs/<protocol>/   a tree, not a command\nsnakemake --profile slurm all\n```\n")
    assert D.commands_in(text) == ["fedrepro weights --list", "snakemake -n all --configfile c.yaml",
                                   "snakemake --profile slurm all", "snakemake --cores 2 --configfile=x.yaml all"]


def test_dry_runs_of_one_prefix_share_one_snakemake_call():
    assert D.Plan.split_target("snakemake --profile slurm results/tables/clean/facmic/table2.md") == (
        ("snakemake", "--profile", "slurm"), "results/tables/clean/facmic/table2.md")
    assert D.Plan.split_target("snakemake --configfile a.yaml results/x.md") is None      # `a.yaml x.md`: two files
    assert D.Plan.split_target("snakemake --profile slurm all") is None


# --------------------------------------------------------------------------------------------
# the commands the package prints

def message_texts(path: Path):
    """(line, text) of every message a module prints or raises: the first argument of a raise, of print, of a
    logging call, of SystemExit, and the module's upper-case string constants (help texts), with ``{...}`` for
    what an f-string fills in."""
    def text(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = text(node.left), text(node.right)
            return None if left is None and right is None else (left or "{}") + (right or "{}")
        return None

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        first = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            first = node.exc.args[0]
        elif isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("print", "error", "warning", "info", "exception", "critical", "SystemExit"):
                first = node.args[0]
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            first = node.value
        found = text(first) if first is not None else None
        if found:
            yield node.lineno, found


def test_every_command_a_message_names_would_run():
    """A `snakemake` command in a message names --cores (or a profile, or -n; --unlock runs no job): Snakemake refuses
    to run without it.
    A `fedrepro` command names a command and options the CLI has."""
    from fedrepro.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    snakemake = re.compile(r"`?\bsnakemake((?: +[^\s`()\"';,]+)+)")
    fedrepro = re.compile(r"(?<![\w./-])fedrepro ([a-z][a-z-]*)((?: +[^\s`()\"';,]+)*)")
    bad, checked = [], 0
    for path in sorted((REPO / "src/fedrepro").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py")):
        for line, text in message_texts(path):
            where = f"{path.relative_to(REPO)}:{line}"
            for match in snakemake.finditer(text):
                if match.group(1).split()[0].startswith(("-", "{", "results", "resources", "<", "all")):
                    checked += 1
                    if not re.search(r"--cores|--profile|(^| )(-n|--dry-run|--lint|--touch|--unlock)( |$)", match.group(1)):
                        bad.append(f"{where}: `snakemake{match.group(1)}` has no --cores (Snakemake refuses it)")
            for match in fedrepro.finditer(text):
                if match.group(1) not in commands:
                    continue
                checked += 1
                options = commands[match.group(1)]._option_string_actions
                unknown = [w for w in match.group(2).split() if w.startswith("-") and w.split("=")[0] not in options]
                if unknown:
                    bad.append(f"{where}: `fedrepro {match.group(1)}` has no option {unknown}")
    assert checked > 15, checked          # the scan finds the messages (a broken scan would pass vacuously)
    assert not bad, "\n".join(bad)


def test_not_slow_leaves_out_the_full_size_and_end_to_end_tests():
    """`bash scripts/test.sh -m "not slow"` (README: the unit tests only) deselects the full-size smoke test too."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "tests/test_fullsize.py",
                           "tests/test_pipeline.py"], cwd=REPO, capture_output=True, text=True, timeout=600)
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not [t for t in collected if "test_every_combination" in t or "test_pipeline.py" in t], collected


# --------------------------------------------------------------------------------------------
# every documented command, run

def calls() -> list[tuple[str, D.How, list[str]]]:
    """(shell command, how, the documented commands it stands for), in the order of the docs; dry runs that differ
    only in their target merged into one call."""
    out, merged = [], {}
    for command in D.documented():
        how = D.how_of(command)
        shell = D.prepared(command, how)
        if shell is None:
            continue
        split = D.Plan.split_target(shell) if how.mode == "dry" and not how.expect else None
        if split:
            prefix, target = split
            if prefix not in merged:
                merged[prefix] = [list(prefix), how, []]
                out.append(merged[prefix])
            merged[prefix][0].insert(1, target)          # targets first: no option after them can take them
            merged[prefix][2].append(command)
        elif (shell, how) in merged:                     # the same stand-in for several documented commands: once
            merged[shell, how][2].append(command)
        else:
            merged[shell, how] = [shell, how, [command]]
            out.append(merged[shell, how])
    return [(shlex.join(c) if isinstance(c, list) else c, how, docs) for c, how, docs in out]


def exercise(shell: str, how: D.How, repo: Path, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    """Run one documented command (after its setup commands) in ``repo``; -> the process and its seconds."""
    start = time.monotonic()
    for setup in how.setup:
        subprocess.run(["bash", "-c", setup], cwd=repo, env=env, capture_output=True, timeout=600)
    proc = subprocess.run(["timeout", "-k", "10", "1500", "bash", "-c", shell], cwd=repo, env=env,
                          capture_output=True, text=True)
    return proc, time.monotonic() - start


def side_effect_free(shell: str, how: D.How) -> bool:
    """A Snakemake dry run (or rule graph, or lint) with no setup: it plans and prints and makes no output, so its
    place among the other commands does not matter."""
    words = shlex.split(shell)
    return (not how.setup and words[:1] == ["snakemake"]
            and bool({"-n", "--dry-run", "--rulegraph", "--lint"} & set(words)))


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_every_documented_command_runs_and_does_what_the_text_says(tmp_path, forkserver):
    """In a scratch copy of the repository (no results, no data, no weights, no internet): each command, as the
    table says, must end with its exit status and print what the text promises. The dry runs plan the whole grid
    each (seconds of CPU apiece, one process each): they go first, two at a time, each lane in a scratch copy of
    its own (Snakemake keeps its state in the working directory); the others then run one by one in the docs' order.
    `fedrepro` commands start in the warm fork-server, as the demo's jobs do; both copies start with the grid's
    model profiles (tests/infra_support.py, warm_profiles)."""
    from concurrent.futures import ThreadPoolExecutor

    lanes = [copy_repo(tmp_path / name, profiles=True) for name in ("repo", "lane2")]
    envs = [{**tool_env(lane, tmp_path / f"home-{lane.name}"), "FEDREPRO_FORKSERVER": str(forkserver)} for lane in lanes]
    for lane, env in zip(lanes, envs):
        subprocess.run(["git", "init", "-q"], cwd=lane, env=env, check=True)
    failures, seconds = [], {}
    todo = calls()
    dry = [c for c in todo if side_effect_free(c[0], c[1])]
    rest = [c for c in todo if not side_effect_free(c[0], c[1])]
    halves = [dry[0::2], dry[1::2]]                 # one lane each, its commands one after another

    def run_lane(i: int) -> list:
        return [exercise(shell, how, lanes[i], envs[i]) for shell, how, _ in halves[i]]

    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(run_lane, (0, 1))
    done = first + second + [exercise(shell, how, lanes[0], envs[0]) for shell, how, _ in rest]
    for (shell, how, documented), (proc, took) in zip(halves[0] + halves[1] + rest, done):
        seconds[shell] = took
        output = proc.stdout + proc.stderr
        missing = [text for text in how.expect if text not in output]
        if proc.returncode != how.rc or missing:
            failures.append(f"$ {shell}\n  (documented: {documented[0]}{' +%d' % (len(documented) - 1) if len(documented) > 1 else ''})"
                            f"\n  exit {proc.returncode} (expected {how.rc}); missing {missing}\n  "
                            + "\n  ".join(output.strip().splitlines()[-12:]))
    print("slowest documented commands:", *(f"{t:6.1f} s  {c[:120]}" for c, t in
                                             sorted(seconds.items(), key=lambda x: -x[1])[:15]), sep="\n  ")
    assert not failures, "\n\n".join(failures)
