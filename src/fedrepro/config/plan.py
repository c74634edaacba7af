"""Planning: what a validated configuration implies. The runs that exist are exactly the cells of its tables and the
settings x methods of its figures, under every configured protocol (a cell, row, column or table may pin one), once
per seed; and from those, the splits, feature caches, image caches, pretrained weights, downstream evaluations and
datasets the DAG must make."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ..paths import RunKey

if TYPE_CHECKING:
    from .loaded import LoadedConfig
    from .resolve import Resolver


class Plan:
    """Every output and job a loaded configuration implies (``resolver`` gives each job's config)."""

    def __init__(self, loaded: LoadedConfig, resolver: Resolver):
        self.loaded = loaded
        self.papers = loaded.papers
        self.resolver = resolver

    @property
    def protocols(self) -> list[str]:
        return self.loaded.protocols

    @property
    def seeds(self) -> list[int]:
        return self.loaded.seeds

    def tables(self) -> Iterator[tuple[str, str, str]]:
        """(protocol, paper, table) of every table to build."""
        for protocol in self.protocols:
            for paper_name, paper in self.papers.items():
                for table in paper.get("tables", {}):
                    yield protocol, paper_name, table

    def figures(self) -> Iterator[tuple[str, str, str]]:
        """(protocol, paper, figure) of every figure to build: once per configured protocol, except that a figure
        whose settings all pin one protocol is built once, under that one. A figure's folder is the protocol its
        runs used: FAA-CLIP's demo figures of a setting pinned to ``paper`` (each eval set at its best test round)
        must not sit among the clean ones."""
        planned: dict[tuple[str, str, str], None] = {}
        for protocol in self.protocols:
            for paper_name, paper in self.papers.items():
                for figure in paper.get("figures", {}):
                    planned[self.figure_protocol(paper_name, figure, protocol), paper_name, figure] = None
        yield from planned

    def figure_protocol(self, paper: str, figure: str, protocol: str) -> str:
        """The protocol ``figure`` is built under when the configuration asks for ``protocol``: the one all its
        settings pin, if they pin the same, else ``protocol``."""
        settings = self.papers[paper]["figures"][figure].get("settings", [])
        used = {self.resolver.protocol(paper, s, protocol) for s in settings}
        return used.pop() if len(used) == 1 else protocol

    def runs(self) -> list[RunKey]:
        """Every run some table or figure needs, under every configured protocol, once per seed."""
        needed: dict[RunKey, None] = {}
        for protocol, paper_name, table in self.tables():
            needed.update(dict.fromkeys(self.table_runs(paper_name, table, protocol)))
        for protocol, paper_name, figure in self.figures():
            needed.update(dict.fromkeys(self.figure_runs(paper_name, figure, protocol)))
        return list(needed)

    def table_runs(self, paper: str, table: str, protocol: str) -> list[RunKey]:
        cells = dict.fromkeys((c["protocol"], c["setting"], c["method"], c["numerics"])
                              for c in self.resolver.resolved_cells(paper, table, protocol))
        return [RunKey(paper, p, s, m, seed, n) for p, s, m, n in cells for seed in self.seeds]

    def table_downstream(self, paper: str, table: str, protocol: str) -> list[tuple[RunKey, str]]:
        cells = dict.fromkeys((c["protocol"], c["setting"], c["method"], c["numerics"], c["task"])
                              for c in self.resolver.resolved_cells(paper, table, protocol) if c["task"])
        return [(RunKey(paper, p, s, m, seed, n), t) for p, s, m, n, t in cells for seed in self.seeds]

    def figure_runs(self, paper: str, figure: str, protocol: str) -> list[RunKey]:
        fig = self.papers[paper]["figures"][figure]
        return [self.resolver.run_key(paper, s, m, seed, protocol)
                for s in fig.get("settings", []) for m in fig.get("methods", []) for seed in self.seeds]

    def count_settings(self, paper: str, kind: str, name: str) -> list[str]:
        """Settings whose split count files a table (``kind="tables"``) or figure reads directly."""
        return list(self.papers[paper][kind][name].get("settings", []))

    def splits(self) -> dict[str, dict]:
        """Every split some run needs, plus those that tables and figures read directly (their
        settings at the first seed), even where no run uses them."""
        needed = [(key.paper, key.setting, key.seed, key.protocol) for key in self.runs()]
        seed = self.seeds[0]
        for paper_name, paper in self.papers.items():
            for kind in ("tables", "figures"):
                for name in paper.get(kind, {}):
                    needed += [(paper_name, s, seed, protocol) for s in self.count_settings(paper_name, kind, name)
                               for protocol in self.protocols]
        out = {}
        for paper_name, setting, run_seed, protocol in needed:
            s = self.resolver.setting(paper_name, setting, protocol)
            out[self.resolver.split_id(paper_name, setting, run_seed, protocol)] = {
                "dataset": s["dataset"],
                "spec": self.resolver.split_spec(paper_name, setting, run_seed, protocol),
                "seed": self.resolver.split_seed(paper_name, setting, run_seed, protocol),
            }
        return out

    def features(self) -> dict[tuple[str, str], dict]:
        """(dataset, features key) -> {"encoder": spec, "jpeg_draft": bool, "pixels": pipeline}, for every feature cache
        some run needs."""
        out = {}
        for key in self.runs():
            run = self.resolver.run_config(key)
            if run["features"]:
                out[(run["dataset"], run["features"]["key"])] = {"encoder": run["features"]["encoder"],
                                                                 "jpeg_draft": run["jpeg_draft"],
                                                                 "pixels": run["train"]["model"]["pixels"]}
        return out

    def weights(self) -> dict:
        """id -> :class:`~fedrepro.models.weights.WeightSpec` of every pretrained resource some job loads:
        the models of the runs (training; downstream and embedding jobs rebuild the same models, with no
        more weights) and the encoders of the feature caches."""
        from ..models.weights import encoder_weights, weight_specs

        out = {}
        for key in self.runs():
            out.update((spec.id, spec) for spec in weight_specs(self.resolver.run_config(key)["train"]["model"]))
        for job in self.features().values():
            out.update((spec.id, spec) for spec in encoder_weights(job["encoder"]))
        return dict(sorted(out.items()))

    def image_caches(self) -> dict[str, dict]:
        """Cache file -> {"dataset", "spec"} for every decode-once image cache some run needs."""
        out = {}
        for key in self.runs():
            run = self.resolver.run_config(key)
            for path in (run["paths"]["images"] or {}).values():
                out[path] = {"dataset": run["dataset"], "spec": Path(path).name.removesuffix(".u8")}
        return out

    def downstream_jobs(self) -> dict[str, tuple[RunKey, str]]:
        """``<run path>/<task>`` -> (run, task) for every downstream result some table needs."""
        jobs = {}
        for protocol, paper_name, table in self.tables():
            for key, task in self.table_downstream(paper_name, table, protocol):
                jobs[f"{key.path}/{task}"] = (key, task)
        return jobs

    def datasets(self) -> list[str]:
        from ..registry import DATASETS

        names = {split["dataset"] for split in self.splits().values()}
        names.update(self.papers[key.paper]["downstream"][task]["dataset"] for key, task in self.downstream_jobs().values())
        for name in list(names):
            names.update(DATASETS.get(name).obj.depends_on)
        return sorted(names)
