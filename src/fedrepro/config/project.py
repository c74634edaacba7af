"""The project: the top-level config (``config/config.yaml``, ``config/demo.yaml``, ``config/evidence.yaml``) and one
YAML file per paper. A project does three things, each in its own module: its files are checked (``checks``), each
job's config is resolved (``resolve``: ``project.resolver``) and what the configuration implies is planned (``plan``:
``project.plan``). Everything is validated before Snakemake schedules any job; an error names the key path, the
offending value and what is allowed (with a "did you mean" for typos)."""

from __future__ import annotations

from pathlib import Path

from .checks import Checks, check_project
from .files import deep_merge, load_yaml
from .loaded import LoadedConfig
from .plan import Plan
from .resolve import Resolver


class Project(LoadedConfig):
    """The validated configuration of every active paper (:class:`LoadedConfig`), with ``resolver`` (the config of
    one job) and ``plan`` (every job and output), checked before anything uses it."""

    def __init__(self, config: dict, root: str | Path = ".", configfiles: list[str] | None = None):
        super().__init__(config, root, configfiles)
        self.resolver = Resolver(self)
        if self.extension is not None:      # what of the extension fits, decided on resolved train blocks
            self.extension.settle(self.resolver, Checks(self, self.resolver, None))
        self.plan = Plan(self, self.resolver)
        check_project(self, self.resolver, self.plan)


def load_project(configfiles: list[str | Path] | None = None, overrides: dict | None = None, root: str | Path = ".") -> Project:
    """Load and merge config files (later ones win) the way ``snakemake --configfile`` does."""
    config: dict = {}
    for path in configfiles or [Path(root) / "config/config.yaml"]:
        config = deep_merge(config, load_yaml(path) or {})
    return Project(deep_merge(config, overrides), root, configfiles=configfiles or [])
