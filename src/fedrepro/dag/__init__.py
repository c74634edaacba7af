"""The workflow's logic, importable: every input function, resource request, definition hash and out-of-date
decision the Snakemake rules use, as methods of one :class:`Dag` over a :class:`~fedrepro.config.Project` (the
Snakefile builds it once; ``fedrepro estimate`` and the tests build their own). :mod:`.jobs` (what each job reads
and is made from), :mod:`.requests` (what it asks SLURM for, from :mod:`fedrepro.cost`), :mod:`.out_of_date`
(when a report must be made again though Snakemake sees nothing newer), :mod:`.targets` (which jobs a target
needs). Nothing here imports Snakemake: the rules pass in what is Snakemake's (its ``WorkflowError``, the
profile's GPU model) and wrap what only Snakemake knows (``ancient``)."""

from .jobs import Dag, DagError
from .out_of_date import OutOfDate
from .requests import per_attempt
from .targets import Target, figure_outputs, scorecard_outputs, table_outputs

__all__ = ["Dag", "DagError", "OutOfDate", "Target", "figure_outputs", "per_attempt", "scorecard_outputs",
           "table_outputs"]
