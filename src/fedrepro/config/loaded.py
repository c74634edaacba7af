"""The configuration files of a project, read and validated against their schemas (``workflow/schemas``): the
top-level config and one file per paper (an overlay expanded into the paper it stands for)."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

from .. import paths
from .extension import Extension
from .files import ConfigError, check_choice, load_schema, load_yaml, validate
from .overlay import Overlay


class LoadedConfig:
    """The configuration files as read and validated against their schemas: ``config`` (the top-level file with its
    defaults), ``papers`` (name -> paper file, overlays expanded), ``paper_files`` (name -> the file it came from)."""

    def __init__(self, config: dict, root: str | Path = ".", configfiles: list[str] | None = None):
        self.root = Path(root)
        # the files the configuration was read from (none: the default config/config.yaml; None: unknown), which
        # a command a message suggests must name: `snakemake ... --configfile=...`
        self.configfiles = None if configfiles is None else [str(f) for f in configfiles]
        if "protocol" in config:
            raise ConfigError(f"config: 'protocol: {config['protocol']}' is now a list, 'protocols: [{config['protocol']}]' "
                              f"(results of each protocol live in their own folder: results/runs/<protocol>/...)")
        if "error_bars" in (config.get("report") or {}):
            raise ConfigError("config: report.error_bars is gone: every ± in tables, scorecards, the evidence page and the "
                              "figures is the mean ± the half-width of its 95% t-interval over n seeds (the CSVs keep "
                              "std and se; <table>.seeds.csv every seed). Remove the key (docs/reading-results.md).")
        schemas = str(self.root.resolve())
        self.config = validate(copy.deepcopy(config), load_schema(schemas, "config.schema.yaml"), "config")
        paths.use_results_dir(self.config["results_dir"])
        self.datasets = self.load_plugins()
        self.papers: dict[str, dict] = {}
        self.paper_files: dict[str, str] = {}
        self.overlays: dict[str, Overlay] = {}
        paper_dir = self.root / self.config["paper_dir"]
        available = sorted(path.stem for path in paper_dir.glob("*.yaml"))
        for name in self.config["papers"]:
            check_choice(name, available, f"config: papers (files in {self.config['paper_dir']})")
            path = paper_dir / f"{name}.yaml"
            paper = load_yaml(path)
            if not isinstance(paper, dict):
                raise ConfigError(f"{path}: expected a mapping at the top level")
            if "base" in paper:
                overlay = Overlay(paper, self.root, str(path))
                paper = overlay.paper((self.config.get("variants") or {}).get(name))
                self.overlays[name] = overlay
            validate(paper, load_schema(schemas, "paper.schema.yaml"), str(path))
            if paper["paper"] != name:
                raise ConfigError(f"{path}: 'paper' is {paper['paper']!r} but the file is for {name!r}")
            self.papers[name] = paper
            self.paper_files[name] = str(path)
        self.extension: Extension | None = None
        if self.config.get("extension"):
            self.extension = Extension(self.config["extension"], self)
            self.papers = self.extension.view(self.papers)
            paths.use_report_dir(paths.extension_dir(self.extension.name))

    def load_plugins(self) -> list:
        """Import the plug-ins (installed entry points, ``plugins:``) and declare ``datasets:``, before any name is
        looked up: a plug-in that fails, or a name that clashes, stops the configuration here, naming both."""
        from ..data.folder import declare
        from ..data.manifest import ManifestError
        from ..registry import PluginError, load_plugins

        try:
            load_plugins(self.config["plugins"], where="config: plugins")
            return declare(self.config["datasets"])
        except (PluginError, ManifestError) as error:
            raise ConfigError(str(error)) from None

    def job_environment(self) -> dict[str, str]:
        """What a job must find in its environment to load this configuration's plug-ins and datasets (the workflow
        exports it: local jobs, the fork-server's children and SLURM jobs inherit it)."""
        import os

        from ..data.folder import environment
        from ..registry import DATASETS_ENV, PLUGINS_ENV

        modules = [m for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()] + self.config["plugins"]
        return {PLUGINS_ENV: ",".join(dict.fromkeys(modules)), DATASETS_ENV: environment(self.datasets)}

    @property
    def protocols(self) -> list[str]:
        """The protocols every table and figure is built for (``protocols`` of the config)."""
        return self.config["protocols"]

    @property
    def seeds(self) -> list[int]:
        return self.config["seeds"]

    def snakemake_config_args(self) -> str:
        """What a suggested `snakemake` command needs to read this configuration: its files, in order (one with
        ``=``, so that no target is read as a second file; several before another option ends the list)."""
        if self.configfiles is None:
            return "--configfile=<your config>"
        if len(self.configfiles) == 1:
            return f"--configfile={shlex.quote(self.configfiles[0])}"
        return f"--configfile {' '.join(map(shlex.quote, self.configfiles))}" if self.configfiles else ""
