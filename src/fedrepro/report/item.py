"""One table or figure of one paper, built for one protocol: what a table builder or a figure drawer
is given, and the one place report code turns (setting, method, seed) into the files it reads.

A kind registers its builder together with an ``inputs(item)`` function that lists every file the
builder reads (:mod:`fedrepro.registry`); the Snakemake rule of the table or figure declares exactly
those, so a table or figure rebuilds from files that ``dvc pull`` brings back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import paths
from ..config import ConfigError, Project
from ..paths import RunKey


@dataclass(frozen=True)
class ReportItem:
    project: Project
    protocol: str          # the protocol the table or figure is built for
    paper: str
    kind: str              # "tables" or "figures"
    name: str

    @property
    def spec(self) -> dict:
        return self.project.papers[self.paper][self.kind][self.name]

    @property
    def seeds(self) -> list[int]:
        return self.project.seeds

    @property
    def title(self) -> str:
        return self.spec.get("title", self.name)

    # ---- labels ------------------------------------------------------------------------------
    def method_label(self, method: str) -> str:
        return self.project.papers[self.paper]["methods"][method].get("label", method)

    def method_labels(self, methods) -> dict[str, str]:
        return method_labels(self.project, self.paper, methods)

    def setting_label(self, setting: str) -> str:
        return self.project.papers[self.paper]["settings"][setting].get("label", setting)

    def classes(self, setting: str) -> list[str]:
        """The classes of the setting's task (a split's subset of classes, or every class of its dataset)."""
        from ..data.partition import task_classes
        from ..registry import DATASETS

        spec = self.project.resolver.setting(self.paper, setting, self.protocol)
        everything = list(DATASETS.get(spec["dataset"]).obj.classes)
        return [everything[c] for c in task_classes(everything, spec["split"])]

    # ---- runs ----------------------------------------------------------------------------------
    def key(self, setting: str, method: str, seed: int) -> RunKey:
        """The run behind (setting, method, seed) here: the item's protocol unless the setting pins one."""
        return self.project.resolver.run_key(self.paper, setting, method, seed, self.protocol)

    def run_file(self, setting: str, method: str, seed: int, name: str = "metrics.json") -> Path:
        return require(paths.run_file(self.key(setting, method, seed), name))

    def figure_runs(self) -> list[RunKey]:
        return self.project.plan.figure_runs(self.paper, self.name, self.protocol)

    def split_counts(self, setting: str, seed: int | None = None) -> pd.DataFrame:
        """The client x class count table of ``setting``'s split (under the first seed by default)."""
        seed = self.seeds[0] if seed is None else seed
        return pd.read_csv(require(paths.split(self.split_id(setting, seed), ".counts.csv")))

    def split_id(self, setting: str, seed: int) -> str:
        """The split ``setting``'s runs read here (a setting may read another dataset under each protocol)."""
        return self.project.resolver.split_id(self.paper, setting, seed, self.protocol)

    def table_csv(self, table: str) -> Path:
        return require(paths.table(self.protocol, self.paper, table, ".csv"))

    def embedding(self, setting: str, method: str, seed: int) -> Path:
        return require(paths.embedding(self.key(setting, method, seed), self.name))

    # ---- options -------------------------------------------------------------------------------
    def options(self, needs: tuple[str, ...] = (), defaults: dict | None = None) -> dict:
        """``spec.options`` with ``defaults`` filled in; missing keys of the spec or unknown options are
        errors that name the table or figure and what is allowed."""
        missing = [k for k in needs if not self.spec.get(k)]
        if missing:
            raise ConfigError(f"{self.kind}/{self.name} (kind {self.spec.get('kind')}) needs {missing}")
        given = self.spec.get("options") or {}
        unknown = sorted(set(given) - set(defaults or {}))
        if unknown:
            raise ConfigError(f"{self.kind}/{self.name}/options: unknown key(s) {unknown} for kind "
                              f"{self.spec.get('kind')}; allowed: {sorted(defaults or {})}")
        return (defaults or {}) | given


