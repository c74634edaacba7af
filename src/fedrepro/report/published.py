"""Published values: the one place ``config/published/<paper>/<table>.csv`` files are read.

The format (documented for people who edit these files in config/published/README.md):

- ``#`` lines are comments (where the numbers come from, paper inconsistencies, ...);
- a header line: ``row`` then the table's column labels; one line per table row;
- a cell is a number as the paper prints it, or empty (the paper printed nothing there);
- a number followed by a **mark** (one of :data:`MARKS`, e.g. ``302.554626*``) is a value the paper does
  not print as such: this project derived it (e.g. expanded a formula) or assembled it (e.g. took it
  from another table or the text). Every mark used in a file needs a footnote line in the same file,
  ``# <mark> <what it means>`` (e.g. ``# * derived by fedrepro: ...``); rendered tables print the mark
  after the published value and the footnote in the caption, and the scorecard flags the cell as
  derived. The marking lives in the CSV only: no code knows which values are derived.

Anything else in a cell is an error that names the file, the row and the column.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

MARKS = ("*", "†", "‡", "§")
_VALUE = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([" + "".join(MARKS) + r"]?)$")
_FOOTNOTE = re.compile(r"^#\s*([" + "".join(MARKS) + r"])\s+(\S.*)$")


class PublishedError(ValueError):
    pass


@dataclass
class Published:
    """The published values of one table: (row, column) -> value, the cells' marks and the marks' footnotes."""

    values: dict[tuple[str, str], float] = field(default_factory=dict)
    marks: dict[tuple[str, str], str] = field(default_factory=dict)
    footnotes: dict[str, str] = field(default_factory=dict)

    def __contains__(self, cell) -> bool:
        return cell in self.values

    def get(self, cell: tuple[str, str], default: float = math.nan) -> float:
        return self.values.get(cell, default)

    def mark(self, cell: tuple[str, str]) -> str:
        """The cell's mark ("" for a value printed by the paper)."""
        return self.marks.get(cell, "")


def parse_published(text: str, where: str) -> Published:
    """``text`` of a published CSV (``where`` names it in errors) -> :class:`Published`."""
    out = Published()
    body = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            note = _FOOTNOTE.match(stripped)
            if note:
                out.footnotes[note.group(1)] = note.group(2).strip()
        elif stripped:
            body.append(line)
    if not body:
        return out
    frame = pd.read_csv(io.StringIO("\n".join(body)), dtype=str, keep_default_na=False)
    if "row" not in frame.columns:
        raise PublishedError(f"{where}: the header needs a 'row' column first; found {list(frame.columns)}")
    for _, rec in frame.iterrows():
        row = str(rec["row"])
        for col in frame.columns:
            if col == "row" or not str(rec[col]).strip():
                continue
            match = _VALUE.match(str(rec[col]).strip())
            if not match:
                raise PublishedError(f"{where}: row {row!r}, column {col!r}: {rec[col]!r} is not a number (optionally "
                                     f"followed by a mark {'/'.join(MARKS)} that a '# <mark> ...' footnote explains)")
            value, mark = float(match.group(1)), match.group(2)
            out.values[(row, col)] = value
            if mark:
                if mark not in out.footnotes:
                    raise PublishedError(f"{where}: row {row!r}, column {col!r} is marked {mark!r} but the file has no "
                                         f"footnote for it: add a comment line '# {mark} <what the mark means>'")
                out.marks[(row, col)] = mark
    return out


def read_published(path: str | Path | None) -> Published:
    """The published values of a table (empty without a file)."""
    if path is None or not Path(path).exists():
        return Published()
    return parse_published(Path(path).read_text(encoding="utf-8"), str(path))
