"""Building one figure: the registered figure kind draws it (PNG + PDF) from the files its ``inputs``
declare. Kinds live by what they draw: :mod:`.curves` (per round), :mod:`.splits` (client splits),
:mod:`.predictions` (ROC, decision curves, reliability), :mod:`.bars` (bars and table plots),
:mod:`.embeddings` (t-SNE, prototypes; from what the ``embed`` rule extracted)."""

from __future__ import annotations

from pathlib import Path

from ..config import Project
from ..registry import FIGURE_KINDS
from .item import ReportItem
from .item import data_note as item_data_note
from .plotting import data_note


def figure_item(project: Project, protocol: str, paper: str, figure: str) -> ReportItem:
    project.resolver.check_names(paper, figure=figure)
    return ReportItem(project, protocol, paper, "figures", figure)


def figure_inputs(item: ReportItem) -> list[str]:
    return FIGURE_KINDS.get(item.spec["kind"])["inputs"](item)


def make_figure(item: ReportItem, out_png: str | Path) -> None:
    """Draw the figure with its kind's drawer; whatever the kind, its face says what data it ran on."""
    with data_note(item_data_note(item.project, item.paper, item.protocol)):
        FIGURE_KINDS.get(item.spec["kind"]).obj(item, Path(out_png))
