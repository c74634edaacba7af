"""Configuration: load, validate against ``workflow/schemas``, resolve each job, plan the grid.

- :mod:`.files`: YAML, schemas, readable validation errors, what the registry lets a config name.
- :mod:`.project`: :class:`Project`, the validated configuration (:func:`load_project` reads it the way
  ``snakemake --configfile`` does).
- :mod:`.checks`: what a configuration must pass beyond its schemas, before any job.
- :mod:`.resolve`: ``project.resolver`` turns one (paper, protocol, setting, method, seed) into its job's config.
- :mod:`.plan`: ``project.plan`` lists every run, table, figure, split, cache, weight and downstream job.
- :mod:`.overlay`: paper files over other paper files (the evidence run).
"""

from .files import (
    PROTOCOLS,
    ConfigError,
    check_choice,
    check_config_files,
    deep_merge,
    did_you_mean,
    input_kind,
    load_yaml,
    method_schema,
    model_schema,
    typed_overrides,
    validate,
)
from .loaded import LoadedConfig
from .overlay import Overlay, scaled
from .project import Project, load_project
from .resolve import column_eval, resolve_cell

__all__ = [
    "PROTOCOLS", "ConfigError", "LoadedConfig", "Overlay", "Project", "check_choice", "check_config_files", "column_eval", "deep_merge",
    "did_you_mean", "input_kind", "load_project", "load_yaml", "method_schema", "model_schema", "resolve_cell",
    "scaled", "typed_overrides", "validate",
]
