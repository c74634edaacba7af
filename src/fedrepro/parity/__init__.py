"""Whole-run parity (``fedrepro parity <paper>``, docs/parity.md): the authors' own training code, unmodified and
recorded from outside, against fedrepro's ``paper`` run replaying the record, round by round; and the golden records
CI replays fedrepro against without the authors' code."""

from __future__ import annotations

import logging
from pathlib import Path

from .compare import ParityError

PARITY = ("fediic",)    # papers with a whole-run comparison; docs/parity.md says what stands in for the others


def run_parity(paper: str, *, work: Path, authors: str | None, golden: str | None, python: str, rounds: int | None,
               batch_size: int | None, threads: int, stochastic: bool, config: str, save: str | None,
               reuse: bool = False) -> bool:
    """Compare (``authors``: a live run of their code; ``golden``: a golden record), print the report -> passed."""
    from . import fediic

    log = logging.getLogger("fedrepro.parity")
    if golden is not None:
        rows, summary, expected = fediic.replay_golden(Path(golden), work, config, rounds, log)
        text, passed = fediic.golden_report(rows, summary, expected)
    else:
        inputs = fediic.Inputs(work, rounds=rounds or 2, batch_size=batch_size, threads=threads, stochastic=stochastic)
        text, passed = fediic.compare(Path(authors), python, inputs, config, Path(save) if save else None, log, reuse)
    print(text)
    return passed


__all__ = ["PARITY", "ParityError", "run_parity"]
