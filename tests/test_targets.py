"""Commands that forgive (issue 43): a target under another configuration's results folder, and a target swallowed by
`--configfile`, each get one line that says what to type (fedrepro.targets, fedrepro.snakemake_guard)."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from fedrepro import paths, targets
from fedrepro.snakemake_guard import PTH

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def demo_folder():
    paths.use_results_dir("results/demo")
    yield
    paths.use_results_dir("results")


def matches(target: str) -> bool:
    return re.fullmatch(targets.misplaced_pattern(), target) is not None


def test_the_rule_for_misplaced_targets_never_takes_a_file_this_configuration_writes(demo_folder):
    for own in ("results/demo/tables/clean/fediic/table1.md", "results/demo/runs/clean/x/s/m/seed0/metrics.json",
                "results/demo/report.html", "results/demo/evidence/index.html", "resources/splits/x.json", "logs/x.log"):
        assert not matches(own), own
    for other in ("results/tables/clean/fediic/table1.md", "results/report.html", "results/evidence-run/figures/x.png",
                  "results/runs/clean/fediic/s/m/seed0/metrics.json"):
        assert matches(other), other
    paths.use_report_dir("results/demo/extensions/mine")           # an extension's reports are its own, too
    assert not matches("results/demo/extensions/mine/tables/clean/p/t.md")
    assert not matches("results/demo/runs/clean/x/s/m/seed0/metrics.json")


def test_a_misplaced_target_is_answered_with_the_folder_this_configuration_writes_to(demo_folder):
    message = targets.misplaced_message("results/tables/clean/fediic/table1.md", ["config/demo.yaml"], root=REPO)
    assert message == ("fedrepro: results/tables/clean/fediic/table1.md is not where this configuration "
                       "(config/demo.yaml) writes: it writes to results/demo/; did you mean "
                       "results/demo/tables/clean/fediic/table1.md? (results/ is where config/config.yaml writes: to "
                       "build it there, leave out --configfile.)")
    message = targets.misplaced_message("results/evidence-run/report.html", ["config/demo.yaml"], root=REPO)
    assert "did you mean results/demo/report.html?" in message and "use --configfile=config/evidence.yaml" in message
    paths.use_results_dir("results")
    message = targets.misplaced_message("results/demo/figures/clean/feddra/fig3.png", [], root=REPO)
    assert "(config/config.yaml) writes: it writes to results/; did you mean results/figures/clean/feddra/fig3.png?" in message
    assert "use --configfile=config/demo.yaml" in message


def test_words_swallowed_by_configfile_are_named_with_the_command_to_type(tmp_path):
    config = tmp_path / "extra.yml"
    config.write_text("seeds: [0]\n")
    table = tmp_path / "table1.md"
    table.write_text("**table1.** a caption\n")
    assert targets.swallowed(["-n", "--configfile", "config/demo.yaml", str(config)]) == []
    assert targets.swallowed(["--configfile=config/demo.yaml", "all"]) == []        # '=' takes one word
    assert targets.swallowed(["--configfile", "config/demo.yaml", "all", "--cores", "2"]) == ["all"]
    assert targets.swallowed(["--configfile", "config/demo.yaml", str(table)]) == [str(table)]   # a file, not YAML
    assert targets.swallowed_message(["--configfile", "config/demo.yaml", "all"]) == (
        "fedrepro: --configfile read 'all' as a config file (it takes every word after it): put the target first, "
        "snakemake all --configfile config/demo.yaml, or write --configfile=config/demo.yaml (with '=') before it")


def test_snakemake_says_it_in_one_line_before_it_starts():
    """What the one-line .pth of scripts/setup.sh does for `snakemake --configfile config/demo.yaml all` (a traceback
    of Snakemake's argument handling before; the workflow is never read, so no check of ours could run)."""
    if not Path(sysconfig.get_path("purelib"), PTH).exists():
        pytest.skip(f"{PTH} is written by scripts/setup.sh")
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", "config/demo.yaml", "all"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [targets.swallowed_message(["--configfile", "config/demo.yaml", "all"])]
