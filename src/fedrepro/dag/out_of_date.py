"""When a report (table, figure, scorecard, evidence page) is out of date in a way Snakemake does not see, in two
steps: :meth:`OutOfDate.decide` says why (nothing written), :meth:`OutOfDate.record` writes the report's mark.

Snakemake reruns nothing for a run file deleted after the report was made (a missing intermediate file is not a
reason to rerun what is up to date) nor for an input put back with its old mtime (``cp -p``). So every report has
one more input, its out-of-date mark (:func:`fedrepro.paths.report_mark`): :meth:`OutOfDate.record` rewrites it
(new content and mtime: Snakemake compares both) when :meth:`~OutOfDate.decide` finds either case, so the report
reruns, rebuilding first what it is missing (or refusing stale runs by name); once nothing is found (the report
rebuilt, or the file put back after a dry run) the mark is made old again (mtime 0). The mark says only what holds
now.

The record step runs while Snakemake builds the DAG, from the report rules' input function
(:meth:`fedrepro.dag.Dag.report_inputs`, which calls the two steps by name): Snakemake compares modification times
as soon as it has built the DAG, with no step in between, so a mark written any later (in a job, after planning)
would not make this plan rebuild the report. It is the one file that planning writes; a dry run writes it too. Every
mark is first made, old, in one explicit step before planning (:meth:`OutOfDate.prepare`, called by the Snakefile),
so that planning only rewrites files Snakemake has already seen.
Why a report is out of date is :func:`fedrepro.report.consistency.out_of_date`; this module is where the workflow
asks it, and the place to extend when a report's staleness is decided otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

from .. import paths


def _say(line: str) -> None:
    print(line, file=sys.stderr)


class OutOfDate:
    """The out-of-date decisions of one planning (one Snakemake process) and the marks they write."""

    def __init__(self, project, say: Callable[[str], None] = _say):
        self.project, self.say = project, say
        self._said: set[str] = set()

    def decide(self, target: str, files: list[str]) -> list[str]:
        """Why ``target``, made from ``files``, must be made again though Snakemake sees nothing newer: a file it
        was made from is missing, or a run behind it was made from inputs changed since (empty: up to date, or not
        made yet). Writes nothing."""
        from ..report.consistency import out_of_date

        return out_of_date(self.project, target, files)

    def prepare(self, targets) -> None:
        """Make every report's mark exist (mtime 0: older than any report) before Snakemake plans anything. The
        record step then only rewrites files that exist: Snakemake caches what it has seen of a folder while it
        builds the DAG, so a mark created in the middle of planning was reported missing when two reports of one
        folder were asked for in one command (``snakemake a/fig8.png a/fig9.png`` on a fresh checkout)."""
        for target in targets:
            mark = Path(paths.report_mark(target))
            if not mark.exists():
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.touch()
                os.utime(mark, ns=(0, 0))

    def record(self, target: str, reasons: list[str]) -> str:
        """Write what :meth:`decide` found into ``target``'s mark, and return the mark's path (a report input): new
        content and mtime where there are reasons (said once per target on stderr), else mtime 0, older than any
        report."""
        mark = Path(paths.report_mark(target))
        if not mark.exists():
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()
        if not reasons:
            if mark.stat().st_mtime_ns:
                os.utime(mark, ns=(0, 0))   # older than any report
        else:
            # new content and mtime: Snakemake compares both (an input newer than the output, with another checksum)
            mark.write_text(f"{time.time_ns()}\n" + "\n".join(reasons) + "\n")
            if target not in self._said:
                self._said.add(target)
                listed = "\n  ".join(reasons[:10]) + (f"\n  ... and {len(reasons) - 10} more" if len(reasons) > 10 else "")
                self.say(f"fedrepro: {target} is out of date, so it is made again (after what it needs):\n  {listed}")
        return str(mark)