def method_labels(project: Project, paper: str, methods) -> dict[str, str]:
    """``method -> label`` for methods shown side by side (one legend, one table): the paper file's labels, made
    unambiguous where a reader would misread them. Variants that share a label (FAA-CLIP's FedCLIP and its
    image-path twin) and a label that says "Ours" (the paper's own method, which a reader would take for this
    pipeline's numbers) carry the variant key: "FedCLIP (fedclip_images)", "Ours (fedadapterproto)"."""
    variants = project.papers[paper]["methods"]
    labels = {m: variants[m].get("label", m) for m in dict.fromkeys(methods)}
    shared = [label for label in labels.values() if list(labels.values()).count(label) > 1]
    return {m: f"{label} ({m})" if (label in shared or label.lower().startswith("ours")) and label != m else label
            for m, label in labels.items()}


def short_title(project: Project, paper: str) -> str:
    """"FACMIC" of "FACMIC (MICCAI 2024) on the embedded demo data": the name a summary row or a table of papers shows
    (a title that does not open on a method's name, "Engine check on ...", gives the paper's key)."""
    word = (project.papers[paper].get("title") or paper).split()[0].rstrip(":,")
    return word if any(c.isupper() for c in word[1:]) else paper


def stand_in(project: Project, paper: str) -> str | None:
    """What a paper file's stand-in data and models are (``stand_in``: the demo twins, the evidence overlays), or
    None for the real grid: its tables and scorecards say that their numbers are not comparable to the paper's."""
    return project.papers[paper].get("stand_in")


def stand_in_warning(description: str) -> str:
    return (f"STAND-IN DATA AND MODELS: {description.rstrip('.')}. These numbers show whether the methods learn; "
            f"they are not comparable to the paper's.")


def run_name() -> str | None:
    """What the configuration's results folder calls its run where it is not the full grid's (``results_dir``):
    "demo" (results/demo), "evidence-run" (results/evidence-run); None for results/ itself."""
    folder = Path(paths.results_dir())
    return None if folder == Path("results") else folder.name


def data_note(project: Project, paper: str, protocol: str | None = None) -> str:
    """The line on a figure's face that says what data it ran on: "(demo: stand-in data, not the paper's) <what stands
    in>" for a paper file with ``stand_in``, else the paper's own data (and the protocol)."""
    description = stand_in(project, paper)
    if description:
        return f"({run_name() or 'stand-in run'}: stand-in data, not comparable to the paper's) {description.rstrip('.')}."
    return "Data: the paper's own datasets" + (f", protocol {protocol}." if protocol else ".")


def require(path: str | Path) -> Path:
    """``path``, or a FileNotFoundError that says which rule builds it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: build it first (snakemake --cores all {path}), or pull it "
                                f"(scripts/dvc-results.py pull)")
    return path


# ---- what rules read: helpers for the kinds' ``inputs`` functions -------------------------------

def run_inputs(*names: str):
    """``inputs`` of a kind that reads ``names`` (e.g. metrics.json, history.csv) of every run of its
    settings x methods x seeds."""
    def inputs(item: ReportItem) -> list[str]:
        return [paths.run_file(key, name) for key in item.figure_runs() for name in names]
    return inputs


def split_count_inputs(all_seeds: bool = False):
    """``inputs`` of a kind that reads the split count files of its ``settings`` (first seed, or every seed)."""
    def inputs(item: ReportItem) -> list[str]:
        seeds = item.seeds if all_seeds else item.seeds[:1]
        ids = dict.fromkeys(item.split_id(s, seed) for s in item.spec.get("settings", []) for seed in seeds)
        return [paths.split(split_id, ".counts.csv") for split_id in ids]
    return inputs


def embedding_inputs(first_seed_only: bool = True):
    """``inputs`` of a figure drawn from what the ``embed`` rule extracted from trained models."""
    def inputs(item: ReportItem) -> list[str]:
        keys = [k for k in item.figure_runs() if not first_seed_only or k.seed == item.seeds[0]]
        return [paths.embedding(key, item.name) for key in keys]
    return inputs
