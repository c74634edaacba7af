"""Every shell command the documentation shows, and how the tests exercise each (tests/test_doc_commands.py).

A command is a line of a fenced ``bash``/``sh``/``console`` block (or of an unlabelled block whose line starts with a
command this project ships or uses), and every inline ``code`` span that starts with one of :data:`PROGRAMS`, in
README.md and docs/**/*.md. :data:`HOW` is the reviewed table of how each is exercised; a command in the docs
without an entry fails the test (add one), and so does an entry whose command the docs no longer show.

- ``RUN``: run as written, in a scratch copy of the repository (optionally after ``setup`` commands).
- ``DRY``: a ``snakemake`` command run with ``-n`` (the real one needs data, credentials, a GPU or a cluster).
- ``Instead(command, why)``: another command stands in, e.g. ``--help`` of a script that needs a GPU or a concrete
  name for a ``<placeholder>``.
- ``Skip(why)``: not run here, and why (root, the suite itself, a remote with pushed results, ...).

Each may carry ``expect``: text the output must contain, so a command that runs but does not do what the text
says fails too.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs")
PROGRAMS = ("snakemake ", "fedrepro ", "bash scripts/", "scripts/", "python ", "dvc ", "generate-slurm-partition-config",
            "FEDREPRO_", "PYTHONPATH=", "mv ", ". .venv", "pip ", ".venv/bin/python")
SHELL_BLOCKS = ("bash", "sh", "shell", "console")


def doc_files() -> list[Path]:
    files = [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
    return [f for f in files if f.exists()]


def is_command(text: str) -> bool:
    return text.startswith(PROGRAMS)


def commands_in(text: str) -> list[str]:
    """The commands of one Markdown text, in order, each once; comments after `` # `` dropped, whitespace (an inline
    span broken over two lines) collapsed, a ``\\`` continuation joined."""
    found: list[str] = []
    blocks = list(re.finditer(r"^```([a-z]*)\n(.*?)^```", text, re.S | re.M))
    for block in blocks:
        language, body = block.group(1), block.group(2).replace("\\\n", " ")
        for line in body.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#") and (language in SHELL_BLOCKS or is_command(line)):
                found.append(" ".join(line.split()))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if is_command(span) and " " in span:
            found.append(span)
    return list(dict.fromkeys(found))


def documented() -> dict[str, list[str]]:
    """command -> the files (relative) that show it."""
    out: dict[str, list[str]] = {}
    for path in doc_files():
        for command in commands_in(path.read_text()):
            out.setdefault(command, []).append(str(path.relative_to(REPO)))
    return out


# --------------------------------------------------------------------------------------------
# how each command is exercised

@dataclass(frozen=True)
class How:
    mode: str                         # "run", "dry", "instead", "skip"
    why: str = ""
    command: str = ""                 # what runs instead
    setup: tuple[str, ...] = ()       # commands run first (same scratch copy)
    expect: tuple[str, ...] = ()      # text the output must contain
    rc: int = 0                       # the exit status it must end with


RUN = How("run")
DRY = How("dry")


def Run(*expect: str, setup: tuple[str, ...] = (), rc: int = 0) -> How:
    return How("run", setup=setup, expect=expect, rc=rc)


def Dry(*expect: str) -> How:
    return How("dry", expect=expect)


def Instead(command: str, why: str, *expect: str, setup: tuple[str, ...] = (), rc: int = 0) -> How:
    return How("instead", why, command, setup, expect, rc)


def Skip(why: str) -> How:
    return How("skip", why)


def Help(command: str, why: str) -> How:
    """``command --help`` stands in: the entry point imports and parses its options."""
    return Instead(f"{command} --help", why, "usage:")


SUITE = "the test suite itself (run by CI and the integrator)"
NEEDS_PUSH = ("needs results pushed to a DVC remote: tests/test_dvc.py pushes the tiny grid and pulls it into a fresh "
              "clone through this script")
GPU = "needs a GPU"
INTERNET = "downloads from the model hubs (no internet here)"
SLURM_ROOT = "starts a one-node SLURM as root (installs Debian packages): tests/test_slurm.py runs it"

PLUGIN = ("needs the example plug-in installed: tests/test_plugin_example.py installs it (pip install -e) into a "
          "throw-away environment and runs its shapes data, the extended grid and one of its tables there, then "
          "changes the plug-in's code and lists its runs with fedrepro stale and plans their rerun")

AUTHORS_CODE = ("the authors' repository and their Python environment (GitHub, PyPI; not here): the golden record it "
                "made is replayed by tests/parity/test_whole_run_golden.py")
PARITY_REFUSAL = ("fedrepro parity fediic --authors /nonexistent", "the authors' checkout is not part of the repository: "
                  "one that is not there is refused by name", "no train_FedIIC.py there")

HOW: dict[str, How] = {
    # ---- README: two commands
    "bash scripts/demo.sh": Skip("the demo itself (10 minutes; CI runs it after the suite): its DAG is planned below "
                                 "(snakemake -n --configfile=config/demo.yaml all --quiet rules) and its report rule runs in "
                                 "tests/test_pipeline.py"),
    "bash scripts/test.sh": Skip(SUITE),
    "FEDREPRO_TEST_SHARDS=1 bash scripts/test.sh": Skip(SUITE),
    "python scripts/test-shards.py 2 --record": Skip("the whole suite, then tests/durations.json rewritten: CI runs the "
                                                     "suite this way; tests/test_test_shards.py checks its shard copies, "
                                                     "placement and seconds"),
    "snakemake --cores 2 --configfile=config/demo.yaml all --rerun-incomplete": DRY,
    "snakemake --cores 1 --configfile=config/demo.yaml report": Run("localrule report:", "Finished"),
    "bash scripts/evidence.sh": Skip("the evidence run (hours); its slice runs in tests/test_evidence_run.py"),
    "bash scripts/evidence.sh tests/data/evidence-slice.yaml": Skip("tests/test_evidence_run.py runs it"),
    "bash scripts/test.sh -m \"not slow\"": Instead(
        "python -m pytest --collect-only -q -m \"not slow\" tests/test_fullsize.py tests/test_pipeline.py",
        "what it selects, without running the suite: no full-size or end-to-end test", "3/"),
    # ---- README: running the real pipeline
    "bash scripts/setup.sh": Skip("installs .venv (scripts/demo.sh runs it first)"),
    ". .venv/bin/activate": Skip("activates the environment scripts/setup.sh made"),
    "pip install -e .": Skip("installs the package (the tests run from this checkout)"),
    "snakemake --profile slurm all": DRY,
    "snakemake --profile slurm results/tables/clean/facmic/table2.md": DRY,
    "snakemake --cores 8 results/tables/clean/fediic/table1.md": DRY,
    "snakemake --profile slurm results/scorecards/facmic.html": DRY,
    "snakemake -n all --quiet rules": Run("Job stats", "train"),
    "snakemake -n all": RUN,                  # what benchmarks/dag_scale.py times (README "Benchmarks")
    "snakemake -n --configfile=config/demo.yaml all --quiet rules": Run("Job stats", "train"),
    "snakemake --cores 1 report": Run("localrule report:", "Finished"),
    "snakemake all --configfile config/demo.yaml": DRY,
    "fedrepro download <dataset> --check": Instead("fedrepro download demo_bt --check", "a concrete dataset, placed "
                                                   "first", "demo_bt: offline demo data", setup=("fedrepro download demo_bt",)),
    "fedrepro estimate <paper> <setting> <method>": Instead("fedrepro estimate faa_clip multi_of moon", "a concrete run",
                                                            "request: mem_mb="),
    "fedrepro weights --list": Run("missing"),
    "fedrepro weights": Skip(INTERNET + "; `fedrepro weights --list` resolves the same resources"),
    "fedrepro weights open_clip--ViT-B-16--openai": Instead("fedrepro weights open_clip--ViT-B-16--openai --list",
                                                            INTERNET + ": the id is resolved, not fetched",
                                                            "open_clip--ViT-B-16--openai"),
    "snakemake --cores 2 all_weights": Dry("weights"),
    "snakemake --until weights all": Instead("snakemake -n --until weights all", "the trap the text warns of: refused "
                                             "before any job", "`--until` was given `all`", rc=1),
    "snakemake all --until weights": DRY,
    "dvc pull": Skip("the text's counter-example (DVC keeps no modification times); " + NEEDS_PUSH),
    "snakemake all --rerun-triggers mtime params input": DRY,
    "fedrepro weights --check": Run("does not exist", "9 of 9 weights resource(s) failed", rc=1),   # none fetched
    "fedrepro weights <id> --force": Skip(INTERNET),
    "scripts/dvc-results.py pull --stages weights -- all_weights": Skip(NEEDS_PUSH),
    "fedrepro validate": Run("config OK: 5 paper(s)"),
    # ---- README: DVC
    "scripts/dvc-results.py push -- --configfile config/config.yaml": Skip(NEEDS_PUSH),
    "scripts/dvc-results.py pull -- --configfile config/config.yaml": Skip(NEEDS_PUSH),
    "snakemake -n all --configfile config/config.yaml": RUN,
    "snakemake --cores 2 all --configfile config/demo.yaml config/dvc-overlay.yaml": DRY,
    "scripts/dvc-results.py push -- --configfile config/demo.yaml config/dvc-overlay.yaml": Skip(
        "the demo's own run first (minutes); " + NEEDS_PUSH + ", with the same overlay"),
    "git clone . ../fedrepro-pulled && cd ../fedrepro-pulled && . \"$OLDPWD/.venv/bin/activate\"": Skip(
        "a clone beside this checkout; tests/test_dvc.py clones into its own scratch folder"),
    "scripts/dvc-results.py pull -- --configfile config/demo.yaml config/dvc-overlay.yaml": Skip(NEEDS_PUSH),
    "snakemake --cores 1 report --configfile config/demo.yaml config/dvc-overlay.yaml": Skip(
        "after the pull: tests/test_dvc.py builds the report from the pulled files"),
    # ---- README: protocols, migration
    "mv results/runs results/runs-old && mkdir results/runs && mv results/runs-old results/runs/clean": Run(
        setup=("mkdir -p results/runs/facmic",)),
    # ---- README: speed, benchmarks, development
    "python benchmarks/facmic_cache.py": Run("uncached / cached total", "last-round global accuracy"),
    "python -m fedrepro.forkserver serve <socket>": Instead("python -m fedrepro.forkserver --help",
                                                            "serves until stopped; conftest's forkserver fixture "
                                                            "runs it for the slow tests",
                                                            "usage: python -m fedrepro.forkserver serve", rc=1),
    "python benchmarks/dag_scale.py": Help("python benchmarks/dag_scale.py", "plans the full grid several times "
                                           "(minutes); its run counts are checked in tests/test_doc_numbers.py"),
    "python benchmarks/provenance.py": Help("python benchmarks/provenance.py", "reads a built demo's results "
                                            "(after bash scripts/demo.sh); the checks it times are tested in "
                                            "tests/faults/test_provenance.py"),
    "python benchmarks/input_pipeline.py": Help("python benchmarks/input_pipeline.py", "a few minutes of decoding images"),
    "python benchmarks/fullsize_smoke.py": Help("python benchmarks/fullsize_smoke.py", "16 minutes on 2 cores"),
    ".venv/bin/python -m pytest": Skip(SUITE),
    # ---- docs/cluster-and-cache.md
    "generate-slurm-partition-config -o workflow/profiles/slurm/partitions.yaml": Help(
        "generate-slurm-partition-config", "asks a running SLURM (scontrol)"),
    "snakemake --profile slurm results/tables/<protocol>/<paper>/<table>.md": Instead(
        "snakemake -n --profile slurm results/tables/clean/fediic/table2.md", "a concrete table"),
    "fedrepro estimate faa_clip multi_of moon": Run("request: mem_mb="),
    "fedrepro estimate": Run("run (first seed)"),
    "fedrepro weights <id>": Skip(INTERNET),
    "snakemake --cores 1 resources/weights/<id>/weights.json": Instead(
        "snakemake -n --cores 1 resources/weights/open_clip--ViT-B-16--openai/weights.json", "a concrete id"),
    "fedrepro --log <log>": Skip("how every rule calls the CLI (each rule's shell command runs in the pipeline tests)"),
    "snakemake --cores all <file>": Skip("a placeholder of the messages that name the file; "
                                         "tests/test_doc_commands.py checks the messages' commands"),
    "scripts/slurm-local.sh start": Skip(SLURM_ROOT),
    "scripts/slurm-local.sh stop": Skip(SLURM_ROOT),
    "snakemake --profile slurm --profile workflow/profiles/ci-slurm all --configfile tests/data/infra/config.yaml": DRY,
    "scripts/dvc-results.py push --stages weights -- all_weights": Skip(NEEDS_PUSH),
    "scripts/dvc-results.py pull --stages <stage> -- <the same Snakemake arguments>": Skip(NEEDS_PUSH),
    "scripts/dvc-results.py pull": Skip(NEEDS_PUSH),
    "dvc pull <stage>": Skip("the text's counter-example (DVC keeps no modification times); " + NEEDS_PUSH),
    "snakemake --cores 1 report --configfile config/config.yaml": Instead(
        "snakemake -n --cores 1 report --configfile config/config.yaml", "after a pull (tests/test_dvc.py builds the "
        "report from pulled files); here the plan of it", "report"),
    "snakemake <table> --cores all --configfile=<config> --forcerun <split> <features> <run>/metrics.json": Skip(
        "the form of the rebuild command a refusal names; tests/faults/test_stale_runs.py runs the real one"),
    "snakemake <table>": Skip("a placeholder for one table's target (the concrete ones are planned above)"),
    "snakemake --unlock": RUN,
    "snakemake --unlock --configfile=<config>": Instead("snakemake --unlock --configfile=config/demo.yaml",
                                                        "a concrete config", "Unlocked working directory"),
    "snakemake --unlock ...": Skip("the form of the command a stopped run's lock message names (tests/faults runs it)"),
    "git push": Skip("needs a git remote"),
    "git clone <repo> && cd <repo>": Skip("your repository's address"),
    "snakemake --cores 2 results/tables/<protocol>/<paper>/<table>.md -R table --configfile config/config.yaml": Instead(
        "snakemake -n --cores 2 results/tables/clean/fediic/table2.md -R table --configfile config/config.yaml",
        "a concrete table; after a pull it trains nothing (tests/test_dvc.py), here it plans the grid"),
    "dvc status": RUN,
    "dvc repro <stage>": Instead("dvc repro --dry splits", "a concrete stage, its Snakemake command printed, not run",
                                 "snakemake"),
    "dvc pull checkpoints": Skip(NEEDS_PUSH),
    "snakemake --touch": Skip("what scripts/dvc-results.py pull runs after the pull (tests/test_dvc.py)"),
    "dvc remote add -d shared /project/fedrepro/dvc-store": RUN,
    "dvc remote add -d s3store s3://my-bucket/fedrepro": RUN,
    "dvc remote modify --local s3store access_key_id \"$AWS_ACCESS_KEY_ID\"": RUN,
    "dvc remote modify --local s3store secret_access_key \"$AWS_SECRET_ACCESS_KEY\"": RUN,
    "dvc remote modify s3store endpointurl https://s3.example.org": RUN,
    "dvc remote add -d sshstore ssh://user@storage.example.org/srv/fedrepro/dvc-store": RUN,
    "dvc remote modify --local sshstore keyfile ~/.ssh/id_ed25519": RUN,
    "dvc cache dir /project/fedrepro/dvc-cache": RUN,
    "dvc config cache.shared group": RUN,
    "dvc config --local cache.type symlink,hardlink,copy": RUN,
    # ---- README, docs/ARCHITECTURE.md: mentions of commands
    "fedrepro --log": Skip("an option of every job's command (`fedrepro --log <log> <command>`): the pipeline tests "
                           "run the rules"),
    "fedrepro --log {log} <command>": Skip("the form of every rule's shell command: the pipeline tests run the rules"),
    "fedrepro report": Run("report: results/report.html"),
    "snakemake --rulegraph": Run("digraph snakemake_dag"),
    "snakemake --lint": Run("Congratulations"),
    # ---- docs/datasets.md, docs/demo.md, docs/fullsize.md
    "fedrepro download <dataset>": Instead("fedrepro download demo_bt", "a concrete dataset (offline demo data)"),
    "fedrepro evidence --configfiles config/demo.yaml --check": Skip(
        "needs the demo's runs; tests/test_evidence.py runs `fedrepro evidence --check` on runs it writes, below and "
        "above the bar"),
    "fedrepro weights composite--fedrepro-lite0-minilm--aligned": Run("composite--fedrepro-lite0-minilm--aligned: 1 file(s)"),
    "python benchmarks/zero_shot_domains.py": Help("python benchmarks/zero_shot_domains.py", "scores the composite CLIP "
                                                   "zero-shot (builds its weights first, minutes)"),
    "python benchmarks/site_shift.py": Help("python benchmarks/site_shift.py", "fine-tunes Lite0 three times (minutes)"),
    "python -m pytest tests/test_fullsize.py -m fullsize -s": Skip(SUITE + "; 15 minutes"),
    "FEDREPRO_FULLSIZE_DEPTH=1 python -m pytest tests/test_fullsize.py -m fullsize_depth -s": Skip(
        "minutes and GBs per architecture (opt-in)"),
    "FEDREPRO_FULLSIZE_DEVICE=cuda FEDREPRO_FULLSIZE_DEPTH=all python -m pytest tests/test_fullsize.py -m fullsize -s":
        Skip(GPU),
    "FEDREPRO_FULLSIZE_DEVICE=cuda FEDREPRO_FULLSIZE_DEPTH=all": Skip("the environment of the GPU command above"),
    "python -m pytest tests/test_fullsize.py -m fullsize -k fediic -s": Skip(SUITE),
    "python benchmarks/fullsize_smoke.py --depth 2": Help("python benchmarks/fullsize_smoke.py", "16 minutes on 2 cores"),
    "python benchmarks/fullsize_smoke.py --depth full --architectures": Help("python benchmarks/fullsize_smoke.py",
                                                                             "minutes and 8 GB per architecture"),
    "python benchmarks/fullsize_smoke.py --depth full --architectures --device cuda --threads 8": Help(
        "python benchmarks/fullsize_smoke.py", GPU),
    "python benchmarks/fullsize_smoke.py --depth full --protocol paper --device cuda": Help(
        "python benchmarks/fullsize_smoke.py", GPU),
    "python benchmarks/fullsize_smoke.py --depth full --numerics authors --device cuda": Help(
        "python benchmarks/fullsize_smoke.py", GPU),
    "python benchmarks/numerics.py": Help("python benchmarks/numerics.py", "decodes 48 images per pipeline (minutes)"),
    # ---- docs/papers/*.md
    "snakemake all --config 'protocols=[paper]'": DRY,
    "snakemake --cores 8 ...": Instead("snakemake -n --cores 8 results/tables/clean/facmic/table2.md",
                                       "the text's \"...\" stands for a paper's targets"),
    "PYTHONPATH=$PWD/src .venv/bin/python -m pytest -q tests/parity/test_feddra_*.py tests/test_feddra.py": Skip(SUITE),
    # ---- GPU cost (issue 36)
    "fedrepro estimate <target file>": Instead("fedrepro estimate results/tables/clean/facmic/table2.md", "a concrete "
                                               "target", "No GPU figure has been measured in this repository yet"),
    "fedrepro estimate <target>": Instead("fedrepro estimate results/tables/clean/facmic/table2.md", "a concrete target",
                                          "No GPU figure has been measured in this repository yet"),
    "fedrepro estimate results/tables/clean/facmic/table2.md": Run("No GPU figure has been measured in this repository"),
    "fedrepro estimate all": Run("No GPU figure has been measured in this repository"),
    "fedrepro estimate results/tables/clean/facmic/table2.md --throughput my_gpu.csv": Instead(
        "fedrepro estimate results/tables/clean/facmic/table2.md --throughput tests/data/throughput/fixture-gpu.csv",
        "a GPU's measured table (train_step.py writes it on a GPU): the tests' hand-written fixture stands in", "ours:"),
    "python benchmarks/train_step.py --device cuda": Help("python benchmarks/train_step.py", GPU),
    "python benchmarks/gpu_hours.py": Run("No GPU figure has been measured in this repository yet", rc=1),   # no table here
    # ---- data (issue 32)
    "fedrepro prepare": Skip("names the command the `prepare` rule runs (the pipeline tests run the rule)"),
    "fedrepro download <dataset> --reverify": Instead("fedrepro download demo_bt --reverify", "a concrete dataset",
                                                      setup=("fedrepro download demo_bt",)),
    # ---- plug-ins (issue 33)
    "pip install -e examples/fedrepro-fedavgm": Skip(PLUGIN),
    "python -m fedrepro_fedavgm.shapes resources/shapes": Skip(PLUGIN),
    "snakemake --cores 2 all --configfile config/demo.yaml examples/fedrepro-fedavgm/fedavgm.yaml": Skip(PLUGIN),
    "fedrepro validate --configfile config/demo.yaml examples/fedrepro-fedavgm/fedavgm.yaml": Skip(PLUGIN),
    "snakemake --cores 2 results/demo/extensions/fedavgm/tables/clean/fediic/table1.md --configfile config/demo.yaml "
    "examples/fedrepro-fedavgm/fedavgm.yaml": Skip(PLUGIN),
    "pip uninstall <it>": Skip("uninstalls a plug-in you installed"),
    # ---- speed (issue 39)
    "fedrepro train --checkpoint-every": Instead("fedrepro train --help", "an option of the train job (its cadence "
                                                 "is tested in tests/test_engine.py)", "--checkpoint-every"),
    # ---- a plug-in author's path (issue 45): the report page, runs made by other code
    "snakemake --cores 1 report --configfile config/demo.yaml examples/fedrepro-fedavgm/fedavgm.yaml": Skip(PLUGIN),
    "fedrepro stale --configfile config/demo.yaml examples/fedrepro-fedavgm/fedavgm.yaml": Skip(PLUGIN),
    "fedrepro stale --rerun --configfile config/demo.yaml examples/fedrepro-fedavgm/fedavgm.yaml": Skip(PLUGIN),
    "fedrepro stale <table file>": Instead("fedrepro stale results/demo/tables/clean/fediic/table1.md "
                                           "--configfile=config/demo.yaml", "a concrete table of the demo, none of "
                                           "whose runs the scratch copy has made", "none of its 6 run(s)"),
    # ---- numbers in the docs
    "python benchmarks/demo_numbers.py": Help("python benchmarks/demo_numbers.py", "needs a demo run's results; "
                                              "tests/test_doc_numbers.py renders its block and checks it against them"),
    # ---- whole-run parity (docs/parity.md)
    "fedrepro parity <paper> --authors <checkout>": Instead(*PARITY_REFUSAL, rc=1),
    "fedrepro parity fediic --authors <checkout>": Instead(*PARITY_REFUSAL, rc=1),
    "fedrepro parity fediic --authors /tmp/fediic --python /tmp/fediic-venv/bin/python": Skip(AUTHORS_CODE),
    "fedrepro parity fediic --golden tests/data/parity/fediic": Skip(
        "replays two rounds of EfficientNet-B0 at 224 px (minutes on 2 cores): tests/parity/test_whole_run_golden.py "
        "replays the server's first message and client 0's first round and checks its inputs and every recorded "
        "augmentation"),
    "git clone https://github.com/wnn2000/FedIIC /tmp/fediic && git -C /tmp/fediic checkout 0c4de6e": Skip(AUTHORS_CODE),
    "python3 -m venv /tmp/fediic-venv": Skip(AUTHORS_CODE),
    "/tmp/fediic-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 efficientnet_pytorch==0.7.1 pretrainedmodels "
    "six tensorboardX pandas scikit-learn": Skip(AUTHORS_CODE),
    "fedrepro train --run <json>": Skip("the form of the train rule's command (the pipeline tests run it); a run with a "
                                        "replay block: tests/test_replay.py, tests/parity/test_whole_run_golden.py"),
}

# commands that differ only in their target, one rule each (every pattern must match a documented command)
PATTERNS: list[tuple[str, How]] = [
    (r"snakemake --profile slurm results/(tables|figures)/clean/[a-z_]+/[\w.]+\.(md|png)", DRY),     # docs/papers
    (r"snakemake --cores 2 --configfile=config/demo\.yaml results/demo/(tables/clean/[a-z_]+/[\w.]+\.md|evidence/index\.html)",
     DRY),                                                                                         # the demo twins
]


def how_of(command: str) -> How | None:
    if command in HOW:
        return HOW[command]
    return next((how for pattern, how in PATTERNS if re.fullmatch(pattern, command)), None)


def prepared(command: str, how: How) -> str | None:
    """The shell command that exercises ``command`` (None: skipped)."""
    if how.mode == "skip":
        return None
    if how.mode == "instead":
        return how.command
    if how.mode == "dry":
        words = shlex.split(command)
        assert words[0] == "snakemake", f"{command}: only snakemake commands have a dry run"
        return shlex.join(["snakemake", "-n", *words[1:]])
    return command


@dataclass
class Plan:
    """The dry runs that differ only in their target, merged into one Snakemake call each (one DAG to build)."""

    calls: dict[tuple[str, ...], list[str]] = field(default_factory=dict)

    @staticmethod
    def split_target(command: str) -> tuple[tuple[str, ...], str] | None:
        """(the command without its one target, the target) for ``snakemake [options] <results/...|resources/...>``,
        unless the target is read as a value of an option that takes several (``--configfile a.yaml results/x.md``:
        two config files), which only the command as written shows."""
        words = shlex.split(command)
        if len(words) < 3 or words[0] != "snakemake" or not re.match(r"(results|resources)/", words[-1]):
            return None
        option = next((w for w in reversed(words[:-1]) if w.startswith("-")), "")
        if option in NARGS_OPTIONS:
            return None
        return tuple(words[:-1]), words[-1]


# Snakemake options that take every word after them (a target after one of them is read as its value)
NARGS_OPTIONS = ("--configfile", "--configfiles", "--until", "-U", "--rerun-triggers", "--forcerun", "-R", "--omit-from",
                 "-O", "--allowed-rules", "--config", "-C", "--forcerun")
